"""`hfbert parity --artifact` on ONNX exports of a tiny DeBERTa-v3 (relative c2p and p2c terms over 8 log buckets):
an exact export passes; a wrong one, whose relative distances are bucketed with another `position_buckets` on the
checkpoint's own table, fails with that bucket size named as the likely cause. Beside them, in the default run, the
DeBERTa reference adapter's variants (hfbert/tools/parity/engines/reference_adapters.py): each changes transformers'
float64 output and puts every field back, and its upgrade guard names a field transformers stops reading.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hfbert.cli import main
from hfbert.tools.parity.engines.reference_adapters import DebertaV2Adapter

from support.deberta import deberta_tokenizer
from support.helpers import parity_texts, randomize_weights
from support.members import tiny_config

transformers = pytest.importorskip("transformers")
FIELDS = tiny_config("deberta-v2")  # deberta-v3-base's attention: position_buckets 8, reach 40
WRONG_BUCKETS = 4


def backbone(seed: int = 0) -> torch.nn.Module:
    config = transformers.DebertaV2Config(**FIELDS)
    torch.manual_seed(seed)
    return randomize_weights(transformers.DebertaV2Model(config)).double().eval()


def fields_of(model: torch.nn.Module) -> list[tuple]:
    encoder = model.encoder
    rows = [("encoder", encoder.position_buckets, encoder.max_relative_positions)]
    for layer in encoder.layer:
        attention = layer.attention.self
        rows.append(
            (
                "attention",
                attention.position_buckets,
                attention.max_relative_positions,
                attention.pos_ebd_size,
                list(attention.pos_att_type),
            )
        )
    return rows


def test_every_variant_changes_the_float64_output_and_puts_every_field_back():
    model = backbone()
    ids = torch.randint(5, 99, (2, 30), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    real = mask.bool()
    before = fields_of(model)
    with torch.no_grad():
        plain = model(ids, attention_mask=mask).last_hidden_state[real]
        variants = DebertaV2Adapter().variants(model)
        for change, changed in variants:
            with changed:
                output = model(ids, attention_mask=mask).last_hidden_state[real]
            assert float((output - plain).abs().max()) > 1e-3, change
            assert fields_of(model) == before, change
        again = model(ids, attention_mask=mask).last_hidden_state[real]
    torch.testing.assert_close(again, plain, rtol=0, atol=0)
    described = [change for change, _ in variants]
    assert any(change.startswith("no log buckets") for change in described), described
    assert any(change.startswith(f"log buckets of {WRONG_BUCKETS}, not 8") for change in described), described
    assert any(change.startswith("no c2p") for change in described) and any("no p2c" in c for c in described)


def test_the_variants_of_a_bucketed_change_equal_transformers_built_so():
    """The bucket variant is what transformers computes when its encoder buckets with that size on the same table."""
    model, wrong = backbone(), backbone()
    wrong.encoder.position_buckets = WRONG_BUCKETS
    ids = torch.randint(5, 99, (1, 30), generator=torch.Generator().manual_seed(1))
    variants = dict(DebertaV2Adapter().variants(model))
    with torch.no_grad():
        expected = wrong(ids).last_hidden_state
        with variants[f"log buckets of {WRONG_BUCKETS}, not 8 (position_buckets), on the same table"]:
            output = model(ids).last_hidden_state
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


def test_a_field_transformers_stops_reading_is_named(monkeypatch):
    model = backbone()
    assert DebertaV2Adapter().missing(transformers, model) == []
    encoder = type(model.encoder)
    original = encoder.get_rel_pos

    def from_config(self, hidden_states, query_states=None, relative_pos=None):  # reads config, not its field
        saved = self.position_buckets
        self.position_buckets = model.config.position_buckets
        try:
            return original(self, hidden_states, query_states, relative_pos)
        finally:
            self.position_buckets = saved

    monkeypatch.setattr(encoder, "get_rel_pos", from_config)
    assert DebertaV2Adapter().missing(transformers, model) == [
        f"{encoder.__name__}.get_rel_pos: no longer buckets with its position_buckets field"
    ]
    monkeypatch.undo()
    del model.encoder.layer[0].attention.self.pos_ebd_size
    del model.encoder.layer[1].attention.self.pos_ebd_size
    assert "DisentangledSelfAttention.pos_ebd_size" in DebertaV2Adapter().missing(transformers, model)


def export(model: torch.nn.Module, path):
    """transformers' DebertaV2Model as ONNX (input_ids, attention_mask -> last_hidden_state), opset 17, dynamic batch
    and sequence axes, traced on a padded batch."""

    class Exporter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(5, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    axes = {name: {0: "batch", 1: "sequence"} for name in ("input_ids", "attention_mask", "last_hidden_state")}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's tracer and deprecation warnings
        torch.onnx.export(
            Exporter().eval(),
            (ids, mask),
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return path


def other_buckets(model: torch.nn.Module) -> None:
    model.encoder.position_buckets = WRONG_BUCKETS  # the field get_rel_pos buckets with; the table keeps its 16 rows


def no_buckets(model: torch.nn.Module) -> None:
    model.encoder.position_buckets = -1


def no_c2p(model: torch.nn.Module) -> None:
    for layer in model.encoder.layer:
        layer.attention.self.pos_att_type = ["p2c"]


# Wrong ports, each transformers' own model with one field changed after it loaded the checkpoint's weights, and the
# cause parity should name for it.
WRONG = {
    "other-buckets": (other_buckets, f"log buckets of {WRONG_BUCKETS}, not 8 (position_buckets), on the same table"),
    "no-buckets": (no_buckets, "no log buckets: distances clamped at 8 as they are (position_buckets read as -1)"),
    "no-c2p": (no_c2p, "no c2p (content-to-position) term: only p2c"),
}


@pytest.mark.slow  # four ONNX exports and two parity runs: about a minute on 2 cores
def test_an_exact_export_passes_and_wrong_relative_positions_fail_naming_the_cause(tmp_path, capsys):
    pytest.importorskip("onnxruntime", reason="ONNX artifacts need the onnx extra: pip install 'hfbert[onnx]'")
    pytest.importorskip("onnx", reason="ONNX artifacts need the onnx extra: pip install 'hfbert[onnx]'")
    directory = tmp_path / "deberta"
    deberta_tokenizer(directory)
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(directory))
    config = transformers.DebertaV2Config(**{**FIELDS, "vocab_size": vocab_size})
    torch.manual_seed(0)
    randomize_weights(transformers.DebertaV2Model(config)).eval().save_pretrained(directory)
    exact = export(transformers.DebertaV2Model.from_pretrained(directory).eval(), tmp_path / "exact.onnx")
    built = {}
    for name, (change, _) in WRONG.items():
        model = transformers.DebertaV2Model.from_pretrained(directory).eval()
        change(model)
        built[name] = export(model, tmp_path / f"{name}.onnx")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(parity_texts(6)) + "\n")
    common = ["parity", str(directory), "--texts", str(texts)]

    assert main([*common, "--artifact", str(exact)]) == 0, capsys.readouterr()
    capsys.readouterr()
    report = tmp_path / "report.json"
    arguments = [*common, "--json", str(report)]
    for path in built.values():
        arguments += ["--artifact", str(path)]
    status = main(arguments)
    table = capsys.readouterr().out
    assert status == 1, table
    assert [entry["verdict"] for entry in json.loads(report.read_text())["artifacts"]] == ["fail"] * len(WRONG)
    sections = table.split("\nartifact ")[1:]
    for (name, (_, cause)), section in zip(WRONG.items(), sections, strict=True):
        assert section.startswith(f"  {built[name]}"), section
        causes = [line.strip() for line in section.splitlines() if line.strip().startswith("likely cause:")]
        assert len(causes) == 1 and causes[0].startswith(f"likely cause: {cause}"), (name, section)
