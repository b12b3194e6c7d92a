"""`hfbert.CrossEncoder` and `hfbert rerank` return what sentence-transformers' `CrossEncoder` returns on the same
folder (issue #52): scores element-wise within 1e-5, the same types, shapes, order and keys.

The reference is sentence-transformers itself, loading the folder it (or transformers) wrote
(`support.retrieval.cross_encoder_folder`): BERT, XLM-R, RoBERTa and MPNet sequence classifiers with random weights
(scores spread over units), small tokenizers, one label (the default activation from each place sentence-transformers
reads it: config_sentence_transformers.json, config.json's `sentence_transformers`, the legacy
`sbert_ce_default_activation_function`, none) and three labels. 33 pairs of mixed lengths in batches of 8: padded
batches, a last batch of one, pairs truncated `longest_first`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert
from hfbert.cli import main

from support.helpers import swap_as_at_bert_base
from support.retrieval import DOCUMENTS, QUERIES, cross_encoder_folder, transformers_checkpoint

sentence_transformers = pytest.importorskip("sentence_transformers")
MAX_ABS = 1e-5  # fp32 rounding: hfbert's kernels sum in another order than transformers'
PAIRS = [(query, document) for query in QUERIES for document in DOCUMENTS]
IDENTITY = "torch.nn.modules.linear.Identity"
# name: (member, labels, layout, activation)
CASES = {
    "bert-6.x-sigmoid": ("bert", 1, "6.x", None),
    "bert-legacy-identity": ("bert", 1, "legacy", IDENTITY),
    "bert-plain-short": ("bert", 1, "plain", None),  # Sigmoid by default; 24 tokens: pairs truncated
    "xlm-roberta-6.x-identity": ("xlm-roberta", 1, "6.x", torch.nn.Identity()),
    "xlm-roberta-3-labels": ("xlm-roberta", 3, "6.x", None),
    "roberta-5.x-tanh": ("roberta", 1, "5.x", "torch.nn.modules.activation.Tanh"),
    "mpnet-6.x": ("mpnet", 1, "6.x", None),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder of a CASES entry, written once per module."""
    written: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in written:
            member, labels, layout, activation = CASES[name]
            fields = {"model_max_length": 24} if name == "bert-plain-short" else {}
            directory = tmp_path_factory.mktemp("rerank") / name
            written[name] = cross_encoder_folder(directory, member, labels, layout, activation, **fields)
        return written[name]

    return make


def reference(directory: Path, **options):
    return sentence_transformers.CrossEncoder(str(directory), device="cpu", **options)


def max_abs(ours, theirs) -> float:
    return float(np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64)).max())


@pytest.mark.parametrize("name", CASES)
def test_predict_equals_sentence_transformers(folder, name):
    directory = folder(name)
    theirs = reference(directory)
    assert len(theirs.tokenizer(DOCUMENTS[1])["input_ids"]) > 10  # the small tokenizer splits a text into many ids
    expected = theirs.predict(PAIRS, batch_size=8)
    ours = hfbert.CrossEncoder(directory)
    scores = ours.predict(PAIRS, batch_size=8)
    assert type(scores) is np.ndarray and scores.dtype == expected.dtype == np.float32
    assert scores.shape == expected.shape
    assert np.ptp(expected) > 0.01  # scores differ from pair to pair (1000x the tolerance): a wrong pair shows
    difference = max_abs(scores, expected)
    print(f"{name}: {ours.describe()}; max abs {difference:.2e}")
    assert difference <= MAX_ABS
    assert ours.max_length == theirs.max_seq_length
    assert type(ours.activation_fn) is type(theirs.activation_fn)


ARGUMENTS = [
    {"convert_to_tensor": True},
    {"convert_to_numpy": False},
    {"apply_softmax": True},
    {"activation_fn": torch.nn.Sigmoid()},
    {"apply_softmax": True, "convert_to_tensor": True},
]


@pytest.mark.parametrize("name", ["bert-6.x-sigmoid", "xlm-roberta-3-labels"])
@pytest.mark.parametrize("arguments", ARGUMENTS, ids=lambda arguments: ",".join(arguments))
def test_predict_returns_what_sentence_transformers_returns(folder, name, arguments):
    """Types and shapes for each return option, one label and three, one pair and none."""
    directory = folder(name)
    theirs, ours = reference(directory), hfbert.CrossEncoder(directory)
    pairs = PAIRS[:13]
    for inputs in (pairs, pairs[4], []):
        expected = theirs.predict(inputs, batch_size=4, **arguments)
        scores = ours.predict(inputs, batch_size=4, **arguments)
        assert type(scores) is type(expected)
        if isinstance(expected, list):
            assert [type(s) for s in scores] == [type(s) for s in expected]
            assert [s.shape for s in scores] == [s.shape for s in expected]
            scores, expected = [s.tolist() for s in scores], [s.tolist() for s in expected]
        else:
            assert scores.shape == expected.shape and scores.dtype == expected.dtype
        if len(inputs):
            assert max_abs(scores, expected) <= MAX_ABS


def test_three_labels_softmax_sums_to_one_and_one_label_ignores_it(folder):
    three = hfbert.CrossEncoder(folder("xlm-roberta-3-labels"))
    assert three.num_labels == 3 and isinstance(three.activation_fn, torch.nn.Identity)
    assert np.allclose(three.predict(PAIRS, apply_softmax=True).sum(axis=1), 1.0, atol=1e-6)
    one = hfbert.CrossEncoder(folder("bert-6.x-sigmoid"))
    assert np.array_equal(one.predict(PAIRS, apply_softmax=True), one.predict(PAIRS))


@pytest.mark.parametrize("name", ["bert-legacy-identity", "xlm-roberta-6.x-identity"])
def test_rank_equals_sentence_transformers(folder, name):
    directory = folder(name)
    theirs, ours = reference(directory), hfbert.CrossEncoder(directory)
    query = QUERIES[0]
    for options in ({}, {"top_k": 4}, {"return_documents": True, "top_k": 20}):
        expected = theirs.rank(query, DOCUMENTS, batch_size=4, **options)
        ranked = ours.rank(query, DOCUMENTS, batch_size=4, **options)
        assert [r["corpus_id"] for r in ranked] == [r["corpus_id"] for r in expected]
        assert [set(r) for r in ranked] == [set(r) for r in expected]
        assert all(type(r["score"]) is float for r in ranked)
        assert max_abs([r["score"] for r in ranked], [r["score"] for r in expected]) <= MAX_ABS
        if options.get("return_documents"):
            assert [r["text"] for r in ranked] == [r["text"] for r in expected]


def test_rank_refuses_several_labels_as_sentence_transformers(folder):
    directory = folder("xlm-roberta-3-labels")
    with pytest.raises(ValueError, match="num_labels=1") as expected:
        reference(directory).rank(QUERIES[0], DOCUMENTS)
    with pytest.raises(ValueError) as ours:
        hfbert.CrossEncoder(directory).rank(QUERIES[0], DOCUMENTS)
    assert str(ours.value) == str(expected.value)


def test_rank_refuses_a_str_of_documents_and_a_query_that_is_no_str(folder, tmp_path):
    """sentence-transformers ranks a str of documents character by character; hfbert says what to give, in `rank`
    and `rank_file` alike, as `predict` does for a str."""
    from hfbert.tools.reranking import rank_file

    directory = folder("bert-6.x-sigmoid")
    assert len(reference(directory).rank(QUERIES[0], DOCUMENTS[0])) == len(DOCUMENTS[0])  # one per character
    ours = hfbert.CrossEncoder(directory)
    out = tmp_path / "ranked.jsonl"
    for call in (ours.rank, lambda query, documents: rank_file(ours, query, documents, out, progress=False)):
        with pytest.raises(TypeError, match=r"documents is a str: give a list of texts \(\[text\] for one\)"):
            call(QUERIES[0], DOCUMENTS[0])
        with pytest.raises(TypeError, match=r"query is a list; expected one text \(a str\)"):
            call(QUERIES, DOCUMENTS)
    assert not out.exists()
    with pytest.raises(TypeError, match="inputs must be a list of"):
        ours.predict(DOCUMENTS[0])


def test_length_capped_at_the_models_longest_input(tmp_path):
    """A tokenizer without a limit: XLM-R's 514 positions take 512 tokens, which hfbert truncates to (its scores
    equal sentence-transformers told max_length=512; left at its own 514 it would index past the position table)."""
    directory = cross_encoder_folder(tmp_path / "xlmr", "xlm-roberta", model_max_length=int(1e30))
    assert reference(directory).max_seq_length == 514
    ours = hfbert.CrossEncoder(directory)
    assert ours.max_length == 512
    long_pairs = [(QUERIES[0], " ".join(DOCUMENTS * 8)), (" ".join(DOCUMENTS * 8), "short"), PAIRS[0]]
    assert len(ours.tokenizer(*long_pairs[0])["input_ids"]) > 600
    expected = reference(directory, max_length=512).predict(long_pairs)
    assert max_abs(ours.predict(long_pairs), expected) <= MAX_ABS


def test_an_activation_outside_torch_is_ignored_with_a_warning(folder, tmp_path):
    """config_sentence_transformers.json names custom code: sentence-transformers ignores it without
    trust_remote_code and takes the next source (here config.json's Identity); so does hfbert, and says so."""
    directory = shutil.copytree(folder("bert-6.x-sigmoid"), tmp_path / "custom")
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["activation_fn"] = "my_package.activations.Sharpen"
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    config = json.loads((directory / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": IDENTITY}
    (directory / "config.json").write_text(json.dumps(config))
    theirs = reference(directory)
    assert isinstance(theirs.activation_fn, torch.nn.Identity)
    with pytest.warns(UserWarning, match="my_package.activations.Sharpen"):
        ours = hfbert.CrossEncoder(directory)
    assert isinstance(ours.activation_fn, torch.nn.Identity)
    assert max_abs(ours.predict(PAIRS), theirs.predict(PAIRS)) <= MAX_ABS


def test_a_torch_path_that_is_no_activation_is_refused_naming_the_file(folder, tmp_path):
    directory = shutil.copytree(folder("bert-6.x-sigmoid"), tmp_path / "linear")
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["activation_fn"] = "torch.nn.modules.linear.Linear"
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=r"config_sentence_transformers.json activation_fn 'torch.nn.modules.linear"):
        hfbert.CrossEncoder(directory)


def test_a_folder_without_a_classification_head_is_refused(tmp_path, capsys):
    directory = transformers_checkpoint(tmp_path / "mlm", "bert", "ForMaskedLM")
    with pytest.raises(ValueError, match="has no classification head") as error:
        hfbert.CrossEncoder(directory)
    assert str(directory) in str(error.value)
    capsys.readouterr()
    assert main(["rerank", str(directory), "a document", "--query", "q"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(directory) in lines[0] and "classification head" in lines[0]


def test_cli_prints_rank_as_json_lines(folder, tmp_path, capsys):
    directory = folder("bert-legacy-identity")
    documents = tmp_path / "docs.txt"
    documents.write_text("".join(document + "\n" for document in DOCUMENTS), encoding="utf-8")
    expected = reference(directory).rank(QUERIES[1], DOCUMENTS)
    assert main(["rerank", str(directory), "--query", QUERIES[1], "--file", str(documents)]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()]
    assert [set(line) for line in lines] == [{"index", "score"}] * len(DOCUMENTS)
    assert [line["index"] for line in lines] == [r["corpus_id"] for r in expected]
    assert max_abs([line["score"] for line in lines], [r["score"] for r in expected]) <= MAX_ABS
    assert f"wrote {len(DOCUMENTS)} scores, best first, to stdout" in captured.err

    out = tmp_path / "top.jsonl"
    arguments = ["rerank", str(directory), "--query", QUERIES[1], "--file", str(documents), "--top-k", "3"]
    assert main([*arguments, "--out", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines[:3]
    assert capsys.readouterr().out == ""


def test_cli_refusals(folder, tmp_path, capsys):
    documents = tmp_path / "docs.jsonl"
    documents.write_text('{"text": "one"}\n{"text": "two"}\n')
    three, one = str(folder("xlm-roberta-3-labels")), str(folder("bert-6.x-sigmoid"))
    capsys.readouterr()
    assert main(["rerank", three, "--query", "q", "--file", str(documents)]) == 1
    assert "num_labels=1" in capsys.readouterr().err
    assert main(["rerank", one, "--query", "q", "--file", str(documents), "--out", str(documents)]) == 1
    assert "--file" in capsys.readouterr().err and documents.read_text() == '{"text": "one"}\n{"text": "two"}\n'
    assert main(["rerank", one, "--query", "q", "--file", str(documents), "--out", str(tmp_path / "out.npy")]) == 1
    assert "use .jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["rerank", one, "--query", "q"])
    assert usage.value.code == 2 and "no document to rank" in capsys.readouterr().err


def relative_rms(ours, theirs) -> float:
    """RMS of the difference over the RMS spread of the reference scores."""
    ours, theirs = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    return float(np.sqrt(np.mean((ours - theirs) ** 2)) / np.sqrt(np.mean((theirs - theirs.mean()) ** 2)))


@pytest.mark.parametrize("name", ["bert-legacy-identity", "xlm-roberta-3-labels", "mpnet-6.x"])
def test_int8_runs_int8_products_and_stays_near_sentence_transformers(folder, name, monkeypatch):
    """`quantize="int8"` (opt-in, lossy): the encoder's products in int8 (the size threshold lowered to these small
    layers', where bert-base's layers sit), the logits' own product in fp32; the scores move off fp32's, and stay
    within int8's error of sentence-transformers' fp32 scores: the RMS of the difference over the scores' RMS spread
    measured 0.01 to 0.11 on these tiny models (width 32, where int8's rounding weighs most), bound 0.25."""
    directory = folder(name)
    hidden = json.loads((directory / "config.json").read_text())["hidden_size"]
    swap_as_at_bert_base(monkeypatch, hidden)
    expected = reference(directory).predict(PAIRS, batch_size=8)
    ours = hfbert.CrossEncoder(directory, quantize="int8")
    kernels = hfbert.inference.packed_layers(ours.model)
    layers = ours.model.config.num_hidden_layers
    assert sum(kind == "int8" for kind in kernels.values()) >= 3 * layers, kernels
    assert not {"classifier", "classifier.out_proj"} & set(kernels)  # the logits' own product stays fp32
    scores = ours.predict(PAIRS, batch_size=8)
    assert scores.dtype == np.float32 and scores.shape == expected.shape
    error = relative_rms(scores, expected)
    print(f"{name}: int8 relative RMS {error:.4f}, max abs {max_abs(scores, expected):.2e}")
    assert max_abs(scores, expected) > 0 and error <= 0.25


def test_cli_rerank_int8_equals_the_int8_cross_encoder(folder, tmp_path, capsys, monkeypatch):
    directory = folder("bert-legacy-identity")
    swap_as_at_bert_base(monkeypatch, json.loads((directory / "config.json").read_text())["hidden_size"])
    expected = hfbert.CrossEncoder(directory, quantize="int8").rank(QUERIES[0], DOCUMENTS)
    fp32 = hfbert.CrossEncoder(directory).rank(QUERIES[0], DOCUMENTS)
    assert main(["rerank", str(directory), *DOCUMENTS, "--query", QUERIES[0], "--quantize", "int8"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["index"], line["score"]) for line in lines] == [(r["corpus_id"], r["score"]) for r in expected]
    assert [line["score"] for line in lines] != [r["score"] for r in fp32]


@pytest.mark.skipif(
    not hfbert.inference.bf16.bf16_available(), reason="this CPU does not compute bf16 natively (no AVX512-BF16/AMX)"
)
def test_bf16_rerank_runs_bf16_products_and_stays_near_sentence_transformers(folder, tmp_path, capsys, monkeypatch):
    """`precision="bf16"` (opt-in, lossy) and `hfbert rerank --precision bf16`: the encoder's products in bf16, the
    logits' own product in fp32; scores within bf16's rounding of sentence-transformers' fp32 scores (relative RMS
    measured 0.03 on this width-32 model, where rounding weighs most; bound 0.1), and the CLI prints the bf16
    cross-encoder's ranking."""
    directory = folder("bert-legacy-identity")
    swap_as_at_bert_base(monkeypatch, json.loads((directory / "config.json").read_text())["hidden_size"])
    expected = reference(directory).predict(PAIRS, batch_size=8)
    ours = hfbert.CrossEncoder(directory, precision="bf16")
    kernels = hfbert.inference.packed_layers(ours.model)
    assert sum(kind == "bf16" for kind in kernels.values()) >= 3 * ours.model.config.num_hidden_layers, kernels
    assert "classifier" not in kernels
    scores = ours.predict(PAIRS, batch_size=8)
    error = relative_rms(scores, expected)
    print(f"bf16 relative RMS {error:.4f}, max abs {max_abs(scores, expected):.2e}")
    assert max_abs(scores, expected) > 1e-6 and error <= 0.1
    ranked = ours.rank(QUERIES[0], DOCUMENTS)
    capsys.readouterr()
    assert main(["rerank", str(directory), *DOCUMENTS, "--query", QUERIES[0], "--precision", "bf16"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["index"], line["score"]) for line in lines] == [(r["corpus_id"], r["score"]) for r in ranked]
