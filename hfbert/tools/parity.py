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
hidden states, pooler and logits come from the sdpa models and the attention rows from an extra eager pass of
both models over the same batches (marked "eager pass" in the table).

The verdict is anchored to exact arithmetic. transformers also runs the same inputs in float64 (the exact
reference; on CUDA on the GPU, TF32 off), and each output is judged by accuracy, not by its distance to another
fp32 run: it passes when hfbert's RMS error against float64 is at most `ACCURACY_RATIO` (1.5) times
transformers' own RMS error against float64, in the same dtype on the same device. The allowed error never
drops below eps(dtype) x the RMS of the float64 values, so that exact zeros on both sides do not divide by zero.
RMS rather than max: the maxima of two sets of rounding errors differ by up to 2x by chance, while a less
accurate kernel raises the RMS every time, and a real port bug raises it by orders of magnitude. Why not a fixed
tolerance: at bert-base scale, with the outlier hidden dimensions trained BERTs carry, transformers' own fp32 is
up to 4e-4 away from float64 and its sdpa and eager kernels differ by 4e-5; a fixed 1e-5 fails correct ports, and a
looser one misses real bugs on small models. `tolerance=ABS` (`--tolerance`) adds an absolute bound on the
distance to transformers for those who ask.

Numbers per output, over all cases, against transformers in the same dtype: max abs = max |a - b|; max rel = max
over token vectors of ||a - b|| / ||b|| (L2); mean abs = mean |a - b|; min cos = smallest cosine similarity of a
token vector (an attention row per head, a pooler vector per sequence). Then hfbert's and transformers' max abs
and RMS error against float64, and the ratio of the RMS errors. Top-5 passes when, at every position, hfbert's
top-5 ids equal the float64 model's, or differ only among tokens whose float64 logits are tied within 3x
transformers' max abs error on that batch's logits (a tie that fp32 rounding can break either way).

transformers is the reference, not a dependency: it is imported only inside these functions
(`pip install 'hfbert[parity]'`).
"""

from __future__ import annotations

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
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from converters.dtypes import DTYPES
from hfbert.modeling.attention import ATTENTION_IMPLEMENTATIONS
from hfbert.tools.extras import import_pyplot, import_transformers
from hfbert.tools.texts import display_name, numbered_lines

TOP_K = 5
# hfbert's linear layers as built (`nn.Linear`), or swapped by `hfbert.optimize_for_inference` (packed weights).
LINEAR_KERNELS = (None, "standard", "packed")


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
        if ours.shape != reference.shape:
            raise ValueError(f"shape {tuple(ours.shape)} in hfbert but {tuple(reference.shape)} in the reference")
        ours, reference = ours.flatten(1), reference.flatten(1)
        rows = max(1, 2**22 // max(1, ours.shape[1]))  # float64 in slices of ~32 MB (MLM logits are large)
        for start in range(0, ours.shape[0], rows):
            a, b = ours[start : start + rows].double(), reference[start : start + rows].double()
            difference = (a - b).abs()
            self.max_abs = _worse(self.max_abs, float(difference.max()))
            self.reference_max_abs = _worse(self.reference_max_abs, float(b.abs().max()))
            self.sum_abs += float(difference.sum())
            self.sum_squares += float(difference.square().sum())
            self.reference_sum_squares += float(b.square().sum())
            self.elements += difference.numel()
            self.vectors += a.shape[0]
            relative = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
            self.max_rel = _worse(self.max_rel, float(relative.max()))
            cosine = float(F.cosine_similarity(a, b, dim=1, eps=1e-300).min().clamp(max=1.0))
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


def allowed_error(dtype: torch.dtype, transformers_error: float, scale: float) -> float:
    """ACCURACY_RATIO x transformers' own error against float64, never below eps(dtype) x `scale` (the values'
    size), so that exact zeros on both sides do not divide by zero."""
    return ACCURACY_RATIO * max(transformers_error, torch.finfo(dtype).eps * scale)


@dataclass
class Accuracy:
    """One output compared three ways: hfbert against transformers (same dtype), and each of them against
    transformers in float64, the exact reference. Passes when hfbert is about as accurate as transformers."""

    dtype: torch.dtype
    tolerance: float | None = None  # optional absolute bound on the distance to transformers
    versus_transformers: Stats = field(default_factory=Stats)
    ours_error: Stats = field(default_factory=Stats)  # hfbert against float64
    reference_error: Stats = field(default_factory=Stats)  # transformers (same dtype) against float64

    def update(self, ours: Tensor, theirs: Tensor, exact: Tensor) -> None:
        self.versus_transformers.update(ours, theirs)
        self.ours_error.update(ours, exact)
        self.reference_error.update(theirs, exact)

    @property
    def allowed_error(self) -> float:
        """The most RMS error against float64 that hfbert may have on this output."""
        return allowed_error(self.dtype, self.reference_error.rms, self.reference_error.reference_rms)

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
        ours_ids = ours.topk(k, dim=-1).indices
        exact_values, exact_ids = exact.topk(k, dim=-1)
        identical = (ours_ids == exact_ids).all(-1)
        # Our ids, scored by the exact logits: as good as the exact top-k, rank by rank, up to the tie?
        tied = (exact.gather(-1, ours_ids) - exact_values).abs() <= tie
        self.positions += ours_ids.shape[0]
        self.identical += int(identical.sum())
        self.near_ties += int((~identical & tied.all(-1)).sum())

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

    def update(self, case: str, *tensors: Tensor, **options: Any) -> None:
        for record in (self.total, self.by_case.setdefault(case, self.new())):
            record.update(*tensors, **options)

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
        rule = f"hfbert's RMS error vs float64 <= {ACCURACY_RATIO:g}x transformers' own ({self.dtype})"
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
            lines.append(
                f"all {len(self.rows)} outputs as accurate as transformers' own {self.dtype} "
                f"(worst ratio {worst:.2f}, {name})"
            )
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
            "accuracy_ratio_bound": ACCURACY_RATIO,
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
                "allowed_error": f"{ACCURACY_RATIO:g} x max(transformers' RMS error, eps(dtype) x RMS of the values)",
                "passed": "hfbert's RMS error vs float64 <= allowed_error (and max_abs <= tolerance when given); "
                "top-5: every position identical to float64's or a near tie within 3x transformers' max abs error",
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
        the `ACCURACY_RATIO` bound (where the eps floor allows more, that output's own bound is marked). PASS or
        FAIL in the title."""
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
        low, high = min([0.5, *finite]) / 1.5, max([ACCURACY_RATIO * 2, *finite]) * 30  # room for the legend
        floored = False  # whether some output's eps floor allows more than ACCURACY_RATIO
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
            for x, row in zip(xs, rows, strict=True):  # an output whose eps floor allows more than 1.5x
                transformers_error = row.total.reference_error.rms
                if transformers_error > 0 and row.total.allowed_error > ACCURACY_RATIO * transformers_error * 1.001:
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
        ratios.axhspan(low, ACCURACY_RATIO, color="green", alpha=0.08)
        ratios.axhline(
            ACCURACY_RATIO,
            color="red",
            linestyle="--",
            linewidth=1.2,
            label=f"bound: {ACCURACY_RATIO:g}x transformers' own error",
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
        verdict = (
            f"PASS: all {len(self.rows)} outputs within {ACCURACY_RATIO:g}x transformers' RMS error vs float64"
            if not failed
            else f"FAIL: {len(failed)} of {len(self.rows)} outputs fail; first divergence: {self.first_divergence}"
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
    transformers: Any, class_name: str, directory: Path, attn: str, device: str, dtype: torch.dtype, **kwargs: Any
) -> Any:
    """A transformers model in eval mode, failing (rather than comparing against random weights) if it initialised
    any weight. The float64 one is the exact reference: its weights are the checkpoint's, cast up without loss."""
    with _quiet_transformers(transformers):
        model, info = getattr(transformers, class_name).from_pretrained(
            directory, attn_implementation=attn, output_loading_info=True, dtype=torch.float32, **kwargs
        )
    if info["missing_keys"] or info["mismatched_keys"]:
        missing = sorted(info["missing_keys"]) + [str(key) for key in info["mismatched_keys"]]
        raise ValueError(f"{directory}: transformers.{class_name} could not load {', '.join(missing[:5])}")
    return model.to(device=device, dtype=dtype).eval()


def _describe_files(files: list[Path]) -> list[dict[str, Any]]:
    from converters.hub import sha256_of

    return [{"name": file.name, "bytes": file.stat().st_size, "sha256": sha256_of(file)} for file in files]


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
    converted or re-saved copy against its original. `linear_kernel`: "standard" (default: `nn.Linear`, as built)
    or "packed" (hfbert's models through `hfbert.optimize_for_inference`). `tolerance`: also require max abs
    against transformers to be at most this. `cache_dir`, `token`: for Hub repo ids, as in huggingface_hub.
    `model_name`: what the report calls the model (default: `model_path` as given)."""
    transformers = import_transformers()
    from converters.checkpoint_files import read_checkpoint
    from converters.hub import resolve_checkpoint
    from converters.key_map import MLM_HEAD, head_of, normalize_name
    from hfbert.inference import optimize_for_inference, packed_layers
    from hfbert.modeling.cpu import cpu_name, instruction_set
    from hfbert.modeling.heads import BertForMaskedLM
    from hfbert.modeling.model import BertModel
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

    def references(class_name: str, attention: str, **kwargs: Any) -> tuple[Any, Any]:
        """transformers in the run's dtype, and in float64 on the same device (the exact reference)."""
        return tuple(
            load_reference(transformers, class_name, reference_directory, attention, device, reference_dtype, **kwargs)
            for reference_dtype in (dtype, torch.float64)
        )

    tokenizer = BertTokenizer.from_pretrained(directory)
    ours = BertModel.from_pretrained(
        directory, dtype=dtype, device=device, attn_implementation=attn, add_pooling_layer=has_pooler
    )
    config = ours.config
    theirs, exact = references("BertModel", attn, add_pooling_layer=has_pooler)
    cases = build_cases(
        tokenizer, list(texts or default_texts()), batch_size, config.max_position_embeddings, config.type_vocab_size
    )

    def accuracy() -> Accuracy:
        return Accuracy(dtype, tolerance)

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

    passes = ["backbone"] + (["eager attentions"] if attn == "sdpa" else []) + (["masked LM"] if has_mlm_head else [])
    from hfbert.tools.progress import Progress

    total = len(passes) * sum(len(case.batches) for case in cases)
    packed = linear_kernel == "packed"
    if packed:
        optimize_for_inference(ours)
    ran_kernel = "oneDNN, packed" if packed and packed_layers(ours) else "F.linear"
    with _no_tf32(torch.device(device).type == "cuda"), torch.no_grad():
        # A bar on a terminal, a line every 30 s in a log (hfbert.tools.progress).
        bar = Progress(total, "parity", "batch", enabled=progress)
        for name in passes:
            if name == "eager attentions":
                ours.set_attn_implementation("eager")
                del theirs, exact
                theirs, exact = references("BertModel", "eager", add_pooling_layer=has_pooler)
            elif name == "masked LM":
                del ours, theirs, exact
                ours = BertForMaskedLM.from_pretrained(directory, dtype=dtype, device=device, attn_implementation=attn)
                if packed:
                    optimize_for_inference(ours)
                theirs, exact = references("BertForMaskedLM", attn)
            bar.set_postfix_str(name)
            for case in cases:
                for batch in case.batches:
                    batch = {key: value.to(device) for key, value in batch.items()}
                    models = (ours, theirs, exact)
                    _compare_batch(name, case.name, batch, models, rows, dtype, attentions=attn == "eager")
                    bar.update()
        bar.close()

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
    )


def _compare_batch(
    kind: str,
    case: str,
    batch: dict[str, Tensor],
    models: tuple[Any, Any, Any],
    rows: dict[str, Row],
    dtype: torch.dtype,
    attentions: bool,
) -> None:
    """One forward of hfbert, transformers and transformers in float64 on `batch`; record what this pass
    compares, at real positions only. `attentions`: whether the backbone pass also returns attention
    probabilities (eager models)."""
    real = batch["attention_mask"].bool()
    if kind == "masked LM":
        ours, theirs, exact = (model(**batch).logits[real] for model in models)
        rows["mlm logits"].update(case, ours, theirs, exact)
        # A swap in the top-k is a real difference unless the exact logits are tied within the allowed error.
        exact = exact.double()
        tie = 2 * allowed_error(dtype, float((theirs.double() - exact).abs().max()), float(exact.abs().max()))
        rows[f"mlm top-{TOP_K}"].update(case, ours, exact, tie=tie)
        return
    with_hidden_states = kind == "backbone"
    with_attentions = kind == "eager attentions" or attentions
    options = dict(output_hidden_states=with_hidden_states, output_attentions=with_attentions, return_dict=True)
    outputs = [model(**batch, **options) for model in models]
    if with_hidden_states:
        counts = {len(output.hidden_states) for output in outputs}
        if len(counts) != 1:
            raise ValueError(f"{sorted(counts)} hidden states: hfbert and transformers disagree on the layer count")
        for index, states in enumerate(zip(*(output.hidden_states for output in outputs), strict=True)):
            rows["embeddings" if index == 0 else f"layer {index - 1}"].update(case, *(x[real] for x in states))
        if "pooler" in rows:
            rows["pooler"].update(case, *(output.pooler_output for output in outputs))
    if with_attentions:
        for index, probabilities in enumerate(zip(*(output.attentions for output in outputs), strict=True)):
            # (batch, heads, query, key) -> the rows of real query tokens, every key: (tokens * heads, key)
            rows[f"attentions layer {index}"].update(
                case, *(x.transpose(1, 2)[real].flatten(0, 1) for x in probabilities)
            )


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
