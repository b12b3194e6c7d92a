"""Broken checkpoints end in one clear exception that names the file and the tensor or field."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import hfbert
from converters.errors import CheckpointError

from conftest import minilm_directory
from test_loading import copy_checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    return copy_checkpoint(minilm_directory(), tmp_path / "checkpoint")


def test_missing_config_json(checkpoint):
    (checkpoint / "config.json").unlink()
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: file not found"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_config_json_not_json(checkpoint):
    (checkpoint / "config.json").write_text("{ not json")
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: not valid JSON"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_unsupported_hidden_act(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["hidden_act"] = "gelu_magic"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: field 'hidden_act' is 'gelu_magic'"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_config_sizes_contradict_the_weights(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = 1000
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        hfbert.BertModel.from_pretrained(checkpoint)
    message = str(error.value)
    assert "model.safetensors" in message and "config.json" in message
    assert "embeddings.word_embeddings.weight is (30522, 384) in the checkpoint, (1000, 384) in the model" in message


def test_config_with_more_layers_than_the_weights(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = 7
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"missing from the checkpoint: encoder\.layer\.6\.attention\.self\.query\.weight"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_one_tensor_with_the_wrong_shape(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["encoder.layer.3.intermediate.dense.weight"] = torch.zeros(1536, 383)
    copy_checkpoint(minilm_directory(), checkpoint, tensors)
    with pytest.raises(
        CheckpointError, match=r"shape mismatch: encoder\.layer\.3\.intermediate\.dense\.weight is \(1536, 383\)"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_one_tensor_missing(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    del tensors["encoder.layer.2.output.LayerNorm.bias"]
    copy_checkpoint(minilm_directory(), checkpoint, tensors)
    with pytest.raises(
        CheckpointError, match=r"missing from the checkpoint: encoder\.layer\.2\.output\.LayerNorm\.bias"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


@pytest.mark.parametrize("keep_bytes", [0, 7, 100, 50_000_000])
def test_truncated_safetensors(checkpoint, keep_bytes):
    path = checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:keep_bytes])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_corrupt_safetensors_header(checkpoint):
    path = checkpoint / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"#" * 32  # the JSON header now is not JSON
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_no_weights_at_all(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weight file found \(looked for model\.safetensors"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_index_naming_a_missing_shard(checkpoint):
    shutil.move(checkpoint / "model.safetensors", checkpoint / "model-00001-of-00002.safetensors")
    weight_map = {"embeddings.word_embeddings.weight": "model-00002-of-00002.safetensors"}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"index\.json: shard 'model-00002-of-00002\.safetensors' does not exist"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_not_a_directory_nor_a_repo_id(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        hfbert.BertModel.from_pretrained(tmp_path / "does-not-exist")
