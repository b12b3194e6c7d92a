"""`embed` and `rerank`: a Ray Dataset in, the same Dataset with output columns out, lazily (nothing runs until the
dataset is consumed or written). Ray Data's documented batch-inference pattern: the callable class of
`hfbert.ray_data.batches` mapped over batches by a pool of actors, each loading the model once.

    >>> import ray, hfbert.ray_data
    >>> corpus = ray.data.read_parquet("s3://bucket/corpus/")  # doctest: +SKIP
    >>> embedded = hfbert.ray_data.embed(corpus, "BAAI/bge-small-en-v1.5", concurrency=4)  # doctest: +SKIP
    >>> embedded.write_parquet("s3://bucket/embeddings/")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from hfbert.ray_data.batches import EmbedBatches, RerankBatches, checked_outputs

BATCH_SIZE = 256  # rows per map_batches call: sorted by length inside, so that padding stays small
__all__ = ["BATCH_SIZE", "embed", "import_ray", "rerank"]


def import_ray() -> Any:
    """`ray`, or MissingExtraError saying how to install it."""
    from hfbert.tools.extras import import_optional

    return import_optional("ray", "hfbert's Ray Data adapter needs ray: pip install 'hfbert[ray]'")


def _check_columns(dataset: Any, columns: Sequence[str]) -> None:
    """ValueError naming a missing column, where the dataset knows its schema without running (Parquet, or any
    dataset already read); otherwise the batches name it."""
    schema = dataset.schema(fetch_if_missing=False)
    names = getattr(schema, "names", None)
    for column in columns:
        if names is not None and column not in names:
            raise ValueError(f"the dataset has no column {column!r} (its columns: {', '.join(names)})")


def _map(
    dataset: Any, cls: type, constructor: dict[str, Any], batch_size: int, concurrency: int, num_cpus: float
) -> Any:
    ray = import_ray()
    if batch_size < 1 or concurrency < 1:
        raise ValueError(f"batch_size and concurrency must be at least 1, got {batch_size} and {concurrency}")
    return dataset.map_batches(
        cls,
        fn_constructor_kwargs=constructor,
        batch_size=batch_size,
        batch_format="pyarrow",  # lists stay lists (numpy would make them Ray's tensor extension type)
        # `compute=ActorPoolStrategy(size=N)` is the documented spelling of ray 2.60 (older releases: concurrency=N).
        compute=ray.data.ActorPoolStrategy(size=concurrency),
        num_cpus=num_cpus,
    )


def embed(
    dataset: Any,
    model: str | os.PathLike,
    *,
    text_column: str = "text",
    outputs: str | Sequence[str] = ("dense",),
    prompt_name: str | None = None,
    batch_size: int = BATCH_SIZE,
    concurrency: int = 1,
    num_cpus: float = 1,
    threads: int | None = None,
    precision: str | None = None,
    quantize: str | None = None,
    model_batch_size: int = 32,
    **load_options: Any,
) -> Any:
    """`dataset` with the columns of `outputs` added (`embedding`; `sparse_indices` + `sparse_values`; `colbert`:
    see `hfbert.ray_data.batches`), every other column passed through. `batch_size` rows per `map_batches` call,
    `concurrency` actors reserving `num_cpus` CPUs each and running `threads` torch threads (None: `num_cpus`),
    each loading `model` (a local folder every node can read, or a Hub repo id) once. `precision`, `quantize` and
    the other `load_options`: `hfbert.tools.retrieval.LoadOptions`. Lazy: returns a `ray.data.Dataset`."""
    outputs = checked_outputs(outputs)
    _check_columns(dataset, [text_column])
    options = {key: value for key, value in dict(precision=precision, quantize=quantize).items() if value is not None}
    constructor = dict(
        model=str(model),
        text_column=text_column,
        outputs=outputs,
        prompt_name=prompt_name,
        model_batch_size=model_batch_size,
        threads=threads or max(1, round(num_cpus)),
        **options,
        **load_options,
    )
    return _map(dataset, EmbedBatches, constructor, batch_size, concurrency, num_cpus)


def rerank(
    dataset: Any,
    model: str | os.PathLike,
    *,
    query_column: str = "query",
    text_column: str = "text",
    batch_size: int = BATCH_SIZE,
    concurrency: int = 1,
    num_cpus: float = 1,
    threads: int | None = None,
    model_batch_size: int = 32,
    **load_options: Any,
) -> Any:
    """`dataset` with `score` added: the cross-encoder `model`'s score of each row's (query, text) pair
    (`hfbert.ray_data.batches.RerankBatches`), every other column passed through. The other arguments are
    `embed`'s. Lazy: returns a `ray.data.Dataset`."""
    _check_columns(dataset, [query_column, text_column])
    constructor = dict(
        model=str(model),
        query_column=query_column,
        text_column=text_column,
        model_batch_size=model_batch_size,
        threads=threads or max(1, round(num_cpus)),
        **load_options,
    )
    return _map(dataset, RerankBatches, constructor, batch_size, concurrency, num_cpus)
