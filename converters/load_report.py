"""`LoadReport`: what happened to every tensor when a checkpoint was loaded.

It separates what is fine (loaded, renamed, ignored by design, legacy buffers checked) from what is a problem
(missing, unexpected, shape-mismatched), so "Some weights were not used" never needs decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# Set around one load by `from_pretrained(..., ignore_mismatched_sizes=True)`: a parameter whose shape differs from
# the checkpoint's is then initialised afresh and reported, as in transformers, instead of failing the load.
_IGNORE_MISMATCHED_SIZES: ContextVar[bool] = ContextVar("ignore_mismatched_sizes", default=False)


@contextmanager
def ignoring_mismatched_sizes(enabled: bool = True) -> Iterator[None]:
    """Reports made inside this block treat shape mismatches as re-initialised parameters, not as problems."""
    token = _IGNORE_MISMATCHED_SIZES.set(enabled)
    try:
        yield
    finally:
        _IGNORE_MISMATCHED_SIZES.reset(token)


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
    initialized: list[str] = field(default_factory=list)  # missing (strict=False) or mismatched, initialised
    # Tied parameter -> its source, for ties the checkpoint breaks (both stored, different values): not made.
    untied: dict[str, str] = field(default_factory=dict)
    # ignore_mismatched_sizes=True: mismatched parameters are initialised afresh (listed in `initialized` too)
    mismatched_reinitialized: bool = field(default_factory=_IGNORE_MISMATCHED_SIZES.get)

    @property
    def problems(self) -> list[str]:
        """One line per problem, naming the tensor (empty when the load is exact)."""
        lines = [f"missing from the checkpoint: {name}" for name in self.missing]
        lines += [f"unexpected in the checkpoint: {name}" for name in self.unexpected]
        if not self.mismatched_reinitialized:
            lines += [
                f"shape mismatch: {name} is {tuple(stored)} in the checkpoint, {tuple(expected)} in the model "
                f"(from config.json); pass ignore_mismatched_sizes=True to initialise it afresh"
                for name, stored, expected in self.mismatched
            ]
        lines += [f"not finite: {name} holds {what}" for name, what in self.non_finite]
        return lines

    def to_loading_info(self) -> dict[str, Any]:
        """The dict transformers' `output_loading_info=True` returns (sets of names; mismatched as (name, shape in
        the checkpoint, shape in the model)), plus this report under "report"."""
        return {
            # transformers counts a new head's parameters as missing (initialised because the file lacks them).
            "missing_keys": set(self.missing) | set(self.new_head),
            "unexpected_keys": set(self.unexpected),
            "mismatched_keys": set(self.mismatched),
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
            (
                "shape mismatched, reinitialised" if self.mismatched_reinitialized else "shape mismatched",
                len(self.mismatched),
                _examples(name for name, _, _ in self.mismatched),
            ),
            ("NaN / Inf values", len(self.non_finite), _examples(name for name, _ in self.non_finite)),
        ]
        if self.new_head:
            rows.append(("new head (initialised)", len(self.new_head), _examples(self.new_head)))
        if self.initialized:
            rows.append(("randomly initialised", len(self.initialized), _examples(self.initialized)))
        if self.untied:
            rows.append(("tied in config, stored apart", len(self.untied), _examples(self.untied)))
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
