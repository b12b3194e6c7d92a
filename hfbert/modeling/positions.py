"""Position schemes: how a member turns token places into what its model reads, one value per config class.

A scheme answers four questions, once per forward: the position ids the embeddings look up when the caller gives
none (`position_ids`), the longest input the model takes (`max_length`, which the input checks ask), the embedding
table's padding row (`padding_index`) and the first position a real token gets (`first_position`, read by
`hfbert parity` to build left-padded cases).

- `AbsolutePositions` (BERT): learned positions counted from 0 at the first column, padding included.
- `PositionsAfterPadding` (RoBERTa, XLM-R, CamemBERT, MPNet): fairseq's `make_positions`, counted from
  `padding_index + 1` over each row's real tokens, `padding_index` at pads; the table loses `padding_index + 1` rows.
- `RotaryPositions` (ModernBERT): no table; each column's index rotates its query and key inside attention
  (`rotary.py`), counted from 0 at the first column, padding included (as transformers 5 counts them).

Positions that act inside attention ride on the batch layout (`padding.py`): an additive bias over column
distances (MPNet's relative bias, `with_attention_bias`), and position ids in the layout's own token order for
rotary embeddings (`with_positions`), with an optional per-layer window in `attend`. A scheme that needs them
returns True from `in_attention`; its model then hands the ids to the layout (`EncoderModel.run`).

    >>> from hfbert.modeling.config import BertConfig
    >>> PositionsAfterPadding().max_length(BertConfig(max_position_embeddings=514, pad_token_id=1))
    512
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class AbsolutePositions:
    """BERT's learned positions: column index, 0 at the first column, padding included (as transformers counts)."""

    name = "absolute"
    after_padding = False  # whether positions start after the padding index
    in_attention = False  # whether attention reads position ids (rotary): the layout then carries them

    def padding_index(self, config: Any) -> int | None:
        return None

    def first_position(self, config: Any) -> int:
        return 0

    def position_ids(self, config: Any, input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor | None:
        """None: the embeddings count columns themselves (the padding-free layout packs the same column index)."""
        return None

    def max_length(self, config: Any) -> int:
        return config.max_position_embeddings

    def limit(self, config: Any) -> str:
        """The length limit as the input check states it."""
        return f"max_position_embeddings = {config.max_position_embeddings}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PositionsAfterPadding(AbsolutePositions):
    """RoBERTa's positions: `padding_index + 1, + 2, ...` over each row's real tokens, `padding_index` at pads, so
    that left padding shifts nothing. `padding_index` is the config's `position_padding_idx` (its pad id; MPNet's is
    fixed at 1)."""

    name = "after-padding"
    after_padding = True

    def padding_index(self, config: Any) -> int | None:
        return config.position_padding_idx

    def first_position(self, config: Any) -> int:
        return config.position_padding_idx + 1

    def position_ids(self, config: Any, input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        # Counted on the padded rows, before a padding-free batch packs them: each sequence restarts.
        return positions_after_padding(input_ids, inputs_embeds, config.position_padding_idx)

    def max_length(self, config: Any) -> int:
        return config.max_position_embeddings - config.position_padding_idx - 1

    def limit(self, config: Any) -> str:
        return (
            f"{self.max_length(config)} = max_position_embeddings = {config.max_position_embeddings} - pad_token_id "
            f"({config.position_padding_idx}) - 1"
        )


def positions_after_padding(input_ids: Tensor | None, inputs_embeds: Tensor | None, padding_idx: int) -> Tensor:
    """RoBERTa's default position ids (fairseq's `make_positions`): `padding_idx + 1, + 2, ...` over each row's
    non-pad tokens, `padding_idx` at pads, so left padding shifts nothing. From `inputs_embeds`, whose pads are
    unknown: `padding_idx + 1` onwards in every column.

    >>> positions_after_padding(torch.tensor([[0, 5, 2, 1, 1], [1, 0, 7, 2, 1]]), None, padding_idx=1).tolist()
    [[2, 3, 4, 1, 1], [1, 2, 3, 4, 1]]
    """
    if input_ids is None:
        return torch.arange(padding_idx + 1, inputs_embeds.shape[1] + padding_idx + 1, device=inputs_embeds.device)
    real = input_ids.ne(padding_idx).long()
    return real.cumsum(dim=1) * real + padding_idx


class RotaryPositions(AbsolutePositions):
    """ModernBERT's rotary positions: the column index, handed to attention on the batch layout (`in_attention`),
    where it rotates queries and keys. Only relative positions reach the scores, so left padding shifts nothing that
    a real token sees; the limit is `max_position_embeddings`, the context the model was trained on."""

    name = "rotary"
    in_attention = True

    def position_ids(self, config: Any, input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        reference = input_ids if input_ids is not None else inputs_embeds
        return torch.arange(reference.shape[1], device=reference.device)


PositionScheme = AbsolutePositions  # the interface every scheme has
