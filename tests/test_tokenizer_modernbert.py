"""ModernBERT's tokenizer against transformers 5's AutoTokenizer on the same folder.

The folders are made by `support.modernbert_tokenizer`: a byte-level BPE trained with the tokenizers library, in
ModernBERT's pipeline (NFC, ByteLevel, `[CLS] $A [SEP] ($B [SEP])`, `[MASK]` taking the space before it), written by
transformers' `save_pretrained` and then given the Hub's tokenizer_config.json ("PreTrainedTokenizerFast"), or left
as transformers 5 writes it ("TokenizersBackend"). transformers loads both with its generic TokenizersBackend, which
runs tokenizer.json as it is. Every expected value is what `transformers.AutoTokenizer.from_pretrained(folder)`
returns, compared element-wise: ids, attention masks, offsets, decoded texts, tokens and the whole backend pipeline.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import transformers

# test_same_pipeline_as_transformers: BERT's check, collected here again on this module's `pair`s.
from test_tokenizer import CORPUS, PAIRS, WITH_OFFSETS, assert_same, test_same_pipeline_as_transformers  # noqa: F401

import hfbert
from hfbert.modeling.tokenizer import ModernBertTokenizer

from support.helpers import MINILM_TOKENIZER_FILES, minilm_directory
from support.modernbert_tokenizer import SPECIAL_TOKEN_IDS, VOCAB_SIZE, modernbert_tokenizer

TEXTS = CORPUS + [
    "Hello [MASK] world",
    "[MASK] first and last [MASK]",
    "joined[MASK]text and  [MASK]  spaced",
    "an |||IP_ADDRESS||| and <|endoftext|> [unused0] <|padding|>",
    "runs  of   spaces    and     more",
    "  \n\t ",
    "It's a dog , isn't it ? We 're here .",
    "decomposed cafe\u0301 and composed café",
]
MODERNBERT_PAIRS = PAIRS + [("Hello [MASK] world", "the second [MASK] text"), (" ", "   ")]
NAMES = ("unk", "sep", "pad", "cls", "mask")


def with_config(source: Path, directory: Path, **fields) -> Path:
    """A copy of `source` with tokenizer_config.json's `fields` set."""
    shutil.copytree(source, directory)
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return directory


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory) -> Path:
    return modernbert_tokenizer(tmp_path_factory.mktemp("modernbert-hub"))


@pytest.fixture(scope="module", params=["PreTrainedTokenizerFast", "TokenizersBackend"])
def pair(request, hub_folder, tmp_path_factory):
    """(hfbert tokenizer, transformers tokenizer) loaded from the same folder."""
    if request.param == "PreTrainedTokenizerFast":
        directory = hub_folder
    else:
        directory = modernbert_tokenizer(tmp_path_factory.mktemp("modernbert-5"), tokenizer_class=request.param)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert type(reference).__name__ == "TokenizersBackend"
    return ModernBertTokenizer.from_pretrained(directory), reference


def test_reference_knows_real_words(pair):
    ours, reference = pair
    ids = reference("The quick brown fox jumps over the lazy dog.")["input_ids"]
    assert len(ids) > 5 and reference.unk_token_id not in ids
    assert ids[0] == SPECIAL_TOKEN_IDS["[CLS]"] and ids[-1] == SPECIAL_TOKEN_IDS["[SEP]"]
    assert ours("The quick brown fox jumps over the lazy dog.")["input_ids"] == ids


def test_attributes(pair):
    ours, reference = pair
    assert ours.model_input_names == tuple(reference.model_input_names) == ("input_ids", "attention_mask")
    assert [getattr(ours, f"{name}_token") for name in NAMES] == [getattr(reference, f"{name}_token") for name in NAMES]
    ids = [getattr(ours, f"{name}_token_id") for name in NAMES]
    assert ids == [getattr(reference, f"{name}_token_id") for name in NAMES]
    assert ids == [SPECIAL_TOKEN_IDS[f"[{name.upper()}]"] for name in NAMES]
    assert (ours.vocab_size, ours.model_max_length) == (reference.vocab_size, reference.model_max_length)
    assert len(ours) == len(reference) == VOCAB_SIZE and ours.get_vocab() == reference.get_vocab()
    assert (ours.padding_side, ours.truncation_side) == (reference.padding_side, reference.truncation_side)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_single_text(pair, text):
    ours, reference = pair
    assert_same(ours(text, **WITH_OFFSETS), reference(text, **WITH_OFFSETS))
    assert ours.tokenize(text) == reference.tokenize(text)


def test_batches_and_no_token_types(pair):
    ours, reference = pair
    encoded = ours(TEXTS, **WITH_OFFSETS)
    assert "token_type_ids" not in encoded and "token_type_ids" not in ours(TEXTS[0])
    assert_same(encoded, reference(TEXTS, **WITH_OFFSETS))
    # Asked for, they come: the template's types (0 for the first text, 1 for the second).
    arguments = dict(return_token_type_ids=True, return_attention_mask=False)
    assert_same(ours(TEXTS[:4], TEXTS[4:8], **arguments), reference(TEXTS[:4], TEXTS[4:8], **arguments))


def test_mask_takes_the_space_before_it(pair):
    ours, reference = pair
    encoded = ours("Hello [MASK] world", **WITH_OFFSETS)
    assert_same(encoded, reference("Hello [MASK] world", **WITH_OFFSETS))
    position = encoded["input_ids"].index(ours.mask_token_id)
    # The space the mask took is in its offsets, and no token of its own.
    assert encoded["offset_mapping"][position] == (5, 12)
    assert ours("Hello [MASK]")["input_ids"] == ours("Hello[MASK]")["input_ids"]


def test_pairs(pair):
    ours, reference = pair
    for first, second in MODERNBERT_PAIRS:
        assert_same(ours(first, second, **WITH_OFFSETS), reference(first, second, **WITH_OFFSETS))
    firsts, seconds = [p[0] for p in MODERNBERT_PAIRS], [p[1] for p in MODERNBERT_PAIRS]
    assert_same(ours(firsts, seconds, **WITH_OFFSETS), reference(firsts, seconds, **WITH_OFFSETS))
    ids = ours("Hello", "world")["input_ids"]
    assert ids[0] == ours.cls_token_id and ids.count(ours.sep_token_id) == 2  # [CLS] A [SEP] B [SEP]


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_padding_and_tensors(pair, padding_side):
    ours, reference = pair
    for arguments in (dict(padding=True), dict(padding="longest"), dict(padding="max_length", max_length=96)):
        arguments = dict(arguments, padding_side=padding_side, truncation=True, **WITH_OFFSETS)
        assert_same(ours(TEXTS, **arguments), reference(TEXTS, **arguments))
        assert_same(ours(TEXTS, **arguments, return_tensors="pt"), reference(TEXTS, **arguments, return_tensors="pt"))
    assert_same(ours(TEXTS[0], return_tensors="pt"), reference(TEXTS[0], return_tensors="pt"))


def same_outcome(ours, reference, *args, **kwargs) -> bool:
    """Whether transformers encodes: then ours gives the same encoding; else ours raises the same exception type."""
    try:
        expected = reference(*args, **kwargs)
    except Exception as error:  # the Rust backend refuses: the chosen text is too short to reach max_length
        with pytest.raises(type(error)):
            ours(*args, **kwargs)
        return False
    assert_same(ours(*args, **kwargs), expected)
    return True


@pytest.mark.parametrize("strategy", [True, "longest_first", "only_first", "only_second"])
def test_truncation(pair, strategy):
    ours, reference = pair
    arguments = dict(truncation=strategy, max_length=12, **WITH_OFFSETS)
    encoded = [same_outcome(ours, reference, first, second, **arguments) for first, second in MODERNBERT_PAIRS]
    assert sum(encoded) >= 4
    for text in TEXTS:
        same_outcome(ours, reference, text, **arguments)
    firsts, seconds = [p[0] for p in MODERNBERT_PAIRS[:4]], [p[1] for p in MODERNBERT_PAIRS[:4]]
    same_outcome(ours, reference, firsts, seconds, padding=True, **arguments)
    if strategy is True:  # max_length alone turns truncation on
        assert_same(ours(TEXTS, max_length=8), reference(TEXTS, max_length=8))


def test_decode(pair):
    ours, reference = pair
    rows = [reference(text)["input_ids"] for text in TEXTS + [f"{a} {b}" for a, b in MODERNBERT_PAIRS]]
    for skip in (True, False):  # ours skips special tokens by default, transformers does not
        assert [ours.decode(ids, skip_special_tokens=skip) for ids in rows] == reference.batch_decode(
            rows, skip_special_tokens=skip
        )
        for clean_up in (True, False):  # byte-level BPE: no clean-up either way, as transformers 5
            arguments = dict(skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
            assert [ours.decode(ids, **arguments) for ids in rows] == reference.batch_decode(rows, **arguments)
        tokens = [reference.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows]
        assert [ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows] == tokens
    batch = reference(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    assert ours.decode(batch) == reference.batch_decode(batch, skip_special_tokens=True)
    assert ours.decode(reference("It's a dog , isn't it ?")["input_ids"]) == "It's a dog , isn't it ?"


def test_save_pretrained_loads_the_same_in_both(pair, tmp_path):
    ours, reference = pair
    ours.save_pretrained(tmp_path)
    assert not (tmp_path / "vocab.txt").exists()
    expected = reference(TEXTS, TEXTS[::-1], **WITH_OFFSETS)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded).__name__ == "TokenizersBackend"
    assert_same(reloaded(TEXTS, TEXTS[::-1], **WITH_OFFSETS), expected)
    assert_same(ModernBertTokenizer.from_pretrained(tmp_path)(TEXTS, TEXTS[::-1], **WITH_OFFSETS), expected)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "modernbert"}))  # as beside a saved model
    auto = hfbert.AutoTokenizer.from_pretrained(tmp_path)
    assert type(auto) is ModernBertTokenizer
    assert_same(auto(TEXTS, TEXTS[::-1], **WITH_OFFSETS), expected)
    rows = expected["input_ids"]
    assert reloaded.batch_decode(rows) == [ours.decode(ids, skip_special_tokens=False) for ids in rows]


@pytest.mark.parametrize(
    "fields",
    [
        {"padding_side": "left", "truncation_side": "left"},
        {"model_max_length": 16},
        {"model_input_names": ["input_ids", "token_type_ids", "attention_mask"]},
        {"clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True},
        {"split_special_tokens": True},
    ],
    ids=lambda fields: next(iter(fields)),
)
def test_call_defaults_from_tokenizer_config(hub_folder, tmp_path, fields):
    directory = with_config(hub_folder, tmp_path / "folder", **fields)
    ours, reference = (
        ModernBertTokenizer.from_pretrained(directory),
        transformers.AutoTokenizer.from_pretrained(directory),
    )
    firsts, seconds = [p[0] for p in MODERNBERT_PAIRS], [p[1] for p in MODERNBERT_PAIRS]
    for arguments in (dict(padding=True), dict(padding=True, truncation=True, max_length=12), dict(truncation=True)):
        assert_same(ours(TEXTS, **arguments, **WITH_OFFSETS), reference(TEXTS, **arguments, **WITH_OFFSETS))
        same_outcome(ours, reference, firsts, seconds, **arguments, **WITH_OFFSETS)
    rows = reference(TEXTS)["input_ids"]
    assert [ours.decode(ids) for ids in rows] == reference.batch_decode(rows, skip_special_tokens=True)


@pytest.mark.parametrize(
    "change",
    ["mask flags in added_tokens_decoder", "token only in added_tokens_decoder", "no post-processor", "legacy"],
)
def test_tokenizer_json_and_config_disagree(hub_folder, tmp_path, change):
    """transformers runs tokenizer.json as it is, but re-adds each token the config lists otherwise (its flags win),
    builds a template without [CLS] / [SEP] for a file with no post-processor, and reads special_tokens_map.json
    for a config without added_tokens_decoder."""
    directory = shutil.copytree(hub_folder, tmp_path / "folder")
    config_file, tokenizer_file = directory / "tokenizer_config.json", directory / "tokenizer.json"
    config, tokenizer = json.loads(config_file.read_text()), json.loads(tokenizer_file.read_text())
    decoder = config["added_tokens_decoder"]
    if change == "mask flags in added_tokens_decoder":
        decoder[str(SPECIAL_TOKEN_IDS["[MASK]"])]["lstrip"] = False
    elif change == "token only in added_tokens_decoder":
        decoder[str(VOCAB_SIZE)] = {"content": "newword", "normalized": True, "special": False}
    elif change == "no post-processor":
        tokenizer["post_processor"] = None
    else:
        del config["added_tokens_decoder"]
    config_file.write_text(json.dumps(config))
    tokenizer_file.write_text(json.dumps(tokenizer))
    ours, reference = (
        ModernBertTokenizer.from_pretrained(directory),
        transformers.AutoTokenizer.from_pretrained(directory),
    )
    test_same_pipeline_as_transformers((ours, reference))
    texts = ["Hello [MASK] world newword", "a [MASK]", "", "runs  of   spaces"]
    assert_same(ours(texts, texts[::-1], **WITH_OFFSETS), reference(texts, texts[::-1], **WITH_OFFSETS))


@pytest.mark.parametrize(
    "tokenizer_class",
    [
        "PreTrainedTokenizerFast",
        "TokenizersBackend",
        None,
        "BertTokenizerFast",  # transformers 5 loads model_type modernbert generically, whatever this says
    ],
)
def test_auto_tokenizer_picks_modernbert_by_model_type(hub_folder, tmp_path, tokenizer_class):
    directory = shutil.copytree(hub_folder, tmp_path / "folder")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class")
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(reference).__name__ == "TokenizersBackend"
    assert type(ours).__name__ == "ModernBertTokenizer"
    assert_same(ours(TEXTS, TEXTS[::-1], **WITH_OFFSETS), reference(TEXTS, TEXTS[::-1], **WITH_OFFSETS))


@pytest.mark.parametrize("tokenizer_class", ["PreTrainedTokenizerFast", "PreTrainedTokenizer", "TokenizersBackend"])
def test_a_generic_tokenizer_class_leaves_the_choice_to_model_type(tmp_path, tokenizer_class):
    """transformers' generic names say only "run tokenizer.json": config.json's model_type picks the class."""
    directory = tmp_path / "folder"
    directory.mkdir()
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(minilm_directory() / name, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": tokenizer_class}))
    (directory / "config.json").write_text(json.dumps({"model_type": "mpnet"}))
    assert type(hfbert.AutoTokenizer.from_pretrained(directory)).__name__ == "MPNetTokenizer"
    (directory / "config.json").unlink()
    assert type(hfbert.AutoTokenizer.from_pretrained(directory)).__name__ == "BertTokenizer"


@pytest.mark.parametrize("how", ["ModernBertTokenizer", "AutoTokenizer"])
def test_a_folder_without_tokenizer_json_is_refused_naming_it(hub_folder, tmp_path, how):
    directory = tmp_path / "no-tokenizer-json"
    directory.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(hub_folder / name, directory)
    (directory / "config.json").write_text(json.dumps({"model_type": "modernbert"}))
    with pytest.raises(Exception):  # noqa: B017 (transformers' error type varies; that it refuses is the point)
        transformers.AutoTokenizer.from_pretrained(directory)
    loader = ModernBertTokenizer if how == "ModernBertTokenizer" else hfbert.AutoTokenizer
    with pytest.raises(FileNotFoundError) as refused:
        loader.from_pretrained(directory)
    assert str(directory) in str(refused.value) and "no tokenizer.json" in str(refused.value)


def test_a_wordpiece_tokenizer_json_is_refused_naming_the_file(tmp_path):
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy(minilm_directory() / name, tmp_path)
    with pytest.raises(ValueError, match=r"tokenizer.json: field 'model' is a WordPiece model; ModernBertTokenizer"):
        ModernBertTokenizer.from_pretrained(tmp_path)
