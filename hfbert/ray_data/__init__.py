"""Corpus-scale embedding on Ray Data (docs/ray-data.md): the library's retrieval encoders mapped over a Ray
Dataset by a pool of actors, each loading the model once. This floor stands beside `hfbert/cli.py` and
`hfbert/serve/`, above the tools; `import hfbert` never imports it, and importing it imports no Ray (the `ray`
extra, `pip install 'hfbert[ray]'`, is needed when a dataset is built or written).

- `batches.py`: `EmbedBatches` and `RerankBatches`, the picklable callable classes `map_batches` runs (pyarrow or
  pandas batches in, output columns added; usable from Spark or Dask too);
- `pipeline.py`: `embed` and `rerank`, a `ray.data.Dataset` in, the same with output columns out, lazily;
- `sink.py`: `ParquetFolder`, the Datasink writing each block as one Parquet file, whole or not at all, named by its
  ids (imports Ray);
- `corpus.py`: `embed_corpus`, what `hfbert embed --ray` runs: checks before any work, resume from the finished
  files, the count at the end.

    >>> import ray, hfbert.ray_data
    >>> corpus = ray.data.read_parquet("corpus.parquet")  # doctest: +SKIP
    >>> hfbert.ray_data.embed(corpus, "sentence-transformers/all-MiniLM-L6-v2").write_parquet("out/")  # doctest: +SKIP
"""

from hfbert.ray_data.batches import COLUMNS, OUTPUTS, EmbedBatches, RerankBatches
from hfbert.ray_data.corpus import CorpusResult, embed_corpus
from hfbert.ray_data.pipeline import embed, rerank

__all__ = ["COLUMNS", "OUTPUTS", "CorpusResult", "EmbedBatches", "RerankBatches", "embed", "embed_corpus", "rerank"]
