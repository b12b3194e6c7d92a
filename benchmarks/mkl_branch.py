"""Does MKL's instruction-set branch (`MKL_CBWR=AUTO`) pay on this CPU? MKL's default branch against it, measured
in processes that take turns.

    python -m benchmarks.mkl_branch [--rounds 20] [--threads N] [--json OUT.json]   # about 4 minutes on 2 cores

MKL reads its branch once per process (`hfbert/platform/mkl.py`), so each setting is a worker process of its own:
"default" (MKL_CBWR unset, `HFBERT_MKL_BRANCH=off`) and "AUTO" (MKL_CBWR=AUTO). The workers build the same
random bert-base weights and inputs, then take turns, round after round, the order alternating: what the machine
does meanwhile lands on both alike. Each turn times, in the worker:

- products: bert-base's 12 layers of linear products (`F.linear`, MKL's sgemm) at 16, 128 and 1,024 rows, and
  in float64 at 128 rows (MKL's dgemm: `hfbert parity`'s reference);
- forward: hfbert's plain `BertModel` (random bert-base weights) at 1 x 16 tokens and 8 x 128.

Prints the CPU, its instruction set and vendor, what MKL says each worker runs, and per cell the median over the
rounds, AUTO's median over the default's, and in how many rounds AUTO was the faster of the pair (a gain that noise
made is a coin toss: about half the rounds). Also the cores other processes kept busy: on a shared machine, read
the rounds won before the medians. hfbert sets AUTO on AMD CPUs without AVX-512 (`hfbert/platform/mkl.py`); this
is the measurement that decides where.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import time

import torch

from benchmarks import common
from benchmarks.busy import BusyMeter
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import SETTING, SWITCH, USER_SETTINGS, cpu_vendor

SETTINGS = {"default": {SWITCH: "off"}, "AUTO": {SETTING: "AUTO"}}
PRODUCT_ROWS = (16, 128, 1024)
FORWARDS = ((1, 16), (8, 128))
# Calls per turn: a turn of about a tenth of a second or more at every size.
REPEATS = {
    "products 16": 4,
    "products 128": 1,
    "products 1024": 1,
    "float64 products 128": 1,
    "forward 1x16": 4,
    "forward 8x128": 1,
}


def worker(threads: int) -> int:
    """One setting's process: builds the work, then answers each request (a cell's name) with seconds per call."""
    import torch.nn.functional as F

    import hfbert
    from hfbert.platform.mkl import mkl_branch

    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the pipe carries answers only
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    shapes = [(768, 768)] * 4 + [(3072, 768), (768, 3072)]
    weights = [torch.randn(outputs, inputs) * 0.02 for outputs, inputs in shapes]
    model = hfbert.BertModel(hfbert.BertConfig()).eval()
    cells = {}
    for rows in PRODUCT_ROWS:
        inputs = {width: torch.randn(rows, width) for width in (768, 3072)}
        cells[f"products {rows}"] = lambda inputs=inputs: [F.linear(inputs[w.shape[1]], w) for w in weights * 12]
    # hfbert parity's reference: transformers in float64, MKL's dgemm.
    wide = {width: torch.randn(128, width, dtype=torch.float64) for width in (768, 3072)}
    doubles = [weight.double() for weight in weights]
    cells["float64 products 128"] = lambda: [F.linear(wide[w.shape[1]], w) for w in doubles * 12]
    for batch, tokens in FORWARDS:
        ids = torch.randint(1000, 20000, (batch, tokens))
        cells[f"forward {batch}x{tokens}"] = lambda ids=ids: model(input_ids=ids)
    with torch.inference_mode():
        for cell in cells.values():
            cell()  # warm up
        pickle.dump(mkl_branch(), answers)
        answers.flush()
        for line in sys.stdin:
            name = line.strip()
            started = time.perf_counter()
            for _ in range(REPEATS[name]):
                cells[name]()
            pickle.dump((time.perf_counter() - started) / REPEATS[name], answers)
            answers.flush()
    return 0


def start(setting: dict[str, str], threads: int) -> tuple[subprocess.Popen, str]:
    environment = {name: value for name, value in os.environ.items() if name not in (*USER_SETTINGS, SWITCH)}
    environment.update(setting)
    command = [sys.executable, "-m", "benchmarks.mkl_branch", "--worker", "--threads", str(threads)]
    process = subprocess.Popen(command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
    return process, pickle.load(process.stdout)


def ask(process: subprocess.Popen, name: str) -> float:
    process.stdin.write(f"{name}\n".encode())
    process.stdin.flush()
    return pickle.load(process.stdout)


def measure(rounds: int, threads: int) -> dict:
    meter = BusyMeter()
    load = os.getloadavg()[0]
    workers = {name: start(setting, threads) for name, setting in SETTINGS.items()}
    times: dict[str, dict[str, list[float]]] = {name: {cell: [] for cell in REPEATS} for name in SETTINGS}
    for index in range(rounds):
        order = list(SETTINGS) if index % 2 == 0 else list(reversed(SETTINGS))
        for cell in REPEATS:
            for name in order:
                times[name][cell].append(ask(workers[name][0], cell))
    for process, _ in workers.values():
        process.stdin.close()
        process.wait(timeout=60)
    seconds = meter.seconds()
    return {
        "machine": {
            "cpu": cpu_name(),
            "vendor": cpu_vendor(),
            "instruction_set": instruction_set(),
            "threads": threads,
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "load_before": load,
            "others_cores": meter.cores(),
            "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        },
        "branches": {name: branch for name, (_, branch) in workers.items()},
        "rounds": rounds,
        "seconds": seconds,
        "times": times,
    }


def markdown(result: dict) -> str:
    machine = result["machine"]
    busy = machine["others_cores"]
    lines = [
        f"Machine: {machine['cpu']} ({machine['vendor']}; {machine['instruction_set']}), {machine['threads']} "
        f"threads, torch {machine['torch']}; measured {machine['measured']}; {result['rounds']} rounds in "
        f"{result['seconds']:.0f} s; other processes kept "
        + (f"{busy:.2f} of {machine['cores']} cores busy." if busy is not None else "an unknown share busy."),
        "MKL: " + "; ".join(f"{name} worker: {branch}" for name, branch in result["branches"].items()) + ".",
        "",
        "| per call | default | AUTO | AUTO / default | rounds AUTO was faster |",
        "|---|---|---|---|---|",
    ]
    default, auto = result["times"]["default"], result["times"]["AUTO"]
    for cell in REPEATS:
        mine, theirs = statistics.median(auto[cell]), statistics.median(default[cell])
        won = sum(a < b for a, b in zip(auto[cell], default[cell], strict=True))
        lines.append(
            f"| {cell} | {theirs * 1e3:.1f} ms | {mine * 1e3:.1f} ms | {mine / theirs:.2f}x "
            f"| {won} of {len(auto[cell])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = common.parser(__doc__, threads=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = common.parse(parser)
    if args.worker:
        return worker(args.threads)
    result = measure(args.rounds, args.threads)
    print(markdown(result))
    common.write(args, None, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
