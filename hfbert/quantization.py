"""int8 linear layers for CPU inference: weights int8 per output channel, activations quantized at run time.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, quantize="int8")  # doctest: +SKIP

The method is ONNX Runtime's dynamic quantization: each weight row (output channel) is scaled to the int8 range
once; at every call the activation is scaled to uint8 with one scale and zero point from its own minimum and
maximum, and the int8 product (int32 accumulation) is scaled back to fp32, plus the fp32 bias.

The kernel is oneDNN's int8 inner product as torch ships it (`torch.ops.onednn.qlinear_prepack` and
`qlinear_pointwise`: what torch.compile's x86 int8 path calls), on plain uint8/int8 tensors. The older routes are
deprecated: `torch.ao.quantization` ("will be removed", pointing to torchao) and torch's quantized tensor dtypes
(quint8/qint8, pytorch#184982). torchao's int8 dynamic-activation path runs its CPU kernels only under
torch.compile; in eager mode it would fall back to slower ops.

CPUs without VNNI (AVX2 and AVX-512 without avx512_vnni) multiply uint8 by int8 with `vpmaddubsw`, which adds
pairs of products in 16 bits and can saturate; there weights use 7 bits ([-64, 63]), as fbgemm's "reduce_range"
does for the same reason, which costs one bit of weight precision and cannot overflow.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from hfbert.cpu import cpu_flags

_prepack = getattr(torch.ops.onednn, "qlinear_prepack", None)
_int8_product = getattr(torch.ops.onednn, "qlinear_pointwise", None)


def int8_available() -> bool:
    """Whether this torch build and CPU run oneDNN's int8 inner product (x86 with oneDNN)."""
    return _prepack is not None and _int8_product is not None and torch.backends.mkldnn.is_available()


def vnni_available() -> bool:
    """Whether oneDNN's int8 kernels use VNNI here (no 16-bit intermediate sums), caps included."""
    if not ({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags()):
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()  # oneDNN's names; the ones below AVX512_CORE_VNNI lack it
    return not cap or any(name in cap for name in ("VNNI", "AMX", "BF16", "FP16", "AVX10", "ALL"))


@dataclass
class Int8Weight:
    """A linear layer's weight in int8, packed once for oneDNN, with its per-output-channel scales and fp32 bias."""

    packed: Tensor  # oneDNN's blocked int8 layout
    scales: Tensor  # (out_features,) float32: weight ~= int8 x scale, row by row
    bias: Tensor | None
    in_features: int
    out_features: int
    levels: int  # 127, or 63 where 16-bit sums could saturate (no VNNI)


def quantize_weight(weight: Tensor, bias: Tensor | None) -> Int8Weight:
    """Symmetric per-output-channel int8 (`weight` is out x in, fp32), prepacked for oneDNN."""
    levels = 127 if vnni_available() else 63
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1).clamp(min=1e-12) / levels
    integers = torch.round(weight / scales[:, None]).clamp(-levels - 1, levels).to(torch.int8)
    return Int8Weight(
        packed=_prepack(integers, None),
        scales=scales,
        bias=None if bias is None else bias.detach().float(),
        in_features=weight.shape[1],
        out_features=weight.shape[0],
        levels=levels,
    )


def dequantize_weight(weight: Int8Weight) -> Tensor:
    """The fp32 weight the int8 one stands for (out x in)."""
    integers = weight.packed.to_dense()  # oneDNN keeps it in x out
    if integers.shape != (weight.out_features, weight.in_features):
        integers = integers.t()
    return integers.float() * weight.scales[:, None]


def quantize_activation(input: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """uint8 `input` with one scale and zero point from its range (which always holds 0, so padding and ReLU
    zeros stay exact): ONNX Runtime's DynamicQuantizeLinear."""
    low = input.min().clamp(max=0)
    high = input.max().clamp(min=0)
    scale = ((high - low) / 255).clamp(min=1e-12)
    zero_point = torch.round(-low / scale).clamp(0, 255)
    quantized = torch.round(input / scale).add_(zero_point).clamp_(0, 255).to(torch.uint8)
    return quantized, scale.float(), zero_point.to(torch.int64)


def int8_linear(input: Tensor, weight: Int8Weight) -> Tensor:
    """fp32 `input` (..., in_features) times the int8 weight, plus bias: fp32 (..., out_features)."""
    rows = input.reshape(-1, weight.in_features)
    quantized, scale, zero_point = quantize_activation(rows)
    zeros = torch.zeros(weight.out_features, dtype=torch.int64)
    output = _int8_product.tensor(
        quantized, scale, zero_point, weight.packed, weight.scales, zeros, weight.bias,
        1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip
    return output.view(*input.shape[:-1], weight.out_features)
