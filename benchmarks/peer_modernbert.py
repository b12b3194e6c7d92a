"""benchmarks/peers.py's row 10: ModernBERT on long documents (issue 51), against transformers, ONNX
Runtime and OpenVINO, each ONNX engine admitted only where its measured memory fits.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.artifacts import export_onnx
from benchmarks.peer_engines import (
    Engine,
    artifact_engine,
    attempt,
    hfbert_engine,
    hfbert_plain_engine,
    memory_mib,
    openvino_engine_at,
    progress,
    transformers_engine,
)
from benchmarks.peer_measurement import (
    check_outputs,
    pad,
    real_tokens,
    reference_outputs,
    time_engines,
)
from benchmarks.report import HFBERT_PLAIN, ORT_UNFUSED
from hfbert.tools.parity.engines import onnxruntime_engine, openvino_engine
from hfbert.tools.parity.engines.reference import load_reference

MODERNBERT_ROW = "10"  # its key in peers.py's --rows
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
