"""Rotary position embeddings (RoPE): each query and key is rotated by its position, so that their dot product
depends on the positions' difference only.

A head's vector of size d is read as d/2 planes, plane i pairing dimensions i and i + d/2 (the "rotate half" layout of
GPT-NeoX, which transformers and ModernBERT use); plane i turns by the angle `position * theta ** (-2i / d)`. The
angles are computed in float64 and the tables cast to the compute dtype, so a position near the 8,192-token limit
is as exact as position 1 (transformers computes them in float32).

    >>> import torch
    >>> cos, sin = rotary_tables(torch.tensor([0, 1]), head_size=4, theta=10_000.0, dtype=torch.float32)
    >>> cos.shape, float(cos[0, 0]), float(sin[0, 0])
    (torch.Size([2, 4]), 1.0, 0.0)
"""

from __future__ import annotations

import torch
from torch import Tensor


def rotary_tables(positions: Tensor, head_size: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's angles, shaped `positions.shape + (head_size,)`, in `dtype` (the two halves of
    the last dimension repeat: plane i's angle is at i and at i + head_size / 2)."""
    frequencies = theta ** (-torch.arange(0, head_size, 2, dtype=torch.float64, device=positions.device) / head_size)
    angles = positions.to(torch.float64)[..., None] * frequencies
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`x` (..., heads, head_size) rotated by the tables (..., head_size) of its positions, in at least float32 (as
    transformers rotates a bf16 model's queries), returned in `x`'s dtype."""
    compute = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos.to(compute).unsqueeze(-2), sin.to(compute).unsqueeze(-2)
    rotated = x.to(compute)
    first, second = rotated.chunk(2, dim=-1)
    return (rotated * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)
