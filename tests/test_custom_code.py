"""A config whose `auto_map` maps the model to custom code (as jinaai's BERTs map theirs to
jina-bert-implementation) is refused by every command that reads a model, naming the custom class, with one opt-out
(`ignore_auto_map=True`, `--ignore-auto-map`); a tokenizer's custom code alone says nothing about the model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import (
    HELLO_WORLD_VOCABULARY,
    SMALL_CONFIG,
    minilm_directory,
    write_random_transformers_checkpoint,
)
from support.robust import assert_one_line, edit_config, run, write_tiny_mlm

JINA_AUTO_MAP = {
    "AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
    "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
    "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--modeling_bert.JinaBertForMaskedLM",
}


@pytest.fixture
def custom_code_checkpoint(tmp_path) -> Path:
    directory = write_random_transformers_checkpoint(tmp_path / "custom", **SMALL_CONFIG)
    (directory / "vocab.txt").write_text("".join(token + "\n" for token in HELLO_WORLD_VOCABULARY))
    return edit_config(directory, auto_map=JINA_AUTO_MAP)


# -- loading: refused, naming the custom class ----------------------------------------------------------------------


def test_a_config_with_auto_map_is_refused_naming_the_custom_class(custom_code_checkpoint):
    with pytest.raises(hfbert.CheckpointError, match=r"'auto_map' maps AutoModel to custom code .*JinaBertModel"):
        hfbert.BertModel.from_pretrained(custom_code_checkpoint)
    with pytest.raises(hfbert.CheckpointError, match=r"maps AutoModelForMaskedLM .*JinaBertForMaskedLM"):
        hfbert.BertForMaskedLM.from_pretrained(custom_code_checkpoint, strict=False)
    with pytest.raises(hfbert.CheckpointError, match=r"maps AutoModel .*ignore_auto_map=True"):
        hfbert.BertForSequenceClassification.from_pretrained(custom_code_checkpoint, num_labels=2)
    # Known to be plain BERT: the explicit opt-out loads it as any checkpoint.
    model, info = hfbert.BertModel.from_pretrained(
        custom_code_checkpoint, ignore_auto_map=True, output_loading_info=True
    )
    assert not info["report"].problems
    # A tokenizer's custom code alone says nothing about the model.
    config = json.loads((custom_code_checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["my_tokenizer.MyTokenizer", None]}
    (custom_code_checkpoint / "config.json").write_text(json.dumps(config))
    hfbert.BertModel.from_pretrained(custom_code_checkpoint)


def test_the_cli_refuses_auto_map_and_takes_the_opt_out(custom_code_checkpoint, capsys):
    capsys.readouterr()
    code, stderr = run(capsys, "embed", custom_code_checkpoint, "hello world")
    assert_one_line(code, stderr, "auto_map", "JinaBertModel", "--ignore-auto-map")
    code, stderr = run(capsys, "embed", custom_code_checkpoint, "hello world", "--ignore-auto-map")
    assert code == 0, stderr


# -- convert: refused as a load refuses it, with the same opt-out ---------------------------------------------------


def test_convert_refuses_auto_map_and_takes_the_opt_out(custom_code_checkpoint, tmp_path, capsys):
    import transformers

    from hfbert.tools.convert import convert

    with pytest.raises(hfbert.CheckpointError, match=r"'auto_map' maps AutoModel to custom code .*JinaBertModel"):
        convert(custom_code_checkpoint, tmp_path / "api")
    assert not (tmp_path / "api").exists()
    code, stderr = run(capsys, "convert", custom_code_checkpoint, tmp_path / "cli")
    assert_one_line(code, stderr, "auto_map", "JinaBertModel", "--ignore-auto-map")
    assert not (tmp_path / "cli").exists()

    # Known to be plain BERT: converted as such. The model's custom code is not copied, so the result maps no model
    # to it (a tokenizer's entry stays: its files are copied), and it loads as plain BERT without the opt-out.
    edit_config(custom_code_checkpoint, auto_map={**JINA_AUTO_MAP, "AutoTokenizer": ["tok.MyTokenizer", None]})
    code, stderr = run(capsys, "convert", custom_code_checkpoint, tmp_path / "cli", "--ignore-auto-map")
    assert code == 0, stderr
    written = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert written["auto_map"] == {"AutoTokenizer": ["tok.MyTokenizer", None]}
    ours = hfbert.BertModel.from_pretrained(tmp_path / "cli")
    theirs = transformers.BertModel.from_pretrained(custom_code_checkpoint).eval()
    ids = torch.tensor([[2, 12, 13, 5, 3]])
    with torch.no_grad():
        expected, got = theirs(input_ids=ids).last_hidden_state, ours(input_ids=ids).last_hidden_state
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)


# -- inspect: says the checkpoint maps to custom code ---------------------------------------------------------------


def test_inspect_shows_auto_map(custom_code_checkpoint, capsys):
    from hfbert.tools.inspect import describe, summary

    facts = summary(custom_code_checkpoint)
    assert facts["custom_code"]["auto_map"] == JINA_AUTO_MAP
    assert "JinaBertModel" in facts["custom_code"]["refused"]
    text = describe(custom_code_checkpoint)
    assert "auto_map" in text and "JinaBertModel" in text and "--ignore-auto-map" in text
    from hfbert.cli import main

    capsys.readouterr()
    assert main(["inspect", str(custom_code_checkpoint), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["custom_code"]["auto_map"] == JINA_AUTO_MAP
    assert summary(minilm_directory())["custom_code"] is None
    assert "custom code" not in describe(minilm_directory())


# -- parity: refused as the load it runs, with the same opt-out -----------------------------------------------------


def test_parity_refuses_auto_map_and_takes_the_opt_out(tmp_path, capsys):
    pytest.importorskip("transformers")
    directory = edit_config(write_tiny_mlm(tmp_path / "mlm"), auto_map=JINA_AUTO_MAP)
    texts = tmp_path / "texts.txt"
    texts.write_text("A first sentence.\nAnother one, a little longer.\n")
    arguments = ["parity", directory, "--texts", texts, "--batch-size", "2"]
    code, stderr = run(capsys, *arguments)
    assert_one_line(code, stderr, "auto_map", "JinaBertModel", "--ignore-auto-map")
    code, stderr = run(capsys, *arguments, "--ignore-auto-map")
    assert code == 0, stderr + capsys.readouterr().out
