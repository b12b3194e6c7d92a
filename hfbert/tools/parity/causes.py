"""Why a deployed artifact fails: its last hidden state tried against the float64 reference run another way.

When an artifact's token outputs fail, `run_parity` asks these before it reports, and the report names what fits:

- `position_offset`: positions counted from 1 or 2 (an offset BERT does not have, RoBERTa's padding_idx + 1 carried
  into a BERT port), or from 0 in a RoBERTa-family port;
- `padding_blind_positions`: positions counted over columns, pads included, on a left-padded batch (a graph that
  computes its own positions without the attention mask);
- `attention_mismatch`: another window or rotary base on local and global layers (ModernBERT's), or another bucket
  size, reach or set of relative terms (DeBERTa's), each change as the member's reference adapter states it
  (engines/reference_adapters.py).

A cause is named only when the changed float64 run fits the artifact FITS_BETTER times better than the battery's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hfbert.tools.parity.engines.base import TorchEngine
from hfbert.tools.parity.engines.reference_adapters import adapter

# Position offsets tried when an artifact's token outputs fail: positions counted from 1 (a port that adds an offset
# BERT does not have), or from 2 (RoBERTa's padding_idx + 1 carried into BERT). Negative offsets would need position
# -1, which no embedding lookup has. For a RoBERTa-family model, whose positions start at pad_token_id + 1, the one
# offset tried is back to 0: BERT's positions carried into a RoBERTa port.
POSITION_OFFSETS = (1, 2)
FITS_BETTER = 10.0  # the shifted float64 run must fit the artifact this many times better in RMS error


@dataclass
class PositionOffset:
    """Positions shifted by `offset` fit an artifact's last hidden state far better than the battery's positions."""

    offset: int
    shifted_rms: float  # the artifact's RMS error against float64 run with position_ids + offset
    plain_rms: float  # ... against float64 at the battery's positions
    first_position: int = 0  # where the model's positions start: 0, RoBERTa's pad_token_id + 1

    def describe(self) -> str:
        start = self.first_position + self.offset
        if self.first_position:
            why = (
                f"BERT's positions carried into a port of a model padded at {self.first_position - 1} (RoBERTa, MPNet)"
            )
        else:
            why = "RoBERTa's padding_idx + 1" if self.offset == 2 else "an offset such as RoBERTa's padding_idx"
            why += ", carried into a BERT port"
        return (
            f"position ids offset by {self.offset}: the float64 reference run with position_ids + {self.offset} fits "
            f"the artifact {self.plain_rms / self.shifted_rms:,.0f}x better (RMS error {self.shifted_rms:.3g}, "
            f"against {self.plain_rms:.3g} at positions from {self.first_position}): its positions count from "
            f"{start}, not {self.first_position} ({why})"
        )


def position_offset(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    exact: TorchEngine,
    batch: dict[str, Tensor],
    max_positions: int,
    first_position: int = 0,
) -> PositionOffset | None:
    """The offset (of POSITION_OFFSETS; -first_position for a model whose positions start at first_position) for
    which the float64 reference, run on `batch` (right-padded, no position_ids) with the positions from
    first_position + offset, fits the last hidden state that `run` (an artifact) gives for `batch` FITS_BETTER times
    better than with the battery's positions; None when none does."""
    real = batch["attention_mask"].bool()
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms(positions: Tensor | None) -> float:
        shifted = batch if positions is None else {**batch, "position_ids": positions}
        return float((ours - exact.run(shifted)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    plain = rms(None)
    width = batch["input_ids"].shape[1]
    for offset in (-first_position,) if first_position else POSITION_OFFSETS:
        if width + first_position + offset > max_positions:
            continue
        shifted = rms((torch.arange(width) + first_position + offset).expand_as(batch["input_ids"]))
        if shifted * FITS_BETTER < plain:
            return PositionOffset(offset, shifted, plain, first_position)
    return None


@dataclass
class PaddingBlindPositions:
    """Each column's position, pads counted, fits a left-padded batch through an artifact far better than the
    positions counted over real tokens that its model gives."""

    blind_rms: float  # the artifact's RMS error against float64 run with position_ids = first_position + column
    plain_rms: float  # ... against float64 at the battery's positions (real tokens from first_position)
    first_position: int

    def describe(self) -> str:
        return (
            f"positions ignore padding: on a left-padded batch the float64 reference run with each column's "
            f"position ({self.first_position}, {self.first_position + 1}, ..., pads counted) fits the artifact "
            f"{self.plain_rms / self.blind_rms if self.blind_rms else math.inf:,.0f}x better (RMS error "
            f"{self.blind_rms:.3g}, against "
            f"{self.plain_rms:.3g} at positions over real tokens): its positions count columns, not real tokens, "
            f"which only right padding hides (RoBERTa's create_position_ids_from_input_ids counts real tokens from "
            f"padding_idx + 1)"
        )


def padding_blind_positions(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    exact: TorchEngine,
    batch: dict[str, Tensor],
    max_positions: int,
    first_position: int,
) -> PaddingBlindPositions | None:
    """Whether the last hidden state that `run` (an artifact that computes its own positions, as RoBERTa-family and
    MPNet graphs do) gives for `batch` (left-padded, with the battery's position_ids) is what the float64 reference
    computes with every column's position from `first_position`, FITS_BETTER times better than at the battery's
    positions; None when not, or when those positions do not fit in the table."""
    real = batch["attention_mask"].bool()
    width = batch["input_ids"].shape[1]
    if width + first_position > max_positions:
        return None
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms(positions: Tensor) -> float:
        fed = {**batch, "position_ids": positions}
        return float((ours - exact.run(fed)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    plain = rms(batch["position_ids"])
    blind = rms((torch.arange(width) + first_position).expand_as(batch["input_ids"]))
    return PaddingBlindPositions(blind, plain, first_position) if blind * FITS_BETTER < plain else None


@dataclass
class AttentionMismatch:
    """Another window or rotary base on the local / global layers (ModernBERT's), or other relative positions
    (DeBERTa's), fits a failing artifact's last hidden state far better than the checkpoint's config.json."""

    change: str  # what differs, in words
    fitted_rms: float  # the artifact's RMS error against float64 run with that change
    plain_rms: float  # ... against float64 as config.json says

    def describe(self) -> str:
        return (
            f"{self.change}: the float64 reference run so fits the artifact "
            f"{self.plain_rms / self.fitted_rms if self.fitted_rms else math.inf:,.0f}x better (RMS error "
            f"{self.fitted_rms:.3g}, against {self.plain_rms:.3g} as config.json says)"
        )


def attention_mismatch(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]], exact: TorchEngine, batch: dict[str, Tensor]
) -> AttentionMismatch | None:
    """For a member whose reference adapter has `variants` (ModernBERT's windows and rotary bases, DeBERTa's
    relative positions): the change under which the float64 reference fits the last hidden state that `run` (an
    artifact) gives for `batch` FITS_BETTER times better than as config.json says, the best such; None otherwise."""
    variants = adapter(exact.backbone.config.model_type).variants(exact.backbone)
    if not variants:
        return None
    real = batch["attention_mask"].bool()
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms() -> float:
        return float((ours - exact.run(batch)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    plain = rms()
    found = None
    for change, changed in variants:
        with changed:
            fitted = rms()
        if fitted * FITS_BETTER < plain and (found is None or fitted < found.fitted_rms):
            found = AttentionMismatch(change, fitted, plain)
    return found
