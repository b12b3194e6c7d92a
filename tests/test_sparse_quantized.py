"""SPLADE's vocabulary projection in the int8 and bf16 modes (issue 69): the masked-LM decoder, whose weight is the
word embeddings' (a tie), runs in the mode's kernel like every other large linear layer.

The tie is the Parameter object: the swapped decoder holds it, so `parameters()`, `state_dict()` and
`save_pretrained()` are what they were, bit for bit, and `restore_weights` gives the decoder back tied. Its form
follows the shared weight however it changes (through the embeddings too: `.data` writes, in-place writes,
`load_state_dict`), checked element-wise against transformers' masked LM given the same change. The sparse vectors
keep the mode's contract for sparse output (`hfbert.inference.SPARSE_BOUNDS`) against sentence-transformers'
SparseEncoder run in float64, and stay within it of its fp32 vectors element-wise: on the tiny SPLADE folders of
tests/test_sparse.py in the default run, on a SPLADE folder of the real all-MiniLM-L6-v2 in the slow one.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

import hfbert
from hfbert.inference import SPARSE_BOUNDS, inference_mode_of, packed_layers, restore_weights
from hfbert.inference.bf16 import BF16Linear, bf16_available
from hfbert.inference.int8 import Int8Linear, int8_available

from support.helpers import swap_as_at_bert_base
from support.members import MODEL_TYPES, TINY, reference_checkpoint
from support.retrieval import DOCUMENTS, splade_folder

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
bf16 = pytest.mark.skipif(not bf16_available(), reason="this CPU does not compute bf16 natively (no AVX512-BF16/AMX)")
MODES = {
    "int8": (dict(quantize="int8"), Int8Linear),
    "bf16": (dict(precision="bf16"), BF16Linear),
}


def modes():
    marks = {"int8": int8, "bf16": bf16}
    return pytest.mark.parametrize("mode", [pytest.param(name, marks=marks[name]) for name in MODES])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """transformers' tiny masked LM of a member (random weights, decoder tied), written once per module."""
    written = {}

    def make(model_type: str):
        if model_type not in written:
            directory = tmp_path_factory.mktemp("masked-lm") / model_type
            written[model_type] = reference_checkpoint(directory, model_type, "masked-lm")
        return written[model_type]

    return make


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    """A member's tiny SPLADE folder written by sentence-transformers (max of relu), once per module."""
    pytest.importorskip("sentence_transformers")
    written = {}

    def make(member: str):
        if member not in written:
            written[member] = splade_folder(tmp_path_factory.mktemp("splade") / member, member, "max")
        return written[member]

    return make


def decoder_name(model: torch.nn.Module) -> str:
    decoder = model.get_output_embeddings()
    return next(name for name, module in model.named_modules() if module is decoder)


# -- the tie --------------------------------------------------------------------------------------------------------
# One member per head layout in the default run (BERT's `cls.predictions`, RoBERTa's `lm_head`, MPNet's, ModernBERT's
# `decoder`), every member in the slow one.
HEAD_LAYOUTS = ("bert", "roberta", "mpnet", "modernbert")


@modes()
@pytest.mark.parametrize(
    "model_type",
    [pytest.param(name, marks=[] if name in HEAD_LAYOUTS else [pytest.mark.slow]) for name in MODEL_TYPES],
)
def test_the_decoder_is_swapped_and_the_tie_survives_the_swap_and_restore(
    model_type, mode, checkpoint, tmp_path, monkeypatch
):
    model = hfbert.AutoModelForMaskedLM.from_pretrained(checkpoint(model_type)).eval()
    plain = copy.deepcopy(model)
    parameters = [(name, id(parameter)) for name, parameter in model.named_parameters(remove_duplicate=False)]
    swap_as_at_bert_base(monkeypatch, TINY["hidden_size"])
    options, swapped_class = MODES[mode]
    hfbert.optimize_for_inference(model, **options)

    name, embeddings = decoder_name(model), model.get_input_embeddings()
    decoder = model.get_output_embeddings()
    assert type(decoder) is swapped_class and packed_layers(model)[name] == mode
    assert decoder.weight is embeddings.weight and decoder._form is not None
    assert decoder._keep_pages  # the embeddings read the shared weight at every forward: its pages are not let go
    assert [(name, id(p)) for name, p in model.named_parameters(remove_duplicate=False)] == parameters
    state, expected = model.state_dict(), plain.state_dict()
    assert list(state) == list(expected) and all(torch.equal(state[key], expected[key]) for key in expected)
    assert inference_mode_of(model).plain is None
    model.save_pretrained(tmp_path / "optimized")
    plain.save_pretrained(tmp_path / "plain")
    saved, plain_saved = (load_file(tmp_path / folder / "model.safetensors") for folder in ("optimized", "plain"))
    assert list(saved) == list(plain_saved) and all(torch.equal(saved[key], plain_saved[key]) for key in saved)

    restore_weights(model)
    assert type(model.get_output_embeddings()) is torch.nn.Linear
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert [(name, id(p)) for name, p in model.named_parameters(remove_duplicate=False)] == parameters


# -- weight changes -------------------------------------------------------------------------------------------------
# The largest element-wise difference from transformers' fp32 logits allowed (logits of about 10 here): the mode's
# rounding; a stale form would be off by the change's own effect, many times that.
LOGIT_BOUNDS = {"int8": 0.15, "bf16": 0.06}


def tied_pair(directory, monkeypatch, mode: str):
    """hfbert's BertForMaskedLM optimized in `mode` and transformers' with the same weights."""
    import transformers

    reference = transformers.BertForMaskedLM.from_pretrained(directory).eval()
    model = hfbert.BertForMaskedLM.from_pretrained(directory)
    swap_as_at_bert_base(monkeypatch, TINY["hidden_size"])
    hfbert.optimize_for_inference(model, **MODES[mode][0])
    assert type(model.cls.predictions.decoder) is MODES[mode][1]
    return model, reference


def logits(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.randint(5, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids).logits


def _data_mul(embeddings):
    embeddings.weight.data.mul_(3)


def _data_copy(embeddings):
    embeddings.weight.data.copy_(embeddings.weight.data.flip(0))


def _in_place_under_no_grad(embeddings):
    with torch.no_grad():
        embeddings.weight.mul_(3)


def _data_replaced(embeddings):
    embeddings.weight.data = embeddings.weight.data.flip(0).contiguous()


def _embeddings_load_state_dict(embeddings):
    embeddings.load_state_dict({"weight": embeddings.weight.detach().flip(0) * 2})


CHANGES = {
    "weight.data.mul_": _data_mul,
    "weight.data.copy_": _data_copy,
    "weight.mul_ under no_grad": _in_place_under_no_grad,
    "weight.data = new tensor": _data_replaced,
    "embeddings.load_state_dict": _embeddings_load_state_dict,
}


@modes()
@pytest.mark.parametrize("change", [*CHANGES, "model.load_state_dict"])
def test_a_change_of_the_tied_weight_after_the_swap_is_followed(mode, change, checkpoint, monkeypatch):
    """Each change made to the word embeddings (the tie's other holder), or a whole new state dict: the decoder's
    logits are transformers' on the changed weights, within the mode's rounding."""
    model, reference = tied_pair(checkpoint("bert"), monkeypatch, mode)
    before = logits(model)
    if change == "model.load_state_dict":
        state = model.state_dict()
        other = {name: tensor * 2 if "word_embeddings" in name else tensor for name, tensor in state.items()}
        for network in (model, reference):
            network.load_state_dict(other)
    else:
        for network in (model, reference):
            CHANGES[change](network.get_input_embeddings())
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    expected = logits(reference)
    difference = float((logits(model) - expected).abs().max())
    effect = float((before - expected).abs().max())
    print(f"{mode}, {change}: max abs difference {difference:.3g}, the change's effect {effect:.3g}")
    assert difference < LOGIT_BOUNDS[mode] < effect / 5, (difference, effect)


@modes()
def test_a_peft_merge_into_the_tied_decoder_is_followed(mode, checkpoint, monkeypatch):
    """PEFT's LoRA on the decoder, merged through `.data` into the shared weight (`merge_and_unload`): the optimized
    model's logits are transformers' merged model's."""
    peft = pytest.importorskip("peft", reason="the LoRA test runs real PEFT")
    model, reference = tied_pair(checkpoint("bert"), monkeypatch, mode)
    before = logits(model)
    config = peft.LoraConfig(target_modules=["decoder"], r=8, lora_alpha=32, init_lora_weights=False)
    torch.manual_seed(1)
    model, reference = peft.get_peft_model(model, config), peft.get_peft_model(reference, config)
    reference.load_state_dict(model.state_dict())
    model, reference = model.merge_and_unload(), reference.merge_and_unload()
    assert type(model.cls.predictions.decoder) is MODES[mode][1]
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    expected = logits(reference)
    difference = float((logits(model) - expected).abs().max())
    effect = float((before - expected).abs().max())
    print(f"{mode}, PEFT merge: max abs difference {difference:.3g}, the change's effect {effect:.3g}")
    assert difference < LOGIT_BOUNDS[mode] < effect / 5, (difference, effect)


# -- the sparse vectors' contract -----------------------------------------------------------------------------------
def sparse_errors(ours: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """(relative RMS, largest element-wise error over the largest weight) of `ours` against `exact`."""
    difference = ours.double() - exact
    scale = exact.square().mean().sqrt()
    return float(difference.square().mean().sqrt() / scale), float(difference.abs().max() / exact.abs().max())


def check_contract(mode: str, directory, texts: list[str], encoder: hfbert.SparseEncoder) -> tuple[float, float]:
    """`encoder`'s vectors of `texts` against sentence-transformers' SparseEncoder in float64 (the bound) and in
    fp32 (element-wise within it); returns the errors against float64."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    theirs = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    fp32 = theirs.encode(texts, batch_size=8, convert_to_sparse_tensor=False).double()
    exact = theirs.to(torch.float64).encode(texts, batch_size=8, convert_to_sparse_tensor=False)
    assert exact.dtype == torch.float64
    vectors = encoder.encode(texts, batch_size=8, convert_to_sparse_tensor=False)
    relative_rms, largest = SPARSE_BOUNDS[mode]
    errors = sparse_errors(vectors, exact)
    assert 0 < errors[0] <= relative_rms and errors[1] <= largest, errors
    near = sparse_errors(vectors, fp32)
    assert near[0] <= relative_rms and near[1] <= largest, near
    print(f"{mode}: relative RMS {errors[0]:.4f}, largest error {errors[1]:.4f} of the largest weight")
    return errors


@modes()
@pytest.mark.parametrize("member", ["bert", pytest.param("xlm-roberta", marks=pytest.mark.slow)])
def test_sparse_vectors_keep_the_contract(mode, member, splade, monkeypatch):
    """A tiny SPLADE folder written by sentence-transformers (max of relu, about half the vocabulary absent from a
    text), the thresholds lowered to these small layers' (where bert-base's sit): the projection runs in the mode's
    kernel, and the vectors keep the contract."""
    directory = splade(member)
    swap_as_at_bert_base(monkeypatch, json.loads((directory / "config.json").read_text())["hidden_size"])
    encoder = hfbert.SparseEncoder(directory, **MODES[mode][0])
    assert type(encoder.model.get_output_embeddings()) is MODES[mode][1]
    assert packed_layers(encoder.model)[decoder_name(encoder.model)] == mode
    check_contract(mode, directory, DOCUMENTS, encoder)


@pytest.mark.slow  # the real all-MiniLM-L6-v2, a 30,522-token projection, three encoders
@modes()
def test_real_minilm_splade_vectors_keep_the_contract(mode, tmp_path):
    """all-MiniLM-L6-v2's real encoder under a masked-LM head (benchmarks/peer_retrieval.py's SPLADE folder: max of
    log1p_relu), 64 real texts of 1 to 12 sentences: the default thresholds swap the projection."""
    from benchmarks.peer_measurement import real_texts
    from benchmarks.peer_retrieval import splade_folder as minilm_splade_folder

    directory = minilm_splade_folder(tmp_path / "splade")
    encoder = hfbert.SparseEncoder(directory, **MODES[mode][0])
    assert packed_layers(encoder.model)["cls.predictions.decoder"] == mode
    check_contract(mode, directory, real_texts(64), encoder)
