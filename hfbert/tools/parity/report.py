"""The report of a parity run: the table, the JSON, and the figure (drawn by plot.py)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfbert.tools.extras import import_pyplot
from hfbert.tools.parity.artifact_report import artifact_block, first_failure
from hfbert.tools.parity.statistics import ACCURACY_RATIO, Accuracy, Row, TopKStats

# The fields the JSON holds as the run gave them, in its order.
_AS_GIVEN = (
    "model", "model_path", "reference_path", "device", "dtype", "attn", "reference_attn", "linear_kernel",
    "instruction_set", "tolerance", "num_layers", "versions", "weight_files", "reference_weight_files", "cases",
    "seconds",
)  # fmt: skip


@dataclass
class ParityReport:
    """What a parity run found (`run_parity`): the table, the JSON and the figure."""

    model: str
    model_path: str
    reference_path: str  # where transformers loaded from: model_path unless a reference was given
    device: str
    dtype: str
    attn: str
    linear_kernel: str  # what hfbert's linear layers ran on: "F.linear", "oneDNN, packed" or "oneDNN"
    instruction_set: str  # of the CPU kernels (hfbert.platform.cpu.instruction_set())
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
    artifacts: list[Any] = field(default_factory=list)  # ArtifactCheck per deployed artifact (artifacts.py)
    sentence_pipeline: str = ""  # the sentence-transformers pipeline applied to the artifacts' token outputs
    sentence_baseline: dict[str, Any] = field(default_factory=dict)  # transformers fp32's sentence numbers
    # transformers' attention where it is not `attn`: eager for a model it runs eager only (MPNet)
    reference_attn: str = ""

    @property
    def untested(self) -> dict[str, str]:
        """The cases whose batches could not hold what they test (padding, pairs of other token types): case -> why.
        A run with one passes nothing: its verdict is "untested", its exit status 1."""
        return {case["name"]: case["note"] for case in self.cases if not case.get("exercised", True)}

    @property
    def hfbert_passed(self) -> bool:
        return all(row.passed for row in self.rows) and not self.untested

    @property
    def passed(self) -> bool:
        """hfbert and every artifact within their bounds."""
        return self.hfbert_passed and all(check.passed for check in self.artifacts)

    @property
    def first_failing_artifact(self) -> str | None:
        """'ARTIFACT (OUTPUT, ratio)' of the first artifact that fails, or None."""
        return first_failure(self.artifacts)

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

    @property
    def _reference_attention(self) -> str:
        if not self.reference_attn or self.reference_attn == self.attn:
            return ""
        return f" (transformers {self.reference_attn}: the only attention it has for this model)"

    def table(self) -> str:
        tokens = sum(case["real_tokens"] for case in self.cases)
        described = ", ".join(f"{case['name']} {case['sequences']}" for case in self.cases)
        lines = [f"model      {self.model_path}"]
        if self.reference_path != self.model_path:
            lines.append(f"reference  {self.reference_path} (loaded in transformers)")
        lines += [
            f"run        {self.device} ({self.versions['device_name']}, {self.instruction_set}), {self.dtype}, "
            f"attention {self.attn}{self._reference_attention}, linear {self.linear_kernel}; "
            f"hfbert {self.versions['hfbert']}, "
            f"transformers {self.versions['transformers']}, torch {self.versions['torch']}",
            *([f"mkl        {self.versions['mkl']}"] if self.versions.get("mkl") and self.device == "cpu" else []),
            *(
                [f"threads    {self.versions['threads']}"]
                if self.versions.get("threads") and self.device == "cpu"
                else []
            ),
            f"inputs     {described} sequences; {tokens} real tokens compared per output",
            *(f"           {case['name']}: {case['note']}" for case in self.cases if case.get("note")),
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
        if self.untested:
            lines.append(f"UNTESTED   {', '.join(self.untested)}: not exercised (see inputs), so nothing passes")
        if self.artifacts:
            if self.sentence_pipeline:
                lines += ["", f"sentence embeddings of the artifacts: {self.sentence_pipeline}, on the texts"]
            for check in self.artifacts:
                lines += ["", *artifact_block(check, self.sentence_baseline)]
            passed = sum(check.passed for check in self.artifacts)
            failing = f"; first failing: {self.first_failing_artifact}" if self.first_failing_artifact else ""
            lines += ["", f"artifacts: {passed} of {len(self.artifacts)} pass{failing}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON data: every non-finite number (NaN, inf) is None (JSON has no NaN; strict parsers
        reject the bare NaN that json.dumps writes by default)."""
        data = {
            "passed": self.passed,
            "first_divergence": self.first_divergence,
            "untested": self.untested,
            "rule": self.rule,
            "accuracy_ratio_bound": self.accuracy_bound,
            "precision": self.precision,
            **{key: getattr(self, key) for key in _AS_GIVEN},
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
            "hfbert_passed": self.hfbert_passed,
            "first_failing_artifact": self.first_failing_artifact,
            "sentence_pipeline": self.sentence_pipeline,
            "transformers_sentence_embeddings": self.sentence_baseline,
            "artifacts": [check.to_dict() for check in self.artifacts],
        }
        return _finite(data)

    def write_json(self, path: str | os.PathLike) -> None:
        from converters.atomic_write import atomic_file

        with atomic_file(path) as temporary:
            temporary.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")

    def plot(self, path: str | os.PathLike) -> None:
        """Write `figure()` to an image file (the format from its suffix; png by default), atomically."""
        from converters.atomic_write import atomic_file

        pyplot = import_pyplot()
        figure = self.figure()
        with atomic_file(path) as temporary:
            figure.savefig(temporary, dpi=120, format=Path(path).suffix.lstrip(".") or "png")
        pyplot.close(figure)

    def figure(self) -> Any:
        """A matplotlib figure of what is judged (hfbert.tools.parity.plot.figure)."""
        from hfbert.tools.parity.plot import figure

        return figure(self)


def _finite(value: Any) -> Any:
    """`value` (JSON data) with every float that is NaN or infinite replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
