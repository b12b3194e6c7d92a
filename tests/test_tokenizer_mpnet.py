"""MPNet's tokenizer (all-mpnet-base-v2) against transformers' MPNetTokenizerFast (issue #42).

The real all-mpnet-base-v2 folder (the `real_mpnet` fixture, read-only) is loaded three ways: as it is (tokenizer.json
+ a legacy tokenizer_config.json + special_tokens_map.json); from vocab.txt + tokenizer_config.json alone (so `<mask>`
takes the space before it by MPNet's own rule, not by a stored flag); and with a tokenizer.json that stores another
pipeline (a Lowercase normalizer, BERT's `[CLS] A [SEP]` template) under a config with `do_lower_case: false`, which
transformers rebuilds from the config. Every expected value is what `transformers.AutoTokenizer.from_pretrained` returns
for the same folder, compared element-wise: ids, attention masks, token types when asked for, offsets, tokens, decoded
texts, and the whole backend pipeline. The texts are real: hfbert's parity sentences and the model card's lines.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers

# test_same_pipeline_as_transformers: BERT's check, collected here again on this module's `pair`s.
from test_tokenizer import CORPUS, PAIRS, WITH_OFFSETS, assert_same, test_same_pipeline_as_transformers  # noqa: F401

# RoBERTa's checks of the `<s> A </s></s> B </s>` framing and of padding, collected here again on this module's `pair`s.
from test_tokenizer_roberta import same_outcome, test_padding_and_tensors, test_pairs_are_joined_by_two_separators  # noqa: F401

import hfbert
from hfbert.tools.parity import default_texts

MASKED = [
    "Hello <mask> world",
    "<mask> first and last <mask>",
    "joined<mask>text and  <mask>  spaced",
    "Paris is the <mask> of France.",
    "<s> literal </s> special <pad> tokens <unk> [UNK] [PAD]",
    "CAPITALS and Accents: ÉCOLE, Ångström",
]
MPNET_PAIRS = PAIRS + [
    ("Paris is the <mask> of France.", "It is the capital."),
    ("How old is the universe?", "About 13.8 billion years."),
]


def card_lines(directory: Path) -> list[str]:
    """The model card's non-empty lines: markdown, code and prose, as a user's documents come."""
    return [line for line in (directory / "README.md").read_text(encoding="utf-8").splitlines() if line.strip()]


def vocab_folder(source: Path, directory: Path) -> Path:
    directory.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(source / name, directory / name)
    return directory


def restored_folder(source: Path, directory: Path) -> Path:
    """tokenizer.json stores a Lowercase normalizer and BERT's template; tokenizer_config.json says cased, accents
    kept. transformers' MPNetTokenizer takes only the vocabulary and added tokens from the file."""
    directory.mkdir()
    stored = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    stored["normalizer"] = {"type": "Lowercase"}
    stored["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<pad>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<pad>": {"id": "<pad>", "ids": [1], "tokens": ["<pad>"]}},
    }
    (directory / "tokenizer.json").write_text(json.dumps(stored), encoding="utf-8")
    config = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(do_lower_case=False, strip_accents=False)
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    shutil.copy(source / "special_tokens_map.json", directory)
    return directory


FOLDERS = ["as-published", "vocab.txt", "restored-pipeline"]


@pytest.fixture(scope="module", params=FOLDERS)
def pair(request, real_mpnet, tmp_path_factory):
    """(hfbert tokenizer, transformers tokenizer) loaded from the same folder by each one's AutoTokenizer."""
    if request.param == "as-published":
        directory = real_mpnet
    elif request.param == "vocab.txt":
        directory = vocab_folder(real_mpnet, tmp_path_factory.mktemp("mpnet") / "vocab")
    else:
        directory = restored_folder(real_mpnet, tmp_path_factory.mktemp("mpnet") / "restored")
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(reference).__name__ == type(ours).__name__ == "MPNetTokenizer"
    return ours, reference


@pytest.fixture(scope="module")
def texts(real_mpnet) -> list[str]:
    return default_texts() + card_lines(real_mpnet)[:60] + CORPUS + MASKED


def test_attributes(pair):
    ours, reference = pair
    assert ours.model_input_names == tuple(reference.model_input_names) == ("input_ids", "attention_mask")
    names = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    assert [getattr(ours, f"{name}_token") for name in names] == [getattr(reference, f"{name}_token") for name in names]
    ids = [getattr(ours, f"{name}_token_id") for name in names]
    assert ids == [getattr(reference, f"{name}_token_id") for name in names] == [0, 2, 104, 2, 1, 0, 30526]
    assert (ours.vocab_size, ours.model_max_length) == (reference.vocab_size, reference.model_max_length)
    assert len(ours) == len(reference) and ours.get_vocab() == reference.get_vocab()


def test_single_texts(pair, texts):
    ours, reference = pair
    for text in texts:
        assert_same(ours(text, **WITH_OFFSETS), reference(text, **WITH_OFFSETS))
        tokens = reference.tokenize(text)
        assert ours.tokenize(text) == tokens
        assert ours.convert_tokens_to_ids(tokens) == reference.convert_tokens_to_ids(tokens)
    assert_same(ours(texts, **WITH_OFFSETS), reference(texts, **WITH_OFFSETS))
    assert_same(ours(texts, return_token_type_ids=True), reference(texts, return_token_type_ids=True))
    arguments = dict(padding=True, truncation=True, max_length=48, return_tensors="pt", **WITH_OFFSETS)
    assert_same(ours(texts, **arguments), reference(texts, **arguments))
    assert "token_type_ids" not in ours(texts[0]) and ours(texts[0], return_token_type_ids=True)["token_type_ids"]


def test_mask_takes_the_space_before_it(pair):
    ours, reference = pair
    for text in MASKED:
        ids = ours(text)["input_ids"]
        assert ids == reference(text)["input_ids"]
    assert ours("Hello <mask> world")["input_ids"] == ours("Hello<mask> world")["input_ids"]
    ids = ours("Hello <mask> world")["input_ids"]
    assert ids.count(ours.mask_token_id) == 1 and ids[0] == ours.cls_token_id and ids[-1] == ours.sep_token_id
    (mask,) = [
        token for token in ours.backend_tokenizer.get_added_tokens_decoder().values() if token.content == "<mask>"
    ]
    assert mask.lstrip and not mask.rstrip and mask.special


def test_lowercasing_follows_the_config(pair):
    ours, reference = pair
    lowered = ours("HELLO World")["input_ids"] == ours("hello world")["input_ids"]
    assert lowered == reference.do_lower_case == ours.backend_tokenizer.normalizer.lowercase


@pytest.mark.parametrize("strategy", [True, "longest_first", "only_first", "only_second"])
def test_truncation(pair, real_mpnet, strategy):
    ours, reference = pair
    arguments = dict(truncation=strategy, max_length=16, **WITH_OFFSETS)
    encoded = [same_outcome(ours, reference, first, second, **arguments) for first, second in MPNET_PAIRS]
    assert sum(encoded) >= 4
    if strategy is True:  # the whole model card: past model_max_length (512), cut there, max_length alone too
        card = (real_mpnet / "README.md").read_text(encoding="utf-8")
        assert len(reference(card)["input_ids"]) > 512
        for arguments in (dict(truncation=True), dict(max_length=100), dict(padding=True, truncation=True)):
            assert_same(ours([card, card[:900]], **arguments), reference([card, card[:900]], **arguments))


def test_decode(pair, texts):
    ours, reference = pair
    rows = [reference(text)["input_ids"] for text in texts + [f"{a} {b}" for a, b in MPNET_PAIRS]]
    rows.append(reference(*MPNET_PAIRS[0])["input_ids"])
    for skip in (True, False):  # ours skips special tokens by default, transformers does not
        decoded = reference.batch_decode(rows, skip_special_tokens=skip)
        assert [ours.decode(ids, skip_special_tokens=skip) for ids in rows] == decoded
        tokens = [reference.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows]
        assert [ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows] == tokens
    batch = reference(texts, padding=True, return_tensors="pt")["input_ids"]
    assert ours.decode(batch) == reference.batch_decode(batch, skip_special_tokens=True)


def test_save_pretrained_loads_the_same_in_both(pair, texts, tmp_path):
    ours, reference = pair
    ours.save_pretrained(tmp_path)
    expected = reference(texts, **WITH_OFFSETS)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded).__name__ == "MPNetTokenizer"
    assert_same(loaded(texts, **WITH_OFFSETS), expected)
    again = hfbert.AutoTokenizer.from_pretrained(tmp_path)
    assert type(again).__name__ == "MPNetTokenizer"
    assert_same(again(texts, **WITH_OFFSETS), expected)
    (tmp_path / "tokenizer.json").unlink()  # the vocab.txt written beside it makes a folder of the other shape
    expected = transformers.AutoTokenizer.from_pretrained(tmp_path)(texts, **WITH_OFFSETS)
    assert_same(hfbert.AutoTokenizer.from_pretrained(tmp_path)(texts, **WITH_OFFSETS), expected)


@pytest.mark.parametrize(
    ("tokenizer_class", "model_type", "expected"),
    [
        ("MPNetTokenizer", None, "MPNetTokenizer"),
        ("MPNetTokenizerFast", "bert", "MPNetTokenizer"),
        (None, "mpnet", "MPNetTokenizer"),
        ("BertTokenizer", "mpnet", "BertTokenizer"),
    ],
)
def test_auto_tokenizer_picks_the_class_transformers_picks(real_mpnet, tmp_path, tokenizer_class, model_type, expected):
    directory = tmp_path / "folder"
    directory.mkdir()
    shutil.copy(real_mpnet / "tokenizer.json", directory)
    config = json.loads((real_mpnet / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("tokenizer_class")
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if model_type is not None:
        (directory / "config.json").write_text(json.dumps({"model_type": model_type}), encoding="utf-8")
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(ours).__name__ == type(reference).__name__.removesuffix("Fast") == expected
    assert_same(ours(MASKED), reference(MASKED))
    if expected == "MPNetTokenizer":
        firsts, seconds = [p[0] for p in MPNET_PAIRS], [p[1] for p in MPNET_PAIRS]
        assert_same(ours(firsts, seconds), reference(firsts, seconds))


def test_a_config_that_names_no_tokens_gets_mpnets_defaults(real_mpnet, tmp_path):
    directory = vocab_folder(real_mpnet, tmp_path / "defaults")
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MPNetTokenizer"}))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    test_same_pipeline_as_transformers((ours, reference))
    assert (ours.unk_token, ours.mask_token, ours.model_max_length) == ("[UNK]", "<mask>", reference.model_max_length)
    assert_same(ours(MASKED, **WITH_OFFSETS), reference(MASKED, **WITH_OFFSETS))
    firsts, seconds = [p[0] for p in MPNET_PAIRS], [p[1] for p in MPNET_PAIRS]
    assert_same(ours(firsts, seconds, padding=True), reference(firsts, seconds, padding=True))


def test_bad_folders_are_named(real_mpnet, tmp_path):
    config = json.loads((real_mpnet / "tokenizer_config.json").read_text(encoding="utf-8"))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"empty: no tokenizer.json or vocab.txt \(MPNet's"):
        hfbert.AutoTokenizer.from_pretrained(empty)

    other_unk = vocab_folder(real_mpnet, tmp_path / "other-unk")
    (other_unk / "tokenizer_config.json").write_text(json.dumps({**config, "unk_token": "<oov>"}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.txt: the unk_token '<oov>' is not in the vocabulary"):
        hfbert.AutoTokenizer.from_pretrained(other_unk)

    bpe = tmp_path / "bpe"
    bpe.mkdir()
    (bpe / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    stored = {"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    (bpe / "tokenizer.json").write_text(json.dumps(stored), encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json: field 'model' is a BPE model; MPNetTokenizer takes"):
        hfbert.AutoTokenizer.from_pretrained(bpe)
