"""hfbert's Ray Data adapter without a cluster (issue #67): the callable classes `map_batches` runs
(`hfbert.ray_data.EmbedBatches`, `RerankBatches`) on pyarrow and pandas batches, against sentence-transformers on the
same folders, element-wise; the output folder's record (`hfbert.ray_data.sink`); and `hfbert embed --ray`'s usage
errors, which come before Ray starts. On a real local cluster: tests/test_ray_data_cluster.py (slow).

- dense: the real all-MiniLM-L6-v2 against `SentenceTransformer.encode`, within 1e-6 (unit vectors);
- sparse: a SPLADE folder saved by sentence-transformers' SparseEncoder against its `encode`, the same nonzero set
  (as `sparse_indices`) and weights within 1e-5 (`sparse_values`);
- score: a cross-encoder folder against sentence-transformers' `CrossEncoder.predict`, within 1e-5;
- bge-m3's three outputs: against FlagEmbedding's formulas (`test_bge_m3.flag_formulas`), within 1e-5.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("ray")
sentence_transformers = pytest.importorskip("sentence_transformers")

from hfbert.ray_data import EmbedBatches, RerankBatches  # noqa: E402

from support.cli import in_process  # noqa: E402
from support.helpers import minilm_directory  # noqa: E402
from support.retrieval import DOCUMENTS, QUERIES, cross_encoder_folder, splade_folder  # noqa: E402

MAX_ABS = 1e-6  # unit vectors: fp32 rounding of hfbert's kernels against transformers'
MAX_ABS_SMALL = 1e-5  # the small random folders' unnormalised outputs


def corpus(texts: list[str]) -> pa.Table:
    """A batch as a Parquet corpus has it: ids not in text order, the texts, and a column to pass through."""
    ids = [1000 - 7 * index for index in range(len(texts))]
    return pa.table({"id": ids, "text": texts, "source": [f"doc{index}" for index in range(len(texts))]})


@pytest.fixture(scope="module")
def minilm() -> EmbedBatches:
    return EmbedBatches(minilm_directory(), model_batch_size=4)


def test_embedding_equals_sentence_transformers_and_passes_columns_through(minilm):
    texts = [*DOCUMENTS, "", "a", " ".join(DOCUMENTS * 8)]  # an empty text and one longer than 256 tokens
    batch = corpus(texts)
    out = minilm(batch)
    assert out.column_names == ["id", "text", "source", "embedding"]
    assert out.schema.field("embedding").type == pa.list_(pa.float32())  # a plain Parquet list
    assert out.select(["id", "text", "source"]).equals(batch)
    model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
    expected = model.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(np.array(out.column("embedding").to_pylist()), expected, atol=MAX_ABS, rtol=0)


def test_a_pandas_batch_gives_a_pandas_batch_and_a_dict_a_table(minilm):
    batch = corpus(DOCUMENTS[:3])
    frame = minilm(batch.to_pandas())
    assert type(frame).__name__ == "DataFrame" and list(frame.columns) == ["id", "text", "source", "embedding"]
    table = minilm(batch.to_pydict())
    np.testing.assert_array_equal(np.stack(frame["embedding"].to_numpy()), np.array(table["embedding"].to_pylist()))


def test_the_class_pickles_and_builds_its_model_in_the_constructor():
    """Ray ships the class to each actor and calls the constructor there: the class itself must pickle."""
    assert pickle.loads(pickle.dumps(EmbedBatches)) is EmbedBatches
    assert pickle.loads(pickle.dumps(RerankBatches)) is RerankBatches


def test_sparse_columns_equal_sentence_transformers(tmp_path):
    directory = splade_folder(tmp_path / "splade")
    texts = [*DOCUMENTS, ""]
    out = EmbedBatches(directory, outputs="sparse", model_batch_size=4)(corpus(texts))
    assert out.column_names == ["id", "text", "source", "sparse_indices", "sparse_values"]
    assert out.schema.field("sparse_indices").type == pa.list_(pa.int32())
    expected = sentence_transformers.SparseEncoder(str(directory), device="cpu").encode(texts, batch_size=4)
    expected = expected.to_dense()
    for row, (indices, values) in enumerate(
        zip(out.column("sparse_indices").to_pylist(), out.column("sparse_values").to_pylist(), strict=True)
    ):
        nonzero = expected[row].nonzero().flatten()
        assert indices == nonzero.tolist()  # the same nonzero set, ascending
        np.testing.assert_allclose(values, expected[row][nonzero].numpy(), atol=MAX_ABS_SMALL, rtol=0)


def test_score_equals_sentence_transformers(tmp_path):
    directory = cross_encoder_folder(tmp_path / "reranker")
    queries = [QUERIES[index % len(QUERIES)] for index in range(len(DOCUMENTS))]
    batch = pa.table({"query": queries, "text": DOCUMENTS, "id": list(range(len(DOCUMENTS)))})
    out = RerankBatches(directory, model_batch_size=3)(batch)
    assert out.column_names == ["query", "text", "id", "score"]
    expected = sentence_transformers.CrossEncoder(str(directory), device="cpu").predict(
        list(zip(queries, DOCUMENTS, strict=True))
    )
    np.testing.assert_allclose(out.column("score").to_numpy(), expected, atol=MAX_ABS_SMALL, rtol=0)


def test_bge_m3_columns_equal_flagembeddings_formulas(tmp_path):
    from test_bge_m3 import TEXTS_M3, bge_m3_folder, flag_formulas

    directory = bge_m3_folder(tmp_path / "bge-m3")
    out = EmbedBatches(directory, outputs=("dense", "sparse", "colbert"), model_batch_size=4)(corpus(TEXTS_M3))
    assert out.column_names == ["id", "text", "source", "embedding", "sparse_indices", "sparse_values", "colbert"]
    assert out.schema.field("colbert").type == pa.list_(pa.list_(pa.float32()))
    expected = flag_formulas(directory, TEXTS_M3, max_length=8192)
    np.testing.assert_allclose(
        np.array(out.column("embedding").to_pylist()), expected["dense_vecs"], atol=MAX_ABS_SMALL, rtol=0
    )
    for row, weights in enumerate(expected["lexical_weights"]):
        indices, values = out.column("sparse_indices")[row].as_py(), out.column("sparse_values")[row].as_py()
        assert sorted(map(int, weights)) == indices
        np.testing.assert_allclose(values, [weights[str(index)] for index in indices], atol=MAX_ABS_SMALL, rtol=0)
    for row, vectors in enumerate(expected["colbert_vecs"]):
        ours = np.array(out.column("colbert")[row].as_py(), dtype=np.float32).reshape(len(vectors), -1)
        np.testing.assert_allclose(ours, vectors, atol=MAX_ABS_SMALL, rtol=0)


def test_a_missing_column_and_a_null_text_are_one_error_naming_them(minilm):
    with pytest.raises(ValueError, match=r"no column 'body' \(its columns: id, text, source\)"):
        EmbedBatches(minilm_directory(), text_column="body")(corpus(["one"]))
    batch = pa.table({"id": [1, 2], "text": ["one", None]})
    with pytest.raises(ValueError, match=r"column 'text': row 1 of the batch is null"):
        minilm(batch)


def test_splade_with_dense_is_refused_before_any_batch(tmp_path):
    directory = splade_folder(tmp_path / "splade")
    with pytest.raises(ValueError, match="a SPLADE folder gives sparse vectors alone"):
        EmbedBatches(directory, outputs=("dense", "sparse"))


# -- the output folder's record ------------------------------------------------------------------------------------
def test_only_visible_parquet_files_are_the_record(tmp_path):
    import pyarrow.parquet as pq

    from hfbert.ray_data.sink import finished_files, finished_ids, visible_rows

    assert finished_files(str(tmp_path / "absent")) == [] and finished_ids(str(tmp_path / "absent"), "id") is None
    pq.write_table(pa.table({"id": [3, 1]}), tmp_path / "part-a.parquet")
    pq.write_table(pa.table({"id": [2]}), tmp_path / "part-b.parquet")
    (tmp_path / "_partial").mkdir()
    pq.write_table(pa.table({"id": [9]}), tmp_path / "_partial" / "part-c.parquet.1234")  # unfinished
    pq.write_table(pa.table({"id": [8]}), tmp_path / ".hidden.parquet")
    (tmp_path / "_hfbert.json").write_text("{}")
    assert [path.rsplit("/", 1)[1] for path in finished_files(str(tmp_path))] == ["part-a.parquet", "part-b.parquet"]
    assert sorted(finished_ids(str(tmp_path), "id").to_pylist()) == [1, 2, 3]
    assert visible_rows(str(tmp_path)) == 3


# -- hfbert embed --ray: usage errors before Ray starts ------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--file", "c.parquet", "--out", "o"], "--ray needs --id-column NAME"),
        (["--file", "c.parquet", "--id-column", "id"], "--ray needs --out DIR"),
        (["--file", "c.txt", "--id-column", "id", "--out", "o"], "--file c.txt: --ray reads a .parquet or a .jsonl"),
        (["--file", "-", "--id-column", "id", "--out", "o"], "--ray reads a corpus file"),
        (["--file", "c.parquet", "--id-column", "id", "--out", "o.npy"], "--ray writes Parquet files into a folder"),
        (["--file", "c.jsonl", "--id-column", "id", "--out", "o", "--pooling", "cls"], "--pooling does not apply"),
    ],
)
def test_ray_usage_errors(capsys, arguments, message):
    result = in_process(capsys, "embed", "MODEL", *arguments, "--ray")
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_ray_options_without_ray_are_usage_errors(capsys):
    result = in_process(capsys, "embed", "MODEL", "--file", "c.jsonl", "--id-column", "id")
    assert result.returncode == 2 and "--id-column applies to --ray" in result.stderr, result.stderr


def test_import_hfbert_and_hfbert_ray_data_import_no_ray():
    code = "import sys, hfbert, hfbert.ray_data; assert 'ray' not in sys.modules, 'ray imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
