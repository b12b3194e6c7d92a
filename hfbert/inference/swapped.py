"""The one swap protocol of the inference floor, and the one gate that decides, call by call, "kernel or plain".

A swapped module (`Swapped`) is one of the model's own modules (an `nn.Linear`, or a block of `fused.py`) put in
another class that can run a faster form of its parameters (packed blocks, int8 values, a fused weight) through a
kernel. The swap:

- keeps the same Parameter objects, child modules and hooks (`swap_state`): their `requires_grad`, their values,
  their place in `parameters()` and `state_dict()` stay what they were. A tie is the Parameter object itself (a
  masked-LM decoder's weight is its word embeddings'), so a swapped decoder keeps it, and `swap_out` gives it back
  tied; its form is the swapped module's cache, never the Parameter's, and the Parameter's pages stay in RAM
  (`_keep_pages`), as the embeddings read it at every forward;
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
- written behind every counter (`.data` writes, as PEFT's `merge_and_unload` does): each call that runs a kernel
  first reads a fixed sample of its parameters' memory (`Fingerprint`, bit for bit) and compares it with the sample
  taken when the form was built: SAMPLES elements spread over the rows and columns, or, of a parameter whose pages
  were let go (`release_resident_pages`), PAGE_SAMPLES of the partial page at its start (part of its first row), as
  touching a page let go would bring the weight back into RAM. A bias the form holds itself needs none. A write that
  changes no sampled element (a few rows or elements edited through `.data`) is not seen:
  `hfbert.inference.refresh(model)` marks every form stale.

Forward-mode AD (dual tensors, `torch.autograd.forward_ad`) and functorch's transforms (`torch.func.jvp`, `vmap`,
`grad`, `jacrev`) run the plain computation: the kernels' ops have no forward derivative or batching rule
(`transformed`).
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd import forward_ad

from hfbert.inference.measured import bucket

# What a swapped module holds beyond its plain class's state: never carried across a swap.
_SWAP_ATTRIBUTES = (
    "_form",
    "_form_from",
    "_fingerprint",
    "_stale",
    "_trace_kernels",
    "_choice",
    "_keep_pages",
    "kernel",
)
# Elements of a parameter a `Fingerprint` reads at every call that runs a kernel, each in another row and column,
# where its pages stay in RAM: a write to a tenth of the rows (or columns), taken at random, misses all of them with
# probability 0.9**32 (3%).
SAMPLES = 32
# Elements read from one memory page: of a parameter whose pages were let go (`release_resident_pages`), the partial
# page at one of its ends, which stays (touching a page let go maps its whole folio back, up to 2 MiB on Linux 6.18
# for a file just written: 170 MB of bert-base's packed weights back in RAM); of a parameter within a page (a bias).
# Few, as each is a cache miss in a forward, whose weights evict them.
PAGE_SAMPLES = 4


@dataclass(frozen=True)
class Kernel:
    """A faster computation of a linear product `rows @ weight.T + bias`, as a value a swapped module takes
    (`packed.BLOCKED`, `packed.WHOLE`, `int8.INT8`): the module builds the form once and runs it at each call."""

    name: str  # what `packed_layers` reports for a module running it
    supports: Callable[[Tensor], bool]  # whether it can run a product with this weight here
    accepts: Callable[[Tensor, Tensor], bool]  # whether it runs this input (its dtype) with this weight
    build: Callable[[Tensor, Tensor | None], Any]  # (weight, bias) -> the form, holding the bias itself (no copy)
    run: Callable[[Tensor, Any], Tensor]  # (rows, form) -> rows @ weight.T + bias
    # (rows, form) -> GELU (erf) of that, as the product's post-op; None where the kernel has none
    run_gelu: Callable[[Tensor, Any], Tensor] | None = None
    # (rows, form) -> the product in the kernel's own lower precision (bf16), which attention computes on as it is;
    # None where the kernel has none
    run_native: Callable[[Tensor, Any], Tensor] | None = None


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
    _fingerprint: Fingerprint | None = None  # a sample of the values the form was built from
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
        # Pages stay where some row counts read the plain parameters, or where the caller says other modules read
        # them (a tied weight: the word embeddings look rows up in the decoder's weight at every forward).
        swapped._keep_pages = bool(attributes.get("_keep_pages")) or 0 in swapped._choice
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

    def fingerprinted(self) -> tuple[Tensor | None, ...]:
        """The parameters a `Fingerprint` samples: those the form holds a copy of. A bias the form holds itself
        (`Kernel.build`) needs none: the kernel reads its current values."""
        return self.form_parameters()

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
        if self.trains_plain:
            return 0
        parameters = self.form_parameters()  # the weight first
        if type(input) is not Tensor or input.device.type != "cpu" or not self.kernel.accepts(input, parameters[0]):
            return 0
        inner = self.inner_modules()
        if inner and (any(type(module) is not nn.Linear for module in inner) or hooked(inner)):
            return 0  # a wrapper (LoRA) or a hook must see that module's own call, which only the plain way makes
        if not kernel_call(input, parameters, self._trace_kernels):
            return 0
        way = self._choice[bucket(input.numel() // input.shape[-1])]
        return way if way and self._ready() else 0

    @property
    def trains_plain(self) -> bool:
        """Whether it runs its plain computation because it is training (where that changes it: a block's dropout)."""
        return self.training and self.differs_in_training

    # -- the form -----------------------------------------------------------------------------------------------
    def rebuild(self) -> bool:
        """Build the form of the current parameters (and let their file-backed pages go, see
        `release_resident_pages`); False where the kernel cannot run them here (then the plain computation runs)."""
        self._form, self._form_from, self._stale, self._fingerprint = None, self._key(), False, None
        if not self.can_build():
            return False
        self._fingerprint = Fingerprint(self.fingerprinted(), resident=self._keep_pages)
        self._form = self.build_form()
        if not self._keep_pages:
            for parameter in self.form_parameters():
                if parameter is not None:
                    release_resident_pages(parameter)
        return True

    @property
    def is_stale(self) -> bool:
        """Whether the parameters changed since the form was built (or found impossible to build)."""
        if self._stale or self._form_from != self._key():
            return True
        if self._fingerprint is not None and not self._fingerprint.matches():
            self._stale = True  # values changed behind every counter: the compiled path compiles anew
            return True
        return False

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
            self._form, self._form_from, self._fingerprint = None, None, None
        return super().train(mode)

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any):
        self._stale = True  # `.to()`, `.float()`: new tensors, possibly where the old ones were
        self._fingerprint = None  # it holds the old tensors' memory
        return super()._apply(fn, *args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._stale = True  # inference tensors loaded in place keep their key: the next call builds anew
        super()._load_from_state_dict(*args, **kwargs)

    def __getstate__(self) -> dict:
        # oneDNN's packed tensors cannot be pickled or deep-copied: a copy builds its own form at its first call.
        return {**self.__dict__, "_form": None, "_form_from": None, "_fingerprint": None}


class InferenceLinear(Swapped, nn.Linear):
    """An `nn.Linear` whose plain CPU inference calls run `kernel` (`packed.PackedLinear`, `int8.Int8Linear`)."""

    plain_class = nn.Linear
    differs_in_training = False

    @classmethod
    def from_linear(cls, linear: nn.Linear, **attributes: Any) -> InferenceLinear:
        """`swap_in` for a linear layer (the name its callers know)."""
        return cls.swap_in(linear, **attributes)

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return (self.weight, self.bias)

    def fingerprinted(self) -> tuple[Tensor | None, ...]:
        return (self.weight,)

    def build_form(self) -> Any:
        return self.kernel.build(self.weight.detach(), None if self.bias is None else self.bias.detach())

    def forward(self, input: Tensor) -> Tensor:
        if self.kernel_way(input):
            return self.kernel.run(input, self._form)
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.kernel.name}"


def swapped_modules(model: nn.Module) -> list[Swapped]:
    return [module for module in model.modules() if isinstance(module, Swapped)]


def refresh(model: nn.Module) -> None:
    """Make `model`'s swapped modules build their forms anew at their next call. Changes are followed without it
    (module docstring), `.data` writes included, except a write that changes none of the elements a `Fingerprint`
    samples (a few rows or elements edited through `.data`): call it after such a write."""
    for module in swapped_modules(model):
        module._stale = True


def hooked(modules: Iterable[nn.Module]) -> bool:
    """Whether a forward hook (global, or on one of `modules`) would run at a call of one of `modules`."""
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks) or any(
        module._forward_hooks or module._forward_pre_hooks for module in modules
    )


def kernel_call(input: Tensor, parameters: Iterable[Tensor | None], trace_kernels: bool = False) -> bool:
    """Whether a oneDNN op (which has no backward and is invisible to autocast and tracers) may run this call: under
    torch.compile only where it traces the kernels (`trace_kernels`: the compiled path's own calls; a user's
    torch.compile traces the plain computation); else no jit trace, plain parameters, no gradient asked of
    anything, no autocast."""
    if torch.compiler.is_compiling():
        return trace_kernels
    if torch.jit.is_tracing() or transformed():
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


def transformed() -> bool:
    """Whether a call may carry tangents or run under a functorch transform: inside a forward-mode AD level
    (`forward_ad.dual_level`, whose dual tensors are plain tensors to every other check) or under `torch.func`'s
    jvp, vmap, grad or jacrev. The kernels' ops have no forward derivative or batching rule: a tangent through them
    would silently be dropped."""
    return forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


class Fingerprint:
    """A fixed strided sample of tensors' memory (`_sampled`), taken when a form is built: `matches()` reads it again
    and compares it bit for bit (its cost per forward: `python -m benchmarks.weight_fingerprint`). `resident`: the
    tensors' pages stay in RAM (else only the pages `release_resident_pages` keeps are read). It holds the tensors
    (detached), so that the memory it reads stays theirs."""

    __slots__ = ("_tensors", "_samples")

    def __init__(self, tensors: Iterable[Tensor | None], resident: bool) -> None:
        self._tensors = tuple(tensor.detach() for tensor in tensors if tensor is not None and tensor.numel())
        views = [view for tensor in self._tensors for view in _sampled(tensor, resident)]
        self._samples = tuple((view, view.tobytes()) for view in views)

    def matches(self) -> bool:
        """Whether every sampled element still holds the bits it held when the fingerprint was taken."""
        for view, taken in self._samples:  # noqa: SIM110 (a generator costs more, at every call)
            if view.tobytes() != taken:
                return False
        return True


_UNSIGNED = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32, 8: ctypes.c_uint64}


def _sampled(tensor: Tensor, resident: bool) -> list[memoryview]:
    """Whole elements of a CPU tensor's memory, as views that read them anew at each `tobytes()`: SAMPLES spread
    over the span its strides cover where its pages stay in RAM (`resident`, no whole page, not Linux); else
    PAGE_SAMPLES of the partial page at its start or end, which `release_resident_pages` keeps (or of its first
    page, where it has neither), or of all of it where it fits in a page."""
    size = tensor.element_size()
    span = 1 + sum((length - 1) * stride for length, stride in zip(tensor.shape, tensor.stride(), strict=True))
    row = max(tensor.stride()) if tensor.dim() >= 2 else span  # the outer stride: a row in memory
    memory = memoryview((_UNSIGNED[size] * span).from_address(tensor.data_ptr()))
    start, end = tensor.data_ptr(), tensor.data_ptr() + span * size
    first_page, last_page = _whole_pages(start, end)
    if span * size <= mmap.PAGESIZE:
        return [_spread(memory, PAGE_SAMPLES, row)]
    if resident or last_page <= first_page or not sys.platform.startswith("linux"):
        return [_spread(memory, SAMPLES, row)]
    ends = (memory[: (first_page - start) // size], memory[(last_page - start) // size :], memory[:1])
    return [_spread(next(part for part in ends if len(part)), PAGE_SAMPLES, row)]


def _spread(memory: memoryview, count: int, row: int) -> memoryview:
    """About `count` elements of `memory`, evenly spaced; each step also moves a `count`-th of a `row`, so that the
    elements fall in different columns as well as different rows."""
    return memory[:: max(1, len(memory) // count + (row // count if row < len(memory) else 0))]


def weight_key(weight: Tensor) -> tuple:
    """What identifies the values a form was made from: storage, in-place version, dtype and shape. A tensor made
    under `torch.inference_mode()` has no version counter: its storage identifies it (and `load_state_dict` marks
    the form stale)."""
    version = None if weight.is_inference() else weight._version
    return (weight.data_ptr(), version, weight.dtype, weight.device, tuple(weight.shape))


_MADV_PAGEOUT = 21  # linux/mman.h, Linux 5.4 and later


@functools.cache
def _libc_madvise() -> Any:
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
        first_page, last_page = _whole_pages(
            tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        )
        if last_page > first_page:
            _libc_madvise()(first_page, last_page - first_page, _MADV_PAGEOUT)
    except (OSError, AttributeError):
        pass


def _whole_pages(start: int, end: int) -> tuple[int, int]:
    """The first and the end address of the whole memory pages in [start, end): those `release_resident_pages`
    lets go (the partial pages at the ends are shared with neighbouring tensors)."""
    page = mmap.PAGESIZE
    return -(-start // page) * page, end // page * page
