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
- the residual stream, LayerNorm, softmax, GELU and attention's own products in fp32. Attention's query, key and
  value are one product (`fused.FusedSelfAttention` with this file's kernel, `BF16`), as in the int8 mode.

Its contract (`PRECISIONS` in optimize.py says why it is not a multiple of fp32's error): RMS error against
float64 at most OpenVINO bf16's on the same inputs, and a min cosine to the fp32 model of at least 0.9999 on
all-MiniLM-L6-v2 and all-mpnet-base-v2 (tests/test_bf16.py; `python -m benchmarks.peers` measures both beside
OpenVINO). Each rounding to bf16 costs about 2**-9 of a value, relative, so the error is about 1e-3 of the hidden
states' scale: several thousand times fp32's, and about 0.4x a wholly bf16 model's (docs/cpu-inference.md).

Where the CPU has no native bf16 (AVX2 CPUs, Zen 3, AVX-512 before Cooper Lake), oneDNN would emulate bf16, several
times slower than fp32: the mode's kernel cannot run there and `optimize_for_inference` says so by name (a warning,
as for int8), leaving the model as it was. The bf16 weights are a cache of the fp32 parameters (`swapped.py`):
weight changes, adapters and `load_state_dict` are followed as in the other modes, and training, gradients and
tracing run the fp32 computation.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from hfbert.inference.packed import can_pack, pack_whole, packed_product, packing_supported
from hfbert.inference.swapped import InferenceLinear, Kernel


def bf16_available() -> bool:
    """Whether this torch build and CPU run the bf16 mode's products natively (AVX512-BF16 or AMX, torch's
    oneDNN); `hfbert.platform.cpu.bfloat16_native` sees every cap (`ONEDNN_MAX_CPU_ISA`)."""
    return packing_supported(torch.bfloat16)


def _supports(weight: Tensor) -> bool:
    return weight.dtype == torch.float32 and can_pack(weight) and bf16_available()


def _accepts(input: Tensor, weight: Tensor) -> bool:
    return input.dtype == torch.float32


def _build(weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
    # The bias stays fp32: oneDNN adds it to the fp32 sums, before the output is rounded.
    return pack_whole(weight.detach().to(torch.bfloat16)), None if bias is None else bias.detach().float()


def bf16_linear(input: Tensor, form: tuple[Tensor, Tensor | None], post_op: str = "none") -> Tensor:
    """`F.linear(input, weight, bias)` with `input` and the weight rounded to bf16, summed in fp32, the output
    rounded to bf16 and returned as fp32 (..., out_features); `form` is `BF16.build(weight, bias)`. `post_op="gelu"`:
    GELU (erf) applied to the fp32 sums, before the one rounding."""
    rows = input.reshape(-1, input.shape[-1]).to(torch.bfloat16)
    return packed_product(rows, *form, post_op).float().view(*input.shape[:-1], -1)


# The bf16 mode's kernel: every large linear layer's, attention's query, key and value in one product, and the
# feed-forward product with GELU as its post-op (`fused.FusedIntermediate`): GELU on the fp32 sums, so that its
# output is rounded once (it is the next product's bf16 input), not twice (the product's output, then GELU's).
BF16 = Kernel("bf16", _supports, _accepts, _build, bf16_linear, functools.partial(bf16_linear, post_op="gelu"))


class BF16Linear(InferenceLinear):
    """`nn.Linear` whose plain CPU inference calls run in bf16 (module docstring); everything else, training
    included, runs `F.linear` on the fp32 parameter it keeps."""

    kernel = BF16
