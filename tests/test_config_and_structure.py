"""BertConfig mirrors transformers' BertConfig; BertModel's state dict equals transformers.BertModel's."""

from __future__ import annotations

import json

import pytest
import torch

import hfbert
from hfbert.modeling.activations import ACTIVATIONS

from support.checkpoints import REFERENCE
from support.helpers import SMALL_CONFIG, minilm_directory


def test_every_transformers_encoder_field_is_typed():
    import transformers

    reference_fields = set(transformers.BertConfig().to_dict())
    ours = set(hfbert.BertConfig().to_dict())
    # Fields shared by every transformers config (labels, generation, ...) are kept as extra fields instead.
    bert_fields = set(transformers.BertConfig.__annotations__)
    assert bert_fields <= ours, bert_fields - ours
    assert {"hidden_size", "num_attention_heads", "model_type"} <= ours & reference_fields


@pytest.mark.parametrize("path", [REFERENCE / "config.json", minilm_directory() / "config.json"])
def test_config_json_round_trip_keeps_every_key(path, tmp_path):
    original = json.loads(path.read_text())
    config = hfbert.BertConfig.from_json_file(path)
    config.to_json_file(tmp_path / "config.json")
    written = json.loads((tmp_path / "config.json").read_text())
    for key, value in original.items():
        assert written[key] == value, key
    assert hfbert.BertConfig.from_json_file(tmp_path / "config.json") == config
    assert config.transformers_version == original["transformers_version"]  # unknown keys read like fields


def test_written_config_loads_in_transformers(tmp_path):
    import transformers

    hfbert.BertConfig(**SMALL_CONFIG, hidden_act="gelu_new").to_json_file(tmp_path / "config.json")
    reference = transformers.BertConfig.from_pretrained(tmp_path)
    for key, value in SMALL_CONFIG.items():
        assert getattr(reference, key) == value
    assert reference.hidden_act == "gelu_new"


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("hidden_size", 0, "positive integer"),
        ("num_hidden_layers", -1, "positive integer"),
        ("vocab_size", 3.5, "positive integer"),
        ("hidden_act", "gelu_magic", "supported"),
        ("position_embedding_type", "relative_key", "absolute"),
        ("is_decoder", True, "encoder"),
        ("add_cross_attention", True, "encoder"),
        ("hidden_dropout_prob", 1.5, r"\[0, 1\]"),
        ("layer_norm_eps", 0, "positive number"),
        ("pad_token_id", 30522, "vocab_size"),
    ],
)
def test_invalid_fields_name_the_field_and_file(field, value, message, tmp_path):
    values = json.loads((REFERENCE / "config.json").read_text())
    values[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(hfbert.ConfigError, match=message) as error:
        hfbert.BertConfig.from_json_file(path)
    assert f"'{field}'" in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_are_transformers_formulas(name):
    from transformers.activations import ACT2FN

    x = torch.linspace(-12, 12, 20001, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(ACTIVATIONS[name](x.to(dtype)), ACT2FN[name](x.to(dtype))), name


STRUCTURE_CASES = [
    dict(),
    dict(SMALL_CONFIG),
    dict(hidden_size=64, num_attention_heads=1, num_hidden_layers=1, intermediate_size=7, type_vocab_size=3),
    dict(hidden_size=384, num_attention_heads=12, num_hidden_layers=6, intermediate_size=1536, pad_token_id=None),
]


@pytest.mark.parametrize("fields", STRUCTURE_CASES)
@pytest.mark.parametrize("add_pooling_layer", [True, False])
def test_state_dict_equals_transformers(fields, add_pooling_layer):
    import transformers

    with torch.device("meta"):
        ours = hfbert.BertModel(hfbert.BertConfig(**fields), add_pooling_layer=add_pooling_layer).state_dict()
        theirs = transformers.BertModel(transformers.BertConfig(**fields), add_pooling_layer=add_pooling_layer)
        theirs = theirs.state_dict()
    assert list(ours) == list(theirs)
    assert {name: tuple(t.shape) for name, t in ours.items()} == {name: tuple(t.shape) for name, t in theirs.items()}
    assert not any("position_ids" in name or "token_type_ids" in name for name in ours)


def test_config_from_pretrained_never_keeps_loader_options():
    """transformers' download keywords are not config fields: a token must never reach a saved config.json."""
    with pytest.raises(TypeError, match="token not supported"):
        hfbert.BertConfig.from_pretrained(minilm_directory(), token="hf_secret")
