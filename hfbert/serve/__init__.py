"""`hfbert serve`: a model's embeddings, reranking and sparse vectors over HTTP, TEI- and OpenAI-compatible
(docs/serving.md). This floor stands beside `hfbert/cli.py`, above the tools; `import hfbert` never imports it, and
nothing here imports FastAPI or uvicorn until a server is built (`options.py` is what the CLI reads).

- `__main__.py`: `python -m hfbert.serve MODEL`, the start and its log;
- `options.py`: the command's options (TEI's names and defaults) and `Settings`, the limits in force;
- `engine.py`: `Engine`, the one adapter to the library's encoders (the task, token counts, raw outputs);
- `batcher.py`: the queue, batched by a budget of real tokens, the model on one thread off the event loop;
- `app.py`: the routes, on FastAPI, and the middleware that checks the API key and the payload limit;
- `schemas.py`: the request bodies, as pydantic models;
- `errors.py`: the errors, in each API's JSON shape;
- `metrics.py`: the Prometheus metrics of `/metrics`.
"""
