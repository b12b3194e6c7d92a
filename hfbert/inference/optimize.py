"""Make a built model fast for CPU inference, from outside: its linear layers swapped for packed or int8 ones.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model)  # eval mode, large linear layers packed for oneDNN
    >>> with torch.no_grad():
    ...     out = model(input_ids=torch.tensor([[101, 102]]))

fp32 (the default): every large `nn.Linear` becomes a `PackedLinear` (`packed.py`), whose weight is packed once
into oneDNN's blocked layout and summed in blocks, so the error against float64 stays transformers' own; a bf16
model is packed too on CPUs that compute bf16 natively. `quantize="int8"`: they become `Int8Linear` (`int8.py`):
int8 weights, activations quantized per token at run time, lossy by design (docs/cpu-inference.md measures it).

The swap is the way torchao's `quantize_` and transformers' quantizers work: the model's own modules are replaced,
its parameters are not. The same Parameter objects stay in place (an optimizer made before keeps training them,
`requires_grad` flags are kept), `parameters()`, `num_parameters()`, `state_dict()` and `save_pretrained()` are
what they were, bit for bit, and training, gradients, torch.compile and tracing run the plain `F.linear`.
`restore_weights(model)` swaps the plain `nn.Linear` modules back. The packed copy of a weight loaded from
safetensors replaces it in memory: its file-backed pages are let go (`packed.release_resident_pages`).

On a CPU it also asks malloc to keep freed activation memory for the next forward (`allocator.py`: process-wide,
glibc only): without that, every forward of a large batch faults its activations' pages in anew.

Layers whose weight is shared (the masked-LM decoder tied to the word embeddings) and small layers (classifiers)
stay as they are. Where the kernels cannot run (GPU, fp16/fp64, bf16 on CPUs that emulate it, a torch without
oneDNN, non-x86 CPUs) nothing is swapped and the model runs as before: `packed_layers(model)` says what was.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from hfbert.inference.allocator import keep_freed_memory
from hfbert.inference.int8 import Int8Linear, SharedQuantization, int8_available
from hfbert.inference.packed import MIN_PACKED_WEIGHTS, PackedLinear, can_pack
from hfbert.inference.swapped import InferenceLinear
from hfbert.modeling.model import BertSelfAttention

QUANTIZATIONS = ("int8",)
# int8 pays on smaller products than packing does (all-MiniLM-L6-v2's 384 x 384 attention projections), but a
# classifier's few outputs keep their fp32 weights: they are cheap, and their rounding would land on the logits.
MIN_INT8_WEIGHTS = 2**16


def optimize_for_inference(model: nn.Module, quantize: str | None = None) -> nn.Module:
    """Put `model` in eval mode and swap its large linear layers for packed (or, with `quantize="int8"`, int8)
    ones, in place. Returns the model, for chaining. Calling it again re-optimizes (int8 after packed, say)."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZATIONS)}, not {quantize!r}")
    restore_weights(model)
    model.eval()
    if any(parameter.device.type == "cpu" for parameter in model.parameters()):
        keep_freed_memory()
    if quantize == "int8":
        if int8_available():
            _swap(model, _linears(model, MIN_INT8_WEIGHTS), _int8_layer(model))
    else:
        _swap(model, _linears(model, MIN_PACKED_WEIGHTS), PackedLinear.from_linear)
    return model


def restore_weights(model: nn.Module) -> nn.Module:
    """Undo `optimize_for_inference`: every swapped layer is a plain `nn.Linear` again, with the same parameters."""
    swapped = [name for name, module in model.named_modules() if isinstance(module, InferenceLinear)]
    _swap(model, swapped, lambda layer: layer.to_linear())
    return model


def packed_layers(model: nn.Module) -> dict[str, str]:
    """Name -> "packed" or "int8" for every layer that `optimize_for_inference` swapped and that runs its kernel on
    its current weight here (a model moved to float64 runs `F.linear` everywhere: none)."""
    forms = {}
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear) and can_pack(module.weight):
            forms[name] = "packed"
        elif isinstance(module, Int8Linear) and module.supports(module.weight):
            forms[name] = "int8"
    return forms


def _linears(model: nn.Module, min_weights: int) -> list[str]:
    """The `nn.Linear` layers worth swapping: large enough, plain, and owning their weight (a tied weight must stay
    one parameter of one module, or the tie would break when a swap is undone)."""
    uses = Counter(id(parameter) for _, parameter in model.named_parameters(remove_duplicate=False))
    return [
        name
        for name, layer in model.named_modules()
        if type(layer) is nn.Linear
        and uses[id(layer.weight)] == 1
        and layer.weight.numel() >= min_weights
        and can_pack(layer.weight)
    ]


def _int8_layer(model: nn.Module):
    """Int8Linear.from_linear, with attention's query, key and value of each layer sharing one quantized input."""
    shared = {}
    for attention in model.modules():
        if isinstance(attention, BertSelfAttention):
            quantization = SharedQuantization()
            shared.update({id(attention.query): quantization, id(attention.key): quantization})
            shared[id(attention.value)] = quantization
    return lambda linear: Int8Linear.from_linear(linear, _shared=shared.get(id(linear)))


def _swap(model: nn.Module, names: list[str], make) -> None:
    # Every new module is built before any is put in place: a failure changes nothing.
    replacements = {name: make(model.get_submodule(name)) for name in names}
    for name, layer in replacements.items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
