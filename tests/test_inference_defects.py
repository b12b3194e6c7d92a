"""An optimized model stays the model it speeds up after what a user does to it (issue 32's adversarial pass): weights
changed behind the version counter (`.data` writes, `load_state_dict` of inference tensors), PEFT LoRA adapters on
the projections a fused block would read, hooks added after the compiled path compiled, and a compiled mode
refused on a model it cannot compile (which must change nothing). Each optimized model is compared element-wise
with the plain model given the same change: closely for the fp32 modes, within int8's error for int8, against an
effect (the change itself) many times larger."""

from __future__ import annotations

import copy

import pytest
import torch
from test_compiled import SMALL, compiler, relative_rms

import hfbert
from hfbert.inference import packed_layers
from hfbert.inference.int8 import int8_available
from hfbert.inference.packed import packing_supported

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
MODES = {
    "int8": (dict(quantize="int8"), 0.05),  # int8 against fp32: a relative RMS error of about 0.01 here
    "high": (dict(precision="high", kernels="always"), 1e-5),
    "highest": (dict(kernels="always"), 1e-5),
}
# The default mode packs layers of at least 2**19 weights (MIN_PACKED_WEIGHTS): bert-base's width.
WIDE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=1)


def small_model(seed: int = 0, shape: dict = SMALL) -> hfbert.BertModel:
    torch.manual_seed(seed)
    return hfbert.BertModel(hfbert.BertConfig(**shape)).eval()


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return dict(input_ids=torch.randint(1000, 20000, (2, 16), generator=generator))


def outputs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs()).last_hidden_state


def modes(*names: str):
    marks = {"int8": int8, "high": packs, "highest": packs}
    return pytest.mark.parametrize("mode", [pytest.param(name, marks=marks[name]) for name in names])


@modes("int8", "high", "highest")
def test_data_writes_are_followed_after_refresh(mode):
    """`.data` writes bump no version counter: `hfbert.inference.refresh(model)` makes the model follow them."""
    options, bound = MODES[mode]
    plain = small_model(shape=WIDE if mode == "highest" else SMALL)
    model = hfbert.optimize_for_inference(copy.deepcopy(plain), **options)
    assert packed_layers(model)
    before = outputs(model)
    for network in (plain, model):
        for layer in network.encoder.layer:
            for linear in (layer.attention.self.query, layer.intermediate.dense, layer.output.dense):
                linear.weight.data.mul_(3)
    hfbert.inference.refresh(model)
    expected = outputs(plain)
    assert relative_rms(outputs(model), expected) < bound < relative_rms(before, expected)


@modes("int8", "high")
def test_load_state_dict_of_inference_tensors_is_followed(mode):
    """A model built under `torch.inference_mode()` has inference tensors (no version counter): loading new values
    into them in inference mode is seen through `load_state_dict`'s own path."""
    options, bound = MODES[mode]
    with torch.inference_mode():
        model = hfbert.optimize_for_inference(small_model(), **options)
        before = outputs(model)
        other = small_model(seed=1)
        model.load_state_dict(other.state_dict())
        after = outputs(model)
    expected = outputs(other)
    assert relative_rms(after, expected) < bound < relative_rms(before, expected)


def lora_pair():
    """A small model with PEFT LoRA adapters (random, so that they change the outputs) on query and value, and the
    same model without them."""
    peft = pytest.importorskip("peft", reason="the LoRA tests run real PEFT")
    plain = small_model()
    without = copy.deepcopy(plain)
    config = peft.LoraConfig(target_modules=["query", "value"], r=8, init_lora_weights=False)
    return peft.get_peft_model(plain, config), without


@modes("int8", "high")
@pytest.mark.parametrize("when", ["before", "after"])
def test_lora_adapters_on_the_projections_are_computed(mode, when):
    """Adapters wrapped around query and value, before or after optimizing: the optimized model computes them."""
    options, bound = MODES[mode]
    if when == "before":
        model, without = lora_pair()
        expected = outputs(copy.deepcopy(model))
        hfbert.optimize_for_inference(model, **options)
    else:
        peft = pytest.importorskip("peft", reason="the LoRA tests run real PEFT")
        without = small_model()
        model = hfbert.optimize_for_inference(copy.deepcopy(without), **options)
        config = peft.LoraConfig(target_modules=["query", "value"], r=8, init_lora_weights=False)
        torch.manual_seed(1)
        model = peft.get_peft_model(model, config)
        plain = peft.get_peft_model(copy.deepcopy(without), config)
        plain.load_state_dict(model.state_dict())
        expected = outputs(plain)
        assert not any(name.endswith("attention.self") for name in packed_layers(model))
    effect = relative_rms(outputs(without), expected)
    assert relative_rms(outputs(model), expected) < bound < effect


@int8
def test_a_refused_compile_changes_nothing():
    """compile=True on a model it cannot compile (transformers' BertModel, a user's module around an hfbert model):
    one TypeError, and the model is what it was (no int8 layer, still in training mode)."""
    import transformers

    config = transformers.BertConfig(**SMALL)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = hfbert.BertModel(hfbert.BertConfig(**SMALL))

    for model in (transformers.BertModel(config), Wrapper()):
        model.train()
        types = [type(module) for module in model.modules()]
        with pytest.raises(TypeError, match="compile=True"):
            hfbert.optimize_for_inference(model, quantize="int8", compile=True)
        assert model.training and [type(module) for module in model.modules()] == types
        assert not packed_layers(model)


@pytest.mark.slow  # one compilation of a small model
@int8
@compiler
def test_hooks_added_after_compiling_run():
    """A forward hook registered after the compiled path compiled runs, and its change to a layer's output is
    the model's output (as in the plain model with the same hook)."""
    plain = small_model()
    model = hfbert.optimize_for_inference(copy.deepcopy(plain), quantize="int8", compile=True)
    outputs(model)  # compiles
    assert hfbert.inference.compiled.compile_report(model)
    calls = []

    def zero(module, args, output):
        calls.append(module)
        return (torch.zeros_like(output[0]), *output[1:])

    for network in (plain, model):
        network.encoder.layer[-1].register_forward_hook(zero)
    hooked = outputs(model)
    assert len(calls) == 1 and torch.equal(hooked, outputs(plain)) and not hooked.any()


@int8
def test_a_failure_while_swapping_changes_nothing():
    """A weight int8 cannot represent (NaN), found while the int8 layers are built: the ValueError leaves the model
    as it was, its packed layers in place (the same objects), still in training mode, its mode record unchanged."""
    model = hfbert.optimize_for_inference(small_model(shape=WIDE), kernels="always").train()
    before = {name: module for name, module in model.named_modules()}
    applied = hfbert.inference.inference_mode_of(model)
    with torch.no_grad():
        model.pooler.dense.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        hfbert.optimize_for_inference(model, quantize="int8")
    assert dict(model.named_modules()) == before and all(module.training for module in model.modules())
    assert hfbert.inference.inference_mode_of(model) == applied and set(packed_layers(model).values()) == {"packed"}


@int8
def test_the_applied_mode_is_recorded_and_a_mode_that_cannot_run_warns():
    model = small_model()
    assert hfbert.inference.inference_mode_of(model) is None
    hfbert.optimize_for_inference(model, quantize="int8")
    applied = hfbert.inference.inference_mode_of(model)
    assert (applied.mode, applied.unavailable) == ("int8", None) and applied.swapped == len(packed_layers(model)) > 0
    hfbert.restore_weights(model)
    assert hfbert.inference.inference_mode_of(model) is None
    model.double()
    with pytest.warns(UserWarning, match="mode 'int8' runs torch.float32 on the CPU.*torch.float64"):
        hfbert.optimize_for_inference(model, quantize="int8")
    applied = hfbert.inference.inference_mode_of(model)
    assert applied.swapped == 0 and "float64" in applied.unavailable and "float64" in str(applied)
