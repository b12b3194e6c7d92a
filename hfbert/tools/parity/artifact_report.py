"""The block of the parity table for each deployed artifact, and the line naming the first failure."""

from __future__ import annotations

import math
from typing import Any

from hfbert.tools.parity.artifacts import ArtifactCheck


def sentence_line(numbers: dict[str, Any], baseline: dict[str, Any]) -> str:
    if not numbers:
        return ""
    line = f"min cos {numbers['min_cosine']:.8f}, mean cos {numbers['mean_cosine']:.8f} to float64"
    if "retrieval_agreement" in numbers:
        line += f"; top-{numbers['retrieval_k']} retrieval agreement {100 * numbers['retrieval_agreement']:.1f}%"
    line += f" over {numbers['texts']} texts"
    if baseline:
        line += f" (transformers fp32: min cos {baseline['min_cosine']:.8f}"
        if "retrieval_agreement" in baseline:
            line += f", agreement {100 * baseline['retrieval_agreement']:.1f}%"
        line += ")"
    return line


def artifact_block(check: ArtifactCheck, baseline: dict[str, Any]) -> list[str]:
    """engine, version, precision that ran, CPU ISA; then per output the RMS errors, the ratio against the bound,
    the median time per batch and the verdict; then the sentence embeddings; then the likely causes, or the batch
    it could not run."""
    engine = check.engine
    lines = [
        f"artifact   {check.name}" + (f" ({engine.path})" if str(engine.path) != check.name else ""),
        f"  engine   {engine.engine} {engine.version}, precision {engine.precision}"
        + (f" (weights stored as {engine.weights})" if engine.weights else "")
        + f", CPU {check.instruction_set}"
        + (f"; {'; '.join(engine.notes)}" if engine.notes else ""),
        f"  inputs   {', '.join(engine.inputs)}"
        + (
            ""
            if "token_type_ids" in engine.inputs or not engine.token_types
            else " (no token_type_ids: fed as segment 0)"
        ),
        f"  verdict  its RMS error vs float64 <= {check.bound:g}x transformers' fp32 own",
    ]
    if check.rows:  # none when its first batch could not run
        lines.append(
            f"  {'output':<20} {'RMS err':>10} {'transf.':>10} {'ratio':>10} {'max abs':>10} {'min cos':>11}  "
            f"{'median/batch':>12}  result"
        )
    for name, row in check.rows.items():
        accuracy = row.total
        result = "pass" if row.passed else "FAIL"
        lines.append(
            f"  {name:<20} {accuracy.ours_error.rms:>10.3e} {accuracy.reference_error.rms:>10.3e} "
            f"{_ratio(accuracy.ratio):>10} {accuracy.ours_error.max_abs:>10.3e} "
            f"{accuracy.ours_error.min_cosine:>11.8f}  "
            f"{1000 * check.median_seconds:>9.2f} ms  {result}"
        )
        if not row.passed:
            cases = ", ".join(f"{case} {_ratio(record.ratio)}" for case, record in row.by_case.items())
            lines.append(f"  {'':<20} by case: {cases}")
    sentences = sentence_line(check.sentences.numbers(), baseline)
    if sentences:
        lines.append(f"  sentences {sentences}")
    for cause in check.likely_causes():
        lines.append(f"  likely cause: {cause}")
    if check.error is not None:
        lines.append(f"  ERROR    {check.error}")
    if check.untested:
        lines.append(f"  UNTESTED on {', '.join(check.untested)} (not exercised, see inputs): verdict {check.verdict}")
    return lines


def _ratio(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.2f}x" if value < 1000 else f"{value:,.0f}x"


def first_failure(checks: list[ArtifactCheck]) -> str | None:
    """'ARTIFACT (OUTPUT, ratio Nx > bound)' of the first failing artifact, or None."""
    for check in checks:
        if not check.passed:
            if check.error is not None:
                return f"{check.name} (error: {check.error.removeprefix(check.name + ': ')})"
            output = check.first_failure
            if output is None and check.untested:
                return f"{check.name} (untested: {', '.join(check.untested)} not exercised)"
            if output is None:
                return f"{check.name} (no output compared)"
            return f"{check.name} ({output}, {_ratio(check.rows[output].total.ratio)} > {check.bound:g}x)"
    return None
