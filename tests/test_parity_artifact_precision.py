"""`hfbert parity --artifact` on artifacts whose weights are stored in fp16 while they compute in float32: an
OpenVINO IR saved with `openvino.save_model`'s default `compress_to_fp16=True`, and a CTranslate2 float16 conversion
(on a CPU without float16 compute, CTranslate2 converts the weights to float32 at load). The report gives the
weights' precision beside the precision that ran, as each engine reports them, and names fp16 weights as the cause
of the failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfbert.cli import main

from support.helpers import parity_texts, write_small_minilm_checkpoint

openvino = pytest.importorskip("openvino")
pytest.importorskip("ctranslate2")


@pytest.fixture(scope="module")
def fp16(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    from benchmarks.artifacts import convert_ctranslate2, export_onnx

    work = tmp_path_factory.mktemp("fp16")
    checkpoint = write_small_minilm_checkpoint(work / "small")
    exact = export_onnx(checkpoint, work / "bert.onnx")
    ir = work / "openvino" / "bert.xml"
    ir.parent.mkdir()
    openvino.save_model(openvino.convert_model(str(exact)), str(ir))  # compress_to_fp16 left at its default, True
    return checkpoint, {"exact": exact, "openvino": ir, "ctranslate2": convert_ctranslate2(checkpoint, work, "float16")}


def engines_own_account(built: dict[str, Path]) -> dict[str, object]:
    """What the engines themselves say: the IR's Constant element types and the precision OpenVINO compiles it to at
    the f32 hint; CTranslate2's compute type and its load log about the saved model's type."""
    from hfbert.tools.parity.engines.ctranslate2_engine import captured_log, import_ctranslate2

    core = openvino.Core()
    model = core.read_model(str(built["openvino"]))
    constants = {
        op.get_element_type().get_type_name() for op in model.get_ordered_ops() if op.get_type_name() == "Constant"
    }
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ctranslate2 = import_ctranslate2()
    with captured_log(ctranslate2) as log:
        encoder = ctranslate2.Encoder(str(built["ctranslate2"]), device="cpu", compute_type="default")
        lines = log()
    return {
        "openvino constants": constants,
        "openvino ran": compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name(),
        "ctranslate2 ran": encoder.compute_type,
        "ctranslate2 log": " ".join(lines),
        "ctranslate2 cpu types": ctranslate2.get_supported_compute_types("cpu"),
    }


def test_fp16_weights_are_reported_beside_what_ran_and_named_as_the_cause(fp16, tmp_path, capsys):
    checkpoint, built = fp16
    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(6)) + "\n")
    report = tmp_path / "report.json"
    arguments = ["parity", str(checkpoint), "--texts", str(tmp_path / "texts.txt"), "--json", str(report)]
    for path in built.values():
        arguments += ["--artifact", str(path)]
    status = main(arguments)
    table = capsys.readouterr().out
    assert status == 1
    found = {entry["path"]: entry for entry in json.loads(report.read_text())["artifacts"]}
    exact, ir, ct2 = (found[str(built[name])] for name in ("exact", "openvino", "ctranslate2"))
    own = engines_own_account(built)

    assert "f16" in own["openvino constants"]
    assert ir["weights_precision"] == "fp16" and ir["precision"] == own["openvino ran"] == "f32"
    if "float16" not in own["ctranslate2 cpu types"]:  # converted at load: CTranslate2's log says so
        assert "inferred from the saved model is float16" in own["ctranslate2 log"]
        assert ct2["precision"] == own["ctranslate2 ran"] == "float32"
        assert any("fp16 weights converted to float32 at load" in note for note in ct2["notes"])
    assert ct2["weights_precision"] == "fp16"
    assert exact["weights_precision"] == "fp32" and exact["verdict"] == "pass" and exact["likely_causes"] == []
    assert "precision f32 (weights stored as fp16)" in table
    assert f"precision {own['ctranslate2 ran']} (weights stored as fp16)" in table

    # fp16 rounding (2^-11 relative) is thousands of times float32's: both fail, each with fp16 weights as the cause
    # and its own tool's remedy, not "computes something else".
    for entry, remedy in ((ir, "compress_to_fp16=False"), (ct2, "--quantization float32")):
        assert entry["verdict"] == "fail" and entry["worst_ratio"] > 100, entry["ratios"]
        causes = entry["likely_causes"]
        assert len(causes) == 1 and causes[0].startswith("fp16 weights: each weight rounded to 11 significant bits")
        assert remedy in causes[0] and "--artifact-bound" in causes[0]
    assert table.count("likely cause: fp16 weights") == 2
