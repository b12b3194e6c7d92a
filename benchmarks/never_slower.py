"""Is `optimize_for_inference` never slower than the plain model? Both, in one process, taking turns, in several
fresh processes: each process measures its own kernel choice (`hfbert/inference/measured.py`), so each run is
an independent draw of that choice under the machine's noise.

    python -m benchmarks.never_slower [--runs 3] [--threads N] [--json OUT.json]   # about 4 minutes a run, 2 cores

Each run: bert-base's shape with random weights (benchmark.py's checkpoint), the plain `BertModel` and the same
model after `optimize_for_inference(model)` (precision "highest"), `precision="high"` and `precision="high",
compile=True` (each shape compiled in the untimed warm-up pass), then rows taken in
turns, batch by batch (benchmark.py's `interleaved`): dense 8 x 128, mixed lengths (64 sequences, batches of 32,
arrival order) and 1 x 16 (20 calls a turn). Prints per run and row the median time of each and the optimized
ones over the plain one (at most 1.00x is the promise), what each swapped, the MKL branch and how busy other
processes kept the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch

import hfbert
from benchmarks import common
from benchmarks.benchmark import batch, interleaved, make_checkpoint, mixed_batches
from benchmarks.busy import BusyMeter
from hfbert.inference import packed_layers
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch

MODES = {
    "plain": None,
    "optimized": {},
    "optimized high": {"precision": "high"},
    # Each shape compiled (and timed against eager) in the untimed warm-up pass.
    "compiled high": {"precision": "high", "compile": True},
}
OPTIMIZED = [name for name, options in MODES.items() if options is not None]


def one_run(threads: int) -> dict:
    torch.set_num_threads(threads)
    meter = BusyMeter()
    rows = {
        "dense 8x128": ([batch([128] * 8, 1000, "cpu")], 5, 1),
        "mixed, 64 seqs": (mixed_batches(64, "cpu"), 3, 1),
        "1x16, per call": ([batch([16], 1001, "cpu")], 10, 20),
    }
    with tempfile.TemporaryDirectory(prefix="hfbert-never-slower-") as work, torch.no_grad():
        checkpoint = make_checkpoint(Path(work) / "bert-base-random")
        models, swapped = {}, {}
        for name, options in MODES.items():
            models[name] = hfbert.BertModel.from_pretrained(checkpoint).eval()
            if options is not None:
                hfbert.optimize_for_inference(models[name], **options)
                swapped[name] = dict(Counter(packed_layers(models[name]).values())) or "nothing"
        result = {}
        for row, (batches, repeats, calls) in rows.items():

            def runner(model, calls=calls):
                def run(inputs):
                    for _ in range(calls):
                        model(**inputs)

                return run

            times, _ = interleaved({name: runner(model) for name, model in models.items()}, batches, repeats, 1, "cpu")
            medians = {name: statistics.median(values) / calls for name, values in times.items()}
            result[row] = {"seconds": medians, "ratio": {name: medians[name] / medians["plain"] for name in medians}}
    return {"rows": result, "swapped": swapped, "others_cores": meter.cores()}


def main() -> int:
    parser = common.parser(__doc__, threads=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a run, its JSON on stdout
    args = common.parse(parser)
    if args.one:
        print(json.dumps(one_run(args.threads)))
        return 0
    print(f"Machine: {cpu_name()}; instruction set {instruction_set()}; {args.threads} threads; MKL: {mkl_branch()}.")
    command = [sys.executable, "-m", "benchmarks.never_slower", "--one", "--threads", str(args.threads)]
    runs, slower = [], 0
    for index in range(args.runs):
        # Each run measures its kernels afresh: a choice cached by an earlier run would make the runs one sample.
        environment = {**os.environ, "HFBERT_KERNEL_CACHE": "off"}
        run = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, env=environment).stdout)
        runs.append(run)
        busy = run["others_cores"]
        print(f"\nRun {index + 1}: swapped {run['swapped']}; other processes kept {busy:.2f} cores busy.")
        print(f"| row | plain | {' | '.join(OPTIMIZED)} |\n|---|---|{'---|' * len(OPTIMIZED)}")
        for row, numbers in run["rows"].items():
            cells = [f"{numbers['seconds']['plain'] * 1e3:.1f} ms"]
            for name in OPTIMIZED:
                ratio = numbers["ratio"][name]
                slower += ratio > 1
                cells.append(f"{numbers['seconds'][name] * 1e3:.1f} ms ({ratio:.2f}x{', SLOWER' if ratio > 1 else ''})")
            print(f"| {row} | {' | '.join(cells)} |")
    print(f"\n{slower} of {args.runs * 3 * len(OPTIMIZED)} cells slower than the plain model.")
    common.write(args, None, {"runs": runs, "mkl_branch": mkl_branch()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
