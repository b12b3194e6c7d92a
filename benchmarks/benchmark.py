"""hfbert against transformers: same process, same weights, same inputs. Prints a Markdown table, writes JSON.

    python -m benchmarks.benchmark [--quick] [--json results.json] [--device cpu|cuda] [--repeats N] [--optimized]
        [--update-docs [--allow-busy]]
    python -m benchmarks.benchmark --render docs/results/benchmark.json

Run from the repository root. Without `--optimized` hfbert's models are the plain ones (every linear layer
`F.linear`, transformers' kernel); with it they go through `hfbert.optimize_for_inference` (fp32 and bf16
packed). `--update-docs` writes the result to docs/results/benchmark.json (benchmark_optimized.json with
`--optimized`) and renders it into docs/cpu-inference.md (benchmarks/report.py); `--render JSON` renders an
existing result without measuring.

Rows (targets are goals printed beside the numbers, never asserts):
  a    dense fp32, batch 8 x 128 tokens               throughput >= 1.0x transformers and >= 85% of the GEMM rate
  b    mixed lengths fp32, batches of 32, padded      real tokens/s >= 2.5x transformers
  c    latency, batch 1 x 16 tokens                   time <= 0.8x transformers'
  d    a and b in bf16 (and fp16 on CUDA)             >= 1.8x our own fp32 on a; cosine to our fp32 >= 0.999
       (on CPU only where bf16 is native: emulated bf16 is 3-5x slower than fp32, and the row is left out)
  e    cold start: fresh process, import, load, one forward (batch 1 x 16)   wall <= 0.5x, peak RSS <= transformers'
Weights: a random checkpoint in bert-base-uncased's exact file layout (or --checkpoint DIR). Mixed lengths are
log-normal (median 60, sigma 0.6, clipped to 8..512; 32% of the padded tokens are real). Timed runs alternate
ours, theirs, ours, ... after a warm-up, and the 2048^3 GEMM probe runs inside the dense rows' loop. Cold starts
read the checkpoint from the page cache. Model FLOPs are "useful" FLOPs, counted on real tokens only (padding
is waste, not work): per sequence of real length s, 2 * s * (matmul weights of the layers) + 4 * L * s^2 * d for
attention; embeddings, pooler, LayerNorm, GELU and softmax are not counted. The report says how busy other
processes kept the cores: on a shared 2-core machine that moves every number.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import hfbert
from benchmarks import common, report
from benchmarks.busy import BusyMeter
from hfbert.platform.cpu import bfloat16_native, cpu_flags
from hfbert.tools.parity import Stats
from tests.support.checkpoints import bert_base_shapes, random_tensors, write_checkpoint

ROOT = Path(__file__).resolve().parents[1]

LENGTH_MEDIAN, LENGTH_SIGMA, MIXED_BATCH = 60, 0.6, 32  # log-normal lengths: median 60, about 32% real tokens
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


# -- machine, checkpoint, inputs -----------------------------------------------------------------------------------
def machine_info(device: str, optimized: bool) -> dict:
    import transformers

    info = {
        **common.machine(torch.get_num_threads(), packages=()),
        "avx512_bf16": "avx512_bf16" in cpu_flags(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": device,
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "hfbert_linear": "packed by hfbert.optimize_for_inference" if optimized else "F.linear (plain model)",
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def make_checkpoint(directory: Path) -> Path:
    """A random checkpoint in bert-base-uncased's real file layout (`bert.` prefix, LayerNorm gamma/beta, cls.*
    heads), so both loaders take the same renaming path they take on the real file."""
    if (directory / "model.safetensors").exists():
        return directory
    return write_checkpoint(directory, random_tensors(bert_base_shapes(), seed=0, weight_std=0.02, gain_std=0.0))


def batch(lengths: list[int], seed: int, device: str) -> dict[str, torch.Tensor]:
    """[CLS] random words [SEP], right-padded with 0 to the longest; attention_mask marks the real tokens."""
    ids = torch.randint(1000, 30000, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(seed))
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    ids[:, 0] = 101
    ids[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = 102
    inputs = {"input_ids": ids * mask, "attention_mask": mask.long(), "token_type_ids": torch.zeros_like(ids)}
    return {key: value.to(device) for key, value in inputs.items()}


def mixed_batches(count: int, device: str) -> list[dict]:
    """The first `count` of one fixed draw of 256 lengths (so --quick runs a prefix of the default workload), in
    input order, no sorting: what a caller streaming documents sends."""
    generator = torch.Generator().manual_seed(0)
    draw = torch.exp(math.log(LENGTH_MEDIAN) + LENGTH_SIGMA * torch.randn(256, generator=generator))
    lengths = draw.round().clamp(8, 512).long().tolist()[:count]
    return [batch(lengths[i : i + MIXED_BATCH], seed=i, device=device) for i in range(0, count, MIXED_BATCH)]


def useful_flops(batches: list[dict], config: hfbert.BertConfig) -> float:
    d, layers = config.hidden_size, config.num_hidden_layers
    weights = layers * (4 * d * d + 2 * d * config.intermediate_size)  # 84.93M for bert-base
    lengths = torch.cat([b["attention_mask"].sum(dim=1) for b in batches]).double()
    return float((2 * weights * lengths + 4 * layers * d * lengths**2).sum())


def real_tokens(batches: list[dict]) -> int:
    return int(sum(b["attention_mask"].sum() for b in batches))


# -- timing ----------------------------------------------------------------------------------------------------------
def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()  # kernels are asynchronous: without this we would time the launches only


def interleaved(
    runners: dict, batches: list[dict], repeats: int, warmup: int, device: str, settle: float = 0.0
) -> tuple[dict, dict]:
    """Seconds per pass over `batches` for each runner (a model, or the GEMM probe). Batch by batch the runners
    take turns (ours, theirs, ours, ...), so drift such as another process on these few cores hits all alike.
    `settle`: seconds to wait, untimed, before each turn, so that worker threads the previous runner left spinning
    (OpenMP, ONNX Runtime, OpenVINO pools) are asleep again, as they would be in a process that runs one engine.
    Also returns each runner's outputs from its last pass, for the accuracy checks."""
    times = {name: [0.0] * repeats for name in runners}
    outputs = {name: [None] * len(batches) for name in runners}
    for step in range(warmup + repeats):
        for index, inputs in enumerate(batches):
            for name, run in runners.items():
                synchronize(device)
                if settle:
                    time.sleep(settle)
                start = time.perf_counter()
                outputs[name][index] = run(inputs)
                synchronize(device)
                if step >= warmup:
                    times[name][step - warmup] += time.perf_counter() - start
    return times, outputs


def forward(model):
    return lambda inputs: model(**inputs).last_hidden_state


def gemm_probe(dtype: torch.dtype, device: str, n: int = 2048) -> tuple:
    """An n^3 matmul, the ceiling a model made of Linear layers can approach, and its FLOPs (in GFLOP). It runs
    inside the dense row's loop, so both rates are measured under the same conditions."""
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return lambda _: torch.matmul(a, b), 2 * n**3 / 1e9


def per_second(amount: float, times: dict) -> dict:
    return {name: amount / statistics.median(seconds) for name, seconds in times.items()}


def min_cosine(outputs: list[torch.Tensor], reference: list[torch.Tensor], batches: list[dict]) -> float:
    """Worst cosine similarity over real tokens (what a model returns at pad positions is not defined), by
    `hfbert parity`'s statistics."""
    stats = Stats()
    for out, ref, inputs in zip(outputs, reference, batches, strict=True):
        real = inputs["attention_mask"].bool()
        stats.update(out[real], ref[real])
    return stats.min_cosine


# -- models ----------------------------------------------------------------------------------------------------------
def load_pair(checkpoint: Path, dtype: torch.dtype, device: str, optimized: bool = False) -> dict:
    import transformers

    transformers.logging.set_verbosity_error()  # the cls.* "unexpected keys" report is expected here
    ours = hfbert.BertModel.from_pretrained(checkpoint, dtype=dtype, device=device, attn_implementation="sdpa")
    if optimized:
        hfbert.optimize_for_inference(ours)
    theirs = transformers.BertModel.from_pretrained(checkpoint, attn_implementation="sdpa", dtype=dtype)
    return {"hfbert": ours.eval(), "transformers": theirs.to(device).eval()}


COLD_START = """
import sys, torch
which, path, device = sys.argv[1:]
if which == "hfbert":
    import hfbert
    model = hfbert.BertModel.from_pretrained(path, device=device, attn_implementation="sdpa")
else:
    import transformers
    model = transformers.BertModel.from_pretrained(path, attn_implementation="sdpa").to(device).eval()
ids = torch.randint(1000, 30000, (1, 16), device=device)
with torch.inference_mode():
    model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.sum().item()
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))  # peak RSS, kB
"""


def cold_start(which: str, checkpoint: Path, device: str) -> tuple[float, float]:
    """Wall seconds as a user waits for them (parent clock around the whole process) and the child's peak RSS."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", COLD_START, which, str(checkpoint), device], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"cold start of {which} failed:\n{done.stderr[-3000:]}")
    return wall, int(done.stdout.split()[-1]) / 1024


# -- rows ------------------------------------------------------------------------------------------------------------
def row(name: str, values: dict, unit: str, goal: tuple | None = None, **numbers) -> dict:
    """One table row. `ratio` is hfbert / transformers of the shown quantity; `goal` = (">=" or "<=", bound)."""
    ratio = values["hfbert"] / values["transformers"]
    new = {"row": name, **values, "unit": unit, "ratio": ratio, "target": "", "pass": True, **numbers}
    if goal:
        add_target(new, f"{goal[0]} {goal[1]:.2f}x", ratio >= goal[1] if goal[0] == ">=" else ratio <= goal[1])
    return new


def add_target(row: dict, text: str, met: bool) -> None:
    row["target"] = f"{row['target']}; {text}" if row["target"] else text
    row["pass"] = row["pass"] and met


def throughput_rows(labels, dtype, models, dense, mixed, args, config) -> tuple[list[dict], dict]:
    """Rows a and b (or d-a and d-b): the dense batch, then the mixed-length set."""
    precision = DTYPE_NAMES[dtype]
    runners = {name: forward(model) for name, model in models.items()}
    probe, probe_gflop = gemm_probe(dtype, args.device)
    dense_times, dense_out = interleaved({**runners, "gemm": probe}, [dense], args.repeats, 1, args.device)
    gemm = per_second(probe_gflop, {"gemm": dense_times.pop("gemm")})["gemm"]
    # A pass over the mixed set takes a minute or more on CPU: the dense warm-up serves it, with fewer repeats.
    mixed_times, mixed_out = interleaved(runners, mixed, args.mixed_repeats, 0, args.device)
    gflops = per_second(useful_flops([dense], config) / 1e9, dense_times)
    share = {model: value / gemm for model, value in gflops.items()}
    label = f"{labels[0]}. dense {precision} 8x128"
    dense_row = row(label, per_second(real_tokens([dense]), dense_times), "tok/s", (">=", 1.0))
    dense_row.update(gemm_gflops=gemm, useful_gflops=gflops, gemm_share=share, seconds=dense_times)
    shares = f"{share['hfbert']:.0%} (theirs {share['transformers']:.0%})"
    add_target(dense_row, f">= 85% of GEMM: {shares}", share["hfbert"] >= 0.85)
    label = f"{labels[1]}. mixed {precision} {len(mixed) * MIXED_BATCH} seqs"
    mixed_row = row(label, per_second(real_tokens(mixed), mixed_times), "real tok/s", (">=", 2.5))
    padded = sum(inputs["input_ids"].numel() for inputs in mixed)
    mixed_row.update(seconds=mixed_times, real_tokens=real_tokens(mixed), padded_tokens=padded)
    mixed_row["useful_gflop"] = useful_flops(mixed, config) / 1e9
    return [dense_row, mixed_row], {"dense": dense_out, "mixed": mixed_out}


def low_precision_rows(dtype, checkpoint, dense, mixed, fp32_rows, fp32_outputs, args, config) -> list[dict]:
    """Row d for one dtype: a and b again, our speed-up over our own fp32, and accuracy against fp32."""
    models = load_pair(checkpoint, dtype, args.device, args.optimized)
    rows, outputs = throughput_rows(("d-a", "d-b"), dtype, models, dense, mixed, args, config)
    speedup = rows[0]["hfbert"] / fp32_rows[0]["hfbert"]
    rows[0]["own_fp32_speedup"] = speedup
    add_target(rows[0], f">= 1.80x own fp32: {speedup:.2f}x", speedup >= 1.8)
    parts = {"dense": [dense], "mixed": mixed}
    cosine = {
        model: min(min_cosine(outputs[part][model], fp32_outputs[part][model], parts[part]) for part in parts)
        for model in models
    }
    rows.append(row(f"d-cos. {DTYPE_NAMES[dtype]} vs own fp32, min cosine", cosine, "cos"))
    add_target(rows[-1], ">= 0.999 (ours)", cosine["hfbert"] >= 0.999)
    return rows


def cold_start_rows(checkpoint: Path, args) -> list[dict]:
    runs = {"hfbert": [], "transformers": []}
    for _ in range(args.cold_repeats):
        for which in runs:  # interleaved; the checkpoint is in the page cache for both (it was just written or read)
            runs[which].append(cold_start(which, checkpoint, args.device))
    wall = {which: statistics.median(run[0] for run in results) for which, results in runs.items()}
    rss = {which: statistics.median(run[1] for run in results) for which, results in runs.items()}
    return [
        row("e. cold start wall", wall, "s", ("<=", 0.5), runs=runs),
        row("e. cold start peak RSS", rss, "MiB", ("<=", 1.0)),
    ]


def parse_args() -> argparse.Namespace:
    parser = common.parser(__doc__, "benchmark", quick="fewer repeats, 64 mixed sequences (< 2 min on 2 cores)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, help="timed passes of a, d-a, GEMM and (x5) c; default 10, quick 3")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory (a random one is written if empty)")
    parser.add_argument(
        "--optimized",
        action="store_true",
        help="hfbert.optimize_for_inference on hfbert's models: fp32 packed, bf16 packed where the CPU has bf16",
    )
    args = common.parse(parser)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda, but this torch ({torch.__version__}) sees no CUDA device")
    args.repeats = args.repeats or (3 if args.quick else 10)
    args.mixed_repeats = max(1, args.repeats // 5)  # a mixed pass is ~50x a dense one: a fifth of the repeats
    args.cold_repeats = 1 if args.quick else 3
    args.mixed_count = 64 if args.quick else 256
    return args


def main() -> None:
    args = parse_args()
    if common.rendered(args, "benchmark"):
        return
    meter = BusyMeter()
    machine = machine_info(args.device, args.optimized)
    low_precision = [torch.float16, torch.bfloat16] if args.device == "cuda" else [torch.bfloat16]
    if args.device == "cpu" and not bfloat16_native():
        # Emulated bf16 runs 3-5x slower than fp32 (hfbert warns): row d would time the emulation, not bf16.
        low_precision = []
        machine["skipped"] = "row d (bf16): this CPU has no native bf16 (avx512_bf16 or AMX); it would be emulated"
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        checkpoint = make_checkpoint(args.checkpoint or Path(tmp) / "bert-base-random")
        config = hfbert.BertConfig.from_json_file(checkpoint / "config.json")
        dense, short = batch([128] * 8, 1000, args.device), batch([16], 1001, args.device)
        mixed = mixed_batches(args.mixed_count, args.device)
        models = load_pair(checkpoint, torch.float32, args.device, args.optimized)
        rows, fp32_outputs = throughput_rows(("a", "b"), torch.float32, models, dense, mixed, args, config)
        # Batch 1 is where per-op overhead shows: many short timings, their median.
        latency, _ = interleaved({n: forward(m) for n, m in models.items()}, [short], 5 * args.repeats, 3, args.device)
        ms = {name: 1000 * statistics.median(seconds) for name, seconds in latency.items()}
        rows.append(row("c. latency 1x16", ms, "ms", ("<=", 0.8), seconds=latency))
        del models
        for dtype in low_precision:
            rows += low_precision_rows(dtype, checkpoint, dense, mixed, rows[:2], fp32_outputs, args, config)
        rows += cold_start_rows(checkpoint, args)
    result = common.finish({"machine": machine, "rows": rows, "args": vars(args)}, meter)
    print("\n" + report.benchmark_markdown(result))
    common.write(args, "benchmark", result)


if __name__ == "__main__":
    main()
