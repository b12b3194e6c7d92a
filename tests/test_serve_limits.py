"""`hfbert serve` as a trusted server behaves (issue #66): 401 without the API key (every route but /health), 413 for
a body over `--payload-limit` (announced or chunked) and for a text over the model's length with truncation off,
429 when `--max-concurrent-requests` are in flight (while /health still answers at once), the work of a client that
disconnected dropped before it runs; and with truncation on, a long text's vector equals sentence-transformers'
(which truncates at the same length), on the right or on the left.

A small random BERT with MiniLM's tokenizer and pipeline (`support.helpers.write_small_minilm_checkpoint`: 128
positions). The model call is wrapped in a gate the tests can close, to hold a batch on the model thread. One
server for the module, on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support.family import TEXTS
from support.helpers import write_small_minilm_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

KEY = "secret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PAYLOAD_LIMIT = 4000
CONCURRENT = 2
LONG = " ".join(TEXTS) * 2  # over 128 tokens
WAIT = 30  # seconds any wait below may take at most


class Gate:
    """The engine's `run`, held while the gate is closed; records what the model ran."""

    def __init__(self, run):
        self._run = run
        self.open = threading.Event()
        self.open.set()
        self.ran: list[list] = []
        self.fail = False

    def __call__(self, operation, inputs):
        assert self.open.wait(WAIT), "the gate stayed closed"
        self.ran.append(list(inputs))
        if self.fail:
            raise RuntimeError("the model broke")
        return self._run(operation, inputs)


def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_small_minilm_checkpoint(tmp_path_factory.mktemp("serve-limits") / "small")


@pytest.fixture(scope="module")
def served(folder):
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine
    from hfbert.serve.options import Settings

    from support.serve import RunningServer

    engine = Engine(folder)
    gate = engine.run = Gate(engine.run)
    settings = Settings(
        model_id="small",
        api_key=KEY,
        payload_limit=PAYLOAD_LIMIT,
        max_concurrent_requests=CONCURRENT,
        max_client_batch_size=4,
        auto_truncate=False,
    )
    app = create_app(engine, settings)
    running = RunningServer(app)
    yield running, app.state.server, gate
    gate.open.set()
    running.stop()


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=WAIT, headers=AUTH) as client:
        yield client


@pytest.mark.parametrize(("method", "route"), [("POST", "/embed"), ("GET", "/info"), ("GET", "/metrics")])
def test_every_route_but_health_needs_the_key(served, method, route):
    url = served[0].url + route
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        answer = httpx.request(method, url, json={"inputs": "a"}, headers=headers, timeout=WAIT)
        assert answer.status_code == 401 and "API key" in answer.json()["error"]
    assert httpx.request(method, url, json={"inputs": "a"}, headers=AUTH, timeout=WAIT).status_code == 200
    assert httpx.get(served[0].url + "/health", timeout=WAIT).status_code == 200


def test_openai_client_sends_the_key(served):
    openai = pytest.importorskip("openai")
    url = served[0].url + "/v1"
    good = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=WAIT)
    assert len(good.embeddings.create(model="small", input="a").data[0].embedding) == 96
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="wrong", max_retries=0, timeout=WAIT).embeddings.create(
            model="m", input="a"
        )


def test_payload_over_the_limit(client):
    body = {"inputs": ["word " * (PAYLOAD_LIMIT // 5)]}
    answer = client.post("/embed", json=body)
    assert answer.status_code == 413 and f"limit of {PAYLOAD_LIMIT} bytes" in answer.json()["error"]

    def chunks():  # no Content-Length: the limit holds on what arrives
        yield b'{"inputs": ["'
        for _ in range(PAYLOAD_LIMIT // 100):
            yield b"word " * 20
        yield b'"]}'

    chunked = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert chunked.status_code == 413
    openai_shape = client.post("/v1/embeddings", json={"input": body["inputs"]}).json()
    assert f"limit of {PAYLOAD_LIMIT} bytes" in openai_shape["error"]["message"]


def test_a_long_text_without_truncation_is_refused(client):
    answer = client.post("/embed", json={"inputs": ["short", LONG]})
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("input 1 has ") and "limit of 128 (truncate is false)" in answer.text


def test_a_long_text_with_truncation_equals_sentence_transformers(client, folder):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(folder), device="cpu")
    reference.max_seq_length = 128  # the folder says MiniLM's 256; the model has 128 positions, hfbert's limit
    answer = client.post("/embed", json={"inputs": [LONG, TEXTS[0]], "truncate": True})
    assert answer.status_code == 200
    np.testing.assert_allclose(np.array(answer.json()), reference.encode([LONG, TEXTS[0]]), rtol=0, atol=1e-5)
    body = {"inputs": [LONG, TEXTS[0]], "truncate": True, "truncation_direction": "left"}
    left = client.post("/embed", json=body)
    assert left.status_code == 200, left.text
    reference.tokenizer.truncation_side = "left"  # TEI's left: the text's start cut, its special tokens kept
    theirs = reference.encode([LONG, TEXTS[0]])
    np.testing.assert_allclose(np.array(left.json()), theirs, rtol=0, atol=1e-5)
    assert np.abs(theirs[0] - np.array(answer.json()[0])).max() > 0.01  # not the right side's cut


def test_overload_is_429_and_health_stays_responsive(served, client):
    _, server, gate = served
    gate.open.clear()
    with httpx.Client(base_url=served[0].url, timeout=WAIT, headers=AUTH) as other:
        threads = [
            threading.Thread(target=other.post, args=("/embed",), kwargs={"json": {"inputs": f"held {i}"}})
            for i in range(CONCURRENT)
        ]
        try:
            for thread in threads:
                thread.start()
            until(lambda: server.in_flight == CONCURRENT, "the requests to be admitted")
            refused = client.post("/embed", json={"inputs": "one too many"})
            assert refused.status_code == 429
            assert refused.json()["error_type"] == "Overloaded" and "--max-concurrent-requests" in refused.text
            started = time.monotonic()
            assert client.get("/health").status_code == 200
            assert time.monotonic() - started < 2  # not behind the model
        finally:
            gate.open.set()
            for thread in threads:
                thread.join(WAIT)
    until(lambda: server.in_flight == 0, "the held requests to finish")


def test_a_disconnected_clients_work_is_dropped(served, client):
    _, server, gate = served
    gate.open.clear()
    holder = threading.Thread(target=client.post, args=("/embed",), kwargs={"json": {"inputs": "holds the model"}})
    try:
        holder.start()
        until(lambda: server.in_flight == 1 and server.batcher.depth == 0, "the first batch to start")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(served[0].url + "/embed", json={"inputs": "never computed"}, headers=AUTH, timeout=0.5)
        until(lambda: server.in_flight == 1, "the disconnected request to be dropped")
    finally:
        gate.open.set()
        holder.join(WAIT)
    until(lambda: server.in_flight == 0, "the held request to finish")
    assert ["holds the model"] in gate.ran and not any("never computed" in batch for batch in gate.ran)


def test_a_model_failure_is_a_500_for_its_request_only(served, client):
    gate = served[2]
    gate.fail = True
    try:
        answer = client.post("/embed", json={"inputs": "breaks"})
    finally:
        gate.fail = False
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "the model failed on this request: RuntimeError: the model broke",
        "error_type": "Backend",
    }
    assert client.post("/embed", json={"inputs": "works again"}).status_code == 200


@pytest.mark.slow
def test_the_command_serves_and_exits_0_on_sigterm(folder, tmp_path):
    """`python -m hfbert.serve`: starts, answers, and on SIGTERM stops and exits 0."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "hfbert.serve", str(folder), "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy():
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return process.poll() is not None

        deadline = time.monotonic() + 120
        while not healthy():
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        assert process.poll() is None, process.stdout.read().decode()
        assert len(httpx.post(url + "/embed", json={"inputs": "a"}, timeout=WAIT).json()[0]) == 96
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)
