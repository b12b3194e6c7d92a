"""The HTTP routes, on FastAPI: TEI's (`/embed`, `/embed_all`, `/embed_sparse`, `/embed_multi`, `/rerank`, `/predict`,
`/tokenize`,
`/decode`, `/`, `/invocations`, `/info`, `/health`, `/metrics`), OpenAI's `/v1/embeddings` and the Jina/Cohere
`/v1/rerank` and `/v2/rerank`.

`create_app(engine, settings)` builds the app for one loaded model (`engine.Engine`). Every request goes through
`Guard` first (an ASGI middleware: the API key, the payload limit, one log line and the request metrics), then its
route: the body validated (`schemas.py`), the task checked (a route the model does not serve answers 424 naming the
task, as TEI's), the inputs counted against `--max-client-batch-size`, admitted under `--max-concurrent-requests`
(429 beyond), tokenized off the event loop, checked against the model's length (413 with truncation off), and
batched with every other client's (`batcher.py`). Defaults are TEI's: `normalize` true on `/embed`, `raw_scores`
false (a one-label score is its sigmoid, several labels' a softmax), `truncate` as `--auto-truncate`, `prompt_name`
the server's prompt. Inputs are texts or token ids where TEI takes either (`parse_inputs`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from hfbert import __version__
from hfbert.serve import errors
from hfbert.serve.batcher import Batcher
from hfbert.serve.engine import Engine, Operation
from hfbert.serve.errors import ServeError, error_body
from hfbert.serve.metrics import CONTENT_TYPE, Metrics
from hfbert.serve.options import Settings
from hfbert.serve.schemas import (
    CohereRerankRequest,
    DecodeRequest,
    EmbedAllRequest,
    EmbedMultiRequest,
    EmbedRequest,
    EmbedSparseRequest,
    OpenAIEmbeddingRequest,
    PredictRequest,
    RerankRequest,
    TokenizeRequest,
)
from hfbert.tools.texts import check_unicode

log = logging.getLogger("hfbert.serve")
PUBLIC = ("/health",)  # answered without the API key, as TEI's
ROUTES = (
    "/",
    "/invocations",
    "/embed",
    "/embed_all",
    "/embed_sparse",
    "/embed_multi",
    "/rerank",
    "/predict",
    "/tokenize",
    "/decode",
    "/v1/embeddings",
    "/v1/rerank",
    "/v2/rerank",
    "/info",
    "/health",
    "/metrics",
)
# What each operation needs, for the error of a route the model's task does not serve.
NEEDS = {
    "embed": "an embedding model",
    "tokens": "an embedding model",
    "rerank": "a reranker (sequence classification)",
    "predict": "a sequence-classification model",
    "sparse": "a sparse model",
    "multi": "a bge-m3 model (sparse_linear and colbert_linear beside the weights)",
}


class Guard:
    """The ASGI middleware every request passes first: 401 without the API key (all routes but /health), 413 for a
    body over the payload limit (read up to the limit, never further: memory stays bounded whatever a client
    sends), then one log line and the request metrics once answered."""

    def __init__(self, app: Any, settings: Settings, metrics: Metrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self._key = f"Bearer {settings.api_key}".encode() if settings.api_key else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope["path"]
        status = {"code": 500}
        state = scope.setdefault("state", {})

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is None and scope["method"] == "POST":
                receive, refusal = await self._bounded_body(scope, receive)
            if refusal is not None:
                await JSONResponse(error_body(path, refusal), refusal.status)(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            route = path if path in ROUTES else "other"
            self.metrics.requests.labels(route, str(status["code"])).inc()
            self.metrics.latency.labels(route).observe(seconds)
            log.info(
                "%s %s %d inputs=%s tokens=%s %.1fms",
                scope["method"],
                path,
                status["code"],
                state.get("inputs", "-"),
                state.get("tokens", "-"),
                seconds * 1000,
            )

    def _refusal(self, scope: dict) -> ServeError | None:
        if self._key is None or scope["path"] in PUBLIC:
            return None
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self._key):
            return None
        return ServeError(401, "missing or wrong API key: send the header `Authorization: Bearer KEY`", "Unauthorized")

    async def _bounded_body(self, scope: dict, receive: Any) -> tuple[Any, ServeError | None]:
        """The body read whole, up to the payload limit, and a `receive` that replays it; or a 413."""
        limit = self.settings.payload_limit
        too_large = errors.too_large(f"payload over the limit of {limit} bytes (--payload-limit)")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return receive, too_large
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return receive, ServeError(400, "the client disconnected before sending its body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return receive, too_large
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return replay, None


class Server:
    """The state the routes share: the engine, the limits, the batcher, the metrics and the requests in flight."""

    def __init__(self, engine: Engine, settings: Settings, metrics: Metrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.batcher = Batcher(
            engine.run, settings.max_batch_tokens, settings.max_batch_requests, observe=metrics.observe_batch
        )
        self.in_flight = 0
        metrics.queue_depth.set_function(lambda: self.batcher.depth)
        metrics.in_flight.set_function(lambda: self.in_flight)

    def check_task(self, operation: str, route: str) -> None:
        """424 naming the model's task when it does not serve `operation` (TEI: "model is not a re-ranker model")."""
        if not self.engine.serves(operation):
            raise ServeError(
                424,
                f"{route} needs {NEEDS[operation]}, but this server's model ({self.settings.name}) is "
                f"{self.engine.task_name}",
                errors.BACKEND,
            )

    def check_count(self, count: int, field: str) -> None:
        if count == 0:
            raise errors.validation(f"`{field}` cannot be empty")
        if count > self.settings.max_client_batch_size:
            raise errors.validation(
                f"batch size {count} > maximum allowed batch size {self.settings.max_client_batch_size} "
                f"(--max-client-batch-size)"
            )

    def check_prompt(self, operation: str, prompt_name: str | None, inputs: Sequence[Any] = ()) -> None:
        """422 for a prompt name the folder does not have (naming those it has), and for one given with token ids
        (the ids are the model's input as they are)."""
        try:
            self.engine.check_prompt(operation, prompt_name)
        except ValueError as error:
            raise errors.validation(str(error)) from None
        if prompt_name is not None and any(not isinstance(item, str) for item in inputs):
            raise errors.validation(
                f"prompt_name {prompt_name!r} with token ids: ids are the model's input as given; send the prompt's "
                "ids with them (/tokenize gives them), or send texts"
            )

    @contextlib.contextmanager
    def admitted(self):
        """One request in flight, or 429 when `--max-concurrent-requests` are: the queue never grows beyond
        max_concurrent_requests x max_client_batch_size inputs."""
        if self.in_flight >= self.settings.max_concurrent_requests:
            raise errors.overloaded(self.settings.max_concurrent_requests)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def compute(
        self,
        request: Request,
        operation: Operation,
        payloads: Sequence[Any],
        count: Any,
        truncate: bool | None,
        direction: str,
    ) -> tuple[list[Any], int]:
        """The model's outputs for `payloads` (texts, pairs, or token id lists) and their tokens, batched with other
        requests'. `count`: the function counting each payload's tokens (run off the event loop). Inputs over the
        model's length are cut on `direction`'s side (a text cut on the left runs as its ids); pairs on the right
        only."""
        truncate = self.settings.auto_truncate if truncate is None else truncate
        limit = self.engine.max_input_length
        left = direction.lower() == "left"
        with self.admitted():
            started = time.perf_counter()
            counts = await asyncio.to_thread(count)
            self.metrics.tokenize.observe(time.perf_counter() - started)
            payloads = list(payloads)
            cut_left = []  # texts to cut on the left: they run as their ids, cut
            for index, tokens in enumerate(counts):
                if tokens > limit and not truncate:
                    raise errors.too_large(
                        f"input {index} has {tokens} tokens, over the model's limit of {limit} (truncate is false)"
                    )
                if tokens > limit and isinstance(payloads[index], list):
                    payloads[index] = payloads[index][-limit:] if left else payloads[index][:limit]
                elif tokens > limit and left and isinstance(payloads[index], str):
                    cut_left.append(index)
                elif tokens > limit and left:
                    raise errors.validation(
                        "truncation_direction left: pairs of texts are truncated on the right only; shorten the input"
                    )
            if cut_left:
                prompt = self.engine.prompt_text(operation.prompt_name)
                try:
                    cut = await asyncio.to_thread(
                        lambda: [self.engine.truncated_left(payloads[index], prompt) for index in cut_left]
                    )
                except ValueError as error:
                    raise errors.validation(str(error)) from None
                for index, ids in zip(cut_left, cut, strict=True):
                    payloads[index] = ids
            tokens = [min(count, limit) for count in counts]
            request.state.inputs = len(payloads)
            request.state.tokens = sum(tokens)
            self.metrics.input_tokens.labels(request.url.path).inc(sum(tokens))
            results = await _unless_disconnected(request, self._submit(operation, payloads, tokens))
            return results, sum(tokens)

    async def _submit(self, operation: Operation, payloads: list[Any], tokens: list[int]) -> list[Any]:
        """The batcher's results for `payloads`, in order: texts and token id lists go as two operations (a batch
        holds one kind of input) and come back merged."""
        kinds = [isinstance(payload, list) for payload in payloads]
        if not any(kinds):
            return await self.batcher.submit(operation, payloads, tokens)
        groups = [[index for index, ids in enumerate(kinds) if ids == kind] for kind in (False, True)]
        submitted = [
            self.batcher.submit(replace(operation, ids=kind), [payloads[i] for i in group], [tokens[i] for i in group])
            for kind, group in zip((False, True), groups, strict=True)
            if group
        ]
        answers = await asyncio.gather(*submitted)
        results: list[Any] = [None] * len(payloads)
        for group, answer in zip([group for group in groups if group], answers, strict=True):
            for index, result in zip(group, answer, strict=True):
                results[index] = result
        return results


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """`work`'s result; cancelled (its inputs not yet started dropped from the queue) when the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ServeError(499, "the client disconnected", errors.VALIDATION)


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def dense(vector: torch.Tensor, normalize: bool, dimensions: int | None, size: int) -> torch.Tensor:
    """A vector truncated to `dimensions` (Matryoshka, as sentence-transformers' truncate_dim) and then normalized
    to unit length when asked (TEI's order)."""
    if dimensions is not None:
        if dimensions > size:
            raise errors.validation(f"dimensions {dimensions} > the model's {size}")
        vector = vector[:dimensions]
    if normalize:
        vector = torch.nn.functional.normalize(vector, dim=-1)
    return vector


def scores(logits: torch.Tensor, raw: bool) -> torch.Tensor:
    """TEI's scores of (labels,) logits: raw, or a sigmoid for one label and a softmax over several."""
    if raw:
        return logits
    return torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=-1)


def check_query(query: str) -> None:
    """422 for an empty (or blank) query, which ranks nothing, or one that is not valid Unicode."""
    if not query.strip():
        raise errors.validation("`query` cannot be empty")
    check_text(query, "query")


def check_text(text: str, field: str) -> None:
    """422 when `text` is not valid Unicode (a lone surrogate such as "\\ud800" in JSON), which no tokenizer takes."""
    try:
        check_unicode(text, f"`{field}`")
    except ValueError as error:
        raise errors.validation(str(error)) from None


def as_list(inputs: str | list[str], field: str = "inputs") -> list[str]:
    """A request's texts as a list, each checked (`check_text`, named by its place)."""
    if isinstance(inputs, str):
        check_text(inputs, field)
        return [inputs]
    for index, text in enumerate(inputs):
        check_text(text, f"{field}.{index}")
    return list(inputs)


def parse_inputs(inputs: str | list[Any], engine: Engine, field: str = "inputs") -> list[str | list[int]]:
    """A request's inputs as a list of texts and token id lists (TEI's `EmbeddingInput`): a text; a list of ints,
    one input of token ids; a list of texts and lists of ids. 422 naming the input for an id outside a list among
    texts, an empty id list, an id outside the vocabulary or a text that is not valid Unicode."""
    if isinstance(inputs, str):
        return as_list(inputs, field)
    single = bool(inputs) and all(isinstance(item, int) for item in inputs)
    if single:
        inputs = [inputs]
    parsed: list[str | list[int]] = []
    for index, item in enumerate(inputs):
        if isinstance(item, int):
            raise errors.validation(
                f"`{field}.{index}`: a token id among texts; give a text, a list of token ids, or a list of texts "
                "and lists of ids"
            )
        if isinstance(item, str):
            check_text(item, f"{field}.{index}")
        else:
            try:
                engine.check_ids(item, f"`{field}`" if single else f"`{field}.{index}`")
            except ValueError as error:
                raise errors.validation(str(error)) from None
        parsed.append(item)
    return parsed


def create_app(engine: Engine, settings: Settings, metrics: Metrics | None = None) -> FastAPI:
    """The server of `engine`'s model with `settings`' limits (see the module docstring)."""
    metrics = metrics or Metrics()
    server = Server(engine, settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.batcher.start()
        yield
        await server.batcher.close()

    app = FastAPI(title="hfbert serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = server
    app.add_middleware(Guard, settings=settings, metrics=metrics)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, error: ServeError) -> JSONResponse:
        return JSONResponse(error_body(request.url.path, error), error.status)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        message = f"the model failed on this request: {type(error).__name__}: {' '.join(str(error).split())[:300]}"
        return await serve_error(request, ServeError(500, message, errors.BACKEND))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return await serve_error(request, _validation_error(error.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kinds = {404: errors.NOT_FOUND, 405: errors.METHOD_NOT_ALLOWED}
        detail = f"no route {request.url.path}" if error.status_code == 404 else str(error.detail)
        if error.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}"
        refusal = ServeError(error.status_code, detail, kinds.get(error.status_code, errors.VALIDATION))
        return JSONResponse(error_body(request.url.path, refusal), error.status_code, headers=error.headers)

    @app.get("/health")
    async def health() -> Response:
        if not server.batcher.running:
            raise ServeError(503, "the model's batcher is not running", errors.UNHEALTHY)
        return Response(status_code=200)

    @app.get("/info")
    async def info() -> dict[str, Any]:
        return _info(engine, settings)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/embed")
    async def embed(body: EmbedRequest, request: Request) -> list[list[float]]:
        server.check_task("embed", "/embed")
        inputs = parse_inputs(body.inputs, engine)
        server.check_count(len(inputs), "inputs")
        server.check_prompt("embed", body.prompt_name, inputs)
        vectors, _ = await server.compute(
            request,
            Operation("embed", body.prompt_name),
            inputs,
            lambda: engine.count_tokens(inputs, engine.prompt_text(body.prompt_name)),
            body.truncate,
            body.truncation_direction,
        )
        return [dense(v, body.normalize, body.dimensions, engine.dimension).tolist() for v in vectors]

    @app.post("/embed_all")
    async def embed_all(body: EmbedAllRequest, request: Request) -> list[list[list[float]]]:
        server.check_task("tokens", "/embed_all")
        inputs = parse_inputs(body.inputs, engine)
        server.check_count(len(inputs), "inputs")
        server.check_prompt("tokens", body.prompt_name, inputs)
        rows, _ = await server.compute(
            request,
            Operation("tokens", body.prompt_name),
            inputs,
            lambda: engine.count_tokens(inputs, engine.prompt_text(body.prompt_name)),
            body.truncate,
            body.truncation_direction,
        )
        return [row.tolist() for row in rows]

    @app.post("/embed_sparse")
    async def embed_sparse(body: EmbedSparseRequest, request: Request) -> list[list[dict[str, Any]]]:
        server.check_task("sparse", "/embed_sparse")
        inputs = parse_inputs(body.inputs, engine)
        server.check_count(len(inputs), "inputs")
        server.check_prompt("sparse", body.prompt_name, inputs)
        rows, _ = await server.compute(
            request,
            Operation("sparse", body.prompt_name),
            inputs,
            lambda: engine.count_tokens(inputs, engine.prompt_text(body.prompt_name)),
            body.truncate,
            body.truncation_direction,
        )
        return [[{"index": index, "value": value} for index, value in row] for row in rows]

    @app.post("/embed_multi")
    async def embed_multi(body: EmbedMultiRequest, request: Request) -> list[dict[str, Any]]:
        server.check_task("multi", "/embed_multi")
        inputs = parse_inputs(body.inputs, engine)
        server.check_count(len(inputs), "inputs")
        if not body.outputs:
            raise errors.validation("`outputs` cannot be empty: name dense, sparse or colbert")
        outputs = tuple(name for name in ("dense", "sparse", "colbert") if name in body.outputs)
        answers, _ = await server.compute(
            request,
            Operation("multi", outputs=outputs),
            inputs,
            lambda: engine.count_tokens(inputs),
            body.truncate,
            body.truncation_direction,
        )
        result = []
        for answer in answers:
            item: dict[str, Any] = {}
            if "dense" in answer:
                item["dense"] = dense(answer["dense"], body.normalize, None, engine.dimension).tolist()
            if "sparse" in answer:
                item["sparse"] = [{"index": index, "value": value} for index, value in answer["sparse"]]
            if "colbert" in answer:
                item["colbert"] = answer["colbert"].tolist()
            result.append(item)
        return result

    @app.post("/rerank")
    async def rerank(body: RerankRequest, request: Request) -> list[dict[str, Any]]:
        server.check_task("rerank", "/rerank")
        server.check_count(len(body.texts), "texts")
        check_query(body.query)
        as_list(body.texts, "texts")
        logits = await _rerank_logits(server, request, body.query, body.texts, body.truncate, body.truncation_direction)
        ranked = []
        for index, row in enumerate(logits):
            ranked.append({"index": index, "score": float(scores(row, body.raw_scores)[0])})
            if body.return_text:
                ranked[-1]["text"] = body.texts[index]
        return sorted(ranked, key=lambda rank: -rank["score"])

    @app.post("/predict")
    async def predict(body: PredictRequest, request: Request) -> list[Any]:
        server.check_task("predict", "/predict")
        single, pairs = _predict_pairs(body.inputs)
        server.check_count(len(pairs), "inputs")
        as_list([text for pair in pairs for text in pair])
        logits, _ = await server.compute(
            request,
            Operation("rerank"),
            pairs,
            lambda: engine.count_pair_tokens(pairs),
            body.truncate,
            body.truncation_direction,
        )
        labels = engine.labels
        answers = []
        for row in logits:
            values = scores(row, body.raw_scores).tolist()
            ranked = sorted(zip(values, labels, strict=True), key=lambda item: -item[0])
            answers.append([{"score": score, "label": label} for score, label in ranked])
        return answers[0] if single else answers

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> list[list[dict[str, Any]]]:
        texts = as_list(body.inputs)
        server.check_count(len(texts), "inputs")
        server.check_prompt("tokenize", body.prompt_name)
        prompt = engine.prompt_text(body.prompt_name)
        with server.admitted():  # the tokenizer's threads are bounded as the model's queue is
            return await asyncio.to_thread(engine.tokenize, texts, body.add_special_tokens, prompt)

    @app.post("/decode")
    async def decode(body: DecodeRequest) -> list[str]:
        sequences = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
        server.check_count(len(sequences), "ids")
        try:
            with server.admitted():
                return await asyncio.to_thread(engine.decode, sequences, body.skip_special_tokens)
        except ValueError as error:
            raise errors.validation(str(error)) from None

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> dict[str, Any]:
        server.check_task("embed", "/v1/embeddings")
        inputs = parse_inputs(body.input, engine, "input")
        server.check_count(len(inputs), "input")
        server.check_prompt("embed", body.prompt_name, inputs)
        vectors, tokens = await server.compute(
            request,
            Operation("embed", body.prompt_name),
            inputs,
            lambda: engine.count_tokens(inputs, engine.prompt_text(body.prompt_name)),
            None,
            "right",
        )
        data = []
        for index, vector in enumerate(vectors):
            unit = dense(vector, True, body.dimensions, engine.dimension)
            if body.encoding_format == "base64":  # little-endian float32, as OpenAI's
                embedding: Any = base64.b64encode(unit.contiguous().numpy().astype("<f4").tobytes()).decode("ascii")
            else:
                embedding = unit.tolist()
            data.append({"object": "embedding", "embedding": embedding, "index": index})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": body.model or settings.name, "usage": usage}

    async def cohere_rerank(body: CohereRerankRequest, request: Request) -> dict[str, Any]:
        route = request.url.path
        server.check_task("rerank", route)
        server.check_count(len(body.documents), "documents")
        documents = [document if isinstance(document, str) else document.text for document in body.documents]
        check_query(body.query)
        as_list(documents, "documents")
        logits = await _rerank_logits(server, request, body.query, documents, None, "right")
        results = []
        for index, row in enumerate(logits):
            results.append({"index": index, "relevance_score": float(scores(row, False)[0])})
            if body.return_documents:
                results[-1]["document"] = {"text": documents[index]}
        results.sort(key=lambda result: -result["relevance_score"])
        tokens = request.state.tokens
        return {
            "model": body.model or settings.name,
            "results": results[: body.top_n],
            "usage": {"total_tokens": tokens},
        }

    app.post("/v1/rerank")(cohere_rerank)
    app.post("/v2/rerank")(cohere_rerank)
    # TEI's default route (and SageMaker's): the task's own, where huggingface_hub's InferenceClient posts.
    default = {"embed": embed, "m3": embed, "sparse": embed_sparse}.get(engine.task)
    if default is None:
        default = rerank if len(engine.labels) == 1 else predict
    app.post("/")(default)
    app.post("/invocations")(default)
    return app


async def _rerank_logits(
    server: Server, request: Request, query: str, texts: list[str], truncate: bool | None, direction: str
) -> list[torch.Tensor]:
    pairs = [(query, text) for text in texts]
    logits, _ = await server.compute(
        request, Operation("rerank"), pairs, lambda: server.engine.count_pair_tokens(pairs), truncate, direction
    )
    return logits


def _predict_pairs(inputs: str | list[str] | list[list[str]]) -> tuple[bool, list[tuple[str, str]]]:
    """(one input?, the (first, second) pairs) of `/predict`'s inputs, TEI's forms: a text, a pair, a batch of them.
    The served cross-encoders score pairs: a lone text is refused, naming it."""
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], str)):
        single, batch = True, [[inputs] if isinstance(inputs, str) else inputs]
    else:
        single, batch = False, inputs
    pairs = []
    for index, sequence in enumerate(batch):
        where = "`inputs`" if single else f"`inputs.{index}`"
        if len(sequence) == 2:
            pairs.append((sequence[0], sequence[1]))
        elif len(sequence) == 1:
            raise errors.validation(f"{where}: one text; this model scores pairs of texts, give [first, second]")
        else:
            raise errors.validation(f"{where}: {len(sequence)} texts; expected a pair [first, second]")
    return single, pairs


def _validation_error(problems: Sequence[dict[str, Any]]) -> ServeError:
    """One error for pydantic's list: 400 for a body that is no JSON, else 422 naming the first field."""
    for problem in problems:
        if problem.get("type") == "json_invalid":
            reason = problem.get("ctx", {}).get("error", "")
            return ServeError(400, f"the body is not valid JSON ({reason})".replace(" ()", ""), errors.VALIDATION)
    if not problems:
        return errors.validation("invalid request")
    # pydantic names the branch of a union it tried (`str`, `list[str]`): the field's path is what a client knows,
    # and the deepest problem names the item (`inputs.3`).
    paths = [[str(part) for part in p.get("loc", ()) if part != "body" and not _is_branch(part)] for p in problems]
    deepest = max(len(path) for path in paths)
    found = [(path, problem) for path, problem in zip(paths, problems, strict=True) if len(path) == deepest]
    field = ".".join(found[0][0]) or "body"
    if found[0][1].get("type") == "missing":
        return errors.validation(f"`{field}` is required")
    messages = list(
        dict.fromkeys(problem.get("msg", "invalid value") for path, problem in found if path == found[0][0])
    )
    return errors.validation(f"`{field}`: {' or '.join(messages)}")


def _is_branch(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "bool", "Document") or "[" in part or "-" in part)


def _info(engine: Engine, settings: Settings) -> dict[str, Any]:
    """TEI's `Info`, and hfbert's own fields (`task`, `mode`, `pipeline`)."""
    if engine.task == "rerank":
        labels = {"id2label": dict(enumerate(engine.labels)), "label2id": {n: i for i, n in enumerate(engine.labels)}}
        model_type: dict[str, Any] = {"reranker" if len(engine.labels) == 1 else "classifier": labels}
    else:
        model_type = {"embedding": {"pooling": engine.pooling}}
    options = engine.options.load
    return {
        "model_id": settings.model_id,
        "model_sha": None,
        "model_dtype": "float32",
        "served_model_name": settings.name,
        "model_type": model_type,
        "max_concurrent_requests": settings.max_concurrent_requests,
        "max_input_length": engine.max_input_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_requests,
        "max_client_batch_size": settings.max_client_batch_size,
        "auto_truncate": settings.auto_truncate,
        "tokenization_workers": 1,
        "version": __version__,
        "sha": None,
        "docker_label": None,
        "task": engine.task,
        "mode": {"precision": options.precision, "quantize": options.quantize, "device": options.device},
        "pipeline": engine.describe(),
        "dimension": engine.dimension,
    }
