"""Parity with transformers: run a checkpoint in hfbert and in `transformers` side by side, output by output.

    >>> from hfbert.tools.parity import run_parity
    >>> report = run_parity("google-bert/bert-base-uncased")  # doctest: +SKIP
    >>> print(report.table()); report.passed  # doctest: +SKIP

What runs: a fixed battery of real sentences (`hfbert/data/parity_sentences.txt`, or your own), tokenized with
the checkpoint's tokenizer (`hfbert.BertTokenizer`), as five cases:

- "single": every text alone (batch of one, no padding);
- "pairs": consecutive texts as two segments (token_type_ids 0 / 1), batched and padded right (skipped when the
  model has a single token type);
- "right padding" and "left padding": the texts in batches of `batch_size`; with left padding both models get
  `position_ids = cumsum(attention_mask) - 1` (clamped at 0), so real tokens start at position 0 in both;
- "max length": one sequence exactly `max_position_embeddings` tokens long (the texts repeated, truncated).

What is compared, over real (non-pad) positions only: the embeddings output and every layer's hidden state, the
pooler (when the checkpoint has one), the attention probabilities of every layer (rows of real query tokens),
and, when the checkpoint has a masked-LM head (`cls.predictions.*`), the MLM logits and the top-5 token ids at
every real position. Attention probabilities exist only in the eager implementation: with `attn="sdpa"` the
hidden states, pooler and logits come from the sdpa models and the attention rows from an extra eager call of
both models' backbones on the same batch (marked "eager pass" in the table).

How it runs: hfbert and transformers each load the checkpoint once, as the masked-LM model when it has that head
(its backbone, with the checkpoint's pooler where there is one, gives the backbone's rows; `with_pooler`), else as
the backbone. Every batch goes through each model and is compared at once; only the running sums are kept. The
float64 reference runs once per batch, eager, for every output: eager and sdpa differ in float64 by float64
rounding (1e-16 relative), nine orders of magnitude below the float32 errors it measures, so it is exact enough for
the sdpa rows too. In float32 runs it shares transformers' float32 weights and casts each to float64 as it is read
(`float64_twin`: what transformers' model cast to float64 computes, bit for bit, without 880 MB more for bert-base).

The verdict is anchored to exact arithmetic. transformers also runs the same inputs in float64 (the exact
reference; on CUDA on the GPU, TF32 off), and each output is judged by accuracy, not by its distance to another
fp32 run: it passes when hfbert's RMS error against float64 is at most `ACCURACY_RATIO` (1.5) times
transformers' own RMS error against float64, in the same dtype on the same device (`linear_kernel="fast"`, hfbert
through `optimize_for_inference(precision="high")`: that mode's own bound, `ACCURACY_BOUNDS["high"]`, 3x). The
allowed error never drops below eps(dtype) x the RMS of the float64 values, so that exact zeros on both sides do
not divide by zero. RMS rather than max: the maxima of two sets of rounding errors differ by up to 2x by chance,
while a less accurate kernel raises the RMS every time, and a real port bug raises it by orders of magnitude. Why
not a fixed tolerance: at bert-base scale, with the outlier hidden dimensions trained BERTs carry, transformers'
own fp32 is up to 4e-4 away from float64 and its sdpa and eager kernels differ by 4e-5; a fixed 1e-5 fails correct
ports, and a looser one misses real bugs on small models. `tolerance=ABS` (`--tolerance`) adds an absolute bound on the
distance to transformers for those who ask.

Numbers per output, over all cases, against transformers in the same dtype: max abs = max |a - b|; max rel = max
over token vectors of ||a - b|| / ||b|| (L2); mean abs = mean |a - b|; min cos = smallest cosine similarity of a
token vector (an attention row per head, a pooler vector per sequence). Then hfbert's and transformers' max abs
and RMS error against float64, and the ratio of the RMS errors. Top-5 passes when, at every position, hfbert's
top-5 ids equal the float64 model's, or differ only among tokens whose float64 logits are tied within twice the
bound (3x; 6x in the fast mode) times transformers' max abs error on that batch's logits (a tie that fp32 rounding
can break either way).

transformers is the reference, not a dependency: it is imported only inside these functions
(`pip install 'hfbert[parity]'`).
"""

from __future__ import annotations

import copy
import functools
import gc
import importlib.metadata
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from converters.dtypes import DTYPES
from hfbert.modeling.attention import ATTENTION_IMPLEMENTATIONS
from hfbert.tools.extras import import_pyplot, import_transformers
from hfbert.tools.texts import display_name, numbered_lines

TOP_K = 5
# hfbert's linear layers as built (`nn.Linear`), or swapped by `hfbert.optimize_for_inference`: "packed" (its
# default, precision "highest": judged by ACCURACY_RATIO) or "fast" (precision "high": judged by its own bound).
LINEAR_KERNELS = (None, "standard", "packed", "fast")


ACCURACY_RATIO = 1.5  # hfbert's RMS error against float64 may be at most this many times transformers' own


def default_texts() -> list[str]:
    """The shipped battery: about 40 varied real English sentences."""
    text = resources.files("hfbert").joinpath("data", "parity_sentences.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def read_texts(path: str | os.PathLike) -> list[str]:
    """One text per line (`-`: standard input); blank lines are skipped; invalid UTF-8 is named with its line and
    column."""
    texts = [line for _, line in numbered_lines(path) if line.strip()]
    if not texts:
        raise ValueError(f"{display_name(path)}: no text in the file (expected one text per line)")
    return texts


# -- statistics -----------------------------------------------------------------------------------------------


def _worse(current: float, value: float) -> float:
    """The larger of two errors, where NaN (a model produced NaN or inf) is the worst of all."""
    return value if math.isnan(value) or value > current else current


class Slice(NamedTuple):
    """The numbers of one slice of rows, as `Stats.measure` computes them and `Stats.add` folds them in."""

    max_abs: float
    reference_max_abs: float
    sum_abs: float
    sum_squares: float
    reference_sum_squares: float
    elements: int
    vectors: int
    max_rel: float
    min_cosine: float


@dataclass
class Stats:
    """Differences between two sets of vectors, accumulated over batches."""

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
    def measure(ours: Tensor, reference: Tensor) -> list[Slice]:
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
                Slice(
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

    def add(self, slices: list[Slice]) -> None:
        for part in slices:  # in order: the sums come out the same whichever records they are added to
            self.max_abs = _worse(self.max_abs, part.max_abs)
            self.reference_max_abs = _worse(self.reference_max_abs, part.reference_max_abs)
            self.sum_abs += part.sum_abs
            self.sum_squares += part.sum_squares
            self.reference_sum_squares += part.reference_sum_squares
            self.elements += part.elements
            self.vectors += part.vectors
            self.max_rel = _worse(self.max_rel, part.max_rel)
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
    def measure(ours: Tensor, theirs: Tensor, exact: Tensor) -> tuple[list[Slice], list[Slice], list[Slice]]:
        """hfbert against transformers, hfbert against float64, transformers against float64."""
        return Stats.measure(ours, theirs), Stats.measure(ours, exact), Stats.measure(theirs, exact)

    def add(self, measured: tuple[list[Slice], list[Slice], list[Slice]]) -> None:
        for stats, slices in zip(
            (self.versus_transformers, self.ours_error, self.reference_error), measured, strict=True
        ):
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


# -- the report -----------------------------------------------------------------------------------------------


@dataclass
class ParityReport:
    model: str
    model_path: str
    reference_path: str  # where transformers loaded from: model_path unless a reference was given
    device: str
    dtype: str
    attn: str
    linear_kernel: str  # what hfbert's linear layers ran on: "F.linear", "oneDNN, packed" or "oneDNN"
    instruction_set: str  # of the CPU kernels (hfbert.modeling.cpu.instruction_set())
    tolerance: float | None  # the optional absolute bound on the distance to transformers
    num_layers: int
    versions: dict[str, str]
    weight_files: list[dict[str, Any]]
    cases: list[dict[str, Any]]
    rows: list[Row]
    reference_weight_files: list[dict[str, Any]] = field(default_factory=list)  # only with a separate reference
    seconds: float = 0.0
    # The bound every output is judged against: ACCURACY_RATIO, or with linear_kernel="fast" the contract of
    # optimize_for_inference(precision="high") (hfbert.inference.ACCURACY_BOUNDS["high"]).
    accuracy_bound: float = ACCURACY_RATIO
    precision: str = "highest"  # the optimize_for_inference precision whose bound applies

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.rows)

    @property
    def first_divergence(self) -> str | None:
        """The first output, in forward order, that fails (None when all pass)."""
        failing = [row for row in self.rows if not row.passed]
        return min(failing, key=lambda row: row.order).name if failing else None

    @property
    def rule(self) -> str:
        rule = f"hfbert's RMS error vs float64 <= {self.accuracy_bound:g}x transformers' own ({self.dtype})"
        if self.accuracy_bound != ACCURACY_RATIO:
            rule += f", the bound of optimize_for_inference(precision={self.precision!r})"
        return rule + (f", and max abs vs transformers <= {self.tolerance:g}" if self.tolerance is not None else "")

    def table(self) -> str:
        tokens = sum(case["real_tokens"] for case in self.cases)
        described = ", ".join(f"{case['name']} {case['sequences']}" for case in self.cases)
        lines = [f"model      {self.model_path}"]
        if self.reference_path != self.model_path:
            lines.append(f"reference  {self.reference_path} (loaded in transformers)")
        where = self.versions["device_name"]
        lines += [
            f"run        {self.device} ({where}, {self.instruction_set}), {self.dtype}, attention {self.attn}, "
            f"linear {self.linear_kernel}; hfbert {self.versions['hfbert']}, "
            f"transformers {self.versions['transformers']}, torch {self.versions['torch']}",
            f"inputs     {described} sequences; {tokens} real tokens compared per output",
            f"verdict    {self.rule}",
            "",
            f"{'':<28} {'hfbert vs transformers (' + self.dtype + ')':<46}  {'error vs float64: max abs, RMS':<32}",
            f"{'output':<28} {'max abs':>10} {'max rel':>10} {'mean abs':>10} {'min cos':>11}  "
            f"{'hfbert':>10} {'transf.':>10} {'hfbert':>10} {'transf.':>10} {'ratio':>6}  result",
        ]
        for row in self.rows:
            verdict = "pass" if row.passed else "FAIL"
            if isinstance(row.total, TopKStats):
                s = row.total
                numbers = f"{s.identical}/{s.positions} positions identical to float64's, {s.near_ties} near ties"
                lines.append(f"{row.name:<28} {numbers:<102} {verdict}")
                continue
            accuracy, s = row.total, row.total.versus_transformers
            note = f"  ({row.note})" if row.note else ""
            lines.append(
                f"{row.name:<28} {s.max_abs:>10.3e} {s.max_rel:>10.3e} {s.mean_abs:>10.3e} {s.min_cosine:>11.8f}  "
                f"{accuracy.ours_error.max_abs:>10.3e} {accuracy.reference_error.max_abs:>10.3e} "
                f"{accuracy.ours_error.rms:>10.3e} {accuracy.reference_error.rms:>10.3e} "
                f"{accuracy.ratio:>6.2f}  {verdict}{note}"
            )
        lines.append("")
        first = self.first_divergence
        if first is None:
            ratios = [(row.total.ratio, row.name) for row in self.rows if isinstance(row.total, Accuracy)]
            worst, name = max(ratios)
            accurate = (
                "as accurate as transformers' own"
                if self.accuracy_bound == ACCURACY_RATIO
                else f"within {self.accuracy_bound:g}x the error of transformers' own"
            )
            lines.append(f"all {len(self.rows)} outputs {accurate} {self.dtype} (worst ratio {worst:.2f}, {name})")
        else:
            failed = sum(not row.passed for row in self.rows)
            lines.append(f"{failed} of {len(self.rows)} outputs fail ({self.rule}); first divergence: {first}")
            row = next(row for row in self.rows if row.name == first)
            cases = [case for case, record in row.by_case.items() if not record.passed]
            lines.append(f"           in the cases: {', '.join(cases)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "rule": self.rule,
            "accuracy_ratio_bound": self.accuracy_bound,
            "precision": self.precision,
            "model": self.model,
            "model_path": self.model_path,
            "reference_path": self.reference_path,
            "device": self.device,
            "dtype": self.dtype,
            "attn": self.attn,
            "linear_kernel": self.linear_kernel,
            "instruction_set": self.instruction_set,
            "tolerance": self.tolerance,
            "num_layers": self.num_layers,
            "versions": self.versions,
            "weight_files": self.weight_files,
            "reference_weight_files": self.reference_weight_files,
            "cases": self.cases,
            "seconds": self.seconds,
            "definitions": {
                "max_abs": "max |a - b| over real positions, hfbert (a) against transformers in the same dtype (b)",
                "max_rel": "max over token vectors of ||a - b|| / ||b|| (L2)",
                "mean_abs": "mean |a - b| over real positions",
                "min_cosine": "min cosine similarity of a token vector (attention: a row per head; pooler: a sequence)",
                "hfbert_error_vs_float64": "the same numbers, hfbert against transformers run in float64",
                "transformers_error_vs_float64": "the same numbers, transformers (same dtype) against its float64 run",
                "rms": "root mean square of the differences",
                "accuracy_ratio": "hfbert's RMS error vs float64 / transformers' RMS error vs float64",
                "allowed_error": f"{self.accuracy_bound:g} x max(transformers' RMS error, eps(dtype) x RMS of the "
                "values)",
                "passed": "hfbert's RMS error vs float64 <= allowed_error (and max_abs <= tolerance when given); "
                f"top-5: every position identical to float64's or a near tie within {2 * self.accuracy_bound:g}x "
                "transformers' max abs error",
            },
            "rows": [row.to_dict() for row in self.rows],
        }

    def write_json(self, path: str | os.PathLike) -> None:
        from converters.atomic_write import atomic_file

        with atomic_file(path) as temporary:
            temporary.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    def plot(self, path: str | os.PathLike) -> None:
        """Write `figure()` to an image file (the format from its suffix; png by default), atomically."""
        from converters.atomic_write import atomic_file

        pyplot = import_pyplot()
        figure = self.figure()
        with atomic_file(path) as temporary:
            figure.savefig(temporary, dpi=120, format=Path(path).suffix.lstrip(".") or "png")
        pyplot.close(figure)

    def figure(self) -> Any:
        """A matplotlib figure of what is judged, per output in forward order: above, hfbert's and transformers'
        RMS error against float64 (log scale; hidden states and attention probabilities as separate series,
        hfbert filled, transformers hollow, so that coinciding values stay visible); below, their ratio against
        the report's bound (`accuracy_bound`; where the eps floor allows more, that output's own bound is marked).
        PASS or FAIL, against which bound, in the title."""
        pyplot = import_pyplot()
        floor = 1e-12  # an exact agreement (RMS 0) is drawn here
        accuracy_rows = [row for row in self.rows if isinstance(row.total, Accuracy)]
        hidden = [row for row in accuracy_rows if row.name == "embeddings" or row.name.startswith("layer ")]
        attentions = [row for row in accuracy_rows if row.name.startswith("attentions")]
        extra = [row for row in accuracy_rows if row.name in ("pooler", "mlm logits")]
        # x: embeddings at 0, layer i (its hidden state and its attention probabilities) at i + 1, then the rest.
        x_hidden = list(range(len(hidden)))
        x_attentions = [int(row.name.split()[-1]) + 1 for row in attentions]
        x_extra = [len(hidden) + offset for offset in range(len(extra))]
        series = [
            ("hidden states", hidden, x_hidden, "o", "C0"),
            ("attention probabilities", attentions, x_attentions, "^", "C2"),
            ("pooler / mlm logits", extra, x_extra, "D", "C4"),
        ]
        finite = [r.total.ratio for r in accuracy_rows if math.isfinite(r.total.ratio) and r.total.ratio > 0]
        bound = self.accuracy_bound
        low, high = min([0.5, *finite]) / 1.5, max([bound * 2, *finite]) * 30  # room for the legend
        floored = False  # whether some output's eps floor allows more than the bound
        figure, (errors, ratios) = pyplot.subplots(
            2, 1, figsize=(10, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
        )
        for label, rows, xs, marker, color in series:
            if not rows:
                continue
            line = "-" if rows is not extra else "none"
            ours = [max(row.total.ours_error.rms, floor) for row in rows]
            theirs = [max(row.total.reference_error.rms, floor) for row in rows]
            errors.plot(
                xs,
                theirs,
                marker=marker,
                linestyle=line.replace("-", "--"),
                color=color,
                markersize=11,
                markerfacecolor="none",
                markeredgewidth=1.5,
                alpha=0.8,
                label=f"{label}: transformers",
            )
            errors.plot(xs, ours, marker=marker, linestyle=line, color=color, markersize=5, label=f"{label}: hfbert")
            values = [row.total.ratio for row in rows]
            passed = [row.passed for row in rows]
            xs = [x + 0.12 for x in xs] if rows is attentions else xs  # beside the hidden state of the same layer
            ratios.plot(xs, values, linestyle=line, color=color, alpha=0.4)
            for x, value, ok in zip(xs, values, passed, strict=True):
                shown = min(max(value, low), high) if math.isfinite(value) else high / 2  # NaN, inf: at the top
                ratios.plot(
                    [x],
                    [shown],
                    marker=marker,
                    linestyle="none",
                    markersize=7,
                    color=color if ok else "red",
                    markeredgecolor="black" if not ok else color,
                    gid="ratio",
                )
            for x, row in zip(xs, rows, strict=True):  # an output whose eps floor allows more than the bound
                transformers_error = row.total.reference_error.rms
                if transformers_error > 0 and row.total.allowed_error > bound * transformers_error * 1.001:
                    floored = True
                    ratios.plot(
                        [x],
                        [row.total.allowed_error / transformers_error],
                        marker="_",
                        color="grey",
                        markersize=14,
                        linestyle="none",
                        gid="bound of this output",
                    )
        errors.set_yscale("log")
        plotted = [max(r.total.ours_error.rms, r.total.reference_error.rms, floor) for r in accuracy_rows] or [1.0]
        errors.set_ylim(top=max(plotted) * 60)  # room for the legend above the data
        errors.set_ylabel(f"RMS error vs float64\n({self.dtype}; 0 drawn at {floor:g})")
        errors.legend(fontsize="small", ncol=3, loc="upper center")
        errors.grid(True, which="major", alpha=0.3)
        ratios.set_yscale("log")
        ratios.axhspan(low, bound, color="green", alpha=0.08)
        ratios.axhline(
            bound,
            color="red",
            linestyle="--",
            linewidth=1.2,
            label=f"bound: {bound:g}x transformers' own error"
            + (f" (precision {self.precision!r})" if bound != ACCURACY_RATIO else ""),
        )
        ratios.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="as accurate as transformers")
        if floored:
            ratios.plot(
                [], [], marker="_", color="grey", markersize=14, linestyle="none", label="its bound (eps floor)"
            )
        if any(not row.passed for row in accuracy_rows):
            ratios.plot([], [], marker="o", color="red", markeredgecolor="black", linestyle="none", label="FAIL")
        ratios.set_ylim(low, high)
        ratios.set_ylabel("hfbert RMS error /\ntransformers RMS error")
        ratios.legend(fontsize="small", loc="upper center", ncol=4)
        ratios.grid(True, axis="y", which="major", alpha=0.3)
        ticks = x_hidden + x_extra
        names = ["emb"] + [str(i) for i in range(self.num_layers)] + [row.name.replace(" ", "\n") for row in extra]
        ratios.set_xticks(ticks, names)
        ratios.set_xlabel("output (layer)")
        failed = [row.name for row in self.rows if not row.passed]
        within = f"{bound:g}x transformers' RMS error vs float64"
        if bound != ACCURACY_RATIO:
            within += f" (the bound of precision {self.precision!r})"
        verdict = (
            f"PASS: all {len(self.rows)} outputs within {within}"
            if not failed
            else f"FAIL: {len(failed)} of {len(self.rows)} outputs beyond {within}; "
            f"first divergence: {self.first_divergence}"
        )
        figure.suptitle(
            f"{verdict}\n{self.model[-60:]}, {self.device}, {self.dtype}, attention {self.attn}, "
            f"linear {self.linear_kernel}",
            color="darkgreen" if not failed else "darkred",
            fontsize="medium",
        )
        figure.tight_layout()
        return figure


# -- the inputs -----------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    batches: list[dict[str, Tensor]]  # forward keyword arguments, one dict per batch

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batches": len(self.batches),
            "sequences": sum(len(batch["input_ids"]) for batch in self.batches),
            "real_tokens": sum(int(batch["attention_mask"].sum()) for batch in self.batches),
            "longest": max(batch["input_ids"].shape[1] for batch in self.batches),
        }


def build_cases(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int, segments: int) -> list[Case]:
    """The battery described in the module docstring, as forward keyword arguments."""
    if not texts:
        raise ValueError("no texts to run")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")

    def encode(first: list[str], second: list[str] | None = None, **options: Any) -> dict[str, Tensor]:
        return dict(tokenizer(first, second, truncation=True, max_length=max_length, return_tensors="pt", **options))

    def chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
        for start in range(0, len(items), batch_size):
            yield list(items[start : start + batch_size])

    cases = [Case("single", [encode([text]) for text in texts])]
    if segments >= 2 and len(texts) >= 2:
        pairs = list(zip(texts[0::2], texts[1::2], strict=False))  # an odd last text has no partner
        batches = [encode([a for a, _ in chunk], [b for _, b in chunk], padding=True) for chunk in chunks(pairs)]
        cases.append(Case("pairs", batches))
    cases.append(Case("right padding", [encode(chunk, padding=True) for chunk in chunks(texts)]))
    left = [encode(chunk, padding=True, padding_side="left") for chunk in chunks(texts)]
    for batch in left:
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    cases.append(Case("left padding", left))
    # Repeat the texts until they are longer than the model's maximum length, then truncate to exactly it.
    words = len(tokenizer(" ".join(texts))["input_ids"])
    long_text = " ".join(list(texts) * (max_length // max(1, words - 2) + 1))
    longest = encode([long_text])
    if longest["input_ids"].shape[1] == max_length:
        cases.append(Case("max length", [longest]))
    return cases


# -- running both models --------------------------------------------------------------------------------------


@contextmanager
def _quiet_transformers(transformers: Any) -> Iterator[None]:
    """No load reports or "Loading weights" bars from transformers while the reference models load."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    progress = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if progress:
            logging.enable_progress_bar()


@contextmanager
def _no_tf32(active: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if active:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def load_reference(
    transformers: Any,
    class_name: str | type,
    directory: Path,
    attn: str,
    device: str,
    dtype: torch.dtype,
    **kwargs: Any,
) -> Any:
    """A transformers model (`class_name`: a class of transformers, or one) in eval mode, failing (rather than
    comparing against random weights) if it initialised any weight. The float64 one is the exact reference: its
    weights are the checkpoint's, cast up without loss."""
    model_class = getattr(transformers, class_name) if isinstance(class_name, str) else class_name
    with _quiet_transformers(transformers):
        model, info = model_class.from_pretrained(
            directory, attn_implementation=attn, output_loading_info=True, dtype=torch.float32, **kwargs
        )
    if info["missing_keys"] or info["mismatched_keys"]:
        missing = sorted(info["missing_keys"]) + [str(key) for key in info["mismatched_keys"]]
        raise ValueError(f"{directory}: transformers.{model_class.__name__} could not load {', '.join(missing[:5])}")
    return model.to(device=device, dtype=dtype).eval()


@functools.cache
def with_pooler(masked_lm_class: type, pooler_class: type) -> type:
    """`masked_lm_class` (hfbert's or transformers' BertForMaskedLM) whose backbone has the checkpoint's pooler too.
    Both libraries build BertForMaskedLM without one (add_pooling_layer=False); with it, one masked-LM model gives
    every row, the pooler computed by its own BertModel.forward, as a BertModel with a pooler computes it."""

    class WithPooler(masked_lm_class):
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            self.bert.pooler = pooler_class(self.config)

    WithPooler.__name__ = WithPooler.__qualname__ = f"{masked_lm_class.__name__}WithPooler"
    return WithPooler


class _Float64(torch.nn.Module):
    """A parametrization: the parameter, cast to float64 each time its module reads it."""

    def forward(self, tensor: Tensor) -> Tensor:
        return tensor.to(torch.float64)


def float64_twin(model: Any) -> Any:
    """`model` (float32) in float64 without a float64 copy of its weights: its modules copied, their parameters the
    same tensors, each cast to float64 whenever a module reads it (exact: every float32 is a float64). It computes
    what `model.to(torch.float64)` computes, bit for bit (tests/test_parity.py), at one cast of the weights per
    forward (about 0.1 s for bert-base) instead of 880 MB more held in memory. Its config is its own, so its
    attention implementation can differ from the model's."""
    from torch.nn.utils import parametrize

    twin = copy.deepcopy(model, memo={id(parameter): parameter for parameter in model.parameters()})
    for module in list(twin.modules()):  # listed first: each parametrization adds modules
        if type(module) is torch.nn.Embedding and module.max_norm is None:
            # A lookup: the rows it reads, cast (the same values as a lookup in the cast table, without casting
            # bert-base's 30522 x 768 word embeddings, 188 MB, for a few rows at every forward).
            module.register_forward_hook(lambda _, __, output: output.to(torch.float64))
            continue
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and parameter.is_floating_point():
                parametrize.register_parametrization(module, name, _Float64(), unsafe=True)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(torch.float64)
    return twin.eval()


class _Runner(NamedTuple):
    """One of the three models of a run, as the calls the comparison makes."""

    model: Any  # the whole model: its attention implementation is switched for the eager attention call
    backbone: Any  # its BertModel: hidden states, pooler, attention probabilities
    head: Any  # its masked-LM head (logits from the last hidden state, as its forward computes them), or None


@contextmanager
def _eager_attention(*models: Any) -> Iterator[None]:
    """The models' attention implementation switched to eager (the one that returns the probabilities)."""
    saved = [model.config._attn_implementation for model in models]
    for model in models:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        for model, implementation in zip(models, saved, strict=True):
            model.set_attn_implementation(implementation)


def _describe_files(files: list[Path]) -> list[dict[str, Any]]:
    from converters.hub import sha256_of

    return [{"name": file.name, "bytes": file.stat().st_size, "sha256": sha256_of(file)} for file in files]


def fast_mode_bound() -> float:
    """The bound of `optimize_for_inference(model, precision="high")` (hfbert.inference.ACCURACY_BOUNDS["high"])."""
    from hfbert.inference import ACCURACY_BOUNDS

    return float(ACCURACY_BOUNDS["high"])


def run_parity(
    model_path: str | os.PathLike,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    attn: str = "sdpa",
    texts: Sequence[str] | None = None,
    batch_size: int = 8,
    *,
    revision: str | None = None,
    reference: str | os.PathLike | None = None,
    linear_kernel: str | None = None,
    tolerance: float | None = None,
    progress: bool = True,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    model_name: str | None = None,
) -> ParityReport:
    """Compare hfbert with transformers, and both with transformers in float64, on `model_path` (a local
    directory or a Hub repo id); see the module docstring for what runs, what is compared and when it passes.
    `reference`: load transformers from this checkpoint instead (default: `model_path`), e.g. to check a
    converted or re-saved copy against its original. `linear_kernel`: "standard" (default: `nn.Linear`, as built),
    "packed" (hfbert's model through `hfbert.optimize_for_inference`, judged by the same 1.5x) or "fast" (through
    `optimize_for_inference(model, precision="high")`, judged by that mode's bound, 3x). `tolerance`: also require
    max abs against transformers to be at most this. `cache_dir`, `token`: for Hub repo ids, as in huggingface_hub.
    `model_name`: what the report calls the model (default: `model_path` as given)."""
    transformers = import_transformers()
    from converters.checkpoint_files import read_checkpoint
    from converters.hub import resolve_checkpoint
    from converters.key_map import MLM_HEAD, head_of, normalize_name
    from hfbert.modeling.cpu import cpu_name, instruction_set
    from hfbert.modeling.heads import BertForMaskedLM
    from hfbert.modeling.model import BertModel, BertPooler
    from hfbert.modeling.tokenizer import BertTokenizer

    started = time.perf_counter()
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    dtype_name = next(name for name, value in DTYPES.items() if value == dtype)
    if attn not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(f"attn must be one of {', '.join(ATTENTION_IMPLEMENTATIONS)}, not {attn!r}")
    if linear_kernel not in LINEAR_KERNELS:
        raise ValueError(f"linear_kernel must be one of {', '.join(map(str, LINEAR_KERNELS))}, not {linear_kernel!r}")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if tolerance is not None and not tolerance >= 0:
        raise ValueError(f"tolerance must be a number >= 0, got {tolerance}")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    if torch.device(device).type == "mps":
        raise ValueError(f"device {device!r}: the float64 reference cannot run on mps (it has no float64); use cpu")
    precision = "high" if linear_kernel == "fast" else "highest"
    bound = fast_mode_bound() if linear_kernel == "fast" else ACCURACY_RATIO

    hub = {"cache_dir": cache_dir, "token": token}
    directory = Path(resolve_checkpoint(model_path, revision, include_tokenizer=True, **hub))
    checkpoint = read_checkpoint(directory)
    stored = {normalize_name(name) for name in checkpoint.tensors}
    has_pooler = any(name.startswith("pooler.") for name in stored)
    has_mlm_head = any(head_of(name) == MLM_HEAD for name in stored)
    weight_files = _describe_files(checkpoint.files)
    del checkpoint
    reference_directory = Path(resolve_checkpoint(reference, **hub)) if reference is not None else directory
    reference_files = _describe_files(read_checkpoint(reference_directory).files) if reference is not None else []

    # One model per library, loaded once: the masked-LM model when the checkpoint has that head (its backbone gives
    # the hidden states, the pooler and the attention probabilities), else the backbone alone.
    tokenizer = BertTokenizer.from_pretrained(directory)
    if has_mlm_head:
        their_class = transformers.BertForMaskedLM
        if has_pooler:
            their_class = with_pooler(their_class, transformers.models.bert.modeling_bert.BertPooler)
        their_options: dict[str, Any] = {}
        our_class = with_pooler(BertForMaskedLM, BertPooler) if has_pooler else BertForMaskedLM
        ours = our_class.from_pretrained(directory, dtype=dtype, device=device, attn_implementation=attn)
    else:
        their_class, their_options = transformers.BertModel, {"add_pooling_layer": has_pooler}
        ours = BertModel.from_pretrained(
            directory, dtype=dtype, device=device, attn_implementation=attn, add_pooling_layer=has_pooler
        )
    theirs = load_reference(transformers, their_class, reference_directory, attn, device, dtype, **their_options)
    # The exact reference, eager, once per batch for every output. Eager and sdpa differ in float64 by float64
    # rounding (1e-16 relative), nine orders of magnitude below the float32 errors it measures, so one eager run
    # serves the sdpa rows too. In float32 runs it shares transformers' weights (float64_twin); a bf16 or fp16 run
    # loads its own, from the checkpoint's float32 values.
    if dtype == torch.float32:
        exact = float64_twin(theirs)
    else:
        exact = load_reference(
            transformers, their_class, reference_directory, attn, device, torch.float64, **their_options
        )
    exact.set_attn_implementation("eager")
    config = ours.config
    cases = build_cases(
        tokenizer, list(texts or default_texts()), batch_size, config.max_position_embeddings, config.type_vocab_size
    )

    def accuracy() -> Accuracy:
        return Accuracy(dtype, tolerance, bound=bound)

    layers = config.num_hidden_layers
    attention_note = "eager pass" if attn == "sdpa" else ""
    rows = {"embeddings": Row("embeddings", 0, accuracy)}
    rows.update({f"layer {i}": Row(f"layer {i}", 2 * i + 2, accuracy) for i in range(layers)})
    if has_pooler:
        rows["pooler"] = Row("pooler", 2 * layers + 1, accuracy)
    for i in range(layers):
        rows[f"attentions layer {i}"] = Row(f"attentions layer {i}", 2 * i + 1, accuracy, note=attention_note)
    if has_mlm_head:
        rows["mlm logits"] = Row("mlm logits", 2 * layers + 2, accuracy)
        rows[f"mlm top-{TOP_K}"] = Row(f"mlm top-{TOP_K}", 2 * layers + 3, TopKStats)

    if linear_kernel in ("packed", "fast"):
        from hfbert.inference import optimize_for_inference, packed_layers

        # kernels="always": the packed or fused kernels at every row count, not only where they were measured
        # faster here, so that the verdict covers whatever another machine's measurement may pick.
        optimize_for_inference(ours, kernels="always", **({"precision": precision} if linear_kernel == "fast" else {}))
        forms = set(packed_layers(ours).values())
        ran_kernel = "oneDNN, " + " and ".join(sorted(forms)) if forms else "F.linear"
    else:
        ran_kernel = "F.linear"
    runners = (
        _Runner(ours, ours.bert, ours.cls.predictions) if has_mlm_head else _Runner(ours, ours, None),
        _Runner(theirs, theirs.bert, theirs.cls) if has_mlm_head else _Runner(theirs, theirs, None),
        _Runner(exact, exact.bert, exact.cls) if has_mlm_head else _Runner(exact, exact, None),
    )
    from hfbert.tools.progress import Progress

    if torch.device(device).type == "cpu":
        # Freed memory kept for the next batch, process-wide (hfbert.inference.allocator): without it, every cast of
        # the float64 reference's weights and every large output faults its pages in anew (3x slower).
        from hfbert.inference.allocator import keep_freed_memory

        keep_freed_memory()
    with _no_tf32(torch.device(device).type == "cuda"), torch.no_grad():
        # A bar on a terminal, a line every 30 s in a log (hfbert.tools.progress).
        bar = Progress(sum(len(case.batches) for case in cases), "parity", "batch", enabled=progress)
        for case in cases:
            bar.set_postfix_str(case.name)
            for batch in case.batches:
                batch = {key: value.to(device) for key, value in batch.items()}
                _compare_batch(case.name, batch, runners, rows, dtype, bound, attentions=attn == "eager")
                bar.update()
        bar.close()
    del runners, ours, theirs, exact
    gc.collect()

    return ParityReport(
        model=str(model_name if model_name is not None else model_path),
        model_path=str(directory),
        reference_path=str(reference_directory),
        device=str(device),
        dtype=dtype_name,
        attn=attn,
        linear_kernel=ran_kernel,
        instruction_set=instruction_set(),
        tolerance=tolerance,
        num_layers=layers,
        versions={
            "hfbert": _installed_version("hfbert"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "device_name": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else cpu_name(),
        },
        weight_files=weight_files,
        reference_weight_files=reference_files,
        cases=[case.describe() for case in cases],
        rows=list(rows.values()),
        seconds=round(time.perf_counter() - started, 3),
        accuracy_bound=bound,
        precision=precision,
    )


@contextmanager
def _each_layer_attention(backbone: Any, receive: Callable[[int, Tensor], None]) -> Iterator[None]:
    """`receive(index, probabilities)` called as each layer's self-attention returns its probabilities (eager:
    its second output, the one transformers' own `output_attentions` records), so that they are compared during
    the forward instead of all layers held at once."""
    handles = [
        layer.attention.self.register_forward_hook(lambda _, __, output, index=index: receive(index, output[1]))
        for index, layer in enumerate(backbone.encoder.layer)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _real_rows(x: Tensor, real: Tensor, all_real: bool) -> Tensor:
    """(batch, sequence, ...) -> the vectors at real positions; a view, not a copy, when no position is padding."""
    return x.flatten(0, 1) if all_real else x[real]


def _compare_batch(
    case: str,
    batch: dict[str, Tensor],
    runners: tuple[_Runner, _Runner, _Runner],
    rows: dict[str, Row],
    dtype: torch.dtype,
    bound: float,
    attentions: bool,
) -> None:
    """`batch` through hfbert, transformers and transformers in float64; every row updated at real positions only.
    hfbert and transformers run with the run's attention and, unless that is eager (`attentions`), once more eager
    on the backbone for the attention probabilities; the float64 model runs once, eager, for every output. Each
    of its layers' attention probabilities is compared as it comes out and let go with the other two models':
    at the maximum length they are the largest outputs (bert-base, 512 tokens: 600 MB for the three models)."""
    real = batch["attention_mask"].bool()
    all_real = bool(real.all())
    if attentions:  # an eager run: one call of each model gives every output
        options = dict(output_hidden_states=True, output_attentions=True, return_dict=True)
        outputs = [runner.backbone(**batch, **options) for runner in runners[:2]]
        probabilities = [list(output.attentions) for output in outputs]
        outputs = [(output.hidden_states, output.pooler_output, output.last_hidden_state) for output in outputs]
    else:  # the eager calls first: their probabilities are compared and let go before the sdpa calls run
        with _eager_attention(runners[0].model, runners[1].model):
            probabilities = [
                list(runner.backbone(**batch, output_attentions=True, return_dict=True).attentions)
                for runner in runners[:2]
            ]
    compared = []

    def compare(index: int, exact: Tensor) -> None:
        # (batch, heads, query, key) -> the rows of real query tokens, every key: (tokens * heads, key)
        layer = [x.transpose(1, 2)[real].flatten(0, 1) for x in (probabilities[0][index], probabilities[1][index])]
        probabilities[0][index] = probabilities[1][index] = None
        rows[f"attentions layer {index}"].update(case, *layer, exact.transpose(1, 2)[real].flatten(0, 1))
        compared.append(index)

    with _each_layer_attention(runners[2].backbone, compare):  # the float64 reference: eager, every output
        exact = runners[2].backbone(**batch, output_hidden_states=True, return_dict=True)
    exact = (exact.hidden_states, exact.pooler_output, exact.last_hidden_state)
    if not attentions:
        options = dict(output_hidden_states=True, return_dict=True)
        outputs = [runner.backbone(**batch, **options) for runner in runners[:2]]
        outputs = [(output.hidden_states, output.pooler_output, output.last_hidden_state) for output in outputs]
    outputs.append(exact)
    del exact
    counts = {len(hidden_states) for hidden_states, _, _ in outputs} | {len(layers) + 1 for layers in probabilities}
    if len(counts) != 1 or compared != list(range(len(probabilities[0]))):
        raise ValueError(f"{sorted(counts)} hidden states: hfbert and transformers disagree on the layer count")
    for index, states in enumerate(zip(*(hidden_states for hidden_states, _, _ in outputs), strict=True)):
        rows["embeddings" if index == 0 else f"layer {index - 1}"].update(
            case, *(_real_rows(x, real, all_real) for x in states)
        )
    if "pooler" in rows:
        rows["pooler"].update(case, *(pooler for _, pooler, _ in outputs))
    if runners[0].head is not None:
        # The logits as each masked-LM model's forward computes them: its head on its backbone's last hidden state.
        last = [last for _, _, last in outputs]
        del outputs
        exact = _real_rows(runners[2].head(last[2]), real, all_real)
        ours, theirs = (
            _real_rows(runner.head(x), real, all_real) for runner, x in zip(runners[:2], last[:2], strict=True)
        )
        _, _, reference_error = rows["mlm logits"].update(case, ours, theirs, exact)
        # A swap in the top-k is a real difference unless the exact logits are tied within the allowed error.
        their_max_abs = reference_max_abs = 0.0
        for part in reference_error:  # max |theirs - exact| and max |exact| over this batch, as measured
            their_max_abs = _worse(their_max_abs, part.max_abs)
            reference_max_abs = _worse(reference_max_abs, part.reference_max_abs)
        tie = 2 * allowed_error(dtype, their_max_abs, reference_max_abs, bound)
        rows[f"mlm top-{TOP_K}"].update(case, ours, exact, tie=tie)


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
