"""The files an artifact reads beside it, found from the artifact itself: an ONNX graph's external data is where its
tensors' `location` fields say (onnx's `external_data`), whatever the files are called; an OpenVINO IR's `.bin`.
`hfbert parity --json` or `--plot` over one of them is refused before anything runs, and an artifact in the model's
Hub repo is downloaded with them."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfbert.cli import main

from support.helpers import write_small_minilm_checkpoint

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

REPO = "someone/small-bert"
SHA = "4" * 40


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Path]:
    """A small checkpoint, and its ONNX export with every tensor in one external file named weights.bin."""
    from benchmarks.artifacts import export_onnx

    work = tmp_path_factory.mktemp("external")
    checkpoint = write_small_minilm_checkpoint(work / "small")
    graph = onnx.load(str(export_onnx(checkpoint, work / "inline.onnx")))
    (work / "art").mkdir()
    onnx.save_model(graph, str(work / "art" / "model.onnx"), save_as_external_data=True, location="weights.bin")
    assert sorted(path.name for path in (work / "art").iterdir()) == ["model.onnx", "weights.bin"]
    return checkpoint, work / "art" / "model.onnx"


def test_the_external_data_files_are_the_ones_the_graph_names(exported, tmp_path):
    """One file per tensor, named after the tensors by onnx: exactly the files onnx wrote, which ONNX Runtime
    then needs (it cannot load the graph without them)."""
    from converters.hub import artifact_companions, onnx_external_data

    _, model = exported
    spread = tmp_path / "spread"
    spread.mkdir()
    onnx.save_model(
        onnx.load(str(model)),
        str(spread / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=False,
        size_threshold=0,
    )
    written = {path.name for path in spread.iterdir()} - {"m.onnx"}
    assert len(written) > 10
    assert set(onnx_external_data(spread / "m.onnx")) == written
    assert {path.name for path in artifact_companions(spread / "m.onnx")} == written
    onnxruntime.InferenceSession(str(spread / "m.onnx"), providers=["CPUExecutionProvider"])
    (spread / sorted(written)[0]).unlink()
    with pytest.raises(Exception, match=sorted(written)[0].replace(".", r"\.")):
        onnxruntime.InferenceSession(str(spread / "m.onnx"), providers=["CPUExecutionProvider"])
    assert onnx_external_data(model) == ["weights.bin"]


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_over_the_graphs_external_data_is_refused_before_anything_runs(exported, option, monkeypatch, capsys):
    import hfbert.tools.parity

    checkpoint, model = exported
    weights = model.parent / "weights.bin"
    before = hashlib.sha256(weights.read_bytes()).hexdigest()

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(hfbert.tools.parity, "run_parity", must_not_run)
    if option == "--plot":
        pytest.importorskip("matplotlib")
    status = main(["parity", str(checkpoint), "--artifact", str(model), option, str(weights)])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert len(error) == 1 and "refusing to overwrite it" in error[0], error
    assert f"weights.bin (read by --artifact {model})" in error[0]
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before


def hub_download(hub_url: str, cache: Path, path: str) -> subprocess.CompletedProcess:
    """converters.hub.download_artifact in a fresh process: huggingface_hub reads HF_ENDPOINT when imported."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1", HF_ENDPOINT=hub_url)
    code = (
        "import sys\nfrom converters.hub import download_artifact\n"
        "try:\n"
        f"    print(download_artifact({REPO!r}, {path!r}, revision={SHA!r}))\n"
        "except ValueError as error:\n"
        "    sys.exit(str(error))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_a_hub_artifact_comes_with_its_external_data_whatever_it_is_called(exported, tmp_path):
    from support.fake_hub import FakeHub

    checkpoint, model = exported
    weights = (model.parent / "weights.bin").read_bytes()
    files = {"config.json": (checkpoint / "config.json").read_bytes(), "onnx/model.onnx": model.read_bytes()}
    files.update({"onnx/weights.bin": weights, "onnx/other.bin": b"not read by the graph" * 100})
    with FakeHub() as hub:
        hub.add_revision(REPO, SHA, files)
        result = hub_download(hub.url, tmp_path / "cache", "onnx/model.onnx")
        assert result.returncode == 0, result.stderr
        local = Path(result.stdout.strip().splitlines()[-1])
        assert sorted(hub.downloads()) == ["onnx/model.onnx", "onnx/weights.bin"]
        assert (local.parent / "weights.bin").read_bytes() == weights
        onnxruntime.InferenceSession(str(local), providers=["CPUExecutionProvider"])  # loads: its data is there

        # A graph naming a file the repository does not have, or one outside its folder: one error naming it.
        missing = {name: data for name, data in files.items() if name != "onnx/weights.bin"}
        hub.add_revision(REPO, SHA, missing)
        result = hub_download(hub.url, tmp_path / "cache2", "onnx/model.onnx")
        assert result.returncode == 1
        expected = "onnx/model.onnx keeps tensors in 'weights.bin' (onnx/weights.bin), which is not in the repository"
        assert expected in result.stderr
        graph = onnx.load(str(model), load_external_data=False)
        for tensor in graph.graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "../weights.bin"
        outside = {**missing, "onnx/model.onnx": graph.SerializeToString(), "weights.bin": weights}
        hub.add_revision(REPO, SHA, outside)
        result = hub_download(hub.url, tmp_path / "cache3", "onnx/model.onnx")
        assert result.returncode == 1 and "keeps tensors in '../weights.bin', outside its folder" in result.stderr
        assert "weights.bin" not in hub.downloads()
