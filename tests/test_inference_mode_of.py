"""`inference_mode_of(model)` describes what runs now, not what ran when the model was optimized: after `.half()`,
`.to(torch.float64)`, `.to("meta")` and training mode the swapped layers and blocks run their plain computation
and it says so, naming why; after `.float()` and `eval()` back, the kernels run again and it says that. What it
says is checked against what the gate decides at each call (`Swapped.kernel_way`), and the outputs against
transformers' BertModel with the same weights."""

from __future__ import annotations

import pytest
import torch
from test_compiled import SMALL

import hfbert
from hfbert.inference import inference_mode_of, packed_layers
from hfbert.inference.int8 import int8_available
from hfbert.inference.packed import packing_supported
from hfbert.inference.swapped import Swapped

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
MODES = {
    "high": (dict(precision="high", kernels="always"), 8, 5e-5),  # 4 fused blocks a layer
    "int8": (dict(quantize="int8"), 9, 0.15),  # 4 a layer and the pooler
}


@pytest.fixture
def ways(monkeypatch) -> list[int]:
    """The computation each swapped module's gate chooses at each call: 0 plain, others a kernel."""
    chosen = []
    gate = Swapped.kernel_way

    def recorded(self, input):
        chosen.append(gate(self, input))
        return chosen[-1]

    monkeypatch.setattr(Swapped, "kernel_way", recorded)
    return chosen


def run(model: torch.nn.Module, ways: list[int]) -> tuple[torch.Tensor, list[int]]:
    """The last hidden states of a fixed batch, and the ways its swapped modules ran."""
    ways.clear()
    ids = torch.randint(1000, 20000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output = model(input_ids=ids).last_hidden_state
    return output, list(ways)


@pytest.mark.parametrize("mode", [pytest.param("high", marks=packs), pytest.param("int8", marks=int8)])
def test_what_runs_now_after_half_and_float_back(mode, ways):
    import transformers

    options, swapped, bound = MODES[mode]
    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(**SMALL)).eval()
    reference = transformers.BertModel(transformers.BertConfig(**SMALL)).eval()
    reference.load_state_dict(model.state_dict())
    hfbert.optimize_for_inference(model, **options)
    applied = inference_mode_of(model)
    assert applied.swapped == swapped == len(packed_layers(model))
    assert str(applied).endswith(f": {swapped} layers or blocks swapped")
    assert all(run(model, ways)[1])

    model.half()
    now = inference_mode_of(model)
    assert now.swapped == 0 and not packed_layers(model) and "layers or blocks swapped" not in str(now)
    assert f"plain: all {swapped} swapped layers or blocks run their plain computation" in str(now)
    assert "their parameters are torch.float16 on cpu" in now.plain
    assert not any(run(model, ways)[1])

    model.float()
    reference.half().float()  # the same weights, rounded to float16 and back
    assert inference_mode_of(model) == applied
    output, chosen = run(model, ways)
    assert all(chosen)
    with torch.no_grad():
        expected = reference(input_ids=torch.randint(1000, 20000, (2, 16), generator=torch.Generator().manual_seed(0)))
    assert float((output - expected.last_hidden_state).abs().max()) < bound


@packs
@pytest.mark.parametrize("move", ["float64", "meta", "train"])
def test_what_runs_now_after_a_move_or_training_mode(move, ways):
    model = hfbert.optimize_for_inference(
        hfbert.BertModel(hfbert.BertConfig(**SMALL)), precision="high", kernels="always"
    )
    swapped = len(packed_layers(model))
    assert swapped and inference_mode_of(model).swapped == swapped
    if move == "train":
        model.train()
        said = "the model is in training mode"
    else:
        model.to(torch.float64 if move == "float64" else "meta")
        said = f"their parameters are torch.float{'64 on cpu' if move == 'float64' else '32 on meta'}"
    now = inference_mode_of(model)
    assert now.swapped == 0 and said in now.plain and said in str(now)
    if move != "meta":
        assert not any(run(model, ways)[1])


@packs
def test_peft_wrapped_projections_are_named():
    """PEFT's LoRA around query and value: the attention blocks run plain (their wrappers' forward must run), the
    other fused blocks their kernels."""
    peft = pytest.importorskip("peft", reason="the LoRA test runs real PEFT")
    model = hfbert.optimize_for_inference(
        hfbert.BertModel(hfbert.BertConfig(**SMALL)), precision="high", kernels="always"
    )
    swapped = len(packed_layers(model))
    peft.get_peft_model(model, peft.LoraConfig(target_modules=["query", "value"], r=8))
    now = inference_mode_of(model)
    layers = SMALL["num_hidden_layers"]
    assert now.swapped == swapped - layers and f"plain: {layers} of the {swapped} swapped" in now.plain
    assert "wrapped (PEFT's LoRA)" in now.plain
