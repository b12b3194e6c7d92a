"""`hfbert serve` on a cross-encoder (issue #66): `/rerank` (TEI) and `/v1/rerank`, `/v2/rerank` (Jina/Cohere) equal
sentence-transformers' `CrossEncoder.predict` element-wise (fp32, 1e-5): raw logits with `raw_scores`, else TEI's
sigmoid of the one label, whatever activation the folder names (here Identity, as cross-encoder/ms-marco-MiniLM-L6-v2's
legacy config says); ranked best first; pairs over the model's 64 tokens truncated as sentence-transformers truncates
them, or refused (413) with `truncate: false`.

The folder is written by sentence-transformers' own classes (`support.retrieval.cross_encoder_folder`: BERT, random
weights, a small tokenizer). One server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.retrieval import DOCUMENTS, QUERIES, cross_encoder_folder

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5
IDENTITY = "torch.nn.modules.linear.Identity"
QUERY = QUERIES[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return cross_encoder_folder(tmp_path_factory.mktemp("serve-rerank") / "bert-legacy", "bert", 1, "legacy", IDENTITY)


@pytest.fixture(scope="module")
def server(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    running = RunningServer(create_app(Engine(folder), Settings(model_id="tiny-reranker")))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def logits(folder):
    """sentence-transformers' raw scores of (QUERY, each document)."""
    model = sentence_transformers.CrossEncoder(str(folder), device="cpu")
    pairs = [(QUERY, document) for document in DOCUMENTS]
    return model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True)


def by_index(ranks, key="score"):
    return np.array([rank[key] for rank in sorted(ranks, key=lambda rank: rank["index"])], dtype=np.float32)


def test_the_task_is_read_from_the_folder(client):
    info = client.get("/info").json()
    assert info["task"] == "rerank" and info["model_type"] == {
        "reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}
    }
    assert client.post("/embed", json={"inputs": "a"}).status_code == 424


def test_rerank_raw_scores_equal_predict(client, logits):
    answer = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}).json()
    np.testing.assert_allclose(by_index(answer), logits, rtol=0, atol=ATOL)
    assert [rank["score"] for rank in answer] == sorted((rank["score"] for rank in answer), reverse=True)
    assert np.ptp(logits) > 0.1  # the scores spread: a wrong order would show


def test_rerank_default_is_teis_sigmoid(client, logits):
    answer = client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}).json()
    np.testing.assert_allclose(by_index(answer), torch.sigmoid(torch.from_numpy(logits)).numpy(), rtol=0, atol=ATOL)
    assert all(rank["text"] == DOCUMENTS[rank["index"]] for rank in answer)
    assert client.post("/", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}).json() == answer  # TEI's
    order = [rank["index"] for rank in answer]
    assert sorted(order) == list(range(len(DOCUMENTS))) and np.all(np.diff(logits[order]) <= ATOL)  # best first


def test_jina_cohere_rerank(client, logits):
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]
    for route in ("/v1/rerank", "/v2/rerank"):
        answer = client.post(route, json={"query": QUERY, "documents": documents, "top_n": 3, "return_documents": True})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        best = np.argsort(-logits, kind="stable")[:3]
        assert [result["index"] for result in results] == list(best)
        sigmoid = torch.sigmoid(torch.from_numpy(logits)).numpy()
        np.testing.assert_allclose([r["relevance_score"] for r in results], sigmoid[best], rtol=0, atol=ATOL)
        assert [result["document"]["text"] for result in results] == [DOCUMENTS[i] for i in best]
        assert answer.json()["usage"]["total_tokens"] > 0


def test_predict_equals_predict(client, logits):
    pairs = [[QUERY, document] for document in DOCUMENTS]
    batch = client.post("/predict", json={"inputs": pairs, "raw_scores": True})
    assert batch.status_code == 200, batch.text
    assert all([item["label"] for item in answer] == ["LABEL_0"] for answer in batch.json())
    np.testing.assert_allclose([answer[0]["score"] for answer in batch.json()], logits, rtol=0, atol=ATOL)
    one = client.post("/predict", json={"inputs": pairs[3]}).json()
    np.testing.assert_allclose(one[0]["score"], torch.sigmoid(torch.tensor(logits[3])).item(), rtol=0, atol=ATOL)
    lone = client.post("/predict", json={"inputs": "one text"})
    assert lone.status_code == 422 and "this model scores pairs" in lone.json()["error"]


def test_a_pair_over_the_length_is_refused_without_truncation(client):
    long = DOCUMENTS[-2]  # over the model's 64 tokens with the query
    answer = client.post("/rerank", json={"query": QUERY, "texts": ["short", long], "truncate": False})
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("input 1 has ") and "limit of 64" in answer.json()["error"]


@pytest.mark.parametrize(
    ("route", "body", "message"),
    [
        ("/rerank", {"query": QUERY, "texts": []}, "`texts` cannot be empty"),
        ("/rerank", {"texts": ["a"]}, "`query` is required"),
        ("/rerank", {"query": 1, "texts": ["a"]}, "`query`: Input should be a valid string"),
        ("/rerank", {"query": "", "texts": ["a"]}, "`query` cannot be empty"),
        ("/v2/rerank", {"query": " ", "documents": ["a"]}, "`query` cannot be empty"),
        ("/v1/rerank", {"query": QUERY, "documents": []}, "`documents` cannot be empty"),
        ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, "`top_n`"),
    ],
)
def test_bad_rerank_requests(client, route, body, message):
    answer = client.post(route, json=body)
    assert answer.status_code == 422
    error = answer.json()
    assert message in (error["error"] if route == "/rerank" else error["message"])


def test_a_lone_surrogate_is_refused_naming_it(client):
    body = b'{"query": "q\\ud800", "texts": ["a"]}'
    answer = client.post("/rerank", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "`query` is not valid Unicode" in answer.json()["error"]
