"""`hfbert parity MODEL --artifact PATH`: deployed artifacts judged against float64, built with the engines' own tools
(benchmarks/artifacts.py: torch.onnx.export of transformers' BertModel, ONNX Runtime's transformers optimizer with
and without GELU approximation, quantize_dynamic, OpenVINO convert_model + save_model, CTranslate2's
TransformersConverter).

An exact export passes; GELU's approximation, int8 and a graph that ignores token_type_ids fail, each with its
cause. The small checkpoint's run is in the default run; the real all-MiniLM-L6-v2 is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hfbert.cli import main

from support.helpers import (
    SMALL_MINILM_CONFIG,
    minilm_directory,
    parity_texts,
    write_random_transformers_checkpoint,
    write_small_minilm_checkpoint,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

ENGINES = ("onnxruntime", "openvino", "ctranslate2", "onnx")


def build_artifacts(checkpoint: Path, work: Path, config: dict, engines: bool = True) -> dict[str, Path]:
    from benchmarks.artifacts import convert_ctranslate2, convert_openvino, export_onnx, fuse_onnx, quantize_onnx

    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    built = {"exact": export_onnx(checkpoint, work / "bert.onnx")}
    built["no token types"] = export_onnx(checkpoint, work / "bert-no-types.onnx", token_type_ids=False)
    built["fused"], _ = fuse_onnx(built["exact"], work / "bert-fused.onnx", heads, hidden)
    built["fast gelu"], fusions = fuse_onnx(built["exact"], work / "bert-fastgelu.onnx", heads, hidden, True)
    assert "FastGelu" in fusions
    built["int8"] = quantize_onnx(built["fused"], work / "bert-int8.onnx")
    if engines:
        built["openvino"] = convert_openvino(built["exact"], work / "openvino" / "bert.xml")
        built["ctranslate2"] = convert_ctranslate2(checkpoint, work)
    return built


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    pytest.importorskip("openvino")
    pytest.importorskip("ctranslate2")
    work = tmp_path_factory.mktemp("artifacts")
    checkpoint = write_small_minilm_checkpoint(work / "small")
    return checkpoint, build_artifacts(checkpoint, work, SMALL_MINILM_CONFIG)


@pytest.fixture(scope="module")
def small_report(small):
    from hfbert.tools.parity import run_parity

    checkpoint, built = small
    return run_parity(checkpoint, texts=parity_texts(12), artifacts=list(built.values()), progress=False)


def by_name(report, built: dict[str, Path]) -> dict[str, dict]:
    artifacts = {entry["path"]: entry for entry in report.to_dict()["artifacts"]}
    return {name: artifacts[str(path)] for name, path in built.items()}


def test_exact_artifacts_pass_and_lossy_ones_fail_with_their_cause(small, small_report):
    _, built = small
    found = by_name(small_report, built)
    assert small_report.hfbert_passed
    for name in ("exact", "fused", "openvino", "ctranslate2"):
        entry = found[name]
        assert entry["verdict"] == "pass", (name, entry["ratios"])
        assert entry["worst_ratio"] <= 1.5 and entry["bound"] == 1.5
        assert entry["min_cosine"] > 0.99999 and entry["retrieval_agreement"] == 1.0
        assert entry["likely_causes"] == []
        assert entry["median_seconds_per_batch"] > 0
    assert found["exact"]["engine"] == "ONNX Runtime" and found["exact"]["precision"] == "fp32"
    assert found["openvino"]["engine"] == "OpenVINO" and found["openvino"]["precision"] == "f32"
    assert found["ctranslate2"]["engine"] == "CTranslate2" and found["ctranslate2"]["precision"] == "float32"
    assert "pooler_output" in found["ctranslate2"]["ratios"]  # CTranslate2 returns the pooler too

    fast = found["fast gelu"]
    assert fast["verdict"] == "fail" and fast["worst_ratio"] > 10
    assert any("FastGelu" in cause and "tanh approximation" in cause for cause in fast["likely_causes"])
    int8 = found["int8"]
    assert int8["verdict"] == "fail" and int8["worst_ratio"] > 100 and int8["precision"].startswith("int8")
    assert any(cause.startswith("int8") for cause in int8["likely_causes"])
    assert int8["min_cosine"] < found["exact"]["min_cosine"]
    types = found["no token types"]
    assert types["verdict"] == "fail"
    by_case = types["outputs"]["last_hidden_state"]["by_case"]
    assert by_case["pairs"]["accuracy_ratio"] > 100 and by_case["single"]["accuracy_ratio"] <= 1.5
    assert any("only on sentence pairs" in cause and "no token_type_ids" in cause for cause in types["likely_causes"])
    # A cause is printed only where the numbers or the graph show one.
    assert not any("token" in cause for cause in fast["likely_causes"] + int8["likely_causes"])
    assert not small_report.passed
    assert small_report.first_failing_artifact.startswith(f"{built['no token types']} (last_hidden_state")
    table = small_report.table()
    assert "likely cause: the graph has FastGelu" in table and "artifacts: 4 of 7 pass" in table


def test_int8_on_a_cpu_without_vnni_names_the_saturation(small, small_report):
    _, built = small
    check = next(check for check in small_report.artifacts if check.name == str(built["int8"]))
    check.vnni, saved = False, check.vnni
    try:
        assert any("without VNNI" in cause and "saturate" in cause for cause in check.likely_causes())
    finally:
        check.vnni = saved


def test_error_growing_with_position_and_other_weights_show_as_such(small, tmp_path):
    """An export whose position embeddings differ from position 64 on fails with the error by position; an export
    of other weights of the same shape fails in every case with no graph fact, as 'computes something else'."""
    from safetensors.torch import load_file, save_file

    from benchmarks.artifacts import export_onnx
    from hfbert.tools.parity import run_parity

    checkpoint, _ = small
    shifted = tmp_path / "shifted"
    shutil.copytree(checkpoint, shifted)
    tensors = load_file(shifted / "model.safetensors")
    name = next(key for key in tensors if key.endswith("position_embeddings.weight"))
    tensors[name][64:] += 0.05 * torch.randn_like(tensors[name][64:])
    save_file(tensors, shifted / "model.safetensors", metadata={"format": "pt"})
    other = write_random_transformers_checkpoint(tmp_path / "other", seed=11, **SMALL_MINILM_CONFIG)
    artifacts = [export_onnx(shifted, tmp_path / "shifted.onnx"), export_onnx(other, tmp_path / "other.onnx")]
    report = run_parity(checkpoint, texts=parity_texts(12), artifacts=artifacts, progress=False)
    position, weights = report.to_dict()["artifacts"]
    assert position["verdict"] == "fail" and weights["verdict"] == "fail"
    assert any("error growing with position" in cause for cause in position["likely_causes"]), position
    by_position = {entry["positions"]: entry["ratio"] for entry in position["error_by_position"]}
    assert by_position["64-127"] > 4 * by_position["0-15"]
    assert any("computes something else" in cause for cause in weights["likely_causes"]), weights
    assert all(case["accuracy_ratio"] > 100 for case in weights["outputs"]["last_hidden_state"]["by_case"].values())


def test_the_plot_shows_the_artifacts_beside_hfbert_and_transformers(small_report):
    pyplot = pytest.importorskip("matplotlib.pyplot")
    figure = small_report.figure()
    drawn = [line for axis in figure.axes for line in axis.lines if line.get_gid() == "artifact ratio"]
    assert len(drawn) == sum(len(check.rows) for check in small_report.artifacts)
    failing = [line for line in drawn if line.get_color() == "red"]
    assert len(failing) == sum(not row.passed for check in small_report.artifacts for row in check.rows.values())
    assert "artifacts: 4 of 7 pass" in figure._suptitle.get_text()
    pyplot.close(figure)


def test_the_command_line_exit_status_and_json(small, tmp_path, capsys):
    checkpoint, built = small
    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(6)) + "\n")
    common = [str(checkpoint), "--texts", str(tmp_path / "texts.txt")]
    report = tmp_path / "report.json"
    assert main(["parity", *common, "--artifact", str(built["exact"]), "--json", str(report)]) == 0
    entry = json.loads(report.read_text())["artifacts"][0]
    assert set(entry) >= {"path", "engine", "precision", "ratios", "worst_ratio", "bound", "min_cosine", "verdict"}
    assert entry["verdict"] == "pass"
    capsys.readouterr()
    status = main(["parity", *common, "--artifact", str(built["int8"]), "--artifact", str(built["exact"])])
    captured = capsys.readouterr()
    assert status == 1
    assert f"artifact {built['int8']} (last_hidden_state" in captured.err
    # OpenVINO at the CPU's default precision: the report says which precision ran.
    status = main(["parity", *common, "--artifact", str(built["openvino"]), "--artifact-precision", "default"])
    assert "OpenVINO" in capsys.readouterr().out and status in (0, 1)
    # A lossy artifact judged by its own bound passes.
    assert main(["parity", *common, "--artifact", str(built["int8"]), "--artifact-bound", "1e7"]) == 0


def not_bert(tmp_path: Path, small: tuple[Path, dict[str, Path]], kind: str) -> tuple[Path, str]:
    _, built = small
    if kind == "corrupt file":
        path = tmp_path / "corrupt.onnx"
        path.write_bytes(built["exact"].read_bytes()[:2000])
        return path, "cannot load it"
    if kind == "decoder":

        class Decoder(torch.nn.Module):
            def forward(self, input_ids, past_key_values):
                return (
                    input_ids.float().unsqueeze(-1).expand(-1, -1, SMALL_MINILM_CONFIG["hidden_size"])
                    + past_key_values.sum()
                )

        path = tmp_path / "decoder.onnx"
        example = (torch.ones(1, 4, dtype=torch.long), torch.ones(1, 2))
        torch.onnx.export(Decoder(), example, path, input_names=["input_ids", "past_key_values"], dynamo=False)
        return path, "unknown input(s) past_key_values"
    if kind == "other hidden size":

        class Other(torch.nn.Module):
            def forward(self, input_ids, attention_mask):
                return (input_ids * attention_mask).float().unsqueeze(-1).expand(-1, -1, 64).contiguous()

        path = tmp_path / "other.onnx"
        example = (torch.ones(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long))
        names = ["input_ids", "attention_mask"]
        torch.onnx.export(Other(), example, path, input_names=names, output_names=["last_hidden_state"], dynamo=False)
        return path, "hidden size 64, but the model's is 96"
    if kind == "not an IR":
        path = tmp_path / "model.xml"
        path.write_text("<net/>")
        return path, "OpenVINO cannot read it"
    if kind == "folder without a model":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty", "expected a .onnx file, an OpenVINO .xml or a CTranslate2 model folder"
    return tmp_path / "absent.onnx", "no such file or folder"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter's, for the test graphs
@pytest.mark.parametrize(
    "kind",
    ["corrupt file", "decoder", "other hidden size", "not an IR", "folder without a model", "missing file"],
)
def test_an_artifact_that_is_not_a_bert_encoder_is_one_clear_error(kind, small, tmp_path, capsys):
    checkpoint, _ = small
    path, expected = not_bert(tmp_path, small, kind)
    status = main(["parity", str(checkpoint), "--artifact", str(path)])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert len(error) == 1 and str(path) in error[0] and expected in error[0], error


def test_a_missing_engine_exits_2_naming_the_extra_in_process(small, capsys, monkeypatch):
    """The test below in-process: onnxruntime made unimportable."""
    checkpoint, built = small
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert main(["parity", str(checkpoint), "--artifact", str(built["exact"])]) == 2
    assert "pip install 'hfbert[deploy]'" in capsys.readouterr().err


@pytest.mark.slow  # a fresh process; in-process: the test above
def test_a_missing_engine_exits_2_naming_the_extra(small):
    checkpoint, built = small
    for module, path in (("onnxruntime", built["exact"]),):
        code = (
            f"import sys; sys.modules[{module!r}] = None; from hfbert.cli import main; "
            f"sys.exit(main(['parity', {str(checkpoint)!r}, '--artifact', {str(path)!r}]))"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert result.returncode == 2, result.stderr
        assert "pip install 'hfbert[deploy]'" in result.stderr


def test_hfbert_and_plain_parity_never_import_the_engines(small, tmp_path):
    checkpoint, _ = small
    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(2)) + "\n")
    run = ["parity", str(checkpoint), "--texts", str(tmp_path / "texts.txt")]
    code = (
        "import sys, hfbert, hfbert.cli, hfbert.tools.parity\n"
        f"imported = sorted(name for name in {ENGINES!r} if name in sys.modules)\n"
        f"status = hfbert.cli.main({run!r})\n"
        f"print(imported, sorted(name for name in {ENGINES!r} if name in sys.modules), status)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[] [] 0"


def test_left_padding_is_fed_right_aligned_and_put_back():
    from hfbert.tools.parity.engines.base import left_to_right, right_to_left

    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    ids = torch.tensor([[0, 0, 5, 6], [1, 2, 3, 4], [0, 7, 8, 9]])
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    aligned, shift = left_to_right(batch)
    assert aligned["input_ids"].tolist() == [[5, 6, 0, 0], [1, 2, 3, 4], [7, 8, 9, 0]]
    assert aligned["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert "position_ids" not in aligned
    back = right_to_left(aligned["input_ids"].unsqueeze(-1).float(), shift).squeeze(-1).long()
    assert torch.equal(back[mask.bool()], ids[mask.bool()])


HUB_REPO = "someone/small-bert"
HUB_SHA = "3" * 40


def test_a_relative_path_in_the_models_hub_repo_is_downloaded_and_verified(small, tmp_path):
    from support.fake_hub import FakeHub

    checkpoint, built = small
    files = {p.relative_to(checkpoint).as_posix(): p.read_bytes() for p in checkpoint.rglob("*") if p.is_file()}
    files["onnx/model.onnx"] = built["exact"].read_bytes()
    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(4)) + "\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    arguments = [HUB_REPO, "--artifact", "onnx/model.onnx", "--texts", str(tmp_path / "texts.txt"), "--json", "-"]
    with FakeHub() as hub:
        hub.add_revision(HUB_REPO, HUB_SHA, files)
        env["HF_ENDPOINT"] = hub.url
        command = [sys.executable, "-m", "hfbert.cli", "parity", *arguments]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        entry = json.loads(result.stdout)["artifacts"][0]
        assert entry["path"] == "onnx/model.onnx" and entry["verdict"] == "pass"
        assert Path(entry["local_path"]).parent.parent.name == HUB_SHA  # the model's snapshot, in the same cache
        assert "onnx/model.onnx" in hub.downloads()
        hub.corrupt(HUB_REPO, "onnx/model.onnx")
        shutil.rmtree(tmp_path / "cache")
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 1 and "sha256 mismatch" in result.stderr, result.stderr


@pytest.mark.slow
def test_real_minilm_artifacts(tmp_path):
    """all-MiniLM-L6-v2 with real weights: the exact ONNX export, ORT's fused graph, OpenVINO's IR and CTranslate2
    pass 1.5x; FastGelu, int8 and a graph without token_type_ids fail, each with its cause."""
    pytest.importorskip("openvino")
    pytest.importorskip("ctranslate2")
    from hfbert.tools.parity import run_parity

    checkpoint = minilm_directory()
    config = json.loads((checkpoint / "config.json").read_text())
    built = build_artifacts(checkpoint, tmp_path, config)
    report = run_parity(checkpoint, artifacts=list(built.values()), progress=False)
    found = by_name(report, built)
    assert report.hfbert_passed
    for name in ("exact", "openvino", "ctranslate2"):
        assert found[name]["verdict"] == "pass", (name, found[name]["ratios"])
        assert found[name]["retrieval_agreement"] == 1.0
    for name, cause in (("fast gelu", "FastGelu"), ("int8", "int8"), ("no token types", "only on sentence pairs")):
        assert found[name]["verdict"] == "fail", name
        assert any(cause in line for line in found[name]["likely_causes"]), (name, found[name]["likely_causes"])
    assert 0.9 < found["int8"]["min_cosine"] < found["exact"]["min_cosine"]  # lossy, not broken: --artifact-bound
