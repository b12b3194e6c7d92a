"""`hfbert embed` and the sentence-transformers backbone on all-mpnet-base-v2 with its real weights (the `real_mpnet`
fixture, read-only; issue #42), element-wise against `SentenceTransformer(folder).encode` on the same folder: mean
pooling over real tokens, then Normalize.

One model load per library for the module: sentence-transformers' (its encode is the reference, computed once) and
hfbert's `Embedder` (run at batch sizes 32 and 1); the command line loads its own. The texts are real, from three
tokens to about a hundred (test_mpnet_real.py runs past 128, the relative-position bias's last bucket).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import hfbert
from hfbert.cli import main
from hfbert.tools.embedding import Embedder

from support.helpers import parity_texts

st = pytest.importorskip("sentence_transformers")

TOLERANCE = 1e-5  # float32 rounding, summed over 12 layers; measured about 2e-7


def texts() -> list[str]:
    """32 real texts: 24 sentences of the parity battery, six paragraphs of 2 to 8 of its sentences (the longest
    about 100 tokens), a word and a letter; mixed lengths, so every batch of 32 holds padding."""
    battery = parity_texts(42)
    runs = ((24, 2), (26, 3), (29, 4), (33, 5), (36, 6), (30, 8))  # (first sentence, sentences)
    paragraphs = [" ".join(battery[start : start + size]) for start, size in runs]
    return battery[:24] + paragraphs + ["Hello", "x"]


@pytest.fixture(scope="module")
def sentence_transformer(real_mpnet):
    return st.SentenceTransformer(str(real_mpnet), device="cpu")


@pytest.fixture(scope="module")
def expected(sentence_transformer) -> np.ndarray:
    """sentence-transformers' embeddings of `texts()` (batches of 32), the reference of every test here."""
    return sentence_transformer.encode(texts(), batch_size=32, convert_to_numpy=True)


@pytest.fixture(scope="module")
def embedder(real_mpnet) -> Embedder:
    return Embedder(real_mpnet, batch_size=32)


def differences(ours: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max abs difference, min cosine) over the rows."""
    cosine = (ours * expected).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    return float(np.abs(ours - expected).max()), float(cosine.min())


def test_the_reference_is_mean_pooled_and_normalized(real_mpnet, sentence_transformer, expected, embedder):
    lengths = [len(ids) for ids in sentence_transformer.tokenizer(texts())["input_ids"]]
    assert min(lengths) <= 4 and max(lengths) > 96, lengths
    assert np.abs(np.linalg.norm(expected, axis=1) - 1).max() <= 1e-6
    assert embedder.pipeline.describe() == (
        "sentence-transformers (modules.json): Transformer(max_seq_length=384) -> Pooling(mean) -> Normalize"
    )


@pytest.mark.parametrize("batch_size", [32, 1])
def test_embed_equals_encode(batch_size, embedder, expected):
    """The Python API `hfbert embed` runs; the encoder is fed ids and mask only (MPNet has no token types)."""
    fed = []
    hook = embedder.model.register_forward_pre_hook(lambda _, args, kwargs: fed.append(set(kwargs)), with_kwargs=True)
    embedder.batch_size = batch_size
    try:
        ours = embedder.embed(texts()).numpy()
    finally:
        hook.remove()
        embedder.batch_size = 32
    assert len(fed) == -(-len(texts()) // batch_size)
    assert all("token_type_ids" not in keys and {"input_ids", "attention_mask"} <= keys for keys in fed), fed
    assert ours.shape == expected.shape == (32, 768)
    worst, cosine = differences(ours, expected)
    assert worst <= TOLERANCE and cosine >= 1 - 1e-6, (worst, cosine)
    assert np.abs(np.linalg.norm(ours, axis=1) - 1).max() <= 1e-6


def test_the_command_line_equals_encode(real_mpnet, expected, tmp_path):
    file = tmp_path / "texts.jsonl"
    file.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts()), encoding="utf-8")
    out = tmp_path / "out.npy"
    assert main(["embed", str(real_mpnet), "--file", str(file), "--out", str(out), "--batch-size", "32"]) == 0
    ours = np.load(out)
    worst, cosine = differences(ours, expected)
    assert worst <= TOLERANCE and cosine >= 1 - 1e-6, (worst, cosine)


def test_hfbert_as_the_sentence_transformers_backbone_equals_encode(sentence_transformer, expected):
    """The module's SentenceTransformer, its transformers MPNetModel swapped for hfbert's on the same tensors (last
    user of the fixture: `expected` was computed before). transformers runs MPNet eager only; hfbert's runs sdpa."""
    from hfbert.tools.sentence_transformers_backbone import use_hfbert_backbone

    ours = use_hfbert_backbone(sentence_transformer)
    assert isinstance(ours[0].model, hfbert.MPNetModel)
    assert ours[0].model.attn_implementation == "sdpa"
    worst, cosine = differences(ours.encode(texts(), batch_size=32, convert_to_numpy=True), expected)
    assert worst <= TOLERANCE and cosine >= 1 - 1e-6, (worst, cosine)
