"""hfbert.modeling.tokenizer.BertTokenizer against transformers' BertTokenizer (5.x: the fast, `tokenizers`-backed one).

Two real tokenizers: bert-base-uncased from its byte-exact vocab.txt + tokenizer_config.json (no tokenizer.json, so
hfbert builds the pipeline itself), and all-MiniLM-L6-v2 from its tokenizer.json. Every expected value comes from
transformers on the same folder. Trap guarded against: in transformers 5.x `BertTokenizerFast(vocab_file=...)`
maps every word to [UNK]; the reference is built with `from_pretrained(folder)` and checked to know real words.
(AutoTokenizer cannot pick a class for a folder with only vocab.txt + a config without `tokenizer_class`, so the
bert-base-uncased reference is `BertTokenizerFast.from_pretrained`, which is what AutoTokenizer would return.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import transformers

import hfbert
from hfbert.modeling.tokenizer import BertTokenizer

from support.checkpoints import REFERENCE
from support.helpers import HELLO_WORLD_VOCABULARY, minilm_directory

CORPUS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "BERT uses WordPiece: un-aff-able, unaffable, UNAFFABLE.",
    "MiXeD CaSe TeXt with ALLCAPS and lowercase",
    "café naïve Ångström résumé",
    "Crème brûlée à la française, über Straße",
    "UPPER CASE ACCENTS ÉCOLE ÇA",
    "combining e\u0301 versus é",
    "中文字符",
    "日本語のテキスト",
    "한국어 문장입니다",
    "Mixed 中文 and English text",
    "Ελληνικά και русский текст",
    "عربي עברית हिन्दी ไทย",
    "emoji 👍🏽 and 🤗 faces 😀",
    "null\x00byte",
    "tab\tseparated\tvalues",
    "zero\u200bwidth space",
    "windows\r\nline endings\rand\nnewlines",
    "soft\u00adhyphen and nbsp\u00a0here",
    "control \x07 bell \x1b escape \x7f delete",
    "supercalifragilisticexpialidocious",
    "a" * 300,
    "pneumonoultramicroscopicsilicovolcanoconiosis " * 3,
    "Numbers: 3.14159, 1,000,000 and -42 or 1e-10",
    "Phone +1 (555) 123-4567; e-mail me@example.com; https://example.org/path?q=1&x=2",
    "Punctuation!!! ... ??? ;;; --- ''' \"\"\" (((",
    "It's a dog's life, isn't it? We're, they've, I'm.",
    "math ∑ ∫ √ ≠ ≤ ∞ and symbols © ® ™ §",
    "fullwidth ＡＢＣ１２３ and ligature ﬁ",
    "###hashtags and ##subword markers",
    "[CLS] special [SEP] tokens [MASK] in text [PAD] [UNK]",
    "[mask] lowercase special and [ MASK ] spaced",
    "",
    " ",
    "   \t\n  ",
    "  leading and trailing spaces  ",
    "long sentence " + " ".join(f"word{i}" for i in range(40)),
    "ok",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
]
PAIRS = [
    ("What is BERT?", "BERT is a transformer encoder."),
    ("café", "naïve Ångström"),
    ("中文字符", "日本語のテキスト"),
    ("", "second only"),
    ("first only", ""),  # a single example: transformers drops the empty second text; in a batch it stays
    ("short", "a much longer second sentence with many many words in it to truncate"),
    ("a much longer first sentence with many many words in it to truncate", "short"),
    ("long sentence " * 10, "another long sentence " * 10),
    ("👍🏽 🤗", "\x00\t\u200b\r\n"),
    ("supercalifragilisticexpialidocious", "a" * 300),
]
WITH_OFFSETS = dict(return_offsets_mapping=True)


def plain(value):
    """Tensors, tuples and BatchEncodings as nested lists/dicts, so both sides compare with ==."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def assert_same(ours, reference) -> None:
    assert set(ours) == set(reference)
    for key in reference:
        if isinstance(reference[key], torch.Tensor):
            assert isinstance(ours[key], torch.Tensor) and ours[key].dtype == reference[key].dtype, key
            assert ours[key].shape == reference[key].shape, key
        assert plain(ours[key]) == plain(reference[key]), key


def copy_tokenizer_files(destination: Path, source: Path, names=("vocab.txt", "tokenizer_config.json")) -> Path:
    destination.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(source / name, destination / name)
    return destination


@pytest.fixture(scope="module")
def bert_base_dir(tmp_path_factory) -> Path:
    return copy_tokenizer_files(tmp_path_factory.mktemp("bert-base-uncased"), REFERENCE)


@pytest.fixture(scope="module", params=["bert-base-uncased (vocab.txt)", "all-MiniLM-L6-v2 (tokenizer.json)"])
def pair(request, bert_base_dir):
    """(hfbert tokenizer, transformers tokenizer) loaded from the same folder."""
    if request.param.startswith("bert-base"):
        assert not (bert_base_dir / "tokenizer.json").exists()
        reference = transformers.BertTokenizerFast.from_pretrained(bert_base_dir)
        return BertTokenizer.from_pretrained(bert_base_dir), reference
    reference = transformers.AutoTokenizer.from_pretrained(minilm_directory())
    return BertTokenizer.from_pretrained(minilm_directory()), reference


def test_reference_knows_real_words(pair):
    ours, reference = pair
    ids = reference("Hello world, this is a normal sentence.")["input_ids"]
    assert reference.unk_token_id not in ids
    assert ids[:3] == [101, 7592, 2088]  # published bert-base-uncased ids: [CLS] hello world
    assert ours("Hello world, this is a normal sentence.")["input_ids"] == ids


def test_same_pipeline_as_transformers(pair):
    ours, reference = pair
    expected = json.loads(reference.backend_tokenizer.to_str())
    expected["truncation"] = expected["padding"] = None  # both set these per call; at rest ours has none
    assert json.loads(ours.backend_tokenizer.to_str()) == expected


def test_attributes(pair):
    ours, reference = pair
    for name in ("vocab_size", "model_max_length", "pad_token_id", "cls_token_id", "sep_token_id"):
        assert getattr(ours, name) == getattr(reference, name), name
    assert (ours.mask_token_id, ours.unk_token_id) == (reference.mask_token_id, reference.unk_token_id)
    assert len(ours) == len(reference) and ours.get_vocab() == reference.get_vocab()


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_single_text(pair, text):
    ours, reference = pair
    assert_same(ours(text, **WITH_OFFSETS), reference(text, **WITH_OFFSETS))
    assert ours.tokenize(text) == reference.tokenize(text)


def test_pairs(pair):
    ours, reference = pair
    for first, second in PAIRS:
        assert_same(ours(first, second, **WITH_OFFSETS), reference(first, second, **WITH_OFFSETS))
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    assert_same(ours(firsts, seconds, **WITH_OFFSETS), reference(firsts, seconds, **WITH_OFFSETS))


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("padding", [True, "longest"])
def test_batch_padding(pair, padding, padding_side):
    ours, reference = pair
    arguments = dict(padding=padding, padding_side=padding_side, **WITH_OFFSETS)
    assert_same(ours(CORPUS, **arguments), reference(CORPUS, **arguments))
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    assert_same(ours(firsts, seconds, **arguments), reference(firsts, seconds, **arguments))
    assert_same(ours(CORPUS, **arguments, return_tensors="pt"), reference(CORPUS, **arguments, return_tensors="pt"))


def test_padding_to_max_length(pair):
    ours, reference = pair
    for arguments in (dict(max_length=24, truncation=True), dict(max_length=24), dict(), dict(truncation=True)):
        arguments = dict(padding="max_length", **arguments, **WITH_OFFSETS)
        assert_same(ours(CORPUS, **arguments), reference(CORPUS, **arguments))


def test_truncation_single(pair):
    ours, reference = pair
    for strategy in (True, "longest_first", "only_first"):
        arguments = dict(truncation=strategy, max_length=16, **WITH_OFFSETS)
        assert_same(ours(CORPUS, **arguments), reference(CORPUS, **arguments))
        for text in CORPUS:
            assert_same(ours(text, **arguments), reference(text, **arguments))
    # max_length alone turns truncation on (transformers' legacy rule); truncation=True alone uses model_max_length
    long_text = "word " * 600
    for arguments in (dict(max_length=16), dict(truncation=True), dict(), dict(padding=True, truncation=True)):
        assert_same(ours(long_text, **arguments), reference(long_text, **arguments))
    assert len(ours(long_text)["input_ids"]) == 602  # tokenizer.json's stored truncation (128) is not applied
    assert len(ours(long_text, truncation=True)["input_ids"]) == 512


@pytest.mark.parametrize("strategy", [True, "longest_first", "only_first", "only_second"])
def test_truncation_pairs(pair, strategy):
    ours, reference = pair
    arguments = dict(truncation=strategy, max_length=16, **WITH_OFFSETS)
    valid = 0
    for first, second in PAIRS:
        try:
            expected = reference(first, second, **arguments)
        except Exception as error:  # the Rust backend refuses: the chosen text is too short to reach max_length
            with pytest.raises(type(error)):
                ours(first, second, **arguments)
            continue
        valid += 1
        assert_same(ours(first, second, **arguments), expected)
    assert valid >= 4


def test_padding_true_with_max_length_but_no_truncation(pair):
    ours, reference = pair
    with pytest.warns(UserWarning, match="max_length"):
        expected = reference(CORPUS, padding=True, max_length=8, truncation=False)
    with pytest.warns(UserWarning, match="max_length"):
        assert_same(ours(CORPUS, padding=True, max_length=8, truncation=False), expected)


def test_return_tensors_pt(pair):
    ours, reference = pair
    pt = dict(return_tensors="pt", **WITH_OFFSETS)
    for arguments in (dict(), dict(padding=True), dict(padding="max_length", max_length=20, truncation=True)):
        assert_same(ours(CORPUS[0], **arguments, **pt), reference(CORPUS[0], **arguments, **pt))  # shape (1, n)
        assert_same(ours(*PAIRS[0], **arguments, **pt), reference(*PAIRS[0], **arguments, **pt))
        batch = CORPUS if arguments else CORPUS[:1]  # a ragged batch makes no tensor without padding
        assert_same(ours(batch, **arguments, **pt), reference(batch, **arguments, **pt))
    encoded = ours(CORPUS, padding=True, return_tensors="pt")
    assert encoded.input_ids.dtype == torch.int64 and encoded.to("cpu").attention_mask.shape[0] == len(CORPUS)
    without = dict(return_token_type_ids=False, return_attention_mask=False)
    assert_same(ours(CORPUS, padding=True, **without), reference(CORPUS, padding=True, **without))


def test_decode(pair):
    ours, reference = pair
    for text in CORPUS + [f"{a} {b}" for a, b in PAIRS]:
        ids = reference(text)["input_ids"]
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids)
        tokens = reference.convert_ids_to_tokens(ids)
        assert ours.convert_ids_to_tokens(ids) == tokens
        assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == reference.convert_ids_to_tokens(
            ids, skip_special_tokens=True
        )
        assert ours.convert_tokens_to_ids(tokens) == reference.convert_tokens_to_ids(tokens)
    batch = reference(CORPUS, padding=True, return_tensors="pt")["input_ids"]
    assert ours.decode(batch) == reference.batch_decode(batch, skip_special_tokens=True)
    assert ours.decode(batch[0]) == reference.decode(batch[0], skip_special_tokens=True)
    assert ours.convert_tokens_to_ids("not-a-token") == reference.convert_tokens_to_ids("not-a-token")


def test_bad_arguments_raise_as_transformers_does(pair):
    ours, reference = pair
    calls = [
        ((["a", "b c"],), dict(return_tensors="pt")),  # ragged batch: no tensor without padding
        ((["a"], ["b", "c"]), {}),
        ((["a"], "b"), {}),
        (("a",), dict(padding="sideways")),
        (("a",), dict(truncation="only_middle")),
        (("a",), dict(padding=True, padding_side="middle")),
    ]
    for args, kwargs in calls:
        with pytest.raises(Exception) as expected:
            reference(*args, **kwargs)
        with pytest.raises(expected.type):
            ours(*args, **kwargs)


def test_concurrent_calls_keep_their_own_settings(pair):
    ours, reference = pair
    settings = [
        dict(padding=True),
        dict(truncation=True, max_length=8),
        dict(),
        dict(padding="max_length", max_length=40),
    ]
    expected = [plain(reference(CORPUS, **arguments)) for arguments in settings]
    failures = []

    def work(index: int) -> None:
        for _ in range(10):
            if plain(ours(CORPUS, **settings[index % 4])) != expected[index % 4]:
                failures.append(index)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_save_pretrained_loads_in_transformers(pair, tmp_path):
    ours, reference = pair
    written = ours.save_pretrained(tmp_path / "saved")
    names = sorted(path.name for path in (tmp_path / "saved").iterdir())
    assert names == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert sorted(path.name for path in written) == names  # and no temporary file left behind
    firsts, seconds = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    expected = reference(CORPUS, padding=True, **WITH_OFFSETS), reference(firsts, seconds, **WITH_OFFSETS)
    reloaded = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert reloaded.model_max_length == reference.model_max_length
    assert_same(reloaded(CORPUS, padding=True, **WITH_OFFSETS), expected[0])
    assert_same(reloaded(firsts, seconds, **WITH_OFFSETS), expected[1])
    # vocab.txt + tokenizer_config.json alone (no tokenizer.json) must describe the same tokenizer to transformers
    vocab_only = copy_tokenizer_files(tmp_path / "vocab-only", tmp_path / "saved")
    from_vocab = transformers.BertTokenizerFast.from_pretrained(vocab_only)
    assert_same(from_vocab(CORPUS, padding=True, **WITH_OFFSETS), expected[0])
    assert_same(BertTokenizer.from_pretrained(tmp_path / "saved")(CORPUS, padding=True, **WITH_OFFSETS), expected[0])


CONFIG_VARIANTS = [
    {"do_lower_case": False},
    {"do_lower_case": True, "strip_accents": False},
    {"do_lower_case": False, "strip_accents": True},
    {"tokenize_chinese_chars": False},
    {},  # no model_max_length: no limit, so truncation=True alone truncates nothing
    {"clean_up_tokenization_spaces": True, "model_max_length": 64},
    # transformers' "no limit" sentinels: above 1e20 a length is none (truncation=True alone truncates nothing)
    {"model_max_length": int(1e30)},
    {"model_max_length": 1e30},
    {"model_max_length": 5e20},
    {"model_max_length": None},
    {
        "unk_token": {
            "__type": "AddedToken",
            "content": "[UNK]",
            "lstrip": False,
            "rstrip": False,
            "normalized": True,
            "single_word": False,
        }
    },
]


@pytest.mark.parametrize("config", CONFIG_VARIANTS, ids=[json.dumps(c)[:40] for c in CONFIG_VARIANTS])
def test_vocab_txt_options(config, tmp_path):
    directory = copy_tokenizer_files(tmp_path, REFERENCE, names=("vocab.txt",))
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = (
        BertTokenizer.from_pretrained(directory),
        transformers.BertTokenizerFast.from_pretrained(directory),
    )
    assert ours.model_max_length == reference.model_max_length
    for arguments in (dict(padding=True), dict(truncation=True)):
        assert_same(ours(CORPUS, **arguments, **WITH_OFFSETS), reference(CORPUS, **arguments, **WITH_OFFSETS))
    ids = reference("It's a dog's life, isn't it ? Yes !")["input_ids"]
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "normalizer, config",
    [({"lowercase": False}, {}), ({"lowercase": False}, {"do_lower_case": None}), ({}, {"do_lower_case": False})],
)
def test_tokenizer_config_overrides_the_json_normalizer_as_in_transformers(normalizer, config, tmp_path):
    source = minilm_directory()
    directory = copy_tokenizer_files(tmp_path, source, names=("vocab.txt", "special_tokens_map.json"))
    tokenizer_json = json.loads((source / "tokenizer.json").read_text())
    tokenizer_json["normalizer"].update(normalizer)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    tokenizer_config = {**json.loads((source / "tokenizer_config.json").read_text()), **config}
    tokenizer_config = {key: value for key, value in tokenizer_config.items() if value is not None}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    ours, reference = BertTokenizer.from_pretrained(directory), transformers.AutoTokenizer.from_pretrained(directory)
    assert_same(ours(CORPUS, padding=True, **WITH_OFFSETS), reference(CORPUS, padding=True, **WITH_OFFSETS))


def test_added_tokens_decoder_and_unusual_vocab_lines(tmp_path):
    def entry(content: str, special: bool, normalized: bool = False) -> dict:
        flags = dict(lstrip=False, rstrip=False, single_word=False)
        return dict(content=content, special=special, normalized=normalized, **flags)

    # CRLF line ends, a duplicate, and characters str.splitlines() would split on (transformers does not)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "wor\u2028ld", "a\x0bb", "##s", "hello", "word"]
    tokens += ["x\x1cy", "caf", "##é", "é"]
    (tmp_path / "vocab.txt").write_bytes("\r\n".join(tokens).encode() + b"\r\n")
    specials = {str(i): entry(token, True) for i, token in enumerate(tokens[:5])}
    added = {"15": entry("<ent>", False, normalized=True), "16": entry("[E1]", True)}
    config = {"do_lower_case": False, "strip_accents": False, "added_tokens_decoder": {**specials, **added}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = BertTokenizer.from_pretrained(tmp_path), transformers.BertTokenizerFast.from_pretrained(tmp_path)
    assert ours.get_vocab() == reference.get_vocab()
    texts = ["hello words café", "hellos word", "x <ent> hello [E1] word <ENT>", "a\x0bb wor\u2028ld"]
    assert_same(ours(texts, padding=True, **WITH_OFFSETS), reference(texts, padding=True, **WITH_OFFSETS))
    ids = reference(texts[2])["input_ids"]
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    for skip in (False, True):
        assert ours.convert_ids_to_tokens(ids, skip) == reference.convert_ids_to_tokens(ids, skip)


# -- values of tokenizer_config.json that no tokenizer can use -----------------------------------------------------

MAX_LENGTH_VALUES = r"expected a positive integer up to 10\*\*19, or a number above 1e20 for no limit"
BAD_OPTIONS = [
    ('{"model_max_length": 1e400}', "model_max_length", "inf", MAX_LENGTH_VALUES),  # OverflowError before
    ('{"model_max_length": -5}', "model_max_length", "-5", MAX_LENGTH_VALUES),  # broke every truncating call
    ('{"model_max_length": 1e20}', "model_max_length", r"1e\+20", MAX_LENGTH_VALUES),  # too
    ('{"model_max_length": 0}', "model_max_length", "0", MAX_LENGTH_VALUES),
    ('{"model_max_length": 512.5}', "model_max_length", "512.5", MAX_LENGTH_VALUES),
    ('{"model_max_length": true}', "model_max_length", "True", MAX_LENGTH_VALUES),
    ('{"model_max_length": "abc"}', "model_max_length", "'abc'", MAX_LENGTH_VALUES),  # named neither file nor field
    ('{"do_lower_case": "no"}', "do_lower_case", "'no'", "expected true or false"),
    ('{"tokenize_chinese_chars": 1}', "tokenize_chinese_chars", "1", "expected true or false"),
    ('{"clean_up_tokenization_spaces": "yes"}', "clean_up_tokenization_spaces", "'yes'", "expected true or false"),
    ('{"strip_accents": 5}', "strip_accents", "5", "expected true, false or null"),
    ('{"unk_token": {}}', "unk_token", r"\{\}", 'expected a non-empty string, or an object with a "content" string'),
    ('{"mask_token": ["[MASK]"]}', "mask_token", r"\['\[MASK\]'\]", "expected a non-empty string"),
    ('{"added_tokens_decoder": []}', "added_tokens_decoder", r"\[\]", "expected an object of token id ->"),
    ('{"added_tokens_decoder": {"x": {"content": "a"}}}', "added_tokens_decoder' entry 'x", ".*", "expected an object"),
    (
        '{"added_tokens_decoder": {"5": {"content": "a", "special": "yes"}}}',
        "added_tokens_decoder' entry '5",
        ".*",
        r"expected an object .*\(flags true or false\)",
    ),
]


@pytest.mark.parametrize("with_tokenizer_json", [False, True], ids=["vocab.txt", "tokenizer.json"])
@pytest.mark.parametrize("content,field,shown,accepted", BAD_OPTIONS, ids=[case[0][:48] for case in BAD_OPTIONS])
def test_tokenizer_config_values_no_tokenizer_can_use_are_named(
    tmp_path, content, field, shown, accepted, with_tokenizer_json
):
    import hfbert

    names = ("vocab.txt", "tokenizer.json") if with_tokenizer_json else ("vocab.txt",)
    directory = copy_tokenizer_files(tmp_path, minilm_directory(), names=names)
    (directory / "tokenizer_config.json").write_text(content)
    pattern = rf"tokenizer_config\.json: field '{field}' is {shown}; {accepted}"
    with pytest.raises(hfbert.ConfigError, match=pattern):
        BertTokenizer.from_pretrained(directory)


def test_special_tokens_map_values_are_named_with_that_file(tmp_path):
    import hfbert

    directory = copy_tokenizer_files(tmp_path, minilm_directory(), names=("vocab.txt",))
    (directory / "special_tokens_map.json").write_text('{"pad_token": 0}')
    with pytest.raises(hfbert.ConfigError, match=r"special_tokens_map\.json: field 'pad_token' is 0; expected"):
        BertTokenizer.from_pretrained(directory)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        BertTokenizer.from_pretrained(tmp_path / "no-such-folder")
    with pytest.raises(FileNotFoundError, match="no-such-folder"):
        BertTokenizer.from_pretrained(str(tmp_path / "no-such-folder"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path / "empty")
    (tmp_path / "empty" / "vocab.txt").write_text("[PAD]\nhello\n")
    with pytest.raises(ValueError, match=r"vocab\.txt.*\[UNK\]"):
        BertTokenizer.from_pretrained(tmp_path / "empty")


def test_repo_id_resolves_through_the_hub(tmp_path):
    """A repo id goes through converters.hub (here against tests/support/fake_hub.py, in a fresh process because
    huggingface_hub reads HF_ENDPOINT at import)."""
    from safetensors.torch import save

    from support.fake_hub import FakeHub

    files = {name: (REFERENCE / name).read_bytes() for name in ("config.json", "vocab.txt", "tokenizer_config.json")}
    files["model.safetensors"] = save({"embeddings.word_embeddings.weight": torch.zeros(4, 4)})
    text = "Hello world, café 中文!"
    expected = transformers.BertTokenizerFast.from_pretrained(REFERENCE)(text)["input_ids"]
    script = "import sys; from hfbert.modeling.tokenizer import BertTokenizer as T; "
    script += "print(T.from_pretrained(sys.argv[1])(sys.argv[2])['input_ids'])"
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path), HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1")
    with FakeHub() as hub:
        hub.add_revision("google-bert/bert-base-uncased", "1" * 40, files)
        env["HF_ENDPOINT"] = hub.url
        command = [sys.executable, "-c", script, "google-bert/bert-base-uncased", text]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


# -- a long text is cut before it is tokenised, with the same result -----------------------------------------------

FRAGMENTS = ["word", "Über", "naïve", "中文", "日本", "!", "...", "(x)", "e\u0301", "[MASK]", "[SEP]", "x" * 120]
FRAGMENTS += ["un-aff-able", "3.14", "emoji👍🏽", "null\x00", "bell\x07", "zero\u200bwidth", "soft\u00adhyphen"]
# Long runs that yield no token (spaces, control characters the normaliser drops) make a fixed-size cut wrong.
SEPARATORS = [" ", "  ", "\t", "\n", "\r\n", "\r", "\u3000", "\u00a0", "\x1c", "", " " * 700, "\x07" * 700]


def test_a_five_megabyte_line_is_cut_before_tokenisation(pair):
    ours, reference = pair
    text = ("Tokenizers should not read all of this. " * 130_000)[:5_000_000]
    with ours._lock:
        prefix = ours._shorten(text, 256)
    assert 0 < len(prefix) < 10_000 and text.startswith(prefix)  # the whole 5 MB line cost 1 GB before
    medium = text[:200_000]  # small enough for the reference to tokenise whole
    arguments = dict(truncation=True, max_length=256, **WITH_OFFSETS)
    assert_same(ours(medium, **arguments), reference(medium, **arguments))


def test_a_text_without_whitespace_is_tokenised_whole_and_still_right(pair):
    ours, reference = pair
    text = "!?" * 3000 + "中" * 3000  # no place to cut: falls back to the whole text
    arguments = dict(truncation=True, max_length=64, **WITH_OFFSETS)
    assert_same(ours(text, **arguments), reference(text, **arguments))


def test_cut_texts_tokenise_as_the_reference(pair):
    hypothesis = pytest.importorskip("hypothesis", reason="needs hypothesis (pip install hypothesis)")
    strategies = hypothesis.strategies
    ours, reference = pair

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(
        pieces=strategies.lists(
            strategies.tuples(strategies.sampled_from(FRAGMENTS), strategies.sampled_from(SEPARATORS)),
            min_size=1,
            max_size=400,
        ),
        max_length=strategies.integers(min_value=3, max_value=40),
    )
    def check(pieces, max_length):
        text = "".join(fragment + separator for fragment, separator in pieces)
        arguments = dict(truncation=True, max_length=max_length, **WITH_OFFSETS)
        assert_same(ours(text, **arguments), reference(text, **arguments))

    check()


def test_texts_that_are_not_unicode_strings_are_named(pair):
    ours, reference = pair
    with pytest.raises(TypeError):  # the reference fails too, without saying which text or why
        reference(["fine", "bad \udcff"])
    with pytest.raises(ValueError, match=r"text 1 is not valid Unicode: '\\udcff' at position 4"):
        ours(["fine", "bad \udcff"])
    with pytest.raises(ValueError, match=r"text 0 is not valid Unicode"):
        ours("\udcff " + "long " * 1000, truncation=True, max_length=8)  # also on the cut-before-tokenising path
    with pytest.raises(TypeError, match=r"text 1 is a int, not a str"):
        ours(["fine", 3])


# -- legacy added_tokens.json and additional_special_tokens, as transformers loads them ----------------------------


LEGACY_CASES = {
    "added_tokens.json": ({"[E1]": 14, "Newword": 15}, None, {}),
    "added_tokens.json with a special map": ({"[E1]": 14, "Newword": 15}, {"additional_special_tokens": ["[E1]"]}, {}),
    "special map only": (None, {"additional_special_tokens": ["[E1]"]}, {}),
    "config only": (None, None, {"additional_special_tokens": ["[E1]", "[E2]"]}),
    "added_tokens.json and config": ({"[E1]": 14}, None, {"additional_special_tokens": ["[E1]"]}),
    "ids that do not follow the vocabulary": ({"hello": 12, "[E1]": 20}, None, {}),
    "extra_special_tokens": (None, {"additional_special_tokens": ["[E2]"]}, {"extra_special_tokens": ["[E1]"]}),
}


@pytest.mark.parametrize("case", list(LEGACY_CASES))
def test_legacy_added_and_special_tokens_tokenize_as_in_transformers(tmp_path, case):
    added, special_map, config = LEGACY_CASES[case]
    (tmp_path / "vocab.txt").write_text("".join(token + "\n" for token in HELLO_WORLD_VOCABULARY))
    if added is not None:
        (tmp_path / "added_tokens.json").write_text(json.dumps(added))
    if special_map is not None:
        (tmp_path / "special_tokens_map.json").write_text(json.dumps(special_map))
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, **config}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = hfbert.BertTokenizer.from_pretrained(tmp_path)
    for text in ["hello [E1] world", "a newword [e1] Newword [E2]", "[E1][E2]hello"]:
        assert ours(text)["input_ids"] == reference(text)["input_ids"], text
    assert len(ours) == len(reference)


def test_legacy_added_tokens_beside_a_tokenizer_json(tmp_path):
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(minilm_directory() / name, tmp_path / name)
    config = json.loads((minilm_directory() / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "additional_special_tokens": ["[E2]"]}))
    (tmp_path / "added_tokens.json").write_text(json.dumps({"[E1]": 30522, "Newword": 30523}))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = hfbert.BertTokenizer.from_pretrained(tmp_path)
    for text in ["hello [E1] world [E2]", "a newword [e1] Newword"]:
        assert ours(text)["input_ids"] == reference(text)["input_ids"], text


# -- tokenizer files transformers reads otherwise, or refuses ------------------------------------------------------


@pytest.mark.parametrize(
    "file, values",
    [
        ("tokenizer_config.json", {"additional_special_tokens": "[E1]"}),
        ("special_tokens_map.json", {"additional_special_tokens": [5]}),
        # The tokenizers library takes only true / false flags (TypeError: 'str' object is not an instance of 'bool').
        ("tokenizer_config.json", {"additional_special_tokens": [{"content": "[E1]", "lstrip": "yes"}]}),
        ("special_tokens_map.json", {"extra_special_tokens": [{"content": "[E1]", "single_word": 1}]}),
    ],
)
def test_special_token_lists_of_the_wrong_type_name_the_file(tmp_path, file, values):
    directory = tmp_path / "vocab-only"
    directory.mkdir()
    shutil.copy(minilm_directory() / "vocab.txt", directory / "vocab.txt")
    config = {
        "do_lower_case": True
    }  # no added_tokens_decoder: special_tokens_map.json is read, as transformers reads it
    config |= values if file == "tokenizer_config.json" else {}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if file == "special_tokens_map.json":
        (directory / file).write_text(json.dumps(values))
    field = next(iter(values))
    with pytest.raises(hfbert.ConfigError, match=rf"{file}: field '{field}'"):
        hfbert.BertTokenizer.from_pretrained(directory)


@pytest.mark.parametrize("value", [1, 0, None])
def test_clean_up_tokenization_spaces_read_by_truthiness_as_transformers(tmp_path, value):
    directory = tmp_path / "tokenizer"
    shutil.copytree(minilm_directory(), directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": value}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.BertTokenizer.from_pretrained(directory)
    ids = theirs("It isn't here , is it ?")["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(
    "tokenizer_class, refused",
    [
        ("BertJapaneseTokenizer", True),
        ("MyCustomTokenizer", True),
        ("BertTokenizerFast", False),
        ("DistilBertTokenizer", False),
    ],
)
def test_a_vocab_tokenizer_of_another_class_is_refused_not_built_as_bert(tmp_path, tokenizer_class, refused):
    """cl-tohoku/bert-base-japanese says model_type bert, ships vocab.txt and tokenizer_class BertJapaneseTokenizer
    (MeCab word splitting before WordPiece): hfbert built plain BERT WordPiece from it, other ids, silently."""
    directory = tmp_path / "vocab-only"
    directory.mkdir()
    shutil.copy(minilm_directory() / "vocab.txt", directory / "vocab.txt")
    config = {"do_lower_case": True, "tokenizer_class": tokenizer_class}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if refused:
        with pytest.raises(ValueError, match=rf"tokenizer_config\.json: tokenizer_class '{tokenizer_class}'"):
            hfbert.BertTokenizer.from_pretrained(directory)
    else:
        assert hfbert.BertTokenizer.from_pretrained(directory)("hello world")["input_ids"] == [101, 7592, 2088, 102]
