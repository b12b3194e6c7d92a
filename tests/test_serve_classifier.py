"""`hfbert serve` on a sequence classifier of three labels (issue #66): `/predict` (TEI's default route `/` for it)
answers each label's score, a softmax over the labels with `raw_scores` false (TEI's default) and the raw logits
otherwise, best first, equal to sentence-transformers' `CrossEncoder.predict` element-wise (fp32, 1e-5); `/rerank`
scores with the first label's softmax, as TEI.

The folder is written by sentence-transformers' CrossEncoder (`support.retrieval.cross_encoder_folder`: BERT, random
weights, three labels named in config.json). One server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.retrieval import DOCUMENTS, QUERIES, cross_encoder_folder

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5
LABELS = ["contradiction", "entailment", "neutral"]
PAIRS = [[QUERIES[0], document] for document in DOCUMENTS]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    directory = cross_encoder_folder(tmp_path_factory.mktemp("serve-nli") / "nli", "bert", 3)
    config = json.loads((directory / "config.json").read_text())
    config["id2label"] = dict(enumerate(LABELS))
    config["label2id"] = {label: index for index, label in enumerate(LABELS)}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def client(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    running = RunningServer(create_app(Engine(folder), Settings(model_id="tiny-nli")))
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()


@pytest.fixture(scope="module")
def logits(folder):
    model = sentence_transformers.CrossEncoder(str(folder), device="cpu")
    return model.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_numpy=True)


def by_label(answer):
    return np.array(
        [[{p["label"]: p["score"] for p in predictions}[label] for label in LABELS] for predictions in answer]
    )


def test_predict_softmax_and_raw(client, logits):
    answer = client.post("/predict", json={"inputs": PAIRS})
    assert answer.status_code == 200, answer.text
    softmax = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()
    np.testing.assert_allclose(by_label(answer.json()), softmax, rtol=0, atol=ATOL)
    assert all([p["score"] for p in predictions] == sorted((p["score"] for p in predictions), reverse=True)
               for predictions in answer.json())  # fmt: skip
    raw = client.post("/predict", json={"inputs": PAIRS, "raw_scores": True}).json()
    np.testing.assert_allclose(by_label(raw), logits, rtol=0, atol=ATOL)
    assert np.ptp(logits) > 0.1
    one = client.post("/", json={"inputs": PAIRS[0]}).json()  # TEI's default route for a classifier
    np.testing.assert_allclose(by_label([one]), softmax[:1], rtol=0, atol=ATOL)


def test_rerank_scores_the_first_label(client, logits):
    answer = client.post("/rerank", json={"query": QUERIES[0], "texts": DOCUMENTS}).json()
    first = torch.softmax(torch.from_numpy(logits), dim=-1).numpy()[:, 0]
    np.testing.assert_allclose([rank["score"] for rank in sorted(answer, key=lambda r: r["index"])], first, atol=ATOL)
    info = client.get("/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {str(index): label for index, label in enumerate(LABELS)}
