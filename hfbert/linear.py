"""`nn.Linear`, with oneDNN's inner product as an opt-in kernel for CPU inference.

By default every hfbert `Linear` runs `F.linear`, the kernel of `nn.Linear` and transformers (MKL's sgemm on an
x86 CPU), so hfbert's fp32 error against exact (float64) arithmetic is transformers' own.

oneDNN's inner product (`torch.ops.mkldnn._linear_pointwise`, which torch.compile's CPU backend uses for fused
linear layers) runs BERT's weight shapes faster on x86 (1.1-1.6x at 16 rows, where sgemm streams the weights
poorly; `benchmarks/kernels.py`) but sums in an order that loses more bits: on the parity sentences its fp32
hidden states on bert-base-sized models are 1.7-2.4x (AVX-512) and 2.0-2.6x (AVX2) further from float64 than
transformers' (RMS), beyond the 1.5x that hfbert's numerical contract allows (`benchmarks/numerical_contract.py`).
So it is not the default on any instruction set; ask for it where speed matters more than the last bits:

    >>> import torch, hfbert
    >>> from hfbert.linear import onednn_linear
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)).eval()
    >>> with torch.no_grad(), onednn_linear():
    ...     out = model(input_ids=torch.tensor([[101, 102]]))

(or `set_linear_kernel("onednn")` for the whole process). The oneDNN kernel has no backward, so even when asked
for it runs only where no gradient can be asked for, and only on plain CPU tensors of a dtype it supports.
Everything else (training, gradients through the inputs, torch.compile, export, tracing, autocast, GPUs,
fp16/fp64, CPUs other than x86, `torch.backends.mkldnn.enabled = False`) takes `F.linear`.
The parameters are `nn.Linear`'s, so the state dict, `isinstance(module, nn.Linear)` and tools that wrap linear
layers (LoRA, quantizers) see no difference.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# A private op of torch, so look it up defensively: without it, F.linear everywhere. Only on x86, where it was
# measured (AVX-512, and AVX2 by capping oneDNN's and MKL's instruction sets: 0.93-1.28x); elsewhere (ARM) F.linear.
_x86 = platform.machine().lower() in ("x86_64", "amd64", "x64")
_inner_product = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None) if _x86 and torch.backends.mkldnn.is_available() else None
)
_bfloat16_native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()
# fp32 always; bf16 only where the CPU computes it natively (elsewhere oneDNN would emulate it slowly).
_ONEDNN_DTYPES = () if _inner_product is None else (torch.float32,) + ((torch.bfloat16,) if _bfloat16_native else ())
KERNELS = ("standard", "onednn")
_kernel = "standard"  # process-wide, like torch's own backend flags


def set_linear_kernel(name: str) -> None:
    """Process-wide (all threads): "standard" (`F.linear`, the default) or "onednn" (see the module docstring)."""
    global _kernel
    if name not in KERNELS:
        raise ValueError(f"linear kernel must be one of {', '.join(KERNELS)}, not {name!r}")
    _kernel = name


@contextmanager
def linear_kernel(name: str) -> Iterator[None]:
    """Run hfbert's linear layers on `name` inside the block, then restore the previous kernel."""
    previous = _kernel
    set_linear_kernel(name)
    try:
        yield
    finally:
        set_linear_kernel(previous)


def standard_linear() -> AbstractContextManager[None]:
    """Inside the block every hfbert `Linear` runs `F.linear`, the kernel of `nn.Linear` and transformers."""
    return linear_kernel("standard")


def onednn_linear() -> AbstractContextManager[None]:
    """Inside the block hfbert's CPU inference runs oneDNN's inner product where it applies (module docstring)."""
    return linear_kernel("onednn")


def onednn_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch build and CPU can run the oneDNN kernel in `dtype` (bf16 only where native)."""
    return dtype in _ONEDNN_DTYPES and torch.backends.mkldnn.enabled


def inference_kernel(device: torch.device | str, dtype: torch.dtype) -> str:
    """The kernel hfbert's linear layers run at inference on this device and dtype now: "oneDNN" or "F.linear"
    (small products, under the thresholds below, take F.linear either way)."""
    return "oneDNN" if _onednn_enabled(torch.device(device).type, dtype) else "F.linear"


def _onednn_enabled(device_type: str, dtype: torch.dtype) -> bool:
    return _kernel == "onednn" and device_type == "cpu" and onednn_available(dtype)


# oneDNN costs about 25 us more per call than F.linear, so small products stay on F.linear: measured crossovers
# (benchmarks/kernels.py) lie between 147K and 590K weights at one row, and between 2.4M and 19M multiply-adds.
MIN_ONEDNN_WEIGHTS = 2**19
MIN_ONEDNN_MULTIPLY_ADDS = 2**23


def uses_onednn(input: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """True when `Linear` runs this call on oneDNN's inner product instead of `F.linear`."""
    if not (_onednn_enabled(input.device.type, input.dtype) and weight.dtype == input.dtype):
        return False
    parameters = (weight,) if bias is None else (weight, bias)
    return (
        # Plain tensors only: FakeTensor, fx Proxy, DTensor and other subclasses keep the standard op.
        type(input) is Tensor
        and all(type(parameter) in (Tensor, nn.Parameter) for parameter in parameters)
        and (bias is None or bias.dtype == input.dtype)
        # The kernel has no backward: a gradient asked of the input or of any parameter (even the bias alone,
        # as in BitFit) takes F.linear.
        and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (input, *parameters)))
        # Autocast casts F.linear's inputs; it knows nothing of the oneDNN op, which would silently stay fp32.
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and (
            weight.numel() >= MIN_ONEDNN_WEIGHTS
            or input.numel() // max(weight.shape[-1], 1) * weight.numel() >= MIN_ONEDNN_MULTIPLY_ADDS
        )
    )


class Linear(nn.Linear):
    """`nn.Linear` whose CPU inference can run on oneDNN's inner product (see the module docstring)."""

    def forward(self, input: Tensor) -> Tensor:
        if uses_onednn(input, self.weight, self.bias):
            return _inner_product(input, self.weight, self.bias, "none", [], "")
        return F.linear(input, self.weight, self.bias)
