"""Scaled dot-product attention over a key-padding mask, in two interchangeable implementations.

Both take query, key and value shaped (batch, heads, sequence, head_size) and a boolean `key_mask` shaped
(batch, 1, 1, sequence) that is True where a key may be attended to (or None: attend everywhere).

- "eager" writes the softmax out and can return the attention probabilities;
- "sdpa" calls `torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel and never
  materialises the probabilities.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionFunction = Callable[[Tensor, Tensor, Tensor, "Tensor | None", float, float], "tuple[Tensor, Tensor | None]"]


def eager_attention(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, scale: float, dropout: float
) -> tuple[Tensor, Tensor]:
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if key_mask is not None:
        # masked_fill with the dtype's lowest finite value, not an added bias: masked keys get exactly zero
        # weight and nothing can overflow to -inf in fp16 / bf16.
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probabilities = torch.softmax(scores, dim=-1)
    if dropout > 0.0:
        probabilities = F.dropout(probabilities, p=dropout)
    return torch.matmul(probabilities, value), probabilities


def sdpa_attention(
    query: Tensor, key: Tensor, value: Tensor, key_mask: Tensor | None, scale: float, dropout: float
) -> tuple[Tensor, None]:
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=key_mask, dropout_p=dropout, scale=scale)
    return output, None


ATTENTION_IMPLEMENTATIONS: dict[str, AttentionFunction] = {"eager": eager_attention, "sdpa": sdpa_attention}
DEFAULT_ATTENTION = "sdpa"


def check_attention_implementation(name: str) -> str:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={name!r} is not supported; choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
        )
    return name
