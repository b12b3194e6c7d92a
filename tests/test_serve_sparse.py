"""`hfbert serve` on a SPLADE folder (issue #66): `/embed_sparse` answers TEI's `[{"index", "value"}, ...]` per text,
the nonzero weights by vocabulary id, equal to sentence-transformers' `SparseEncoder.encode` element-wise (fp32, 1e-5),
texts over the model's length truncated as sentence-transformers truncates them.

The folder is written by sentence-transformers' SparseEncoder (`support.retrieval.splade_folder`: BERT masked LM,
random weights, a small tokenizer). One server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import numpy as np
import pytest

from support.retrieval import DOCUMENTS, splade_folder

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return splade_folder(tmp_path_factory.mktemp("serve-sparse") / "splade")


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
def expected(folder):
    model = sentence_transformers.SparseEncoder(str(folder), device="cpu")
    return model.encode(DOCUMENTS, convert_to_sparse_tensor=False, convert_to_tensor=True).numpy()


def test_embed_sparse_equals_sparse_encoder(client, expected):
    answer = client.post("/embed_sparse", json={"inputs": DOCUMENTS})
    assert answer.status_code == 200, answer.text
    rows = answer.json()
    assert len(rows) == len(DOCUMENTS)
    dense = np.zeros_like(expected)
    for row, values in zip(dense, rows, strict=True):
        indices = [value["index"] for value in values]
        assert indices == sorted(set(indices)) and all(value["value"] != 0 for value in values)
        row[indices] = [value["value"] for value in values]
    np.testing.assert_allclose(dense, expected, rtol=0, atol=ATOL)
    assert (expected > 0).sum(axis=1).min() > 0 and (expected > 0).mean() < 0.9  # sparse, and not empty


def test_one_text_and_the_task(client, expected):
    answer = client.post("/embed_sparse", json={"inputs": DOCUMENTS[3]}).json()
    assert len(answer) == 1
    assert client.post("/invocations", json={"inputs": DOCUMENTS[3]}).json() == answer  # TEI's default route
    np.testing.assert_allclose([v["value"] for v in answer[0]], expected[3][[v["index"] for v in answer[0]]], atol=ATOL)
    info = client.get("/info").json()
    assert info["task"] == "sparse" and info["model_type"] == {"embedding": {"pooling": "splade"}}
    refused = client.post("/embed", json={"inputs": "a"})
    assert refused.status_code == 424 and "sparse (SPLADE) model" in refused.json()["error"]
