"""`hfbert.optimize_for_inference`: linear layers swapped from outside for packed ones, one copy in memory, and
everything that reads or changes the weights (parameters, optimizers, state_dict, save_pretrained, load_state_dict,
train, .to, pickling, gradients, torch.compile) still sees the original parameters, bit for bit. Accuracy of the
packed path against float64 is in test_linear.py (default and packed share one test, on this CPU's instruction set
and capped to AVX2); its speed is benchmarks/peers.py's.
"""

from __future__ import annotations

import copy
import io
import platform
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file

import hfbert
import hfbert.platform.cpu
from hfbert.inference import packed_layers
from hfbert.inference.packed import PackedLinear, packing_supported

from support.helpers import swap_as_at_bert_base

packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")


def file_tensors(directory) -> dict[str, torch.Tensor]:
    """The checkpoint's own tensors, read with safetensors, named as hfbert names them (no "bert." prefix, the
    original checkpoint's LayerNorm.gamma / beta as weight / bias)."""
    tensors = load_file(directory / "model.safetensors")
    renamed = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("bert.").replace("LayerNorm.gamma", "LayerNorm.weight")
        renamed[name.replace("LayerNorm.beta", "LayerNorm.bias")] = tensor
    return renamed


@pytest.fixture
def checkpoint(layout, monkeypatch):
    """bert-base-uncased's file layout (`layout`: small in the default run, its own size in the slow one). At the small
    size the swap's size thresholds are lowered to a hidden x hidden layer's, as bert-base's sit: every layer bert-base
    swaps is swapped, and the small heads stay plain."""
    if layout.small:
        swap_as_at_bert_base(monkeypatch, layout.config["hidden_size"])
    return layout


def swapped_count(layout) -> int:
    """Six linear layers in every encoder layer, and the pooler's (bert-base: 73)."""
    return 6 * layout.config["num_hidden_layers"] + 1


@pytest.fixture
def packed_model(checkpoint) -> hfbert.BertModel:
    return hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(checkpoint.safetensors), kernels="always")


def test_a_built_model_is_plain_pytorch():
    """Every leaf module of a fresh model and of every head is torch's own: the speed work lives outside."""
    config = hfbert.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=37)
    torch_leaves = (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.Embedding, torch.nn.Dropout)
    for model_class in (hfbert.BertModel, hfbert.BertForPreTraining, hfbert.BertForQuestionAnswering):
        model = model_class(config)
        leaves = [module for module in model.modules() if not list(module.children())]
        assert leaves and all(type(module) in torch_leaves for module in leaves), model_class


@packs
def test_every_encoder_and_pooler_linear_is_swapped_and_packed(packed_model, checkpoint):
    layers = packed_layers(packed_model)
    assert len(layers) == swapped_count(checkpoint) and set(layers.values()) == {"packed"}
    for name in layers:
        layer = packed_model.get_submodule(name)
        assert isinstance(layer, PackedLinear) and isinstance(layer, torch.nn.Linear) and layer.is_current
        assert all(block.is_mkldnn for block in layer._form)
    assert not packed_model.training


@packs
def test_optimizing_keeps_the_parameters_an_optimizer_holds(checkpoint):
    """The same Parameter objects, the same requires_grad flags, the real count; and after model.train() an
    optimizer made before optimize_for_inference trains every weight, as it trains transformers'."""
    import transformers

    model = hfbert.BertModel.from_pretrained(checkpoint.safetensors)
    model.embeddings.requires_grad_(False)
    model.encoder.layer[0].attention.self.query.weight.requires_grad_(False)
    before = dict(model.named_parameters())
    flags = {name: parameter.requires_grad for name, parameter in before.items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    hfbert.optimize_for_inference(model, kernels="always")
    after = dict(model.named_parameters())
    assert list(after) == list(before) and all(after[name] is before[name] for name in before)
    assert {name: parameter.requires_grad for name, parameter in after.items()} == flags
    reference = transformers.BertModel.from_pretrained(checkpoint.safetensors)
    assert model.num_parameters() == reference.num_parameters()
    assert model.num_parameters(only_trainable=True) == sum(p.numel() for p in after.values() if p.requires_grad)
    model.train()
    snapshot = {name: parameter.detach().clone() for name, parameter in after.items()}
    model(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state.square().mean().backward()
    optimizer.step()
    changed = {name for name, parameter in model.named_parameters() if not torch.equal(parameter, snapshot[name])}
    linear_weights = {name for name in flags if name.startswith("encoder.") and name.endswith("dense.weight")}
    assert linear_weights <= changed <= {name for name, trainable in flags.items() if trainable}


@packs
def test_state_dict_and_save_pretrained_give_the_checkpoint(packed_model, checkpoint, tmp_path):
    stored = file_tensors(checkpoint.safetensors)
    state = packed_model.state_dict()
    assert list(state) == list(hfbert.BertModel(packed_model.config).state_dict())  # same keys, same order
    for name, tensor in state.items():
        assert torch.equal(tensor, stored[name]), name
    packed_model.save_pretrained(tmp_path)
    saved = file_tensors(tmp_path)
    assert set(saved) == set(state) - {"embeddings.position_ids"}
    assert all(torch.equal(saved[name], stored[name]) for name in saved)


@packs
def test_train_and_restore_weights_give_the_plain_parameters(packed_model, checkpoint):
    stored = file_tensors(checkpoint.safetensors)
    packed_model.train()
    parameters = dict(packed_model.named_parameters())
    assert all(torch.equal(parameter, stored[name]) for name, parameter in parameters.items())
    assert all(parameter.requires_grad for parameter in parameters.values())
    hfbert.restore_weights(packed_model)
    assert not packed_layers(packed_model)
    assert all(type(module) is not PackedLinear for module in packed_model.modules())
    assert all(torch.equal(p, stored[name]) for name, p in packed_model.named_parameters())
    assert all(packed_model.get_parameter(name) is parameter for name, parameter in parameters.items())


@packs
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_of_an_optimized_model_runs_and_matches_transformers(backend):
    """Compiled, the swapped layers run F.linear on their parameters (the oneDNN ops are invisible to compilers)."""
    import transformers

    torch.manual_seed(0)
    model = hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)), kernels="always")
    reference = transformers.BertModel(transformers.BertConfig(num_hidden_layers=1)).eval()
    reference.load_state_dict(model.state_dict())
    inputs = dict(input_ids=torch.tensor([[101, 7592, 2088, 2003, 102]]))
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        compiled = torch.compile(model, backend=backend)(**inputs).last_hidden_state
    assert (compiled - expected).abs().max() <= 1e-4


def test_a_refused_optimization_changes_nothing():
    model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)).train()
    modules = list(model.modules())
    with pytest.raises(ValueError, match="quantize must be None or one of int8, not 'int4'"):
        hfbert.optimize_for_inference(model, quantize="int4")
    assert model.training and list(model.modules()) == modules


@packs
def test_load_state_dict_repacks_the_new_values(checkpoint, tmp_path):
    other = checkpoint.write(tmp_path, seed=1)
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(checkpoint.safetensors), kernels="always")
    model.load_state_dict(file_tensors(tmp_path), strict=False)
    assert len(packed_layers(model)) == swapped_count(checkpoint)
    layer = "encoder.layer.1.output.dense.weight"
    assert torch.equal(model.state_dict()[layer], other["bert." + layer])


@packs
def test_copies_pickles_and_moves(packed_model, checkpoint):
    inputs = dict(input_ids=torch.tensor([[101, 7592, 2088, 102] * 4]))
    with torch.no_grad():
        expected = packed_model(**inputs).last_hidden_state
        copied = copy.deepcopy(packed_model)
        buffer = io.BytesIO()
        torch.save(packed_model, buffer)
        buffer.seek(0)
        unpickled = torch.load(buffer, weights_only=False)
        for model in (copied, unpickled):
            assert len(packed_layers(model)) == swapped_count(checkpoint)
            assert torch.equal(model(**inputs).last_hidden_state, expected)
        packed_model.to("cpu")  # a move that changes nothing keeps the packing
        assert len(packed_layers(packed_model)) == swapped_count(checkpoint)
        packed_model.double()  # float64 cannot be packed: plain weights, exact arithmetic
        assert not packed_layers(packed_model)
        assert packed_model(**inputs).last_hidden_state.dtype == torch.float64


@packs
def test_gradients_through_a_packed_model_match_transformers(packed_model, checkpoint):
    """Eval mode with autograd on (saliency, attacks): the packed layers take the plain weight and let the
    gradient through to the inputs."""
    import transformers

    reference = transformers.BertModel.from_pretrained(checkpoint.safetensors).eval()
    ids = torch.tensor([[101, 7592, 2088, 2003, 2307, 102]])
    gradients = []
    for model in (packed_model, reference):
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
        model(inputs_embeds=embeddings).last_hidden_state.square().sum().backward()
        gradients.append(embeddings.grad)
    ours, theirs = gradients
    assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()


@packs
def test_the_tied_decoder_and_small_heads_stay_plain(checkpoint):
    model = hfbert.optimize_for_inference(
        hfbert.BertForMaskedLM.from_pretrained(checkpoint.safetensors), kernels="always"
    )
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert "cls.predictions.transform.dense" in packed_layers(model)
    classifier = hfbert.optimize_for_inference(hfbert.BertForSequenceClassification(model.config), kernels="always")
    assert "classifier" not in packed_layers(classifier) and "bert.pooler.dense" in packed_layers(classifier)


@pytest.mark.skipif("avx2" not in hfbert.platform.cpu.cpu_flags(), reason="not an x86 CPU with AVX2: nothing to cap")
def test_bfloat16_warns_once_where_the_cpu_emulates_it():
    script = (
        "import warnings, torch, hfbert\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    for _ in range(2):\n"
        "        hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)).to(torch.bfloat16)\n"
        "print(sum('emulated in software' in str(w.message) for w in caught))\n"
    )
    capped = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env={**_environment(), **capped}, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "1"


def test_bfloat16_does_not_warn_where_the_cpu_computes_it():
    if not hfbert.platform.cpu.bfloat16_native():
        pytest.skip("this CPU emulates bf16: the warning is right here")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)).to(torch.bfloat16)


def _environment() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key not in hfbert.platform.cpu.CAPS}


PEAK_MEMORY = """
import resource, sys, torch
torch.set_num_threads(2)
directory, which = sys.argv[1], sys.argv[2]
with torch.no_grad():
    if which == "transformers":
        import transformers
        model = transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()
    else:
        import hfbert
        model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), kernels="always")
    for _ in range(2):
        model(input_ids=torch.randint(1000, 30000, (8, 128)))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow  # two bert-base processes, transformers and hfbert
@packs
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS as Linux reports it (ru_maxrss in KiB)")
def test_packed_bert_base_peaks_below_transformers_memory(bert_base_safetensors_dir):
    """The packed copy replaces the weights, also the pages of the memory-mapped checkpoint they came from."""
    peaks = {}
    for which in ("transformers", "hfbert"):
        command = [sys.executable, "-c", PEAK_MEMORY, str(bert_base_safetensors_dir), which]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        peaks[which] = int(result.stdout.split()[-1])
    assert peaks["hfbert"] <= peaks["transformers"], peaks


FREED_MEMORY = """
import resource, sys, torch, hfbert
torch.set_num_threads(1)
def page_faults():  # a forward's large activation, made and freed 20 times
    x = torch.randn(4096, 3072)  # 48 MB: above the 32 MB that glibc's own threshold may grow to
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        y = x / 3
        del y
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
default = page_faults()
hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)), kernels="always")
print(default, page_faults())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="keep_freed_memory sets glibc's malloc only")
def test_optimize_for_inference_keeps_freed_activations_instead_of_faulting_them_in_again():
    import resource  # Unix only

    environment = {key: value for key, value in _environment().items() if not key.startswith("MALLOC_")}
    environment.pop("LD_PRELOAD", None)
    result = subprocess.run(
        [sys.executable, "-c", FREED_MEMORY], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    default, kept = map(int, result.stdout.split()[-2:])
    pages = 4096 * 3072 * 4 // resource.getpagesize()
    assert default >= 15 * pages, "glibc kept the freed memory even by default: nothing to check"
    assert kept <= 4 * pages, (default, kept)  # the first allocations fault their pages in, then reuse them


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="keep_freed_memory sets glibc's malloc only")
def test_malloc_settings_of_the_process_owner_win():
    script = "from hfbert.platform.allocator import keep_freed_memory; print(keep_freed_memory())"
    environment = {**_environment(), "MALLOC_TRIM_THRESHOLD_": "131072"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "False"


@pytest.mark.parametrize(
    "options, tolerance",
    [({}, 1e-5), ({"precision": "high"}, 1e-4), ({"quantize": "int8"}, 1.0)],
    ids=["packed", "fast", "int8"],
)
def test_a_model_loaded_under_inference_mode_is_optimized_and_runs(options, tolerance, checkpoint):
    """Inference tensors have no version counter: the swapped layers key their cache on the storage, and int8's
    shared quantization of attention's input on its identity, instead."""
    with torch.inference_mode():
        model = hfbert.BertModel.from_pretrained(checkpoint.safetensors)
        plain = model(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state
        hfbert.optimize_for_inference(model, kernels="always", **options)
        optimized = model(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state
    with torch.no_grad():  # the same kernels on ordinary tensors, with version counters
        expected = model(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state
    assert torch.equal(optimized, expected)
    assert (optimized - plain).abs().max() <= tolerance
