"""int8 linear layers for CPU inference: int8 weights, activations quantized as each product runs.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, quantize="int8")  # doctest: +SKIP

The method is dynamic quantization (ONNX Runtime's `quantize_dynamic`, with a scale per token, not per tensor):

- weights: symmetric, one scale per output channel, `weight[n, :] ~= q[n, :] * scales[n]` with `q` in
  [-127, 127] ([-63, 63] where the kernel would saturate, below); quantized and packed once;
- activations: asymmetric, one scale and zero point per row (per token), from the row's own minimum and maximum
  at every call: `x[m, :] ~= (u[m, :] - zero_point[m]) * scale[m]`, `u` in [0, 255]. Per token, so that one token's
  outlier dimensions cost only that token its precision; asymmetric, because what enters the feed-forward output
  (after GELU) is nearly all positive, where a symmetric scale wastes half the codes;
- the product: uint8 x int8 summed in int32 by oneDNN, which applies the weight scales; then in fp32
  `y[m, n] = scale[m] * (that[m, n] - zero_point[m] * sums[n]) + bias[n]`, `sums[n] = sum_k q[n, k] scales[n]`
  (the kernel takes a single activation scale and zero point, so the per-token ones are applied to its output).

The kernel is oneDNN's int8 inner product as torch ships it, `torch.ops.onednn.qlinear_prepack` and
`qlinear_pointwise`, on plain uint8/int8 tensors: what torch.compile's x86 int8 path (and torchao's int8 configs
under it) lowers to. The alternatives, in torch 2.13: `torch.ao.quantization.quantize_dynamic` warns it is
deprecated (use torchao, pytorch/ao#2259); fbgemm's `quantized::linear_dynamic` needs a `torch.qint8` weight, and
creating one warns that the quantized dtypes will be removed (pytorch/pytorch#184982); torchao 0.18's
`Int8DynamicActivationInt8WeightConfig` runs `torch._int_mm` in eager, which re-lays out the weight at every call
(its wheel has no x86 int8 kernel of its own): 1.3-3.4x slower than this; `torch._int_mm` alone takes no prepacked
weight either (as fast at 16 rows on AVX-512, up to 1.4x slower at 1024 rows, 2-3x slower at 16 rows on AVX2).

Without VNNI (AVX2, or AVX-512 before Cascade Lake) x86 adds pairs of uint8 x int8 products into a saturating
int16 (`vpmaddubsw`): 2 x 255 x 127 overflows it, and results go wrong by up to 9% (measured). Where a probe
product shows that, weights use [-63, 63] (2 x 255 x 63 fits), which costs less accuracy than 7-bit activations
(fbgemm's and ONNX Runtime's `reduce_range`): all-MiniLM-L6-v2 embeddings, min cosine 0.989 against 0.975.

Attention's query, key and value projections read the same hidden states: `int8_linears` quantizes them once for
the three (`hfbert.linear.linears_of_one_input`).

Measured on AMD EPYC (AVX-512 with VNNI), one thread, when this module was written (quantization since runs in
place, a little faster; `python benchmarks/kernels.py` measures the current product on the machine at hand);
"AVX2": the same CPU with oneDNN, MKL and ATen capped to AVX2 (`hfbert.cpu.CAPS`). Time per product including
the activations' quantization; speedup over fp32 `F.linear` and over oneDNN's fp32 inner product with a prepacked
weight; error: RMS against float64, relative to the output's RMS, on Gaussian inputs with 4 outlier dimensions 20x
larger:

    rows x in -> out   AVX-512 (VNNI, 127 levels)               AVX2 (63 levels)
                       time     vs F.linear  vs oneDNN  error     time     vs F.linear  vs oneDNN  error
      16 x  768 -> 2304   0.20 ms   3.8x        1.8x       2.9%      0.40 ms   1.8x        1.4x       3.3%
    1024 x  768 -> 2304   5.1 ms    8.8x        3.6x       3.0%     18.8 ms    2.2x        2.1x       3.3%
      16 x  768 ->  768   0.09 ms   2.6x        1.2x       2.9%      0.16 ms   1.3x        1.1x       3.2%
    1024 x  768 ->  768   2.2 ms    6.7x        2.2x       3.0%      5.4 ms    2.6x        2.4x       3.3%
      16 x  768 -> 3072   0.27 ms   4.3x        1.8x       3.1%      0.59 ms   1.9x        1.5x       3.4%
    1024 x  768 -> 3072   6.6 ms    9.4x        4.2x       3.1%     27.0 ms    2.1x        1.7x       3.3%
      16 x 3072 ->  768   0.26 ms   4.1x        1.9x       4.3%      0.58 ms   1.8x        1.5x       4.5%
    1024 x 3072 ->  768  11.9 ms    5.4x        2.2x       4.2%     28.5 ms    2.0x        1.9x       4.5%

One scale per tensor instead (ONNX Runtime's and fbgemm's choice) runs at about the same speed (up to 25% faster
at 16 rows) with 2-3x the error on such inputs (5.3-12%). fbgemm is faster on AVX-512 at 16 rows (1.3-1.9x) and
at 1024 x 3072 (1.8x), the same under AVX2; torchao's eager path is 1.3-3.4x slower than this.

all-MiniLM-L6-v2, mean-pooled normalised embeddings of 50 sentences (the parity sentences and 8 more), cosine to
fp32, min / mean:

    hfbert int8 (this module)            0.9932 / 0.9987   AVX2: 0.9887 / 0.9972
    the same, one scale per tensor       0.9654 / 0.9924   AVX2: 0.9694 / 0.9918
    the same, 7-bit activations instead of 63 levels (reduce_range): 0.9748 / 0.9959
    ONNX Runtime quantize_dynamic, per-channel weights      0.9679 / 0.9919 (per-tensor weights: 0.8571 / 0.9599)
    CTranslate2 int8                     0.9788 / 0.9965   AVX2 (CT2, MKL, oneDNN capped): 0.9745 / 0.9955

Keeping any one kind of layer in fp32 (query/key/value, attention output, intermediate, feed-forward output)
gains little (min 0.992-0.996), so every linear layer of the encoder is quantized.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from hfbert.cpu import X86

# Private ops of torch, looked up defensively: without them int8 is unavailable and hfbert stays fp32.
_prepack = getattr(torch.ops.onednn, "qlinear_prepack", None) if X86 else None
_int8_product = getattr(torch.ops.onednn, "qlinear_pointwise", None) if X86 else None

_TINY = torch.finfo(torch.float32).tiny  # the scale of an all-zero row: any positive value quantizes it to zeros


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
    weights get the full [-127, 127]; found by a probe product, so it sees every cap (`ONEDNN_MAX_CPU_ISA`)."""
    return _levels() == 127


@functools.cache
def _levels() -> int | None:
    """127 where the kernel sums the worst-case products exactly, 63 where 127 would saturate, None where the
    kernel cannot run here."""
    if _prepack is None or _int8_product is None or not torch.backends.mkldnn.is_available():
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
    low = rows.amin(dim=-1, keepdim=True).clamp_(max=0)
    high = rows.amax(dim=-1, keepdim=True).clamp_(min=0)
    scale = ((high - low) / 255).clamp_(min=_TINY)
    zero_point = torch.round(-low / scale)
    # In place after the division: each pass over a large activation costs as much as the next. round(x / scale)
    # + zero_point can reach 255.5 before rounding: clamp, or 256 would wrap around to 0.
    values = rows.div(scale).round_().add_(zero_point).clamp_(0, 255).to(torch.uint8)
    return values, scale, zero_point


def int8_linear(input: Tensor, weight: Int8Weight) -> Tensor:
    """`F.linear(input, dequantize_weight(weight), weight.bias)` in int8, each row of `input` (fp32, shape
    (..., in_features)) quantized on the fly (`quantize_activation`); returns fp32 (..., out_features). Inference
    only: the kernel has no gradient."""
    return int8_linears(input, [weight])[0]


def int8_linears(input: Tensor, weights: Sequence[Int8Weight]) -> list[Tensor]:
    """`[int8_linear(input, weight) for weight in weights]`, with `input` quantized once for all of them: attention's
    query, key and value projections read the same hidden states."""
    in_features = {weight.in_features for weight in weights}
    if len(in_features) != 1:
        raise ValueError(f"the weights of one input must share in_features, not {sorted(in_features)}")
    (in_features,) = in_features
    if input.dtype != torch.float32 or input.device.type != "cpu":
        raise TypeError(f"int8_linear takes fp32 CPU input, not {input.dtype} on {input.device}")
    if input.shape[-1:] != (in_features,):
        raise ValueError(f"input's last dimension must be {in_features} (in_features): {list(input.shape)}")
    if torch.is_grad_enabled() and input.requires_grad:
        raise RuntimeError("int8_linear has no gradient: run it under torch.no_grad() or torch.inference_mode()")
    rows = input.reshape(-1, in_features)
    if rows.shape[0] == 0:
        return [input.new_empty(*input.shape[:-1], weight.out_features) for weight in weights]
    values, scale, zero_point = quantize_activation(rows)
    values = values.contiguous()
    return [
        _rescaled_product(values, scale, zero_point, weight).view(*input.shape[:-1], weight.out_features)
        for weight in weights
    ]


def _rescaled_product(values: Tensor, scale: Tensor, zero_point: Tensor, weight: Int8Weight) -> Tensor:
    output = _int8_product(
        values, 1.0, 0, weight.packed, weight.scales, weight._zero_points, None, 1.0, 0, torch.float32, "none", [], ""
    )
    output.addr_(zero_point.view(-1), weight.sums, alpha=-1)
    if weight.bias is None:
        return output.mul_(scale)
    return torch.addcmul(weight.bias, output, scale, out=output)  # in place: one pass over the output, not two
