"""`hfbert parity` on RoBERTa-family checkpoints (issue #41): the float64 verdict with and without the masked-LM head,
every case (pairs joined by `</s></s>`, left padding with the family's positions, the family's longest input), and
`--artifact` with ONNX Runtime on a transformers RobertaModel export, whose graph takes no token_type_ids; an export
that counts positions from 0 (BERT's, carried into a RoBERTa port) fails with that cause named."""

from __future__ import annotations

import warnings

import pytest
import torch

from hfbert.tools.parity import run_parity

from support.family import TEXTS, family_checkpoint
from support.members import tiny_config

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("member", "task"), [("roberta", "ForMaskedLM"), ("xlm-roberta", "Model"), ("camembert", "ForMaskedLM")]
)
def test_the_float64_verdict_passes_on_each_member(member, task, tmp_path):
    directory = family_checkpoint(tmp_path / member, member, task)
    report = run_parity(directory, texts=TEXTS, progress=False)
    assert report.passed, report.table()
    names = {row.name for row in report.rows}
    assert {"embeddings", "layer 0", "layer 1", "attentions layer 1"} <= names
    assert ("mlm logits" in names and "mlm top-5" in names) == (task == "ForMaskedLM")
    assert ("pooler" in names) == (task == "Model")  # transformers' RobertaModel saves its pooler
    cases = {case["name"]: case for case in report.cases}
    assert list(cases) == ["single", "pairs", "right padding", "left padding", "max length"]
    assert cases["max length"]["longest"] == 40 - 1 - 1  # max_position_embeddings - pad_token_id - 1


def export_onnx(directory, path, positions_from_zero: bool = False, takes_positions: bool = False):
    """transformers' RobertaModel as ONNX with input_ids and attention_mask only (what optimum exports); with
    `positions_from_zero`, its positions counted 0, 1, ... as a BERT port counts them; with `takes_positions`, a
    graph with a position_ids input."""
    model = transformers.RobertaModel.from_pretrained(directory, attn_implementation="eager", add_pooling_layer=False)

    class Exporter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model.eval()

        def forward(self, input_ids, attention_mask, position_ids=None):
            if positions_from_zero:
                position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
            return self.model(input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state

    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 2], [0, 10, 11, 2, 1, 1, 1]])
    names = ["input_ids", "attention_mask"] + (["position_ids"] if takes_positions else [])
    example = (ids, (ids != 1).long()) + ((torch.arange(2, 9).expand_as(ids),) if takes_positions else ())
    axes = {name: {0: "batch", 1: "sequence"} for name in (*names, "last_hidden_state")}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Exporter(),
            example,
            path,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return path


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_onnx_export_without_token_types_is_judged_and_positions_from_zero_are_named(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    directory = family_checkpoint(tmp_path / "roberta", "roberta", "ForMaskedLM")
    exact = export_onnx(directory, tmp_path / "exact.onnx")
    shifted = export_onnx(directory, tmp_path / "bert-positions.onnx", positions_from_zero=True)
    report = run_parity(directory, texts=TEXTS, progress=False, artifacts=[exact, shifted])
    assert report.hfbert_passed, report.table()
    good, bad = report.artifacts
    assert good.verdict == "pass", good.rows
    assert bad.verdict == "fail"
    assert bad.position_offset is not None and bad.position_offset.offset == -2
    assert bad.position_offset.shifted_rms * 1000 < bad.position_offset.plain_rms  # fits to rounding
    assert "count from 0, not 2" in bad.position_offset.describe()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_export_that_takes_position_ids_is_given_the_familys_positions(tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    directory = family_checkpoint(tmp_path / "roberta", "roberta", "Model")
    artifact = export_onnx(directory, tmp_path / "with-positions.onnx", takes_positions=True)
    report = run_parity(directory, texts=TEXTS, progress=False, artifacts=[artifact])
    (check,) = report.artifacts
    assert check.engine.inputs == ("input_ids", "attention_mask", "position_ids")
    assert check.verdict == "pass", check.rows


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_fused_graph_that_reads_the_mask_as_lengths_fails_left_padding(tmp_path):
    """ONNX Runtime's fused Attention takes the mask as each row's length unless told otherwise: right on right
    padding, wrong on left padding, which a RoBERTa-family graph (positions from the ids) is fed as it is."""
    pytest.importorskip("onnxruntime")
    from benchmarks.artifacts import export_onnx as export_with_engine_tools
    from benchmarks.artifacts import fuse_onnx

    directory = family_checkpoint(tmp_path / "roberta", "roberta", "Model")
    plain = export_with_engine_tools(directory, tmp_path / "plain.onnx")
    tiny = tiny_config("roberta")  # family_checkpoint's shape
    fused, counts = fuse_onnx(plain, tmp_path / "fused.onnx", tiny["num_attention_heads"], tiny["hidden_size"])
    assert counts.get("Attention") == tiny["num_hidden_layers"]
    report = run_parity(directory, texts=TEXTS, progress=False, artifacts=[plain, fused])
    plain_check, fused_check = report.artifacts
    assert plain_check.verdict == "pass", plain_check.rows
    assert fused_check.verdict == "fail"
    by_case = fused_check.rows["last_hidden_state"].by_case
    assert not by_case["left padding"].passed and by_case["right padding"].passed
