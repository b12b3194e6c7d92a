"""The figure of a parity report: per output, hfbert's and transformers' RMS error against float64 and their ratio."""

from __future__ import annotations

import math
from typing import Any

from hfbert.tools.extras import import_pyplot
from hfbert.tools.parity.statistics import ACCURACY_RATIO, Accuracy


def figure(report: Any) -> Any:
    """A matplotlib figure of what is judged, per output in forward order: above, hfbert's and transformers'
    RMS error against float64 (log scale; hidden states and attention probabilities as separate series,
    hfbert filled, transformers hollow, so that coinciding values stay visible); below, their ratio against
    the report's bound (`accuracy_bound`; where the eps floor allows more, that output's own bound is marked).
    PASS, FAIL or UNTESTED, against which bound, in the title."""
    pyplot = import_pyplot()
    floor = 1e-12  # an exact agreement (RMS 0) is drawn here
    accuracy_rows = [row for row in report.rows if isinstance(row.total, Accuracy)]
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
    finite += [x for c in report.artifacts for x in c.ratios.values() if math.isfinite(x) and x > 0]
    bound = report.accuracy_bound
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
        xs = [x + 0.12 for x in xs] if rows is attentions else xs  # beside the hidden state of the same layer
        ratios.plot(xs, [row.total.ratio for row in rows], linestyle=line, color=color, alpha=0.4)
        for x, row in zip(xs, rows, strict=True):
            _draw_ratio(ratios, x, row, (low, high), color, marker=marker, markersize=7, gid="ratio")
            transformers_error = row.total.reference_error.rms
            # An output whose eps floor allows more than the bound: its own bound marked.
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
    pooler_x = next((x for x, row in zip(x_extra, extra, strict=True) if row.name == "pooler"), None)
    artifact_errors = _draw_artifacts(report, errors, ratios, x_hidden[-1], pooler_x, floor, (low, high))
    errors.set_yscale("log")
    plotted = [max(r.total.ours_error.rms, r.total.reference_error.rms, floor) for r in accuracy_rows] or [1.0]
    plotted += artifact_errors
    errors.set_ylim(top=max(plotted) * 60)  # room for the legend above the data
    errors.set_ylabel(f"RMS error vs float64\n({report.dtype}; 0 drawn at {floor:g})")
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
        + (f" (precision {report.precision!r})" if bound != ACCURACY_RATIO else ""),
    )
    ratios.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="as accurate as transformers")
    if floored:
        ratios.plot([], [], marker="_", color="grey", markersize=14, linestyle="none", label="its bound (eps floor)")
    if any(not row.passed for row in accuracy_rows):
        ratios.plot([], [], marker="o", color="red", markeredgecolor="black", linestyle="none", label="FAIL")
    ratios.set_ylim(low, high)
    ratios.set_ylabel("hfbert RMS error /\ntransformers RMS error")
    ratios.legend(fontsize="small", loc="upper center", ncol=4)
    ratios.grid(True, axis="y", which="major", alpha=0.3)
    names = ["emb"] + [str(i) for i in range(report.num_layers)] + [row.name.replace(" ", "\n") for row in extra]
    ratios.set_xticks(x_hidden + x_extra, names)
    ratios.set_xlabel("output (layer)")
    failed = sum(not row.passed for row in report.rows)
    within = f"{bound:g}x transformers' RMS error vs float64"
    if bound != ACCURACY_RATIO:
        within += f" (the bound of precision {report.precision!r})"
    verdict = (
        f"PASS: all {len(report.rows)} outputs within {within}"
        if not failed
        else f"FAIL: {failed} of {len(report.rows)} outputs beyond {within}; "
        f"first divergence: {report.first_divergence}"
    )
    if report.artifacts:
        passing = sum(check.passed for check in report.artifacts)
        verdict += f"; artifacts: {passing} of {len(report.artifacts)} pass"
        if passing < len(report.artifacts):
            verdict = verdict.replace("PASS: all", "FAIL (artifacts): hfbert's", 1)
    if report.untested:  # a case that could not hold what it tests passes nothing (cases.py)
        verdict = f"UNTESTED ({', '.join(report.untested)} not exercised): {verdict.replace('PASS: ', '', 1)}"
    figure.suptitle(
        f"{verdict}\n{report.model[-60:]}, {report.device}, {report.dtype}, attention {report.attn}, "
        f"linear {report.linear_kernel}",
        color="darkgreen" if report.passed else "darkred",
        fontsize="medium",
    )
    figure.tight_layout()
    return figure


ARTIFACT_MARKERS = "*PXhd"


def _draw_artifacts(
    report: Any, errors: Any, ratios: Any, last_x: float, pooler_x: float | None, floor: float, limits: tuple
) -> list[float]:
    """Each artifact beside hfbert and transformers: its RMS error against float64 and its ratio (against its own
    bound) at the last layer's hidden state (last_hidden_state) and at the pooler; returns the errors drawn."""
    drawn = []
    for index, check in enumerate(report.artifacts):
        marker, color = ARTIFACT_MARKERS[index % len(ARTIFACT_MARKERS)], f"C{(index + 5) % 10}"
        places = {"last_hidden_state": last_x, "pooler_output": pooler_x}
        points = [(places[name], row) for name, row in check.rows.items() if places.get(name) is not None]
        xs = [x + 0.25 + 0.08 * index for x, _ in points]
        values = [max(row.total.ours_error.rms, floor) for _, row in points]
        drawn += values
        name = check.name if len(check.name) <= 40 else "..." + check.name[-37:]
        label = f"{name} ({check.engine.engine}, {check.engine.precision})"
        errors.plot(xs, values, marker=marker, linestyle="none", color=color, markersize=9, label=label)
        for x, (_, row) in zip(xs, points, strict=True):
            _draw_ratio(ratios, x, row, limits, color, marker=marker, markersize=9, gid="artifact ratio")
        if check.bound != report.accuracy_bound:
            ratios.plot(xs, [check.bound] * len(xs), marker="_", color=color, markersize=16, linestyle="none")
    return drawn


def _draw_ratio(ratios: Any, x: float, row: Any, limits: tuple, color: str, **style: Any) -> None:
    """One row's ratio on the lower axes, red edged in black where it fails; NaN and inf at the top."""
    low, high = limits
    value = row.total.ratio
    shown = min(max(value, low), high) if math.isfinite(value) else high / 2
    edge = color if row.passed else "black"
    ratios.plot([x], [shown], linestyle="none", color=color if row.passed else "red", markeredgecolor=edge, **style)
