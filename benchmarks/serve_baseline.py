"""The server many users write around sentence-transformers: one FastAPI handler that calls `encode`, run by uvicorn.
benchmarks/serve.py starts it as a subprocess and measures `hfbert serve` against it.

    python -m benchmarks.serve_baseline MODEL_FOLDER --port PORT [--host 127.0.0.1]

`POST /embed` takes TEI's request (`{"inputs": text or [texts]}`) and answers one unit vector per input, as `hfbert
serve`'s `/embed` does; `GET /health` answers 200. The handler is a plain `def`, so FastAPI runs each request in its
thread pool with no batching across requests: what the common recipe does, kept as it is on purpose.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


class EmbedRequest(BaseModel):
    """TEI's `/embed` request, its `inputs` only. At module level: FastAPI resolves the handler's annotations here."""

    inputs: str | list[str]


def create_app(model_folder: str) -> Any:
    """The FastAPI app serving sentence-transformers' `encode` on `model_folder` (CPU)."""
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_folder, device="cpu")
    app = FastAPI()

    @app.post("/embed")
    def embed(request: EmbedRequest) -> list[list[float]]:
        texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
        return model.encode(texts, normalize_embeddings=True, show_progress_bar=False).tolist()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve_baseline", description=__doc__.split("\n")[0])
    parser.add_argument("model", metavar="MODEL_FOLDER", help="a sentence-transformers folder")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    arguments = parser.parse_args(argv)
    uvicorn.run(create_app(arguments.model), host=arguments.host, port=arguments.port, log_level="warning")


if __name__ == "__main__":
    main()
