"""The one swap protocol of the inference floor, and the one gate that decides, call by call, "kernel or plain".

A swapped module (`Swapped`) is one of the model's own modules (an `nn.Linear`, or a block of `fused.py`) put in
another class that can run a faster form of its parameters (packed blocks, int8 values, a fused weight) through a
kernel. The swap:

- keeps the same Parameter objects, child modules and hooks (`swap_state`): their `requires_grad`, their values,
  their place in `parameters()` and `state_dict()` stay what they were;
- builds every new module before any is put in place (`swap_in`, then the caller's setattr), so that a failure
  changes nothing, and `swap_out` gives the model's own class back;
- holds the form as a cache: built from the current parameters, built again at the next call that runs the kernel
  after they change (see below), dropped by `train()`.

The gate (`Swapped.kernel_way`) asks, in this order: is the module training; is the input a plain CPU tensor of a
dtype the kernel runs; do modules whose own calls the kernel would replace carry hooks or wrappers (PEFT's LoRA
around a projection); is the call traced (torch.compile, jit, fx), asks gradients or runs under autocast; which
computation was measured fastest for these rows (`measured.py`); is the form of the current parameters ready.
Only then does the kernel run; every other call is the model's own computation on its own parameters. Each kernel
module only says how it builds its form and whether it can (`form_parameters`, `can_build`, `build_form`).

When the parameters change, the form follows:

- in place through PyTorch (an optimizer step, `copy_` under `torch.no_grad()`): the version counter changes
  (`weight_key`);
- replaced (`load_state_dict(assign=True)`, `.to()`, `.float()`): the storage changes, and `_apply` marks the form
  stale;
- `load_state_dict` on the model or any module holding a swapped one, inference tensors included (which have no
  version counter): `_load_from_state_dict` marks the form stale;
- `.data` writes, which no counter sees: `hfbert.inference.refresh(model)` marks every form stale.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.inference.measured import bucket

# What a swapped module holds beyond its plain class's state: never carried across a swap.
_SWAP_ATTRIBUTES = ("_form", "_form_from", "_stale", "_trace_kernels", "_choice", "_keep_pages", "kernel")


@dataclass(frozen=True)
class Kernel:
    """A faster computation of a linear product `rows @ weight.T + bias`, as a value a swapped module takes
    (`packed.BLOCKED`, `packed.WHOLE`, `int8.INT8`): the module builds the form once and runs it at each call."""

    name: str  # what `packed_layers` reports for a module running it
    supports: Callable[[Tensor], bool]  # whether it can run a product with this weight here
    accepts: Callable[[Tensor, Tensor], bool]  # whether it runs this input (its dtype) with this weight
    build: Callable[[Tensor, Tensor | None], Any]  # (weight, bias) -> the form
    run: Callable[[Tensor, Any], Tensor]  # (rows, form) -> rows @ weight.T + bias


def swap_state(module: nn.Module) -> dict[str, Any]:
    """`module`'s state for an instance of another class: the same parameters, child modules and hooks (in new
    dicts, so that the two instances do not share later changes), nothing of a swapped module's form."""
    return {
        key: value.copy() if isinstance(value, dict) else value
        for key, value in module.__dict__.items()
        if key not in _SWAP_ATTRIBUTES
    }


class Swapped:
    """What every swapped module shares (module docstring): the swap in and out, the form, and the gate. A subclass
    puts this class before the model's own class (`plain_class`) and says which parameters its form is made of and
    how it is built; `kernel` is the product it runs them with."""

    plain_class: type[nn.Module]
    kernel: Kernel
    _form: Any = None  # the parameters in the kernel's form, or None
    _form_from: tuple | None = None  # `weight_key`s of the parameters the form (or the refusal to build it) is from
    _stale: bool = False  # changed where no key shows it (`load_state_dict`, `refresh`): build again at next call
    _trace_kernels: bool = False  # set for the compiled path's own calls only (`compiled.py`): trace the kernel
    _choice: tuple[int, ...] = (1, 1, 1)  # per `measured.ROW_BUCKETS`: 0 runs the plain computation, others a kernel
    _keep_pages: bool = False  # some row counts read the plain parameters: keep them in RAM
    # Whether training mode changes the module's own computation (a block's dropout): then training runs it plain.
    # A linear layer computes the same in training; the gradients a training step asks for are the tracing rule's.
    differs_in_training: bool = True

    # -- the swap ---------------------------------------------------------------------------------------------
    @classmethod
    def swap_in(cls, module: nn.Module, **attributes: Any) -> Swapped:
        """An instance of this class holding `module`'s own parameters, children and hooks (not yet in the model:
        the caller puts it in place once every new module is built), `attributes` set, its form built now."""
        swapped = cls.__new__(cls)
        swapped.__dict__.update(swap_state(module))
        swapped.__dict__.update(attributes)
        swapped._keep_pages = 0 in swapped._choice
        if any(swapped._choice):
            swapped.rebuild()
        return swapped

    def swap_out(self) -> nn.Module:
        """The model's own class again, with the same parameters, children and hooks."""
        plain = self.plain_class.__new__(self.plain_class)
        plain.__dict__.update(swap_state(self))
        return plain

    # -- what a subclass says -----------------------------------------------------------------------------------
    def form_parameters(self) -> tuple[Tensor | None, ...]:
        """The parameters the form is made of (None for a missing bias)."""
        raise NotImplementedError

    def build_form(self) -> Any:
        raise NotImplementedError

    def inner_modules(self) -> tuple[nn.Module, ...]:
        """The modules whose own calls the kernel replaces (a fused block's projections): none for a linear layer."""
        return ()

    def can_build(self) -> bool:
        """Whether the kernel can run the current parameters here: plain CPU tensors of one dtype it supports."""
        parameters = [parameter for parameter in self.form_parameters() if parameter is not None]
        return all(
            type(parameter) in (Tensor, nn.Parameter)
            and parameter.device.type == "cpu"
            and parameter.dtype == parameters[0].dtype
            for parameter in parameters
        ) and all(self.kernel.supports(parameter) for parameter in parameters if parameter.dim() == 2)

    def runs_kernel(self) -> bool:
        """Whether some inference calls run the kernel on the current parameters (the modules it computes are still
        plain `nn.Linear` layers, and it can build their form here)."""
        return all(type(module) is nn.Linear for module in self.inner_modules()) and self.can_build()

    # -- the gate -----------------------------------------------------------------------------------------------
    def kernel_way(self, input: Tensor) -> int:
        """Which computation this call runs: 0 (the plain one) unless every rule lets a kernel run (module
        docstring); else the way measured fastest for its rows."""
        if self.training and self.differs_in_training:
            return 0
        parameters = self.form_parameters()  # the weight first
        if type(input) is not Tensor or input.device.type != "cpu" or not self.kernel.accepts(input, parameters[0]):
            return 0
        inner = self.inner_modules()
        if inner and (any(type(module) is not nn.Linear for module in inner) or hooked(inner)):
            return 0  # a wrapper (LoRA) or a hook must see that module's own call, which only the plain way makes
        if torch.compiler.is_compiling():
            if not self._trace_kernels:  # a user's torch.compile traces the plain computation
                return 0
        elif not plain_call(input, parameters):
            return 0
        way = self._choice[bucket(input.numel() // input.shape[-1])]
        return way if way and self._ready() else 0

    # -- the form -----------------------------------------------------------------------------------------------
    def rebuild(self) -> bool:
        """Build the form of the current parameters (and let their file-backed pages go, see
        `release_resident_pages`); False where the kernel cannot run them here (then the plain computation runs)."""
        self._form, self._form_from, self._stale = None, self._key(), False
        if not self.can_build():
            return False
        self._form = self.build_form()
        if not self._keep_pages:
            for parameter in self.form_parameters():
                if parameter is not None:
                    release_resident_pages(parameter)
        return True

    @property
    def is_stale(self) -> bool:
        """Whether the parameters changed since the form was built (or found impossible to build)."""
        return self._stale or self._form_from != self._key()

    @property
    def is_current(self) -> bool:
        """Whether the next call that runs the kernel runs it on a form of the current parameters."""
        return self._form is not None and not self.is_stale

    def _key(self) -> tuple:
        return tuple(() if tensor is None else weight_key(tensor) for tensor in self.form_parameters())

    def _ready(self) -> bool:
        """The form of the current parameters is there, built again now if they changed since."""
        if torch.compiler.is_compiling():  # the compiled path built every form before tracing
            return self._form is not None
        if self.is_stale:
            return self.rebuild()
        return self._form is not None

    # -- what changes the parameters ----------------------------------------------------------------------------
    def train(self, mode: bool = True):
        if mode:  # training runs the plain computation and changes the weights: the form would only hold memory
            self._form, self._form_from = None, None
        return super().train(mode)

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any):
        self._stale = True  # `.to()`, `.float()`: new tensors, possibly where the old ones were
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._stale = True  # inference tensors loaded in place keep their key: the next call builds anew
        super()._load_from_state_dict(*args, **kwargs)

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be pickled or deep-copied: a copy builds its own form at its first call.
        return {**self.__dict__, "_form": None, "_form_from": None}


class InferenceLinear(Swapped, nn.Linear):
    """An `nn.Linear` whose plain CPU inference calls run `kernel` (`packed.PackedLinear`, `int8.Int8Linear`)."""

    plain_class = nn.Linear
    differs_in_training = False

    @classmethod
    def from_linear(cls, linear: nn.Linear, **attributes: Any) -> InferenceLinear:
        """`swap_in` for a linear layer (the name its callers know)."""
        return cls.swap_in(linear, **attributes)

    def to_linear(self) -> nn.Linear:
        return self.swap_out()

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return (self.weight, self.bias)

    def build_form(self) -> Any:
        return self.kernel.build(self.weight.detach(), None if self.bias is None else self.bias.detach())

    def supports(self, weight: Tensor) -> bool:
        """Whether the kernel can run a product with `weight` here."""
        return self.kernel.supports(weight)

    def run(self, input: Tensor) -> Tensor:
        """The kernel on the form (where the gate lets it run)."""
        return self.kernel.run(input, self._form)

    def forward(self, input: Tensor) -> Tensor:
        if self.kernel_way(input):
            return self.run(input)
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.kernel.name}"


def swapped_modules(model: nn.Module) -> list[Swapped]:
    return [module for module in model.modules() if isinstance(module, Swapped)]


def refresh(model: nn.Module) -> None:
    """Make `model`'s swapped modules build their forms anew at their next call: after changing weights through
    `.data` (which no version counter sees). Other changes are followed by themselves (module docstring)."""
    for module in swapped_modules(model):
        module._stale = True


def hooked(modules: Iterable[nn.Module]) -> bool:
    """Whether a forward hook (global, or on one of `modules`) would run at a call of one of `modules`."""
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks) or any(
        module._forward_hooks or module._forward_pre_hooks for module in modules
    )


def plain_call(input: Tensor, parameters: tuple[Tensor | None, ...]) -> bool:
    """Whether a oneDNN op (which has no backward and is invisible to autocast and tracers) may run this eager
    call: no jit trace, plain parameters, no gradient asked of anything, no autocast."""
    if torch.jit.is_tracing():
        return False
    parameters = tuple(parameter for parameter in parameters if parameter is not None)
    return (
        # FakeTensor, DTensor and other subclasses keep the standard op.
        all(type(parameter) in (Tensor, nn.Parameter) for parameter in parameters)
        # No backward: a gradient asked of the input or of any parameter (even the bias alone, as in BitFit).
        and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (input, *parameters)))
        # Autocast casts F.linear's inputs; it knows nothing of the oneDNN ops, which would silently stay fp32.
        and not torch.is_autocast_enabled("cpu")
    )


def weight_key(weight: Tensor) -> tuple:
    """What identifies the values a form was made from: storage, in-place version, dtype and shape. A tensor made
    under `torch.inference_mode()` has no version counter: its storage identifies it (and `load_state_dict` marks
    the form stale)."""
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
