"""`hfbert serve` on the members of issue #68: a DistilBERT sentence-transformers folder (`/embed` and
`/v1/embeddings` equal `SentenceTransformer.encode` element-wise), and a DeBERTa-v3 and an ELECTRA cross-encoder
(`/rerank` equals `CrossEncoder.predict`: raw scores and the folder's Sigmoid). fp32, 1e-5.

The folders are written by transformers' and sentence-transformers' own classes on the family's tiny checkpoints
(`support.members.tokenized_checkpoint`: random weights, each member's tokenizer, 38 tokens at most, so the longest
texts are truncated). One server per folder, on 127.0.0.1 (`support.serve.RunningServer`); each is started and
stopped within bounded time.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.family import TEXTS
from support.members import tokenized_checkpoint
from support.retrieval import DOCUMENTS, QUERIES

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # a server, and sentence-transformers' load and save of each folder: seconds each

ATOL = 1e-5  # fp32: hfbert's kernels sum in another order than torch's
MIXED = [*TEXTS, "", "Yes.", " ".join(TEXTS[:3]), " ".join(TEXTS), TEXTS[1].upper()]  # one over 38 tokens
QUERY = QUERIES[0]


def serve(folder):
    """A running server of `folder` (stop it when done)."""
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    return RunningServer(create_app(Engine(folder), Settings(model_id=folder.name)))


@pytest.fixture(scope="module")
def embedding_folder(tmp_path_factory, request):
    """A DistilBERT sentence-transformers folder as distilbert-based bi-encoders ship it: Transformer, mean pooling,
    Normalize."""
    models = pytest.importorskip("sentence_transformers.models")
    raw = tokenized_checkpoint(tmp_path_factory.mktemp("distilbert") / "raw", "distilbert", "model", request)
    modules = [models.Transformer(str(raw)), models.Pooling(32, pooling_mode="mean"), models.Normalize()]
    folder = raw.with_name("sentence")
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def cross_encoder(directory, model_type: str, request):
    """A cross-encoder of `model_type` (one label, the classifier scaled so that scores spread over units) saved by
    sentence-transformers' CrossEncoder with its default Sigmoid."""
    raw = tokenized_checkpoint(directory / "raw", model_type, "sequence-classification", request, num_labels=1)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(raw)
    last = model.classifier.out_proj if model_type == "electra" else model.classifier
    with torch.no_grad():
        last.weight.mul_(5.0)
    model.save_pretrained(raw)
    sentence_transformers.CrossEncoder(str(raw), device="cpu").save(str(directory / "cross"))
    return directory / "cross"


@pytest.fixture(scope="module", params=["deberta-v2", "electra"])
def reranker(tmp_path_factory, request):
    """(server URL, sentence-transformers' raw scores and default (Sigmoid) scores of (QUERY, each document))."""
    folder = cross_encoder(tmp_path_factory.mktemp(request.param), request.param, request)
    theirs = sentence_transformers.CrossEncoder(str(folder), device="cpu")
    pairs = [(QUERY, document) for document in DOCUMENTS]
    logits = theirs.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    scores = theirs.predict(pairs, convert_to_numpy=True)
    running = serve(folder)
    yield running.url, logits, scores
    running.stop()


def by_index(ranks, key="score"):
    return np.array([rank[key] for rank in sorted(ranks, key=lambda rank: rank["index"])], dtype=np.float32)


def test_distilbert_embed_and_openai_embeddings_equal_sentence_transformers(embedding_folder):
    expected = sentence_transformers.SentenceTransformer(str(embedding_folder), device="cpu").encode(MIXED)
    running = serve(embedding_folder)
    try:
        with httpx.Client(base_url=running.url, timeout=60) as client:
            info = client.get("/info").json()
            assert info["task"] == "embed"
            embed = client.post("/embed", json={"inputs": MIXED})
            assert embed.status_code == 200, embed.text
            np.testing.assert_allclose(np.array(embed.json(), dtype=np.float32), expected, rtol=0, atol=ATOL)
            openai = client.post("/v1/embeddings", json={"input": MIXED, "model": "distilbert"})
            assert openai.status_code == 200, openai.text
            data = openai.json()["data"]
            assert [item["index"] for item in data] == list(range(len(MIXED)))
            vectors = np.array([item["embedding"] for item in data], dtype=np.float32)
            np.testing.assert_allclose(vectors, expected, rtol=0, atol=ATOL)
    finally:
        running.stop()


def test_rerank_equals_cross_encoder_predict(reranker):
    url, logits, scores = reranker
    assert np.ptp(logits) > 0.1  # the scores spread: a wrong order would show
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/info").json()["task"] == "rerank"
        raw = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
        assert raw.status_code == 200, raw.text
        np.testing.assert_allclose(by_index(raw.json()), logits, rtol=0, atol=ATOL)
        order = [rank["index"] for rank in raw.json()]  # best first
        assert sorted(order) == list(range(len(DOCUMENTS))) and np.all(np.diff(logits[order]) <= ATOL)
        default = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS}).json()
        np.testing.assert_allclose(by_index(default), scores, rtol=0, atol=ATOL)
