"""`hfbert parity` on MPNet (issue #42): the float64 verdict against transformers' MPNetModel / MPNetForMaskedLM,
which transformers runs eager only (hfbert runs sdpa with the position bias), on every case (pairs without token
types, left padding with MPNet's positions from 2, the longest input); `--artifact` on transformers' MPNetModel
exported by benchmarks/artifacts.py (input_ids and attention_mask; positions and the relative-position bias computed
in the graph) with ONNX Runtime and OpenVINO: an exact export passes, one that ignores the attention mask fails.

A tiny MPNet with all-mpnet-base-v2's tokenizer runs in the default run; the real all-mpnet-base-v2 (`real_mpnet`)
is marked slow.
"""

from __future__ import annotations

import math

import pytest
import torch

import benchmarks.artifacts as artifacts
from hfbert.tools.parity import run_parity
from hfbert.tools.parity.statistics import Accuracy

from support.family import TEXTS
from support.helpers import parity_texts
from support.mpnet import tiny_mpnet_checkpoint

transformers = pytest.importorskip("transformers")

CASES = ["single", "pairs", "right padding", "left padding", "max length"]
MAX_POSITIONS = 40  # the longest input 38 (positions from 2): a fast "max length" case


@pytest.fixture(scope="module")
def tiny(real_mpnet, tmp_path_factory):
    """The tiny MPNet of a task (`support.mpnet`), written once per module and read, never changed, by the tests."""
    written = {}

    def checkpoint(task: str):
        if task not in written:
            directory = tmp_path_factory.mktemp("mpnet") / task
            written[task] = tiny_mpnet_checkpoint(directory, real_mpnet, task, max_position_embeddings=MAX_POSITIONS)
        return written[task]

    return checkpoint


def assert_sane(report) -> None:
    """Every compared output measured (not exact zeros on both sides), both libraries within float32 rounding of
    float64, and hfbert within the bound."""
    for row in report.rows:
        if isinstance(row.total, Accuracy):
            ours, theirs = row.total.ours_error.rms, row.total.reference_error.rms
            assert 0 < theirs < 1e-5 and ours < 1e-5, (row.name, ours, theirs)
            assert math.isfinite(row.total.ratio) and row.total.ratio <= 1.5, (row.name, row.total.ratio)


@pytest.mark.parametrize("task", ["ForMaskedLM", "Model"])
def test_the_float64_verdict_passes_on_a_tiny_mpnet(task, tiny):
    directory = tiny(task)
    report = run_parity(directory, texts=TEXTS, progress=False)
    assert report.passed, report.table()
    assert_sane(report)
    names = [row.name for row in report.rows]
    assert {"embeddings", "layer 0", "layer 1", "attentions layer 0", "attentions layer 1"} <= set(names)
    assert ("mlm logits" in names and "mlm top-5" in names) == (task == "ForMaskedLM")
    assert ("pooler" in names) == (task == "Model")  # transformers' MPNetModel saves its pooler
    cases = {case["name"]: case for case in report.cases}
    assert list(cases) == CASES
    assert cases["max length"]["longest"] == MAX_POSITIONS - 2  # positions 2 ... 39
    # hfbert runs sdpa with the bias as an additive mask; transformers' MPNet has eager only, and the report says so
    assert (report.attn, report.reference_attn) == ("sdpa", "eager")
    assert "transformers eager: the only attention it has" in report.table()


def test_the_verdict_fails_without_the_relative_position_bias(tiny, monkeypatch):
    """The battery sees what MPNet adds to BERT: hfbert with the bias table's values zeroed diverges at layer 0."""
    import hfbert.modeling.mpnet as mpnet

    zeroed = mpnet.relative_position_bias
    monkeypatch.setattr(mpnet, "relative_position_bias", lambda table, length: torch.zeros_like(zeroed(table, length)))
    report = run_parity(tiny("Model"), texts=TEXTS[:2], progress=False)
    assert not report.passed
    assert report.first_divergence == "attentions layer 0"  # in forward order: the scores, before layer 0's output
    assert not next(row for row in report.rows if row.name == "layer 0").passed


class _MaskIgnored(artifacts.Exporter):
    """benchmarks.artifacts' exporter with every token attending to every other: real tokens attend to pads."""

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return super().forward(input_ids, torch.ones_like(attention_mask), token_type_ids)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_exact_export_passes_with_onnx_runtime_and_openvino_and_one_ignoring_the_mask_fails(
    tiny, tmp_path, monkeypatch
):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    pytest.importorskip("openvino")
    directory = tiny("Model")
    exact = artifacts.export_onnx(directory, tmp_path / "mpnet.onnx", pooler=True)
    openvino = artifacts.convert_openvino(exact, tmp_path / "openvino" / "mpnet.xml")
    monkeypatch.setattr(artifacts, "Exporter", _MaskIgnored)
    broken = artifacts.export_onnx(directory, tmp_path / "mask-ignored.onnx")
    report = run_parity(directory, texts=TEXTS, progress=False, artifacts=[exact, openvino, broken])
    assert report.hfbert_passed, report.table()
    good, converted, bad = report.artifacts
    for check in (good, converted):
        assert check.engine.inputs == ("input_ids", "attention_mask")  # MPNet has no token types
        assert check.verdict == "pass", report.table()
        assert set(check.rows) == {"last_hidden_state", "pooler_output"}
        # left padding fed as it is: the graph counts positions from the ids, the bias from column distances
        assert check.rows["last_hidden_state"].by_case["left padding"].passed
        assert check.ratios["last_hidden_state"] <= 1.5
    assert "fed as segment 0" not in report.table()
    assert bad.verdict == "fail"
    by_case = bad.rows["last_hidden_state"].by_case
    assert by_case["single"].passed and not by_case["right padding"].passed
    assert any("attention mask looks ignored" in cause for cause in bad.likely_causes()), bad.likely_causes()


# -- the real all-mpnet-base-v2 (slow) -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_report(real_mpnet, tmp_path_factory):
    """16 texts of the shipped battery (and their pairs, paddings and the 512-token input) on all-mpnet-base-v2,
    with its exact ONNX export judged beside hfbert."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    exact = artifacts.export_onnx(real_mpnet, tmp_path_factory.mktemp("onnx") / "all-mpnet-base-v2.onnx", pooler=True)
    return run_parity(real_mpnet, texts=parity_texts(16), progress=False, artifacts=[exact])


@pytest.mark.slow  # all-mpnet-base-v2 in hfbert, transformers and float64 over the shipped battery
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_real_all_mpnet_base_v2_is_as_accurate_as_transformers(real_report):
    assert real_report.hfbert_passed, real_report.table()
    assert_sane(real_report)
    names = {row.name for row in real_report.rows}
    assert "pooler" in names and "mlm logits" not in names  # sentence-transformers saved MPNetModel, its pooler
    assert {f"attentions layer {index}" for index in range(12)} <= names
    cases = {case["name"]: case for case in real_report.cases}
    assert list(cases) == CASES and cases["max length"]["longest"] == 512


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_real_all_mpnet_base_v2_exported_to_onnx_passes(real_report):
    (check,) = real_report.artifacts
    assert check.verdict == "pass", real_report.table()
    assert set(check.rows) == {"last_hidden_state", "pooler_output"}
    # its sentence embeddings through the folder's pipeline (mean pooling, Normalize), against float64's
    assert real_report.sentence_pipeline and check.sentences.numbers()["min_cosine"] > 0.999999
