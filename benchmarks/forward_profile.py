"""Where a forward's time goes: the share of the linear products against everything around them.

    python -m benchmarks.forward_profile          # from the repository root; about 3 minutes on 2 cores

bert-base's shape with random weights, torch's profiler over a few forwards of each hfbert mode (the plain model,
`optimize_for_inference(model, precision="high")`, `quantize="int8"`, and int8 with `compile=True`; the fast mode
with `compile="aot"`; the bf16 mode, its compiled path and its aot path where the CPU computes bf16 natively), at
1 x 16 tokens (batch-1 latency) and 8 x 128 (a dense batch). At 1 x 16 each forward and its products are also put
as multiples of the weight-streaming floor (the bytes
of the encoder's linear weights in the mode's dtype, over the read bandwidth measured here, as benchmarks/peers.py
does): a forward at the floor does nothing but read its weights once. The products are the ops that run a linear
layer (MKL's sgemm through `aten::addmm` / `aten::mm`, oneDNN's fp32 and bf16 `mkldnn::_linear_pointwise` and int8
`onednn::qlinear_pointwise`); the rest is attention, LayerNorm, GELU, int8's quantization and the tensor
bookkeeping. If the products dominate, fewer eager ops cannot make the forward much faster: only a faster product
can. The products' rate (their useful GFLOP/s: two per weight of the encoder's linear layers per token) is printed
beside torch.mm's best rate on 2048 x 2048 float32 matrices here, the CPU's practical fp32 peak. Prints the CPU, the
instruction set and the branch MKL's sgemm runs (`hfbert.platform.mkl`: on AMD CPUs without AVX-512,
`MKL_CBWR=AUTO`, set at `import hfbert`; `HFBERT_MKL_BRANCH=off python -m benchmarks.forward_profile` profiles MKL's
default branch).

The attention column is torch's fused attention kernel alone (`aten::_scaled_dot_product_flash_attention_for_cpu`).
The last rows are OpenVINO at its default precision (bf16 on CPUs with native bf16), where it is installed (the
deploy extra), on transformers' BertModel of the same shape exported to ONNX (benchmarks/artifacts.py, as
benchmarks/peers.py runs it): its forward timed with profiling off, then its own profiler (PERF_COUNT) for its
products (its FullyConnected nodes) and its attention (its fused Subgraph nodes, one per layer), so that each part
of hfbert's forward can be put beside the engine's."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import hfbert
from benchmarks.artifacts import export_onnx
from benchmarks.benchmark import make_checkpoint
from benchmarks.peer_measurement import encoder_weight_bytes, gemm_rate, read_bandwidth
from hfbert.inference.bf16 import bf16_available
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch

PRODUCTS = ("aten::addmm", "aten::mm", "mkldnn::_linear_pointwise", "onednn::qlinear_pointwise")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu",)
OPENVINO_PRODUCTS, OPENVINO_ATTENTION = "FullyConnected", "Subgraph"
# Bytes per weight each mode's products read.
WEIGHT_BYTES = {
    "plain": 4,
    "fast": 4,
    "int8": 1,
    "int8 compiled": 1,
    "fast compiled": 4,
    "fast aot": 4,
    "bf16": 2,
    "bf16 compiled": 2,
    "bf16 aot": 2,
}
MODES = {
    "plain": {},
    "fast": {"precision": "high"},
    "int8": {"quantize": "int8"},
    "int8 compiled": {"quantize": "int8", "compile": True},  # each shape compiled at its first warm-up forward
    # The compiled fast mode run at every shape (not timed against eager first): what is left around its products.
    "fast compiled": {"precision": "high", "compile": True, "kernels": "always"},
    # The forward compiled ahead of time (hfbert/inference/aot.py): one C++ call, whose ops torch's profiler does not
    # see (its products column is empty); its package compiled at the first warm-up forward, or loaded from disk.
    "fast aot": {"precision": "high", "compile": "aot"},
    "bf16": {"precision": "bf16"},
    # Each shape compiled at its first warm-up forward, and timed against the eager bf16 forward (the faster runs).
    "bf16 compiled": {"precision": "bf16", "compile": True},
    "bf16 aot": {"precision": "bf16", "compile": "aot"},
}
SHAPES = ((1, 16, 20), (8, 128, 3))  # batch, tokens, profiled forwards


def main() -> int:
    torch.manual_seed(0)
    print(f"Machine: {cpu_name()}; instruction set {instruction_set()}; {torch.get_num_threads()} threads.")
    print(f"MKL: {mkl_branch()}.")
    peak = gemm_rate()["gflops"]
    bandwidth = read_bandwidth()
    print(f"torch.mm 2048^3 float32: {peak:.0f} GFLOP/s. Read bandwidth: {bandwidth / 1e9:.1f} GB/s.\n")
    print(
        "| mode | tokens | ms per forward | products | share | products' GFLOP/s | x floor: forward, products "
        "| attention |"
    )
    print("|---|---|---|---|---|---|---|---|")
    weights = encoder_weight_bytes(hfbert.BertConfig(), 1)  # the encoder's linear weights, what batch 1 streams
    for mode, options in MODES.items():
        if mode.startswith("bf16") and not bf16_available():
            print(f"| {mode} | skipped: this CPU does not compute bf16 natively | | | | | | |")
            continue
        model = hfbert.BertModel(hfbert.BertConfig()).eval()
        if options:
            hfbert.optimize_for_inference(model, **options)
        for batch, tokens, forwards in SHAPES:
            ids = torch.randint(1000, 20000, (batch, tokens))
            with torch.inference_mode():
                for _ in range(3):
                    model(input_ids=ids)
                started = time.perf_counter()
                for _ in range(forwards):
                    model(input_ids=ids)
                per_forward = (time.perf_counter() - started) / forwards
                with profile(activities=[ProfilerActivity.CPU]) as profiled:
                    for _ in range(forwards):
                        model(input_ids=ids)
            events = profiled.key_averages()
            total = sum(event.self_cpu_time_total for event in events)
            products = sum(event.self_cpu_time_total for event in events if event.key in PRODUCTS)
            attention = sum(event.self_cpu_time_total for event in events if event.key in ATTENTION)
            share, floor = products / total, weights * WEIGHT_BYTES[mode] / bandwidth
            products, attention = products / forwards / 1e6, attention / forwards / 1e6
            print(line(mode, batch, tokens, per_forward, products, share, attention, floor, peak, weights))
    openvino_rows(bandwidth, peak, weights)
    return 0


def line(
    mode: str,
    batch: int,
    tokens: int,
    per_forward: float,
    products: float,
    share: float,
    attention: float,
    floor: float,
    peak: float,
    weights: int,
) -> str:
    """One table row; times in seconds per forward, `floor` the weight-streaming time. No products seen (an aot
    forward, one C++ call): only the forward's time."""
    if products == 0:
        floors = f"{per_forward / floor:.1f}x, -" if batch == 1 else ""
        return f"| {mode} | {batch} x {tokens} | {per_forward * 1e3:.1f} | inside the package | | | {floors} | |"
    rate = 2 * weights * batch * tokens / products / 1e9
    floors = f"{per_forward / floor:.1f}x, {products / floor:.1f}x" if batch == 1 else ""
    return (
        f"| {mode} | {batch} x {tokens} | {per_forward * 1e3:.1f} | {products * 1e3:.1f} ms | {share:.0%} "
        f"| {rate:.0f} ({rate / peak:.0%} of torch.mm's) | {floors} | {attention * 1e3:.2f} ms |"
    )


def openvino_rows(bandwidth: float, peak: float, weights: int) -> None:
    """OpenVINO at its default precision on the same shapes (module docstring)."""
    try:
        import openvino
    except ImportError:
        print("| OpenVINO | skipped: openvino is not installed (`pip install -e .[deploy]`) | | | | | | |")
        return
    threads = torch.get_num_threads()
    settings = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    with tempfile.TemporaryDirectory() as directory:
        onnx = export_onnx(make_checkpoint(Path(directory) / "bert-base-random"), Path(directory) / "bert.onnx")
        core = openvino.Core()
        model = core.read_model(str(onnx))
    for batch, tokens, forwards in SHAPES:
        ids = torch.randint(1000, 20000, (batch, tokens))
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        feed = {name: inputs[name].numpy() for name in (port.get_any_name() for port in model.inputs)}
        times, parts = [], Counter()
        # One compiled model at a time, each shape its own: with two held at once, or shapes run one after another,
        # its profiler counted a fraction of the pass.
        for profiling in (False, True):
            compiled = core.compile_model(model, "CPU", {**settings, "PERF_COUNT": profiling})
            precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
            request = compiled.create_infer_request()
            for _ in range(3):
                request.infer(feed)
            for _ in range(forwards):
                started = time.perf_counter()
                request.infer(feed)
                if not profiling:
                    times.append(time.perf_counter() - started)
                else:
                    for node in request.profiling_info:
                        parts[node.node_type] += node.real_time.total_seconds() / forwards
            del request, compiled
        products, per_forward = parts[OPENVINO_PRODUCTS], statistics.median(times)
        mode, floor = f"OpenVINO ({precision}, its default)", weights * (2 if precision == "bf16" else 4) / bandwidth
        share, attention = products / sum(parts.values()), parts[OPENVINO_ATTENTION]
        print(line(mode, batch, tokens, per_forward, products, share, attention, floor, peak, weights))


if __name__ == "__main__":
    raise SystemExit(main())
