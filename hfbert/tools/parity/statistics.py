"""The numbers of a parity run: differences between two sets of vectors, accumulated over batches (`Stats`), one
output judged against float64 (`Accuracy`: RMS error as a multiple of transformers' own), top-k agreement
(`TopKStats`) and one compared output over all cases and per case (`Row`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

TOP_K = 5
ACCURACY_RATIO = 1.5  # hfbert's RMS error against float64 may be at most this many times transformers' own


def worse(current: float, value: float) -> float:
    """The larger of two errors, where NaN (a model produced NaN or inf) is the worst of all."""
    return value if math.isnan(value) or value > current else current


@dataclass
class Stats:
    """Differences between two sets of vectors, accumulated over batches (or over one slice of rows, as `measure`
    computes them and `add` folds them in)."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_abs: float = 0.0
    elements: int = 0
    vectors: int = 0
    min_cosine: float = 1.0
    sum_squares: float = 0.0
    reference_max_abs: float = 0.0  # the largest |value| of the reference
    reference_sum_squares: float = 0.0  # the reference's own RMS is the scale of the accuracy floor

    def update(self, ours: Tensor, reference: Tensor) -> None:
        """`ours` and `reference`: (vectors, ...) of the same shape; each row is one token (or sequence) vector."""
        self.add(self.measure(ours, reference))

    @staticmethod
    def measure(ours: Tensor, reference: Tensor) -> list[Stats]:
        """What `update` adds, slice by slice: measured once, it is added to the total and to its case alike."""
        if ours.shape != reference.shape:
            raise ValueError(f"shape {tuple(ours.shape)} in hfbert but {tuple(reference.shape)} in the reference")
        ours, reference = ours.flatten(1), reference.flatten(1)
        rows = max(1, 2**22 // max(1, ours.shape[1]))  # float64 in slices of ~32 MB (MLM logits are large)
        slices = []
        for start in range(0, ours.shape[0], rows):
            a, b = ours[start : start + rows].double(), reference[start : start + rows].double()
            # Row by row, so in pieces of rows (the same values; a third of the memory of one call on the slice).
            step = max(1, 2**18 // max(1, a.shape[1]))
            cosines = [
                F.cosine_similarity(a[i : i + step], b[i : i + step], dim=1, eps=1e-300) for i in range(0, len(a), step)
            ]
            cosine = float(torch.cat(cosines).min().clamp(max=1.0))
            difference = a - b
            del a  # one slice fewer held at once
            relative = difference.norm(dim=1) / b.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
            difference.abs_()
            slices.append(
                Stats(
                    max_abs=float(difference.max()),
                    reference_max_abs=float(b.abs().max()),
                    sum_abs=float(difference.sum()),
                    sum_squares=float(difference.square().sum()),
                    reference_sum_squares=float(b.square().sum()),
                    elements=difference.numel(),
                    vectors=difference.shape[0],
                    max_rel=float(relative.max()),
                    min_cosine=cosine,
                )
            )
        return slices

    def add(self, slices: list[Stats]) -> None:
        for part in slices:  # in order: the sums come out the same whichever records they are added to
            self.max_abs = worse(self.max_abs, part.max_abs)
            self.reference_max_abs = worse(self.reference_max_abs, part.reference_max_abs)
            self.sum_abs += part.sum_abs
            self.sum_squares += part.sum_squares
            self.reference_sum_squares += part.reference_sum_squares
            self.elements += part.elements
            self.vectors += part.vectors
            self.max_rel = worse(self.max_rel, part.max_rel)
            cosine = part.min_cosine
            self.min_cosine = cosine if math.isnan(cosine) or cosine < self.min_cosine else self.min_cosine

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.elements if self.elements else 0.0

    @property
    def rms(self) -> float:
        """Root mean square of the differences."""
        return math.sqrt(self.sum_squares / self.elements) if self.elements else 0.0

    @property
    def reference_rms(self) -> float:
        return math.sqrt(self.reference_sum_squares / self.elements) if self.elements else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean_abs": self.mean_abs, "rms": self.rms, "reference_rms": self.reference_rms}


Slice = Stats  # the numbers of one slice of rows, as Stats.measure gives them


def allowed_error(dtype: torch.dtype, transformers_error: float, scale: float, bound: float = ACCURACY_RATIO) -> float:
    """`bound` (ACCURACY_RATIO, or the fast mode's bound) x transformers' own error against float64, never below
    eps(dtype) x `scale` (the values' size), so that exact zeros on both sides do not divide by zero."""
    return bound * max(transformers_error, torch.finfo(dtype).eps * scale)


@dataclass
class Accuracy:
    """One output compared three ways: hfbert against transformers (same dtype), and each of them against
    transformers in float64, the exact reference. Passes when hfbert is about as accurate as transformers."""

    dtype: torch.dtype
    tolerance: float | None = None  # optional absolute bound on the distance to transformers
    versus_transformers: Stats = field(default_factory=Stats)
    ours_error: Stats = field(default_factory=Stats)  # hfbert against float64
    reference_error: Stats = field(default_factory=Stats)  # transformers (same dtype) against float64
    bound: float = ACCURACY_RATIO  # hfbert's RMS error may be this many times transformers' (the fast mode's: 3)

    def update(self, ours: Tensor, theirs: Tensor, exact: Tensor) -> None:
        self.add(self.measure(ours, theirs, exact))

    @staticmethod
    def measure(ours: Tensor, theirs: Tensor, exact: Tensor) -> tuple[list[Stats], list[Stats], list[Stats]]:
        """hfbert against transformers, hfbert against float64, transformers against float64."""
        return Stats.measure(ours, theirs), Stats.measure(ours, exact), Stats.measure(theirs, exact)

    def add(self, measured: tuple[list[Stats], list[Stats], list[Stats]]) -> None:
        records = (self.versus_transformers, self.ours_error, self.reference_error)
        for stats, slices in zip(records, measured, strict=True):
            stats.add(slices)

    @property
    def allowed_error(self) -> float:
        """The most RMS error against float64 that hfbert may have on this output."""
        return allowed_error(self.dtype, self.reference_error.rms, self.reference_error.reference_rms, self.bound)

    @property
    def ratio(self) -> float:
        """hfbert's RMS error over transformers' (both against float64); 0 / 0 is 1, x / 0 is inf."""
        ours, theirs = self.ours_error.rms, self.reference_error.rms
        if math.isnan(ours) or math.isnan(theirs):
            return math.nan
        return ours / theirs if theirs > 0 else (1.0 if ours == 0 else math.inf)

    @property
    def passed(self) -> bool:
        accurate = self.ours_error.rms <= self.allowed_error  # False for NaN
        return accurate and (self.tolerance is None or self.versus_transformers.max_abs <= self.tolerance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            **self.versus_transformers.to_dict(),
            "hfbert_error_vs_float64": self.ours_error.to_dict(),
            "transformers_error_vs_float64": self.reference_error.to_dict(),
            "accuracy_ratio": self.ratio,
            "allowed_error": self.allowed_error,
        }


@dataclass
class TopKStats:
    """Agreement of hfbert's top-k token ids with the float64 model's at each position."""

    positions: int = 0
    identical: int = 0
    near_ties: int = 0  # ids differ, but only among tokens whose exact logits are tied within the allowed error

    def update(self, ours: Tensor, exact: Tensor, tie: float, k: int = TOP_K) -> None:
        self.add(self.measure(ours, exact, tie, k))

    @staticmethod
    def measure(ours: Tensor, exact: Tensor, tie: float, k: int = TOP_K) -> tuple[int, int, int]:
        """(positions, identical, near ties) of this batch."""
        ours_ids = ours.topk(k, dim=-1).indices
        exact_values, exact_ids = exact.topk(k, dim=-1)
        identical = (ours_ids == exact_ids).all(-1)
        # Our ids, scored by the exact logits: as good as the exact top-k, rank by rank, up to the tie?
        tied = (exact.gather(-1, ours_ids) - exact_values).abs() <= tie
        return ours_ids.shape[0], int(identical.sum()), int((~identical & tied.all(-1)).sum())

    def add(self, measured: tuple[int, int, int]) -> None:
        positions, identical, near_ties = measured
        self.positions += positions
        self.identical += identical
        self.near_ties += near_ties

    @property
    def disagreements(self) -> int:
        return self.positions - self.identical - self.near_ties

    @property
    def passed(self) -> bool:
        return self.disagreements == 0

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, **asdict(self), "disagreements": self.disagreements}


@dataclass
class Row:
    """One compared output: its numbers over all cases, and per case."""

    name: str
    order: int  # position in the forward pass; the first failing row in this order is the first divergence
    new: Callable[[], Accuracy | TopKStats]
    total: Accuracy | TopKStats = field(init=False)
    by_case: dict[str, Accuracy | TopKStats] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        self.total = self.new()

    @property
    def passed(self) -> bool:
        return self.total.passed

    def update(self, case: str, *tensors: Tensor, **options: Any) -> Any:
        """Measure this batch once, add it to the total and to its case; returns what was measured."""
        measured = self.total.measure(*tensors, **options)
        for record in (self.total, self.by_case.setdefault(case, self.new())):
            record.add(measured)
        return measured

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "note": self.note,
            **self.total.to_dict(),
            "by_case": {case: record.to_dict() for case, record in self.by_case.items()},
        }
