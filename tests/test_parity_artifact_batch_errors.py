"""`hfbert parity --artifact` with an artifact that loads but cannot run a battery batch: an ONNX export with fixed
sizes (no dynamic axes), and one of a smaller vocabulary than the tokenizer's. Each is that artifact's verdict
"error", one line naming it, the batch and what ONNX Runtime expected; the other artifacts are still judged, the JSON
is written, and the exit status is 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hfbert.cli import main

from support.helpers import (
    SMALL_MINILM_CONFIG,
    parity_texts,
    write_random_transformers_checkpoint,
    write_small_minilm_checkpoint,
)

onnxruntime = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    from benchmarks.artifacts import export_onnx

    work = tmp_path_factory.mktemp("batch-errors")
    checkpoint = write_small_minilm_checkpoint(work / "small")
    smaller = write_random_transformers_checkpoint(
        work / "smaller", seed=3, **{**SMALL_MINILM_CONFIG, "vocab_size": 1000}
    )
    return checkpoint, {
        "good": export_onnx(checkpoint, work / "good.onnx"),
        "static": export_onnx(checkpoint, work / "static.onnx", dynamic=False),
        "vocabulary": export_onnx(smaller, work / "vocabulary.onnx"),
    }


def onnxruntime_refusal(path: Path, ids: list[list[int]]) -> str:
    """ONNX Runtime's own error for these token ids, to compare the report's reason with."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    import numpy

    feed = {"input_ids": numpy.array(ids), "attention_mask": numpy.ones((len(ids), len(ids[0])), dtype=numpy.int64)}
    feed["token_type_ids"] = numpy.zeros_like(feed["attention_mask"])
    with pytest.raises(Exception) as raised:
        session.run(None, feed)
    return str(raised.value)


def test_an_artifact_that_cannot_run_a_batch_is_its_own_verdict(artifacts, tmp_path, capsys):
    checkpoint, built = artifacts
    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(6)) + "\n")
    report = tmp_path / "report.json"
    arguments = ["parity", str(checkpoint), "--texts", str(tmp_path / "texts.txt"), "--json", str(report)]
    for name in ("static", "good", "vocabulary"):
        arguments += ["--artifact", str(built[name])]
    status = main(arguments)
    captured = capsys.readouterr()
    assert status == 1
    found = {entry["path"]: entry for entry in json.loads(report.read_text())["artifacts"]}
    good, static, vocabulary = (found[str(built[name])] for name in ("good", "static", "vocabulary"))

    assert good["verdict"] == "pass" and good["error"] is None and good["worst_ratio"] <= 1.5
    for entry in (static, vocabulary):
        assert entry["verdict"] == "error", entry
        assert entry["error"].startswith(f"{entry['path']}: could not run the 'single' batch (1 x ")
        assert len(entry["error"].splitlines()) == 1
        assert f"ERROR    {entry['error']}" in captured.out
    # The reasons, against ONNX Runtime's own: the fixed shape the export took, the out-of-range token id.
    assert "Expected: 16" in onnxruntime_refusal(built["static"], [[101] * 5])
    assert "input_ids expects shape [2, 16], got [1, " in static["error"]
    largest = int(re.search(r"largest token id (\d+)", vocabulary["error"])[1])
    first = int(re.search(r"idx=(\d+) must be within the inclusive range \[-1000,999\]$", vocabulary["error"])[1])
    assert 1000 <= first <= largest
    gather = "Gather node /model/embeddings/word_embeddings/Gather: indices element out of data bounds"
    assert f"{gather}, idx={first} " in vocabulary["error"]
    assert f"out of data bounds, idx={first} " in onnxruntime_refusal(built["vocabulary"], [[first]])
    # The last line names the first artifact that did not pass, with its error.
    assert captured.err.strip().splitlines()[-1].startswith(f"hfbert parity: artifact {built['static']} (error: ")
    assert "artifacts: 1 of 3 pass" in captured.out
