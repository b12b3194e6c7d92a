"""Attention within a window, computed as a band: cost growing with length x window, not length^2.

A local layer (ModernBERT's "sliding_attention") lets query i see keys j with |i - j| <= window. Computed densely,
every query still scores every key and the mask throws most of them away: at 2,048 tokens and a window of 64 each
side, 94% of the products. Here the queries are cut into blocks of `block` columns, and each block scores only the
keys its queries can see: its own columns and `window` more on each side, `block + 2 * window` keys. The same mask
(the band, and the keys' padding) then decides which of them count, so the result is the dense computation's, up to
the order of floating-point sums.

    >>> import torch
    >>> q = k = v = torch.randn(1, 300, 8)
    >>> near = (torch.arange(300)[None] - torch.arange(300)[:, None]).abs() <= 5
    >>> dense = torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=near)
    >>> band = banded_attention(q, k, v, None, window=5, num_heads=1, scale=8**-0.5)
    >>> bool(torch.allclose(band, dense[:, 0], atol=1e-6))
    True
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def banded_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    key_mask: Tensor | None,
    window: int,
    num_heads: int,
    scale: float,
    dropout: float = 0.0,
    block: int | None = None,
) -> Tensor:
    """(batch, length, hidden) projections -> (batch, length, hidden) context, each query attending the keys at most
    `window` columns away that `key_mask` ((batch, 1, 1, length) bool, True where a key may be attended; None: all)
    allows. `block`: queries per block (default: `window`, at least 16)."""
    batch, length, hidden = query.shape
    head_size = hidden // num_heads
    block = block or max(window, 16)
    blocks = -(-length // block)
    padded = blocks * block
    span = block + 2 * window  # the keys a block of queries can see

    def heads(x: Tensor) -> Tensor:  # (batch, length, hidden) -> (batch, heads, length, head_size)
        return x.view(batch, length, num_heads, head_size).transpose(1, 2)

    # Batch and heads are the kernel's batch dimension and the blocks its "heads": every tensor below is a view of
    # the padded projections, the key spans overlapping ones (no copy of the keys per block).
    queries = F.pad(heads(query), (0, 0, 0, padded - length)).reshape(batch * num_heads, blocks, block, head_size)

    def spans(
        x: Tensor,
    ) -> Tensor:  # `window` columns of zeros before, enough after: (batch * heads, blocks, span, size)
        x = F.pad(heads(x), (0, 0, window, padded - length + window)).reshape(batch * num_heads, -1, head_size)
        return x.unfold(1, span, block).transpose(-1, -2)

    # Query i of a block and key j of its span are (j - window) - i columns apart, in every block alike.
    device = query.device
    offsets = torch.arange(span, device=device)[None, :] - window - torch.arange(block, device=device)[:, None]
    allowed = offsets.abs() <= window  # (block, span)
    # The keys that exist: the columns added around the sequence never, pads where the mask says so. The kernel is
    # fast with a mask shaped (1, blocks, block, span) and slow with one per batch row and head, so a masked batch
    # runs row by row.
    keys, values = spans(key), spans(value)
    if key_mask is None:
        real = F.pad(torch.ones(length, dtype=torch.bool, device=device), (window, padded - length + window))
        allowed = (allowed & real.unfold(0, span, block)[:, None, :])[None]  # (1, blocks, block, span)
        context = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=allowed, dropout_p=dropout, scale=scale
        )
    else:
        real = F.pad(key_mask[:, 0, 0], (window, padded - length + window), value=False).unfold(1, span, block)
        rows = []
        for row in range(batch):
            heads_of_row = slice(row * num_heads, (row + 1) * num_heads)
            rows.append(
                F.scaled_dot_product_attention(
                    queries[heads_of_row],
                    keys[heads_of_row],
                    values[heads_of_row],
                    attn_mask=(allowed & real[row][:, None, :])[None],
                    dropout_p=dropout,
                    scale=scale,
                )
            )
        context = torch.cat(rows)
    context = context.view(batch, num_heads, padded, head_size)[:, :, :length]
    return context.transpose(1, 2).reshape(batch, length, hidden)
