"""`hfbert serve`'s options, named as text-embeddings-inference names them where it has them, and the limits they
set (`Settings`). No web framework is imported here: `hfbert/cli.py` adds these options to its parser cheaply.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hfbert.inference.optimize import COMPILE_CHOICES, PRECISIONS, QUANTIZATIONS
from hfbert.tools.sentence_transformers_modules import POOLINGS

# TEI's defaults (router/src/main.rs), but the host: loopback unless told otherwise.
HOST = "127.0.0.1"
PORT = 8080
MAX_BATCH_TOKENS = 16384
MAX_CLIENT_BATCH_SIZE = 32
MAX_CONCURRENT_REQUESTS = 512
PAYLOAD_LIMIT = 2_000_000


@dataclass
class Settings:
    """The server's limits and identity. `auto_truncate`: inputs over the model's length are truncated unless a
    request says `"truncate": false` (TEI's default, true); `max_batch_requests`: inputs per batch (None: the token
    budget alone)."""

    model_id: str = "model"
    host: str = HOST
    port: int = PORT
    api_key: str | None = None
    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_batch_requests: int | None = None
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS
    payload_limit: int = PAYLOAD_LIMIT
    auto_truncate: bool = True
    served_model_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_client_batch_size", "max_concurrent_requests", "payload_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_batch_requests is not None and self.max_batch_requests < 1:
            raise ValueError(f"--max-batch-requests must be at least 1, got {self.max_batch_requests}")

    @property
    def name(self) -> str:
        """The model's name in answers (`model` of the OpenAI and Jina/Cohere routes, `/info`)."""
        return self.served_model_name or self.model_id


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _pooling(text: str) -> str:
    modes = text.split("+")
    if text != "splade" and any(mode not in POOLINGS for mode in modes):
        raise argparse.ArgumentTypeError(f"expected splade or one of {', '.join(POOLINGS)} (joined by +), got {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hfbert serve`'s arguments: MODEL, the server's limits (TEI's names and defaults), the inference modes."""
    parser.add_argument("model", metavar="MODEL", help="a local folder or a Hub repo id; its task is read from it")
    parser.add_argument(
        "--host", metavar="HOST", default=HOST, help=f"address to bind (default: {HOST}, loopback only)"
    )
    parser.add_argument("--port", metavar="PORT", type=int, default=PORT, help=f"port to listen on (default: {PORT})")
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on every route but /health (default: none; env HFBERT_API_KEY)",
    )
    parser.add_argument(
        "--max-batch-tokens",
        metavar="N",
        type=_positive,
        default=MAX_BATCH_TOKENS,
        help=f"real tokens per batch, summed over its inputs (default: {MAX_BATCH_TOKENS})",
    )
    parser.add_argument(
        "--max-batch-requests", metavar="N", type=_positive, help="inputs per batch (default: no limit but the tokens)"
    )
    parser.add_argument(
        "--max-client-batch-size",
        metavar="N",
        type=_positive,
        default=MAX_CLIENT_BATCH_SIZE,
        help=f"inputs per request (default: {MAX_CLIENT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--max-concurrent-requests",
        metavar="N",
        type=_positive,
        default=MAX_CONCURRENT_REQUESTS,
        help=f"requests in flight; more are refused with 429 (default: {MAX_CONCURRENT_REQUESTS})",
    )
    parser.add_argument(
        "--payload-limit",
        metavar="BYTES",
        type=_positive,
        default=PAYLOAD_LIMIT,
        help=f"bytes per request body; more is refused with 413 (default: {PAYLOAD_LIMIT})",
    )
    parser.add_argument(
        "--auto-truncate",
        type=_boolean,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="truncate inputs over the model's length unless a request says truncate: false (default: true, as TEI)",
    )
    parser.add_argument("--served-model-name", metavar="NAME", help="the model's name in answers (default: MODEL)")
    parser.add_argument(
        "--prompt-name", metavar="NAME", help="the checkpoint's prompt put before every input (default: its own)"
    )
    parser.add_argument(
        "--pooling",
        metavar="MODE",
        type=_pooling,
        help="splade: sparse vectors of a masked LM; or an embedding pooling (cls, mean, ...) instead of the folder's",
    )
    parser.add_argument("--max-length", metavar="N", type=_positive, help="tokens per input (default: the folder's)")
    parser.add_argument("--revision", help="branch, tag or commit sha of a Hub repo id")
    parser.add_argument("--device", metavar="DEVICE", default="cpu", help="cpu, cuda, cuda:N or mps (default: cpu)")
    parser.add_argument("--quantize", choices=list(QUANTIZATIONS), help="int8 weights and activations (lossy)")
    parser.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="highest",
        help="highest: fp32 (default); high: the fast fp32 mode; bf16: products in bf16 (lossy)",
    )
    parser.add_argument(
        "--compile",
        choices=list(COMPILE_CHOICES),
        help="aot: the forward compiled ahead of time (AOTInductor), kept on disk under $HFBERT_CACHE/aot: the first "
        "start of a model compiles (tens of seconds), later starts load it",
    )
    parser.add_argument("--ignore-auto-map", action="store_true", help="load a custom-code checkpoint as plain BERT")
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"], help="(default: info)"
    )


def settings_of(arguments: argparse.Namespace) -> Settings:
    """The `Settings` of parsed arguments; ValueError naming the option for a bad limit."""
    import os

    return Settings(
        model_id=arguments.model,
        host=arguments.host,
        port=arguments.port,
        api_key=arguments.api_key or os.environ.get("HFBERT_API_KEY") or None,
        max_batch_tokens=arguments.max_batch_tokens,
        max_batch_requests=arguments.max_batch_requests,
        max_client_batch_size=arguments.max_client_batch_size,
        max_concurrent_requests=arguments.max_concurrent_requests,
        payload_limit=arguments.payload_limit,
        auto_truncate=arguments.auto_truncate,
        served_model_name=arguments.served_model_name,
    )
