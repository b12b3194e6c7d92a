"""`hfbert serve` on the real sentence-transformers/all-MiniLM-L6-v2 (issue #66): every answer of `/embed` and
`/v1/embeddings` equals sentence-transformers' `SentenceTransformer.encode` element-wise (fp32, 1e-5), through plain
httpx and through the `openai` client (float and base64); a text's vector does not depend on what it was batched
with (alone and inside 32 concurrent mixed requests); `/info`, `/health`, `/metrics`; and the bad requests a
trusted server refuses, each with TEI's (or OpenAI's) error shape and status.

One server for the module, on 127.0.0.1 and a free port (`support.serve.RunningServer`); every loop is bounded.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from support.family import TEXTS
from support.helpers import minilm_directory

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
sentence_transformers = pytest.importorskip("sentence_transformers")

ATOL = 1e-5  # fp32: hfbert's kernels sum in another order than torch's
LONG = " ".join(TEXTS) * 4  # over the model's 256 tokens: truncated, as sentence-transformers truncates
MIXED = [*TEXTS, "", "Yes.", " ".join(TEXTS[:3]), LONG, TEXTS[1].upper()]
CLIENT_BATCH = 40


@pytest.fixture(scope="module")
def server():
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    engine = Engine(minilm_directory())
    settings = Settings(model_id="all-MiniLM-L6-v2", max_client_batch_size=CLIENT_BATCH, max_batch_tokens=2048)
    running = RunningServer(create_app(engine, settings))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reference():
    return sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")


@pytest.fixture(scope="module")
def expected(reference):
    """sentence-transformers' vectors of MIXED (its pipeline ends with Normalize: unit length)."""
    return reference.encode(MIXED, convert_to_numpy=True)


@pytest.fixture(scope="module")
def unnormalized(reference):
    """sentence-transformers' vectors of MIXED without the folder's Normalize (TEI's `normalize: false`)."""
    model = sentence_transformers.SentenceTransformer(modules=[reference[0], reference[1]], device="cpu")
    return model.encode(MIXED, convert_to_numpy=True)


def test_embed_equals_sentence_transformers(client, expected):
    answer = client.post("/embed", json={"inputs": MIXED})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(np.array(answer.json(), dtype=np.float32), expected, rtol=0, atol=ATOL)


def test_embed_one_text_and_normalize_false(client, expected, unnormalized):
    answer = client.post("/embed", json={"inputs": MIXED[2]})
    np.testing.assert_allclose(np.array(answer.json()[0]), expected[2], rtol=0, atol=ATOL)
    raw = client.post("/embed", json={"inputs": MIXED, "normalize": False}).json()
    np.testing.assert_allclose(np.array(raw, dtype=np.float32), unnormalized, rtol=0, atol=ATOL)
    assert np.abs(np.linalg.norm(np.array(raw), axis=1) - 1).max() > 0.1  # really not unit length


def test_embed_dimensions_truncates_then_normalizes(client, unnormalized):
    answer = np.array(client.post("/embed", json={"inputs": MIXED, "dimensions": 64}).json())
    truncated = unnormalized[:, :64]
    np.testing.assert_allclose(answer, truncated / np.linalg.norm(truncated, axis=1, keepdims=True), atol=ATOL)


def test_openai_route_shape_and_usage(client, expected, reference):
    answer = client.post("/v1/embeddings", json={"input": MIXED[:3], "model": "mine"}).json()
    assert answer["object"] == "list" and answer["model"] == "mine"
    assert [item["index"] for item in answer["data"]] == [0, 1, 2]
    assert {item["object"] for item in answer["data"]} == {"embedding"}
    vectors = np.array([item["embedding"] for item in answer["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected[:3], rtol=0, atol=ATOL)
    tokens = sum(len(ids) for ids in reference.tokenizer(MIXED[:3])["input_ids"])
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_openai_client_float_and_base64(server, expected):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=MIXED, encoding_format="float")
    vectors = np.array([item.embedding for item in floats.data], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=ATOL)
    # The client's default asks base64 and decodes it to floats itself.
    default = client.embeddings.create(model="all-MiniLM-L6-v2", input=MIXED[4])
    np.testing.assert_allclose(np.array(default.data[0].embedding), expected[4], rtol=0, atol=ATOL)


def test_huggingface_hub_inference_client(server, expected):
    """huggingface_hub's InferenceClient speaks TEI's API on the default route `/`, as to TEI."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    client = huggingface_hub.InferenceClient(model=server.url, timeout=60)
    np.testing.assert_allclose(client.feature_extraction(MIXED[3])[0], expected[3], rtol=0, atol=ATOL)
    raw = client.feature_extraction(MIXED[3], normalize=False)[0]
    assert abs(np.linalg.norm(raw) - 1) > 0.1


def test_base64_is_little_endian_float32(client, expected):
    answer = client.post("/v1/embeddings", json={"input": MIXED[0], "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expected[0], rtol=0, atol=ATOL)


def test_a_vector_does_not_depend_on_its_batch(client, expected):
    """Each text alone, then inside 32 concurrent requests of mixed sizes and lengths batched together: equal within
    the bound docs/serving.md states (fp32 rounding, 1e-5 absolute on unit vectors)."""
    alone = np.array([client.post("/embed", json={"inputs": text}).json()[0] for text in MIXED], dtype=np.float32)
    np.testing.assert_allclose(alone, expected, rtol=0, atol=ATOL)
    rng = np.random.default_rng(0)
    requests = [[int(i) for i in rng.integers(0, len(MIXED), size=rng.integers(1, 9))] for _ in range(32)]

    def send(indices):
        route = "/embed" if len(indices) % 2 else "/v1/embeddings"
        if route == "/embed":
            answer = client.post(route, json={"inputs": [MIXED[i] for i in indices]})
            return indices, answer.status_code, answer.json()
        answer = client.post(route, json={"input": [MIXED[i] for i in indices]})
        return indices, answer.status_code, [item["embedding"] for item in answer.json()["data"]]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, requests, timeout=120))
    assert len(results) == 32
    for indices, status, vectors in results:
        assert status == 200
        np.testing.assert_allclose(np.array(vectors, dtype=np.float32), alone[indices], rtol=0, atol=ATOL)


def test_info_health_metrics(client):
    info = client.get("/info").json()
    assert info["model_id"] == "all-MiniLM-L6-v2" and info["task"] == "embed"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert (info["max_input_length"], info["max_client_batch_size"], info["auto_truncate"]) == (256, CLIENT_BATCH, True)
    assert client.get("/health").status_code == 200
    client.post("/embed", json={"inputs": "counted"})
    text = client.get("/metrics").text
    assert 'hfbert_requests_total{route="/embed",status="200"}' in text
    for name in ("queue_duration_seconds", "inference_duration_seconds", "batch_tokens", "queue_depth"):
        assert f"hfbert_{name}" in text


@pytest.mark.parametrize(
    ("route", "body", "status", "message"),
    [
        ("/embed", {"inputs": []}, 422, "`inputs` cannot be empty"),
        ("/embed", {"inputs": ["a", 3]}, 422, "`inputs.1`: Input should be a valid string"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "`normalize`"),
        ("/embed", {"text": "a"}, 422, "`inputs` is required"),
        ("/embed", {"inputs": ["a"] * (CLIENT_BATCH + 1)}, 422, f"maximum allowed batch size {CLIENT_BATCH}"),
        ("/embed", {"inputs": "a", "dimensions": 0}, 422, "`dimensions`"),
        ("/embed", {"inputs": "a", "dimensions": 385}, 422, "dimensions 385 > the model's 384"),
        ("/embed", {"inputs": "a", "prompt_name": "query"}, 422, "prompt_name 'query'"),
        ("/rerank", {"query": "q", "texts": ["a"]}, 424, "/rerank needs a reranker"),
        ("/embed_sparse", {"inputs": "a"}, 424, "is an embedding model"),
        ("/predict", {"inputs": ["a", "b"]}, 424, "/predict needs a sequence-classification model"),
        ("/tokenize", {"inputs": []}, 422, "`inputs` cannot be empty"),
    ],
)
def test_bad_requests_get_teis_error(client, route, body, status, message):
    answer = client.post(route, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()
    assert set(error) == {"error", "error_type"} and message in error["error"]


def test_invalid_json_404_405(client):
    answer = client.post("/embed", content=b'{"inputs": [', headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]
    lone = client.post("/embed", content=b'{"inputs": ["a", "b\\ud800"]}', headers={"content-type": "application/json"})
    assert lone.status_code == 422 and "`inputs.1` is not valid Unicode" in lone.json()["error"]  # a lone surrogate
    assert client.get("/nowhere").status_code == 404
    assert client.get("/embed").status_code == 405


def test_openai_errors_in_openai_shape(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.UnprocessableEntityError, match="maximum allowed batch size"):
        client.embeddings.create(model="m", input=["a"] * (CLIENT_BATCH + 1), encoding_format="float")
    answer = httpx.post(server.url + "/v1/embeddings", json={"input": []}, timeout=60).json()
    assert answer["error"]["message"] == "`input` cannot be empty" and answer["error"]["code"] == 422
    ids = httpx.post(server.url + "/v1/embeddings", json={"input": [101, 102]}, timeout=60)
    assert ids.status_code == 422 and "token ids are not served" in ids.json()["error"]["message"]


def test_tokenize_and_decode_equal_transformers(client):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_directory()))
    texts = ["Héllo wörld, naïve café!", TEXTS[0], ""]
    answer = client.post("/tokenize", json={"inputs": texts})
    assert answer.status_code == 200, answer.text
    for text, tokens in zip(texts, answer.json(), strict=True):
        encoded = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
        assert [token["id"] for token in tokens] == encoded["input_ids"]
        for token, (start, stop), special, name in zip(
            tokens,
            encoded["offset_mapping"],
            encoded["special_tokens_mask"],
            tokenizer.convert_ids_to_tokens(encoded["input_ids"]),
            strict=True,
        ):
            assert token["special"] == bool(special)
            if special:
                assert (token["text"], token["start"], token["stop"]) == (name, None, None)
            else:  # TEI's offsets count UTF-8 bytes
                assert token["text"] == text[start:stop]
                assert (token["start"], token["stop"]) == (len(text[:start].encode()), len(text[:stop].encode()))
    bare = client.post("/tokenize", json={"inputs": texts[1], "add_special_tokens": False}).json()
    assert [token["id"] for token in bare[0]] == tokenizer(texts[1], add_special_tokens=False)["input_ids"]
    ids = tokenizer(texts[:2])["input_ids"]
    for skip in (True, False):
        decoded = client.post("/decode", json={"ids": ids, "skip_special_tokens": skip}).json()
        assert decoded == [tokenizer.decode(sequence, skip_special_tokens=skip) for sequence in ids]
    assert client.post("/decode", json={"ids": ids[0]}).json() == [tokenizer.decode(ids[0], skip_special_tokens=True)]
    refused = client.post("/decode", json={"ids": [101, 30522]})
    assert refused.status_code == 422 and "30522 is not a token id" in refused.json()["error"]
