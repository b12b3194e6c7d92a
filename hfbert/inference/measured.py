"""Which way of computing a block is fastest on this machine, measured, not assumed.

A kernel that wins on one CPU loses on another: oneDNN's packed product beats MKL's sgemm on AVX-512 and at few
rows, and loses to it on Zen 3's AVX2 at many (docs/cpu-inference.md). So every swapped module is handed the
candidates for its block (candidate 0 is always the plain computation, the model's own), and `measured_choice` times
them on inputs of the block's shape at a few row counts (ROW_BUCKETS), with this process's thread count, once per
machine: the choices are kept on disk for later processes (`kernel_cache.py`, keyed by the CPU, torch, hfbert, the
environment's caps and the thread count). A call then runs the candidate chosen for the nearest row count.

The choice must not flip with the noise of a shared machine, or an optimized model would run slower than the plain
one. So the candidates are timed in rounds, each round running every candidate once in a rotating order (what the
machine does meanwhile lands on all of them alike), and another candidate replaces the plain one only if it is
clearly faster twice over: its median takes at most WIN_MARGIN of the plain median, and it took at most WIN_MARGIN
of the plain time in at least WIN_SHARE of the rounds, each round compared with itself. Where the two disagree, the
rounds are measured once more; still undecided, the plain computation stays. A lucky fast call or an unlucky slow
one moves neither a median nor most rounds.

    >>> measured_choice(("doc", 1), [lambda rows: (lambda: None)] * 2)  # doctest: +SKIP
    (0, 0, 0)
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Hashable, Sequence

import torch

from hfbert.inference import kernel_cache
from hfbert.platform import mkl
from hfbert.platform.cpu import environment_caps

# Rows per product: batch 1 of a short sentence, a small batch, a large batch (the padding-free token count of
# 32 sentences of 32 tokens).
ROW_BUCKETS = (16, 128, 1024)
WIN_MARGIN = 0.9
# Rounds per row count: fewer at the largest, where a call takes tens of milliseconds.
ROUNDS = (9, 7, 5)
# The share of rounds a challenger must win by WIN_MARGIN, besides its median.
WIN_SHARE = 2 / 3
# A sample is at least this long (several calls of a fast block): one call of a few microseconds is mostly timer
# and scheduler.
MIN_SAMPLE = 1e-3
_clock = time.perf_counter

_measured: dict[Hashable, tuple[int, ...]] = {}

Candidate = Callable[[int], Callable[[], object]]  # rows -> a call computing the block on `rows` rows


def bucket(rows: int, row_counts: tuple[int, ...] = ROW_BUCKETS) -> int:
    """The index in `row_counts` of the row count nearest to `rows` (on a log scale)."""
    # Not bisect: torch.compile traces this (the compiled path) and cannot see into C functions. `==`, not `is`:
    # traced, the default is a copy, and the cached `_bounds` would be traced through (dynamo warns).
    bounds = _BOUNDS if row_counts == ROW_BUCKETS else _bounds(row_counts)
    return sum(rows > bound for bound in bounds)


@functools.cache  # a kernel's own row counts are a constant tuple: its bounds are computed once, not per product
def _bounds(row_counts: tuple[int, ...]) -> tuple[float, ...]:
    """Bucket boundaries: the geometric means of neighbouring row counts."""
    return tuple(math.sqrt(low * high) for low, high in zip(row_counts, row_counts[1:], strict=False))


_BOUNDS = _bounds(ROW_BUCKETS)


def measured_choice(
    key: Hashable, candidates: Sequence[Candidate], row_counts: tuple[int, ...] = ROW_BUCKETS
) -> tuple[int, ...]:
    """For each of `row_counts` (ROW_BUCKETS unless a kernel asks for others), the index of the candidate that runs
    fastest here; measured at the first call for `key` (which names the block and its shape) in this process,
    thread count and environment, then remembered, in this process and on disk for later ones (`kernel_cache.py`:
    a later process on the same machine, torch and caps reads it instead of measuring). Candidate 0 is the plain
    computation, kept unless another takes at most WIN_MARGIN of its time."""
    threads = torch.get_num_threads()
    # Every cap in every spelling (`ENVIRONMENT_CAPS`) and MKL's branch: a process that changes them between two
    # models measures again, as it would in the on-disk cache, whose file these name with the CPU and versions.
    environment = (
        threads,
        torch.backends.cpu.get_cpu_capability(),
        tuple(environment_caps().items()),
        mkl.STATE.reason,
    )
    full_key = (key, environment)
    if full_key not in _measured:
        name = kernel_cache.entry_name(key, row_counts)
        cached = None if name is None else kernel_cache.load(name, len(row_counts), len(candidates), threads)
        if cached is None:
            kernel_cache.note_measuring(threads)
            cached = tuple(
                _fastest([candidate(rows) for candidate in candidates], rounds)
                for rows, rounds in zip(row_counts, map(_rounds, row_counts), strict=True)
            )
            if name is not None:
                kernel_cache.store(name, cached, threads)
        _measured[full_key] = cached
    return _measured[full_key]


def _rounds(rows: int) -> int:
    return ROUNDS[bucket(rows)]


def _fastest(calls: list[Callable[[], object]], rounds: int) -> int:
    with torch.inference_mode():
        repeats = [_repeats(call) for call in calls]
        samples: list[list[float]] = [[] for _ in calls]
        for _ in range(2):
            _sample(calls, repeats, rounds, samples)
            choice = _decide(samples)
            if choice is not None:
                return choice
    return 0


def _repeats(call: Callable[[], object]) -> int:
    """Calls per sample: enough for MIN_SAMPLE, judged by the second of two warm-up calls (the first allocates
    and fills oneDNN's primitive cache)."""
    call()
    started = _clock()
    call()
    return max(1, min(100, math.ceil(MIN_SAMPLE / max(_clock() - started, 1e-9))))


def _sample(calls: list[Callable[[], object]], repeats: list[int], rounds: int, samples: list[list[float]]) -> None:
    """`rounds` more seconds-per-call samples of each call, interleaved, the order rotating by one each round."""
    for round_index in range(rounds):
        for offset in range(len(calls)):
            index = (round_index + offset) % len(calls)
            started = _clock()
            for _ in range(repeats[index]):
                calls[index]()
            samples[index].append((_clock() - started) / repeats[index])


def _decide(samples: list[list[float]]) -> int | None:
    """The index of the candidate to run, or None while the rounds disagree: a challenger whose median beats the
    plain one's by WIN_MARGIN but that does not win WIN_SHARE of the rounds (or the reverse)."""
    medians = [statistics.median(times) for times in samples]
    challenger = min(range(1, len(samples)), key=medians.__getitem__, default=0)
    if not challenger:
        return 0
    won = sum(mine <= WIN_MARGIN * plain for mine, plain in zip(samples[challenger], samples[0], strict=True)) / len(
        samples[0]
    )
    median_wins = medians[challenger] <= WIN_MARGIN * medians[0]
    if median_wins and won >= WIN_SHARE:
        return challenger
    if not median_wins and won < 1 - WIN_SHARE:
        return 0
    return None
