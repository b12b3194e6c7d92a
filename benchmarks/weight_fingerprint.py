"""What the per-call weight fingerprint costs (`hfbert.inference.swapped.Fingerprint`): each call that runs a kernel
reads a fixed sample of its parameters so that `.data` writes (PEFT's `merge_and_unload()`) are followed.

    python -m benchmarks.weight_fingerprint [--threads N] [--calls 200]   # about a minute, 2 cores

bert-base's shape with random weights, optimized (fp32 with every kernel running, then int8), 1 x 16 tokens, forwards
with and without the reads in turns: the time spent in the reads inside each forward (`Fingerprint.matches` timed
where the forward calls it, less the timer's own cost), its median against the forward's median; and, as a check,
the two forwards' medians (on a busy machine their noise is larger than the cost). Prints the ratio, the CPU and
how busy other processes kept its cores.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import hfbert
from benchmarks.busy import BusyMeter
from hfbert.inference.swapped import Fingerprint
from hfbert.platform.cpu import cpu_name, instruction_set

MODES = {"fp32, kernels='always'": {"kernels": "always"}, "int8": {"quantize": "int8"}}


def measure(options: dict, calls: int) -> dict:
    torch.manual_seed(0)
    model = hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig()), **options)
    ids = torch.randint(1000, 20000, (1, 16))
    original = Fingerprint.matches
    spent = [0.0, 0]

    def timed(self) -> bool:
        started = time.perf_counter()
        matches = original(self)
        spent[0] += time.perf_counter() - started
        spent[1] += 1
        return matches

    def untimed(self) -> bool:  # the timer's own cost, and no read
        started = time.perf_counter()
        spent[0] += time.perf_counter() - started
        spent[1] += 1
        return True

    def forward() -> tuple[float, float, int]:
        """(seconds of the forward, seconds inside `matches`, its calls)"""
        spent[:] = [0.0, 0]
        started = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids)
        return time.perf_counter() - started, spent[0], spent[1]

    forward()  # builds what the first call builds
    # In turns: the reads as a forward makes them, their cache lines evicted by the other layers' weights.
    turns = {timed: [], untimed: []}
    try:
        for _ in range(calls):
            for patch, results in turns.items():
                Fingerprint.matches = patch
                results.append(forward())
    finally:
        Fingerprint.matches = original
    with_reads, without = (statistics.median(t[0] for t in turns[patch]) for patch in (timed, untimed))
    reads = statistics.median(t[1] for t in turns[timed]) - statistics.median(t[1] for t in turns[untimed])
    return dict(fingerprints=turns[timed][-1][2], reads=reads, forward=without, with_=with_reads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--calls", type=int, default=200, help="forwards of each kind, taken in turns")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    meter = BusyMeter()
    print(f"{cpu_name()}, {instruction_set()}, {arguments.threads} threads; bert-base shape, 1 x 16 tokens")
    for name, options in MODES.items():
        result = measure(options, arguments.calls)
        print(
            f"{name}: {result['fingerprints']} fingerprints read per forward in {result['reads'] * 1e6:.1f} us, "
            f"forward {result['forward'] * 1e3:.2f} ms: {result['reads'] / result['forward']:.2%} of it; "
            f"forward with / without the reads, in turns: {result['with_'] / result['forward']:.3f}x"
        )
    cores = meter.cores()
    print(f"other processes kept {'?' if cores is None else f'{cores:.2f}'} cores busy")


if __name__ == "__main__":
    main()
