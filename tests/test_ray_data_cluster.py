"""`hfbert embed --ray` and `hfbert.ray_data` on a real local Ray cluster (issue #67): `ray.init` on loopback with 2
CPUs, started once for the module. Slow (a cluster, actors loading the model): the default run has the callable
classes' twins in tests/test_ray_data.py.

- Equal to one process: the rows of `hfbert embed --ray` equal, by id, `hfbert embed` in one process and
  sentence-transformers' `encode` (all-MiniLM-L6-v2's real weights, within 1e-6), with the id column and
  `embedding` alone in plain Parquet files, and nothing else visible in the folder; `--sparse` (a SPLADE folder)
  equals sentence-transformers' SparseEncoder, and bge-m3's `--output dense,sparse,colbert` FlagEmbedding's formulas.
- A worker killed mid-run (its process exits on its second batch, once): Ray restarts the actor and retries, and
  the output holds every id exactly once.
- A driver killed mid-run (SIGKILL, once a file is finished): every visible file is a finished one, and the rerun
  with the same --out computes only what is missing; the union equals the one-process rows.
- `hfbert.ray_data.embed` and `rerank` on a Dataset: every other column passed through, and the references' numbers.
- A missing text column, a null text, a duplicate id, a text column of numbers: one error before any model loads,
  and no output file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
ray = pytest.importorskip("ray")
sentence_transformers = pytest.importorskip("sentence_transformers")

import pyarrow.parquet as pq  # noqa: E402

from hfbert.ray_data import EmbedBatches  # noqa: E402
from hfbert.ray_data.corpus import embed_corpus  # noqa: E402

from support.cli import in_process  # noqa: E402
from support.helpers import minilm_directory  # noqa: E402
from support.retrieval import DOCUMENTS, splade_folder  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
MAX_ABS = 1e-6
MAX_ABS_SMALL = 1e-5
JOB_SECONDS = 300  # every job and every wait here is bounded


@pytest.fixture(scope="module")
def cluster() -> str:
    """A local 2-CPU cluster on loopback for the module; its address (for a second driver)."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def texts_of(count: int) -> list[str]:
    """Mixed lengths: fragments, sentences, runs of sentences (some beyond MiniLM's 256 tokens)."""
    texts = []
    for index in range(count):
        first = DOCUMENTS[index % len(DOCUMENTS)]
        texts.append(" ".join([first] * (1 + index % 7 * (index % 3))) if index % 5 else (first.split() or [""])[0])
    return texts


def write_corpus(path: Path, texts: list[str], **columns) -> Path:
    """A corpus with string ids in an order unlike the texts', and a column the output leaves out."""
    ids = [f"doc-{(index * 37) % 1009:04d}" for index in range(len(texts))]
    table = pa.table({"id": ids, "text": texts, "note": ["kept out"] * len(texts), **columns})
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()), encoding="utf-8")
    return path


def output_rows(out: Path) -> pa.Table:
    """The folder's finished files, after checking that they are all it shows: plain Parquet files."""
    visible = sorted(path.name for path in out.iterdir() if not path.name.startswith(("_", ".")))
    assert visible and all(name.startswith("part-") and name.endswith(".parquet") for name in visible), visible
    return pq.read_table([out / name for name in visible]) if len(visible) > 1 else pq.read_table(out / visible[0])


def by_id(table: pa.Table, column: str) -> dict:
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == len(ids), "an id is there twice"
    return dict(zip(ids, table.column(column).to_pylist(), strict=True))


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_dense_equals_one_process_and_sentence_transformers(cluster, capsys, tmp_path, suffix):
    texts = texts_of(90)
    source = write_corpus(tmp_path / f"corpus{suffix}", texts)
    out = tmp_path / "out"
    arguments = ["embed", minilm_directory(), "--file", source, "--id-column", "id", "--out", out]
    result = in_process(capsys, *arguments, "--chunk-size", "25", "--ray", cluster)
    assert result.returncode == 0, result.stderr
    assert "wrote embedding of 90 texts" in result.stderr
    table = output_rows(out)
    assert table.column_names == ["id", "embedding"] and table.schema.field("embedding").type.value_type == pa.float32()
    assert sorted(path.name for path in out.iterdir() if path.name.startswith("_")) == ["_hfbert.json"]
    ours = by_id(table, "embedding")
    one = tmp_path / "one.jsonl"  # the one-process path, reading the same corpus's texts
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    single = in_process(capsys, "embed", minilm_directory(), "--file", tmp_path / "texts.jsonl", "--out", one)
    assert single.returncode == 0, single.stderr
    ids = pq.read_table(source).column("id").to_pylist() if suffix == ".parquet" else None
    ids = ids or [json.loads(line)["id"] for line in source.read_text().splitlines()]
    rows = [json.loads(line)["embedding"] for line in one.read_text().splitlines()]
    model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
    expected = model.encode(texts, convert_to_numpy=True)
    ours_in_order = np.array([ours[id_] for id_ in ids], dtype=np.float32)
    np.testing.assert_allclose(ours_in_order, np.array(rows, dtype=np.float32), atol=MAX_ABS, rtol=0)
    np.testing.assert_allclose(ours_in_order, expected, atol=MAX_ABS, rtol=0)


def test_sparse_and_bge_m3_outputs_equal_their_references(cluster, capsys, tmp_path):
    from test_bge_m3 import TEXTS_M3, bge_m3_folder, flag_formulas

    splade = splade_folder(tmp_path / "splade")
    source = write_corpus(tmp_path / "corpus.parquet", [*DOCUMENTS, ""])
    out = tmp_path / "sparse"
    arguments = ["embed", splade, "--file", source, "--id-column", "id", "--out", out, "--sparse", "--ray", cluster]
    assert (result := in_process(capsys, *arguments)).returncode == 0, result.stderr
    table = output_rows(out)
    assert table.column_names == ["id", "sparse_indices", "sparse_values"]
    indices, values = by_id(table, "sparse_indices"), by_id(table, "sparse_values")
    expected = sentence_transformers.SparseEncoder(str(splade), device="cpu").encode([*DOCUMENTS, ""]).to_dense()
    for row, id_ in enumerate(pq.read_table(source).column("id").to_pylist()):
        nonzero = expected[row].nonzero().flatten()
        assert indices[id_] == nonzero.tolist()
        np.testing.assert_allclose(values[id_], expected[row][nonzero].numpy(), atol=MAX_ABS_SMALL, rtol=0)

    m3 = bge_m3_folder(tmp_path / "bge-m3")
    source = write_corpus(tmp_path / "m3.jsonl", TEXTS_M3)
    out = tmp_path / "m3"
    arguments = ["embed", m3, "--file", source, "--id-column", "id", "--out", out, "--ray", cluster]
    assert (result := in_process(capsys, *arguments, "--output", "dense,sparse,colbert")).returncode == 0
    table = output_rows(out)
    assert table.column_names == ["id", "embedding", "sparse_indices", "sparse_values", "colbert"]
    expected = flag_formulas(m3, TEXTS_M3, max_length=8192)
    ids = [json.loads(line)["id"] for line in source.read_text().splitlines()]
    dense, sparse_ids, sparse_values = (
        by_id(table, "embedding"),
        by_id(table, "sparse_indices"),
        by_id(table, "sparse_values"),
    )
    colbert = by_id(table, "colbert")
    for row, id_ in enumerate(ids):
        np.testing.assert_allclose(dense[id_], expected["dense_vecs"][row], atol=MAX_ABS_SMALL, rtol=0)
        weights = expected["lexical_weights"][row]
        assert sparse_ids[id_] == sorted(map(int, weights))
        np.testing.assert_allclose(
            sparse_values[id_], [weights[str(index)] for index in sparse_ids[id_]], atol=MAX_ABS_SMALL, rtol=0
        )
        np.testing.assert_allclose(np.array(colbert[id_]), expected["colbert_vecs"][row], atol=MAX_ABS_SMALL, rtol=0)


class DiesOnce(EmbedBatches):
    """Its process exits on its second batch, the first time any actor gets there (a marker file remembers)."""

    marker = ""

    def __call__(self, batch):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 2 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os._exit(1)
        return super().__call__(batch)


def test_a_killed_worker_is_retried_and_every_id_is_there_once(cluster, tmp_path, monkeypatch):
    import hfbert.ray_data.pipeline as pipeline

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors get this module's class
    DiesOnce.marker = str(tmp_path / "died")
    monkeypatch.setattr(pipeline, "EmbedBatches", DiesOnce)
    texts = texts_of(120)
    source = write_corpus(tmp_path / "corpus.parquet", texts)
    out = tmp_path / "out"
    result = embed_corpus(
        minilm_directory(), str(source), str(out), id_column="id", rows_per_block=20, batch_size=20, actors=1
    )
    assert (tmp_path / "died").is_file()  # the worker did die
    assert (result.rows, result.finished_before, result.computed) == (120, 0, 120)
    table = output_rows(out)
    assert sorted(table.column("id").to_pylist()) == sorted(pq.read_table(source).column("id").to_pylist())
    model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
    expected = dict(zip(pq.read_table(source).column("id").to_pylist(), model.encode(texts), strict=True))
    for id_, vector in by_id(table, "embedding").items():
        np.testing.assert_allclose(vector, expected[id_], atol=MAX_ABS, rtol=0)


def test_a_killed_driver_resumes_with_only_what_is_missing(cluster, capsys, tmp_path):
    texts = texts_of(400)
    source = write_corpus(tmp_path / "corpus.parquet", texts)
    out = tmp_path / "out"
    arguments = ["embed", str(minilm_directory()), "--file", str(source), "--id-column", "id", "--out", str(out)]
    arguments += ["--chunk-size", "20", "--batch-size", "4", "--ray-actors", "1"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "hfbert", *arguments, "--ray", cluster],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + JOB_SECONDS
        while time.monotonic() < deadline and driver.poll() is None:
            if any(out.glob("part-*.parquet")):
                break
            time.sleep(0.2)
        assert driver.poll() is None, "the job ended before it could be killed: give it more rows"
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait(timeout=60)
    finished = sorted(out.glob("*.parquet"))
    assert finished, "no file was finished before the kill"
    before = sum(pq.read_table(path).num_rows for path in finished)  # each visible file reads whole
    assert before < len(texts)
    result = in_process(capsys, *arguments, "--ray", cluster)
    assert result.returncode == 0, result.stderr
    assert f"({before} were already there)" in result.stderr or "were already there" in result.stderr
    table = output_rows(out)
    ids = pq.read_table(source).column("id").to_pylist()
    assert sorted(table.column("id").to_pylist()) == sorted(ids)
    model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
    expected = dict(zip(ids, model.encode(texts), strict=True))
    for id_, vector in by_id(table, "embedding").items():
        np.testing.assert_allclose(vector, expected[id_], atol=MAX_ABS, rtol=0)
    assert not (out / "_partial").exists()


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ({}, ["--text-column", "body"], "no column 'body' (--text-column); its columns: id, text, note"),
        ({"body": [1, 2, 3]}, ["--text-column", "body"], "column 'body' holds int64, not strings (--text-column)"),
        ({"text": ["a", None, "c"]}, [], "column 'text' has 1 null texts (the first at id 'doc-0037')"),
        ({"id": ["x", "y", "x"]}, [], "column 'id' (--id-column) has 1 ids more than once (the first: 'x')"),
    ],
)
def test_bad_columns_are_one_error_before_any_work(cluster, capsys, tmp_path, columns, options, message):
    texts = columns.pop("text", ["a", "b", "c"])
    ids = columns.pop("id", None)
    source = write_corpus(tmp_path / "corpus.parquet", texts, **columns)
    if ids is not None:
        pq.write_table(pq.read_table(source).set_column(0, "id", pa.array(ids)), source)
    out = tmp_path / "out"
    arguments = ["embed", minilm_directory(), "--file", source, "--id-column", "id", "--out", out, *options]
    result = in_process(capsys, *arguments, "--ray", cluster)
    ours = [line for line in result.stderr.splitlines() if line.startswith("hfbert embed:")]
    assert result.returncode == 1 and len(ours) == 1 and message in ours[0], result.stderr
    assert not out.exists() or not any(out.glob("*.parquet"))


def test_embed_and_rerank_on_a_dataset_pass_every_column_through(cluster, tmp_path):
    import hfbert.ray_data

    from support.retrieval import QUERIES, cross_encoder_folder

    texts = texts_of(40)
    table = pa.table({"key": list(range(40)), "text": texts, "lang": ["en"] * 40})
    embedded = hfbert.ray_data.embed(ray.data.from_arrow(table), minilm_directory(), batch_size=16).to_arrow_refs()
    rows = pa.concat_tables(ray.get(embedded)).sort_by("key")
    assert rows.column_names == ["key", "text", "lang", "embedding"] and rows.select(["key", "text", "lang"]).equals(
        table
    )
    model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
    np.testing.assert_allclose(np.array(rows.column("embedding").to_pylist()), model.encode(texts), atol=MAX_ABS)

    reranker = cross_encoder_folder(tmp_path / "reranker")
    queries = [QUERIES[index % len(QUERIES)] for index in range(len(DOCUMENTS))]
    pairs = pa.table({"query": queries, "text": DOCUMENTS, "n": list(range(len(DOCUMENTS)))})
    scored = pa.concat_tables(ray.get(hfbert.ray_data.rerank(ray.data.from_arrow(pairs), reranker).to_arrow_refs()))
    scored = scored.sort_by("n")
    assert scored.column_names == ["query", "text", "n", "score"]
    expected = sentence_transformers.CrossEncoder(str(reranker), device="cpu").predict(
        list(zip(queries, DOCUMENTS, strict=True))
    )
    np.testing.assert_allclose(scored.column("score").to_numpy(), expected, atol=MAX_ABS_SMALL, rtol=0)
