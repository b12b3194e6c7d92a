"""Which way of computing a block is fastest on this machine, measured, not assumed.

A kernel that wins on one CPU loses on another: oneDNN's packed product beats MKL's sgemm on AVX-512 and at few
rows, and loses to it on Zen 3's AVX2 at many (docs/cpu-inference.md). So every swapped module is handed the
candidates for its block (candidate 0 is always the plain computation, the model's own), and `measured_choice` times
them once per process on inputs of the block's shape at a few row counts (ROW_BUCKETS), with this process's thread
count. A call then runs the candidate chosen for the nearest row count. Another candidate replaces the plain one only
where it takes at most WIN_MARGIN of its time, so that noise in the timing cannot make a model slower.

    >>> measured_choice(("doc", 1), [lambda rows: (lambda: None)] * 2)  # doctest: +SKIP
    (0, 0, 0)
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable, Sequence

import torch

# Rows per product: batch 1 of a short sentence, a small batch, a large batch (the padding-free token count of
# 32 sentences of 32 tokens).
ROW_BUCKETS = (16, 128, 1024)
WIN_MARGIN = 0.9
# Each candidate is timed this many times at each row count, interleaved with the others, and its fastest time
# counts: a call slowed by another process is discarded as long as one of its rounds ran undisturbed. Fewer
# rounds at the largest row count, where a call takes tens of milliseconds.
ROUNDS = (7, 5, 3)

# Bucket boundaries: the geometric means of neighbouring buckets.
_BOUNDS = tuple(math.sqrt(low * high) for low, high in zip(ROW_BUCKETS, ROW_BUCKETS[1:], strict=False))
_measured: dict[Hashable, tuple[int, ...]] = {}

Candidate = Callable[[int], Callable[[], object]]  # rows -> a call computing the block on `rows` rows


def bucket(rows: int) -> int:
    """The index in ROW_BUCKETS of the row count nearest to `rows` (on a log scale)."""
    # Not bisect: torch.compile traces this (the compiled path) and cannot see into C functions.
    return sum(rows > bound for bound in _BOUNDS)


def measured_choice(key: Hashable, candidates: Sequence[Candidate]) -> tuple[int, ...]:
    """For each row count of ROW_BUCKETS, the index of the candidate that runs fastest here; measured at the first
    call for `key` (which names the block and its shape) in this process and thread count, then remembered.
    Candidate 0 is the plain computation, kept unless another takes at most WIN_MARGIN of its time."""
    environment = (
        torch.get_num_threads(),
        torch.backends.cpu.get_cpu_capability(),
        os.environ.get("ONEDNN_MAX_CPU_ISA"),
    )
    full_key = (key, environment)
    if full_key not in _measured:
        _measured[full_key] = tuple(
            _fastest([candidate(rows) for candidate in candidates], rounds)
            for rows, rounds in zip(ROW_BUCKETS, ROUNDS, strict=True)
        )
    return _measured[full_key]


def _fastest(calls: list[Callable[[], object]], rounds: int) -> int:
    with torch.inference_mode():
        for call in calls:  # warm up: first-call allocations, oneDNN's primitive cache
            call()
        best = [math.inf] * len(calls)
        for _ in range(rounds):
            for index, call in enumerate(calls):
                started = time.perf_counter()
                call()
                best[index] = min(best[index], time.perf_counter() - started)
    challenger = min(range(1, len(calls)), key=best.__getitem__, default=0)
    return challenger if challenger and best[challenger] <= WIN_MARGIN * best[0] else 0
