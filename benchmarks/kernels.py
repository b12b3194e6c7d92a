"""The kernel choices behind hfbert's CPU speed, measured: the linear kernels (F.linear, oneDNN on plain or packed
weights, hfbert's packed blocks, int8) and why bf16 attention stays on the flash kernel.

    python -m benchmarks.kernels [--repeats N]      # from the repository root

1. Linear layers. bert-base's weight shapes, as many copies as make ~200 MB (so, as in a real forward, the
   weights stream from memory instead of sitting in cache), at 16 rows (batch-1 latency) and 1,024 rows (a dense
   8 x 128 batch): `F.linear` (MKL sgemm, what transformers and hfbert's plain model run), oneDNN's inner product
   (`torch.ops.mkldnn._linear_pointwise`, called directly) on the plain weight and on the weight packed once for
   the whole input width (what ONNX-exporting engines and torch.compile's freezing run), and packed in hfbert's
   blocks (what `hfbert.optimize_for_inference` runs); GFLOP/s and max abs error against float64. Then the time
   the whole bert-base encoder's linear layers take at each kernel's rates, for 8 x 128 and for 1 x 16 tokens: a
   floor for any forward built on that kernel.
2. Small products, one weight held in cache: the time of one call of each kernel, which shows oneDNN's fixed
   cost per call, and why small layers stay `nn.Linear` (hfbert.inference.packed.MIN_PACKED_WEIGHTS).
3. bf16 attention, 8 x 12 heads x 128 x 64: the CPU flash kernel (`scaled_dot_product_attention`, what both
   libraries run) against plain bf16 matmul + softmax, which rounds the scores to bf16; time and error against
   float64.
4. int8 (`hfbert/inference/int8.py`): one product with its activations' quantization, against the packed fp32
   product, on Gaussian inputs with 4 outlier dimensions 20x larger; error: RMS against float64, relative to the
   output's RMS.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import hfbert.inference.int8
import hfbert.inference.packed
from hfbert.platform.cpu import cpu_name, instruction_set

BERT_BASE_SHAPES = {"query/key/value/attention output": (768, 768), "intermediate": (3072, 768), "output": (768, 3072)}


def median_seconds(function: Callable[[], object], repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def onednn_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


def apply_all(kernels: list[Callable], inputs: torch.Tensor) -> None:
    for kernel in kernels:
        kernel(inputs)


def linear_kernels() -> dict[str, Callable[[torch.Tensor, torch.Tensor], Callable]]:
    """name -> (weight, bias) -> the function `inputs -> output` that kernel runs, its weight prepared once."""
    kernels = {"F.linear": lambda weight, bias: functools.partial(_call, F.linear, weight, bias)}
    if hfbert.inference.packed.packing_supported():
        kernels["oneDNN"] = lambda weight, bias: functools.partial(_call, onednn_linear, weight, bias)
        kernels["oneDNN packed, whole width"] = lambda weight, bias: functools.partial(
            _call, onednn_linear, torch.ops.mkldnn._reorder_linear_weight(weight), bias
        )
        kernels[f"hfbert packed, blocks of {hfbert.inference.packed.PACKED_BLOCK}"] = lambda weight, bias: (
            functools.partial(_call_packed, hfbert.inference.packed.pack_weight(weight), bias)
        )
    return kernels


def _call(kernel: Callable, weight: torch.Tensor, bias: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return kernel(inputs, weight, bias)


def _call_packed(blocks: tuple[torch.Tensor, ...], bias: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return hfbert.inference.packed.packed_linear(inputs, blocks, bias)


def linear_rows(repeats: int) -> None:
    kernels = linear_kernels()
    print(f"| weight (out x in) | rows | {' | '.join(f'{name} GFLOP/s' for name in kernels)} | "
          f"{' | '.join(f'{name} error' for name in kernels)} |")  # fmt: skip
    print("|---|---|" + "---|" * 2 * len(kernels))
    generator = torch.Generator().manual_seed(0)
    product_seconds: dict[str, dict[tuple[str, int], float]] = {kernel_name: {} for kernel_name in kernels}
    for name, (out_features, in_features) in BERT_BASE_SHAPES.items():
        copies = max(4, 200_000_000 // (out_features * in_features * 4))
        weights = [
            (
                torch.randn(out_features, in_features, generator=generator) * 0.02,
                torch.randn(out_features, generator=generator) * 0.02,
            )
            for _ in range(copies)
        ]
        for rows in (16, 1024):
            inputs = torch.randn(rows, in_features, generator=generator)
            flops = 2 * rows * out_features * in_features * copies
            weight, bias = weights[0]
            exact = F.linear(inputs.double(), weight.double(), bias.double())
            speeds, errors = [], []
            for kernel_name, prepare in kernels.items():
                prepared = [prepare(weight, bias) for weight, bias in weights]
                seconds = median_seconds(functools.partial(apply_all, prepared, inputs), repeats)
                product_seconds[kernel_name][name, rows] = seconds / copies
                speeds.append(f"{flops / seconds / 1e9:.0f}")
                errors.append(f"{(prepared[0](inputs) - exact).abs().max().item():.1e}")
                del prepared
            print(f"| {name} {out_features} x {in_features} | {rows} | {' | '.join(speeds)} | {' | '.join(errors)} |")
    # The whole encoder's products at these rates: what any forward built on that kernel cannot beat.
    print("\nbert-base's 12 encoder layers' linear layers (174 GFLOP for 8 x 128 tokens) at the rates above:")
    for kernel_name, seconds in product_seconds.items():
        dense, single = encoder_seconds(seconds, 1024), encoder_seconds(seconds, 16)
        print(f"  {kernel_name}: {dense * 1e3:.0f} ms for 8 x 128 tokens, {single * 1e3:.1f} ms for 1 x 16")


LAYER_PRODUCTS = {"query/key/value/attention output": 4, "intermediate": 1, "output": 1}  # per encoder layer


def encoder_seconds(product_seconds: dict[tuple[str, int], float], rows: int, layers: int = 12) -> float:
    """bert-base's encoder linear layers on `rows` tokens, from one product's time per (weight shape, rows)."""
    return layers * sum(count * product_seconds[name, rows] for name, count in LAYER_PRODUCTS.items())


def small_product_rows(repeats: int) -> None:
    print("\n| weight (out x in) | rows | multiply-adds | F.linear us | oneDNN us | faster |")
    print("|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in ((128, 128), (384, 384), (1536, 384), (768, 768)):
        weight = torch.randn(out_features, in_features, generator=generator)
        bias = torch.randn(out_features, generator=generator)
        for rows in (1, 16, 128):
            inputs = torch.randn(rows, in_features, generator=generator)
            standard = median_seconds(functools.partial(F.linear, inputs, weight, bias), 100 * repeats) * 1e6
            onednn = median_seconds(functools.partial(onednn_linear, inputs, weight, bias), 100 * repeats) * 1e6
            print(
                f"| {out_features} x {in_features} | {rows} | {rows * weight.numel():,} | {standard:.1f} | "
                f"{onednn:.1f} | {'oneDNN' if onednn < standard else 'F.linear'} |"
            )


def attention_rows(repeats: int) -> None:
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(8, 12, 128, 64, generator=generator).bfloat16() for _ in range(3))
    exact = F.scaled_dot_product_attention(query.double(), key.double(), value.double())

    def flash() -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value)

    def bf16_scores() -> torch.Tensor:
        scores = torch.matmul(query, key.transpose(-1, -2)) * 64**-0.5
        return torch.matmul(scores.softmax(-1), value)

    print("\n| bf16 attention, 8 x 12 x 128 x 64 | ms | max abs error | mean abs error |")
    print("|---|---|---|---|")
    for name, function in (("flash kernel (sdpa)", flash), ("matmul + softmax on bf16 scores", bf16_scores)):
        error = (function().double() - exact).abs()
        milliseconds = median_seconds(function, repeats) * 1e3
        print(f"| {name} | {milliseconds:.2f} | {error.max().item():.1e} | {error.mean().item():.1e} |")


def int8_rows(repeats: int) -> None:
    """hfbert's int8 product (activations quantized per token at every call) against its packed fp32 one."""
    if not (hfbert.inference.int8.int8_available() and hfbert.inference.packed.packing_supported()):
        print("\nint8: not available on this CPU or torch build")
        return
    print("\n| int8, weight (out x in) | rows | int8 ms (with quantization) | packed fp32 ms | speed-up | int8 error |")
    print("|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    seconds: dict[tuple[str, int], float] = {}
    for name, (out_features, in_features) in BERT_BASE_SHAPES.items():
        weight = torch.randn(out_features, in_features, generator=generator) * 0.02
        bias = torch.randn(out_features, generator=generator) * 0.02
        quantized = hfbert.inference.int8.quantize_weight(weight, bias)
        blocks = hfbert.inference.packed.pack_weight(weight)
        for rows in (16, 1024):
            inputs = torch.randn(rows, in_features, generator=generator)
            inputs[:, :4] *= 20  # outlier dimensions, as BERT's hidden states have
            int8 = median_seconds(functools.partial(hfbert.inference.int8.int8_linear, inputs, quantized), repeats)
            fp32 = median_seconds(
                functools.partial(hfbert.inference.packed.packed_linear, inputs, blocks, bias), repeats
            )
            exact = F.linear(inputs.double(), weight.double(), bias.double())
            error = hfbert.inference.int8.int8_linear(inputs, quantized).double() - exact
            relative = (error.square().mean() / exact.square().mean()).sqrt().item()
            print(
                f"| {name} {out_features} x {in_features} | {rows} | {int8 * 1e3:.3f} | {fp32 * 1e3:.3f} | "
                f"{fp32 / int8:.2f}x | {100 * relative:.1f}% RMS |"
            )
            seconds[name, rows] = int8
    dense, single = encoder_seconds(seconds, 1024), encoder_seconds(seconds, 16)
    print(f"\nbert-base's 12 encoder layers' linear layers in int8: {dense * 1e3:.0f} ms for 8 x 128 tokens, "
          f"{single * 1e3:.1f} ms for 1 x 16 (each product quantizing its own input)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per kernel (median reported)")
    args = parser.parse_args()
    print(f"{cpu_name()}, {instruction_set()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        linear_rows(args.repeats)
        small_product_rows(args.repeats)
        attention_rows(args.repeats)
        int8_rows(args.repeats)


if __name__ == "__main__":
    main()
