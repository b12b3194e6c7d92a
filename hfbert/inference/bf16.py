"""The bf16 mode, `optimize_for_inference(model, precision="bf16")`: the products in bf16, everything else in fp32.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, precision="bf16")  # doctest: +SKIP

What a model cast to bf16 whole (`model.bfloat16()`) gets wrong is not its products: it is the residual stream,
LayerNorm and softmax rounded to bf16's 8 bits after every op, the error piling up layer by layer. This mode keeps
the model's fp32 parameters and fp32 activations, and runs only the linear products in bf16 (the way OpenVINO's
bf16 and torch's CPU autocast do it):

- each weight rounded to bf16 once, packed in oneDNN's blocked layout for the CPU's kernel (AMX tiles where the CPU
  has them, AVX512-BF16 otherwise);
- each product's input rounded to bf16 as it runs, summed in fp32 by oneDNN, its bias added in fp32; the product's
  output rounded to bf16 (oneDNN's bf16 product writes bf16) and read back as fp32;
- the residual stream, LayerNorm and GELU in fp32. Attention's query, key and value are one product
  (`fused.FusedSelfAttention` with this file's kernel, `BF16`), as in the int8 mode. Attention computes on that
  product's bf16 output as it is (`Kernel.run_native`; torch's flash kernel: bf16 products summed in fp32, the
  softmax in fp32, its probabilities rounded to bf16 for the product with the values) where that was measured
  faster than attention in fp32 (`fused.FusedAttention.precision_candidates`): on AMX's tiles it is 2.6x faster, on
  a Zen 4 without AMX slower, so there attention stays fp32. Both keep the contract; where attention must return
  its probabilities (the eager kernel) it runs in fp32;
- each product runs whole, or in tiles of TILE_ROWS rows at the row counts where that was measured faster for its
  shape (TILE_COUNTS).

Its contract (`PRECISIONS` in optimize.py says why it is not a multiple of fp32's error): RMS error against
float64 at most OpenVINO bf16's on the same inputs, and a min cosine to the fp32 model of at least 0.9999 on
all-MiniLM-L6-v2 and all-mpnet-base-v2 (tests/test_bf16.py; `python -m benchmarks.peers` measures both beside
OpenVINO). Each rounding to bf16 costs about 2**-9 of a value, relative, so the error is about 1e-3 of the hidden
states' scale: several thousand times fp32's, and about 0.4x a wholly bf16 model's (docs/cpu-inference.md).

`compile=True` runs this mode under torch.compile (`compiled.py`): the products are one op of this file
(`hfbert::bf16_product`, the same kernel, see below), the fp32 ops between them fused by inductor; each shape's graph
is timed against this eager forward when first compiled, and the faster runs.

Where the CPU has no native bf16 (AVX2 CPUs, Zen 3, AVX-512 before Cooper Lake), oneDNN would emulate bf16, several
times slower than fp32: the mode's kernel cannot run there and `optimize_for_inference` says so by name (a warning,
as for int8), leaving the model as it was. The bf16 weights are a cache of the fp32 parameters (`swapped.py`):
weight changes, adapters and `load_state_dict` are followed as in the other modes, and training, gradients and
tracing run the fp32 computation.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from hfbert.inference.measured import Candidate, bucket, measured_choice
from hfbert.inference.packed import TILE_ROWS, can_pack, pack_whole, packed_product, packing_supported
from hfbert.inference.swapped import InferenceLinear, Kernel

# Row counts at which a product runs whole or in tiles of TILE_ROWS rows, whichever was measured faster for its
# shape: oneDNN's bf16 product picks its blocking by the row count, and on some CPUs and shapes a range of counts
# runs far slower per row than the counts around it (docs/cpu-inference.md measures one). Rows within a tile always
# run whole.
TILE_COUNTS = (512, 1024, 2048, 4096)


class BF16Form(NamedTuple):
    """A layer's form for the bf16 kernel: its packed bf16 weight, its fp32 bias, and per TILE_COUNTS whether the
    product runs in tiles (1) or whole (0)."""

    packed: Tensor
    bias: Tensor | None
    tiles: tuple[int, ...]


def bf16_available() -> bool:
    """Whether this torch build and CPU run the bf16 mode's products natively (AVX512-BF16 or AMX, torch's
    oneDNN); `hfbert.platform.cpu.bfloat16_native` sees every cap, in every spelling (`ENVIRONMENT_CAPS`)."""
    return packing_supported(torch.bfloat16)


def _supports(weight: Tensor) -> bool:
    return weight.dtype == torch.float32 and can_pack(weight) and bf16_available()


def _accepts(input: Tensor, weight: Tensor) -> bool:
    return input.dtype == torch.float32


def _build(weight: Tensor, bias: Tensor | None) -> BF16Form:
    # The bias stays fp32: oneDNN adds it to the fp32 sums, before the output is rounded.
    tiles = measured_choice(("bf16 tiles", *weight.shape), _tile_candidates(*weight.shape), TILE_COUNTS)
    return BF16Form(
        pack_whole(weight.detach().to(torch.bfloat16)), None if bias is None else bias.detach().float(), tiles
    )


def _tile_candidates(out_features: int, in_features: int) -> list[Candidate]:
    def make(tiled: bool) -> Candidate:
        def call(rows: int):
            weight = pack_whole(torch.randn(out_features, in_features).to(torch.bfloat16))
            form = BF16Form(weight, torch.zeros(out_features), (int(tiled),) * len(TILE_COUNTS))
            input = torch.randn(rows, in_features).to(torch.bfloat16)
            return lambda: _product(input, form, "none")

        return call

    return [make(False), make(True)]


def _product(rows: Tensor, form: BF16Form, post_op: str) -> Tensor:
    """(rows, in) bf16 x the packed weight + bias, written in bf16, whole or in tiles as measured for its rows."""
    if torch.compiler.is_compiling():
        return torch.ops.hfbert.bf16_product(rows, form.packed, form.bias, post_op, list(form.tiles))
    return _tiled(rows, form.packed, form.bias, post_op, form.tiles)


def _tiled(rows: Tensor, packed: Tensor, bias: Tensor | None, post_op: str, tiles: Sequence[int]) -> Tensor:
    if len(rows) > TILE_ROWS and tiles[bucket(len(rows), TILE_COUNTS)]:
        starts = range(0, len(rows), TILE_ROWS)
        return torch.cat([packed_product(rows[at : at + TILE_ROWS], packed, bias, post_op) for at in starts])
    return packed_product(rows, packed, bias, post_op)


# The product as one op for the compiled path (`compiled.py`): inductor's own lowering of oneDNN's product promotes
# a bf16 input and an fp32 bias to one dtype, which would round the bias to bf16 or run the product in fp32. As an
# op of its own it runs as in eager, called from the compiled code. Defined with torch.library's low-level API, not
# `custom_op`, whose wrapper costs more per call (docs/cpu-inference.md); the compiled path runs
# under no_grad only, so the op needs no autograd formula.
_LIBRARY = torch.library.Library("hfbert", "DEF")
_LIBRARY.define("bf16_product(Tensor rows, Tensor packed, Tensor? bias, str post_op, int[] tiles) -> Tensor")
_LIBRARY.impl("bf16_product", _tiled, "CompositeExplicitAutograd")


@torch.library.register_fake("hfbert::bf16_product", lib=_LIBRARY)
def _(rows: Tensor, packed: Tensor, bias: Tensor | None, post_op: str, tiles: list[int]) -> Tensor:
    return rows.new_empty(rows.shape[0], packed.shape[0])


def bf16_native(input: Tensor, form: BF16Form, post_op: str = "none") -> Tensor:
    """`bf16_linear`'s product as oneDNN writes it, in bf16: for attention, which computes on bf16 as it is."""
    rows = input.reshape(-1, input.shape[-1]).to(torch.bfloat16)
    return _product(rows, form, post_op).view(*input.shape[:-1], -1)


def bf16_linear(input: Tensor, form: BF16Form, post_op: str = "none") -> Tensor:
    """`F.linear(input, weight, bias)` with `input` and the weight rounded to bf16, summed in fp32, the output
    rounded to bf16 and returned as fp32 (..., out_features); `form` is `BF16.build(weight, bias)`. `post_op="gelu"`:
    GELU (erf) applied to the fp32 sums, before the one rounding."""
    return bf16_native(input, form, post_op).float()


# The bf16 mode's kernel: every large linear layer's, attention's query, key and value in one product, and the
# feed-forward product with GELU as its post-op (`fused.FusedIntermediate`): GELU on the fp32 sums, so that its
# output is rounded once (it is the next product's bf16 input), not twice (the product's output, then GELU's).
BF16 = Kernel(
    "bf16", _supports, _accepts, _build, bf16_linear, functools.partial(bf16_linear, post_op="gelu"), bf16_native
)


class BF16Linear(InferenceLinear):
    """`nn.Linear` whose plain CPU inference calls run in bf16 (module docstring); everything else, training
    included, runs `F.linear` on the fp32 parameter it keeps."""

    kernel = BF16
