"""`hfbert serve` on the real sentence-transformers/all-MiniLM-L6-v2 (issue #66): every answer of `/embed`,
`/embed_all` and `/v1/embeddings` equals sentence-transformers' `SentenceTransformer.encode` element-wise (fp32,
1e-5), through plain httpx and through the `openai` client (float and base64): texts or token ids, with a request's
`prompt_name` or the server's prompt; a text's result does not depend on what it was batched with (alone and inside
64 concurrent mixed requests held until they are all queued); `/info`, `/health`, `/metrics`; and the bad requests a
trusted server refuses, each with TEI's (or OpenAI's) error shape and status.

The folder is MiniLM's with two prompts added to its config_sentence_transformers.json (none by default), its other
files linked. One server for the module, on 127.0.0.1 and a free port (`support.serve.RunningServer`); every loop
and wait is bounded.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
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
PROMPTS = {"query": "query: ", "document": "passage: "}
CONCURRENT = 64  # requests in flight at once in the batching test
MOST = 4  # inputs per request in the batching test, at most
WAIT = 60  # seconds any wait below may take at most


class Gate:
    """The engine's `run`, held while the gate is closed; records the size of every batch the model ran."""

    def __init__(self, run):
        self._run = run
        self.open = threading.Event()
        self.open.set()
        self.held = 0  # inputs of the batch waiting at the closed gate
        self.sizes: list[int] = []

    def __call__(self, operation, inputs):
        self.held = len(inputs)
        assert self.open.wait(WAIT), "the gate stayed closed"
        self.held = 0
        self.sizes.append(len(inputs))
        return self._run(operation, inputs)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """all-MiniLM-L6-v2 with PROMPTS in its config_sentence_transformers.json (no default prompt)."""
    source = minilm_directory()
    folder = tmp_path_factory.mktemp("serve") / "all-MiniLM-L6-v2"
    folder.mkdir()
    for path in source.iterdir():
        if path.name != "config_sentence_transformers.json":
            (folder / path.name).symlink_to(path)
    config = json.loads((source / "config_sentence_transformers.json").read_text())
    (folder / "config_sentence_transformers.json").write_text(json.dumps({**config, "prompts": PROMPTS}))
    return folder


@pytest.fixture(scope="module")
def served(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    engine = Engine(folder)
    gate = engine.run = Gate(engine.run)
    settings = Settings(model_id="all-MiniLM-L6-v2", max_client_batch_size=CLIENT_BATCH, max_batch_tokens=2048)
    app = create_app(engine, settings)
    running = RunningServer(app)
    yield running, app.state.server, gate
    gate.open.set()
    running.stop()


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def reference(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


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


@pytest.fixture(scope="module")
def token_vectors(reference):
    """sentence-transformers' per-token vectors of MIXED (`encode(output_value="token_embeddings")`)."""
    return [vectors.numpy() for vectors in reference.encode(MIXED, output_value="token_embeddings")]


def assert_tokens_equal(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for number, (mine, reference) in enumerate(zip(ours, theirs, strict=True)):
        mine = np.array(mine, dtype=np.float32)
        assert mine.shape == reference.shape, f"input {number}"
        np.testing.assert_allclose(mine, reference, rtol=0, atol=ATOL, err_msg=f"input {number}")


def test_embed_all_equals_token_embeddings(client, reference, token_vectors):
    """TEI's `/embed_all`: every real token's vector of the last hidden state, special tokens included, truncated
    at the model's 256 tokens (LONG), as sentence-transformers' token embeddings."""
    answer = client.post("/embed_all", json={"inputs": MIXED})
    assert answer.status_code == 200, answer.text
    assert_tokens_equal(answer.json(), token_vectors)
    assert [len(vectors) for vectors in answer.json()][-2] == 256
    one = client.post("/embed_all", json={"inputs": MIXED[1], "prompt_name": "query"}).json()
    prompted = reference.encode([MIXED[1]], prompt_name="query", output_value="token_embeddings")
    assert_tokens_equal(one, [prompted[0].numpy()])
    assert len(one[0]) > len(token_vectors[1])  # the prompt's tokens are in


def test_token_ids_equal_their_texts(server, client, reference, expected, token_vectors):
    """Token ids (OpenAI's and TEI's forms) are the model's input as given: the tokenizer's ids of a text compute
    what the text computes; usage counts them."""
    ids = reference.tokenizer(MIXED, truncation=True, max_length=256)["input_ids"]
    answer = client.post("/v1/embeddings", json={"input": ids, "encoding_format": "float"}).json()
    vectors = np.array([item["embedding"] for item in answer["data"]], dtype=np.float32)
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=ATOL)
    assert answer["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
    one = client.post("/embed", json={"inputs": ids[2]}).json()  # a list of ints is one input
    np.testing.assert_allclose(np.array(one), expected[2:3], rtol=0, atol=ATOL)
    mixed = client.post("/embed", json={"inputs": [MIXED[0], ids[1], MIXED[2], ids[3]]}).json()
    np.testing.assert_allclose(np.array(mixed, dtype=np.float32), expected[:4], rtol=0, atol=ATOL)
    assert_tokens_equal(client.post("/embed_all", json={"inputs": [ids[0], MIXED[9]]}).json(), token_vectors[::9])
    openai = pytest.importorskip("openai")
    remote = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    created = remote.embeddings.create(model="all-MiniLM-L6-v2", input=ids[:3], encoding_format="float")
    np.testing.assert_allclose([item.embedding for item in created.data], expected[:3], rtol=0, atol=ATOL)


def test_token_ids_over_the_length_are_cut_on_either_side(client, reference):
    """Ids past the model's 256 are cut on the `truncation_direction` side (no special token added back), or
    refused with truncation off; held against sentence-transformers' modules run on the same ids."""
    import torch

    ids = reference.tokenizer(LONG)["input_ids"]
    assert len(ids) > 300
    for direction, kept in (("right", ids[:256]), ("left", ids[-256:])):
        body = {"inputs": ids, "truncation_direction": direction, "normalize": False}
        answer = client.post("/embed", json=body)
        assert answer.status_code == 200, answer.text
        features = {"input_ids": torch.tensor([kept]), "attention_mask": torch.ones(1, 256, dtype=torch.long)}
        with torch.no_grad():
            theirs = reference[1](reference[0](features))["sentence_embedding"][0].numpy()  # Normalize left out
        np.testing.assert_allclose(np.array(answer.json()[0]), theirs, rtol=0, atol=ATOL)
    refused = client.post("/embed", json={"inputs": ids, "truncate": False})
    assert refused.status_code == 413 and f"input 0 has {len(ids)} tokens" in refused.json()["error"]


def test_prompt_name_per_request(server, client, reference, expected):
    """A request's `prompt_name` puts the folder's prompt of that name before each text, as sentence-transformers'
    `encode(prompt_name=...)`; usage counts the prompt's tokens; an unknown name is a 422 naming the prompts."""
    for name in PROMPTS:
        answer = client.post("/embed", json={"inputs": MIXED, "prompt_name": name})
        assert answer.status_code == 200, answer.text
        theirs = reference.encode(MIXED, prompt_name=name)
        np.testing.assert_allclose(np.array(answer.json(), dtype=np.float32), theirs, rtol=0, atol=ATOL)
        assert np.abs(theirs - expected).max() > 0.01  # the prompt changes the vectors
    openai = pytest.importorskip("openai")
    remote = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    created = remote.embeddings.create(
        model="all-MiniLM-L6-v2", input=MIXED[:3], encoding_format="float", extra_body={"prompt_name": "query"}
    )
    theirs = reference.encode(MIXED[:3], prompt_name="query")
    np.testing.assert_allclose([item.embedding for item in created.data], theirs, rtol=0, atol=ATOL)
    tokens = sum(len(ids) for ids in reference.tokenizer([PROMPTS["query"] + text for text in MIXED[:3]])["input_ids"])
    assert created.usage.total_tokens == tokens
    tokenized = client.post("/tokenize", json={"inputs": MIXED[0], "prompt_name": "document"}).json()[0]
    assert [token["id"] for token in tokenized] == reference.tokenizer(PROMPTS["document"] + MIXED[0])["input_ids"]
    unknown = client.post("/embed", json={"inputs": "a", "prompt_name": "passage"})
    assert unknown.status_code == 422
    assert unknown.json()["error"] == "prompt_name 'passage' is not one of the model's prompts ('query', 'document')"


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_result_does_not_depend_on_its_batch(served, client, reference, expected, token_vectors, monkeypatch):
    """Each text alone, then inside 64 concurrent requests of mixed routes (/embed, /v1/embeddings, /embed_all),
    sizes, lengths, prompts and input forms (texts, token ids), held at the model until every input is queued so
    that they are batched together: equal within the bound docs/serving.md states (fp32, 1e-5 absolute)."""
    _, server, gate = served
    ids = reference.tokenizer(MIXED, truncation=True, max_length=256)["input_ids"]

    def send(kind, indices):
        if kind == "openai":
            answer = client.post("/v1/embeddings", json={"input": [MIXED[i] for i in indices]})
            return answer.status_code, [item["embedding"] for item in answer.json()["data"]]
        route = "/embed_all" if kind == "tokens" else "/embed"
        body = {"inputs": [ids[i] if kind == "ids" else MIXED[i] for i in indices]}
        if kind == "query":
            body["prompt_name"] = "query"
        answer = client.post(route, json=body)
        return answer.status_code, answer.json()

    # The per-token vectors of the long texts are megabytes of JSON: /embed_all takes the short ones only.
    short = [index for index, text in enumerate(MIXED) if len(text) < 200]
    everything = range(len(MIXED))
    alone = {
        kind: {i: np.array(send(kind, [i])[1][0], dtype=np.float32) for i in indices}
        for kind, indices in (("embed", everything), ("query", everything), ("tokens", short))
    }
    np.testing.assert_allclose(np.array(list(alone["embed"].values())), expected, rtol=0, atol=ATOL)
    queried = reference.encode(MIXED, prompt_name="query")
    np.testing.assert_allclose(np.array(list(alone["query"].values())), queried, rtol=0, atol=ATOL)
    assert_tokens_equal(list(alone["tokens"].values()), [token_vectors[i] for i in short])
    alone["openai"] = alone["ids"] = alone["embed"]

    rng = np.random.default_rng(0)
    kinds = ("embed", "openai", "ids", "query", "tokens")
    requests = []
    for number in range(CONCURRENT):
        kind = kinds[number % len(kinds)]
        choices = short if kind == "tokens" else everything
        requests.append((kind, [int(choices[i]) for i in rng.integers(0, len(choices), rng.integers(1, MOST + 1))]))
    total = sum(len(indices) for _, indices in requests)
    submitted = []
    submit = server.batcher.submit

    async def counted(operation, payloads, tokens):
        submitted.append(len(payloads))
        return await submit(operation, payloads, tokens)

    monkeypatch.setattr(server.batcher, "submit", counted)
    gate.sizes.clear()
    gate.open.clear()
    with ThreadPoolExecutor(CONCURRENT) as pool:
        try:
            futures = [pool.submit(send, kind, indices) for kind, indices in requests]
            deadline = time.monotonic() + WAIT
            while sum(submitted) < total:  # every input queued, the first batch held at the gate
                assert time.monotonic() < deadline, f"{sum(submitted)} of {total} inputs queued"
                time.sleep(0.01)
            started = time.monotonic()
            assert client.get("/health").status_code == 200 and time.monotonic() - started < 2  # not behind the model
        finally:
            gate.open.set()
        results = [future.result(timeout=WAIT) for future in futures]
    assert max(gate.sizes) > MOST  # batches held inputs of several requests
    for (kind, indices), (status, answer) in zip(requests, results, strict=True):
        assert status == 200, (kind, answer)
        if kind == "tokens":
            assert_tokens_equal(answer, [alone[kind][i] for i in indices])
        else:
            theirs = np.array([alone[kind][i] for i in indices])
            np.testing.assert_allclose(np.array(answer, dtype=np.float32), theirs, rtol=0, atol=ATOL)


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
        ("/embed", {"inputs": ["a", 3]}, 422, "`inputs.1`: a token id among texts"),
        ("/embed", {"inputs": ["a", 1.5]}, 422, "`inputs.1`: Input should be a valid string"),
        ("/embed", {"inputs": [101, 30522]}, 422, "`inputs`: 30522 is not a token id"),
        ("/embed", {"inputs": ["a", []]}, 422, "`inputs.1`: an empty list of token ids"),
        ("/embed", {"inputs": [101, 102], "prompt_name": "query"}, 422, "prompt_name 'query' with token ids"),
        ("/embed_all", {"inputs": []}, 422, "`inputs` cannot be empty"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "`normalize`"),
        ("/embed", {"text": "a"}, 422, "`inputs` is required"),
        ("/embed", {"inputs": ["a"] * (CLIENT_BATCH + 1)}, 422, f"maximum allowed batch size {CLIENT_BATCH}"),
        ("/embed", {"inputs": "a", "dimensions": 0}, 422, "`dimensions`"),
        ("/embed", {"inputs": "a", "dimensions": 385}, 422, "dimensions 385 > the model's 384"),
        ("/embed", {"inputs": "a", "prompt_name": "nope"}, 422, "prompt_name 'nope' is not one of the model's"),
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
    ids = httpx.post(server.url + "/v1/embeddings", json={"input": [[101, 102], [101, -1]]}, timeout=60)
    assert ids.status_code == 422 and ids.json()["error"]["message"].startswith("`input.1`: -1 is not a token id")


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
