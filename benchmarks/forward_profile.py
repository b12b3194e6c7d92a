"""Where a forward's time goes: the share of the linear products against everything around them.

    python -m benchmarks.forward_profile          # from the repository root; about 3 minutes on 2 cores

bert-base's shape with random weights, torch's profiler over a few forwards of each hfbert mode (the plain model,
`optimize_for_inference(model, precision="high")`, `quantize="int8"`, and int8 with `compile=True`; the bf16 mode
and its compiled path where the CPU computes bf16 natively), at 1 x 16 tokens (batch-1 latency) and 8 x 128 (a dense
batch). At 1 x 16 each forward and its products are also put as multiples of the weight-streaming floor (the bytes
of the encoder's linear weights in the mode's dtype, over the read bandwidth measured here, as benchmarks/peers.py
does): a forward at the floor does nothing but read its weights once. The products are the ops that run a linear
layer (MKL's sgemm through `aten::addmm` / `aten::mm`, oneDNN's fp32 and bf16 `mkldnn::_linear_pointwise` and int8
`onednn::qlinear_pointwise`); the rest is attention, LayerNorm, GELU, int8's quantization and the tensor
bookkeeping. If the products dominate, fewer eager ops cannot make the forward much faster: only a faster product
can. The products' rate (their useful GFLOP/s: two per weight of the encoder's linear layers per token) is printed
beside torch.mm's best rate on 2048 x 2048 float32 matrices here, the CPU's practical fp32 peak. Prints the CPU, the
instruction set and the branch MKL's sgemm runs (`hfbert.platform.mkl`: on AMD CPUs without AVX-512,
`MKL_CBWR=AUTO`, set at `import hfbert`; `HFBERT_MKL_BRANCH=off python -m benchmarks.forward_profile` profiles MKL's
default branch)."""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

import hfbert
from benchmarks.peers import gemm_rate, read_bandwidth
from hfbert.inference.bf16 import bf16_available
from hfbert.platform.cpu import cpu_name, instruction_set
from hfbert.platform.mkl import mkl_branch

PRODUCTS = ("aten::addmm", "aten::mm", "mkldnn::_linear_pointwise", "onednn::qlinear_pointwise")
# Bytes per weight each mode's products read.
WEIGHT_BYTES = {"plain": 4, "fast": 4, "int8": 1, "int8 compiled": 1, "fast compiled": 4, "bf16": 2, "bf16 compiled": 2}
MODES = {
    "plain": {},
    "fast": {"precision": "high"},
    "int8": {"quantize": "int8"},
    "int8 compiled": {"quantize": "int8", "compile": True},  # each shape compiled at its first warm-up forward
    # The compiled fast mode run at every shape (not timed against eager first): what is left around its products.
    "fast compiled": {"precision": "high", "compile": True, "kernels": "always"},
    "bf16": {"precision": "bf16"},
    # Each shape compiled at its first warm-up forward, and timed against the eager bf16 forward (the faster runs).
    "bf16 compiled": {"precision": "bf16", "compile": True},
}
SHAPES = ((1, 16, 20), (8, 128, 3))  # batch, tokens, profiled forwards


def main() -> int:
    torch.manual_seed(0)
    print(f"Machine: {cpu_name()}; instruction set {instruction_set()}; {torch.get_num_threads()} threads.")
    print(f"MKL: {mkl_branch()}.")
    peak = gemm_rate()["gflops"]
    bandwidth = read_bandwidth()
    print(f"torch.mm 2048^3 float32: {peak:.0f} GFLOP/s. Read bandwidth: {bandwidth / 1e9:.1f} GB/s.\n")
    print("| mode | tokens | ms per forward | products | share | products' GFLOP/s | x floor: forward, products |")
    print("|---|---|---|---|---|---|---|")
    for mode, options in MODES.items():
        if mode.startswith("bf16") and not bf16_available():
            print(f"| {mode} | skipped: this CPU does not compute bf16 natively | | | | | |")
            continue
        model = hfbert.BertModel(hfbert.BertConfig()).eval()
        weights = sum(m.weight.numel() for m in model.encoder.modules() if isinstance(m, torch.nn.Linear))
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
            seconds = products / forwards / 1e6
            rate = 2 * weights * batch * tokens / seconds / 1e9
            floor = weights * WEIGHT_BYTES[mode] / bandwidth
            floors = f"{per_forward / floor:.1f}x, {seconds / floor:.1f}x" if batch == 1 else ""
            print(
                f"| {mode} | {batch} x {tokens} | {per_forward * 1e3:.1f} | {seconds * 1e3:.1f} ms "
                f"| {products / total:.0%} | {rate:.0f} ({rate / peak:.0%} of torch.mm's) | {floors} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
