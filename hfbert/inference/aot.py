"""The ahead-of-time path, `optimize_for_inference(model, compile="aot")`: the model's forward exported once
(`torch.export`, the batch and the token dimension dynamic) and compiled by AOTInductor into a package on disk, then
called as one C++ function: no Python, no dynamo guards and no per-op dispatch between the products.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, precision="high", compile="aot")  # doctest: +SKIP
    >>> with torch.no_grad():  # the first call compiles (tens of seconds) or loads the package from disk
    ...     out = model(input_ids=torch.tensor([[101, 102]]))  # doctest: +SKIP

What is exported is the model's plain computation (the swapped modules' gate runs it under tracing): hfbert's own
kernels hold oneDNN's packed weights as opaque tensors that `torch.export` cannot trace (it needs storage behind
every constant), so the products are inductor's. With freezing, inductor packs each weight for oneDNN itself
(`cpp.weight_prepack`, where the mode's contract allows its sums) and fuses the ops between the products;
AOTInductor writes the (packed) constants into the package. Per mode (`AOT_ROUTES`):

- fp32, `precision="highest"`: the plain graph in fp32, not frozen, so that nothing packs it: its products ATen's
  (MKL's sgemm, transformers' own arithmetic: oneDNN's inner product sums in an order whose error exceeds this
  precision's contract);
- fp32, `precision="high"`: the same graph, its products oneDNN's fp32 inner product on weights inductor packs
  itself (`cpp.weight_prepack`), within that precision's contract (3x transformers' error);
- `precision="bf16"`: the plain graph under CPU autocast to bf16 (the linear products in bf16 with fp32 sums, their
  outputs rounded to bf16; LayerNorm, the residual stream and GELU in fp32 as autocast keeps them), attention in fp32
  on the rounded query, key and value (`_AttentionInFp32`), held to the bf16 mode's contract (OpenVINO bf16's error);
- `quantize="int8"` has no AOT route: its int8 weights are oneDNN's packed int8 tensors, opaque to `torch.export`,
  and torch's exportable int8 (PT2E) quantizes activations per tensor, not per token (another contract).
  `optimize.py` runs int8 with `compile="aot"` as `compile=True` (`compiled.py`).

One package per input variant (token ids alone; with an attention mask; with token types), compiled at the first
call of that variant (exported here, compiled by AOTInductor in a child process: `compile_package`) and stored
under `cache_dir()` (`$HFBERT_CACHE/aot`, else `$XDG_CACHE_HOME/hfbert/aot`, else `~/.cache/hfbert/aot`), named
by a hash of everything it depends on (`package_key`): every parameter's bytes, the model's classes and config, the
route, torch's version, the CPU (vendor, model and instruction-set flags) and the environment's caps. A later
process with the same model loads it (a fraction of a second) instead of compiling. A package is written to a
temporary file in that folder and linked to its name, which fails where the name exists: a file this call did not
write is never overwritten (a concurrent writer's is loaded). `HFBERT_AOT_CACHE=off`
compiles in every process and keeps nothing on disk. `aot_report(model)` gives each variant's compile or load time.

A call with a mask runs the dense masked computation (the padding-free layout's lengths are data, which a graph
with dynamic shapes cannot branch on), then zeroes the pads as the eager padding-free path does; where pads take
more than a quarter of the batch (`compiled.MIN_FILL`) the eager mode's padding-free path runs instead, faster than
computing pads. The calls the graph does not cover run the eager mode: `compiled.CompiledForward.covers` (training,
gradients, autocast, transforms, a hook inside, `output_attentions`, `inputs_embeds`, a device other than the CPU),
and `position_ids`, `output_hidden_states`, single-token inputs. The package holds the weights it was built from:
when any parameter changes (`compiled.py`'s rules: version counters, storages, `load_state_dict`, `refresh(model)`,
and a sample of every parameter's memory read at each call, `swapped.Fingerprint`, for `.data` writes), the next
call builds (or loads) the package of the new weights; it never runs a stale one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from hfbert.inference import kernel_cache
from hfbert.inference.compiled import (
    MIN_FILL,
    Compilation,
    CompiledForward,
    _bound,
    _parameters,
    _wrapper,
)
from hfbert.inference.swapped import Fingerprint, Swapped, weight_key
from hfbert.modeling.encoder import EncoderModel, wants_tuple
from hfbert.modeling.inputs import check_inputs
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.padding import zeroed_pads
from hfbert.platform.cpu import cpu_identity, environment_caps

log = logging.getLogger("hfbert")

SWITCH = "HFBERT_AOT_CACHE"  # "off" (or 0, false, no): compile in every process, keep nothing on disk
# Inductor's options while AOTInductor compiles (in a process of its own, `compile_package`): freezing folds the
# weights into constants, which inductor packs for oneDNN's inner product itself (the exported graph holds plain
# products). Unfrozen, the products stay ATen's (MKL's sgemm, transformers' own arithmetic).
PACKED = (("freezing", True), ("cpp.weight_prepack", True))
UNPACKED = (("freezing", False),)
# The largest batch one package serves (token dimension: the model's positions); larger batches run eager.
MAX_BATCH = 4096
# The inputs a package may take, in its argument order (the others run the eager mode).
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class AotRoute:
    """How a mode's forward is exported and compiled: its name, inductor's options, and the dtype its products run
    in under CPU autocast (None: the model's own fp32)."""

    name: str
    inductor: tuple[tuple[str, Any], ...]
    autocast: torch.dtype | None = None

    def context(self) -> contextlib.AbstractContextManager:
        if self.autocast is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(torch.autocast("cpu", dtype=self.autocast))
        stack.enter_context(_AttentionInFp32())
        return stack


class _AttentionInFp32(TorchFunctionMode):
    """Attention's products in fp32 on the bf16-rounded query, key and value, as the eager bf16 mode's attention runs
    where it was measured (`fused.FusedAttention`'s fp32 way): autocast would run them in bf16, whose error on
    all-MiniLM-L6-v2 exceeds OpenVINO bf16's (tests/test_aot.py). Active only while the forward is exported."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            with torch.autocast("cpu", enabled=False):
                mask = kwargs.get("attn_mask")
                if mask is not None and mask.is_floating_point():
                    kwargs = {**kwargs, "attn_mask": mask.float()}
                return func(*(tensor.float() for tensor in args[:3]), *args[3:], **kwargs)
        return func(*args, **kwargs)


# "highest": ATen's products, as transformers computes them; oneDNN's unblocked fp32 inner product on inductor's packed
# weights sums in another order, whose error against float64 exceeds 1.5x transformers' own (tests/test_aot.py).
AOT_FP32 = AotRoute("fp32", UNPACKED)
AOT_HIGH = AotRoute("fp32 high", PACKED)
AOT_BF16 = AotRoute("bf16", PACKED, torch.bfloat16)
AOT_ROUTES = {"highest": AOT_FP32, "high": AOT_HIGH, "bf16": AOT_BF16}


def enabled() -> bool:
    """Whether packages are read from and written to disk (`HFBERT_AOT_CACHE` is not off)."""
    return os.environ.get(SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def cache_dir() -> Path:
    """The folder the packages go in: `aot/` beside the kernel choices' folder (`kernel_cache.cache_dir`)."""
    return kernel_cache.cache_dir().parent / "aot"


@dataclass
class Built:
    """One variant's package as `aot_report` lists it."""

    path: str | None  # the package on disk (None: HFBERT_AOT_CACHE=off)
    seconds: float  # the time to export and compile, or to load
    loaded: bool  # True: loaded from disk, compiled by an earlier process


@dataclass(eq=False, repr=False)
class AotForward(CompiledForward):
    """What replaces an encoder's forward under `compile="aot"` (an instance attribute, as `CompiledForward`, whose
    gate, parameter tracking and eager fallback it shares): runs the variant's AOTInductor package on the call's own
    tensors, or the eager mode where the package does not cover the call."""

    route: AotRoute = AOT_FP32
    built: dict[tuple, Built] = field(default_factory=dict)  # (variant, generation) -> how its package came
    _runners: dict[tuple, Any] = field(default_factory=dict)  # variant -> the loaded package, of this generation
    _runners_generation: int = -1
    _values: Fingerprint | None = None  # a sample of every parameter's memory, taken when the packages were built

    def __call__(self, *args: Any, **kwargs: Any) -> BertModelOutput | tuple[Tensor, ...]:
        model = self.model
        given = _bound(model, args, kwargs)
        modules = list(model.modules())
        parameters = _parameters(modules)
        if given is None or not self._aot_covers(given, modules, parameters):
            return type(model).forward(model, *args, **kwargs)
        tensors = {name: given.get(name) for name in INPUTS}
        check_inputs(model.config, parameters[0].device, *tensors.values(), None, None, dtype=parameters[0].dtype)
        mask = tensors["attention_mask"]
        if mask is not None and bool(mask.all()):
            mask = tensors["attention_mask"] = None  # as the eager model drops it: attention without a mask
        if mask is not None and int(mask.count_nonzero()) < MIN_FILL * mask.numel():
            return type(model).forward(model, *args, **kwargs)  # padding-free computes fewer tokens
        self._follow(modules, parameters)
        variant = tuple(name for name, tensor in tensors.items() if tensor is not None)
        runner = self._runners.get(variant) or self._build(variant, tensors)
        with torch.no_grad():
            outputs = _run(runner, [tensors[name].long() for name in variant])
        hidden = outputs[0]
        zero = zeroed_pads(mask, model.padding_free)
        if zero is not None:
            hidden = hidden.masked_fill(zero, 0.0)
        output = BertModelOutput(last_hidden_state=hidden, pooler_output=outputs[1] if len(outputs) > 1 else None)
        return output.to_tuple() if wants_tuple(model.config, given.get("return_dict")) else output

    def _aot_covers(self, given: dict[str, Any], modules: list[nn.Module], parameters: list[Tensor]) -> bool:
        """`covers`, and what a package takes: no position ids, no hidden states of every layer, at least two
        tokens, at most MAX_BATCH rows, no keyword but INPUTS and the output switches."""
        model = self.model
        if not self.covers(given, modules, parameters):
            return False
        hidden = given.get("output_hidden_states")
        input_ids = given["input_ids"]
        return (
            given.get("position_ids") is None
            and not (model.config.output_hidden_states if hidden is None else hidden)
            and 2 <= input_ids.shape[1] <= model.config.max_position_embeddings
            and input_ids.shape[0] <= MAX_BATCH
            and not input_ids.is_floating_point()
        )

    def _follow(self, modules: list[nn.Module], parameters: list[Tensor]) -> None:
        """A new generation where any parameter changed since the packages were built: a version counter or storage
        (`weight_key`), a swapped module marked stale (`load_state_dict`, `.to()`, `refresh(model)`), or the sample
        of every parameter's memory (`.data` writes). The packages of the old weights are dropped, never run. The
        eager mode's forms are not built here (the packages do not read them): a call that runs eager builds them."""
        key = tuple(weight_key(parameter) for parameter in parameters)
        marked = [module for module in modules if isinstance(module, Swapped) and module._stale]
        for module in marked:  # seen here; still stale for the eager mode's next call, whose key no longer matches
            module._stale, module._form_from = False, None
        changed = key != self._parameters_key or marked or (self._values is not None and not self._values.matches())
        if changed and self._parameters_key is not None:
            self._generation += 1
        self._parameters_key = key
        if self._runners_generation != self._generation:
            self._runners, self._values, self._runners_generation = {}, None, self._generation

    def _build(self, variant: tuple[str, ...], tensors: dict[str, Tensor | None]) -> Any:
        """Load the variant's package from disk, or export and compile it there (module docstring)."""
        model = self.model
        started = time.perf_counter()
        key = package_key(model, self.route, variant)
        path = cache_dir() / f"{key}.pt2" if enabled() else None
        runner = _load(path) if path is not None and path.exists() else None
        loaded = runner is not None
        if runner is None:
            log.warning(
                "hfbert: compiling the %s forward ahead of time for inputs %s (tens of seconds; once per model and "
                "machine: the package is kept in %s)",
                self.route.name,
                ", ".join(variant),
                path.parent if path is not None else "memory only (HFBERT_AOT_CACHE=off)",
            )
            runner = self._compile(variant, tensors, path)
        if not self._runners:
            parameters = [parameter for parameter in model.parameters() if parameter.device.type == "cpu"]
            self._values = Fingerprint(parameters, resident=True)
        self._runners[variant] = runner
        seconds = time.perf_counter() - started
        self.built[(variant, self._generation)] = Built(None if path is None else str(path), seconds, loaded)
        if not loaded:
            self.compiled[(variant, self._generation)] = seconds
        return runner

    def _compile(self, variant: tuple[str, ...], tensors: dict[str, Tensor | None], path: Path | None) -> Any:
        """Export the model's plain forward for `variant` and compile it with AOTInductor into `path` (a temporary
        file where None), then load it."""
        program = export_forward(self.model, self.route, variant, tensors)
        folder = path.parent if path is not None else Path(tempfile.gettempdir())
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".aot-", suffix=".pt2", dir=folder)
        os.close(handle)
        try:
            compile_package(program, Path(temporary), self.route)
            runner = torch._inductor.aoti_load_package(temporary)
            if path is not None:
                with contextlib.suppress(FileExistsError):  # another process wrote it first: theirs stays
                    os.link(temporary, path)
        finally:
            os.unlink(temporary)
        return runner

    def __getstate__(self) -> dict:
        # A copy loads (or builds) its own packages.
        state = super().__getstate__()
        return {**state, "built": {}, "_runners": {}, "_runners_generation": -1, "_values": None}


# The compiler process: inductor keeps state per process that changes what a later compile does (its oneDNN packing
# patterns are registered once, at the first freezing compile, and only where packing is on then; afterwards every
# freezing compile packs, `compile=True`'s graphs included, which inductor then fails on). So each package is compiled
# in a fresh process of its own, and this process's inductor is left as it was.
COMPILER = """
import json, sys, torch
program = torch.export.load(sys.argv[1])
options = json.loads(sys.argv[3])
with torch.no_grad():
    torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[2], inductor_configs=options)
"""


def compile_package(program: torch.export.ExportedProgram, package: Path, route: AotRoute) -> None:
    """Compile `program` with AOTInductor into `package` (an existing empty file, overwritten) under `route`'s options,
    in a child process (`COMPILER`): the program is saved beside the package, compiled there, and removed. A failed
    compile raises RuntimeError with the end of the compiler's output."""
    with tempfile.TemporaryDirectory(prefix=".aot-export-", dir=package.parent) as scratch:
        saved = Path(scratch) / "program.pt2"
        torch.export.save(program, saved)
        options = json.dumps(dict(route.inductor))
        done = subprocess.run(
            [sys.executable, "-c", COMPILER, str(saved), str(package), options],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip().splitlines()[-12:]
        raise RuntimeError(f"hfbert: AOTInductor failed to compile the {route.name} package:\n" + "\n".join(output))


def _run(runner: Any, inputs: list[Tensor]) -> list[Tensor]:
    """The package's outputs for `inputs` (its positional tensors, in order). Its loader is called directly: the
    package's own `__call__` parses its input and output tree specs from JSON at every call, a cost of the order of
    this path's checks at batch 1 (benchmarks/batch1_aot.py)."""
    loader = getattr(runner, "loader", None)
    if loader is not None and hasattr(loader, "boxed_run"):
        return loader.boxed_run(inputs)
    return list(runner(*inputs))


def _load(path: Path) -> Any:
    """The package at `path` loaded, or None (with a warning) where it cannot be (then it is compiled anew)."""
    try:
        return torch._inductor.aoti_load_package(str(path))
    except Exception as error:  # a truncated or foreign file: compile, and leave it for its owner
        log.warning("hfbert: cannot load the ahead-of-time package %s (%s): compiling instead", path, error)
        return None


class _Exported(nn.Module):
    """The encoder's plain forward as `torch.export` takes it: the variant's tensors by position, the hidden states
    (and the pooler's output) as a tuple, in fp32."""

    def __init__(self, model: nn.Module, route: AotRoute, variant: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.route, self.variant = model, route, variant

    def forward(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        with self.route.context():
            output = type(self.model).forward(self.model, **dict(zip(self.variant, tensors, strict=True)))
        outputs = (output.last_hidden_state, output.pooler_output)
        return tuple(tensor.float() for tensor in outputs if tensor is not None)


def export_forward(
    model: nn.Module, route: AotRoute, variant: tuple[str, ...], tensors: dict[str, Tensor | None]
) -> torch.export.ExportedProgram:
    """`model`'s plain forward for the inputs `variant` names, exported with a dynamic batch and token dimension;
    with a mask, its dense masked computation (`padding_free` off while it traces)."""
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    tokens = torch.export.Dim("tokens", min=2, max=model.config.max_position_embeddings)
    # Examples of two rows and tokens: export would specialize a size of one.
    examples = tuple(
        torch.ones(2, 2, dtype=torch.long)
        if name == "attention_mask"
        else tensors[name][:1, :2].long().repeat(2, 1).contiguous()
        for name in variant
    )
    padding_free = model.padding_free
    model.padding_free = False
    try:
        with torch.no_grad():
            return torch.export.export(
                _Exported(model, route, variant),
                examples,
                dynamic_shapes=(tuple({0: batch, 1: tokens} for _ in variant),),  # one *tensors argument
                strict=False,
            )
    finally:
        model.padding_free = padding_free


def package_key(model: nn.Module, route: AotRoute, variant: tuple[str, ...]) -> str:
    """The name of a package: a hash of every parameter's (and buffer's) bytes, the model's module classes and
    config, the route and inputs, torch's version, the CPU and the environment's caps, and this floor's source."""
    digest = hashlib.sha256()
    described = {
        "classes": [type(module).__qualname__ for module in model.modules()],
        "config": _config_of(model),
        "padding_free": model.padding_free,
        "route": route.name,
        "variant": variant,
        "torch": torch.__version__,
        "cpu": cpu_identity(),
        "caps": environment_caps(),
        "source": _source(),
    }
    digest.update(json.dumps(described, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict(keep_vars=True).items():
        tensor = tensor.detach()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().data if tensor.numel() else b"")
    return digest.hexdigest()[:32]


def _config_of(model: nn.Module) -> Any:
    config = model.config
    return config.to_dict() if hasattr(config, "to_dict") else repr(config)


@functools.cache
def _source() -> str:
    """A hash of this floor's source: a package exported by other code (an edited checkout) is another package."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def aot_target(model: nn.Module) -> EncoderModel:
    """The encoder whose forward `compile="aot"` replaces: `model` or its backbone (BERT-shaped members and
    ModernBERT); TypeError for any other model, before anything changes."""
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, EncoderModel):
        raise TypeError(
            f"compile='aot' runs hfbert's encoders (or a head model around one), not {type(model).__name__}"
        )
    return backbone


def aot_forward(model: nn.Module, route: AotRoute) -> None:
    """Make the plain inference calls of `model` (an encoder, or a head model around one: its backbone) run their
    AOTInductor package (module docstring); `optimize_for_inference` checked the model and the compiler first."""
    backbone = aot_target(model)
    backbone.forward = AotForward(backbone, Compilation(f"aot {route.name}", (), measured=False), route=route)


def aot_report(model: nn.Module) -> dict[tuple, Built]:
    """(inputs, generation) -> how each package of `model`'s backbone came (compiled or loaded, in how many
    seconds, and where it is kept); empty where it runs no AOT path."""
    forward = _wrapper(model)
    return dict(forward.built) if isinstance(forward, AotForward) else {}
