"""`hfbert serve` on a SPLADE folder (issue #66): `/embed_sparse` answers TEI's `[{"index", "value"}, ...]` per text,
the nonzero weights by vocabulary id, equal to sentence-transformers' `SparseEncoder.encode` element-wise (fp32, 1e-5),
texts over the model's length truncated as sentence-transformers truncates them; token ids as their texts; a
request's `prompt_name` as `SparseEncoder.encode(prompt_name=...)`.

The folder is written by sentence-transformers' SparseEncoder (`support.retrieval.splade_folder`: BERT masked LM,
random weights, a small tokenizer), its "query" prompt set. One server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from support.retrieval import DOCUMENTS, splade_folder

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5
QUERY_PROMPT = "query: "


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = splade_folder(tmp_path_factory.mktemp("serve-sparse") / "splade")
    path = folder / "config_sentence_transformers.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "prompts": {**config["prompts"], "query": QUERY_PROMPT}}))
    return folder


@pytest.fixture(scope="module")
def client(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    running = RunningServer(create_app(Engine(folder), Settings(model_id="tiny-splade")))
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()


@pytest.fixture(scope="module")
def reference(folder):
    return sentence_transformers.SparseEncoder(str(folder), device="cpu")


@pytest.fixture(scope="module")
def expected(reference):
    return reference.encode(DOCUMENTS, convert_to_sparse_tensor=False, convert_to_tensor=True).numpy()


def as_dense(rows: list, like: np.ndarray) -> np.ndarray:
    """TEI's sparse answer as (texts, vocabulary) rows, checking each row's indices are sorted, unique, nonzero."""
    dense = np.zeros_like(like)
    for row, values in zip(dense, rows, strict=True):
        indices = [value["index"] for value in values]
        assert indices == sorted(set(indices)) and all(value["value"] != 0 for value in values)
        row[indices] = [value["value"] for value in values]
    return dense


def test_embed_sparse_equals_sparse_encoder(client, expected):
    answer = client.post("/embed_sparse", json={"inputs": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    rows = answer.json()
    assert len(rows) == len(DOCUMENTS)
    np.testing.assert_allclose(as_dense(rows, expected), expected, rtol=0, atol=ATOL)
    assert (expected > 0).sum(axis=1).min() > 0 and (expected > 0).mean() < 0.9  # sparse, and not empty


def test_token_ids_and_prompt_name(client, reference, expected):
    """The tokenizer's ids of a text (a list of them, or mixed with texts) give the text's weights; `prompt_name`
    puts the folder's prompt before each text, as `SparseEncoder.encode(prompt_name=...)`; an unknown name is a
    422 naming the prompts."""
    ids = reference.tokenizer(DOCUMENTS, truncation=True, max_length=reference.max_seq_length)["input_ids"]
    answer = client.post("/embed_sparse", json={"inputs": [ids[0], DOCUMENTS[1], *ids[2:]]})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(as_dense(answer.json(), expected), expected, rtol=0, atol=ATOL)
    prompted = client.post("/embed_sparse", json={"inputs": DOCUMENTS, "prompt_name": "query"})
    assert prompted.status_code == 200, prompted.text
    theirs = reference.encode(DOCUMENTS, prompt_name="query", convert_to_sparse_tensor=False).numpy()
    np.testing.assert_allclose(as_dense(prompted.json(), theirs), theirs, rtol=0, atol=ATOL)
    assert np.abs(theirs - expected).max() > 0.01  # the prompt changes the weights
    unknown = client.post("/embed_sparse", json={"inputs": "a", "prompt_name": "passage"})
    assert unknown.status_code == 422 and "('document', 'query')" in unknown.json()["error"]


def test_one_text_and_the_task(client, expected):
    answer = client.post("/embed_sparse", json={"inputs": DOCUMENTS[3]}).json()
    assert len(answer) == 1
    assert client.post("/invocations", json={"inputs": DOCUMENTS[3]}).json() == answer  # TEI's default route
    np.testing.assert_allclose([v["value"] for v in answer[0]], expected[3][[v["index"] for v in answer[0]]], atol=ATOL)
    info = client.get("/info").json()
    assert info["task"] == "sparse" and info["model_type"] == {"embedding": {"pooling": "splade"}}
    refused = client.post("/embed", json={"inputs": "a"})
    assert refused.status_code == 424 and "sparse (SPLADE) model" in refused.json()["error"]
