"""The compiled paths, `optimize_for_inference(model, compile=True)`: the model's forward under torch.compile
(inductor, with freezing), on inputs padded to a few static shapes. Two kinds (`Compilation`):

- int8 (`quantize="int8", compile=True`): the int8 model's own kernels traced, the ops between them fused.
- fp32 (`compile=True`, either precision): the mode's own kernels traced (oneDNN's packed products where its eager
  forward runs them); where it runs `F.linear`, max-autotune times inductor's C++ GEMM template (micro-kernels
  chosen by instruction set) against ATen's product for each shape and keeps the faster. Where it wins depends on
  the CPU, so each shape's compiled graph is
  timed against the mode's eager forward when it is first compiled, and the faster runs from then on
  (`eager_shapes` lists those where eager won): an fp32 compiled model is never slower than the eager one it
  compiles, on any CPU.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, quantize="int8", compile=True)  # doctest: +SKIP
    >>> with torch.no_grad():  # the first call of each shape compiles (tens of seconds), later ones reuse it
    ...     out = model(input_ids=torch.tensor([[101, 102]]))  # doctest: +SKIP

Why it pays: the eager int8 forward is about 15 small ops per product around oneDNN's kernel (quantizing each
token, the zero-point and scale corrections, the bias, GELU, the residual, LayerNorm), each a pass over memory.
Inductor traces the same kernels (`torch.ops.onednn.qlinear_pointwise` on the same packed weights) and fuses the
ops between them into a few loops; freezing folds the weights into the graph. That matters where the products are
small (short inputs, batch 1) and not where they dominate (docs/cpu-inference.md measures both). The arithmetic is
the eager int8 path's: same quantization, same kernel, the same accuracy contract.

What it costs: a C++ compiler at run time (inductor writes and builds C++; without one, `optimize_for_inference`
raises, naming the compiler it looked for, and the eager paths keep working), and one compilation per input shape,
made at the first call of that shape only (so only the shapes a workload uses), announced on the `hfbert` logger
(a warning, so that it shows without logging set up) with the cache it fills. Inductor caches what it builds (the
FX graph cache and the autotuning results) in `torch._inductor.runtime.cache_dir_utils.cache_dir()`
(`$TORCHINDUCTOR_CACHE_DIR`, by default a folder under the system's temporary directory, a few MB per shape): a
second process compiling the same model and shape skips the C++ builds and the autotuning (docs/cpu-inference.md
gives both times). Its FX graph cache refuses graphs holding oneDNN's packed weights as constants (they cannot be
pickled), so every process still traces and lowers its graphs.
So that a few compilations cover every call, each call's (batch, sequence) is padded up to the next of
BATCH_BUCKETS x SEQUENCE_BUCKETS (pad tokens, masked out), and its outputs are cut back to the call's shape, pad
positions zero as in the eager padding-free path. Calls whose padding would take more than a quarter of the
padded shape run the eager int8 model instead: there the eager padding-free path, which computes real tokens only,
is faster than any padded computation; so do calls the compiled graph does not cover (training, gradients,
forward-mode AD and `torch.func`'s transforms, autocast, `output_attentions`, `inputs_embeds`, a device other than
the CPU, a forward hook on any module inside, added before or after compiling: it runs, and sees its module's own
call).

The compiled function is the model's own forward, called with the padded tensors and the call's other arguments;
this file pads and cuts, nothing more. While it traces, the flag that lets the int8 modules trace their kernels
(`swapped.Swapped.kernel_way`) is set on this model's modules, for this call only: a user's torch.compile of this
or of any other model traces the plain computation.

The weights are folded into the compiled graph: when any parameter changes (an optimizer step, `load_state_dict`,
a `.data` write that `swapped.Fingerprint` sees, `hfbert.inference.refresh(model)`), the next call builds the int8
forms again and compiles anew. `compile_report(model)` lists the shapes compiled so far and the seconds each took.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from hfbert.inference.swapped import Swapped, hooked, kernel_call, weight_key
from hfbert.modeling.inputs import check_inputs
from hfbert.modeling.model import BertModel, wants_tuple
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.padding import zeroed_pads

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SEQUENCE_BUCKETS = (16, 32, 64, 128, 256, 512)
# A call runs compiled only where real tokens fill at least this share of its padded shape.
MIN_FILL = 0.75
# Each compiled shape is one entry in dynamo's cache of this module's forward function (shared by every model).
RECOMPILE_LIMIT = 256
# Timed calls of each of the compiled graph and the eager forward when an fp32 shape is first compiled (the fastest
# of each decides).
MEASURE_ROUNDS = 5

log = logging.getLogger("hfbert")


@dataclass(frozen=True)
class Compilation:
    """How a compiled path compiles: what inductor is asked for, and whether the graph is timed against eager."""

    name: str
    inductor: tuple[tuple[str, Any], ...]  # inductor config patched while compiling and running
    measured: bool  # time each new shape against the eager forward and run the faster
    # How far a measured shape's compiled hidden states may lie from the eager ones (rtol and atol) and still agree:
    # the roundings a fusion changes, not the whole units a wrong graph is off by.
    agreement: float = 1e-3

    def options(self) -> dict[str, Any]:
        return dict(self.inductor)


# Freezing as a config patch: torch.compile's options={"freezing": True} leaves the int8 forms graph inputs, which
# inductor's int8 lowering refuses (it needs the packed weights as constants). Not max-autotune for int8: its int8
# GEMM template corrupted the heap on a Zen 5 (AVX-512 VNNI) with torch 2.13 (glibc's malloc assertion).
# `cpp.weight_prepack` off in both kinds: hfbert's products come packed already, inductor's packing passes expect
# weights they packed themselves, and once a process has compiled with them on, their patterns stay registered for
# every later compilation (an fp32 compilation after them asserted, or computed wrong numbers: `_agrees`).
COMPILED_INT8 = Compilation("int8", inductor=(("freezing", True), ("cpp.weight_prepack", False)), measured=False)
# fp32: the mode's own products traced (oneDNN's packed kernels where its eager forward runs them, `F.linear` where
# it runs plain: there max-autotune times inductor's C++ GEMM template against ATen's product).
COMPILED_FP32 = Compilation(
    "fp32",
    inductor=(
        ("freezing", True),
        ("max_autotune", True),
        ("max_autotune_gemm_backends", "CPP,ATEN"),
        ("cpp.weight_prepack", False),
    ),
    measured=True,
)


# bf16: the bf16 mode's products (`bf16.py`'s op, as in eager) and its attention traced, the fp32 ops between them
# fused; each shape timed against the eager bf16 forward. Its fusions change where a value is rounded to bf16, and
# a bf16 step is 2**-8 of a value: hidden states agree within a few of them, not fp32's 1e-3.
COMPILED_BF16 = Compilation(
    "bf16", inductor=(("freezing", True), ("cpp.weight_prepack", False)), measured=True, agreement=0.1
)


def cpp_compilers() -> tuple[str, ...]:
    """The C++ compilers inductor looks for, in order (`torch._inductor.config.cpp.cxx`: $CXX, else g++)."""
    from torch._inductor import config

    search = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    return tuple(name for name in search if name)


def check_compiler() -> str:
    """The path of the C++ compiler inductor will use; RuntimeError naming the compilers looked for if none is
    installed."""
    for name in cpp_compilers():
        path = shutil.which(name)
        if path is not None:
            return path
    raise RuntimeError(
        f"the compiled path (compile=True) needs a C++ compiler at run time and none was found: looked for "
        f"{', '.join(map(repr, cpp_compilers())) or 'none configured'} (set CXX to another one); the eager paths "
        f"(compile=False) do not need one"
    )


@dataclass(eq=False, repr=False)
class CompiledForward:
    """What replaces a `BertModel`'s forward (an instance attribute, so that the class and every other model keep
    theirs): runs the model's own forward, compiled on the call's tensors padded to a bucket shape and then cut back,
    or eager where the compiled graph does not cover the call."""

    model: nn.Module
    compilation: Compilation = COMPILED_INT8
    measured: bool = False  # fp32 with kernels="measured": each new shape timed against eager (`Compilation`)
    compiled: dict[tuple, float] = field(default_factory=dict)  # `compile_report`'s keys -> seconds
    eager: set[tuple] = field(default_factory=set)  # `compile_report`'s keys where eager was measured faster
    _generation: int = 0  # bumped when parameters change: a new value is a new compiled graph
    _parameters_key: tuple | None = None
    _compiled: Any = None  # the compiled `_Forward`, made at the first compiled call

    def __call__(self, *args: Any, **kwargs: Any) -> BertModelOutput | tuple[Tensor, ...]:
        """The model's forward arguments; bound by its signature only to find the tensors to pad."""
        model = self.model
        given = _bound(model, args, kwargs)
        # One walk of the model per call (at batch 1 each walk costs about a tenth of a millisecond).
        modules = list(model.modules())
        parameters = _parameters(modules)
        shape = None if given is None else self._shape(given, modules, parameters)
        if shape is None:
            return type(model).forward(model, *args, **kwargs)
        tensors = {name: given.get(name) for name in _PADDED}
        # Every value the compiled graph reads is checked eagerly first: the errors are the eager model's.
        check_inputs(model.config, parameters[0].device, *tensors.values(), None, dtype=parameters[0].dtype)
        swapped = self._refresh(modules, parameters)
        padded = _pad_inputs(shape, model.config.pad_token_id, **tensors)
        options = {"output_hidden_states": given.get("output_hidden_states"), "output_attentions": False}
        hidden = _or(options["output_hidden_states"], model.config.output_hidden_states)
        variant = tuple(padded[name] is not None for name in _PADDED[1:]) + (hidden,)
        key = (*shape, variant, self._generation)
        if key in self.eager:
            return type(model).forward(model, *args, **kwargs)
        new = key not in self.compiled
        if new:
            log.warning(
                "hfbert: compiling the %s forward for shape %d x %d (tens of seconds; once per shape and process, "
                "less where inductor's cache in %s holds it)",
                self.compilation.name,
                *shape,
                _cache_dir(),
            )
        started = time.perf_counter()
        try:
            with self._compiling(swapped):
                if self._compiled is None:
                    self._compiled = torch.compile(_Forward(model), dynamic=False)
                output = self._compiled(self._generation, {**padded, **options})
        except torch._dynamo.exc.BackendCompilerFailed as error:
            if not (new and self.measured):
                raise
            # The measured mode promises the eager mode's speed at worst: an inductor failure costs this shape only.
            log.warning("hfbert: inductor failed on shape %d x %d, which runs eager: %s", *shape, error)
            self.eager.add(key)
            return type(model).forward(model, *args, **kwargs)
        if new:
            self.compiled[key] = time.perf_counter() - started
        output = _cut(output, *given["input_ids"].shape, given.get("attention_mask"), model)
        output = output.to_tuple() if wants_tuple(model.config, given.get("return_dict")) else output
        if new and self.measured:
            eager, faster = self._eager_faster(swapped, {**padded, **options}, args, kwargs)
            if not _agrees(output[0], eager[0], self.compilation.agreement):
                log.warning(
                    "hfbert: the compiled %s forward for shape %d x %d disagrees with the eager one (inductor's "
                    "passes, changed by an earlier compilation in this process?): that shape runs eager",
                    self.compilation.name,
                    *shape,
                )
                self.eager.add(key)
                return eager
            if faster:
                self.eager.add(key)
        return output

    def _compiling(self, swapped: list[Swapped]) -> contextlib.AbstractContextManager:
        """The context of a compiled call: no grad, the swapped modules' kernels traced, inductor's options."""
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        stack.enter_context(_kernels_traced(swapped))
        stack.enter_context(torch._inductor.config.patch(self.compilation.options()))
        stack.enter_context(
            torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT * 4)
        )
        return stack

    def _eager_faster(self, swapped: list[Swapped], padded: dict[str, Any], args: tuple, kwargs: dict) -> tuple:
        """The eager forward's output on the call's own inputs, and whether it beats the compiled graph on the padded
        ones (the fastest of MEASURE_ROUNDS calls each, taken in turn)."""
        model = self.model
        best = {"compiled": float("inf"), "eager": float("inf")}
        for _ in range(MEASURE_ROUNDS):
            with self._compiling(swapped):
                started = time.perf_counter()
                self._compiled(self._generation, padded)
                best["compiled"] = min(best["compiled"], time.perf_counter() - started)
            with torch.no_grad():
                started = time.perf_counter()
                eager = type(model).forward(model, *args, **kwargs)
                best["eager"] = min(best["eager"], time.perf_counter() - started)
        return eager, best["eager"] < best["compiled"]

    def _shape(
        self, given: dict[str, Any], modules: list[nn.Module] | None = None, parameters: list[Tensor] | None = None
    ) -> tuple[int, int] | None:
        """The bucket shape this call runs compiled at, or None where it runs the eager model."""
        model = self.model
        modules = list(model.modules()) if modules is None else modules
        parameters = _parameters(modules) if parameters is None else parameters
        if not self.covers(given, modules, parameters):
            return None
        input_ids, attention_mask = given.get("input_ids"), given.get("attention_mask")
        batch, sequence = input_ids.shape
        limit = model.config.max_position_embeddings
        shape = (_bucket(batch, BATCH_BUCKETS), _bucket(sequence, tuple(s for s in SEQUENCE_BUCKETS if s <= limit)))
        real = batch * sequence if attention_mask is None else int(attention_mask.count_nonzero())
        return shape if real >= MIN_FILL * shape[0] * shape[1] else None

    def covers(self, given: dict[str, Any], modules: list[nn.Module], parameters: list[Tensor]) -> bool:
        """Whether a compiled graph may run this call (the gate every compiled path shares, `aot.py`'s too): a
        plain no-grad inference call on CPU token ids, no hook inside; else the eager model runs it."""
        model = self.model
        input_ids, attention_mask = given.get("input_ids"), given.get("attention_mask")
        return not (
            model.training
            or _or(given.get("output_attentions"), model.config.output_attentions)
            or given.get("inputs_embeds") is not None
            or type(input_ids) is not Tensor
            or input_ids.dim() != 2
            or input_ids.device.type != "cpu"
            or 0 in input_ids.shape
            or (attention_mask is not None and type(attention_mask) is not Tensor)
            # The gate's rules of a call: a user's torch.compile, tracing, transforms, gradients, autocast run plain.
            or not kernel_call(input_ids, parameters)
            # A hook inside (added before or after compiling) must run, and see its module's own call.
            or hooked(module for module in modules if module is not model)
        )

    def _refresh(self, modules: list[nn.Module], parameters: list[Tensor]) -> list[Swapped]:
        """Build the forms of parameters that changed since the last call, and compile anew if any did; returns the
        model's swapped modules (of `modules`, the model's)."""
        swapped = [module for module in modules if isinstance(module, Swapped)]
        key = tuple(weight_key(parameter) for parameter in parameters)
        stale = [module for module in swapped if module.is_stale]
        if key == self._parameters_key and not stale:
            return swapped
        # Forms dropped by `train()` are built again from the same values: the graph compiled from them stays valid.
        changed = key != self._parameters_key or any(module._stale for module in stale)
        for module in stale:
            module.rebuild()
        if changed and self._parameters_key is not None:
            self._generation += 1
        self._parameters_key = key
        return swapped

    def __getstate__(self) -> dict:
        # A copy compiles (and measures) its own graphs.
        return {**self.__dict__, "compiled": {}, "eager": set(), "_parameters_key": None, "_compiled": None}


def _parameters(modules: list[nn.Module]) -> list[Tensor]:
    """The parameters of `modules` (a model's, as `modules()` walks it), each once, in `parameters()`'s order."""
    seen: set[int] = set()
    found = []
    for module in modules:
        for parameter in module._parameters.values():
            if parameter is not None and id(parameter) not in seen:
                seen.add(id(parameter))
                found.append(parameter)
    return found


def _agrees(compiled: Tensor, eager: Tensor, tolerance: float = 1e-3) -> bool:
    """Whether the compiled graph's hidden states are the eager mode's up to the roundings a fusion changes (about
    1e-6 in fp32, `Compilation.agreement`); a graph inductor's passes got wrong is off by whole units."""
    return bool(torch.allclose(compiled, eager, rtol=tolerance, atol=tolerance))


def _cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


_PADDED = ("input_ids", "attention_mask", "token_type_ids", "position_ids")  # the tensors a compiled call pads


def _bound(model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """A call's arguments by name, bound by the model's own forward signature (MPNet's has no `token_type_ids`, and
    another positional order); None where they do not bind, or where the call gives a value to a keyword the
    signature does not name (MPNet takes token types only to check them): the eager forward runs, and says why."""
    signature = _signature(type(model))
    try:
        arguments = signature.bind(model, *args, **kwargs).arguments
    except TypeError:
        return None
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = arguments.pop(parameter.name, {})
            if any(value is not None for value in extra.values()):
                return None
    return arguments


@functools.cache
def _signature(model_class: type[nn.Module]) -> inspect.Signature:
    return inspect.signature(model_class.forward)


@contextlib.contextmanager
def _kernels_traced(modules: list[Swapped]) -> Iterator[None]:
    """Inside, torch.compile traces these modules' kernels (their forms are built) instead of the plain
    computation: a flag of this model's modules, for this call only, so that a user's torch.compile of this model,
    or of any other, still traces the plain computation."""
    for module in modules:
        module.__dict__["_trace_kernels"] = True
    try:
        yield
    finally:
        for module in modules:
            module.__dict__.pop("_trace_kernels", None)


def _or(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _bucket(size: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket holding `size`, or `size` itself beyond the last (a shape of its own)."""
    return next((bucket for bucket in buckets if size <= bucket), size)


def _pad_inputs(
    shape: tuple[int, int],
    pad_token_id: int | None,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    position_ids: Tensor | None,
) -> dict[str, Tensor | None]:
    """The inputs padded on the right and at the bottom to `shape`, the added positions masked out."""
    batch, sequence = input_ids.shape
    if shape == (batch, sequence):
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # as the eager model drops it: attention without a mask (one graph fewer)
        return dict(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids
        )
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)

    def pad(tensor: Tensor | None, value: int) -> Tensor | None:
        if tensor is None:
            return None
        if tensor.dim() == 1:  # position_ids (sequence,)
            tensor = tensor[None]
        rows = shape[0] if tensor.shape[0] == batch else tensor.shape[0]  # position_ids may be (1, sequence)
        padded = tensor.new_full((rows, shape[1]), value)
        padded[: tensor.shape[0], :sequence] = tensor
        return padded

    return dict(
        input_ids=pad(input_ids, pad_token_id or 0),
        attention_mask=pad(attention_mask, 0),
        token_type_ids=pad(token_type_ids, 0),
        position_ids=pad(position_ids, 0),
    )


class _Forward(nn.Module):
    """The model as a submodule, so that freezing folds its parameters and int8 forms into the compiled graph (the
    parameters of a module passed as an argument would be graph inputs)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, generation: int, arguments: dict[str, Any]) -> BertModelOutput:
        # `generation` is an int under dynamic=False: dynamo guards on its value, so a new one compiles a new graph.
        del generation
        return type(self.model).forward(self.model, **arguments, return_dict=True)


def _cut(output: BertModelOutput, batch: int, sequence: int, attention_mask: Tensor | None, model: nn.Module):
    """The outputs of the padded call cut back to the call's (batch, sequence); pad positions zero where the eager
    model's are (`zeroed_pads`: every right-padded row's)."""
    zero = zeroed_pads(attention_mask, model.padding_free)

    def cut(tensor: Tensor) -> Tensor:
        if tensor.dim() != 3:  # the pooler's (batch, hidden)
            return tensor[:batch].contiguous()
        tensor = tensor[:batch, :sequence]
        return tensor.masked_fill(zero, 0.0) if zero is not None else tensor.contiguous()

    return pytree.tree_map(cut, output)


def compile_target(model: nn.Module) -> BertModel:
    """The `BertModel` whose forward `compile_forward(model)` compiles: `model` or its backbone; TypeError for any
    other model, before anything changes."""
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, BertModel):
        raise TypeError(f"compile=True runs hfbert's BertModel (or a head model around it), not {type(model).__name__}")
    return backbone


def compile_forward(model: nn.Module, compilation: Compilation = COMPILED_INT8, measured: bool = False) -> None:
    """Make the plain inference calls of `model` (a `BertModel`, or a head model around one: its backbone) run
    compiled (module docstring); `optimize_for_inference` checked the model and the compiler first. `measured`:
    time each new shape against the eager forward (where `compilation` offers it) and run the faster."""
    backbone = compile_target(model)
    backbone.forward = CompiledForward(backbone, compilation, measured and compilation.measured)


def uncompile(model: nn.Module) -> None:
    """Give `model`'s backbone its class's forward again."""
    if _wrapper(model) is not None:
        del getattr(model, "backbone", model).forward


def _wrapper(model: nn.Module) -> CompiledForward | None:
    """The compiled forward of `model`'s backbone, or None where it runs its class's."""
    forward = getattr(model, "backbone", model).__dict__.get("forward")
    return forward if isinstance(forward, CompiledForward) else None


def compile_report(model: nn.Module) -> dict[tuple, float]:
    """(batch, sequence, inputs given, generation) -> seconds its first call took (compiling included), for every
    shape `model`'s backbone compiled; empty where it runs eager."""
    forward = _wrapper(model)
    return {} if forward is None else dict(forward.compiled)


def eager_shapes(model: nn.Module) -> list[tuple]:
    """The keys of `compile_report(model)` whose calls run the eager forward (fp32 compiled paths only): measured
    faster than the compiled graph when the shape was compiled, or a graph inductor failed to build, or one whose
    output disagreed with the eager mode's (each said by a warning on the `hfbert` logger)."""
    forward = _wrapper(model)
    return [] if forward is None else sorted(forward.eager)


def is_compiled(model: nn.Module) -> bool:
    """Whether `model`'s backbone runs the compiled path (`optimize_for_inference(..., compile=True)`)."""
    return _wrapper(model) is not None


def padded_shape(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None) -> tuple[int, int] | None:
    """The (batch, sequence) a no-grad inference call with these inputs runs compiled at; None where it runs the
    eager model (mostly padding, or `model` not compiled)."""
    forward = _wrapper(model)
    if forward is None:
        return None
    with torch.no_grad():
        return forward._shape(dict(input_ids=input_ids, attention_mask=attention_mask))
