"""The fast fp32 mode, `optimize_for_inference(model, precision="high")` (`hfbert/inference/fused.py`): fused blocks
swapped in from outside, the model's modules and parameters unchanged, the plain computation wherever the kernels
must not run, and its contract (RMS error against float64 at most 3x transformers'; tests/test_linear.py checks it
on three checkpoints, this file on real all-MiniLM-L6-v2 sentence embeddings)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import hfbert
from hfbert.inference.fused import FusedIntermediate, FusedResidualOutput, FusedSelfAttention
from hfbert.inference.packed import packing_supported
from hfbert.modeling.model import BertIntermediate, BertResidualOutput, BertSelfAttention
from hfbert.tools.parity import default_texts

from support.helpers import Accuracy, make_batches, minilm_directory, swap_as_at_bert_base

packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
FUSED = {
    BertSelfAttention: FusedSelfAttention,
    BertIntermediate: FusedIntermediate,
    BertResidualOutput: FusedResidualOutput,
}


def fast(model: torch.nn.Module) -> torch.nn.Module:
    return hfbert.optimize_for_inference(model, precision="high", kernels="always")


def transformers_model(directory, **kwargs):
    import transformers

    return transformers.BertModel.from_pretrained(directory, attn_implementation="sdpa", **kwargs).eval()


@pytest.fixture
def checkpoint(layout, monkeypatch):
    """bert-base-uncased's file layout: small in the default run (the swap's size thresholds lowered to a hidden x
    hidden layer's, so that the same blocks are fused), at its own size in the slow one."""
    if layout.small:
        swap_as_at_bert_base(monkeypatch, layout.config["hidden_size"])
    return layout.safetensors


@packs
def test_blocks_are_swapped_and_the_model_keeps_its_modules_and_parameters(checkpoint):
    plain = hfbert.BertModel.from_pretrained(checkpoint)
    model = hfbert.BertModel.from_pretrained(checkpoint)
    parameters = dict(model.named_parameters())
    fast(model)
    layers = model.config.num_hidden_layers
    # attention, its output, intermediate, output
    assert list(hfbert.inference.packed_layers(model).values()).count("fused") == 4 * layers
    for name, module in plain.named_modules():
        if type(module) in FUSED:
            assert type(model.get_submodule(name)) is FUSED[type(module)], name
    assert {name: id(parameter) for name, parameter in model.named_parameters()} == {
        name: id(parameter) for name, parameter in parameters.items()
    }
    state, expected = model.state_dict(), plain.state_dict()
    assert state.keys() == expected.keys() and all(torch.equal(state[key], expected[key]) for key in expected)
    hfbert.restore_weights(model)
    assert [type(module) for module in model.modules()] == [type(module) for module in plain.modules()]


@packs
def test_minilm_sentence_embeddings_keep_the_issue_bound():
    """Mean-pooled, normalized embeddings of real sentences: cosine >= 0.99999 to transformers fp32, and element-wise
    within 3x transformers' own RMS error against float64."""
    directory = minilm_directory()
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    texts = default_texts()
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    mask = batch["attention_mask"].unsqueeze(-1).double()

    def embed(model) -> torch.Tensor:
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state.double()
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    ours = embed(fast(hfbert.BertModel.from_pretrained(directory)))
    theirs = embed(transformers_model(directory))
    exact = embed(transformers_model(directory).double())
    assert torch.nn.functional.cosine_similarity(ours, theirs).min() >= 0.99999
    record = Accuracy().add(ours, theirs, exact)
    assert record.theirs > 0 and record.passed(ratio=3.0), record


@packs
def test_training_gradients_and_a_changed_weight_run_the_plain_computation(checkpoint):
    model = fast(hfbert.BertModel.from_pretrained(checkpoint))
    reference = hfbert.BertModel.from_pretrained(checkpoint).eval()
    batch = make_batches(model.config.vocab_size, model.config.type_vocab_size, model.config.hidden_size)[0].kwargs
    # Gradients asked for: the plain computation, the plain model's numbers bit for bit.
    ours = model(**batch).last_hidden_state
    expected = reference(**batch).last_hidden_state
    assert torch.equal(ours, expected)
    ours.sum().backward()
    assert model.encoder.layer[0].attention.self.query.weight.grad is not None
    # An in-place change of a fused weight is seen by the next inference call (the packed form is rebuilt): the
    # output moves, and lands within rounding of the plain model's (exactly on it, on some CPUs).
    with torch.no_grad():
        before = model(**batch).last_hidden_state
        for module in (model, reference):
            module.encoder.layer[0].intermediate.dense.weight.mul_(1.5)
        after = model(**batch).last_hidden_state
        error = (after - reference(**batch).last_hidden_state).abs().max()
    assert (after - before).abs().max() > 1e-2
    assert error <= 1e-3


@pytest.mark.slow  # torch.compile of a bert-base-sized model
@packs
def test_copies_pickles_and_compile_run(bert_base_safetensors_dir):
    model = fast(hfbert.BertModel.from_pretrained(bert_base_safetensors_dir))
    inputs = dict(input_ids=torch.tensor([[101, 7592, 2088, 102]]))
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert torch.equal(other(**inputs).last_hidden_state, expected)
        compiled = torch.compile(model, backend="aot_eager")
        assert (compiled(**inputs).last_hidden_state - expected).abs().max() <= 1e-4


def test_where_nothing_can_be_fused_nothing_changes():
    """float64 (oneDNN's fused products are fp32 only): the model runs as before."""
    model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)).double()
    fast(model)
    assert not hfbert.inference.packed_layers(model)
    assert not any(type(module) in FUSED.values() for module in model.modules())
