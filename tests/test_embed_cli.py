"""`hfbert embed` against sentence-transformers, and `hfbert fill-mask` against transformers' fill-mask pipeline.

300 texts of shuffled lengths, from a text file, from JSONL and from a pipe (`--file -`, `--file /dev/stdin`, read
once), read in several chunks: on the real all-MiniLM-L6-v2 weights the output equals
`SentenceTransformer(...).encode(...)` element for element (max abs <= 1e-6; a cosine alone would hide a wrong
norm), in input order, as .npy and .jsonl. (Several processes: `hfbert embed --ray`, tests/test_ray_data*.py.) A
full disk (a 1 MiB tmpfs in a private mount namespace) ends in one line naming it, with
nothing left behind. Each pooling mode, Normalize and Dense against sentence-transformers: test_embed_pipeline.py.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.ray_data import mixed_texts
from hfbert.cli import main

from support.helpers import minilm_directory

MAX_ABS = 1e-6  # unit vectors; fp32 rounding of hfbert's packed kernels against transformers' (measured 2e-7)
TEXT_COUNT = 300


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Fragments of a few words, whole sentences, runs of sentences and texts over 256 tokens (truncated, as
    sentence-transformers does), in random order: the Ray Data benchmark's corpus."""
    return mixed_texts(TEXT_COUNT, seed=0)


_REFERENCES: dict[int, np.ndarray] = {}


def reference_of(texts: list[str]) -> np.ndarray:
    """sentence-transformers' embeddings of the first `len(texts)` texts (computed once per count)."""
    if len(texts) not in _REFERENCES:
        sentence_transformers = pytest.importorskip("sentence_transformers")
        model = sentence_transformers.SentenceTransformer(str(minilm_directory()), device="cpu")
        _REFERENCES[len(texts)] = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    return _REFERENCES[len(texts)]


# The first 60 texts in the default run (long ones among them, several chunks at the chunk sizes below); all
# TEXT_COUNT in the slow one.
FEW = 60
COUNTS = [FEW, pytest.param(TEXT_COUNT, marks=pytest.mark.slow)]


@pytest.fixture
def corpus(request, texts, tmp_path) -> tuple[list[str], np.ndarray, object]:
    """(texts, their reference embeddings, a folder with them as texts.txt and texts.jsonl) for the test's count."""
    chosen = texts[: request.param]
    with open(tmp_path / "texts.txt", "w", encoding="utf-8") as handle:
        handle.write("".join(text + "\n" for text in chosen))
    with open(tmp_path / "texts.jsonl", "w", encoding="utf-8") as handle:
        for number, text in enumerate(chosen):
            handle.write(json.dumps({"id": f"doc-{number}", "text": text}) + "\n")
    return chosen, reference_of(chosen), tmp_path


@pytest.fixture(scope="module")
def reference(texts) -> np.ndarray:
    """The first FEW texts' reference embeddings."""
    return reference_of(texts[:FEW])


def embed(*arguments) -> int:
    return main(["embed", str(minilm_directory()), *map(str, arguments)])


def assert_matches(embeddings: np.ndarray, reference: np.ndarray) -> None:
    assert embeddings.shape == reference.shape == (len(reference), 384)
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-6)
    difference = np.abs(embeddings - reference).max(axis=1)
    worst = int(difference.argmax())
    assert difference.max() <= MAX_ABS, f"text {worst}: max abs difference {difference.max()}"


@pytest.mark.parametrize("corpus", COUNTS, indirect=True)
def test_text_file_to_npy(corpus, tmp_path):
    texts, reference, inputs = corpus
    out = tmp_path / "embeddings.npy"
    arguments = ["--file", inputs / "texts.txt", "--pooling", "mean", "--normalize", "--out", out]
    chunk = 64 if len(texts) == TEXT_COUNT else 16  # several chunks either way
    assert embed(*arguments, "--chunk-size", chunk, "--batch-size", 16) == 0
    embeddings = np.load(out)
    assert embeddings.dtype == np.float32
    assert_matches(embeddings, reference)


@pytest.mark.parametrize("corpus", COUNTS, indirect=True)
def test_jsonl_file_to_jsonl(corpus, tmp_path):
    texts, reference, inputs = corpus
    out = tmp_path / "embeddings.jsonl"
    chunk = 100 if len(texts) == TEXT_COUNT else 25
    arguments = ["--file", inputs / "texts.jsonl", "--pooling", "mean", "--normalize", "--out", out]
    assert embed(*arguments, "--chunk-size", chunk) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [record["index"] for record in records] == list(range(len(texts)))
    assert_matches(np.array([record["embedding"] for record in records], dtype=np.float32), reference)


def test_texts_as_arguments_to_stdout(texts, reference, capsys):
    assert embed(*texts[:3], "--pooling", "mean", "--normalize") == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["index"] for record in records] == [0, 1, 2]
    assert_matches(np.array([record["embedding"] for record in records], dtype=np.float32), reference[:3])


def test_cls_pooling_without_normalize(texts, tmp_path):
    import torch
    import transformers

    out = tmp_path / "cls.npy"
    assert embed(*texts[:5], "--pooling", "cls", "--no-normalize", "--out", out) == 0
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_directory())
    model = transformers.BertModel.from_pretrained(minilm_directory()).eval()
    with torch.no_grad():
        # 256: the max_seq_length of the checkpoint's sentence_bert_config.json, hfbert embed's default
        batch = tokenizer(texts[:5], padding=True, truncation=True, max_length=256, return_tensors="pt")
        expected = model(**batch).last_hidden_state[:, 0]
    assert max(len(ids) for ids in tokenizer(texts[:5])["input_ids"]) > 256  # truncation is exercised
    assert np.abs(np.load(out) - expected.numpy()).max() <= 1e-5


def test_bad_inputs_exit_1_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"no text": 1}\n', encoding="utf-8")
    assert embed("--file", bad, "--out", tmp_path / "x.npy") == 1
    assert (
        capsys.readouterr().err.strip() == f'hfbert embed: {bad}:2: expected a JSON object with a string "text" field'
    )
    assert embed("some text", "--out", tmp_path / "x.csv") == 1
    assert ".npy or a .jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(("source", "suffix"), [("-", ".npy"), ("/dev/stdin", ".jsonl"), ("-", None)])
def test_a_pipe_is_read_once(source, suffix, texts, reference, tmp_path, hfbert_command):
    """`printf ... | hfbert embed MODEL --file -` (or /dev/stdin): every line embedded, none lost to a first
    pass that counted them (such a pass wrote an empty file and exited 0). In-process with a real pipe on standard
    input in the default run, in a fresh process in the slow one."""
    data = "".join(text + "\n" for text in texts[:40]).encode()
    out = tmp_path / f"piped{suffix}" if suffix else None
    result = hfbert_command("embed", minilm_directory(), "--file", source, *(["--out", out] if out else []), stdin=data)
    assert result.returncode == 0, result.stderr
    if suffix == ".npy":
        embeddings = np.load(out)
    else:
        lines = (out.read_text() if out else result.stdout).splitlines()
        records = [json.loads(line) for line in lines]
        assert [record["index"] for record in records] == list(range(40))
        embeddings = np.array([record["embedding"] for record in records], dtype=np.float32)
    assert_matches(embeddings, reference[:40])
    assert f"wrote 40 embeddings of size 384 to {out or 'stdout'}" in result.stderr


def test_one_embedding_is_singular(tmp_path, capsys):
    assert embed("A single text.", "--out", tmp_path / "one.npy") == 0
    assert "wrote 1 embedding of size 384 to" in capsys.readouterr().err


def private_tmpfs_unavailable() -> str | None:
    """Why a 1 MiB tmpfs in a private mount namespace cannot be made here (None when it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /mnt"], capture_output=True)
    return None if probe.returncode == 0 else f"unshare -m / mount not permitted here ({probe.stderr.decode().strip()})"


@pytest.mark.slow  # a fresh process in a mount namespace per case; in-process twin: the test after this one
@pytest.mark.skipif(private_tmpfs_unavailable() is not None, reason=str(private_tmpfs_unavailable()))
@pytest.mark.parametrize("case", ["npy from a file", "npy from a pipe", "jsonl from a pipe"])
def test_a_full_disk_is_one_line_and_leaves_nothing(case, tmp_path):
    """1000 embeddings (1.5 MB as .npy) into a 1 MiB tmpfs (a sparse memory map died of SIGBUS there,
    exit 135, no message, a 3 MB partial file left). From a regular file the space is reserved first and the run
    fails before embedding; from a pipe it fails at the first write that does not fit. Either way: exit 1, one
    line naming the disk, and the disk left empty."""
    source = tmp_path / "texts.txt"
    source.write_text("".join(f"text {i}\n" for i in range(1000)), encoding="utf-8")
    disk = tmp_path / "small-disk"
    disk.mkdir()
    out = disk / ("embeddings.jsonl" if case.startswith("jsonl") else "embeddings.npy")
    run = f"{sys.executable} -m hfbert embed {minilm_directory()} --batch-size 64 --chunk-size 200 --out {out}"
    run += f" --file {source}" if case.endswith("a file") else f" --file - < {source}"
    script = f"mount -t tmpfs -o size=1M tmpfs {disk} && {run}; status=$?; ls -A {disk}; exit $status"
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"hfbert embed: {out}: no space left on the disk holding {disk} (tmpfs (tmpfs) mounted on {disk}" in lines[0]
    assert "nothing was written" in lines[0]
    assert result.stdout == ""  # `ls -A` of the full disk: no partial file, no temporary


class SmallDisk:
    """A disk of `size` bytes under the files `hfbert embed` writes (hfbert.tools.embedding_output's `open`, and
    os.posix_fallocate): a write or a reservation past it fails with ENOSPC, as on a full tmpfs."""

    def __init__(self, size: int) -> None:
        self.size, self.used = size, 0

    def open(self, path, mode="r", *arguments, **options):
        handle = open(path, mode, *arguments, **options)  # noqa: SIM115 - the caller closes it
        return _Budgeted(handle, self) if "w" in mode or "a" in mode else handle

    def spend(self, count: int) -> None:
        if self.used + count > self.size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.used += count

    def fallocate(self, real):
        def posix_fallocate(descriptor: int, offset: int, length: int) -> None:
            if offset + length > self.size:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(descriptor, offset, length)

        return posix_fallocate


class _Budgeted:
    def __init__(self, handle, disk: SmallDisk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data) -> int:
        self._disk.spend(len(data.encode() if isinstance(data, str) else data))
        return self._handle.write(data)

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.close()


@pytest.mark.parametrize("case", ["npy from a file", "npy from a pipe", "jsonl from a pipe"])
def test_a_full_disk_is_one_line_and_leaves_nothing_in_process(case, tmp_path, capsys, monkeypatch):
    """test_a_full_disk_is_one_line_and_leaves_nothing in-process: the same 1000 texts into a 1 MiB disk simulated
    under the writer (writes and reservations past it fail with ENOSPC), from a file or a real pipe."""
    import hfbert.tools.embedding_output as embedding_output

    from support.cli import in_process

    disk = SmallDisk(2**20)
    monkeypatch.setattr(embedding_output, "open", disk.open, raising=False)
    if hasattr(os, "posix_fallocate"):
        monkeypatch.setattr(os, "posix_fallocate", disk.fallocate(os.posix_fallocate))
    source = tmp_path / "texts.txt"
    source.write_text("".join(f"text {i}\n" for i in range(1000)), encoding="utf-8")
    folder = tmp_path / "small-disk"
    folder.mkdir()
    out = folder / ("embeddings.jsonl" if case.startswith("jsonl") else "embeddings.npy")
    arguments = ["embed", minilm_directory(), "--batch-size", 64, "--chunk-size", 200, "--out", out]
    if case.endswith("a file"):
        result = in_process(capsys, *arguments, "--file", source)
    else:
        result = in_process(capsys, *arguments, "--file", "-", stdin=source.read_bytes())
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"hfbert embed: {out}: no space left on the disk holding {folder} (" in lines[0]
    assert "nothing was written" in lines[0]
    assert list(folder.iterdir()) == []  # no partial file, no temporary


def read_embeddings(path) -> np.ndarray:
    """The rows of an embed output file, in file order (a .jsonl file's indices must run 0, 1, ...)."""
    if path.suffix == ".npy":
        return np.load(path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [row["index"] for row in rows] == list(range(len(rows)))
    return np.array([row["embedding"] for row in rows], dtype=np.float32)


FILL_MASK_TEXT = "Paris is the [MASK] of France."


def test_fill_mask_equals_the_transformers_pipeline(layout, capsys):
    """bert-base-uncased's file layout: small in the default run, its own size in the slow one."""
    import transformers

    directory = layout.safetensors
    pipeline = transformers.pipeline(
        "fill-mask",
        model=transformers.BertForMaskedLM.from_pretrained(directory),
        tokenizer=transformers.BertTokenizerFast.from_pretrained(directory),
    )
    expected = pipeline(FILL_MASK_TEXT, top_k=5)
    assert main(["fill-mask", str(directory), FILL_MASK_TEXT, "--top-k", "5", "--json"]) == 0
    predictions = json.loads(capsys.readouterr().out)
    assert [(p["token"], p["token_str"], p["sequence"]) for p in predictions] == [
        (e["token"], e["token_str"], e["sequence"]) for e in expected
    ]
    assert max(abs(p["score"] - e["score"]) for p, e in zip(predictions, expected, strict=True)) <= 1e-6

    assert main(["fill-mask", str(directory), FILL_MASK_TEXT, "--top-k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["token", "score", "sequence"] and len(lines) == 4
    for line, e in zip(lines[1:], expected, strict=False):
        assert line.startswith(repr(e["token_str"])) and f"{e['score']:.4f}" in line and line.endswith(e["sequence"])


def test_fill_mask_refuses_a_checkpoint_without_masked_lm_head(capsys):
    assert main(["fill-mask", str(minilm_directory()), FILL_MASK_TEXT]) == 1
    assert "no masked-LM head" in capsys.readouterr().err


def test_one_reader_of_text_files(tmp_path):
    from hfbert.tools import embedding, texts

    assert embedding.read_texts is texts.read_texts
    plain = tmp_path / "t.txt"
    plain.write_text("a\n\n  \nb\n")
    assert list(texts.read_texts(plain)) == ["a", "", "  ", "b"]
    assert list(texts.read_texts(plain, skip_blank=True)) == ["a", "b"]
