"""`hfbert parity --artifact` as a release gate that no option fools: the padded cases hold padding and "pairs" two
rows of other token types whatever --batch-size and --texts (or the verdict says untested and exits 1), a position
offset is named as such, and the JSON stays valid JSON when an artifact emits NaN.

The broken artifacts are transformers' BertModel exported as benchmarks/artifacts.py exports it (`export_onnx`), with
one bug each put into its forward, as a port ships them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hfbert.cli import main

from support.helpers import parity_texts, write_small_minilm_checkpoint

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

ONE_LENGTH = ["the cat sat", "a dog ran", "my car is", "his hat was", "our team won", "the sun set"]


def bug(kind: str) -> type:
    """benchmarks.artifacts.Exporter with one bug in its forward."""
    from benchmarks.artifacts import Exporter

    class Broken(Exporter):
        def forward(self, input_ids, attention_mask, token_type_ids=None):
            positions = None
            if kind == "attends to pads":
                attention_mask = torch.ones_like(attention_mask)
            elif kind == "first row's token types":
                token_type_ids = token_type_ids[:1].expand_as(token_type_ids)
            elif kind.startswith("positions from"):
                start = int(kind.split()[-1])
                top = self.model.config.max_position_embeddings - 1  # kept in the table, as a port that runs at all
                positions = (torch.arange(input_ids.shape[1]) + start).clamp(max=top).expand_as(input_ids)
            output = self.model(
                input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=positions
            ).last_hidden_state
            return output * torch.tensor(float("nan")) if kind == "emits NaN" else output

    return Broken


def export(checkpoint: Path, path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    import benchmarks.artifacts

    with monkeypatch.context() as patch:
        patch.setattr(benchmarks.artifacts, "Exporter", bug(kind))
        return benchmarks.artifacts.export_onnx(checkpoint, path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_small_minilm_checkpoint(tmp_path_factory.mktemp("gate") / "small", pipeline=False)


@pytest.fixture(scope="module")
def artifacts(checkpoint, tmp_path_factory) -> dict[str, Path]:
    from benchmarks.artifacts import export_onnx

    work = tmp_path_factory.mktemp("artifacts")
    built = {"exact": export_onnx(checkpoint, work / "exact.onnx")}
    with pytest.MonkeyPatch.context() as monkeypatch:
        for kind in ("attends to pads", "first row's token types", "positions from 1", "positions from 2", "emits NaN"):
            built[kind] = export(checkpoint, work / f"{kind.replace(' ', '-')}.onnx", kind, monkeypatch)
    return built


def run(checkpoint: Path, artifacts: dict[str, Path], names: list[str], **options) -> tuple[object, dict[str, dict]]:
    from hfbert.tools.parity import run_parity

    report = run_parity(checkpoint, artifacts=[artifacts[name] for name in names], progress=False, **options)
    entries = report.to_dict()["artifacts"]
    return report, dict(zip(names, entries, strict=True))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("inputs", ["batch size 1", "texts of one length"])
def test_padding_and_token_type_bugs_fail_whatever_the_batch_size_and_texts(inputs, checkpoint, artifacts):
    names = ["exact", "attends to pads", "first row's token types"]
    options = {"batch_size": 1, "texts": parity_texts(12)} if inputs == "batch size 1" else {"texts": ONE_LENGTH}
    if inputs == "texts of one length":
        from hfbert.modeling.tokenizer import BertTokenizer

        assert len({len(row) for row in BertTokenizer.from_pretrained(checkpoint)(ONE_LENGTH)["input_ids"]}) == 1
    report, found = run(checkpoint, artifacts, names, **options)
    assert report.hfbert_passed and found["exact"]["verdict"] == "pass", found["exact"]["ratios"]
    pads, types = found["attends to pads"], found["first row's token types"]
    assert pads["verdict"] == "fail" and types["verdict"] == "fail", (pads["ratios"], types["ratios"])
    cases = {case["name"]: case for case in report.to_dict()["cases"]}
    for name in ("pairs", "right padding", "left padding"):
        assert cases[name]["exercised"] and cases[name]["added_batches"] == 1, cases[name]
    by_case = pads["outputs"]["last_hidden_state"]["by_case"]
    assert by_case["right padding"]["accuracy_ratio"] > 100 and by_case["left padding"]["accuracy_ratio"] > 100
    assert by_case["single"]["accuracy_ratio"] <= 1.5
    assert any("attention mask looks ignored" in cause for cause in pads["likely_causes"]), pads["likely_causes"]
    by_case = types["outputs"]["last_hidden_state"]["by_case"]
    assert by_case["pairs"]["accuracy_ratio"] > 100 and by_case["right padding"]["accuracy_ratio"] <= 1.5
    assert any("only on sentence pairs" in cause for cause in types["likely_causes"]), types["likely_causes"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_command_line_fails_them_at_batch_size_1(checkpoint, artifacts, tmp_path, capsys):
    (tmp_path / "texts.txt").write_text("\n".join(ONE_LENGTH) + "\n")
    report = tmp_path / "report.json"
    names = ["attends to pads", "first row's token types"]
    run = ["parity", str(checkpoint), "--texts", str(tmp_path / "texts.txt"), "--batch-size", "1"]
    run += [argument for name in names for argument in ("--artifact", str(artifacts[name]))]
    assert main([*run, "--json", str(report)]) == 1
    out = capsys.readouterr()
    assert "right padding: no batch of at most 1 sequence held padding: a batch added" in out.out
    assert f"artifact {artifacts[names[0]]} (last_hidden_state" in out.err
    assert [entry["verdict"] for entry in json.loads(report.read_text())["artifacts"]] == ["fail", "fail"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_texts_that_cannot_hold_padding_leave_the_verdict_untested(checkpoint, artifacts, tmp_path, capsys):
    """A text the tokenizer reduces to [CLS] [SEP] (a lone combining accent, stripped) can be neither padded beside
    a shorter one nor cut: the cases say so, and neither hfbert nor the artifact passes.

    The artifact is judged with a bound of 4, not 1.5: on sequences of 2-4 tokens ONNX Runtime's fp32 products
    measure 1.3-1.9x the error of MKL's (transformers') against float64, on MKL's Intel branch and at the edge (1.44-
    1.5x) on its AMD branch, against 0.8-1.1x on sentences of 9 tokens and more (issue 49). This test is about
    "untested" against "fail", not about that bound, which the default battery's real sentences judge."""
    (tmp_path / "texts.txt").write_text("\u0301\n")
    report = tmp_path / "report.json"
    common = ["parity", str(checkpoint), "--texts", str(tmp_path / "texts.txt"), "--json", str(report)]
    pytest.importorskip("matplotlib")
    plot = tmp_path / "plot.svg"
    exact = ["--artifact", str(artifacts["exact"]), "--artifact-bound", "4"]
    assert main([*common, *exact, "--plot", str(plot)]) == 1
    assert "UNTESTED" in plot.read_text() and "PASS" not in plot.read_text()
    out = capsys.readouterr()
    assert "UNTESTED" in out.out and "the texts cannot give one" in out.out
    written = json.loads(report.read_text())
    assert not written["passed"] and not written["hfbert_passed"]
    assert set(written["untested"]) == {"pairs", "right padding", "left padding"}
    entry = written["artifacts"][0]
    assert entry["verdict"] == "untested" and set(entry["untested"]) == set(written["untested"])
    assert all(row["passed"] for row in written["rows"])  # what ran is exact: untested, not failed
    assert f"artifact {artifacts['exact']} (untested" in out.err


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_position_offset_is_named(checkpoint, artifacts):
    names = ["exact", "positions from 1", "positions from 2"]
    report, found = run(checkpoint, artifacts, names, texts=parity_texts(8))
    assert found["exact"]["verdict"] == "pass" and found["exact"]["likely_causes"] == []
    for offset in (1, 2):
        entry = found[f"positions from {offset}"]
        assert entry["verdict"] == "fail" and entry["worst_ratio"] > 100
        causes = entry["likely_causes"]
        assert causes and causes[0].startswith(f"position ids offset by {offset}:"), causes
        assert "RoBERTa's padding_idx" in causes[0]
        assert not any("computes something else" in cause for cause in causes), causes
    check = next(check for check in report.artifacts if check.name == str(artifacts["positions from 1"]))
    assert check.position_offset.shifted_rms * 1000 < check.position_offset.plain_rms  # fits to rounding


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_json_with_an_artifact_that_emits_nan_is_strict_json(checkpoint, artifacts, tmp_path, capsys):
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    (tmp_path / "texts.txt").write_text("\n".join(parity_texts(4)) + "\n")
    report = tmp_path / "report.json"
    common = [
        "parity",
        str(checkpoint),
        "--texts",
        str(tmp_path / "texts.txt"),
        "--artifact",
        str(artifacts["emits NaN"]),
    ]
    assert main([*common, "--json", str(report)]) == 1
    written = json.loads(report.read_text(), parse_constant=refuse)
    entry = written["artifacts"][0]
    assert entry["verdict"] == "fail" and entry["worst_ratio"] is None and entry["min_cosine"] is None
    capsys.readouterr()
    assert main([*common, "--json"]) == 1
    printed = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert printed["artifacts"][0]["worst_ratio"] is None
