"""The tools on DeBERTa-v3 checkpoints written by transformers and sentence-transformers: `hfbert.CrossEncoder` and
`hfbert rerank` on a cross-encoder folder (DeBERTa-v3 rerankers: sentence pairs whose segment ids the model ignores)
against sentence-transformers' CrossEncoder, `hfbert fill-mask` against transformers' pipeline, and the fast paths
(`optimize_for_inference` in int8, bf16) against the plain model. (embed, parity, convert and inspect run in the
conformance suite.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hfbert
from hfbert.cli import main

from support.deberta import deberta_tokenizer
from support.helpers import randomize_weights
from support.members import tiny_config
from support.retrieval import DOCUMENTS, QUERIES

transformers = pytest.importorskip("transformers")
V3_FIELDS = tiny_config("deberta-v2")  # deberta-v3-base's attention, tiny
PAIRS = [(query, document) for query in QUERIES for document in DOCUMENTS]


def deberta_checkpoint(directory, task: str, **fields):
    """transformers' DebertaV2`task` (deberta-v3-base's attention, tiny) with random weights and the DeBERTa tokenizer,
    saved by `save_pretrained`."""
    deberta_tokenizer(directory)
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(directory))
    config = transformers.DebertaV2Config(**{**V3_FIELDS, "vocab_size": vocab_size, **fields})
    torch.manual_seed(0)
    model = randomize_weights(getattr(transformers, f"DebertaV2{task}")(config)).eval()
    if task == "ForSequenceClassification":
        with torch.no_grad():  # scores spread over units, not hundredths
            model.classifier.weight.mul_(5.0)
    model.save_pretrained(directory)
    return directory


@pytest.mark.slow  # sentence-transformers' load and save of a folder: seconds on a quiet machine
def test_a_deberta_cross_encoder_ranks_as_sentence_transformers(tmp_path, capsys):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    raw = deberta_checkpoint(tmp_path / "raw", "ForSequenceClassification", num_labels=1)
    sentence_transformers.CrossEncoder(str(raw), device="cpu").save(str(tmp_path / "reranker"))
    theirs = sentence_transformers.CrossEncoder(str(tmp_path / "reranker"), device="cpu")
    assert "token_type_ids" in theirs.tokenizer(*PAIRS[0])  # DeBERTa's tokenizer gives segments the model ignores
    expected = theirs.predict(PAIRS, batch_size=8)
    ours = hfbert.CrossEncoder(tmp_path / "reranker").predict(PAIRS, batch_size=8)
    assert ours.shape == expected.shape and np.ptp(expected) > 0.01
    assert np.abs(ours - expected).max() <= 1e-5
    query = QUERIES[0]
    assert main(["rerank", str(tmp_path / "reranker"), "--query", query, *DOCUMENTS[:5]]) == 0
    ranked = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    reference = theirs.rank(query, DOCUMENTS[:5])
    assert [row["index"] for row in ranked] == [row["corpus_id"] for row in reference]
    assert np.abs(np.array([row["score"] for row in ranked]) - [row["score"] for row in reference]).max() <= 1e-5


def test_fill_mask_equals_transformers_pipeline(tmp_path, capsys):
    directory = deberta_checkpoint(tmp_path, "ForMaskedLM")
    text = "Paris is the [MASK] of France."
    expected = transformers.pipeline("fill-mask", model=str(directory), device="cpu")(text, top_k=5)
    assert main(["fill-mask", str(directory), text, "--top-k", "5", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert [p["token"] for p in ours] == [p["token"] for p in expected]
    assert np.abs(np.array([p["score"] for p in ours]) - [p["score"] for p in expected]).max() <= 1e-6
    assert [p["sequence"] for p in ours] == [p["sequence"] for p in expected]


@pytest.mark.parametrize(
    ("options", "tolerance"),
    [({"quantize": "int8"}, 0.25), ({"precision": "bf16"}, 0.1), ({"precision": "high"}, 1e-4)],
    ids=["int8", "bf16", "high"],
)
def test_the_fast_paths_run_deberta(options, tolerance, tmp_path, monkeypatch):
    """int8 and bf16 (their own accuracy contracts, measured elsewhere): the relative terms ride through them, and
    the outputs stay near the float32 model's."""
    import hfbert.inference.optimize as optimize

    monkeypatch.setattr(optimize, "MIN_PACKED_WEIGHTS", 0)
    directory = deberta_checkpoint(tmp_path, "ForSequenceClassification", num_labels=3)
    tokenizer = hfbert.AutoTokenizer.from_pretrained(directory)
    firsts, seconds = [a for a, _ in PAIRS[:6]], [b for _, b in PAIRS[:6]]
    batch = tokenizer(firsts, seconds, padding=True, truncation=True, return_tensors="pt")
    plain = hfbert.AutoModelForSequenceClassification.from_pretrained(directory)
    fast = hfbert.optimize_for_inference(
        hfbert.AutoModelForSequenceClassification.from_pretrained(directory), kernels="always", **options
    )
    with torch.no_grad():
        expected, actual = plain(**batch).logits, fast(**batch).logits.float()
    assert torch.isfinite(actual).all()
    assert (actual - expected).abs().max() <= tolerance * expected.abs().max()
