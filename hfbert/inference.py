"""Make a loaded model fast for CPU inference: weights packed once, or quantized to int8.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model)  # eval mode, linear weights packed for oneDNN
    >>> with torch.no_grad():
    ...     out = model(input_ids=torch.tensor([[101, 102]]))

fp32 (the default): every large linear layer's weight is packed once into oneDNN's blocked layout, summed in
blocks so the error against float64 stays transformers' own (`hfbert/linear.py`); a bf16 model is packed too on
CPUs that compute bf16 natively. The packed blocks replace the
plain weight, so memory holds one copy; `state_dict()` and `save_pretrained()` still give the original weights bit
for bit, and `model.train()` or `restore_weights(model)` brings the plain parameters back.

`quantize="int8"`: weights int8 per output channel, activations quantized at run time (`hfbert/quantization.py`).
Lossy by design: the fp32 weights are gone, so such a model cannot be saved or trained; keep the fp32 model (or its
checkpoint) for that.

On a CPU it also asks malloc to keep freed activation memory for the next forward (`hfbert/allocator.py`:
process-wide, glibc only): without that, every forward of a large batch faults its activations' pages in anew.

Layers whose weight is shared (the masked-LM decoder tied to the word embeddings) and small layers (classifiers)
are left as they are. Elsewhere (GPU, fp16/fp64, bf16 on CPUs that emulate it, a torch without oneDNN, non-x86
CPUs) nothing is packed and the model runs as before: `packed_layers(model)` says what was.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from hfbert.allocator import keep_freed_memory
from hfbert.linear import MIN_ONEDNN_WEIGHTS, Linear

QUANTIZATIONS = ("int8",)
# int8 pays on smaller products than packing does (all-MiniLM-L6-v2's 384 x 384 attention projections), but a
# classifier's few outputs keep their fp32 weights: they are cheap, and their rounding would land on the logits.
MIN_INT8_WEIGHTS = 2**16


def optimize_for_inference(model: nn.Module, quantize: str | None = None) -> nn.Module:
    """Put `model` in eval mode and pack (or, with `quantize="int8"`, quantize) its large linear layers in place.
    Returns the model, for chaining."""
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"quantize must be None or one of {', '.join(QUANTIZATIONS)}, not {quantize!r}")
    model.eval()
    if any(parameter.device.type == "cpu" for parameter in model.parameters()):
        keep_freed_memory()
    for layer in _packable_layers(model, MIN_INT8_WEIGHTS if quantize == "int8" else MIN_ONEDNN_WEIGHTS):
        if quantize == "int8":
            layer.quantize_int8()
        else:
            layer.pack()
    return model


def restore_weights(model: nn.Module) -> nn.Module:
    """Undo the fp32 packing of `optimize_for_inference`: every layer gets its plain weight back, bit for bit."""
    for layer in model.modules():
        if isinstance(layer, Linear):
            layer.unpack()
    return model


def packed_layers(model: nn.Module) -> dict[str, str]:
    """Name -> "packed" or "int8" for every layer `optimize_for_inference` changed."""
    forms = {name: getattr(layer, "inference_form", "plain") for name, layer in model.named_modules()}
    return {name: form for name, form in forms.items() if form != "plain"}


def _packable_layers(model: nn.Module, min_weights: int) -> list[Linear]:
    uses = Counter(id(parameter) for _, parameter in model.named_parameters(remove_duplicate=False))
    return [
        layer
        for layer in model.modules()
        if isinstance(layer, Linear)
        and "weight" in layer._parameters
        and uses[id(layer.weight)] == 1  # a tied weight must stay one parameter
        and layer.weight.numel() >= min_weights
    ]
