"""Swapped modules whose plain CPU inference calls run a faster form of their parameters: `CachedForm`, the cache
they share, and `InferenceLinear`, the `nn.Linear` built on it (`packed.PackedLinear`, `int8.Int8Linear`; the fused
blocks of `fused.py` build on `CachedForm` too).

The form (packed blocks, int8 values, a fused weight) is a cache of the module's parameters, which stay what they
were: the same Parameter objects, their `requires_grad`, their values, their place in `parameters()` and
`state_dict()`. Parameters changed since the form was built (an optimizer step, `load_state_dict`, `.to()`) get a new
form at the next inference call, and every call that is not plain CPU inference (gradients asked for, torch.compile,
tracing, autocast, a dtype or device the form does not run) takes the plain computation on the parameters, as the
model's own module does; only hfbert's own compiled path (`compiled.py`, inside `kernels_traced`) compiles the
kernels. The subclasses say which parameters they support, how they build the form and run it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CachedForm:
    """The cache behind every swapped module: a form of some of its parameters (`form_parameters()`), built by
    `build_form()`, used while those parameters keep the storage and in-place version it was built from, built
    again at the next inference call after they change, dropped by `train()`."""

    _form: Any = None  # the parameters in the kernel's form, or None
    _form_from: tuple | None = None  # `weight_key`s of the parameters the form was built from
    _keep_pages: bool = False  # the plain parameters are read again (some calls run F.linear): keep them in RAM

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        raise NotImplementedError

    def can_build(self) -> bool:
        """Whether the kernel can run the current parameters here."""
        raise NotImplementedError

    def build_form(self) -> Any:
        raise NotImplementedError

    def rebuild(self) -> bool:
        """Build the form of the current parameters (and let their file-backed pages go, see
        `release_resident_pages`); False where the kernel cannot run them here (then the plain computation runs)."""
        self._form, self._form_from = None, None
        if not self.can_build():
            return False
        self._form = self.build_form()
        self._form_from = self._key()
        if not self._keep_pages:
            for parameter in self.form_parameters():
                if parameter is not None:
                    release_resident_pages(parameter)
        return True

    @property
    def is_current(self) -> bool:
        """Whether the next inference call runs the kernel on a form of the current parameters."""
        return self._form is not None and self._form_from == self._key()

    def _key(self) -> tuple:
        return tuple(() if tensor is None else weight_key(tensor) for tensor in self.form_parameters())

    def _ready(self) -> bool:
        """The form of the current parameters is there, built again now if they changed since."""
        if torch.compiler.is_compiling():  # `kernels_traced`: the compiled path built every form before tracing
            return self._form is not None
        return self.is_current or (self._form_from != self._key() and self.rebuild())

    def train(self, mode: bool = True):
        if mode:  # training runs the plain computation and changes the weights: the form would only hold memory
            self._form, self._form_from = None, None
        return super().train(mode)

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be pickled or deep-copied: a copy builds its own form at its first call.
        return {**self.__dict__, "_form": None, "_form_from": None}


class InferenceLinear(CachedForm, nn.Linear):
    # -- what a subclass defines ------------------------------------------------------------------------------
    @staticmethod
    def supports(weight: Tensor) -> bool:
        """Whether the kernel can run a product with `weight` here."""
        raise NotImplementedError

    def accepts(self, input: Tensor) -> bool:
        """Whether the kernel runs `input` (its dtype)."""
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
    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return (self.weight, self.bias)

    def can_build(self) -> bool:
        return self.supports(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        if self.accepts(input) and plain_inference_call(input, (self.weight, self.bias)) and self._ready():
            return self.run(input)
        return F.linear(input, self.weight, self.bias)


def module_state(module: nn.Module) -> dict[str, Any]:
    """A linear module's state for another class's instance: the same parameters and hooks (in new dicts), no
    inference form."""
    return {
        key: value.copy() if isinstance(value, dict) else value
        for key, value in module.__dict__.items()
        if key not in ("_form", "_form_from", "_choice", "_keep_pages")
    }


_kernels_traced = False


@contextlib.contextmanager
def kernels_traced() -> Iterator[None]:
    """Inside, torch.compile traces the swapped modules' kernels instead of the plain computation: for the compiled
    path (`compiled.py`), which calls the compiler only for plain inference calls and builds every form first."""
    global _kernels_traced
    before, _kernels_traced = _kernels_traced, True
    try:
        yield
    finally:
        _kernels_traced = before


def plain_inference_call(input: Tensor, parameters: tuple[Tensor | None, ...]) -> bool:
    """Whether a oneDNN op (which has no backward and is invisible to autocast, compilers and tracers) may run."""
    if torch.compiler.is_compiling():
        return _kernels_traced
    if torch.jit.is_tracing():
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
