"""`save_pretrained` into a folder replaces what the model owns, as transformers' does: config.json and the weights
(old shards and weight files of its naming go). Tokenizer files, sentence-transformers files and a user's files
stay as they were (a tokenizer saved there first keeps its added token); into a folder without them a
backbone's save and `convert` copy the checkpoint's tokenizer and sentence-transformers pipeline (pooling,
Normalize), so `SentenceTransformer(folder)` encodes as the original does.

Judged against transformers' `AutoTokenizer` and sentence-transformers' `encode`, on the real all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert
from hfbert.modeling.tokenizer import BertTokenizer
from hfbert.tools.convert import convert

from support.helpers import SMALL_CONFIG, files_under, minilm_directory, write_random_transformers_checkpoint

# `other_model` (conftest.py) has its own 14-token vocabulary: this text is [2, 12, 13, 3] there, MiniLM's
# [101, 7592, 2088, 102].
TEXT = "hello world"


def test_a_save_over_another_model_replaces_config_and_weights_and_leaves_the_rest(tmp_path, other_model):
    import transformers

    folder = tmp_path / "d"
    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(folder)
    assert {"tokenizer.json", "special_tokens_map.json"} <= set(files_under(folder))
    # The user's own files, beside and below: a save never touches them.
    (folder / "notes.txt").write_text("mine")
    (folder / "README.md").write_text("my model card")
    (folder / "checkpoint-500").mkdir()
    (folder / "checkpoint-500" / "tokenizer.json").write_text("{}")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "mine.txt").write_text("mine too")
    before = {relative: (folder / relative).read_bytes() for relative in files_under(folder)}

    hfbert.BertModel.from_pretrained(other_model).save_pretrained(folder)
    # As transformers' save_pretrained: the tokenizer in the folder is the one saved there (MiniLM's), untouched.
    model_files = ("config.json", "model.safetensors")
    kept = {relative: (folder / relative).read_bytes() for relative in before if relative not in model_files}
    assert kept == {relative: content for relative, content in before.items() if relative not in model_files}
    assert transformers.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == [101, 7592, 2088, 102]
    assert BertTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == [101, 7592, 2088, 102]
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 14
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "README.md").read_text() == "my model card"


def test_stale_weight_files_go_and_every_other_file_stays(tmp_path, other_model):
    folder = tmp_path / "d"
    folder.mkdir()
    stale = ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    kept = [
        "pytorch_model.bin",  # read after model.safetensors by every loader, as transformers leaves it
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model.bin.index.json",
        "added_tokens.json",
        "tokenizer.json",
        "special_tokens_map.json",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
        "3_Normalize/config.json",
        "2_Dense/notes.txt",
        "model.safetensors.backup",
        "my_vocab.txt",
        "README.md",
    ]
    for relative in stale + kept:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text("old")
    hfbert.BertModel.from_pretrained(other_model).save_pretrained(folder)
    # The folder has tokenizer and sentence-transformers files already: none of the source's is copied over them.
    assert sorted(files_under(folder)) == sorted(["config.json", "model.safetensors", *kept])
    assert all((folder / relative).read_text() == "old" for relative in kept)


def test_a_task_model_saved_from_a_sentence_transformers_checkpoint_does_not_claim_its_pipeline(tmp_path):
    """Pooling and Normalize describe the backbone's embeddings; a classifier fine-tuned from it is another model."""
    folder = tmp_path / "classifier"
    hfbert.BertForSequenceClassification.from_pretrained(minilm_directory(), num_labels=2).save_pretrained(folder)
    assert not (folder / "modules.json").exists() and not (folder / "1_Pooling").exists()
    assert (folder / "tokenizer.json").is_file()


def sentence_transformer_embeddings(directory: Path) -> tuple[list[str], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu")
    texts = ["A first sentence.", "Another, longer sentence about something else entirely.", "x"]
    return [type(module).__name__ for module in model], model.encode(texts, convert_to_numpy=True)


@pytest.mark.parametrize("how", ["convert", "save_pretrained"])
def test_a_backbone_keeps_its_sentence_transformers_pipeline(tmp_path, how):
    pytest.importorskip("sentence_transformers")
    destination = tmp_path / "out"
    if how == "convert":
        convert(minilm_directory(), destination)
    else:
        hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(destination)
    assert (destination / "modules.json").read_bytes() == (minilm_directory() / "modules.json").read_bytes()
    assert not (destination / "README.md").exists()  # the model card is not copied
    modules, embeddings = sentence_transformer_embeddings(destination)
    expected_modules, expected = sentence_transformer_embeddings(minilm_directory())
    assert modules == expected_modules == ["Transformer", "Pooling", "Normalize"]
    assert np.abs(embeddings - expected).max() <= 1e-6
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-6)


def test_convert_into_an_existing_folder_is_refused_and_it_is_left_as_it_was(tmp_path, other_model):
    folder = tmp_path / "d"
    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(folder)
    before = {relative: (folder / relative).read_bytes() for relative in files_under(folder)}
    with pytest.raises(hfbert.CheckpointError, match="already exists"):
        convert(other_model, folder)
    assert {relative: (folder / relative).read_bytes() for relative in files_under(folder)} == before
    assert torch.equal(
        hfbert.BertModel.from_pretrained(folder).embeddings.word_embeddings.weight,
        hfbert.BertModel.from_pretrained(minilm_directory()).embeddings.word_embeddings.weight,
    )


def test_a_model_saved_beside_its_tokenizer_keeps_the_tokenizer(tmp_path):
    import transformers

    folder = tmp_path / "out"
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_directory())
    tokenizer.add_tokens(["hfbertword"])
    tokenizer.save_pretrained(folder)
    before = files_under(folder)
    text = "a hfbertword here"
    expected = tokenizer(text)["input_ids"]
    assert len(tokenizer) - 1 in expected  # the added token's id

    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(folder)
    after = files_under(folder)
    assert {name: after.get(name) for name in before} == before  # nothing deleted, nothing overwritten
    assert transformers.AutoTokenizer.from_pretrained(folder)(text)["input_ids"] == expected
    assert hfbert.BertTokenizer.from_pretrained(folder)(text)["input_ids"] == expected
    # Saved again (the model's own files now exist): still only config and weights change.
    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(folder)
    assert {name: files_under(folder).get(name) for name in before} == before


def test_a_save_removes_only_weight_files_of_its_own_naming(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    others = ["tokenizer.json", "special_tokens_map.json", "modules.json", "config_sentence_transformers.json"]
    others += ["2_Dense/model.safetensors", "pytorch_model.bin", "adapter_model.safetensors", "model.fp16.safetensors"]
    stale = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    for relative in others + stale:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text("old")
    directory = write_random_transformers_checkpoint(tmp_path / "small", **SMALL_CONFIG)
    hfbert.BertModel.from_pretrained(directory).save_pretrained(folder)
    present = set(files_under(folder))
    assert present == {*others, "config.json", "model.safetensors"}
    assert all((folder / relative).read_text() == "old" for relative in others)
    # A pytorch_model.bin save: the safetensors weights would be loaded instead of it, so they go too.
    hfbert.BertModel.from_pretrained(directory).save_pretrained(folder, safe_serialization=False)
    assert set(files_under(folder)) == (present - {"model.safetensors"}) | {"pytorch_model.bin"}
    assert (folder / "tokenizer.json").read_text() == "old"
    reloaded = hfbert.BertModel.from_pretrained(folder)
    original = hfbert.BertModel.from_pretrained(directory)
    assert reloaded.state_dict().keys() == original.state_dict().keys()
    assert all(torch.equal(reloaded.state_dict()[name], tensor) for name, tensor in original.state_dict().items())
