"""The defaults of a call that tokenizer_config.json sets (issue #49), for every family's tokenizer, against
transformers' AutoTokenizer loading the same folder, element-wise.

`padding_side` and `truncation_side` (else the directions tokenizer.json stores), `model_input_names` (which of
token_type_ids / attention_mask a call returns), `split_special_tokens`, and `clean_up_tokenization_spaces`, which
transformers 5 applies in `decode` to WordPiece and Unigram models but never to byte-level BPE (RoBERTa) unless
`clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output` is set; arguments of the same names to
`from_pretrained` win over the file. Each folder is written by transformers' own classes: bert-base-uncased's
vocab.txt (hfbert builds that pipeline itself), all-MiniLM-L6-v2's tokenizer.json, a byte-level BPE (RoBERTa) and a
SentencePiece Unigram (XLM-R) trained with the tokenizers library, and MPNet's tokenizer made from the BERT vocabulary.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import transformers
from test_tokenizer import plain
from tokenizers import SentencePieceUnigramTokenizer

import hfbert
from hfbert.cli import main
from hfbert.tools.embedding import Embedder

from support.checkpoints import REFERENCE
from support.family import SPECIALS, TEXTS, family_checkpoint, tokenizer_of
from support.helpers import (
    MINILM_TOKENIZER_FILES,
    minilm_directory,
    with_minilm_pipeline,
    write_random_transformers_checkpoint,
)

# Spaces before punctuation and clitics, as a word-level tokenized corpus writes them: what the clean-up removes.
SPACED = [
    "Hello , the is here . It 's fine , isn't it ? I 'm sure they 've gone n't ! ' quoted '",
    "We 're here , they 're not . Don 't worry ; it 's fine !",
    "Paris is the capital of France , and Berlin the capital of Germany .",
]
MODEL_MAX_LENGTH = 24
LONG = " ".join(TEXTS * 3)
BATCH = [LONG, "short", TEXTS[1], SPACED[0], "x"]
PAIRS = ([TEXTS[0], LONG, "short"], [TEXTS[1], "short", LONG])
FAMILIES = ["bert-vocab", "minilm", "roberta", "xlm-roberta", "mpnet"]
TOKENIZER_JSON_FAMILIES = ["minilm", "roberta", "xlm-roberta", "mpnet"]
CLASSES = {
    "bert-vocab": "BertTokenizer",
    "minilm": "BertTokenizer",
    "roberta": "RobertaTokenizer",
    "xlm-roberta": "XLMRobertaTokenizer",
    "mpnet": "MPNetTokenizer",
}


def bert_vocab_folder(directory: Path) -> Path:
    directory.mkdir(parents=True)
    shutil.copy(REFERENCE / "vocab.txt", directory / "vocab.txt")
    config = {"do_lower_case": True, "model_max_length": MODEL_MAX_LENGTH, "tokenizer_class": "BertTokenizer"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def write_folder(family: str, directory: Path) -> Path:
    """`family`'s tokenizer folder as transformers writes it, with `MODEL_MAX_LENGTH`."""
    if family == "bert-vocab":
        return bert_vocab_folder(directory)
    if family == "minilm":
        directory.mkdir(parents=True)
        for name in MINILM_TOKENIZER_FILES:
            shutil.copy(minilm_directory() / name, directory / name)
        edit_config(directory, model_max_length=MODEL_MAX_LENGTH)
        return directory
    if family == "roberta":
        tokenizer = tokenizer_of("roberta", MODEL_MAX_LENGTH)
    elif family == "xlm-roberta":
        # Trained on the spaced texts too, so that "'" and "?" have pieces (the clean-up acts on them).
        trained = SentencePieceUnigramTokenizer()
        trained.train_from_iterator((TEXTS + SPACED) * 3, vocab_size=300, special_tokens=SPECIALS, unk_token="<unk>")
        tokenizer = transformers.XLMRobertaTokenizerFast(
            tokenizer_object=trained._tokenizer, model_max_length=MODEL_MAX_LENGTH
        )
    else:
        tokenizer = transformers.MPNetTokenizer.from_pretrained(bert_vocab_folder(directory.with_name("mpnet-vocab")))
    tokenizer.save_pretrained(directory)
    return directory


def edit_config(directory: Path, **fields) -> Path:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    for name, value in fields.items():
        if value is None:
            config.pop(name, None)
        else:
            config[name] = value
    path.write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: write_folder(family, root / family) for family in FAMILIES}


@pytest.fixture
def folder(sources, tmp_path):
    """A copy of a family's folder with tokenizer_config.json `fields` set (None removes one)."""

    def make(family: str, **fields) -> Path:
        directory = tmp_path / family
        shutil.copytree(sources[family], directory)
        return edit_config(directory, **fields)

    return make


def load_both(directory: Path, **arguments):
    reference = transformers.AutoTokenizer.from_pretrained(directory, **arguments)
    ours = hfbert.AutoTokenizer.from_pretrained(directory, **arguments)
    assert type(ours).__name__ == type(reference).__name__
    return ours, reference


def assert_same(ours, reference) -> None:
    assert set(ours) == set(reference)
    for key in reference:
        assert plain(ours[key]) == plain(reference[key]), key


def assert_same_calls(ours, reference) -> None:
    """Truncation past the model's and a given max_length, padding on mixed lengths, pairs: the same ids, masks,
    token types (present or not) and offsets."""
    offsets = dict(return_offsets_mapping=True)
    calls = [
        ((BATCH,), dict(truncation=True)),  # to model_max_length
        ((BATCH,), dict(truncation=True, max_length=12)),
        ((BATCH,), dict(padding=True)),
        ((BATCH,), dict(padding=True, truncation=True, max_length=10)),
        ((BATCH,), dict(padding="max_length", truncation=True, max_length=16)),
        ((LONG,), dict(truncation=True, max_length=9)),
        (PAIRS, dict(padding=True, truncation=True, max_length=16)),
        ((BATCH,), dict(padding=True, truncation=True, return_tensors="pt")),
    ]
    for args, arguments in calls:
        assert_same(ours(*args, **arguments, **offsets), reference(*args, **arguments, **offsets))


def test_the_fixtures_tokenize_real_text(sources):
    for family in FAMILIES:
        reference = transformers.AutoTokenizer.from_pretrained(sources[family])
        ids = reference(LONG)["input_ids"]
        assert len(ids) > 3 * MODEL_MAX_LENGTH, family
        assert ids.count(reference.unk_token_id) < len(ids) // 10, family


SIDES = [("left", "left"), ("left", "right"), ("right", "left")]


@pytest.mark.parametrize("truncation_side, padding_side", SIDES)
@pytest.mark.parametrize("family", FAMILIES)
def test_sides_from_tokenizer_config(folder, family, truncation_side, padding_side):
    """A config that truncates on the left embedded differently from SentenceTransformer.encode, silently."""
    ours, reference = load_both(folder(family, truncation_side=truncation_side, padding_side=padding_side))
    assert (ours.truncation_side, ours.padding_side) == (truncation_side, padding_side)
    assert (reference.truncation_side, reference.padding_side) == (truncation_side, padding_side)
    assert_same_calls(ours, reference)
    # A call's padding_side still wins over the config's.
    other = "right" if padding_side == "left" else "left"
    assert_same(ours(BATCH, padding=True, padding_side=other), reference(BATCH, padding=True, padding_side=other))


@pytest.mark.parametrize("family", TOKENIZER_JSON_FAMILIES)
def test_tokenizer_json_directions_are_the_sides_a_config_without_them_gets(folder, family):
    directory = folder(family, truncation_side=None, padding_side=None)
    stored = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    stored["truncation"] = {"direction": "Left", "max_length": 7, "strategy": "LongestFirst", "stride": 0}
    pad_id = stored["added_tokens"][0]["id"]
    stored["padding"] = {
        "strategy": "BatchLongest",
        "direction": "Left",
        "pad_to_multiple_of": 8,
        "pad_id": pad_id,
        "pad_type_id": 0,
        "pad_token": stored["added_tokens"][0]["content"],
    }
    (directory / "tokenizer.json").write_text(json.dumps(stored), encoding="utf-8")
    ours, reference = load_both(directory)
    assert (ours.truncation_side, ours.padding_side) == (reference.truncation_side, reference.padding_side)
    assert ours.truncation_side == "left"
    assert_same_calls(ours, reference)
    # The config's sides win over the stored directions.
    ours, reference = load_both(edit_config(directory, truncation_side="right", padding_side="right"))
    assert (
        (ours.truncation_side, ours.padding_side)
        == (reference.truncation_side, reference.padding_side)
        == (
            "right",
            "right",
        )
    )
    assert_same_calls(ours, reference)


NAMES = [["input_ids", "attention_mask"], ["input_ids", "token_type_ids", "attention_mask"], ["input_ids"]]


@pytest.mark.parametrize("names", NAMES, ids=["no-token-types", "token-types", "ids-only"])
@pytest.mark.parametrize("family", FAMILIES)
def test_model_input_names_from_tokenizer_config(folder, family, names):
    ours, reference = load_both(folder(family, model_input_names=names))
    assert list(ours.model_input_names) == reference.model_input_names == names
    assert_same_calls(ours, reference)
    explicit = dict(return_token_type_ids=True, return_attention_mask=True)
    assert_same(ours(BATCH, padding=True, **explicit), reference(BATCH, padding=True, **explicit))


@pytest.mark.parametrize("family", FAMILIES)
def test_split_special_tokens_from_tokenizer_config(folder, family):
    ours, reference = load_both(folder(family, split_special_tokens=True))
    text = f"Paris is the {reference.mask_token} of {reference.cls_token} France {reference.sep_token}."
    assert ours.split_special_tokens is reference.split_special_tokens is True
    assert ours.tokenize(text) == reference.tokenize(text)
    # The trained Unigram has the special tokens among its pieces too, so only the other families show the split.
    assert family == "xlm-roberta" or reference.tokenize(text) != reference.tokenize(text, split_special_tokens=False)
    assert_same(ours([text, LONG], padding=True), reference([text, LONG], padding=True))
    for split in (False, True):
        arguments = dict(padding=True, split_special_tokens=split)
        assert_same(ours([text, LONG], **arguments), reference([text, LONG], **arguments))
        assert ours.tokenize(text, split_special_tokens=split) == reference.tokenize(text, split_special_tokens=split)
    assert_same_calls(ours, reference)


@pytest.mark.parametrize("family", FAMILIES)
def test_from_pretrained_arguments_win_over_the_file(folder, family):
    directory = folder(
        family,
        truncation_side="left",
        padding_side="left",
        model_input_names=["input_ids"],
        split_special_tokens=True,
        clean_up_tokenization_spaces=True,
    )
    arguments = dict(
        truncation_side="right",
        padding_side="right",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        split_special_tokens=False,
        clean_up_tokenization_spaces=False,
        model_max_length=15,
    )
    ours, reference = load_both(directory, **arguments)
    for name, value in arguments.items():
        assert plain(getattr(ours, name)) == getattr(reference, name) == value, name
    assert_same_calls(ours, reference)
    text = f"Paris is the {reference.mask_token} of France ."
    assert ours.tokenize(text) == reference.tokenize(text)
    ids = reference(SPACED)["input_ids"]
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_keeps_the_call_defaults(folder, family, tmp_path):
    ours, _ = load_both(folder(family, truncation_side="left", padding_side="left", model_input_names=["input_ids"]))
    ours.save_pretrained(tmp_path / "saved")
    again, reference = load_both(tmp_path / "saved")
    assert (reference.truncation_side, reference.padding_side, reference.model_input_names) == (
        "left",
        "left",
        ["input_ids"],
    )
    assert_same_calls(again, reference)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"padding_side": "middle"}, "padding_side"),
        ({"truncation_side": None}, "truncation_side"),
        ({"split_special_tokens": "yes"}, "split_special_tokens"),
        ({"model_input_names": None}, "model_input_names"),
    ],
)
def test_bad_call_defaults_in_the_file_are_named_as_transformers_refuses_them(folder, fields, field):
    directory = folder("roberta")
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, **fields}))
    with pytest.raises((ValueError, TypeError)):
        transformers.AutoTokenizer.from_pretrained(directory)
    with pytest.raises(hfbert.ConfigError, match=rf"tokenizer_config\.json: field '{field}'"):
        hfbert.AutoTokenizer.from_pretrained(directory)


def test_a_model_input_names_string_is_refused_not_read_letter_by_letter(folder):
    """transformers takes list("input_ids"): no token types and no attention mask, silently."""
    directory = folder("bert-vocab", model_input_names="input_ids")
    with pytest.raises(hfbert.ConfigError, match=r"tokenizer_config\.json: field 'model_input_names'"):
        hfbert.AutoTokenizer.from_pretrained(directory)


def test_bad_from_pretrained_arguments_are_named_before_any_file_is_read(tmp_path):
    missing = tmp_path / "not-there"  # a refused call reads nothing: no "no such directory" either
    for arguments, name in (
        (dict(padding_side="up"), "padding_side"),
        (dict(truncation_side="middle"), "truncation_side"),
        (dict(model_input_names="input_ids"), "model_input_names"),
        (dict(split_special_tokens=1), "split_special_tokens"),
        (dict(model_max_length=-3), "model_max_length"),
    ):
        for loader in (hfbert.AutoTokenizer, hfbert.RobertaTokenizer):
            with pytest.raises(hfbert.ConfigError, match=rf"from_pretrained: argument '{name}'"):
                loader.from_pretrained(missing, **arguments)
    with pytest.raises(TypeError, match="padding_sides"):
        hfbert.AutoTokenizer.from_pretrained(missing, padding_sides="left")


def test_sides_set_after_loading_are_checked_at_the_call(folder):
    ours, _ = load_both(folder("roberta"))
    ours.truncation_side = "top"
    with pytest.raises(ValueError, match="truncation_side must be 'right' or 'left', not 'top'"):
        ours(LONG, truncation=True)
    ours.truncation_side, ours.padding_side = "left", "middle"
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', not 'middle'"):
        ours(BATCH, padding=True)


# Pieces a long line is made of, and what separates them: runs that yield no token, and no separator at all.
FRAGMENTS = ["word", "Über", "naïve", "中文", "!", "...", "(x)", "e\u0301", "[MASK]", "[SEP]", "x" * 120, "3.14"]
SEPARATORS = [" ", "  ", "\t", "\n", "\r\n", "\u3000", "\u00a0", "", " " * 700, "\x07" * 700]


@pytest.mark.parametrize("family", ["bert-vocab", "mpnet"])
def test_left_truncation_of_a_long_line_cuts_the_line_and_keeps_its_last_tokens(folder, family):
    """A long line is cut before it is tokenised; truncating on the left, the cut keeps the line's end."""
    ours, reference = load_both(folder(family, truncation_side="left"))
    text = ("Tokenizers should not read all of this. " * 130_000)[:5_000_000] + "The end."
    with ours._lock:
        suffix = ours._shorten_left(text, 256)
    assert 0 < len(suffix) < 10_000 and text.endswith(suffix)
    medium = text[-200_000:]  # small enough for the reference to tokenise whole
    arguments = dict(truncation=True, max_length=256, return_offsets_mapping=True)
    assert_same(ours(medium, **arguments), reference(medium, **arguments))
    generator = random.Random(49)
    for _ in range(40):
        pieces = generator.randint(1, 400)
        line = "".join(generator.choice(FRAGMENTS) + generator.choice(SEPARATORS) for _ in range(pieces))
        arguments = dict(truncation=True, max_length=generator.randint(3, 40), return_offsets_mapping=True)
        assert_same(ours([line, "short"], **arguments), reference([line, "short"], **arguments))


@pytest.mark.parametrize("in_file", [True, False, None], ids=["file-true", "file-false", "file-absent"])
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_cleans_up_as_transformers_5(folder, family, in_file):
    """transformers 5 skips the clean-up for BPE models: "Hello , the is here ." stays as it is for RoBERTa, with
    clean_up_tokenization_spaces true in the file (as 4.3x-4.4x wrote it) or passed to decode."""
    ours, reference = load_both(folder(family, clean_up_tokenization_spaces=in_file))
    batch = reference(SPACED, padding=True, return_tensors="pt")["input_ids"]
    for argument in (None, True, False):
        for skip in (True, False):
            for text in SPACED:
                ids = reference(text)["input_ids"]
                expected = reference.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=argument)
                assert ours.decode(ids, skip, clean_up_tokenization_spaces=argument) == expected
            expected = reference.batch_decode(batch, skip_special_tokens=skip, clean_up_tokenization_spaces=argument)
            assert ours.decode(batch, skip, clean_up_tokenization_spaces=argument) == expected
    cleaned = ours.decode(reference(SPACED[0])["input_ids"], clean_up_tokenization_spaces=True)
    assert (" ," in cleaned) == (family == "roberta")  # the texts do have the patterns the clean-up removes


@pytest.mark.parametrize("family", FAMILIES)
def test_the_bpe_clean_up_override_is_read_from_the_file(folder, family):
    flag = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
    ours, reference = load_both(folder(family, clean_up_tokenization_spaces=True, **{flag: True}))
    assert getattr(ours, flag) is getattr(reference, flag) is True
    for text in SPACED:
        ids = reference(text)["input_ids"]
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)


def test_fill_mask_sequence_equals_the_pipeline_with_clean_up_in_a_roberta_config(tmp_path, capsys):
    directory = family_checkpoint(tmp_path / "roberta", "roberta", "ForMaskedLM")
    edit_config(directory, clean_up_tokenization_spaces=True)
    text = "Paris , is the <mask> of France ."
    fill = transformers.pipeline("fill-mask", model=str(directory), tokenizer=str(directory), device="cpu")
    expected = fill(text, top_k=5)
    assert main(["fill-mask", str(directory), text, "--top-k", "5", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert [p["token"] for p in ours] == [p["token"] for p in expected]
    assert [p["token_str"] for p in ours] == [p["token_str"] for p in expected]
    assert [p["sequence"] for p in ours] == [p["sequence"] for p in expected]
    assert all(" ," in p["sequence"] for p in ours)


def test_embeddings_follow_the_sides_as_sentence_transformers_does(tmp_path):
    """A checkpoint that truncates and pads on the left embeds as `SentenceTransformer.encode` does, past its
    max_seq_length too (before, hfbert kept the first tokens and padded on the right, silently)."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    directory = tmp_path / "left"
    tiny = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    write_random_transformers_checkpoint(directory, vocab_size=30522, hidden_size=32, **tiny)
    with_minilm_pipeline(directory, 32)
    settings = json.loads((directory / "sentence_bert_config.json").read_text())
    (directory / "sentence_bert_config.json").write_text(json.dumps({**settings, "max_seq_length": 24}))
    edit_config(directory, truncation_side="left", padding_side="left")
    texts = [LONG, "short", *TEXTS, " ".join(reversed(TEXTS)), ""]
    reference = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
    expected = reference.encode(texts, convert_to_numpy=True, batch_size=4)
    ours = Embedder(str(directory), batch_size=4).embed(texts).numpy()
    assert ours.shape == expected.shape
    assert float(abs(ours - expected).max()) <= 1e-5  # fp32: hfbert's kernels sum in another order


@pytest.mark.parametrize("family", ["minilm", "xlm-roberta"])
def test_a_tokenizer_in_a_subfolder_loads_as_transformers_loads_it(sources, family, tmp_path):
    """`from_pretrained(path, subfolder=...)`, as transformers takes it (issue 49): the class's and AutoTokenizer's."""
    shutil.copytree(sources[family], tmp_path / "repo" / "tokenizer")
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "repo", subfolder="tokenizer")
    ours = hfbert.AutoTokenizer.from_pretrained(tmp_path / "repo", subfolder="tokenizer")
    assert type(ours).__name__ == type(reference).__name__
    assert_same_calls(ours, reference)
    own_class = type(ours).from_pretrained(tmp_path / "repo", subfolder="tokenizer")
    assert_same_calls(own_class, reference)
    with pytest.raises(FileNotFoundError, match="no folder 'elsewhere'"):
        hfbert.AutoTokenizer.from_pretrained(tmp_path / "repo", subfolder="elsewhere")
