"""`hfbert convert` writes checkpoints transformers loads with nothing missing or unexpected; `hfbert inspect`."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import hfbert
from converters import writing
from hfbert.tools.convert import convert

from support.helpers import max_difference, minilm_directory

IDS = torch.tensor([[101, 7592, 1010, 2088, 999, 102]])


def transformers_output(directory, model_class="BertModel", **kwargs):
    import transformers

    model, info = getattr(transformers, model_class).from_pretrained(directory, output_loading_info=True, **kwargs)
    with torch.no_grad():
        output = model.eval()(input_ids=IDS)
    return output, info


@pytest.mark.parametrize(
    ("layout", "shard_size", "shards"),
    [("small layout", "1MB", 3), pytest.param("bert-base", "200MB", 3, marks=pytest.mark.slow)],
    indirect=["layout"],
)
def test_bert_base_pickle_to_canonical_sharded(tmp_path, layout, shard_size, shards, hfbert_command):
    """bert-base-uncased's pickle (small in the default run, its own size in the slow one) to sharded safetensors,
    `hfbert convert` in-process in the default run, in a fresh process in the slow one."""
    destination = tmp_path / "canonical"
    result = hfbert_command("convert", layout.pickle, destination, "--max-shard-size", shard_size)
    assert result.returncode == 0, result.stderr
    index = json.loads((destination / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == shards
    assert "cls.predictions.decoder.weight" not in index["weight_map"]  # tied: stored once, as transformers does
    assert not any("gamma" in name or "beta" in name for name in index["weight_map"])
    assert (destination / "vocab.txt").read_bytes() == (layout.pickle / "vocab.txt").read_bytes()

    pretraining, info = transformers_output(destination, "BertForPreTraining")
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    original, _ = transformers_output(layout.safetensors, "BertForPreTraining")
    assert max_difference(pretraining.prediction_logits, original.prediction_logits) == 0.0
    ours = hfbert.BertModel.from_pretrained(destination)
    reference, _ = transformers_output(layout.safetensors)
    with torch.no_grad():
        assert max_difference(ours(input_ids=IDS).last_hidden_state, reference.last_hidden_state) <= 1e-5


def test_minilm_with_legacy_buffer_to_bfloat16(tmp_path, hfbert_command):
    destination = tmp_path / "bf16"
    result = hfbert_command("convert", minilm_directory(), destination, "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    output, info = transformers_output(destination)
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    assert json.loads((destination / "config.json").read_text())["dtype"] == "bfloat16"
    ours = hfbert.BertModel.from_pretrained(destination)
    assert ours.dtype == torch.bfloat16
    with torch.no_grad():
        assert max_difference(ours(input_ids=IDS).last_hidden_state, output.last_hidden_state) <= 1e-2


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def failing_save(tensors, path, metadata=None):
        calls.append(path)
        path.write_bytes(b"partial")
        raise OSError("disk full")

    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        convert(minilm_directory(), tmp_path / "out")
    assert calls and list(tmp_path.iterdir()) == []


def test_destination_that_exists_is_refused(tmp_path, hfbert_command):
    (tmp_path / "out").mkdir()
    result = hfbert_command("convert", minilm_directory(), tmp_path / "out")
    assert result.returncode == 1 and "already exists" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_shard_size_parsing():
    assert writing.parse_size("2GB") == 2 * 10**9 and writing.parse_size("500MiB") == 500 * 2**20
    with pytest.raises(ValueError, match="max_shard_size"):
        writing.parse_size("lots")


@pytest.mark.parametrize("size", ["2GB", "500MB", "200KB", "1TB", " 2 GB", "0.5KB", "1.25GB", "5gb"])
def test_shard_sizes_mean_what_they_mean_to_huggingface_hub(size):
    """Our parser (kept for its errors: huggingface_hub's raises OverflowError on "1e400GB" and takes "-5GB") gives
    the byte count huggingface_hub's, which transformers uses, gives for every size that one accepts."""
    from huggingface_hub.serialization._base import parse_size_to_int

    assert writing.parse_size(size) == parse_size_to_int(size)


SHARDED_CLASSES = ["BertModel", "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification"]


@pytest.mark.parametrize("class_name", SHARDED_CLASSES)
def test_shards_and_index_are_the_ones_transformers_writes(tmp_path, class_name):
    """Same shard files (names, tensors in each, bytes), same index text, for save_pretrained and for convert: the
    word embeddings, larger than the limit, get a shard of their own ahead of the one being filled, as in
    huggingface_hub's split; `metadata.total_parameters` is there, as transformers 5 writes it."""
    import transformers
    from safetensors import safe_open

    from support.helpers import SMALL_CONFIG

    torch.manual_seed(0)
    reference = getattr(transformers, class_name)(transformers.BertConfig(**SMALL_CONFIG))
    reference.save_pretrained(tmp_path / "transformers", max_shard_size="100KB")
    getattr(hfbert, class_name).from_pretrained(tmp_path / "transformers").save_pretrained(
        tmp_path / "saved", max_shard_size="100KB"
    )
    convert(tmp_path / "transformers", tmp_path / "converted", max_shard_size="100KB")
    expected = sorted(path.name for path in (tmp_path / "transformers").glob("model*"))
    assert len(expected) > 10
    index = (tmp_path / "transformers" / "model.safetensors.index.json").read_text()
    assert "total_parameters" in index
    for ours in ("saved", "converted"):
        assert sorted(path.name for path in (tmp_path / ours).glob("model*")) == expected
        assert (tmp_path / ours / "model.safetensors.index.json").read_text() == index
        for name in expected[:-1]:  # the shards
            with (
                safe_open(tmp_path / "transformers" / name, "pt") as theirs,
                safe_open(tmp_path / ours / name, "pt") as mine,
            ):
                assert list(mine.keys()) == list(theirs.keys()), (ours, name)
                assert all(torch.equal(mine.get_tensor(key), theirs.get_tensor(key)) for key in theirs.keys())


def test_inspect_bert_base_layout(layout, hfbert_command):
    """bert-base-uncased's file layout (small in the default run, its own size in the slow one)."""
    result = hfbert_command("inspect", layout.safetensors)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    weights = layout.safetensors / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() in text
    layers = f"{{0-{layout.config['num_hidden_layers'] - 1}}}"
    assert f"bert.encoder.layer.{layers}.attention.self.query.weight" in text
    assert f"renamed -> encoder.layer.{layers}.output.LayerNorm.weight" in text
    assert text.count("ignored by design") == 7
    total = sum(tensor.numel() for tensor in layout.tensors.values())
    assert f"total {total:,}" in text
    if not layout.small:  # layout.json's published parameter count of the real model.safetensors
        assert "total 110,106,428" in text


def test_inspect_missing_source_fails_with_one_line(hfbert_command):
    result = hfbert_command("inspect", "./no/such/dir")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "not a checkpoint directory" in result.stderr
