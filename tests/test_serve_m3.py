"""`hfbert serve` on a folder in BAAI/bge-m3's layout (issue #66): `/embed_multi` answers any subset of dense, sparse
and ColBERT outputs per text from one forward pass, `/embed` and `/embed_sparse` the dense and sparse ones, from texts
or their token ids, all equal element-wise (fp32, 1e-5) to FlagEmbedding's `BGEM3FlagModel.encode`, as its formulas
are written out on transformers' model in tests/test_bge_m3.py (`flag_formulas`, on the folder `bge_m3_folder`
writes: XLM-R with random weights, texts of mixed lengths, one of 528 tokens).

One server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_bge_m3 import LONGEST, TEXTS_M3, bge_m3_folder, flag_formulas

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

ATOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return bge_m3_folder(tmp_path_factory.mktemp("serve-m3") / "model")


@pytest.fixture(scope="module")
def client(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    running = RunningServer(create_app(Engine(folder), Settings(model_id="tiny-m3", max_client_batch_size=64)))
    with httpx.Client(base_url=running.url, timeout=60) as client:
        yield client
    running.stop()


@pytest.fixture(scope="module")
def reference(folder):
    return flag_formulas(folder, TEXTS_M3, LONGEST)


def sparse_dict(values):
    return {str(value["index"]): value["value"] for value in values}


def assert_sparse_equal(ours: list, theirs: list) -> None:
    for number, (mine, flag) in enumerate(zip(ours, theirs, strict=True)):
        mine = sparse_dict(mine)
        assert set(mine) == set(flag), f"text {number}"
        assert max((abs(mine[key] - flag[key]) for key in flag), default=0.0) <= ATOL, f"text {number}"


def test_embed_multi_equals_flagembedding(client, reference):
    answer = client.post("/embed_multi", json={"inputs": TEXTS_M3})
    assert answer.status_code == 200, answer.text
    results = answer.json()
    assert all(set(result) == {"dense", "sparse", "colbert"} for result in results)
    dense = np.array([result["dense"] for result in results], dtype=np.float32)
    np.testing.assert_allclose(dense, reference["dense_vecs"].numpy(), rtol=0, atol=ATOL)
    assert_sparse_equal([result["sparse"] for result in results], reference["lexical_weights"])
    for result, vectors in zip(results, reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(np.array(result["colbert"], dtype=np.float32), vectors.numpy(), rtol=0, atol=ATOL)


def test_one_output_and_the_tei_routes(client, reference):
    only = client.post("/embed_multi", json={"inputs": TEXTS_M3[:3], "outputs": ["sparse"]}).json()
    assert [set(result) for result in only] == [{"sparse"}] * 3
    assert_sparse_equal([result["sparse"] for result in only], reference["lexical_weights"][:3])
    dense = client.post("/embed", json={"inputs": TEXTS_M3}).json()
    np.testing.assert_allclose(np.array(dense, dtype=np.float32), reference["dense_vecs"].numpy(), rtol=0, atol=ATOL)
    sparse = client.post("/embed_sparse", json={"inputs": TEXTS_M3}).json()
    assert_sparse_equal(sparse, reference["lexical_weights"])
    assert client.get("/info").json()["task"] == "m3"
    refused = client.post("/embed_multi", json={"inputs": "a", "outputs": ["dense", "words"]})
    assert refused.status_code == 422 and "`outputs.1`" in refused.json()["error"]


def test_token_ids_give_their_texts_outputs(client, folder, reference):
    """The tokenizer's ids of each text (with its special tokens) give that text's three outputs, on
    `/embed_multi`, `/embed` and `/embed_sparse`."""
    transformers = pytest.importorskip("transformers")
    ids = transformers.AutoTokenizer.from_pretrained(str(folder))(TEXTS_M3)["input_ids"]
    answer = client.post("/embed_multi", json={"inputs": ids})
    assert answer.status_code == 200, answer.text
    results = answer.json()
    dense = np.array([result["dense"] for result in results], dtype=np.float32)
    np.testing.assert_allclose(dense, reference["dense_vecs"].numpy(), rtol=0, atol=ATOL)
    assert_sparse_equal([result["sparse"] for result in results], reference["lexical_weights"])
    for result, vectors in zip(results, reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(np.array(result["colbert"], dtype=np.float32), vectors.numpy(), rtol=0, atol=ATOL)
    mixed = client.post("/embed", json={"inputs": [TEXTS_M3[0], ids[1]]}).json()
    np.testing.assert_allclose(np.array(mixed), reference["dense_vecs"].numpy()[:2], rtol=0, atol=ATOL)
    assert_sparse_equal(client.post("/embed_sparse", json={"inputs": ids[2]}).json(), reference["lexical_weights"][2:3])
