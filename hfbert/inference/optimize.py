"""Make a built model fast for CPU inference, from outside: its linear layers or blocks swapped for faster ones.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model)  # eval mode; what is measured faster here, swapped in
    >>> with torch.no_grad():
    ...     out = model(input_ids=torch.tensor([[101, 102]]))

Three modes, each with its numerical contract (ACCURACY_BOUNDS; docs/numerical-contract.md measures them):

- fp32, `precision="highest"` (the default): large `nn.Linear` layers may become `PackedLinear` (`packed.py`), whose
  weight is packed once into oneDNN's blocked layout and summed in blocks, so the error against float64 stays
  transformers' own (at most 1.5x); a bf16 model is packed too on CPUs that compute bf16 natively.
- fp32, `precision="high"`: the fast mode of `fused.py`, at most 3x transformers' error: query, key and value in
  one product, GELU and the residual add as oneDNN post-ops, whole-width packed weights.
- `quantize="int8"`: `Int8Linear` and `Int8SelfAttention` (query, key and value in one product; `int8.py`): int8
  weights, activations quantized per token at run time, lossy by design (docs/cpu-inference.md measures it);
  with `compile=True`, its forward runs under torch.compile on a few padded shapes (`compiled.py`).

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

Layers whose weight is shared (the masked-LM decoder tied to the word embeddings) and small layers (classifiers)
stay as they are. Where the kernels cannot run (GPU, fp16/fp64, bf16 on CPUs that emulate it, a torch without
oneDNN, non-x86 CPUs) nothing is swapped and the model runs as before: `packed_layers(model)` says what was.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from hfbert.inference.allocator import keep_freed_memory
from hfbert.inference.compiled import check_compiler, compile_forward, uncompile
from hfbert.inference.fused import FUSED_BLOCKS, FusedBlock, block_candidates
from hfbert.inference.int8 import Int8Linear, Int8SelfAttention, int8_available
from hfbert.inference.measured import ROW_BUCKETS, Candidate, measured_choice
from hfbert.inference.packed import MIN_PACKED_WEIGHTS, PackedLinear, can_pack, linear_candidates, packing_supported
from hfbert.inference.swapped import InferenceLinear
from hfbert.modeling.model import BertSelfAttention

QUANTIZATIONS = ("int8",)
# Each precision's contract: RMS error against float64, on every output, at most this many times transformers' own
# fp32 error (docs/numerical-contract.md, measured by `python -m benchmarks.numerical_contract`).
ACCURACY_BOUNDS = {"highest": 1.5, "high": 3.0}
# "measured": each swapped block runs, at each row count, what was measured fastest here (the plain computation
# included). "always": every swapped block runs its most fused kernel, whatever its speed (for accuracy checks).
KERNEL_CHOICES = ("measured", "always")
# int8 pays on smaller products than packing does (all-MiniLM-L6-v2's 384 x 384 attention projections), but a
# classifier's few outputs keep their fp32 weights: they are cheap, and their rounding would land on the logits.
MIN_INT8_WEIGHTS = 2**16


def optimize_for_inference(
    model: nn.Module,
    quantize: str | None = None,
    precision: str = "highest",
    kernels: str = "measured",
    compile: bool = False,
) -> nn.Module:
    """Put `model` in eval mode and swap its large linear layers for packed (or, with `quantize="int8"`, int8)
    ones, in place. Returns the model, for chaining. Calling it again re-optimizes (int8 after packed, say).

    `precision="highest"` (the default) keeps the model as accurate as transformers (RMS error against float64 at
    most 1.5x transformers' own); `precision="high"` is the fast fp32 mode of `fused.py` (at most 3x): query, key
    and value in one product, post-ops fused, whole-width packed weights. `kernels="measured"` (the default): a
    packed or fused kernel runs only at the row counts where it was measured faster than the plain model on this
    machine (`measured.py`), so an optimized model is never slower than the plain one; `kernels="always"` runs
    it everywhere (to check its accuracy on an instruction set).

    `compile=True` (with `quantize="int8"`) runs the int8 model's plain inference calls under torch.compile, on a
    few padded shapes (`compiled.py`): faster on short inputs, the same arithmetic, a compilation of tens of seconds
    per new shape, and a C++ compiler needed (RuntimeError naming it where there is none)."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZATIONS)}, not {quantize!r}")
    if precision not in ACCURACY_BOUNDS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, ACCURACY_BOUNDS))}, not {precision!r}")
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {', '.join(map(repr, KERNEL_CHOICES))}, not {kernels!r}")
    if quantize is not None and precision != "highest":
        raise ValueError(f"precision={precision!r} is an fp32 mode: it cannot be combined with quantize={quantize!r}")
    if compile and quantize != "int8":
        # Measured (docs/cpu-inference.md): compiling the fp32 modes gains nothing over their eager kernels.
        raise ValueError("compile=True is offered with quantize='int8' only, where it was measured to pay")
    if compile and int8_available():
        check_compiler()  # before anything changes
    restore_weights(model)
    model.eval()
    if any(parameter.device.type == "cpu" for parameter in model.parameters()):
        keep_freed_memory()
    if quantize == "int8":
        if int8_available():
            attention = [
                name
                for name in _fused_blocks(model)
                if isinstance(block := model.get_submodule(name), BertSelfAttention)
                and block.query.weight.numel() >= MIN_INT8_WEIGHTS
            ]
            _swap(model, attention, lambda name, block: Int8SelfAttention.from_block(block, (1,) * len(ROW_BUCKETS)))
            _swap(
                model,
                _linears(model, MIN_INT8_WEIGHTS, inside=_fused(model)),
                lambda name, layer: Int8Linear.from_linear(layer),
            )
            if compile:
                compile_forward(model)
        return model
    if precision == "high" and packing_supported(torch.float32):
        blocks = _fused_blocks(model)
        choices = {name: _choice(kernels, *block_candidates(model.get_submodule(name))) for name in blocks}
        fused = [name for name in blocks if any(choices[name])]
        _swap(model, fused, lambda name, block: FUSED_BLOCKS[type(block)].from_block(block, choices[name]))
    linears = _linears(model, MIN_PACKED_WEIGHTS, inside=_fused(model))
    choices = {name: _linear_choice(kernels, model.get_submodule(name)) for name in linears}
    packed = [name for name in linears if any(choices[name])]
    _swap(model, packed, lambda name, layer: _packed_layer(layer, choices[name]))
    return model


def _choice(kernels: str, key: tuple, candidates: list[Candidate]) -> tuple[int, ...]:
    if kernels == "always":
        return (len(candidates) - 1,) * len(ROW_BUCKETS)
    return measured_choice(key, candidates)


def _linear_choice(kernels: str, layer: nn.Linear) -> tuple[int, ...]:
    shape = (layer.out_features, layer.in_features, layer.weight.dtype)
    return _choice(kernels, ("linear", *shape), linear_candidates(*shape))


def _packed_layer(layer: nn.Linear, choice: tuple[int, ...]) -> PackedLinear:
    # Where some row counts run F.linear, it reads the plain weight: its pages stay in memory.
    return PackedLinear.from_linear(layer, _choice=choice, _keep_pages=0 in choice)


def _fused_blocks(model: nn.Module) -> list[str]:
    """The blocks the fast mode swaps: the model's own attention, intermediate and output blocks, fp32 on the CPU,
    with plain linear layers (not already swapped or replaced by a user's)."""
    names = []
    for name, block in model.named_modules():
        if type(block) not in FUSED_BLOCKS:
            continue
        linears = [module for module in block.children() if isinstance(module, nn.Linear)]
        if all(type(linear) is nn.Linear and can_pack(linear.weight) for linear in linears) and all(
            linear.weight.dtype == torch.float32 for linear in linears
        ):
            names.append(name)
    return names


def restore_weights(model: nn.Module) -> nn.Module:
    """Undo `optimize_for_inference`: every swapped layer is a plain `nn.Linear` again, with the same parameters,
    and the forward the class's own (not compiled)."""
    uncompile(model)
    swapped = [name for name, module in model.named_modules() if isinstance(module, InferenceLinear)]
    _swap(model, swapped, lambda name, layer: layer.to_linear())
    fused = [name for name, module in model.named_modules() if isinstance(module, FusedBlock)]
    _swap(model, fused, lambda name, block: block.to_block())
    return model


def packed_layers(model: nn.Module) -> dict[str, str]:
    """Name -> "packed", "int8" or "fused" for every layer or block that `optimize_for_inference` swapped and that
    runs its kernel on its current weights here, at some row counts at least (a model moved to float64 runs the
    plain computation everywhere: none)."""
    forms = {}
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear) and can_pack(module.weight):
            forms[name] = "packed"
        elif isinstance(module, Int8Linear) and module.supports(module.weight):
            forms[name] = "int8"
        elif isinstance(module, FusedBlock) and module.can_build():
            forms[name] = "int8" if isinstance(module, Int8SelfAttention) else "fused"
    return forms


def _fused(model: nn.Module) -> tuple[str, ...]:
    """Name prefixes of the fused blocks: the linear layers inside them are computed by their block (whose plain way
    runs them as nn.Linear)."""
    return tuple(f"{name}." for name, module in model.named_modules() if isinstance(module, FusedBlock))


def _linears(model: nn.Module, min_weights: int, inside: tuple[str, ...]) -> list[str]:
    """The `nn.Linear` layers worth swapping: large enough, plain, not `inside` a fused block, and owning their
    weight (a tied weight must stay one parameter of one module, or the tie would break when a swap is undone)."""
    uses = Counter(id(parameter) for _, parameter in model.named_parameters(remove_duplicate=False))
    return [
        name
        for name, layer in model.named_modules()
        if type(layer) is nn.Linear
        and not name.startswith(inside)
        and uses[id(layer.weight)] == 1
        and layer.weight.numel() >= min_weights
        and can_pack(layer.weight)
    ]


def _swap(model: nn.Module, names: list[str], make) -> None:
    # Every new module is built before any is put in place: a failure changes nothing.
    replacements = {name: make(name, model.get_submodule(name)) for name in names}
    for name, layer in replacements.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
