"""An optimized model computes with the weights it holds now, however they were changed, without `refresh(model)`:
PEFT's `merge_and_unload()` and `.data` writes (which no version counter sees), in-place writes under no_grad,
replaced storage, `load_state_dict`. Each optimized model is compared element-wise with transformers' BertModel
given the same weights and the same change, within a bound many times smaller than the change's own effect (what a
stale form would still compute)."""

from __future__ import annotations

import pytest
import torch
from test_compiled import SMALL, compiler

import hfbert
from hfbert.inference import packed_layers
from hfbert.inference.bf16 import bf16_available
from hfbert.inference.int8 import int8_available
from hfbert.inference.packed import packing_supported

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
bf16 = pytest.mark.skipif(not bf16_available(), reason="this CPU does not compute bf16 natively (no AVX512-BF16/AMX)")
packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
# The default mode packs layers of at least 2**19 weights (MIN_PACKED_WEIGHTS): bert-base's width.
WIDE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=1)
# mode -> (options, shape, largest element-wise difference from transformers allowed). The fp32 modes hold
# transformers' rounding (3e-6 here); int8 differs from fp32 by its quantization (up to 0.07 on outputs of about 4),
# bf16 by its roundings (up to 0.02).
MODES = {
    "highest": (dict(kernels="always"), WIDE, 5e-5),
    "high": (dict(precision="high", kernels="always"), SMALL, 5e-5),
    "int8": (dict(quantize="int8"), SMALL, 0.15),
    "bf16": (dict(precision="bf16"), SMALL, 0.06),
}
LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


def modes(*names: str):
    marks = {"int8": int8, "high": packs, "highest": packs, "bf16": bf16}
    return pytest.mark.parametrize("mode", [pytest.param(name, marks=marks[name]) for name in names])


def optimized_pair(mode: str, seed: int = 0):
    """An hfbert model optimized in `mode`, transformers' BertModel with the same weights, and the bound."""
    import transformers

    options, shape, bound = MODES[mode]
    torch.manual_seed(seed)
    model = hfbert.BertModel(hfbert.BertConfig(**shape)).eval()
    reference = transformers.BertModel(transformers.BertConfig(**shape)).eval()
    reference.load_state_dict(model.state_dict())
    hfbert.optimize_for_inference(model, **options)
    assert packed_layers(model)
    return model, reference, bound


def outputs(model: torch.nn.Module) -> torch.Tensor:
    """The last hidden states and the pooled output, of ids from a fixed generator."""
    ids = torch.randint(1000, 20000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output = model(input_ids=ids)
    return torch.cat([output.last_hidden_state.flatten(), output.pooler_output.flatten()])


def linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """Every linear layer of the encoder and the pooler (the same names in hfbert and transformers)."""
    names = [f"encoder.layer.{i}.{name}" for i in range(model.config.num_hidden_layers) for name in LINEARS]
    return [model.get_submodule(name) for name in (*names, "pooler.dense")]


def assert_follows(model, reference, bound: float, before: torch.Tensor) -> None:
    """`model` computes what `reference` does now, and what it computed `before` the change would not pass."""
    expected = outputs(reference)
    difference = float((outputs(model) - expected).abs().max())
    effect = float((before - expected).abs().max())
    assert difference < bound and 5 * bound < effect, (difference, bound, effect)


def _data_mul(layer):
    layer.weight.data.mul_(3)


def _data_copy(layer):
    layer.weight.data.copy_(layer.weight.data.flip(0))


def _bias_data_add(layer):
    layer.bias.data.add_(0.5)


def _in_place_under_no_grad(layer):
    with torch.no_grad():
        layer.weight.mul_(3)


def _data_replaced(layer):
    layer.weight.data = layer.weight.data * 3


CHANGES = {
    "weight.data.mul_": _data_mul,
    "weight.data.copy_": _data_copy,
    "bias.data.add_": _bias_data_add,
    "weight.mul_ under no_grad": _in_place_under_no_grad,
    "weight.data = new tensor": _data_replaced,
}


@modes("highest", "high", "int8", "bf16")
@pytest.mark.parametrize("change", list(CHANGES))
def test_changed_weights_are_followed(mode, change):
    model, reference, bound = optimized_pair(mode)
    before = outputs(model)
    for network in (model, reference):
        for layer in linears(network):
            CHANGES[change](layer)
    assert_follows(model, reference, bound, before)


@modes("highest", "high", "int8", "bf16")
def test_peft_merge_and_unload_is_followed(mode):
    """PEFT merges a LoRA adapter into its base layer's weight through `.data`: the merged optimized model computes
    the merged weights, as transformers' merged model does."""
    peft = pytest.importorskip("peft", reason="the LoRA test runs real PEFT")
    model, reference, bound = optimized_pair(mode)
    before = outputs(model)
    config = peft.LoraConfig(target_modules=["query", "value"], r=8, lora_alpha=32, init_lora_weights=False)
    torch.manual_seed(1)
    model = peft.get_peft_model(model, config)
    reference = peft.get_peft_model(reference, config)
    reference.load_state_dict(model.state_dict())
    assert_follows(model, reference, bound, before)  # the adapters run, forms of the base layers built
    model, reference = model.merge_and_unload(), reference.merge_and_unload()
    assert type(model) is hfbert.BertModel and packed_layers(model)
    assert_follows(model, reference, bound, before)


@modes("highest", "high", "int8", "bf16")
def test_load_state_dict_is_followed(mode):
    model, reference, bound = optimized_pair(mode)
    before = outputs(model)
    other, _, _ = optimized_pair(mode, seed=1)
    for network in (model, reference):
        network.load_state_dict(other.state_dict())
    assert_follows(model, reference, bound, before)


@pytest.mark.slow  # two compilations of a small model
@modes("int8", "bf16")
@compiler
def test_the_compiled_path_follows_data_writes(mode):
    """The compiled int8 and bf16 paths fold the weights into their graph: a `.data` write compiles it anew (the
    first call of a new graph returns its output, measured against eager or not)."""
    model, reference, bound = optimized_pair(mode)
    hfbert.optimize_for_inference(model, **MODES[mode][0], compile=True)
    before = outputs(model)
    assert hfbert.inference.compiled.compile_report(model)
    for network in (model, reference):
        for layer in linears(network):
            _data_mul(layer)
    assert_follows(model, reference, bound, before)
