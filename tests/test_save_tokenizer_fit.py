"""A save never deletes or overwrites tokenizer files (as transformers' `save_pretrained`, which writes none), so a
folder can end up pairing new weights with a tokenizer that is not theirs. That is never silent: `save_pretrained`
warns naming the files when the folder keeps a tokenizer of another vocabulary than the checkpoint the model came
from, or one whose ids run past the model's word embeddings; `hfbert inspect` shows a tokenizer that does not fit.

Judged against transformers: its `AutoTokenizer` on the folder gives the ids the warning is about, and its
`BertModel` cannot embed the ids named as past its rows.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import files_under, minilm_directory

TEXT = "hello world"
MINILM_IDS = [101, 7592, 2088, 102]


def save_warnings(model: torch.nn.Module, folder: Path) -> list[str]:
    """The messages of the warnings `model.save_pretrained(folder)` gives about the folder's tokenizer."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_pretrained(folder)
    return [str(warning.message) for warning in caught if "save_pretrained into" in str(warning.message)]


def test_a_save_over_another_models_tokenizer_warns_naming_its_files_and_deletes_nothing(tmp_path, other_model):
    import transformers

    folder = tmp_path / "d"
    hfbert.BertModel.from_pretrained(other_model).save_pretrained(folder)
    before = files_under(folder)
    (message,) = save_warnings(hfbert.BertModel.from_pretrained(minilm_directory()), folder)
    assert "tokenizer_config.json, vocab.txt" in message and "another vocabulary" in message
    assert str(folder) in message and str(minilm_directory()) in message
    assert "tokenizer.save_pretrained" in message  # the way out
    # Nothing deleted or overwritten but the model's own files; the folder really pairs MiniLM with the other
    # model's tokenizer, as the warning says.
    after = files_under(folder)
    assert {name: after[name] for name in before if name not in ("config.json", "model.safetensors")} == {
        name: content for name, content in before.items() if name not in ("config.json", "model.safetensors")
    }
    assert transformers.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == [2, 12, 13, 3]
    assert transformers.AutoTokenizer.from_pretrained(minilm_directory())(TEXT)["input_ids"] == MINILM_IDS

    # The way out: the model's tokenizer saved there (as Trainer and sentence-transformers do right after the
    # model); later saves are silent.
    transformers.AutoTokenizer.from_pretrained(minilm_directory()).save_pretrained(folder)
    assert save_warnings(hfbert.BertModel.from_pretrained(minilm_directory()), folder) == []
    assert transformers.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"] == MINILM_IDS


def test_a_kept_tokenizer_with_ids_past_the_embeddings_is_named_with_those_ids(tmp_path, other_model):
    import transformers

    folder = tmp_path / "d"
    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(folder)
    (message,) = save_warnings(hfbert.BertModel.from_pretrained(other_model), folder)
    assert "tokenizer.json" in message and "another vocabulary" in message
    assert "30508 id(s) past the model's 14 rows" in message and "'[unused13]' = 14" in message
    ids = transformers.AutoTokenizer.from_pretrained(folder)(TEXT)["input_ids"]
    assert ids == MINILM_IDS
    with pytest.raises(IndexError):  # transformers cannot embed them either
        transformers.BertModel.from_pretrained(folder)(input_ids=torch.tensor([ids]))


def test_an_added_token_saved_first_is_silent_once_the_embeddings_are_resized(tmp_path):
    import transformers

    folder = tmp_path / "out"
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_directory())
    tokenizer.add_tokens(["hfbertword"])
    tokenizer.save_pretrained(folder)
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    added = tokenizer.convert_tokens_to_ids("hfbertword")
    (message,) = save_warnings(model, folder)  # the same vocabulary, but one id more than the model has rows
    assert f"1 id(s) past the model's 30522 rows of word embeddings: 'hfbertword' = {added}" in message
    assert "another vocabulary" not in message and "resize_token_embeddings(len(tokenizer))" in message

    model.resize_token_embeddings(len(tokenizer))
    assert save_warnings(model, folder) == []
    assert save_warnings(model, folder) == []  # saved again: the model's own files are there now
    assert transformers.AutoTokenizer.from_pretrained(folder)("a hfbertword")["input_ids"][2] == added


def test_a_copied_tokenizer_that_does_not_fit_warns_and_a_fresh_save_is_silent(tmp_path):
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    assert save_warnings(model, tmp_path / "fresh") == []
    model.resize_token_embeddings(100)
    (message,) = save_warnings(model, tmp_path / "smaller")
    assert f"copies from {minilm_directory()}" in message and "30422 id(s) past the model's 100 rows" in message


# -- hfbert inspect ------------------------------------------------------------------------------------------------


def minilm_with(tmp_path: Path, tokenizer_config: dict | None = None, added: tuple[str, ...] = ()) -> Path:
    """MiniLM's weights and config beside its tokenizer with `added` tokens (and `tokenizer_config` over its
    tokenizer_config.json), saved by transformers."""
    import shutil

    import transformers

    folder = tmp_path / "minilm"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(minilm_directory() / name, folder / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_directory())
    tokenizer.add_tokens(list(added))
    tokenizer.save_pretrained(folder)
    if tokenizer_config:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, **tokenizer_config}))
    return folder


def test_inspect_names_tokens_past_the_vocabulary_with_transformers_ids(tmp_path, capsys):
    import transformers

    from hfbert.cli import main
    from hfbert.tools.inspect import describe, summary

    folder = minilm_with(tmp_path, added=("hfbertalpha", "hfbertbeta"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    facts = summary(folder)["tokenizer"]
    assert facts["tokens"] == len(tokenizer) == 30524 and facts["largest_id"] == 30523
    (problem,) = facts["problems"]
    ids = tokenizer.convert_tokens_to_ids(["hfbertalpha", "hfbertbeta"])
    assert "2 token id(s) past the model's vocab_size 30522" in problem
    assert f"'hfbertalpha' = {ids[0]}, 'hfbertbeta' = {ids[1]}" in problem
    assert "warning     tokenizer: 2 token id(s)" in describe(folder)
    capsys.readouterr()
    assert main(["inspect", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"]["problems"] == [problem]


def test_inspect_names_a_model_max_length_past_the_positions_and_a_tokenizer_it_cannot_build(tmp_path):
    from hfbert.tools.inspect import summary

    facts = summary(minilm_with(tmp_path, {"model_max_length": 1024}))["tokenizer"]
    assert facts["model_max_length"] == 1024
    assert facts["problems"] == [
        "model_max_length 1024 is more than the model's max_position_embeddings 512: texts truncated to it can be "
        "longer than the model takes"
    ]
    folder = tmp_path / "minilm"
    (folder / "tokenizer.json").unlink()
    (problem,) = summary(folder)["tokenizer"]["problems"]
    assert problem.startswith("cannot be built:") and "no tokenizer.json or vocab.txt" in problem


def test_inspect_of_a_tokenizer_that_fits_shows_no_warning():
    from hfbert.tools.inspect import describe, summary

    facts = summary(minilm_directory())["tokenizer"]
    assert facts["problems"] == [] and facts["tokens"] == 30522 and facts["model_max_length"] == 512
    assert "warning" not in describe(minilm_directory())
    assert "tokenizer   30522 tokens, ids up to 30521 (the model has 30522 rows), model_max_length 512" in describe(
        minilm_directory()
    )
