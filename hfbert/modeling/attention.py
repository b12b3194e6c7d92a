"""Multi-head scaled dot-product attention over a key-padding mask, in two interchangeable implementations.

`multi_head_attention` takes the query, key and value projections shaped (batch, sequence, hidden) and a boolean
`key_mask` shaped (batch, 1, 1, sequence) that is True where a key may be attended to (or None: attend
everywhere), and optionally an additive `bias` broadcastable to (batch, heads, query, key) (MPNet's relative-position
bias) and a `score_term`, a function of the split queries and keys (batch, heads, length, head_size) whose result is
added to the scores as well (a term of query and key together, as DeBERTa's disentangled attention has); it splits the
heads, attends, and merges the heads again. The kernel is one of:

- "eager" writes the softmax out and can return the attention probabilities;
- "sdpa" calls `torch.nn.functional.scaled_dot_product_attention`, which picks a fused kernel and never
  materialises the probabilities.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

AttentionKernel = Callable[
    [Tensor, Tensor, Tensor, "Tensor | None", float, float, "Tensor | None"], "tuple[Tensor, Tensor | None]"
]


def eager_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    scale: float,
    dropout: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if key_mask is not None:
        # masked_fill with the dtype's lowest finite value, not an added bias: masked keys get exactly zero
        # weight and nothing can overflow to -inf in fp16 / bf16.
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
    probabilities = torch.softmax(scores, dim=-1)
    if dropout > 0.0:
        probabilities = F.dropout(probabilities, p=dropout)
    return torch.matmul(probabilities, value), probabilities


def sdpa_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    scale: float,
    dropout: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, None]:
    mask = key_mask
    if bias is not None:
        # One additive mask: the bias where a key may be attended, the lowest finite value where not (as eager).
        mask = bias.to(query.dtype)
        if key_mask is not None:
            mask = mask.masked_fill(~key_mask, torch.finfo(query.dtype).min)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale)
    return output, None


ATTENTION_IMPLEMENTATIONS: dict[str, AttentionKernel] = {"eager": eager_attention, "sdpa": sdpa_attention}
DEFAULT_ATTENTION = "sdpa"


def multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    num_heads: int,
    scale: float,
    dropout: float,
    implementation: str,
    bias: Tensor | None = None,
    score_term: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(batch, sequence, hidden) projections -> (batch, sequence, hidden) context, and the probabilities
    (batch, heads, query, key) when the implementation computes them. `bias` and `score_term(query, key)` (of the
    split heads) are added to the scaled scores; the key mask applies after both."""
    batch, length, hidden = query.shape

    def split_heads(projected: Tensor) -> Tensor:
        return projected.view(batch, length, num_heads, hidden // num_heads).transpose(1, 2)

    query, key, value = split_heads(query), split_heads(key), split_heads(value)
    if score_term is not None:
        # The kernels take one additive tensor: the term joins the bias (sdpa folds the key mask into it).
        term = score_term(query, key)
        bias = term if bias is None else bias + term
    attend = ATTENTION_IMPLEMENTATIONS[implementation]
    context, probabilities = attend(query, key, value, key_mask, scale, dropout, bias)
    context = context.transpose(1, 2)
    if torch.compiler.is_exporting():
        # The ONNX exporter decomposes sdpa into ops whose output is laid out otherwise than the kernel it traced,
        # and the reshape below, recorded as a view of the traced layout, then fails (pytorch/pytorch#141107, MPNet's
        # bias with gradients enabled): an explicit copy holds for either layout. Eager runs need no copy.
        context = context.clone(memory_format=torch.contiguous_format)
    return context.reshape(batch, length, hidden), probabilities


def check_attention_implementation(name: str) -> str:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f'Specified `attn_implementation="{name}"` is not supported: hfbert implements '
            f"{', '.join(repr(known) for known in ATTENTION_IMPLEMENTATIONS)}"
        )
    return name
