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

import functools
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.cpu import X86, bfloat16_native
from hfbert.quantization import dequantize_weight, int8_available, int8_linear, int8_linears, quantize_weight

# A private op of torch, so look it up defensively: without it, F.linear everywhere. Only on x86, where it was
# measured (AVX-512, and AVX2 by capping oneDNN's and MKL's instruction sets: 0.93-1.28x); elsewhere (ARM) F.linear.
_inner_product = (
    getattr(torch.ops.mkldnn, "_linear_pointwise", None) if X86 and torch.backends.mkldnn.is_available() else None
)
# fp32 always; bf16 only where the CPU computes it natively (elsewhere oneDNN would emulate it slowly).
_ONEDNN_DTYPES = () if _inner_product is None else (torch.float32,) + ((torch.bfloat16,) if bfloat16_native() else ())
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
    return (
        _plain_inference_call(input, (weight,) if bias is None else (weight, bias))
        and (bias is None or bias.dtype == input.dtype)
        and (
            weight.numel() >= MIN_ONEDNN_WEIGHTS
            or input.numel() // max(weight.shape[-1], 1) * weight.numel() >= MIN_ONEDNN_MULTIPLY_ADDS
        )
    )


# -- weights packed once for inference ------------------------------------------------------------------------
# oneDNN re-lays out a plain weight on every call; packed once into its blocked layout, a 16-row product runs
# 2-3x faster (the weight is streamed, not copied). oneDNN sums the whole inner dimension in one register chain,
# which loses more bits than MKL's sgemm (transformers' kernel), which sums blocks of about 192 products and adds
# the blocks: measured per product 1.47x (K = 768) and 2.2x (K = 3072) MKL's RMS error against float64. So the
# packed weight is cut into column blocks of PACKED_BLOCK inputs, each block's product starts from zero and the
# partial products are added in order (oneDNN's fused "add" post-op), which brings the error to MKL's (1.00x).
PACKED_BLOCK = 192


def packing_available(weight: Tensor) -> bool:
    """Whether `weight` can be packed for oneDNN here: a plain 2-d CPU tensor, fp32 (or bf16 where the CPU computes
    it natively), on an x86 torch with oneDNN."""
    return (
        _inner_product is not None
        and torch.backends.mkldnn.enabled
        and type(weight) in (Tensor, nn.Parameter)
        and weight.device.type == "cpu"
        and weight.dtype in _ONEDNN_DTYPES
        and weight.dim() == 2
    )


def pack_weight(weight: Tensor) -> tuple[Tensor, ...]:
    """Cut `weight` (out x in) into blocks of PACKED_BLOCK input columns, each in oneDNN's blocked layout. bf16
    stays one block: its error is the rounding of its inputs, and oneDNN accumulates it in fp32 anyway."""
    block = PACKED_BLOCK if weight.dtype == torch.float32 else weight.shape[1]
    return tuple(_reorder(part.contiguous()) for part in weight.detach().split(block, dim=1))


def unpack_weight(blocks: tuple[Tensor, ...]) -> Tensor:
    """The plain weight back, bit for bit (packing only moves values)."""
    return torch.cat([block.to_dense() for block in blocks], dim=1)


# Many rows through few blocks: every block re-reads and rewrites the whole output, so tiles of TILE_ROWS rows keep
# it in cache (bert-base, 8 x 128 tokens: 604 ms instead of 657 ms; measured on AMD EPYC, AVX-512). With many
# blocks (the 3072-wide input of the feed-forward output) the extra calls cost more than the cache saves.
TILE_ROWS = 256
TILE_MAX_BLOCKS = 4


def packed_linear(input: Tensor, blocks: tuple[Tensor, ...], bias: Tensor | None) -> Tensor:
    """`F.linear(input, unpack_weight(blocks), bias)`, summed block by block (see PACKED_BLOCK)."""
    rows = input.reshape(-1, input.shape[-1])
    if rows.shape[0] > TILE_ROWS and len(blocks) <= TILE_MAX_BLOCKS:
        tiles = [_blockwise(rows[start : start + TILE_ROWS], blocks, bias) for start in range(0, len(rows), TILE_ROWS)]
        output = torch.cat(tiles)
    else:
        output = _blockwise(rows, blocks, bias)
    return output.view(*input.shape[:-1], output.shape[-1])


def _blockwise(rows: Tensor, blocks: tuple[Tensor, ...], bias: Tensor | None) -> Tensor:
    pieces = _column_blocks(rows, blocks)
    output = _inner_product(pieces[0], blocks[0], bias, "none", [], "")
    for piece, block in zip(pieces[1:], blocks[1:], strict=True):
        output = _inner_product_add(piece, output, block, None, "add")
    return output


def _column_blocks(rows: Tensor, blocks: tuple[Tensor, ...]) -> list[Tensor]:
    """`rows` cut into the blocks' input columns, each contiguous (oneDNN reads dense inputs only). The full blocks
    are gathered by one copy, not one per block: at 16 rows the per-op cost of 16 copies outweighs the copying."""
    if len(blocks) == 1:
        return [rows.contiguous()]
    full = rows.shape[1] // PACKED_BLOCK * PACKED_BLOCK
    pieces = list(rows[:, :full].unflatten(1, (-1, PACKED_BLOCK)).transpose(0, 1).contiguous().unbind(0))
    return pieces if full == rows.shape[1] else [*pieces, rows[:, full:].contiguous()]


_reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None) if _inner_product is not None else None
_inner_product_add = _inner_product.binary if _inner_product is not None else None


_MADV_PAGEOUT = 21  # linux/mman.h, Linux 5.4 and later


@functools.cache
def _libc_madvise() -> Any:
    import ctypes

    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def release_resident_pages(tensor: Tensor) -> None:
    """Ask Linux to drop `tensor`'s memory pages now (madvise MADV_PAGEOUT), before its last reference goes.

    hfbert loads safetensors zero-copy: the weights are pages of the memory-mapped file, and the mapping lives
    while any tensor of the file does (the embeddings). After packing, those pages would stay resident beside the
    packed copy: two copies in RSS. Paging out loses nothing (clean file pages are re-read if touched, changed ones
    stay or go to swap). A no-op off Linux, on older kernels or on any error: memory, never correctness."""
    if not sys.platform.startswith("linux") or tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    try:
        import mmap

        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        first_page = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the tensor only
        last_page = end // mmap.PAGESIZE * mmap.PAGESIZE
        if last_page > first_page:
            _libc_madvise()(first_page, last_page - first_page, _MADV_PAGEOUT)
    except (OSError, AttributeError):
        pass


class PackedWeightError(AttributeError):
    """Raised when code reaches for the weight of a layer whose weight is packed for inference."""


class Linear(nn.Linear):
    """`nn.Linear` whose CPU inference can run on oneDNN: with its weight packed once (`pack`, which
    `hfbert.optimize_for_inference` calls) or, unpacked, on the opt-in kernel of the module docstring.

    While packed, the packed blocks are the only copy of the weight: `state_dict()` (hence `save_pretrained`)
    unpacks it bit for bit, `load_state_dict` repacks, `train()` and `.to()` restore the plain parameter, and a
    forward that needs gradients, or runs under torch.compile, tracing or autocast, uses the unpacked weight.
    `layer.weight` itself raises `PackedWeightError` until `unpack()`, so nothing reads a stale copy.
    """

    packed_weight: tuple[Tensor, ...] | None = None
    int8_weight: Any = None  # hfbert.quantization.Int8Weight
    _weight_requires_grad = False

    @property
    def is_packed(self) -> bool:
        return self.packed_weight is not None

    @property
    def inference_form(self) -> str:
        """ "plain", "packed" (fp32, oneDNN's layout) or "int8"."""
        return "int8" if self.int8_weight is not None else "packed" if self.is_packed else "plain"

    def pack(self) -> bool:
        """Pack the weight for inference (see the class docstring); False where it cannot be packed here."""
        if self.is_packed:
            return True
        weight = self._parameters.get("weight")
        if weight is None or not packing_available(weight):
            return False
        self.packed_weight = pack_weight(weight)
        self._weight_requires_grad = weight.requires_grad
        release_resident_pages(weight)
        del self._parameters["weight"]  # the packed blocks are now the only copy
        return True

    def quantize_int8(self) -> bool:
        """Replace the weight by its int8 form for inference (`hfbert/quantization.py`); lossy, and it cannot be
        undone. False where int8 cannot run here."""
        if self.int8_weight is not None:
            return True
        self.unpack()
        weight = self._parameters.get("weight")
        if weight is None or not (int8_available() and packing_available(weight)):
            return False
        self.int8_weight = quantize_weight(weight.detach(), None if self.bias is None else self.bias.detach())
        del self._parameters["weight"]
        return True

    def unpack(self) -> None:
        """Restore the plain `weight` parameter, bit for bit."""
        if not self.is_packed:
            return
        weight = nn.Parameter(unpack_weight(self.packed_weight), requires_grad=self._weight_requires_grad)
        self.packed_weight = None
        self._parameters["weight"] = weight

    def __getattr__(self, name: str):
        if name == "weight" and self.__dict__.get("int8_weight") is not None:
            raise PackedWeightError("this Linear's weight was quantized to int8 for inference; the fp32 weight is gone")
        if name == "weight" and self.__dict__.get("packed_weight") is not None:
            raise PackedWeightError(
                "this Linear's weight is packed for inference (hfbert.optimize_for_inference); call .unpack() on "
                "the layer, or hfbert.restore_weights(model), or model.train(), to get the parameter back; "
                "state_dict() returns it unpacked"
            )
        return super().__getattr__(name)

    def forward(self, input: Tensor) -> Tensor:
        if self.int8_weight is not None:
            if _runs_packed(input, self.bias, torch.float32):
                return int8_linear(input, self.int8_weight)
            return F.linear(input, dequantize_weight(self.int8_weight).to(input.dtype), self.bias)
        if self.packed_weight is not None:
            if _runs_packed(input, self.bias, self.packed_weight[0].dtype):
                return packed_linear(input, self.packed_weight, self.bias)
            return F.linear(input, unpack_weight(self.packed_weight).to(input.dtype), self.bias)
        if uses_onednn(input, self.weight, self.bias):
            return _inner_product(input, self.weight, self.bias, "none", [], "")
        return F.linear(input, self.weight, self.bias)

    # The packed blocks stay invisible to torch's module machinery; these hooks keep what it does exact.
    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        if self.int8_weight is not None:
            raise PackedWeightError(
                f"{prefix}weight was quantized to int8 for inference and its fp32 values are gone: save the model "
                "before hfbert.optimize_for_inference(model, quantize='int8')"
            )
        if self.is_packed:
            destination[prefix + "weight"] = unpack_weight(self.packed_weight)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        was_packed = self.is_packed
        self.unpack()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if was_packed:
            self.pack()

    def _apply(self, fn, recurse=True):
        was_packed = self.is_packed
        self.unpack()
        result = super()._apply(fn, recurse)
        if was_packed:
            self.pack()  # a no-op move (.to("cpu"), .float()) keeps the packing; anything else cannot pack
        return result

    def train(self, mode: bool = True):
        if mode and self.int8_weight is not None:
            raise PackedWeightError("an int8-quantized model is for inference only: it cannot train")
        if mode:
            self.unpack()
        return super().train(mode)

    def __getstate__(self) -> dict:
        # oneDNN's blocked tensors cannot be pickled or deep-copied: carry the plain weight and repack on arrival.
        state = self.__dict__.copy()
        if self.is_packed:
            state["_parameters"] = {
                "weight": nn.Parameter(unpack_weight(self.packed_weight), requires_grad=self._weight_requires_grad),
                **self._parameters,
            }
            state["packed_weight"] = None
            state["_repack"] = True
        return state

    def __setstate__(self, state: dict) -> None:
        repack = state.pop("_repack", False)
        super().__setstate__(state)
        if repack:
            self.pack()


def linears_of_one_input(input: Tensor, layers: Sequence[Linear]) -> list[Tensor]:
    """`[layer(input) for layer in layers]`: attention's query, key and value projections of the same hidden states.
    Where all of them run int8, the input is quantized once for the three instead of once each (bert-base, 8 x 128
    tokens: 24 of the 73 quantizations of a forward), unless a hook watches a layer (this path would skip it)."""
    if all(_runs_int8_plainly(layer, input) for layer in layers):
        return int8_linears(input, [layer.int8_weight for layer in layers])
    return [layer(input) for layer in layers]


def _runs_int8_plainly(layer: nn.Module, input: Tensor) -> bool:
    return (
        isinstance(layer, Linear)
        and layer.int8_weight is not None
        and _runs_packed(input, layer.bias, torch.float32)
        and _called_plainly(layer)
    )


def _called_plainly(layer: nn.Module) -> bool:
    """Whether calling `layer` runs its forward and nothing else: no hook on it, nor on every module."""
    hooks = (layer._forward_pre_hooks, layer._forward_hooks, layer._backward_pre_hooks, layer._backward_hooks)
    global_hooks = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks")
    return not any(hooks) and not any(getattr(torch.nn.modules.module, name, None) for name in global_hooks)


def _runs_packed(input: Tensor, bias: Tensor | None, dtype: torch.dtype) -> bool:
    return (
        input.dtype == dtype
        and input.device.type == "cpu"
        and (bias is None or bias.dtype == dtype)
        and _plain_inference_call(input, () if bias is None else (bias,))
    )


def _plain_inference_call(input: Tensor, parameters: tuple[Tensor, ...]) -> bool:
    """Whether a oneDNN op (which has no backward and is invisible to autocast, compilers and tracers) may run."""
    return (
        # Plain tensors only: FakeTensor, fx Proxy, DTensor and other subclasses keep the standard op.
        type(input) is Tensor
        and all(type(parameter) in (Tensor, nn.Parameter) for parameter in parameters)
        # No backward: a gradient asked of the input or of any parameter (even the bias alone, as in BitFit)
        # takes F.linear.
        and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (input, *parameters)))
        # Autocast casts F.linear's inputs; it knows nothing of the oneDNN ops, which would silently stay fp32.
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    )
