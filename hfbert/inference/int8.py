"""int8 linear layers for CPU inference: int8 weights, activations quantized as each product runs.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, quantize="int8")  # doctest: +SKIP

The method is dynamic quantization (ONNX Runtime's `quantize_dynamic`, with a scale per token, not per tensor):

- weights: symmetric, one scale per output channel, `weight[n, :] ~= q[n, :] * scales[n]` with `q` in
  [-127, 127] ([-63, 63] where the kernel would saturate, below); quantized and packed once;
- activations: asymmetric, one scale and zero point per row (per token), from the row's own minimum and maximum
  at every call: `x[m, :] ~= (u[m, :] - zero_point[m]) * scale[m]`, `u` in [0, 255]. Per token, so
  that one token's outlier dimensions cost only that token its precision; asymmetric, because what enters the
  feed-forward output (after GELU) is nearly all positive, where a symmetric scale wastes half the codes;
- the product: uint8 x int8 summed in int32 by oneDNN, which applies the weight scales; then in fp32
  `y[m, n] = scale[m] * (that[m, n] - zero_point[m] * sums[n]) + bias[n]`, `sums[n] = sum_k q[n, k] scales[n]`
  (the kernel takes a single activation scale and zero point, so the per-token ones are applied to its output).

The kernel is oneDNN's int8 inner product as torch ships it, `torch.ops.onednn.qlinear_prepack` and
`qlinear_pointwise`, on plain uint8/int8 tensors: what torch.compile's x86 int8 path (and torchao's int8 configs
under it) lowers to. torch's other int8 routes are deprecated (`torch.ao.quantization.quantize_dynamic`, the
`torch.qint8` dtypes) or re-lay out the weight at every call (`torch._int_mm`, torchao's eager path).

Without VNNI (AVX2, or AVX-512 before Cascade Lake) x86 adds pairs of uint8 x int8 products into a saturating
int16 (`vpmaddubsw`): 2 x 255 x 127 overflows it. Where a probe product shows that, weights use [-63, 63]
(2 x 255 x 63 fits), which costs less accuracy than 7-bit activations (fbgemm's and ONNX Runtime's
`reduce_range`). Attention's query, key and value projections read the same hidden states: the int8 model computes
the three in one product (hidden -> 3 x hidden), its input quantized once: `fused.FusedSelfAttention` with this
file's kernel, `INT8`.

Why per token: one scale per tensor (ONNX Runtime's `DynamicQuantizeLinear`; oneDNN's kernel would then apply it,
the bias and GELU itself, a few ops fewer per product) costs real sentence embeddings several times the error. On
all-MiniLM-L6-v2 (`python -m benchmarks.int8_accuracy`, docs/cpu-inference.md) it falls below both ONNX Runtime's
and CTranslate2's int8; per token stays above both.

`Int8Linear` keeps the layer's fp32 `weight` parameter (the int8 form is a cache of it, rebuilt when it changes), so
an int8 model still saves, loads and trains its real weights; only plain CPU inference calls run int8. Accuracy and
speed against fp32, ONNX Runtime and CTranslate2: docs/cpu-inference.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hfbert.inference.packed import can_pack
from hfbert.inference.swapped import InferenceLinear, Kernel
from hfbert.platform.onednn import onednn_ops


def _ops() -> tuple[Any, Any] | None:
    """oneDNN's int8 weight prepack and product, or None where this torch or CPU has none (then int8 is
    unavailable and hfbert stays fp32)."""
    return onednn_ops("onednn", "qlinear_prepack", "qlinear_pointwise")


def _prepack(*args: Any) -> Tensor:
    return _ops()[0](*args)


def _int8_product(*args: Any) -> Tensor:
    # By name, not through `_ops()`: torch.compile traces this (the compiled path), and only runs where `_ops()` has
    # found the op (`int8_available`).
    return torch.ops.onednn.qlinear_pointwise(*args)


_TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row: any positive value quantizes it to zeros
STEPS = 255  # an activation row's range in uint8 steps


def int8_available() -> bool:
    """Whether this torch build and CPU run `int8_linear`: x86 with AVX2 or better, and torch's oneDNN."""
    return (
        torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
        and _levels() is not None
    )


def vnni_available() -> bool:
    """Whether oneDNN's int8 kernel sums uint8 x int8 products here without 16-bit saturation (VNNI or AMX), so
    weights get the full [-127, 127]; found by a probe product, so it sees every cap (`ENVIRONMENT_CAPS`)."""
    return _levels() == 127


@functools.cache
def _levels() -> int | None:
    """127 where the kernel sums the worst-case products exactly, 63 where 127 would saturate, None where the
    kernel cannot run here."""
    if _ops() is None or not torch.backends.mkldnn.is_available():
        return None
    try:
        return next((levels for levels in (127, 63) if _sums_exactly(levels)), None)
    except RuntimeError:
        return None


def _sums_exactly(levels: int) -> bool:
    # Every product 255 x levels, at a few row counts (oneDNN picks its kernel by shape). 512 x 255 x 127 < 2**24,
    # so the exact sum is exact in fp32 too.
    depth, outputs = 512, 32
    packed = _prepack(torch.full((outputs, depth), levels, dtype=torch.int8), None)
    ones, zeros = torch.ones(outputs), torch.zeros(outputs, dtype=torch.int64)
    for rows in (1, 8, 64):
        activations = torch.full((rows, depth), 255, dtype=torch.uint8)
        output = _int8_product(activations, 1.0, 0, packed, ones, zeros, None, 1.0, 0, torch.float32, "none", [], "")
        if not torch.equal(output, torch.full((rows, outputs), float(depth * 255 * levels))):
            return False
    return True


@dataclass(eq=False)
class Int8Weight:
    """A linear layer's weight as `int8_linear` runs it: int8 values in oneDNN's packed layout (the only copy of the
    weight), their per-output-channel scales, and the fp32 bias. `dequantize_weight` gives the fp32 weight."""

    packed: Tensor  # int8 (out_features, in_features) values in oneDNN's blocked layout
    scales: Tensor  # fp32 (out_features,): weight[n, :] ~= values[n, :] * scales[n]
    sums: Tensor  # fp32 (out_features,): each output channel's dequantized weights summed (for zero points)
    bias: Tensor | None  # fp32 (out_features,)
    in_features: int
    out_features: int
    levels: int  # the values lie in [-levels, levels]: 127, or 63 where 16-bit sums would saturate (no VNNI)
    _zero_points: Tensor = field(repr=False)  # int64 zeros (out_features,): the kernel takes weight zero points

    # oneDNN's packed tensors cannot be pickled or deep-copied: carry the plain int8 values and repack on arrival.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "packed": _int8_values(self)}

    def __setstate__(self, state: dict) -> None:
        if _levels() is None:
            raise RuntimeError("this int8 weight cannot be unpickled here: int8_available() is False")
        if state["levels"] > _levels():  # quantized where VNNI sums exactly, arriving where it would saturate
            dequantized = state["packed"].float() * state["scales"][:, None]
            state = quantize_weight(dequantized, state["bias"]).__dict__
        else:
            state = {**state, "packed": _prepack(state["packed"], None)}
        self.__dict__.update(state)


def quantize_weight(weight: Tensor, bias: Tensor | None = None) -> Int8Weight:
    """Symmetric per-output-channel int8 of a linear layer's (out_features, in_features) weight, packed for oneDNN
    once; the bias stays fp32. Raises RuntimeError where `int8_available()` is False."""
    if not int8_available():
        raise RuntimeError("int8 inference needs torch's oneDNN on an x86 CPU with AVX2 (int8_available() is False)")
    if weight.dim() != 2 or weight.numel() == 0 or not weight.is_floating_point():
        raise ValueError(f"weight must be a non-empty 2-d floating-point tensor, not {weight.dtype} {weight.shape}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must have shape [{weight.shape[0]}] (out_features), not {list(bias.shape)}")
    weight = weight.detach().to("cpu", torch.float32)
    if not torch.isfinite(weight).all():
        raise ValueError("weight has NaN or infinite values, which int8 cannot represent")
    levels = _levels()
    largest = weight.abs().amax(dim=1)
    scales = torch.where(largest > 0, largest / levels, torch.ones_like(largest))  # an all-zero row stays zero
    values = torch.round(weight / scales[:, None]).clamp_(-levels, levels).to(torch.int8)
    return Int8Weight(
        packed=_prepack(values, None),
        scales=scales,
        sums=values.sum(dim=1, dtype=torch.int32).float() * scales,
        bias=None if bias is None else bias.detach().to("cpu", torch.float32).contiguous(),
        in_features=weight.shape[1],
        out_features=weight.shape[0],
        levels=levels,
        _zero_points=torch.zeros(weight.shape[0], dtype=torch.int64),
    )


def dequantize_weight(weight: Int8Weight) -> Tensor:
    """The fp32 (out_features, in_features) weight that `weight` stands for: int8 values times their scales."""
    return _int8_values(weight).float() * weight.scales[:, None]


def _int8_values(weight: Int8Weight) -> Tensor:
    # oneDNN's packed tensor reads back as (in_features, out_features), square weights included.
    return weight.packed.to_dense().t().contiguous()


def quantize_activation(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, features) fp32 -> uint8 values, and a scale and zero point per row, (rows, 1) fp32 each, with
    `rows ~= (values - zero_point) * scale`: each row's range, widened to hold 0 (so that zeros, padding and
    ReLU's, stay exact), in 255 steps; ONNX Runtime's DynamicQuantizeLinear, row by row."""
    # Not torch.aminmax: along a dimension it is many times slower than the two reductions (torch 2.13, x86).
    low, high = rows.amin(dim=-1, keepdim=True), rows.amax(dim=-1, keepdim=True)
    scale = (high.clamp_(min=0) - low.clamp_(max=0)).div_(STEPS).clamp_(min=_TINY)
    zero_point = low.div_(scale).neg_().round_()
    # Each pass over the activation costs as much as the next: x / scale + zero_point + 1/2, truncated to uint8, is
    # x rounded to the nearest step. The clamp is needed: the top value can reach 255.5 + 1/2, which would wrap
    # around to 0. (254 steps would keep it in range without the clamp; measured on MiniLM's embeddings, the lost
    # step costs more accuracy than the pass costs time.)
    values = rows.div(scale).add_(zero_point + 0.5).clamp_(0, STEPS).to(torch.uint8)
    return values, scale, zero_point


def int8_linear(input: Tensor, weight: Int8Weight) -> Tensor:
    """`F.linear(input, dequantize_weight(weight), weight.bias)` in int8, each row of `input` (fp32, shape
    (..., in_features)) quantized on the fly (`quantize_activation`); returns fp32 (..., out_features). Inference
    only: the kernel has no gradient."""
    if input.dtype != torch.float32 or input.device.type != "cpu":
        raise TypeError(f"int8_linear takes fp32 CPU input, not {input.dtype} on {input.device}")
    if input.shape[-1:] != (weight.in_features,):
        raise ValueError(f"input's last dimension must be {weight.in_features} (in_features): {list(input.shape)}")
    if torch.is_grad_enabled() and input.requires_grad:
        raise RuntimeError("int8_linear has no gradient: run it under torch.no_grad() or torch.inference_mode()")
    shape = (*input.shape[:-1], weight.out_features)
    if input.numel() == 0:
        return input.new_empty(shape)
    values, scale, zero_point = quantize_activation(input.reshape(-1, weight.in_features))
    output = _int8_product(
        values, 1.0, 0, weight.packed, weight.scales, weight._zero_points, None, 1.0, 0, torch.float32, "none", [], ""
    )
    output.addr_(zero_point.view(-1), weight.sums, alpha=-1)
    if weight.bias is None:
        output.mul_(scale)
    else:
        output = torch.addcmul(weight.bias, output, scale, out=output)  # in place: one pass over the output
    return output.view(shape)


def supports(weight: Tensor) -> bool:
    """Whether int8 can run a product with `weight` here: fp32 on the CPU, where `int8_available()`."""
    return weight.dtype == torch.float32 and can_pack(weight) and int8_available()


def _fp32(input: Tensor, weight: Tensor) -> bool:
    return input.dtype == torch.float32


# The int8 modes' kernel: `Int8Linear`'s, and attention's query, key and value in one product (`fused.py`).
INT8 = Kernel("int8", supports, _fp32, quantize_weight, int8_linear)


class Int8Linear(InferenceLinear):
    """`nn.Linear` whose plain CPU inference calls run in int8 (module docstring); everything else, training
    included, runs `F.linear` on the fp32 parameter it keeps.

    `hfbert.optimize_for_inference(model, quantize="int8")` swaps a model's linear layers for these; `from_linear`
    keeps the layer's parameters (the same objects) and hooks.
    """

    kernel = INT8
