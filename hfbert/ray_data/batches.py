"""The callable classes `map_batches` runs: `EmbedBatches` and `RerankBatches`. Each loads its model once, in its
constructor (once per Ray actor), and turns a batch into output columns by calling the library's one retrieval
interface (`hfbert.tools.retrieval`: `Embedder`, `SparseEncoder`, `CrossEncoder`, bge-m3's `Embedder.embed_m3`):
the batch's texts are sorted by length and run `model_batch_size` at a time there, never here.

Nothing here imports Ray: a batch is a `pyarrow.Table`, a `pandas.DataFrame` or a dict of columns, so the same
classes serve Spark's `mapInPandas`, Dask's `map_partitions` or a plain loop (a class is picklable before its first
call; the model is built in the constructor, where each worker calls it). A pandas batch gives a pandas batch back;
any other gives a `pyarrow.Table`, whose list columns Parquet stores as plain lists.

Output columns: `embedding` (list<float32>: the folder's sentence-transformers pipeline, prompts and normalisation
as the folder says), `sparse_indices` (list<int32>: token ids, ascending) and `sparse_values` (list<float32>: their
weights) for a SPLADE folder or bge-m3's lexical weights, `colbert` (list<list<float32>>: bge-m3's vectors, one per
token but the first), `score` (float32: a cross-encoder's, or list<float32> for several labels). Every other column
passes through unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

OUTPUTS = ("dense", "sparse", "colbert")
COLUMNS = {"dense": ("embedding",), "sparse": ("sparse_indices", "sparse_values"), "colbert": ("colbert",)}
__all__ = ["COLUMNS", "OUTPUTS", "EmbedBatches", "RerankBatches", "checked_outputs"]


def checked_outputs(outputs: str | Sequence[str]) -> tuple[str, ...]:
    """`outputs` ("dense,sparse" or a list of names) as a tuple in `OUTPUTS`' order; ValueError naming the choices."""
    from hfbert.tools.bge_m3 import parse_outputs

    return parse_outputs(outputs)


def _pyarrow() -> Any:
    from hfbert.tools.extras import import_optional

    return import_optional("pyarrow", "hfbert.ray_data needs pyarrow: pip install 'hfbert[ray]'")


def _as_table(batch: Any) -> tuple[Any, bool]:
    """The batch as a pyarrow Table, and whether it came as pandas (and goes back so)."""
    pa = _pyarrow()
    if isinstance(batch, pa.Table):
        return batch, False
    if type(batch).__module__.startswith("pandas"):
        return pa.Table.from_pandas(batch, preserve_index=False), True
    if isinstance(batch, dict):
        return pa.table({name: list(column) if _is_2d(column) else column for name, column in batch.items()}), False
    raise TypeError(f"a batch must be a pyarrow.Table, a pandas.DataFrame or a dict of columns, not {type(batch)}")


def _is_2d(column: Any) -> bool:
    return getattr(column, "ndim", 1) > 1


def _texts(table: Any, column: str) -> list[str]:
    """The column's texts; ValueError naming the column when it is missing, or holds a null or a non-string."""
    if column not in table.column_names:
        raise ValueError(f"the batch has no column {column!r} (its columns: {', '.join(table.column_names)})")
    values = table.column(column)
    if values.null_count:
        row = values.is_null().to_pylist().index(True)
        raise ValueError(f"column {column!r}: row {row} of the batch is null; give every row a text (or drop it)")
    texts = values.to_pylist()
    for row, text in enumerate(texts):
        if not isinstance(text, str):
            raise ValueError(f"column {column!r}: row {row} of the batch is {type(text).__name__}, not a string")
    return texts


def _finish(table: Any, columns: dict[str, Any], pandas: bool) -> Any:
    """`table` with `columns` added (replacing any of the same name): a Table, or a DataFrame for a pandas batch."""
    for name, values in columns.items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, values)
    return table.to_pandas() if pandas else table


def _vectors(rows: Any) -> Any:
    """A list<float32> column of a (rows, dimension) float32 array, without a copy per row."""
    pa, numpy = _pyarrow(), _numpy()
    rows = numpy.ascontiguousarray(rows, dtype=numpy.float32)
    offsets = numpy.arange(0, rows.size + 1, rows.shape[1] if rows.ndim > 1 else 1, dtype=numpy.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(rows.reshape(-1)))


def _numpy() -> Any:
    import numpy

    return numpy


def _sparse_columns(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    """`sparse_indices` / `sparse_values` from (token ids, weights) per text, each sorted by token id."""
    pa, numpy = _pyarrow(), _numpy()
    indices, values = [], []
    for ids, weights in pairs:
        ids, weights = numpy.asarray(ids, dtype=numpy.int64), numpy.asarray(weights, dtype=numpy.float32)
        order = numpy.argsort(ids, kind="stable")
        indices.append(ids[order].astype(numpy.int32))
        values.append(weights[order])
    return {
        "sparse_indices": pa.array(indices, type=pa.list_(pa.int32())),
        "sparse_values": pa.array(values, type=pa.list_(pa.float32())),
    }


class EmbedBatches:
    """`map_batches`' callable class for embeddings: `EmbedBatches(model, outputs=("dense",))(batch)` adds the
    output columns of `outputs` (see the module docstring) to `batch`.

    Which encoder runs: "dense" (and "colbert") are the folder's `Embedder`; "sparse" is bge-m3's lexical weights
    where the folder has bge-m3's `sparse_linear` file, otherwise a SPLADE folder's `SparseEncoder` (alone: a SPLADE
    folder has no dense output). Several outputs of a bge-m3 folder come from one encoder pass (`embed_m3`).
    `prompt_name`: a prompt of the folder (None: the folder's default prompt, as `encode`); `model_batch_size`:
    texts per model call; `threads`: torch's intra-op threads (None: as the process has them, which Ray sets to the
    actor's CPUs). The load options (`precision`, `quantize`, `max_length`, `device`, `dtype`, `revision`,
    `cache_dir`, `token`, `ignore_auto_map`) are `hfbert.tools.retrieval.LoadOptions`' fields."""

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        text_column: str = "text",
        outputs: str | Sequence[str] = ("dense",),
        prompt_name: str | None = None,
        model_batch_size: int = 32,
        threads: int | None = None,
        **load_options: Any,
    ) -> None:
        import torch

        from hfbert.tools.bge_m3 import SPARSE_LINEAR, head_file
        from hfbert.tools.head_checkpoint import resolve_folder
        from hfbert.tools.retrieval import LoadOptions

        if threads is not None:
            torch.set_num_threads(threads)
        self.text_column, self.outputs, self.prompt_name = text_column, checked_outputs(outputs), prompt_name
        self.model_batch_size = model_batch_size
        options = LoadOptions.of(None, load_options)
        directory = resolve_folder(model, options.revision, options.cache_dir, options.token)
        self.m3 = head_file(directory, SPARSE_LINEAR).is_file()
        self.encoder: Any
        if "sparse" in self.outputs and not self.m3:
            if self.outputs != ("sparse",):
                raise ValueError(
                    f"{directory}: outputs {','.join(self.outputs)}: a SPLADE folder gives sparse vectors alone "
                    f"(dense and colbert with sparse need bge-m3's sparse_linear and colbert_linear files)"
                )
            from hfbert.tools.sparse import SparseEncoder

            self.encoder = SparseEncoder(directory, options=options)
        else:
            from hfbert.tools.embedding import Embedder

            self.encoder = Embedder(directory, prompt_name=prompt_name, batch_size=model_batch_size, options=options)
            if "colbert" in self.outputs and not self.m3:
                self.encoder.m3_heads  # noqa: B018 - the missing colbert_linear file named here, before any batch
            if self.m3 and self.outputs != ("dense",):
                self.encoder.m3_heads  # noqa: B018 - a malformed head file fails here, once, not in every batch

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns this class adds, in order."""
        return tuple(column for output in self.outputs for column in COLUMNS[output])

    def __call__(self, batch: Any) -> Any:
        table, pandas = _as_table(batch)
        texts = _texts(table, self.text_column)
        return _finish(table, self._outputs(texts), pandas)

    def _outputs(self, texts: list[str]) -> dict[str, Any]:
        import torch

        pa = _pyarrow()
        encoder, size = self.encoder, self.model_batch_size
        if self.outputs == ("dense",):
            return {"embedding": _vectors(encoder.encode(texts, batch_size=size))}
        if not self.m3:  # SPLADE
            vectors = encoder.encode(texts, prompt_name=self.prompt_name, batch_size=size, convert_to_tensor=False)
            return _sparse_columns(encoder.nonzero(vectors))
        result = encoder.embed_m3(texts, self.outputs, batch_size=size)
        columns: dict[str, Any] = {}
        if "dense" in self.outputs:
            columns["embedding"] = _vectors(result["dense_vecs"].numpy())
        if "sparse" in self.outputs:
            weights = result["lexical_weights"]
            columns.update(_sparse_columns([([int(k) for k in w], list(w.values())) for w in weights]))
        if "colbert" in self.outputs:
            vectors = [vectors.to(torch.float32).numpy() for vectors in result["colbert_vecs"]]
            counts = _numpy().cumsum([0, *(len(rows) for rows in vectors)]).astype("int32")
            rows = _numpy().concatenate(vectors) if vectors else _numpy().empty((0, 1), "float32")
            columns["colbert"] = pa.ListArray.from_arrays(pa.array(counts), _vectors(rows))
        return columns


class RerankBatches:
    """`map_batches`' callable class for a cross-encoder: adds `score`, the model's score of each (query, text)
    pair (`CrossEncoder.predict`: float32, the folder's activation; a list per row for several labels). The load
    options are `EmbedBatches`'."""

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        query_column: str = "query",
        text_column: str = "text",
        model_batch_size: int = 32,
        threads: int | None = None,
        **load_options: Any,
    ) -> None:
        import torch

        from hfbert.tools.reranking import CrossEncoder

        if threads is not None:
            torch.set_num_threads(threads)
        self.query_column, self.text_column, self.model_batch_size = query_column, text_column, model_batch_size
        self.encoder = CrossEncoder(model, **load_options)

    def __call__(self, batch: Any) -> Any:
        table, pandas = _as_table(batch)
        queries, texts = _texts(table, self.query_column), _texts(table, self.text_column)
        scores = self.encoder.predict(list(zip(queries, texts, strict=True)), batch_size=self.model_batch_size)
        pa, numpy = _pyarrow(), _numpy()
        scores = numpy.asarray(scores, dtype=numpy.float32).reshape(len(texts), -1)
        column = pa.array(scores[:, 0]) if scores.shape[1] == 1 else _vectors(scores)
        return _finish(table, {"score": column}, pandas)
