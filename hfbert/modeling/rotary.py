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
    transformers rotates a bf16 model's queries), returned in `x`'s dtype: plane i of (first, second) halves becomes
    (first * cos - second * sin, second * cos + first * sin), one new tensor."""
    dtype, compute = x.dtype, torch.promote_types(x.dtype, torch.float32)
    half = x.shape[-1] // 2
    cos, sin = (table[..., :half].to(compute).unsqueeze(-2) for table in (cos, sin))  # the halves repeat
    halves = x.to(compute).unflatten(-1, (2, half))  # (..., heads, 2, half): first and second
    # Both halves in one product and one multiply-add (first's partner is second, second's is first), the add into
    # the product's own new tensor: never a write into a slice of a buffer (`out=`), which the TorchScript ONNX
    # exporter drops and AOTAutograd refuses, so that every tracer records the rotation the eager model runs.
    rotated = (halves * cos.unsqueeze(-2)).addcmul_(halves.flip(-2), torch.stack((-sin, sin), dim=-2))
    return rotated.flatten(-2).to(dtype)
