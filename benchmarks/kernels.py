"""The kernel choices behind hfbert's CPU speed, measured: why linear layers run oneDNN, why bf16 attention stays
on the flash kernel.

    python benchmarks/kernels.py [--repeats N]

1. Linear layers. bert-base's four weight shapes, as many copies as make ~200 MB (so, as in a real forward, the
   weights stream from memory instead of sitting in cache), at 16 rows (batch-1 latency) and 1,024 rows (a dense
   8 x 128 batch): `F.linear` (MKL sgemm, what transformers runs) against oneDNN's inner product (what
   hfbert.linear.Linear runs), GFLOP/s and max abs error against float64.
2. Small products, one weight held in cache: the time of one call of each kernel, which shows oneDNN's fixed
   cost per call and where hfbert.linear's thresholds (MIN_ONEDNN_WEIGHTS, MIN_ONEDNN_MULTIPLY_ADDS) come from.
3. bf16 attention, 8 x 12 heads x 128 x 64: the CPU flash kernel (`scaled_dot_product_attention`, what both
   libraries run) against plain bf16 matmul + softmax, which rounds the scores to bf16; time and error against
   float64.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

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


def apply_all(kernel: Callable, inputs: torch.Tensor, weights: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for weight, bias in weights:
        kernel(inputs, weight, bias)


def linear_rows(repeats: int) -> None:
    print("| weight (out x in) | rows | F.linear GFLOP/s | oneDNN GFLOP/s | speed-up | F.linear error | oneDNN error |")
    print("|---|---|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
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

            standard_seconds = median_seconds(functools.partial(apply_all, F.linear, inputs, weights), repeats)
            onednn_seconds = median_seconds(functools.partial(apply_all, onednn_linear, inputs, weights), repeats)
            weight, bias = weights[0]
            exact = F.linear(inputs.double(), weight.double(), bias.double())
            standard_error = (F.linear(inputs, weight, bias) - exact).abs().max().item()
            onednn_error = (onednn_linear(inputs, weight, bias) - exact).abs().max().item()
            print(
                f"| {name} {out_features} x {in_features} | {rows} | {flops / standard_seconds / 1e9:.0f} | "
                f"{flops / onednn_seconds / 1e9:.0f} | {standard_seconds / onednn_seconds:.2f}x | "
                f"{standard_error:.1e} | {onednn_error:.1e} |"
            )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per kernel (median reported)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        linear_rows(args.repeats)
        small_product_rows(args.repeats)
        attention_rows(args.repeats)


if __name__ == "__main__":
    main()
