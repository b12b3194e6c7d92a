"""DeBERTa-v2 / v3's SentencePiece tokenizer against transformers' DebertaV2Tokenizer on the family's hard texts:
tokenizer.json written by transformers itself from a vocabulary trained here (with and without SentencePiece's
precompiled charsmap, with its options: `do_lower_case`, `split_by_punct`, `add_prefix_space`), singles, pairs (token
types 0 then 1), padding both sides, truncation, decoding; a folder with only the slow `spm.model` refused naming it;
and, where the sentencepiece library is installed, a tokenizer converted from an `spm.model` trained by it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tokenizer import CORPUS, PAIRS, WITH_OFFSETS, assert_same
from test_tokenizer_roberta import PRECOMPILED_CHARSMAP
from tokenizers import SentencePieceUnigramTokenizer

import hfbert

from support.deberta import SPECIALS, deberta_tokenizer, sentencepiece_tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = CORPUS + [
    "Hello [MASK] world",
    "[MASK] first and last [MASK]",
    "joined[MASK]text and  [MASK]  spaced",
    "[CLS] literal [SEP] special [PAD] tokens [UNK]",
    "CAPITALS Stay CAPITALS, Punctuation!Splits?(maybe)",
    "fullwidth ＡＢＣ, ligature ﬁ, circled ①, Å and ideographic\u3000space",
    " leading space",
    "trailing space ",
    "tabs\tand\nnewlines\r\nand   runs     of spaces",
]
DEBERTA_PAIRS = PAIRS + [("Hello [MASK] world", "the second [MASK] text")]


def precompiled_folder(directory: Path) -> Path:
    """As DeBERTa's published tokenizer.json: SentencePiece's precompiled charsmap in the normalizer."""
    trained = SentencePieceUnigramTokenizer()
    trained.train_from_iterator(TEXTS * 3, vocab_size=250, special_tokens=SPECIALS, unk_token="[UNK]")
    vocab = [tuple(entry) for entry in json.loads(trained.to_str())["model"]["vocab"]]
    tokenizer = transformers.DebertaV2Tokenizer(
        vocab=vocab, _spm_precompiled_charsmap=PRECOMPILED_CHARSMAP, model_max_length=48
    )
    tokenizer.save_pretrained(directory)
    assert "Precompiled" in (directory / "tokenizer.json").read_text()
    return directory


FOLDERS = {
    "plain": lambda directory: deberta_tokenizer(directory, model_max_length=48),
    "precompiled": precompiled_folder,
    "lowercase": lambda directory: deberta_tokenizer(directory, do_lower_case=True),
    "split-by-punct": lambda directory: deberta_tokenizer(directory, split_by_punct=True),
    "no-prefix-space": lambda directory: deberta_tokenizer(directory, add_prefix_space=False),
    "sentencepiece": sentencepiece_tokenizer,  # skips without the sentencepiece and protobuf packages
}


@pytest.fixture(scope="module", params=list(FOLDERS))
def pair(request, tmp_path_factory):
    """(hfbert tokenizer, transformers tokenizer), each loaded by its AutoTokenizer from the same folder."""
    directory = FOLDERS[request.param](tmp_path_factory.mktemp(request.param))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(ours).__name__ == "DebertaV2Tokenizer" and type(reference).__name__ == "DebertaV2Tokenizer"
    return ours, reference


def test_attributes(pair):
    ours, reference = pair
    assert ours.model_input_names == tuple(reference.model_input_names)
    names = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    assert [getattr(ours, f"{name}_token") for name in names] == [getattr(reference, f"{name}_token") for name in names]
    assert [getattr(ours, f"{name}_token_id") for name in names] == [
        getattr(reference, f"{name}_token_id") for name in names
    ]
    assert len(ours) == len(reference) and ours.get_vocab() == reference.get_vocab()


def test_single_texts_split_into_many_ids_as_transformers(pair):
    ours, reference = pair
    for text in TEXTS:
        assert_same(ours(text, **WITH_OFFSETS), reference(text, **WITH_OFFSETS))
        assert ours.tokenize(text) == reference.tokenize(text)
    assert sum(len(ours(text)["input_ids"]) for text in CORPUS) > 3 * len(CORPUS)  # the vocabulary splits words


def test_pairs_give_token_types_zero_then_one(pair):
    ours, reference = pair
    firsts, seconds = [a for a, _ in DEBERTA_PAIRS], [b for _, b in DEBERTA_PAIRS]
    encoded = ours(firsts, seconds)
    assert_same(encoded, reference(firsts, seconds))
    assert set(encoded["token_type_ids"][0]) == {0, 1}


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_padding_truncation_and_tensors(pair, padding_side):
    ours, reference = pair
    options = {"padding": True, "padding_side": padding_side, "return_tensors": "pt"}
    assert_same(ours(TEXTS, **options), reference(TEXTS, **options))
    truncated = {**options, "truncation": True, "max_length": 9}
    assert_same(ours(TEXTS, **truncated), reference(TEXTS, **truncated))
    firsts, seconds = [a for a, _ in DEBERTA_PAIRS], [b for _, b in DEBERTA_PAIRS]
    assert_same(ours(firsts, seconds, **truncated), reference(firsts, seconds, **truncated))


def test_decoding(pair):
    ours, reference = pair
    for text in TEXTS:
        ids = reference(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)


def test_what_hfbert_saves_loads_as_the_same_tokenizer(pair, tmp_path):
    ours, reference = pair
    ours.save_pretrained(tmp_path)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(again).__name__ == "DebertaV2Tokenizer"
    assert_same(again(TEXTS), reference(TEXTS))


def test_a_folder_with_only_spm_model_is_refused_naming_the_file(tmp_path):
    (tmp_path / "spm.model").write_bytes(b"\x00")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "DebertaV2Tokenizer"}))
    with pytest.raises(ValueError, match=r"spm\.model: DeBERTa's slow SentencePiece file.*no tokenizer\.json"):
        hfbert.AutoTokenizer.from_pretrained(tmp_path)
