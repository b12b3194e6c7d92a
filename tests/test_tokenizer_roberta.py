"""RoBERTa's, XLM-RoBERTa's and CamemBERT's tokenizers against transformers' fast tokenizers (issue #41).

Each folder is made as transformers makes one: a tokenizer trained with the tokenizers library (byte-level BPE for
RoBERTa, a SentencePiece Unigram for XLM-R and CamemBERT), wrapped in transformers' RobertaTokenizerFast /
XLMRobertaTokenizerFast / CamembertTokenizerFast and written by its `save_pretrained`; RoBERTa also as vocab.json +
merges.txt + tokenizer_config.json, without tokenizer.json. Every expected value is what
`transformers.AutoTokenizer.from_pretrained(folder)` returns for the same folder, compared element-wise: ids,
attention masks, token types when asked for, offsets, decoded texts, and the whole backend pipeline.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import transformers

# test_same_pipeline_as_transformers: BERT's check, collected here again on this module's `pair`s.
from test_tokenizer import CORPUS, PAIRS, WITH_OFFSETS, assert_same, test_same_pipeline_as_transformers  # noqa: F401
from tokenizers import AddedToken, ByteLevelBPETokenizer, Regex, SentencePieceUnigramTokenizer, normalizers

import hfbert

from support.helpers import MINILM_TOKENIZER_FILES, minilm_directory

TEXTS = CORPUS + [
    "Hello <mask> world",
    "<mask> first and last <mask>",
    "joined<mask>text and  <mask>  spaced",
    "<s> literal </s> special <pad> tokens <unk>",
    "added newword, [SPECIAL] and <extra> tokens",
    "CAPITALS Stay CAPITALS, no lowercasing",
    "fullwidth ＡＢＣ, ligature ﬁ, circled ①, Å and ideographic\u3000space",
    " leading space",
    "trailing space ",
]
ROBERTA_PAIRS = PAIRS + [("Hello <mask> world", "the second <mask> text"), ("newword", "<extra> [SPECIAL]")]
# SentencePiece's precompiled normalizer for the rules ＡＢＣ -> ABC, Ａ -> A, ﬁ -> fi, ① -> 1, U+3000 -> " " and
# Å -> A + U+030A, as `sentencepiece.SentencePieceTrainer.train(normalization_rule_tsv=...)` compiles them: real
# XLM-R tokenizer.json files carry such a map (for NFKC), and transformers keeps it when it rebuilds the pipeline.
PRECOMPILED_CHARSMAP = base64.b64decode(
    "AAQAAAAIAwDDGAIAhQUAAAoAAICRhAIAoA0AAAIAAIAAAACAgAQCAIA5AACsAAIAgR0AAA4AAIChDQAABAAAgLz0AgCiuAMA7/wCALyIAgCjHQAA"
    "BgAAgBQAAAAXAAAAFgAAABkAAAAYAAAAvNgCABoAAAAdAAAAHAAAAB8AAAAeAAAA4tQCAOOkAgAjAAAAIgAAACUAAAAkAAAAJwAAACYAAAApAAAA"
    "KAAAACsAAAAqAAAALQAAAO8sAgAvAAAALgAAADEAAAAwAAAAMwAAADIAAAA1AAAANAAAADcAAAA2AAAAOQAAADgAAAA7AAAAOgAAAD0AAAA8AAAA"
    "PwAAAD4AAABBAAAAQAAAAEMAAABCAAAARQAAAEQAAABHAAAARgAAAEkAAABIAAAASwAAAEoAAABNAAAATAAAAE8AAABOAAAAUQAAAFAAAABTAAAA"
    "UgAAAFUAAABUAAAAVwAAAFYAAABZAAAAWAAAAFsAAABaAAAAXQAAAFwAAABfAAAAXgAAAGEAAABgAAAAYwAAAGIAAABlAAAAZAAAAGcAAABmAAAA"
    "aQAAAGgAAABrAAAAagAAAG0AAABsAAAAbwAAAG4AAABxAAAAcAAAAHMAAAByAAAAdQAAAHQAAAB3AAAAdgAAAHkAAAB4AAAAewAAAHoAAAB9AAAA"
    "fAAAAH8AAAB+AAAAgQAAAIAAAACDAAAAggAAAIUAAACEAAAAhwAAAIYAAACJAAAAiAAAAIsAAACKAAAAjQAAAIwAAACPAAAAjgAAAJEAAACQAAAA"
    "kwAAAJIAAACVAAAAlAAAAJcAAACWAAAAmQAAAJgAAACbAAAAmgAAAJ0AAACcAAAAnwAAAJ4AAAChAAAAoAAAAKMAAACiAAAApQAAAKQAAACnAAAA"
    "pgAAAKkAAACoAAAAqwAAAKoAAACtAAAArAAAAK8AAACuAAAAsQAAALAAAACzAAAAsgAAALUAAAC0AAAAtwAAALYAAAC5AAAAuAAAALsAAAC6AAAA"
    "vQAAALwAAAC/AAAAvgAAAMEAAADAAAAAwwAAAMIAAADFAAAAxAAAAMcAAADGAAAAyQAAAMgAAADLAAAAygAAAM0AAADMAAAAzwAAAM4AAADRAAAA"
    "0AAAANMAAADSAAAA1QAAANQAAADXAAAA1gAAANkAAADYAAAA2wAAANoAAADdAAAA3AAAAN8AAADeAAAA4QAAAO9IAQDjAAAA4gAAAOUAAADkAAAA"
    "5wAAAOYAAADpAAAA6AAAAOsAAADqAAAA7QAAAOwAAADvAAAA7gAAAPEAAADwAAAA8wAAAPIAAAD1AAAA9AAAAPcAAAD2AAAA+QAAAPgAAAD7AAAA"
    "+gAAAP0AAAD8AAAA/wAAAP4AAAAgADEAQQBBQkMAQcyKAGZpAA=="
)
# As roberta-base's and xlm-roberta-base's tokenizer.json: <mask> takes the space before it.
MASK = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", MASK]
CAMEMBERT_SPECIALS = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>", MASK]


def byte_level_bpe(lowercase: bool = False) -> ByteLevelBPETokenizer:
    bpe = ByteLevelBPETokenizer(lowercase=lowercase)
    bpe.train_from_iterator(TEXTS * 3, vocab_size=600, min_frequency=2, special_tokens=ROBERTA_SPECIALS)
    return bpe


def unigram(specials: list) -> SentencePieceUnigramTokenizer:
    trained = SentencePieceUnigramTokenizer()
    trained.train_from_iterator(TEXTS * 3, vocab_size=300, special_tokens=specials, unk_token="<unk>")
    # A real XLM-R tokenizer.json: SentencePiece's precompiled map, then runs of spaces made one.
    trained.normalizer = normalizers.Sequence(
        [normalizers.Precompiled(PRECOMPILED_CHARSMAP), normalizers.Replace(Regex(" {2,}"), " ")]
    )
    return trained


def with_added_tokens(tokenizer):
    tokenizer.add_tokens(["newword", AddedToken("[SPECIAL]", normalized=False)])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    return tokenizer


def roberta_folder(directory: Path) -> Path:
    fast = transformers.RobertaTokenizerFast(tokenizer_object=byte_level_bpe()._tokenizer, model_max_length=48)
    with_added_tokens(fast).save_pretrained(directory)
    return directory


def vocab_merges_folder(directory: Path) -> Path:
    byte_level_bpe().save_model(str(directory))  # vocab.json + merges.txt ("#version: 0.2" first)
    fast = transformers.RobertaTokenizerFast(tokenizer_object=byte_level_bpe()._tokenizer)
    fast.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    fast.save_pretrained(directory)
    (directory / "tokenizer.json").unlink()
    return directory


def prefix_space_folder(directory: Path) -> Path:
    """tokenizer.json stores a Lowercase normalizer and `add_prefix_space: false`; tokenizer_config.json says
    add_prefix_space true and trim_offsets false. transformers builds the pipeline from the config, without the
    normalizer."""
    bpe = byte_level_bpe(lowercase=True)
    fast = transformers.RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, add_prefix_space=True, trim_offsets=False)
    fast.save_pretrained(directory)
    assert json.loads((directory / "tokenizer.json").read_text())["normalizer"] == {"type": "Lowercase"}
    return directory


def xlm_roberta_folder(directory: Path) -> Path:
    fast = transformers.XLMRobertaTokenizerFast(tokenizer_object=unigram(ROBERTA_SPECIALS)._tokenizer)
    with_added_tokens(fast).save_pretrained(directory)
    return directory


def camembert_folder(directory: Path) -> Path:
    transformers.CamembertTokenizerFast(tokenizer_object=unigram(CAMEMBERT_SPECIALS)._tokenizer).save_pretrained(
        directory
    )
    return directory


FOLDERS = {
    "roberta": roberta_folder,
    "roberta-vocab-merges": vocab_merges_folder,
    "roberta-prefix-space": prefix_space_folder,
    "xlm-roberta": xlm_roberta_folder,
    "camembert": camembert_folder,
}
CLASSES = {
    "roberta": "RobertaTokenizer",
    "roberta-vocab-merges": "RobertaTokenizer",
    "roberta-prefix-space": "RobertaTokenizer",
    "xlm-roberta": "XLMRobertaTokenizer",
    "camembert": "XLMRobertaTokenizer",
}


@pytest.fixture(scope="module", params=list(FOLDERS))
def pair(request, tmp_path_factory):
    """(hfbert tokenizer, transformers tokenizer) loaded from the same folder by each one's AutoTokenizer."""
    directory = FOLDERS[request.param](tmp_path_factory.mktemp(request.param))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(ours).__name__ == CLASSES[request.param]
    return ours, reference


def test_attributes(pair):
    ours, reference = pair
    assert ours.model_input_names == tuple(reference.model_input_names) == ("input_ids", "attention_mask")
    names = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
    assert [getattr(ours, f"{name}_token") for name in names] == [getattr(reference, f"{name}_token") for name in names]
    assert [getattr(ours, f"{name}_token_id") for name in names] == [
        getattr(reference, f"{name}_token_id") for name in names
    ]
    assert (ours.vocab_size, ours.model_max_length) == (reference.vocab_size, reference.model_max_length)
    assert len(ours) == len(reference) and ours.get_vocab() == reference.get_vocab()


def test_single_texts(pair):
    ours, reference = pair
    for text in TEXTS:
        assert_same(ours(text, **WITH_OFFSETS), reference(text, **WITH_OFFSETS))
        assert ours.tokenize(text) == reference.tokenize(text)
    assert_same(ours(TEXTS, **WITH_OFFSETS), reference(TEXTS, **WITH_OFFSETS))
    assert_same(ours(TEXTS, return_token_type_ids=True), reference(TEXTS, return_token_type_ids=True))


def test_mask_takes_the_space_before_it_and_capitals_stay(pair):
    ours, reference = pair
    ids = ours("Hello <mask> world")["input_ids"]
    assert ids == reference("Hello <mask> world")["input_ids"]
    assert ids.count(ours.mask_token_id) == 1 and ids[0] == ours.cls_token_id and ids[-1] == ours.sep_token_id
    assert ours("HELLO")["input_ids"] != ours("hello")["input_ids"]  # no lowercasing, even over a stored Lowercase


def test_pairs_are_joined_by_two_separators(pair):
    ours, reference = pair
    for first, second in ROBERTA_PAIRS:
        assert_same(ours(first, second, **WITH_OFFSETS), reference(first, second, **WITH_OFFSETS))
    firsts, seconds = [p[0] for p in ROBERTA_PAIRS], [p[1] for p in ROBERTA_PAIRS]
    assert_same(ours(firsts, seconds, **WITH_OFFSETS), reference(firsts, seconds, **WITH_OFFSETS))
    arguments = dict(return_token_type_ids=True, return_tensors="pt", padding=True)
    assert_same(ours(firsts, seconds, **arguments), reference(firsts, seconds, **arguments))
    alone = len(ours("newword")["input_ids"]) - 2
    ids = ours("newword", "newword")["input_ids"]
    separators = [ours.eos_token_id] * 2
    assert ids[1 + alone : 3 + alone] == separators and len(ids) == 2 * alone + 4


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_padding_and_tensors(pair, padding_side):
    ours, reference = pair
    for arguments in (dict(padding=True), dict(padding="longest"), dict(padding="max_length", max_length=64)):
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
    arguments = dict(truncation=strategy, max_length=16, **WITH_OFFSETS)
    encoded = [same_outcome(ours, reference, first, second, **arguments) for first, second in ROBERTA_PAIRS]
    assert sum(encoded) >= 4
    firsts, seconds = [p[0] for p in ROBERTA_PAIRS[:4]], [p[1] for p in ROBERTA_PAIRS[:4]]
    same_outcome(ours, reference, firsts, seconds, padding=True, **arguments)
    if strategy is True:  # truncation=True alone cuts to model_max_length (48 for "roberta"), max_length alone too
        for arguments in (dict(truncation=True), dict(max_length=8), dict(padding=True, truncation=True)):
            assert_same(ours(TEXTS, **arguments), reference(TEXTS, **arguments))


def test_decode(pair):
    ours, reference = pair
    rows = [reference(text)["input_ids"] for text in TEXTS + [f"{a} {b}" for a, b in ROBERTA_PAIRS]]
    for skip in (True, False):  # ours skips special tokens by default, transformers does not
        assert [ours.decode(ids, skip_special_tokens=skip) for ids in rows] == reference.batch_decode(
            rows, skip_special_tokens=skip
        )
        tokens = [reference.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows]
        assert [ours.convert_ids_to_tokens(ids, skip_special_tokens=skip) for ids in rows] == tokens
    batch = reference(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    assert ours.decode(batch) == reference.batch_decode(batch, skip_special_tokens=True)


def test_save_pretrained_loads_the_same_in_both(pair, tmp_path):
    ours, reference = pair
    ours.save_pretrained(tmp_path)
    expected = reference(TEXTS, **WITH_OFFSETS)
    assert_same(transformers.AutoTokenizer.from_pretrained(tmp_path)(TEXTS, **WITH_OFFSETS), expected)
    assert_same(hfbert.AutoTokenizer.from_pretrained(tmp_path)(TEXTS, **WITH_OFFSETS), expected)


@pytest.fixture(scope="module")
def roberta_files(tmp_path_factory) -> Path:
    return roberta_folder(tmp_path_factory.mktemp("roberta-files"))


@pytest.mark.parametrize(
    ("tokenizer_class", "model_type", "expected"),
    [
        ("RobertaTokenizer", None, "RobertaTokenizer"),
        ("RobertaTokenizerFast", "bert", "RobertaTokenizer"),
        (None, "roberta", "RobertaTokenizer"),
        (None, "xlm-roberta", "XLMRobertaTokenizer"),
        ("XLMRobertaTokenizer", None, "XLMRobertaTokenizer"),
        ("CamembertTokenizer", None, "XLMRobertaTokenizer"),
        (None, "camembert", "XLMRobertaTokenizer"),
        ("BertTokenizer", "roberta", "BertTokenizer"),
        (None, "bert", "BertTokenizer"),
    ],
)
def test_auto_tokenizer_picks_the_class_transformers_picks(tokenizer_class, model_type, expected, tmp_path):
    directory = tmp_path / "folder"
    if expected == "BertTokenizer":
        directory.mkdir()
        for name in MINILM_TOKENIZER_FILES:
            shutil.copy(minilm_directory() / name, directory)
    elif expected == "XLMRobertaTokenizer":
        xlm_roberta_folder(directory)
    else:
        transformers.RobertaTokenizerFast(tokenizer_object=byte_level_bpe()._tokenizer).save_pretrained(directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class", None)
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if model_type is not None:
        (directory / "config.json").write_text(json.dumps({"model_type": model_type}))
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    assert type(ours).__name__ == expected
    assert type(reference).__name__.removesuffix("Fast") in {expected, "CamembertTokenizer"}
    assert_same(ours(TEXTS[:8], TEXTS[8:16]), reference(TEXTS[:8], TEXTS[8:16]))


@pytest.mark.parametrize("how", ["tokenizer_config.json", "config.json"])
def test_a_sentencepiece_model_alone_is_refused_naming_tokenizer_json(how, tmp_path):
    (tmp_path / "sentencepiece.bpe.model").write_bytes(b"\x0a\x00")  # never read: its name is enough
    if how == "tokenizer_config.json":
        (tmp_path / how).write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    else:
        (tmp_path / how).write_text(json.dumps({"model_type": "xlm-roberta"}))
    with pytest.raises(ValueError) as refused:
        hfbert.AutoTokenizer.from_pretrained(tmp_path)
    message = str(refused.value)
    assert str(tmp_path) in message and "tokenizer.json" in message and "sentencepiece.bpe.model" in message
    assert "AutoTokenizer.from_pretrained(folder).save_pretrained(folder)" in message


def test_bad_byte_level_files_are_named(roberta_files, tmp_path):
    config = roberta_files / "tokenizer_config.json"
    vocab = json.loads(roberta_files.joinpath("tokenizer.json").read_text())["model"]["vocab"]
    cases = {
        "merges line": ({"vocab.json": vocab, "merges.txt": "#version: 0.2\nĠ t\nnot-a-pair\n"}, "merges.txt: line 3"),
        "merges token": ({"vocab.json": vocab, "merges.txt": "Ġ zzzz\n"}, "merges.txt: does not go with vocab.json"),
        "vocab id": ({"vocab.json": {**vocab, "bad": "7"}, "merges.txt": ""}, "vocab.json: token 'bad' has id '7'"),
        "vocab json": ({"vocab.json": "[1, 2]", "merges.txt": ""}, "vocab.json: expected a JSON object"),
    }
    for name, (files, expected) in cases.items():
        directory = tmp_path / name.replace(" ", "-")
        directory.mkdir()
        shutil.copy(config, directory)
        for file, content in files.items():
            text = content if isinstance(content, str) else json.dumps(content)
            (directory / file).write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=expected.replace("(", r"\(")):
            hfbert.AutoTokenizer.from_pretrained(directory)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(config, empty)
    with pytest.raises(FileNotFoundError, match="no tokenizer.json, nor vocab.json and merges.txt"):
        hfbert.AutoTokenizer.from_pretrained(empty)


def test_a_model_of_the_other_kind_is_named(roberta_files, tmp_path):
    shutil.copytree(roberta_files, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "XLMRobertaTokenizer"}))
    with pytest.raises(ValueError, match=r"tokenizer.json: field 'model' is a BPE model; XLMRobertaTokenizer takes"):
        hfbert.AutoTokenizer.from_pretrained(tmp_path)
