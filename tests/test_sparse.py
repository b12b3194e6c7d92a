"""`hfbert.SparseEncoder` and `hfbert embed --sparse` return what sentence-transformers' `SparseEncoder.encode`
returns on the same SPLADE folder (issue #52): weights element-wise within 1e-5, the same nonzero set, the same
return types.

The reference is sentence-transformers itself, on folders its SparseEncoder saved (`support.retrieval.splade_folder`:
transformers' BertForMaskedLM, XLMRobertaForMaskedLM and MPNetForMaskedLM with random weights, the head's bias
lowered so that about half the vocabulary is absent from a text, small tokenizers) with MLMTransformer or a fill-mask
Transformer, then SpladePooling max or sum (relu, or log1p_relu), in 6.x's module names and 5.x's
(`sentence_transformers.sparse_encoder.models.*`), and a plain masked-LM checkpoint (SparseEncoder's default). Texts
of mixed lengths in batches of 4 (padded batches, one truncated text, an empty one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import hfbert
from hfbert.cli import main
from hfbert.tools import sparse

from support.helpers import swap_as_at_bert_base
from support.retrieval import DOCUMENTS, splade_folder, transformers_checkpoint

sentence_transformers = pytest.importorskip("sentence_transformers")
MAX_ABS = 1e-5
# name: (member, pooling, layout, SpladePooling options)
CASES = {
    "bert-max": ("bert", "max", "6.x", {}),
    "bert-sum": ("bert", "sum", "6.x", {}),
    "bert-5.x-max": ("bert", "max", "5.x", {}),
    "bert-transformer-sum-log1p": ("bert", "sum", "transformer", {"activation_function": "log1p_relu"}),
    "xlm-roberta-max": ("xlm-roberta", "max", "6.x", {}),
    "mpnet-sum": ("mpnet", "sum", "6.x", {}),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder of a CASES entry (or "plain": a transformers BertForMaskedLM alone), written once per module."""
    written: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in written:
            directory = tmp_path_factory.mktemp("splade") / name
            if name == "plain":
                written[name] = transformers_checkpoint(directory, "bert", "ForMaskedLM")
            else:
                member, pooling, layout, options = CASES[name]
                written[name] = splade_folder(directory, member, pooling, layout, **options)
        return written[name]

    return make


def reference(directory: Path, **options):
    return sentence_transformers.SparseEncoder(str(directory), device="cpu", **options)


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Max abs difference of two vectors (sparse or dense), after checking that they have the same layout, shape,
    dtype and nonzero set."""
    assert (ours.layout, ours.shape, ours.dtype) == (theirs.layout, theirs.shape, theirs.dtype)
    ours, theirs = ours.to_dense(), theirs.to_dense()
    assert torch.equal(ours != 0, theirs != 0), f"{int(((ours != 0) != (theirs != 0)).sum())} entries differ in zeros"
    return float((ours.double() - theirs.double()).abs().max()) if ours.numel() else 0.0


@pytest.mark.parametrize("name", [*CASES, "plain"])
def test_encode_equals_sentence_transformers(folder, name):
    directory = folder(name)
    theirs = reference(directory)
    if name == "bert-5.x-max":  # the reference read the old module names as meant
        assert [type(module).__name__ for module in theirs] == ["MLMTransformer", "SpladePooling"]
    assert len(theirs.tokenizer(DOCUMENTS[1])["input_ids"]) > 10  # the small tokenizer splits a text into many ids
    expected = theirs.encode(DOCUMENTS, batch_size=4)
    ours = hfbert.SparseEncoder(directory)
    vectors = ours.encode(DOCUMENTS, batch_size=4)
    difference = compare(vectors, expected)
    present = float((expected.to_dense()[:-2] != 0).float().mean())  # without the empty text and "Yes."
    print(f"{name}: {ours.describe()}; {present:.0%} of the vocabulary present; max abs {difference:.2e}")
    assert 0.1 < present < 0.9  # zeros and weights both: the nonzero set says something
    assert difference <= MAX_ABS
    assert ours.max_length == theirs.max_seq_length and ours.dimension == expected.shape[1]
    assert ours.pooling_strategy == theirs[1].pooling_strategy


ARGUMENTS = [
    {},
    {"convert_to_sparse_tensor": False},
    {"convert_to_tensor": False},
    {"convert_to_tensor": False, "convert_to_sparse_tensor": False},
]


@pytest.mark.parametrize("arguments", ARGUMENTS, ids=lambda arguments: ",".join(arguments) or "default")
def test_encode_returns_what_sentence_transformers_returns(folder, arguments):
    """Types, layouts and shapes for each return option, for texts, one text and none."""
    directory = folder("bert-max")
    theirs, ours = reference(directory), hfbert.SparseEncoder(directory)
    for inputs in (DOCUMENTS[:5], DOCUMENTS[2], []):
        expected = theirs.encode(inputs, batch_size=2, **arguments)
        vectors = ours.encode(inputs, batch_size=2, **arguments)
        assert type(vectors) is type(expected)
        if isinstance(expected, list):
            assert len(vectors) == len(expected)
            for vector, reference_vector in zip(vectors, expected, strict=True):
                assert compare(vector, reference_vector) <= MAX_ABS
        else:
            assert compare(vectors, expected) <= MAX_ABS


def test_one_text_gives_one_dict_of_token_weights(folder, tmp_path):
    """`token_weights` of a str: that text's one {token: weight} dict (sentence-transformers' one vector), not one
    per character; `sparse_file` refuses a str, naming `texts`."""
    directory = folder("bert-max")
    theirs, ours = reference(directory), hfbert.SparseEncoder(directory)
    text = DOCUMENTS[1]
    vector = theirs.encode(text).to_dense()
    assert vector.shape == (ours.dimension,)
    ids = vector.nonzero().flatten().tolist()
    expected = dict(zip(theirs.tokenizer.convert_ids_to_tokens(ids), vector[ids].tolist(), strict=True))
    weights = ours.token_weights(text)
    assert isinstance(weights, dict) and set(weights) == set(expected) and len(expected) > 10
    assert all(abs(weights[token] - weight) <= MAX_ABS for token, weight in expected.items())
    with pytest.raises(TypeError, match="texts is a str"):
        sparse.sparse_file(ours, text, tmp_path / "weights.jsonl", progress=False)


def test_max_active_dims_from_the_folder_and_the_argument(folder, tmp_path):
    directory = shutil.copytree(folder("bert-sum"), tmp_path / "active")
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["max_active_dims"] = 7
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    theirs, ours = reference(directory), hfbert.SparseEncoder(directory)
    expected = theirs.encode(DOCUMENTS)
    assert int((expected.to_dense()[0] != 0).sum()) == 7
    assert compare(ours.encode(DOCUMENTS), expected) <= MAX_ABS
    assert compare(ours.encode(DOCUMENTS, max_active_dims=3), theirs.encode(DOCUMENTS, max_active_dims=3)) <= MAX_ABS


def test_prompts_as_encode_query_and_encode_document(folder, tmp_path):
    directory = shutil.copytree(folder("bert-max"), tmp_path / "prompts")
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["prompts"] = {"query": "query: ", "document": "passage: "}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    theirs, ours = reference(directory), hfbert.SparseEncoder(directory)
    for method in ("encode_query", "encode_document"):
        expected = getattr(theirs, method)(DOCUMENTS, batch_size=4)
        assert compare(getattr(ours, method)(DOCUMENTS, batch_size=4), expected) <= MAX_ABS
        assert not torch.equal(expected.to_dense(), theirs.encode(DOCUMENTS).to_dense())  # the prompt changed them
    expected = theirs.encode(DOCUMENTS, prompt="search: ")
    assert compare(ours.encode(DOCUMENTS, prompt="search: "), expected) <= MAX_ABS


@pytest.mark.parametrize("name", ["bert-sum", "xlm-roberta-max"])
def test_the_vocabulary_projection_runs_in_chunks_of_tokens(folder, name, monkeypatch):
    """With a chunk of 3 tokens' logits, the head never sees more than 3 tokens at once, and the vectors are the
    same (chunks cut across texts and batches)."""
    directory = folder(name)
    ours = hfbert.SparseEncoder(directory)
    monkeypatch.setattr(sparse, "VOCABULARY_CHUNK", 3 * ours.dimension)
    rows = []
    ours.model.prediction_head.register_forward_hook(lambda module, inputs, output: rows.append(inputs[0].shape[0]))
    vectors = ours.encode(DOCUMENTS, batch_size=4)
    assert max(rows) == 3 and sum(rows) > 3 * len(DOCUMENTS)
    assert compare(vectors, reference(directory).encode(DOCUMENTS, batch_size=4)) <= MAX_ABS


def test_embed_sparse_writes_token_weights_in_input_order(folder, tmp_path, capsys):
    directory = folder("bert-max")
    theirs = reference(directory)
    expected = theirs.encode(DOCUMENTS).to_dense()
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(text + "\n" for text in DOCUMENTS), encoding="utf-8")
    out = tmp_path / "weights.jsonl"
    capsys.readouterr()
    assert (
        main(["embed", str(directory), "--sparse", "--file", str(texts), "--out", str(out), "--batch-size", "3"]) == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["index"] for record in records] == list(range(len(DOCUMENTS)))
    for record, vector in zip(records, expected, strict=True):
        ids = vector.nonzero().flatten().tolist()
        weights = dict(zip(theirs.tokenizer.convert_ids_to_tokens(ids), vector[ids].tolist(), strict=True))
        assert set(record["embedding"]) == set(weights)
        assert all(abs(record["embedding"][token] - weight) <= MAX_ABS for token, weight in weights.items())
        assert list(record["embedding"].values()) == sorted(record["embedding"].values(), reverse=True)
    stderr = capsys.readouterr().err
    assert f"wrote {len(DOCUMENTS)} sparse vectors over a vocabulary of {expected.shape[1]} to {out}" in stderr


def test_a_folder_without_a_masked_lm_head_is_refused(tmp_path, capsys):
    """config.json naming no masked LM, and one naming a masked LM whose weights have no head: one error each,
    naming the file or the folder."""
    encoder_only = transformers_checkpoint(tmp_path / "encoder", "bert", "Model")
    with pytest.raises(ValueError, match=r"config\.json: architectures \['BertModel'\] name no \.\.\.ForMaskedLM"):
        hfbert.SparseEncoder(encoder_only)
    headless = shutil.copytree(encoder_only, tmp_path / "headless")
    config = json.loads((headless / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (headless / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has no masked-LM pre-training head \(no cls\.predictions\.\* tensors"):
        hfbert.SparseEncoder(headless)
    capsys.readouterr()
    assert main(["embed", str(encoder_only), "a text", "--sparse"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(encoder_only / "config.json") in lines[0]


def test_modules_other_than_splade_are_refused_by_name(folder, tmp_path):
    directory = shutil.copytree(folder("bert-max"), tmp_path / "static")
    modules = json.loads((directory / "modules.json").read_text())
    modules[1]["type"] = "sentence_transformers.sparse_encoder.modules.SparseStaticEmbedding"
    (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="modules.json: modules .*SparseStaticEmbedding"):
        hfbert.SparseEncoder(directory)
    directory = shutil.copytree(folder("bert-sum"), tmp_path / "no-pooling-config")
    (directory / "1_SpladePooling" / "config.json").unlink()
    with pytest.raises(ValueError, match="1_SpladePooling/config.json: missing"):
        hfbert.SparseEncoder(directory)


def test_embed_sparse_usage(folder, capsys):
    directory = str(folder("bert-max"))
    with pytest.raises(SystemExit) as usage:
        main(["embed", directory, "a text", "--sparse", "--pooling", "cls"])
    assert usage.value.code == 2 and "--pooling does not apply to --sparse" in capsys.readouterr().err
    assert main(["embed", directory, "a text", "--sparse", "--out", "weights.npy"]) == 1
    assert "use .jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["bert-max", "xlm-roberta-max"])
def test_int8_runs_int8_products_and_stays_near_sentence_transformers(folder, name, monkeypatch, tmp_path, capsys):
    """`quantize="int8"` (opt-in, lossy): the encoder's products in int8 (the size threshold lowered to these small
    layers', where bert-base's layers sit); the weights move off fp32's and stay within int8's error of
    sentence-transformers' fp32 ones (RMS of the difference over the weights' RMS, bound 0.05). `embed --sparse
    --quantize int8` writes the int8 encoder's weights."""
    directory = folder(name)
    swap_as_at_bert_base(monkeypatch, json.loads((directory / "config.json").read_text())["hidden_size"])
    expected = reference(directory).encode(DOCUMENTS).to_dense().double()
    ours = hfbert.SparseEncoder(directory, quantize="int8")
    kernels = hfbert.inference.packed_layers(ours.model)
    assert sum(kind == "int8" for kind in kernels.values()) >= 3 * ours.model.config.num_hidden_layers, kernels
    # The vocabulary projection (tied to the word embeddings) runs in int8 too.
    assert any(layer.endswith("decoder") and kind == "int8" for layer, kind in kernels.items()), kernels
    vectors = ours.encode(DOCUMENTS).to_dense().double()
    difference = vectors - expected
    error = float(difference.square().mean().sqrt() / expected.square().mean().sqrt())
    print(f"{name}: int8 relative RMS {error:.4f}, max abs {float(difference.abs().max()):.2e}")
    assert float(difference.abs().max()) > 0 and error <= 0.05  # measured 0.013 on both

    texts = tmp_path / "texts.txt"
    texts.write_text("".join(text + "\n" for text in DOCUMENTS), encoding="utf-8")
    out = tmp_path / "weights.jsonl"
    capsys.readouterr()
    assert (
        main(["embed", str(directory), "--sparse", "--quantize", "int8", "--file", str(texts), "--out", str(out)]) == 0
    )
    written = [json.loads(line)["embedding"] for line in out.read_text().splitlines()]
    assert written == ours.token_weights(DOCUMENTS)
