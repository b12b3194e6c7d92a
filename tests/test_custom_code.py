"""Third adversarial round (issue 33), second pass: the same classes of defect as the listed items, found where the
list was silent: `auto_map` on every command that reads a model, JSON files nested deeply or of the wrong type,
flags read by truthiness as the reference library reads them.

Each test fails on the code before its fix; answers are judged against transformers where it defines them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert

from support.helpers import SMALL_CONFIG, minilm_directory, write_random_transformers_checkpoint
from support.robust import assert_one_line, edit_config, run, write_tiny_mlm

JINA_AUTO_MAP = {
    "AutoConfig": "jinaai/jina-bert-implementation--configuration_bert.JinaBertConfig",
    "AutoModel": "jinaai/jina-bert-implementation--modeling_bert.JinaBertModel",
    "AutoModelForMaskedLM": "jinaai/jina-bert-implementation--modeling_bert.JinaBertForMaskedLM",
}
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefg", "hello", "world"]
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def custom_code_checkpoint(tmp_path) -> Path:
    directory = write_random_transformers_checkpoint(tmp_path / "custom", **SMALL_CONFIG)
    (directory / "vocab.txt").write_text("".join(token + "\n" for token in VOCABULARY))
    return edit_config(directory, auto_map=JINA_AUTO_MAP)


# -- convert: auto_map refused as a load refuses it, with the same opt-out ---------------------------------------


def test_convert_refuses_auto_map_and_takes_the_opt_out(custom_code_checkpoint, tmp_path, capsys):
    import transformers

    from hfbert.tools.convert import convert

    with pytest.raises(hfbert.CheckpointError, match=r"'auto_map' maps AutoModel to custom code .*JinaBertModel"):
        convert(custom_code_checkpoint, tmp_path / "api")
    assert not (tmp_path / "api").exists()
    code, stderr = run(capsys, "convert", custom_code_checkpoint, tmp_path / "cli")
    assert_one_line(code, stderr, "auto_map", "JinaBertModel", "--ignore-auto-map")
    assert not (tmp_path / "cli").exists()

    # Known to be plain BERT: converted as such. The model's custom code is not copied, so the result maps no model
    # to it (a tokenizer's entry stays: its files are copied), and it loads as plain BERT without the opt-out.
    edit_config(custom_code_checkpoint, auto_map={**JINA_AUTO_MAP, "AutoTokenizer": ["tok.MyTokenizer", None]})
    code, stderr = run(capsys, "convert", custom_code_checkpoint, tmp_path / "cli", "--ignore-auto-map")
    assert code == 0, stderr
    written = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert written["auto_map"] == {"AutoTokenizer": ["tok.MyTokenizer", None]}
    ours = hfbert.BertModel.from_pretrained(tmp_path / "cli")
    theirs = transformers.BertModel.from_pretrained(custom_code_checkpoint).eval()
    ids = torch.tensor([[2, 12, 13, 5, 3]])
    with torch.no_grad():
        expected, got = theirs(input_ids=ids).last_hidden_state, ours(input_ids=ids).last_hidden_state
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)


# -- inspect: says the checkpoint maps to custom code -------------------------------------------------------------


def test_inspect_shows_auto_map(custom_code_checkpoint, capsys):
    from hfbert.tools.inspect import describe, summary

    facts = summary(custom_code_checkpoint)
    assert facts["custom_code"]["auto_map"] == JINA_AUTO_MAP
    assert "JinaBertModel" in facts["custom_code"]["refused"]
    text = describe(custom_code_checkpoint)
    assert "auto_map" in text and "JinaBertModel" in text and "--ignore-auto-map" in text
    from hfbert.cli import main

    capsys.readouterr()
    assert main(["inspect", str(custom_code_checkpoint), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["custom_code"]["auto_map"] == JINA_AUTO_MAP
    assert summary(minilm_directory())["custom_code"] is None
    assert "custom code" not in describe(minilm_directory())


# -- parity: refused as the load it runs, with the same opt-out --------------------------------------------------


def test_parity_refuses_auto_map_and_takes_the_opt_out(tmp_path, capsys):
    pytest.importorskip("transformers")
    directory = edit_config(write_tiny_mlm(tmp_path / "mlm"), auto_map=JINA_AUTO_MAP)
    texts = tmp_path / "texts.txt"
    texts.write_text("A first sentence.\nAnother one, a little longer.\n")
    arguments = ["parity", directory, "--texts", texts, "--batch-size", "2"]
    code, stderr = run(capsys, *arguments)
    assert_one_line(code, stderr, "auto_map", "JinaBertModel", "--ignore-auto-map")
    code, stderr = run(capsys, *arguments, "--ignore-auto-map")
    assert code == 0, stderr + capsys.readouterr().out


# -- the sha256 proof kept in the Hub cache ----------------------------------------------------------------------


def test_a_proof_nested_deeply_is_no_proof(tmp_path, monkeypatch):
    """The proof of a cache blob is hfbert's own file: one that cannot be read (nested 100,000 deep) proves nothing,
    so the blob is hashed again (not a RecursionError) and a good proof written over it."""
    from test_hub_cache import MAIN_SHA, REPO_ID, add_snapshot

    import converters.hub as hub

    cache = tmp_path / "hub"
    add_snapshot(cache, MAIN_SHA, {"model.safetensors": (minilm_directory() / "model.safetensors").read_bytes()})
    first = hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache)
    sha256 = first.verified_sha256["model.safetensors"]
    proof = cache / ("models--" + REPO_ID.replace("/", "--")) / hub.PROOF_FOLDER / sha256
    assert proof.is_file()
    proof.write_text(DEEP)
    hashed = []
    original = hub.sha256_of
    monkeypatch.setattr(hub, "sha256_of", lambda path: hashed.append(path) or original(path))
    assert hub.download(REPO_ID, MAIN_SHA, offline=True, cache_dir=cache).verified_sha256 == first.verified_sha256
    assert len(hashed) == 1 and isinstance(json.loads(proof.read_text()), dict)


# -- config_sentence_transformers.json: prompts of the wrong type -------------------------------------------------


@pytest.mark.parametrize(
    "prompts, arguments, field",
    [
        ({"default_prompt_name": "query", "prompts": ["query"]}, [], "prompts is ['query']"),
        ({"prompts": "query"}, ["--prompt-name", "query"], "prompts is 'query'"),
        ({"default_prompt_name": "query", "prompts": {"query": 5}}, [], "prompt 'query' is 5"),
        ({"prompts": {"query": ["x"]}}, ["--prompt-name", "query"], "prompt 'query' is ['x']"),
        ({"default_prompt_name": ["query"], "prompts": {"query": "q: "}}, [], "default_prompt_name is ['query']"),
    ],
)
def test_prompts_of_the_wrong_type_name_the_file_and_field(tmp_path, capsys, prompts, arguments, field):
    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    code, stderr = run(capsys, "embed", directory, "hello", *arguments)
    assert_one_line(code, stderr, "config_sentence_transformers.json", field)


def test_a_prompt_name_whose_prompt_is_null_means_no_prompt_as_in_sentence_transformers(tmp_path):
    """sentence-transformers 6 (`_resolve_prompt`): prompt_name picks `prompts[name]`, null included, so a null
    prompt is no prompt, not the default one."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    from hfbert.tools.embedding import Embedder

    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    prompts = {"prompts": {"query": "query: ", "plain": None}, "default_prompt_name": "query"}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    texts = ["A first sentence.", "Another one, about something else."]
    expected = SentenceTransformer(str(directory), device="cpu").encode(texts, prompt_name="plain")
    got = Embedder(directory, prompt_name="plain").embed(texts).numpy()
    assert np.abs(got - expected).max() < 1e-5
    with_default = SentenceTransformer(str(directory), device="cpu").encode(texts)
    assert np.abs(got - with_default).max() > 1e-3  # the case tells a prompt from none


# -- tokenizer files: lists of special tokens of the wrong type ---------------------------------------------------


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


# -- flags read by truthiness, as transformers reads them -----------------------------------------------------------


@pytest.mark.parametrize("value", [True, 1, "yes", 0, False, None])
def test_legacy_gradient_checkpointing_flag_read_as_transformers_reads_it(value):
    import transformers

    small = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=37, vocab_size=50)
    ours = hfbert.BertModel(hfbert.BertConfig.from_dict({**small, "gradient_checkpointing": value}))
    theirs = transformers.BertModel(transformers.BertConfig(**small, gradient_checkpointing=value))
    assert ours.is_gradient_checkpointing == theirs.is_gradient_checkpointing


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
@pytest.mark.parametrize("value", [1, 0, None])
def test_output_flags_written_as_integers_read_as_transformers_reads_them(tmp_path, flag, value):
    """transformers takes `"output_hidden_states": 1` (or 0, or null) in config.json and reads it by truthiness
    (5.x's own output collection then gives a tuple with holes for 1, so the reference is transformers with the flag
    passed as the bool it means)."""
    import transformers

    directory = edit_config(write_random_transformers_checkpoint(tmp_path / "m", **SMALL_CONFIG), **{flag: value})
    ours = hfbert.BertModel.from_pretrained(directory, attn_implementation="eager")
    theirs = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    ids = torch.tensor([[2, 12, 13, 5, 3]])
    with torch.no_grad():
        expected = getattr(theirs(input_ids=ids, **{flag: bool(value)}), flag[7:])
        got = getattr(ours(input_ids=ids), flag[7:])
    assert (got is None) == (expected is None) == (not value)
    for mine, reference in zip(got or (), expected or (), strict=True):
        assert torch.allclose(mine, reference, atol=1e-5, rtol=0)


# -- torchrun part files: never a file the call did not produce ----------------------------------------------------


def test_torchrun_part_files_never_overwrite_or_delete_a_users_file(tmp_path, monkeypatch):
    """Under torchrun each rank writes a part file that rank 0 deletes after the merge: named `OUT.rank0`, a user's
    file of that name was overwritten by the part, then deleted by the merge."""
    import hfbert.tools.embedding as embedding

    out = tmp_path / "texts.jsonl"
    theirs = tmp_path / "texts.jsonl.rank0"
    theirs.write_text('{"text": "a user\'s own file"}\n')
    before = theirs.read_bytes()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(embedding, "merge_under_torchrun", lambda *arguments: 1)  # no process group here
    embedder = embedding.Embedder(minilm_directory())
    assert embedding.embed_file(embedder, ["one text", "another"], out, progress=False) == 1
    assert theirs.read_bytes() == before
    part = tmp_path / ".texts.jsonl.partial-rank0-of-2"  # hfbert's own temporary namespace
    assert json.loads(part.read_text())["index"] == 0


# -- a module modules.json lists, without its config ----------------------------------------------------------------


def test_a_pooling_module_without_its_config_is_refused_not_mean(tmp_path, capsys):
    """sentence-transformers cannot build a Pooling module whose config.json is missing (TypeError: no
    embedding_dimension); hfbert pooled by the mean instead, silently (the checkpoint may say CLS)."""
    directory = tmp_path / "minilm"
    shutil.copytree(minilm_directory(), directory)
    (directory / "1_Pooling" / "config.json").unlink()
    code, stderr = run(capsys, "embed", directory, "hello")
    assert_one_line(code, stderr, "1_Pooling/config.json", "Pooling")


# -- a CTranslate2 artifact's config.json -------------------------------------------------------------------------


@pytest.mark.parametrize("text", [DEEP, "[1, 2]"])
def test_a_ctranslate2_config_nested_deeply_or_not_an_object_names_the_file(tmp_path, text):
    pytest.importorskip("ctranslate2")
    from hfbert.tools.parity.engines import ctranslate2_engine
    from hfbert.tools.parity.engines.base import ArtifactError

    (tmp_path / "config.json").write_text(text)
    with pytest.raises(
        ArtifactError, match=r"config\.json: (not valid JSON \(nested too deeply\)|expected a JSON object)"
    ):
        ctranslate2_engine.load(tmp_path, hidden_size=96, threads=1)


# -- parity --reference: its config.json checked as hfbert checks one ---------------------------------------------


@pytest.mark.parametrize("text, expected", [(DEEP, "not valid JSON"), ("[1]", "expected a JSON object")])
def test_a_parity_reference_with_a_bad_config_names_the_file(tmp_path, capsys, text, expected):
    pytest.importorskip("transformers")
    model = write_tiny_mlm(tmp_path / "model")
    reference = tmp_path / "reference"
    shutil.copytree(model, reference)
    (reference / "config.json").write_text(text)
    texts = tmp_path / "texts.txt"
    texts.write_text("hello world\n")
    code, stderr = run(capsys, "parity", model, "--reference", reference, "--texts", texts)
    assert_one_line(code, stderr, str(reference / "config.json"), expected)


@pytest.mark.parametrize("class_name", ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"])
@pytest.mark.parametrize("in_config", [None, False, 0])
@pytest.mark.parametrize("in_call", [None, False, 0, True])
def test_return_dict_of_the_config_and_the_call_as_transformers_reads_them(class_name, in_config, in_call):
    """transformers' BertModel returns a tuple when `return_dict` (the call's, else config.json's) is False; its task
    models when it is falsy. hfbert ignored config.json's `return_dict: false` and read the call's as `is False`."""
    import transformers

    small = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=37, vocab_size=50)
    values = small if in_config is None else {**small, "return_dict": in_config}
    ours = getattr(hfbert, class_name)(hfbert.BertConfig.from_dict(values)).eval()
    theirs = getattr(transformers, class_name)(transformers.BertConfig(**values)).eval()
    call = {} if in_call is None else {"return_dict": in_call}
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert isinstance(ours(ids, **call), tuple) == isinstance(theirs(ids, **call), tuple)


def test_embed_and_fill_mask_run_a_checkpoint_whose_config_says_return_dict_false(tmp_path, capsys):
    directory = edit_config(write_tiny_mlm(tmp_path / "mlm"), return_dict=False)
    code, stderr = run(capsys, "fill-mask", directory, "Paris is the [MASK] of France.")
    assert code == 0, stderr
    code, stderr = run(capsys, "embed", directory, "hello world")
    assert code == 0, stderr


@pytest.mark.parametrize("value", [1, 0, None])
def test_clean_up_tokenization_spaces_read_by_truthiness_as_transformers(tmp_path, value):
    import transformers

    directory = tmp_path / "tokenizer"
    shutil.copytree(minilm_directory(), directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": value}))
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hfbert.BertTokenizer.from_pretrained(directory)
    ids = theirs("It isn't here , is it ?")["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)


# -- parity outputs over what an artifact reads beside it ----------------------------------------------------------


@pytest.mark.parametrize(
    "artifact, companion", [("model.xml", "model.bin"), ("model.onnx", "model.onnx_data"), ("m.onnx", "m.onnx.data")]
)
def test_parity_output_over_an_artifacts_weights_is_refused(tmp_path, capsys, artifact, companion):
    """An OpenVINO IR reads its weights from the .bin beside the .xml, an ONNX file its external data: outputs
    over them were written (the .xml / .onnx alone was checked)."""
    model = write_tiny_mlm(tmp_path / "model")
    folder = tmp_path / "deployed"
    folder.mkdir()
    (folder / artifact).write_bytes(b"graph")
    (folder / companion).write_bytes(b"weights")
    for option in ("--json", "--plot"):
        code, stderr = run(capsys, "parity", model, "--artifact", folder / artifact, option, folder / companion)
        assert_one_line(code, stderr, companion, "refusing to overwrite")
        assert (folder / companion).read_bytes() == b"weights"


# -- a vocab.txt tokenizer that is not BERT's WordPiece -------------------------------------------------------------


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
