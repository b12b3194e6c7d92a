"""`InferenceLinear`: an `nn.Linear` whose plain CPU inference calls run a faster form of its weight.

The form (packed blocks, int8 values) is a cache of the layer's `weight` parameter, which stays what it was: the same
Parameter object, its `requires_grad`, its values, its place in `parameters()` and `state_dict()`. A weight changed
since the form was built (an optimizer step, `load_state_dict`, `.to()`) gets a new form at the next inference call,
and every call that is not plain CPU inference (gradients asked for, torch.compile, tracing, autocast, a dtype or
device the form does not run) takes `F.linear` on the parameter, as `nn.Linear` does. The subclasses
(`packed.PackedLinear`, `int8.Int8Linear`) say which weights they support, how they build the form and run it.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class InferenceLinear(nn.Linear):
    _form: Any = None  # the weight in the kernel's form, or None
    _form_from: tuple | None = None  # `weight_key` of the parameters the form was built from

    # -- what a subclass defines ------------------------------------------------------------------------------
    @staticmethod
    def supports(weight: Tensor) -> bool:
        """Whether the kernel can run a product with `weight` here."""
        raise NotImplementedError

    def accepts(self, input: Tensor) -> bool:
        """Whether the kernel runs `input` (its dtype)."""
        raise NotImplementedError

    def build_form(self) -> Any:
        raise NotImplementedError

    def run(self, input: Tensor) -> Tensor:
        raise NotImplementedError

    # -- the swap ---------------------------------------------------------------------------------------------
    @classmethod
    def from_linear(cls, linear: nn.Linear, **attributes: Any) -> InferenceLinear:
        """A layer of this class holding `linear`'s own parameters (the same objects) and hooks, its form built now;
        `attributes` are set on it first."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.__dict__.update(module_state(linear))
        layer.__dict__.update(attributes)
        layer.rebuild()
        return layer

    def to_linear(self) -> nn.Linear:
        """The plain `nn.Linear` again, with the same parameters and hooks."""
        linear = nn.Linear.__new__(nn.Linear)
        linear.__dict__.update(module_state(self))
        return linear

    # -- the cache ------------------------------------------------------------------------------------------
    def rebuild(self) -> bool:
        """Build the form of the current weight (and let its file-backed pages go, see `release_resident_pages`);
        False where the kernel cannot run it here (then the layer runs `F.linear`)."""
        self._form, self._form_from = None, None
        if not self.supports(self.weight):
            return False
        self._form = self.build_form()
        self._form_from = self._key()
        release_resident_pages(self.weight)
        return True

    @property
    def is_current(self) -> bool:
        """Whether the next inference call runs the kernel on a form of the current parameters."""
        return self._form is not None and self._form_from == self._key()

    def _key(self) -> tuple:
        return weight_key(self.weight) + (() if self.bias is None else weight_key(self.bias))

    def _ready(self) -> bool:
        """The form of the current parameters is there, built again now if they changed since."""
        return self.is_current or (self._form_from != self._key() and self.rebuild())

    def forward(self, input: Tensor) -> Tensor:
        if self.accepts(input) and plain_inference_call(input, (self.weight, self.bias)) and self._ready():
            return self.run(input)
        return F.linear(input, self.weight, self.bias)

    def train(self, mode: bool = True) -> InferenceLinear:
        if mode:  # training runs F.linear and changes the weight: the form would only hold memory
            self._form, self._form_from = None, None
        return super().train(mode)

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be pickled or deep-copied: a copy builds its own form at its first call.
        return {**self.__dict__, "_form": None, "_form_from": None}


def module_state(module: nn.Module) -> dict[str, Any]:
    """A linear module's state for another class's instance: the same parameters and hooks (in new dicts), no
    inference form."""
    return {
        key: value.copy() if isinstance(value, dict) else value
        for key, value in module.__dict__.items()
        if key not in ("_form", "_form_from", "_shared")
    }


def plain_inference_call(input: Tensor, parameters: tuple[Tensor | None, ...]) -> bool:
    """Whether a oneDNN op (which has no backward and is invisible to autocast, compilers and tracers) may run."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    parameters = tuple(parameter for parameter in parameters if parameter is not None)
    return (
        # Plain tensors only: FakeTensor, fx Proxy, DTensor and other subclasses keep the standard op.
        type(input) is Tensor
        and input.device.type == "cpu"
        and all(type(parameter) in (Tensor, nn.Parameter) for parameter in parameters)
        # No backward: a gradient asked of the input or of any parameter (even the bias alone, as in BitFit)
        # takes F.linear.
        and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (input, *parameters)))
        # Autocast casts F.linear's inputs; it knows nothing of the oneDNN ops, which would silently stay fp32.
        and not torch.is_autocast_enabled("cpu")
    )


def weight_key(weight: Tensor) -> tuple:
    """What identifies the values a cache was made from: storage, in-place version, dtype and shape. A tensor made
    under `torch.inference_mode()` has no version counter; it cannot be changed in place outside inference mode,
    so its storage identifies it."""
    version = None if weight.is_inference() else weight._version
    return (weight.data_ptr(), version, weight.dtype, weight.device, tuple(weight.shape))


_MADV_PAGEOUT = 21  # linux/mman.h, Linux 5.4 and later


@functools.cache
def _libc_madvise() -> Any:
    import ctypes

    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def release_resident_pages(tensor: Tensor) -> None:
    """Ask Linux to drop `tensor`'s memory pages from RAM now (madvise MADV_PAGEOUT); the tensor stays valid.

    hfbert loads safetensors zero-copy: a loaded weight is pages of the memory-mapped file. Once packed, those pages
    are only read again if something reads the parameter itself (`state_dict()`, a training step), and then come
    back from the file: memory holds one copy of the weight instead of two. Changed pages (a weight trained in
    memory) go to swap or stay. A no-op off Linux, on older kernels or on any error: memory, never correctness."""
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
