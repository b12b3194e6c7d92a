"""fill-mask's refusals, convert and inspect on MPNet checkpoints (issue #42), each against transformers loading the
same folder, element-wise (what every member's fill-mask, convert and inspect do: test_family_conformance.py). The
checkpoints are transformers' own MPNet classes with random weights (`support.mpnet`) and all-mpnet-base-v2's
tokenizer (the `real_mpnet` fixture, read-only), so `<mask>` is MPNet's real mask token."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from converters.errors import CheckpointError
from hfbert.cli import main
from hfbert.tools.convert import convert
from hfbert.tools.inspect import summary

from support.mpnet import tiny_mpnet_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def mpnet_folders(real_mpnet, tmp_path_factory):
    """task -> a tiny transformers MPNet<task> folder, written on first use; read by the tests, never changed."""
    folders = {}

    def folder(task: str):
        if task not in folders:
            fields = {"num_labels": 2} if task == "ForQuestionAnswering" else {}  # start and end logits
            folders[task] = tiny_mpnet_checkpoint(tmp_path_factory.mktemp("mpnet") / task, real_mpnet, task, **fields)
        return folders[task]

    return folder


def test_fill_mask_names_mpnets_mask_token_and_head(mpnet_folders, capsys):
    assert main(["fill-mask", str(mpnet_folders("ForMaskedLM")), "Paris is the [MASK] of France."]) != 0
    assert "exactly one '<mask>' in the text, found 0" in capsys.readouterr().err
    assert main(["fill-mask", str(mpnet_folders("Model")), "Paris is the <mask> of France."]) != 0
    assert "no lm_head.* tensors" in capsys.readouterr().err


def test_convert_a_legacy_file_to_transformers_layout(mpnet_folders, tmp_path):
    """A pytorch_model.bin of a wrapped model (`module.`), with the tied decoder and the position_ids buffer stored,
    as transformers 4.x and training scripts wrote them: converted to the names transformers 5 saves."""
    directory = mpnet_folders("ForMaskedLM")
    legacy = tmp_path / "legacy"
    shutil.copytree(directory, legacy, ignore=shutil.ignore_patterns("model.safetensors"))
    model = transformers.MPNetForMaskedLM.from_pretrained(directory)
    state = {f"module.{name}": tensor.clone() for name, tensor in model.state_dict().items()}
    assert "module.lm_head.decoder.weight" in state
    state["module.mpnet.embeddings.position_ids"] = torch.arange(514)[None]
    torch.save(state, legacy / "pytorch_model.bin")
    convert(legacy, tmp_path / "converted")
    source = load_file(directory / "model.safetensors")
    written = load_file(tmp_path / "converted" / "model.safetensors")
    assert sorted(written) == sorted(source)
    assert all(torch.equal(written[name], source[name]) for name in source)


def test_convert_refuses_roberta_keys_under_an_mpnet_config(mpnet_folders, tmp_path):
    directory = shutil.copytree(mpnet_folders("ForMaskedLM"), tmp_path / "source")
    tensors = {name.replace("mpnet.", "roberta."): t for name, t in load_file(directory / "model.safetensors").items()}
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match="named as a 'roberta' checkpoint's, but .* says model_type 'mpnet'"):
        convert(directory, tmp_path / "converted")
    assert not (tmp_path / "converted").exists()


def test_inspect_reads_the_mpnet_layout(mpnet_folders, capsys):
    directory = mpnet_folders("ForMaskedLM")
    facts = summary(directory)
    config = facts["config"]
    assert config["model_type"] == "mpnet" and config["max_sequence_length"] == 512
    assert config["relative_attention_num_buckets"] == 32
    assert config["type_vocab_size"] is None  # MPNet has no token types
    actions = {entry["name"]: entry["action"] for entry in facts["tensors"]}
    assert actions["mpnet.encoder.relative_attention_bias.weight"] == "renamed"
    assert actions["mpnet.encoder.layer.0.attention.attn.q.weight"] == "renamed"
    assert {actions[name] for name in actions if name.startswith("lm_head.")} == {"ignored"}
    assert facts["tokenizer"]["problems"] == []
    assert main(["inspect", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "mpnet, 2 layers" in out and "positions 514 (longest input 512)" in out
    assert "no token types, relative_attention_num_buckets 32" in out
    assert main(["inspect", str(directory), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == config
