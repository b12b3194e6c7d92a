"""DistilBERT's tokenizer against transformers' DistilBertTokenizerFast (issue #68): BERT's WordPiece, whose calls
return no token types.

Two folders as DistilBERT checkpoints ship them: bert-base-uncased's byte-exact vocab.txt + a tokenizer_config.json
without `tokenizer_class` beside a config.json of model_type "distilbert" (distilbert-base-uncased's layout: the model
type picks the class), and all-MiniLM-L6-v2's tokenizer.json under `tokenizer_class: DistilBertTokenizer` (what
transformers 5 writes). Every expected value is what transformers' DistilBertTokenizerFast returns for the same
folder; BERT's checks of the pipeline, single texts, pairs, padding, truncation, tensors and decoding are collected
here again on this module's `pair`s.

By model_type alone transformers 5's AutoTokenizer picks its BertTokenizer (4.x picked DistilBertTokenizer), which
adds token types that its DistilBERT then drops unseen; hfbert's picks DistilBertTokenizer, with the same ids and
masks and no token types, since its DistilBERT refuses non-zero ones (`test_by_model_type_...`).
"""

from __future__ import annotations

import json
import shutil

import pytest
import transformers

# BERT's checks, collected here again on this module's `pair`s.
from test_tokenizer import (  # noqa: F401
    CORPUS,
    PAIRS,
    copy_tokenizer_files,
    test_batch_padding,
    test_decode,
    test_pairs,
    test_return_tensors_pt,
    test_same_pipeline_as_transformers,
    test_single_text,
    test_truncation_pairs,
)

import hfbert

from support.checkpoints import REFERENCE
from support.helpers import minilm_directory


@pytest.fixture(scope="module", params=["bert-base-uncased vocab.txt by model_type", "MiniLM tokenizer.json by class"])
def pair(request, tmp_path_factory):
    """(hfbert's AutoTokenizer, transformers' AutoTokenizer) on the same DistilBERT folder."""
    directory = tmp_path_factory.mktemp("distilbert-tokenizer")
    if request.param.startswith("bert-base"):
        copy_tokenizer_files(directory, REFERENCE)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        assert "tokenizer_class" not in config
        (directory / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
    else:
        for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            if (minilm_directory() / name).is_file():
                shutil.copy(minilm_directory() / name, directory / name)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(
            json.dumps({**config, "tokenizer_class": "DistilBertTokenizer"})
        )
    reference = transformers.DistilBertTokenizerFast.from_pretrained(directory)
    assert reference("Hello world")["input_ids"] == [101, 7592, 2088, 102]  # real words, not [UNK]
    return hfbert.AutoTokenizer.from_pretrained(directory), reference


def test_by_model_type_ids_and_masks_are_transformers_autotokenizers(tmp_path):
    copy_tokenizer_files(tmp_path, REFERENCE)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
    ours, reference = (
        hfbert.AutoTokenizer.from_pretrained(tmp_path),
        transformers.AutoTokenizer.from_pretrained(tmp_path),
    )
    assert (type(ours).__name__, type(reference).__name__) == ("DistilBertTokenizer", "BertTokenizer")
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    for arguments in ((CORPUS,), (firsts, seconds)):
        expected = reference(*arguments, padding=True).data
        assert "token_type_ids" in expected
        del expected["token_type_ids"]
        assert dict(ours(*arguments, padding=True)) == expected


def test_the_class_and_its_inputs_are_distilberts(pair):
    ours, reference = pair
    assert type(ours).__name__ == "DistilBertTokenizer"
    assert list(ours.model_input_names) == list(reference.model_input_names) == ["input_ids", "attention_mask"]
    assert set(ours(CORPUS[:3], [p[1] for p in PAIRS[:3]])) == {"input_ids", "attention_mask"}
    # Asked for, token types come as transformers gives them (segment ids of a pair), for a BERT body beside it.
    asked = dict(return_token_type_ids=True)
    assert ours(*PAIRS[0], **asked)["token_type_ids"] == reference(*PAIRS[0], **asked)["token_type_ids"]


def test_saved_tokenizer_is_distilberts_in_transformers(pair, tmp_path):
    ours, reference = pair
    ours.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"] == "DistilBertTokenizer"
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "DistilBertTokenizer"
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    assert reloaded(firsts, seconds, padding=True).data == reference(firsts, seconds, padding=True).data
