"""`PackedLinear` (`hfbert/inference/packed.py`), the layer `hfbert.optimize_for_inference` swaps in: when its
oneDNN kernel runs and when it must not, and how accurate the model is against exact arithmetic, plain and packed.

The plain model (`nn.Linear`, transformers' kernel) and the packed one must keep hfbert's fp32 error against float64
within 1.5x of transformers' own (RMS, every hidden state; support.helpers.Accuracy) on all-MiniLM-L6-v2, the
bert-base layout and the same with outlier dimensions (small in the default run, at bert-base's size in the slow
one), padded and padding-free, on this CPU's instruction set and, in a subprocess with oneDNN, MKL and ATen capped,
on AVX2.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import hfbert
import hfbert.inference
from hfbert.inference.packed import PackedLinear, packing_supported
from hfbert.platform.cpu import cpu_flags

from support.checkpoints import SMALL_LAYOUT_SHAPE, write_bert_base_layout, write_small_layout
from support.helpers import Accuracy, make_batches, minilm_directory, swap_as_at_bert_base

packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
ROOT = Path(__file__).resolve().parents[1]
ONEDNN_OP = "mkldnn::_linear_pointwise"


def operators(function) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        function()
    return [event.name for event in profiler.events()]


def packed_pair(features=(768, 768)) -> tuple[torch.nn.Linear, PackedLinear]:
    torch.manual_seed(0)
    reference = torch.nn.Linear(*features)
    layer = torch.nn.Linear(*features)
    layer.load_state_dict(reference.state_dict())
    return reference, PackedLinear.from_linear(layer)


def test_a_built_model_runs_f_linear_only(layout):
    model = hfbert.BertModel.from_pretrained(layout.safetensors)
    inputs = dict(input_ids=torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]]))
    inputs["attention_mask"] = (inputs["input_ids"] != 0).long()
    linear_layers = 6 * model.config.num_hidden_layers + 1  # q, k, v, attention output, intermediate, output; pooler
    with torch.no_grad():
        ran = operators(lambda: model(**inputs))
    assert ONEDNN_OP not in ran and ran.count("aten::linear") == linear_layers


@packs
def test_a_packed_model_runs_onednn_in_every_large_layer(layout, monkeypatch):
    if layout.small:
        swap_as_at_bert_base(monkeypatch, layout.config["hidden_size"])
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(layout.safetensors), kernels="always")
    inputs = dict(input_ids=torch.tensor([[101, 7592, 2088, 102]]))
    with torch.no_grad():
        ran = operators(lambda: model(**inputs))
    assert "aten::linear" not in ran and ran.count(ONEDNN_OP) >= 6 * model.config.num_hidden_layers + 1


@packs
@pytest.mark.parametrize(
    "trained", [("weight", "bias"), ("bias",), ()], ids=["all parameters", "bias only (BitFit)", "input only"]
)
def test_every_gradient_takes_the_standard_kernel(trained):
    """The oneDNN op has no backward: whichever tensor wants a gradient, the call must go through F.linear and
    give torch's own gradients."""
    reference, layer = packed_pair()
    inputs = torch.randn(3, 768)
    with torch.no_grad():
        assert ONEDNN_OP in operators(lambda: layer(inputs))  # without gradients this layer runs oneDNN
    for name, parameter in layer.named_parameters():
        parameter.requires_grad_(name in trained)
    inputs.requires_grad_(not trained)
    reference_inputs = inputs.detach().clone().requires_grad_(not trained)
    assert ONEDNN_OP not in operators(lambda: layer(inputs).square().sum().backward())
    reference(reference_inputs).square().sum().backward()
    for name, parameter in layer.named_parameters():
        expected = getattr(reference, name).grad if name in trained else None
        assert (parameter.grad is None) == (expected is None), name
        if expected is not None:
            assert torch.equal(parameter.grad, expected), name
    if not trained:
        assert torch.equal(inputs.grad, reference_inputs.grad)


@packs
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_dtypes_without_the_kernel_take_f_linear(dtype):
    _, layer = packed_pair()
    layer.to(dtype)
    inputs = torch.randn(3, 768, dtype=dtype)
    with torch.no_grad():
        assert ONEDNN_OP not in operators(lambda: layer(inputs))
        assert torch.equal(layer(inputs), F.linear(inputs, layer.weight, layer.bias))


@packs
def test_autocast_takes_f_linear_and_its_cast():
    """torch.autocast("cpu", bfloat16) casts F.linear's inputs; the oneDNN op would silently stay in fp32."""
    _, layer = packed_pair()
    inputs = torch.randn(3, 768)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert ONEDNN_OP not in operators(lambda: layer(inputs))
        output = layer(inputs)
        expected = F.linear(inputs, layer.weight, layer.bias)
    assert output.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(output, expected)


@packs
def test_tracing_records_the_standard_op():
    """A traced graph must not hold a private oneDNN op: exported models run elsewhere."""
    _, layer = packed_pair()
    with torch.no_grad():
        graph = torch.jit.trace(layer.eval(), torch.randn(3, 768)).graph
    kinds = {node.kind() for node in graph.nodes()}
    assert "aten::linear" in kinds and not any("mkldnn" in kind for kind in kinds)


@packs
def test_a_changed_weight_is_packed_again_before_it_runs():
    """The packed blocks are a cache of the parameter: an in-place change (an optimizer step) is seen."""
    reference, layer = packed_pair()
    inputs = torch.randn(5, 768)
    with torch.no_grad():
        layer.weight.mul_(2)
        reference.weight.mul_(2)
        assert ONEDNN_OP in operators(lambda: layer(inputs))
        error = (layer(inputs) - reference(inputs)).abs().max()
    assert error <= 1e-5 * reference(inputs).abs().max()


@pytest.mark.parametrize("features", [(32, 32), (384, 10)])
def test_small_layers_are_not_swapped(features):
    model = torch.nn.Sequential(torch.nn.Linear(*features))
    hfbert.optimize_for_inference(model, kernels="always")
    assert type(model[0]) is torch.nn.Linear and not hfbert.inference.packed_layers(model)


@functools.cache
def reference_models(directory: Path, class_name: str = "BertModel") -> tuple:
    import transformers

    model_class = getattr(transformers, class_name)
    exact = model_class.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa").double()
    fp32 = model_class.from_pretrained(directory, dtype=torch.float32, attn_implementation="sdpa")
    return exact.eval(), fp32.eval()


@pytest.fixture(scope="module")
def outlier_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bert-base-outliers")
    write_bert_base_layout(directory, outliers=True)
    return directory


@pytest.fixture(scope="module")
def small_outlier_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("small-layout-outliers")
    write_small_layout(directory, outliers=True)
    return directory


# The checkpoints the accuracy is measured on: bert-base-uncased's layout (and the same with outlier dimensions) at
# its own size in the slow run, at the small size in the default run (where the swap's size thresholds are lowered
# to a hidden x hidden layer's: the same layers packed and fused).
CHECKPOINTS = [
    "all-MiniLM-L6-v2",
    "small layout",
    "small layout, outlier dimensions",
    pytest.param("bert-base layout", marks=pytest.mark.slow),
    pytest.param("outlier dimensions", marks=pytest.mark.slow),
]


# The packed and fused kernels at every row count (what kernels="measured" may pick, at its worst), and their bounds.
OPTIMIZED = {"packed": {"kernels": "always"}, "fast": {"precision": "high", "kernels": "always"}}
BOUNDS = {"default": 1.5, "packed": 1.5, "fast": 3.0}


@pytest.mark.parametrize("form", ["default", "packed", "fast"])
@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_fp32_is_as_accurate_as_transformers(checkpoint, padding_free, form, request, monkeypatch):
    """The default kernel, and weights packed by `hfbert.optimize_for_inference` (where this CPU can pack)."""
    fixture = {
        "small layout": "small_layout_safetensors_dir",
        "small layout, outlier dimensions": "small_outlier_dir",
        "bert-base layout": "bert_base_safetensors_dir",
        "outlier dimensions": "outlier_dir",
    }
    directory = request.getfixturevalue(fixture[checkpoint]) if checkpoint in fixture else minilm_directory()
    if checkpoint.startswith("small layout"):
        swap_as_at_bert_base(monkeypatch, SMALL_LAYOUT_SHAPE["hidden_size"])
    exact, theirs = reference_models(directory)
    ours = hfbert.BertModel.from_pretrained(directory)
    ours.padding_free = padding_free
    if form != "default":
        hfbert.optimize_for_inference(ours, **OPTIMIZED[form])
        assert bool(hfbert.inference.packed_layers(ours)) == packing_supported()
    config = ours.config
    accuracy: dict[int, Accuracy] = {}
    for batch in make_batches(config.vocab_size, config.type_vocab_size, config.hidden_size):
        kwargs = batch.kwargs
        exact_kwargs = {key: value.double() if key == "inputs_embeds" else value for key, value in kwargs.items()}
        with torch.no_grad():
            truth = exact(**exact_kwargs, output_hidden_states=True).hidden_states
            ours_states = ours(**kwargs, output_hidden_states=True).hidden_states
            theirs_states = theirs(**kwargs, output_hidden_states=True).hidden_states
        for index, states in enumerate(zip(ours_states, theirs_states, truth, strict=True)):
            accuracy.setdefault(index, Accuracy()).add(*states, batch.real)
    assert all(0 < record.theirs < 1e-4 for record in accuracy.values())  # fp32 rounding, nothing more
    failures = {index: record for index, record in accuracy.items() if not record.passed(ratio=BOUNDS[form])}
    assert not failures, failures


def test_default_masked_lm_logits_are_as_accurate_as_transformers(layout):
    """The decoder (hidden -> 30,522 logits, tied to the word embeddings) too."""
    exact, theirs = reference_models(layout.safetensors, "BertForMaskedLM")
    ours = hfbert.BertForMaskedLM.from_pretrained(layout.safetensors).eval()
    # The first test batch is right-padded: the padding-free path.
    batch = make_batches(ours.config.vocab_size, ours.config.type_vocab_size, ours.config.hidden_size)[0]
    with torch.no_grad():
        logits = [model(**batch.kwargs).logits for model in (ours, theirs, exact)]
    record = Accuracy().add(*logits, batch.real)
    assert record.theirs > 0 and record.passed(), record


@pytest.mark.slow  # the numerical-contract benchmark in a capped subprocess: three checkpoints, three kernels
@pytest.mark.skipif("avx2" not in cpu_flags(), reason="not an x86 CPU with AVX2: nothing to cap to AVX2")
def test_fp32_is_as_accurate_as_transformers_on_avx2(tmp_path):
    """The same bar, default and packed, on the kernels an AVX2-only CPU runs: oneDNN, MKL and ATen capped in a
    subprocess (benchmarks/numerical_contract.py, judged with the parity verdict; its tests prove that verdict
    fails real port bugs)."""
    command = [sys.executable, "-m", "benchmarks.numerical_contract", "--isa", "AVX2"]
    command += ["--checkpoints", "minilm,bert-base,outlier", "--kernels", "standard,packed,fast", "--dtypes", "float32"]
    # 32 texts: the pooler is one row per text, and its RMS ratio over 8 rows swings past the bound by chance.
    command += ["--texts", "32", "--json", str(tmp_path / "contract.json")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "contract.json").read_text())[0]
    assert report["isa"] == "AVX2 (capped)" and "ONEDNN_MAX_CPU_ISA=AVX2" in report["instruction_set"]
    assert len(report["rows"]) == 3 * 2 * 2 * 3  # checkpoints x attention x padding x (default, packed, fast)
    # The fast mode also packs the layers outside its fused blocks (a pooler as large as bert-base's).
    packed, fast = (
        ("oneDNN, packed", ("oneDNN, fused", "oneDNN, fused and packed"))
        if packing_supported()
        else ("F.linear", ("F.linear",))
    )
    for row in report["rows"]:
        expected = {"standard": ("F.linear",), "packed": (packed,), "fast": fast}[row["kernel"]]
        assert row["ran"] in expected and 0 < row["transformers_rms"] < 1e-4, row
        assert row["passed"] and row["worst_ratio"] <= BOUNDS[row["kernel"].replace("standard", "default")], row
