"""`LoadReport`: what happened to every tensor when a checkpoint was loaded.

It separates what is fine (loaded, renamed, ignored by design, legacy buffers checked) from what is a problem
(missing, unexpected, shape-mismatched), so "Some weights were not used" never needs decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadReport:
    source: str
    loaded: list[str] = field(default_factory=list)  # hfbert parameter names filled from the checkpoint
    renamed: dict[str, str] = field(default_factory=dict)  # checkpoint name -> hfbert name
    ignored_by_design: dict[str, str] = field(default_factory=dict)  # checkpoint name -> reason
    legacy_buffers: list[str] = field(default_factory=list)  # checked equal to the computed values, dropped
    missing: list[str] = field(default_factory=list)  # hfbert parameters the checkpoint lacks
    unexpected: list[str] = field(default_factory=list)  # checkpoint names no rule explains
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # name, file, model
    non_finite: list[tuple[str, str]] = field(default_factory=list)  # checkpoint name, what is wrong
    new_head: list[str] = field(default_factory=list)  # a task head the checkpoint lacks entirely, initialised
    initialized: list[str] = field(default_factory=list)  # other missing parameters initialised (strict=False)

    @property
    def problems(self) -> list[str]:
        """One line per problem, naming the tensor (empty when the load is exact)."""
        lines = [f"missing from the checkpoint: {name}" for name in self.missing]
        lines += [f"unexpected in the checkpoint: {name}" for name in self.unexpected]
        lines += [
            f"shape mismatch: {name} is {tuple(stored)} in the checkpoint, {tuple(expected)} in the model "
            f"(from config.json)"
            for name, stored, expected in self.mismatched
        ]
        lines += [f"not finite: {name} holds {what}" for name, what in self.non_finite]
        return lines

    def to_loading_info(self) -> dict[str, Any]:
        """The dict transformers' `output_loading_info=True` returns, plus this report under "report"."""
        return {
            "missing_keys": list(self.missing),
            "unexpected_keys": list(self.unexpected),
            "mismatched_keys": list(self.mismatched),
            "error_msgs": self.problems,
            "report": self,
        }

    def __str__(self) -> str:
        rows = [
            ("loaded", len(self.loaded), ""),
            ("renamed", len(self.renamed), _examples(f"{old} -> {new}" for old, new in self.renamed.items())),
            ("ignored by design", len(self.ignored_by_design), _reasons(self.ignored_by_design)),
            ("legacy buffers", len(self.legacy_buffers), _examples(self.legacy_buffers)),
            ("missing", len(self.missing), _examples(self.missing)),
            ("unexpected", len(self.unexpected), _examples(self.unexpected)),
            ("shape mismatched", len(self.mismatched), _examples(name for name, _, _ in self.mismatched)),
            ("NaN / Inf values", len(self.non_finite), _examples(name for name, _ in self.non_finite)),
        ]
        if self.new_head:
            rows.append(("new head (initialised)", len(self.new_head), _examples(self.new_head)))
        if self.initialized:
            rows.append(("randomly initialised", len(self.initialized), _examples(self.initialized)))
        width = max(len(label) for label, _, _ in rows)
        lines = [f"load report for {self.source}"]
        lines += [f"  {label:<{width}}  {count:>5}  {detail}".rstrip() for label, count, detail in rows]
        return "\n".join(lines)


def _examples(names: Any, limit: int = 3) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f", ... (+{len(names) - limit})" if len(names) > limit else "")


def _reasons(ignored: dict[str, str]) -> str:
    counts: dict[str, int] = {}
    for reason in ignored.values():
        counts[reason] = counts.get(reason, 0) + 1
    return "; ".join(f"{count} x {reason}" for reason, count in counts.items())
