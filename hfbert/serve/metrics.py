"""What `/metrics` exposes, in Prometheus text (prometheus_client), on a registry of the app's own (two apps in one
process do not share counters).

- `hfbert_requests_total{route, status}`: requests answered, by route and HTTP status;
- `hfbert_request_duration_seconds{route}`: time from the request to its answer;
- `hfbert_queue_duration_seconds`, `hfbert_tokenize_duration_seconds`, `hfbert_inference_duration_seconds`: time an
  input waited for its batch, a request's tokenization, a batch's forward pass;
- `hfbert_batch_size`, `hfbert_batch_tokens`: inputs and real tokens per batch;
- `hfbert_queue_depth`: inputs waiting for the model; `hfbert_requests_in_flight`: requests admitted, not answered;
- `hfbert_input_tokens_total{route}`: tokens of the inputs computed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The server's counters, histograms and gauges (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(
            "hfbert_requests", "Requests answered, by route and status", ["route", "status"], registry=registry
        )
        self.latency = Histogram(
            "hfbert_request_duration_seconds", "Request latency", ["route"], buckets=LATENCY, registry=registry
        )
        self.queue = Histogram(
            "hfbert_queue_duration_seconds", "Time an input waited for its batch", buckets=LATENCY, registry=registry
        )
        self.tokenize = Histogram(
            "hfbert_tokenize_duration_seconds", "A request's tokenization", buckets=LATENCY, registry=registry
        )
        self.inference = Histogram(
            "hfbert_inference_duration_seconds", "A batch's forward pass", buckets=LATENCY, registry=registry
        )
        self.batch_size = Histogram("hfbert_batch_size", "Inputs per batch", buckets=SIZES, registry=registry)
        self.batch_tokens = Histogram("hfbert_batch_tokens", "Real tokens per batch", buckets=TOKENS, registry=registry)
        self.queue_depth = Gauge("hfbert_queue_depth", "Inputs waiting for the model", registry=registry)
        self.in_flight = Gauge("hfbert_requests_in_flight", "Requests admitted and not answered", registry=registry)
        self.input_tokens = Counter("hfbert_input_tokens", "Tokens computed, by route", ["route"], registry=registry)

    def observe_batch(self, size: int, tokens: int, waits: list[float], seconds: float) -> None:
        """One batch done: its size, tokens, each input's wait and the forward pass's time."""
        self.batch_size.observe(size)
        self.batch_tokens.observe(tokens)
        self.inference.observe(seconds)
        for wait in waits:
            self.queue.observe(wait)

    def exposition(self) -> bytes:
        """The Prometheus text of every metric."""
        return generate_latest(self.registry)
