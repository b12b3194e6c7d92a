"""`PackedLinear`: an `nn.Linear` whose CPU inference runs on its weight packed once for oneDNN.

oneDNN re-lays out a plain weight on every call; packed once into its blocked layout, a product of few rows runs
several times faster (the weight is streamed, not copied). oneDNN sums the whole inner dimension in one register
chain, which loses more bits than MKL's sgemm (transformers' kernel: blocks of about 192 products, then the blocks
added). So the packed weight is cut into column blocks of PACKED_BLOCK inputs, each block's product starts from
zero and the partial products are added in order (oneDNN's fused "add" post-op): the error against float64 stays
transformers' own (docs/numerical-contract.md measures it on every instruction set).

The packed blocks are a cache of the layer's `weight` parameter, which stays what it was (`swapped.py`): a changed
weight is packed again before it runs, and every call that is not plain CPU inference runs `F.linear`. Whether the
blocks beat MKL's sgemm depends on the CPU and the row count (on Zen 3's AVX2 they mostly lose): `optimize.py` swaps
a layer in only where `measured.py` found it faster, and only for those row counts.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.inference.measured import Candidate
from hfbert.inference.swapped import InferenceLinear, Kernel
from hfbert.platform.cpu import bfloat16_native
from hfbert.platform.onednn import onednn_ops

PACKED_BLOCK = 192
# oneDNN costs more per call than F.linear: smaller layers (a classifier's few outputs) stay nn.Linear
# (docs/cpu-inference.md, "Thresholds").
MIN_PACKED_WEIGHTS = 2**19
# Many rows through few blocks: every block re-reads and rewrites the whole output, so tiles of TILE_ROWS rows keep
# it in cache. With many blocks (the feed-forward output's 3072 inputs) the extra calls cost more than the cache saves.
TILE_ROWS = 256
TILE_MAX_BLOCKS = 4


@functools.cache
def _ops() -> tuple[Any, Any] | None:
    """oneDNN's fp32/bf16 inner product and weight reorder, or None where this torch or CPU has none."""
    if not torch.backends.mkldnn.is_available():
        return None
    return onednn_ops("mkldnn", "_linear_pointwise", "_reorder_linear_weight")


def packing_supported(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU can pack weights of `dtype`: fp32 on x86 with oneDNN, and bf16 where the CPU
    computes it natively (elsewhere oneDNN would emulate it slowly)."""
    if _ops() is None or not torch.backends.mkldnn.enabled:
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bfloat16_native())


def can_pack(weight: Tensor) -> bool:
    """Whether `weight` itself can be packed here: a plain 2-d CPU tensor of a supported dtype."""
    return (
        type(weight) in (Tensor, nn.Parameter)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and packing_supported(weight.dtype)
    )


def pack_weight(weight: Tensor) -> tuple[Tensor, ...]:
    """Cut `weight` (out x in) into blocks of PACKED_BLOCK input columns, each in oneDNN's blocked layout. bf16
    stays one block: its error is the rounding of its inputs, and oneDNN accumulates it in fp32 anyway."""
    _, reorder = _ops()
    block = PACKED_BLOCK if weight.dtype == torch.float32 else weight.shape[1]
    return tuple(reorder(part.contiguous()) for part in weight.detach().split(block, dim=1))


def packed_linear(input: Tensor, blocks: tuple[Tensor, ...], bias: Tensor | None) -> Tensor:
    """`F.linear(input, weight, bias)` on the blocks of `pack_weight(weight)`, summed block by block."""
    rows = input.reshape(-1, input.shape[-1])
    if rows.shape[0] > TILE_ROWS and len(blocks) <= TILE_MAX_BLOCKS:
        tiles = [_blockwise(rows[start : start + TILE_ROWS], blocks, bias) for start in range(0, len(rows), TILE_ROWS)]
        output = torch.cat(tiles)
    else:
        output = _blockwise(rows, blocks, bias)
    return output.view(*input.shape[:-1], output.shape[-1])


def _product() -> Any:
    # By name, not through `_ops()` (whose check torch.compile cannot trace: a graph break at every product): the
    # compiled path traces the products, and they run only where `_ops()` found the op (`packing_supported`).
    return torch.ops.mkldnn._linear_pointwise


def _blockwise(rows: Tensor, blocks: tuple[Tensor, ...], bias: Tensor | None) -> Tensor:
    product = _product()
    pieces = _column_blocks(rows, blocks)
    output = product(pieces[0], blocks[0], bias, "none", [], "")
    for piece, block in zip(pieces[1:], blocks[1:], strict=True):
        output = _add_product(piece, block, None, output)
    return output


def _add_product(rows: Tensor, packed: Tensor, bias: Tensor | None, other: Tensor) -> Tensor:
    """rows x packed + bias + other. Eager: the addition as oneDNN's binary post-op. Traced (the compiled path): the
    same sum as an addition after the product, which inductor fuses into its loops (torch has no fake-tensor rule
    for the binary op); the same roundings either way (the post-op adds to the product's fp32 result)."""
    if torch.compiler.is_compiling():
        return _product()(rows, packed, bias, "none", [], "") + other
    return _product().binary(rows, other, packed, bias, "add")


def _column_blocks(rows: Tensor, blocks: tuple[Tensor, ...]) -> list[Tensor]:
    """`rows` cut into the blocks' input columns, each contiguous (oneDNN reads dense inputs only). The full blocks
    are gathered by one copy, not one per block: at a few rows the cost of one op per block outweighs the copying."""
    if len(blocks) == 1:
        return [rows.contiguous()]
    full = rows.shape[1] // PACKED_BLOCK * PACKED_BLOCK
    pieces = list(rows[:, :full].unflatten(1, (-1, PACKED_BLOCK)).transpose(0, 1).contiguous().unbind(0))
    return pieces if full == rows.shape[1] else [*pieces, rows[:, full:].contiguous()]


def linear_candidates(out_features: int, in_features: int, dtype: torch.dtype) -> list[Candidate]:
    """The two ways to compute a linear layer of this shape, for `measured.measured_choice`: `F.linear` (MKL's
    sgemm on x86) and `packed_linear`."""

    def inputs(rows: int) -> tuple[Tensor, Tensor, Tensor]:
        return (
            torch.randn(rows, in_features).to(dtype),
            torch.randn(out_features, in_features).to(dtype),
            torch.zeros(out_features, dtype=dtype),
        )

    def plain(rows: int):
        input, weight, bias = inputs(rows)
        return lambda: F.linear(input, weight, bias)

    def packed(rows: int):
        input, weight, bias = inputs(rows)
        blocks = pack_weight(weight)
        return lambda: packed_linear(input, blocks, bias)

    return [plain, packed]


def pack_whole(weight: Tensor) -> Tensor:
    """`weight` (out x in) in oneDNN's blocked layout, the whole inner dimension at once (the fast fp32 mode)."""
    return _ops()[1](weight.detach().contiguous())


def packed_product(rows: Tensor, packed: Tensor, bias: Tensor | None, post_op: str = "none") -> Tensor:
    """(rows, in) x packed (out x in) + bias, with oneDNN's `post_op` ("none", or "gelu": GELU's erf form)."""
    return _product()(rows, packed, bias, post_op, [], "none" if post_op == "gelu" else "")


def packed_product_add(rows: Tensor, packed: Tensor, bias: Tensor | None, other: Tensor) -> Tensor:
    """(rows, in) x packed + bias + other, the addition as oneDNN's binary post-op (`_add_product`)."""
    return _add_product(rows, packed, bias, other)


def _same_dtype(input: Tensor, weight: Tensor) -> bool:
    return input.dtype == weight.dtype


def _fp32(input: Tensor, weight: Tensor) -> bool:
    return input.dtype == torch.float32 == weight.dtype


def _fp32_packable(weight: Tensor) -> bool:
    return weight.dtype == torch.float32 and can_pack(weight)


class PackedBlocks(tuple):
    """`pack_weight`'s blocks (iterating gives them), and the layer's bias with them: `BLOCKED`'s form."""

    bias: Tensor | None


def _build_blocked(weight: Tensor, bias: Tensor | None) -> PackedBlocks:
    blocks = PackedBlocks(pack_weight(weight))
    blocks.bias = bias
    return blocks


def _run_blocked(input: Tensor, form: PackedBlocks) -> Tensor:
    return packed_linear(input, form, form.bias)


def _build_whole(weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    return pack_whole(weight), bias


def _run_whole(input: Tensor, form: tuple[Tensor, Tensor | None], post_op: str = "none") -> Tensor:
    rows = input.reshape(-1, input.shape[-1])
    return packed_product(rows, *form, post_op).view(*input.shape[:-1], -1)


# The default mode's kernel: blocks of PACKED_BLOCK inputs summed in order (transformers' accuracy).
BLOCKED = Kernel("packed", can_pack, _same_dtype, _build_blocked, _run_blocked)
# The fast fp32 mode's kernel (`fused.py`): the whole inner dimension in one chain, fp32 only.
WHOLE = Kernel("fused", _fp32_packable, _fp32, _build_whole, _run_whole, functools.partial(_run_whole, post_op="gelu"))


class PackedLinear(InferenceLinear):
    """`nn.Linear` whose CPU inference runs on its weight packed once (see the module docstring).

        >>> layer = PackedLinear.from_linear(nn.Linear(768, 768))  # doctest: +SKIP

    `hfbert.optimize_for_inference` swaps a model's large `nn.Linear` layers for these; `from_linear` keeps the
    layer's parameters and hooks, so the model's parameters, state dict and optimizers see no difference.
    `_choice` says, for each row count of `measured.ROW_BUCKETS`, whether the packed product (1) or `F.linear` (0)
    runs: whichever was measured faster here (`swapped.Swapped.kernel_way` decides).
    """

    kernel = BLOCKED
