"""Make a built model fast for CPU inference, from outside: its linear layers or blocks swapped for faster ones.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model)  # eval mode; what is measured faster here, swapped in
    >>> with torch.no_grad():
    ...     out = model(input_ids=torch.tensor([[101, 102]]))

The modes, each with its numerical contract (ACCURACY_BOUNDS; docs/numerical-contract.md measures them):

- fp32, `precision="highest"` (the default): large `nn.Linear` layers may become `PackedLinear` (`packed.py`), whose
  weight is packed once into oneDNN's blocked layout and summed in blocks, so the error against float64 stays
  transformers' own (at most 1.5x); a bf16 model is packed too on CPUs that compute bf16 natively.
- fp32, `precision="high"`: the fast mode of `fused.py`, at most 3x transformers' error: query, key and value in
  one product, GELU and the residual add as oneDNN post-ops, whole-width packed weights.
- `precision="bf16"`, on CPUs that compute bf16 natively: `BF16Linear` (`bf16.py`), and attention's query, key and
  value in one bf16 product: the products in bf16 (fp32 sums), the residual stream, LayerNorm, softmax and GELU in
  fp32; RMS error against float64 at most OpenVINO bf16's (lossy by design, about 1e-3 of the hidden states).
- `quantize="int8"`: `Int8Linear` (`int8.py`), and attention's query, key and value in one int8 product (the fused
  block of `fused.py` with the int8 kernel): int8 weights, activations quantized per token at run time, lossy by
  design (docs/cpu-inference.md measures it).

`compile=True` adds to each mode its compiled path (`compiled.py`): the forward under torch.compile on a few padded
shapes; int8's traces its kernels, the fp32 modes' trace theirs too, with max-autotune for the plain products, and
bf16's its products and attention; the fp32 and bf16 paths run the compiled graph only on the shapes where it was
measured faster than their eager forward. `compile="aot"` (`aot.py`) instead exports the forward once, with dynamic
shapes, and compiles it ahead of time into a package kept on disk (fp32 and bf16; int8 runs `compile=True`'s path).

Each mode is a row of MODES, its steps in order. The arguments are checked in one place, and everything a mode
needs (a C++ compiler, a model it can compile) before anything changes: a refused call changes nothing, and a call
that fails while swapping puts every module back. `inference_mode_of(model)` says which mode was applied and what
runs now: where its kernels cannot run on this CPU or on the model's dtype or device, why (the call also warns);
after `.half()`, `.to("meta")` or PEFT's wrappers, which swapped layers or blocks run their plain computation, and
why.

Which kernel is faster depends on the CPU and on the rows per product (oneDNN's packed product beats MKL's sgemm at
few rows and on AVX-512, and loses to it on Zen 3's AVX2 at many): in the fp32 modes every candidate layer or block
is timed against the plain computation at a few row counts (`measured.py`, once per process and shape), and each
call runs what was faster for its row count. A layer whose kernel never wins stays `nn.Linear`, so an optimized
model is never slower than the plain one. `kernels="always"` runs the kernels everywhere (accuracy checks).

The swap is the way torchao's `quantize_` and transformers' quantizers work: the model's own modules are replaced,
its parameters are not. The same Parameter objects stay in place (an optimizer made before keeps training them,
`requires_grad` flags are kept), `parameters()`, `num_parameters()`, `state_dict()` and `save_pretrained()` are
what they were, bit for bit, and training, gradients, torch.compile and tracing run the plain computation (a user's
torch.compile; `compile=True`, `compiled.py`, compiles the int8 kernels themselves).
`restore_weights(model)` swaps the model's own modules back. The packed copy of a weight loaded from safetensors
replaces it in memory where only the kernel reads it: its file-backed pages are let go (`release_resident_pages`).

On a CPU it also asks malloc to keep freed activation memory for the next forward (`allocator.py`: process-wide,
glibc only): without that, every forward of a large batch faults its activations' pages in anew.

Small layers (classifiers) stay as they are, and so, in the fp32 modes, do layers whose weight is shared (the
masked-LM decoder tied to the word embeddings). The int8 and bf16 modes swap that decoder too, SPLADE's vocabulary
projection (`hfbert.tools.sparse`), which costs as much as the encoder: the swapped decoder holds the same Parameter
as the embeddings (the tie is kept, through `restore_weights` too), its int8 or bf16 form is its own cache, and the
form follows the shared weight as any other. Their contract for sparse (SPLADE) vectors is SPARSE_BOUNDS.

Where the kernels cannot run (GPU, fp16/fp64, bf16 on CPUs that emulate it, a torch without oneDNN, non-x86 CPUs)
nothing is swapped, the model runs as before and the call warns: `packed_layers(model)` says
what was swapped, `inference_mode_of(model)` why nothing was.

The forms follow the parameters (`swapped.py` says how), `.data` writes and PEFT's `merge_and_unload()` included
(a sample of each parameter is compared at every call that runs a kernel); after a `.data` write that changes only
a few elements, which that sample may miss, call `refresh(model)`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from hfbert.inference.aot import AOT_ROUTES, aot_forward, aot_target
from hfbert.inference.bf16 import BF16, BF16Linear, bf16_available
from hfbert.inference.compiled import (
    COMPILED_BF16,
    COMPILED_FP32,
    COMPILED_INT8,
    check_compiler,
    compile_forward,
    compile_target,
    uncompile,
)
from hfbert.inference.fused import (
    FUSED_BLOCKS,
    FusedAttention,
    FusedBlock,
    FusedIntermediate,
    attention_projection,
    block_candidates,
)
from hfbert.inference.int8 import INT8, Int8Linear, int8_available
from hfbert.inference.measured import ROW_BUCKETS, Candidate, measured_choice
from hfbert.inference.packed import BLOCKED, MIN_PACKED_WEIGHTS, PackedLinear, linear_candidates, packing_supported
from hfbert.inference.swapped import Kernel, Swapped, swapped_modules
from hfbert.platform.allocator import keep_freed_memory
from hfbert.platform.mkl import warn_if_too_late

QUANTIZATIONS = ("int8",)
# `compile`'s values beside True and False, as the command line spells them (`aot.py`).
COMPILE_CHOICES = ("aot",)
# Each precision's contract: RMS error against float64, on every output, at most this many times transformers' own
# fp32 error (docs/numerical-contract.md, measured by `python -m benchmarks.numerical_contract`).
ACCURACY_BOUNDS = {"highest": 1.5, "high": 3.0}
# bf16 rounds each product's inputs and outputs to 8 bits: its error is about 2**-9 of a value, thousands of times
# fp32's, so its contract is not a multiple of fp32's error but OpenVINO bf16's error on the same inputs (`bf16.py`).
PRECISIONS = (*ACCURACY_BOUNDS, "bf16")
# The lossy modes' contract for sparse (SPLADE) vectors, whose vocabulary projection they run in int8 or bf16 too:
# (relative RMS, largest element-wise error) of the vectors against float64, each over the float64 vectors' RMS and
# largest weight (docs/numerical-contract.md, tests/test_sparse_quantized.py). The projection adds little to the
# encoder's own error: the weights are log1p(relu(logit)), which moves no more than the logit does.
SPARSE_BOUNDS = {"int8": (0.2, 0.35), "bf16": (0.03, 0.05)}
# "measured": each swapped block runs, at each row count, what was measured fastest here (the plain computation
# included). "always": every swapped block runs its most fused kernel, whatever its speed (for accuracy checks).
KERNEL_CHOICES = ("measured", "always")
# int8 pays on smaller products than packing does (all-MiniLM-L6-v2's 384 x 384 attention projections), but a
# classifier's few outputs keep their fp32 weights: they are cheap, and their rounding would land on the logits.
MIN_INT8_WEIGHTS = 2**16


@dataclass(frozen=True)
class Mode:
    """One way `optimize_for_inference` can make a model fast: its steps, in order, and what it needs here."""

    name: str
    steps: tuple[Callable[[nn.Module, str], None], ...]  # (model, kernels) -> swaps or compiles, in place
    available: Callable[[], bool]  # whether this torch build and CPU run its kernels
    needs: str  # what `available` checks, for the warning where it is False
    dtypes: Callable[[], tuple[torch.dtype, ...]]  # the parameter dtypes its kernels run here


@dataclass(frozen=True)
class AppliedMode:
    """What `optimize_for_inference` applied to a model, and what runs now (`inference_mode_of`)."""

    mode: str  # a name of MODES: "fp32", "fp32 high", "int8", "int8 compiled"
    kernels: str  # "measured" or "always"
    swapped: int  # how many layers and blocks run a kernel now (at some row counts at least)
    unavailable: str | None = None  # why its kernels could run nowhere in this model when it was applied
    plain: str | None = None  # which swapped layers or blocks run their plain computation now, and why

    def __str__(self) -> str:
        if self.plain is not None:
            return f"{self.mode} (kernels={self.kernels!r}): {self.swapped} layers or blocks run a kernel; {self.plain}"
        said = f"{self.mode} (kernels={self.kernels!r}): {self.swapped} layers or blocks swapped"
        return said if self.unavailable is None else f"{said}; {self.unavailable}"


def optimize_for_inference(
    model: nn.Module,
    quantize: str | None = None,
    precision: str = "highest",
    kernels: str = "measured",
    compile: bool | str = False,
) -> nn.Module:
    """Put `model` in eval mode and swap its large linear layers for packed (or, with `quantize="int8"`, int8)
    ones, in place. Returns the model, for chaining. Calling it again re-optimizes (int8 after packed, say).

    `precision="highest"` (the default) keeps the model as accurate as transformers (RMS error against float64 at
    most 1.5x transformers' own); `precision="high"` is the fast fp32 mode of `fused.py` (at most 3x): query, key
    and value in one product, post-ops fused, whole-width packed weights; `precision="bf16"` (`bf16.py`), on CPUs
    that compute bf16 natively, runs the products in bf16 and the rest in fp32, at most OpenVINO bf16's error.
    `kernels="measured"` (the default): a
    packed or fused kernel runs only at the row counts where it was measured faster than the plain model on this
    machine (`measured.py`), so an optimized model is never slower than the plain one; `kernels="always"` runs
    it everywhere (to check its accuracy on an instruction set).

    `compile=True` runs the model's plain inference calls under torch.compile, on a few padded shapes
    (`compiled.py`), a compilation of tens of seconds per new shape (cached by inductor for later processes), a C++
    compiler needed (RuntimeError naming it where there is none). With `quantize="int8"`: the int8 kernels, the
    ops between them fused, the same arithmetic. In fp32 (either precision): the mode's kernels traced, inductor's
    C++ GEMM template timed against ATen where the mode runs `F.linear` (max-autotune), held to the precision's
    contract; with `kernels="measured"` each shape's
    compiled graph is timed against the eager mode's forward when first compiled, and the faster runs. In bf16:
    its products and attention traced, the fp32 ops between them fused (its contract), each shape timed likewise.

    `compile="aot"` (`aot.py`): the forward exported once with a dynamic batch and token dimension and compiled by
    AOTInductor into a package kept on disk, keyed by the weights, torch and the CPU (a later process loads it in
    a fraction of a second), called without Python between its ops; fp32 (either precision) and bf16 (products
    under autocast), each held to its precision's contract. int8 has no AOT route (its packed int8 weights cannot be
    exported): with `quantize="int8"` it runs `compile=True`'s path.

    Where the mode's kernels cannot run here (this CPU or torch build, the model's dtype or device), the model
    stays plain and the call warns; `inference_mode_of(model)` says what was applied. On an AMD CPU where hfbert
    would run MKL's faster branch but MKL had already run before `import hfbert`, it warns once, naming the setting
    (`hfbert.platform.mkl`)."""
    mode = MODES[_mode_key(quantize, precision, kernels, compile)]
    warn_if_too_late()  # MKL's products are the plain computation every kernel is measured against
    if compile == "aot" and quantize is None:
        aot_target(model)  # a model the AOT path runs, before anything changes
    elif compile:
        compile_target(model)  # a model the compiled path runs, before anything changes
    unavailable = _unavailable(mode, model)
    if compile and unavailable is None:
        check_compiler()
    with _AllOrNothing(model):
        restore_weights(model)
        model.eval()
        if unavailable is None:
            for step in mode.steps:
                step(model, kernels)
    if any(parameter.device.type == "cpu" for parameter in model.parameters()):
        keep_freed_memory()
    if unavailable is not None:
        warnings.warn(f"optimize_for_inference: {unavailable}; the model runs as before", stacklevel=2)
    model.__dict__["_hfbert_inference_mode"] = AppliedMode(mode.name, kernels, len(packed_layers(model)), unavailable)
    return model


def _mode_key(quantize: str | None, precision: str, kernels: str, compile: bool | str) -> tuple:
    """The arguments checked, each against its choices, then as a combination: the key of their row of MODES."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZATIONS)}, not {quantize!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, not {precision!r}")
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNEL_CHOICES))}, not {kernels!r}")
    aot = isinstance(compile, str) and compile == "aot"
    if not aot and compile not in (True, False):
        raise ValueError(f"compile must be True, False or 'aot', not {compile!r}")
    key = (quantize, precision, "aot" if aot else bool(compile))
    if key not in MODES and precision == "bf16":
        raise ValueError(f"precision='bf16' runs its products in bf16, not int8: quantize={quantize!r} is refused")
    if key not in MODES:
        raise ValueError(f"precision={precision!r} is an fp32 mode: it cannot be combined with quantize={quantize!r}")
    return key


def _unavailable(mode: Mode, model: nn.Module) -> str | None:
    """Why `mode`'s kernels can run nowhere in `model` here, or None where they can."""
    if not mode.available():
        return f"mode {mode.name!r} needs {mode.needs}, which this torch build or CPU lacks"
    parameters = [parameter for parameter in model.parameters() if parameter.is_floating_point()]
    dtypes = mode.dtypes()
    if parameters and not any(p.device.type == "cpu" and p.dtype in dtypes for p in parameters):
        kinds = sorted({f"{p.dtype} on {p.device.type}" for p in parameters})
        runs = ", ".join(str(dtype) for dtype in dtypes)
        return f"mode {mode.name!r} runs {runs} on the CPU, and the model's parameters are {', '.join(kinds)}"
    return None


class _AllOrNothing:
    """A context in which `model`'s modules may be swapped and put in eval mode: on an exception, every module is
    put back where it was, in the mode it was in, and the forward compiled or not as it was."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.children = [(module, dict(module._modules)) for module in self.model.modules()]
        self.training = [(module, module.training) for module in self.model.modules()]
        self.forwards = [(module, module.__dict__.get("forward")) for module in self.model.modules()]
        self.applied = self.model.__dict__.get("_hfbert_inference_mode")  # the record, not what runs now

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            return
        for module, children in self.children:
            module._modules.clear()
            module._modules.update(children)
        for module, training in self.training:
            module.training = training
        for module, forward in self.forwards:
            module.__dict__.pop("forward", None)
            if forward is not None:
                module.__dict__["forward"] = forward
        if self.applied is not None:
            self.model.__dict__["_hfbert_inference_mode"] = self.applied


def _choice(kernels: str, key: tuple, candidates: list[Candidate]) -> tuple[int, ...]:
    if kernels == "always":
        return (len(candidates) - 1,) * len(ROW_BUCKETS)
    return measured_choice(key, candidates)


def _linear_choice(kernels: str, layer: nn.Linear) -> tuple[int, ...]:
    shape = (layer.out_features, layer.in_features, layer.weight.dtype)
    return _choice(kernels, ("linear", *shape), linear_candidates(*shape))


# -- the steps ------------------------------------------------------------------------------------------------------
def _swap_packed_linears(model: nn.Module, kernels: str) -> None:
    linears = _linears(model, BLOCKED, MIN_PACKED_WEIGHTS)
    choices = {name: _linear_choice(kernels, model.get_submodule(name)) for name in linears}
    packed = [name for name in linears if any(choices[name])]
    _swap(model, packed, lambda name, layer: PackedLinear.from_linear(layer, _choice=choices[name]))


def _swap_fused_blocks(model: nn.Module, kernels: str) -> None:
    blocks = _fused_blocks(model, FusedBlock.kernel)
    choices = {name: _choice(kernels, *block_candidates(model.get_submodule(name))) for name in blocks}
    fused = [name for name in blocks if any(choices[name])]
    _swap(model, fused, lambda name, block: FUSED_BLOCKS[type(block)].from_block(block, choices[name]))


def _swap_attention(model: nn.Module, kernel: Kernel, kernels: str) -> None:
    """Attention's query, key and value in one product of `kernel`, at every row count: the int8 and bf16 products
    beat fp32's wherever they were measured (docs/cpu-inference.md). A kernel with an output of its own precision
    (bf16) hands it to attention as it is where that was measured faster than attention in fp32 (way 2, else 1)."""
    attention = [
        name
        for name in _fused_blocks(model, kernel)
        if (projection := attention_projection(model.get_submodule(name))) is not None
        and projection.weight.numel() >= MIN_INT8_WEIGHTS
    ]

    def make(name: str, block: nn.Module) -> FusedAttention:
        choice = (1,) * len(ROW_BUCKETS)
        if kernel.run_native is not None:
            heads, hidden = block.num_heads, attention_projection(block).out_features
            key = ("attention precision", kernel.name, heads, hidden // heads)
            candidates = FusedAttention.precision_candidates(heads, hidden // heads, torch.bfloat16)
            choice = tuple(1 + way for way in _choice(kernels, key, candidates))
        return FUSED_BLOCKS[type(block)].from_block(block, choice, kernel=kernel)

    _swap(model, attention, make)


def _swap_int8_attention(model: nn.Module, kernels: str) -> None:
    _swap_attention(model, INT8, kernels)


def _swap_bf16_attention(model: nn.Module, kernels: str) -> None:
    _swap_attention(model, BF16, kernels)


def _swap_bf16_intermediates(model: nn.Module, kernels: str) -> None:
    fused = _fused_blocks(model, BF16)
    blocks = [name for name in fused if FUSED_BLOCKS[type(model.get_submodule(name))] is FusedIntermediate]

    def make(name: str, block: nn.Module) -> FusedIntermediate:
        choice = (FusedIntermediate.gelu_choice(block),) * len(ROW_BUCKETS)
        return FusedIntermediate.from_block(block, choice, kernel=BF16)

    _swap(model, blocks, make)


def _swap_bf16_linears(model: nn.Module, kernels: str) -> None:
    # The same smallest layer as int8's: a classifier's few outputs stay fp32, their rounding would land on logits.
    _swap_lossy_linears(model, BF16Linear)


def _swap_int8_linears(model: nn.Module, kernels: str) -> None:
    _swap_lossy_linears(model, Int8Linear)


def _swap_lossy_linears(model: nn.Module, linear_class: type[BF16Linear | Int8Linear]) -> None:
    """Every large linear layer in `linear_class` (int8 or bf16), the vocabulary projection too: a masked-LM
    decoder whose weight is the word embeddings' (SPLADE's projection, as costly as the encoder). The swap keeps that
    Parameter, so the tie holds; the kernel's form is the swapped decoder's cache, and the shared weight stays in RAM
    (the embeddings read it)."""
    shared = _shared_weights(model)
    _swap(
        model,
        _linears(model, linear_class.kernel, MIN_INT8_WEIGHTS, tied=True),
        lambda name, layer: linear_class.from_linear(layer, _keep_pages=id(layer.weight) in shared),
    )


def _compile_int8(model: nn.Module, kernels: str) -> None:
    compile_forward(model, COMPILED_INT8)


def _compile_bf16(model: nn.Module, kernels: str) -> None:
    compile_forward(model, COMPILED_BF16, measured=True)


def _compile_fp32(model: nn.Module, kernels: str) -> None:
    # "measured": each shape's graph timed against the eager mode's forward, the faster kept (`compiled.py`).
    compile_forward(model, COMPILED_FP32, measured=kernels == "measured")


def _aot(model: nn.Module, kernels: str) -> None:
    aot_forward(model, AOT_ROUTES["highest"])


def _aot_high(model: nn.Module, kernels: str) -> None:
    aot_forward(model, AOT_ROUTES["high"])


def _aot_bf16(model: nn.Module, kernels: str) -> None:
    aot_forward(model, AOT_ROUTES["bf16"])


def _fp32() -> tuple[torch.dtype, ...]:
    return (torch.float32,)


def _packed_dtypes() -> tuple[torch.dtype, ...]:
    # bf16 where the CPU computes it natively (elsewhere oneDNN would emulate it slowly: `packing_supported`).
    return (torch.float32,) + ((torch.bfloat16,) if packing_supported(torch.bfloat16) else ())


# The modes: (quantize, precision, compile) -> what `optimize_for_inference` does.
MODES: dict[tuple, Mode] = {
    (None, "highest", False): Mode("fp32", (_swap_packed_linears,), packing_supported, "oneDNN on x86", _packed_dtypes),
    (None, "high", False): Mode(
        "fp32 high", (_swap_fused_blocks, _swap_packed_linears), packing_supported, "oneDNN on x86", _fp32
    ),
    (None, "bf16", False): Mode(
        "bf16",
        (_swap_bf16_attention, _swap_bf16_intermediates, _swap_bf16_linears),
        bf16_available,
        "a CPU that computes bf16 natively (AVX512-BF16 or AMX) and torch's oneDNN",
        _fp32,
    ),
    ("int8", "highest", False): Mode(
        "int8", (_swap_int8_attention, _swap_int8_linears), int8_available, "oneDNN's int8 kernel (x86, AVX2)", _fp32
    ),
    (None, "highest", True): Mode(
        "fp32 compiled", (_swap_packed_linears, _compile_fp32), packing_supported, "oneDNN on x86", _fp32
    ),
    (None, "high", True): Mode(
        "fp32 high compiled",
        (_swap_fused_blocks, _swap_packed_linears, _compile_fp32),
        packing_supported,
        "oneDNN on x86",
        _fp32,
    ),
    (None, "bf16", True): Mode(
        "bf16 compiled",
        (_swap_bf16_attention, _swap_bf16_intermediates, _swap_bf16_linears, _compile_bf16),
        bf16_available,
        "a CPU that computes bf16 natively (AVX512-BF16 or AMX) and torch's oneDNN",
        _fp32,
    ),
    ("int8", "highest", True): Mode(
        "int8 compiled",
        (_swap_int8_attention, _swap_int8_linears, _compile_int8),
        int8_available,
        "oneDNN's int8 kernel (x86, AVX2)",
        _fp32,
    ),
}
# compile="aot" (`aot.py`): the eager mode's swaps (for the calls the package does not cover), then the package. int8
# has no AOT route (its packed int8 weights cannot be exported): it runs compile=True's path, under its name.
MODES |= {
    (None, "highest", "aot"): Mode("fp32 aot", (_swap_packed_linears, _aot), packing_supported, "oneDNN on x86", _fp32),
    (None, "high", "aot"): Mode(
        "fp32 high aot",
        (_swap_fused_blocks, _swap_packed_linears, _aot_high),
        packing_supported,
        "oneDNN on x86",
        _fp32,
    ),
    (None, "bf16", "aot"): Mode(
        "bf16 aot",
        (_swap_bf16_attention, _swap_bf16_intermediates, _swap_bf16_linears, _aot_bf16),
        bf16_available,
        "a CPU that computes bf16 natively (AVX512-BF16 or AMX) and torch's oneDNN",
        _fp32,
    ),
    ("int8", "highest", "aot"): MODES[("int8", "highest", True)],
}


def _fused_blocks(model: nn.Module, kernel: Kernel) -> list[str]:
    """The blocks a fused product can compute: the model's own attention, intermediate and output blocks whose
    projections are plain `nn.Linear` layers (not a user's replacement or PEFT's LoRA wrapper, whose own forward
    must run) with weights `kernel` runs here."""
    return [
        name
        for name, block in model.named_modules()
        if type(block) in FUSED_BLOCKS
        and all(
            type(linear) is nn.Linear and kernel.supports(linear.weight)
            for linear in FUSED_BLOCKS[type(block)].linears(block)
        )
    ]


def restore_weights(model: nn.Module) -> nn.Module:
    """Undo `optimize_for_inference`: every swapped layer or block is the model's own class again, with the same
    parameters, and the forward the class's own (not compiled)."""
    uncompile(model)
    swapped = [name for name, module in model.named_modules() if isinstance(module, Swapped)]
    _swap(model, swapped, lambda name, module: module.swap_out())
    model.__dict__.pop("_hfbert_inference_mode", None)
    return model


def packed_layers(model: nn.Module) -> dict[str, str]:
    """Name -> "packed", "int8" or "fused" for every layer or block that `optimize_for_inference` swapped and that
    runs its kernel on its current weights here, at some row counts at least (a model moved to float64 runs the
    plain computation everywhere: none; nor does a block whose projections PEFT wrapped since)."""
    return {
        name: module.kernel.name
        for name, module in model.named_modules()
        if isinstance(module, Swapped) and module.runs_kernel()
    }


def inference_mode_of(model: nn.Module) -> AppliedMode | None:
    """What `optimize_for_inference` applied to `model` (its mode, and why its kernels run nowhere where they
    cannot) and what runs now: after `.half()`, `.to("meta")`, `.double()`, training mode or PEFT's wrappers around
    a fused block's projections, the swapped layers or blocks that run their plain computation, and why. None for a
    model it did not optimize (or `restore_weights` restored)."""
    applied = model.__dict__.get("_hfbert_inference_mode")
    if applied is None:
        return None
    swapped = swapped_modules(model)
    plain = [module for module in swapped if module.trains_plain or not module.runs_kernel()]
    said = _why_plain(applied.mode, plain, len(swapped)) if plain else None
    return dataclasses.replace(applied, swapped=len(swapped) - len(plain), plain=said)


def _why_plain(mode_name: str, plain: list[Swapped], swapped: int) -> str:
    """`plain` (swapped modules that run their plain computation now) said with why, for `inference_mode_of`."""
    reasons = []
    kinds = sorted(
        {
            f"{parameter.dtype} on {parameter.device.type}"
            for module in plain
            if not module.can_build()
            for parameter in module.form_parameters()
            if parameter is not None
        }
    )
    if kinds:
        mode = next(mode for mode in MODES.values() if mode.name == mode_name)
        runs = ", ".join(str(dtype) for dtype in mode.dtypes())
        reasons.append(f"their parameters are {', '.join(kinds)}, and mode {mode_name!r} runs {runs} on the CPU")
    if any(module.can_build() and not module.runs_kernel() for module in plain):
        reasons.append("the projections a fused block computes are wrapped (PEFT's LoRA) or replaced")
    if any(module.runs_kernel() for module in plain):
        reasons.append("the model is in training mode, where a fused block runs its own computation")
    count = f"all {swapped}" if len(plain) == swapped else f"{len(plain)} of the {swapped}"
    return f"plain: {count} swapped layers or blocks run their plain computation: {'; '.join(reasons)}"


def _shared_weights(model: nn.Module) -> set[int]:
    """The ids of the parameters that more than one module holds (tied weights)."""
    uses = Counter(id(parameter) for _, parameter in model.named_parameters(remove_duplicate=False))
    return {key for key, count in uses.items() if count > 1}


def _linears(model: nn.Module, kernel: Kernel, min_weights: int, tied: bool = False) -> list[str]:
    """The `nn.Linear` layers worth swapping for `kernel`: large enough, plain, not computed by a fused block (whose
    plain way runs them as nn.Linear; MPNet's `attn.o`, which its fused block calls as a module, is swapped as any
    other), and owning their weight unless `tied` (the lossy modes swap a masked-LM decoder too: the swap keeps the
    shared Parameter, so the tie holds through the swap and `restore_weights`; the fp32 modes leave it as it is)."""
    shared = set() if tied else _shared_weights(model)
    fused = {
        id(layer) for module in model.modules() if isinstance(module, FusedBlock) for layer in module.inner_modules()
    }
    return [
        name
        for name, layer in model.named_modules()
        if type(layer) is nn.Linear
        and kernel.supports(layer.weight)
        and id(layer) not in fused
        and id(layer.weight) not in shared
        and layer.weight.numel() >= min_weights
    ]


def _swap(model: nn.Module, names: list[str], make) -> None:
    # Every new module is built before any is put in place: a failure changes nothing.
    replacements = {name: make(name, model.get_submodule(name)) for name in names}
    for name, layer in replacements.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
