"""Broken and hostile checkpoint directories: each ends in one clear exception (one line on the CLI's stderr)
that names the file and the tensor or field, and nothing is allocated before the config is checked against the
weights.

The cases here are written by hand; `test_robust_checkpoint_fuzz.py` draws corruptions of the same files.
"""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file

import hfbert
from converters import loading
from converters.errors import CheckpointError
from hfbert.cli import main

from support.checkpoints import copy_checkpoint
from support.helpers import minilm_directory
from support.robust import DEEP_JSON, TINY_MLM, assert_one_line, copy_of, edit_config, run

# -- config.json and weight files that do not fit ------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path):
    return copy_checkpoint(minilm_directory(), tmp_path / "checkpoint")


def test_a_missing_config_json_is_named(checkpoint):
    (checkpoint / "config.json").unlink()
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: file not found"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_a_config_json_that_is_not_json_is_named(checkpoint):
    (checkpoint / "config.json").write_text("{ not json")
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: not valid JSON"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_an_unsupported_hidden_act_is_named_with_its_value(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["hidden_act"] = "gelu_magic"
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(hfbert.ConfigError, match=r"config\.json: field 'hidden_act' is 'gelu_magic'"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_config_sizes_that_contradict_the_weights_name_both_files_and_shapes(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = 1000
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        hfbert.BertModel.from_pretrained(checkpoint)
    message = str(error.value)
    assert "model.safetensors" in message and "config.json" in message
    assert "embeddings.word_embeddings.weight is (30522, 384) in the checkpoint, (1000, 384) in the model" in message


def test_a_config_with_more_layers_than_the_weights_names_a_missing_tensor(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["num_hidden_layers"] = 7
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"missing from the checkpoint: encoder\.layer\.6\.attention\.self\.query\.weight"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_one_tensor_of_the_wrong_shape_is_named(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["encoder.layer.3.intermediate.dense.weight"] = torch.zeros(1536, 383)
    copy_checkpoint(minilm_directory(), checkpoint, tensors)
    with pytest.raises(
        CheckpointError, match=r"shape mismatch: encoder\.layer\.3\.intermediate\.dense\.weight is \(1536, 383\)"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_one_missing_tensor_is_named(checkpoint):
    tensors = load_file(checkpoint / "model.safetensors")
    del tensors["encoder.layer.2.output.LayerNorm.bias"]
    copy_checkpoint(minilm_directory(), checkpoint, tensors)
    with pytest.raises(
        CheckpointError, match=r"missing from the checkpoint: encoder\.layer\.2\.output\.LayerNorm\.bias"
    ):
        hfbert.BertModel.from_pretrained(checkpoint)


@pytest.mark.parametrize("keep_bytes", [0, 7, 100, 50_000_000])
def test_a_truncated_safetensors_file_is_not_valid(checkpoint, keep_bytes):
    path = checkpoint / "model.safetensors"
    path.write_bytes(path.read_bytes()[:keep_bytes])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_a_safetensors_header_that_is_not_json_is_not_valid(checkpoint):
    path = checkpoint / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:40] = b"#" * 32  # the JSON header now is not JSON
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_a_directory_without_weights_says_what_was_looked_for(checkpoint):
    (checkpoint / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weight file found \(looked for model\.safetensors"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_an_index_naming_a_missing_shard_is_refused(checkpoint):
    shutil.move(checkpoint / "model.safetensors", checkpoint / "model-00001-of-00002.safetensors")
    weight_map = {"embeddings.word_embeddings.weight": "model-00002-of-00002.safetensors"}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"index\.json: shard 'model-00002-of-00002\.safetensors' does not exist"):
        hfbert.BertModel.from_pretrained(checkpoint)


def test_a_path_that_is_neither_a_directory_nor_a_repo_id_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint directory"):
        hfbert.BertModel.from_pretrained(tmp_path / "does-not-exist")


# -- a config cannot make the loader allocate what the checkpoint does not hold ------------------------------------


@pytest.fixture
def no_initialisation(monkeypatch):
    """Fails the test if the loader initialises any parameter (allocates memory) before it raises."""

    def refuse(name, shape, config):
        raise AssertionError(f"initialised {name} {shape} before the checks")

    monkeypatch.setattr(loading, "initial_value", refuse)


BEYOND = r"needs [\d,]+ values .* that the checkpoint does not hold"


@pytest.mark.parametrize(
    "strict,expected", [(True, r"shape mismatch: bert\.embeddings"), (False, BEYOND)], ids=["strict", "not strict"]
)
@pytest.mark.parametrize("num_labels", [2, 1024])
def test_a_config_cannot_imply_more_memory_than_the_checkpoint(
    tiny_mlm, tmp_path, num_labels, strict, expected, no_initialisation
):
    # 4 MB of weights, a config.json asking for hidden_size 2**24: was 9 s and 4.3 GB of random initialisation
    # before the shape check (2 labels), or a raw 64 GB allocation failure (1024 labels).
    changes = dict(hidden_size=2**24, num_attention_heads=1, intermediate_size=7, num_labels=num_labels)
    directory = edit_config(copy_of(tiny_mlm, tmp_path / "huge"), **changes)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=expected):
        hfbert.BertForSequenceClassification.from_pretrained(directory, strict=strict)
    assert time.perf_counter() - start < 60  # the 4 GB allocation took 9 s; the check takes milliseconds


@pytest.mark.parametrize("strict", [True, False])
def test_real_checkpoint_with_a_million_labels_is_refused_before_allocation(tmp_path, strict, no_initialisation):
    # all-MiniLM-L6-v2's config with "num_labels": 1048576 asked for a (1048576, 384) classifier: 2.1 GB peak.
    directory = tmp_path / "minilm"
    directory.mkdir()
    (directory / "model.safetensors").symlink_to(minilm_directory() / "model.safetensors")
    shutil.copy(minilm_directory() / "config.json", directory / "config.json")
    edit_config(directory, num_labels=1048576)
    with pytest.raises(CheckpointError, match=BEYOND + r".*classifier\.weight of shape \(1048576, 384\)"):
        hfbert.BertForSequenceClassification.from_pretrained(directory, strict=strict)


def test_a_new_head_of_ordinary_size_still_loads(tiny_mlm):
    model, info = hfbert.BertForSequenceClassification.from_pretrained(tiny_mlm, num_labels=3, output_loading_info=True)
    assert info["report"].new_head == ["classifier.weight", "classifier.bias"]
    assert model.classifier.weight.shape == (3, 32)


def test_fill_mask_on_a_huge_config_is_one_line(tiny_mlm, tmp_path, capsys, no_initialisation):
    directory = edit_config(copy_of(tiny_mlm, tmp_path / "huge"), hidden_size=2**24, num_attention_heads=1)
    assert_one_line(*run(capsys, "fill-mask", directory, "a [MASK] b"), "hfbert fill-mask:", "shape mismatch")


# -- side files, symbolic links, pickles and second weight files ---------------------------------------------------


@pytest.mark.parametrize(
    "file,content,expected",
    [
        ("tokenizer.json", "{ not json", "tokenizer.json: not a valid tokenizer file"),
        ("tokenizer_config.json", "{ not json", "tokenizer_config.json: not valid JSON"),
        ("tokenizer_config.json", "[1]", "tokenizer_config.json: expected a JSON object, got list"),
        ("sentence_bert_config.json", "[1]", "sentence_bert_config.json: expected a JSON object"),
    ],
)
def test_malformed_side_files_are_named(tiny_mlm, tmp_path, capsys, file, content, expected):
    directory = copy_of(tiny_mlm, tmp_path / "model")
    if file == "sentence_bert_config.json":  # read, as sentence-transformers reads it, through modules.json
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
        (directory / "modules.json").write_text(json.dumps(modules))
    (directory / file).write_text(content)
    assert_one_line(*run(capsys, "embed", directory, "some text"), "hfbert embed:", expected)


@pytest.mark.parametrize(
    "file,content,expected",
    [
        ("vocab.txt", b"[PAD]\n[UNK]\n\xff\n", "vocab.txt: not valid UTF-8"),
        ("tokenizer_config.json", b'{"added_tokens_decoder": {"5": 3}}', "field 'added_tokens_decoder' entry '5' is 3"),
    ],
)
def test_malformed_vocabulary_files_are_named(tiny_mlm, tmp_path, capsys, file, content, expected):
    directory = copy_of(tiny_mlm, tmp_path / "model")
    (directory / "tokenizer.json").unlink()  # the tokenizer is then built from vocab.txt + tokenizer_config.json
    (directory / file).write_bytes(content)
    assert_one_line(*run(capsys, "embed", directory, "some text"), "hfbert embed:", expected)


def test_bin_holding_a_non_tensor_names_the_entry(tiny_mlm, tmp_path):
    directory = copy_of(tiny_mlm, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": {"nested": 1}}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"entry 'bert\.embeddings\.word_embeddings\.weight' holds a dict"):
        hfbert.BertModel.from_pretrained(directory)


def test_a_dangling_symlink_is_named(tiny_mlm, tmp_path):
    directory = copy_of(tiny_mlm, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: a symbolic link to .*gone\.safetensors"):
        hfbert.BertModel.from_pretrained(directory)


@pytest.mark.parametrize("id2label", [{}, {"0": "a", "00": "b", "1": "c"}])
def test_id2label_that_loses_labels_is_refused(tiny_mlm, tmp_path, id2label):
    directory = edit_config(copy_of(tiny_mlm, tmp_path / "model"), id2label=id2label)
    with pytest.raises(hfbert.ConfigError, match=r"field 'id2label' must map distinct label indices"):
        hfbert.BertForSequenceClassification.from_pretrained(directory)


def test_a_second_weight_file_is_reported_not_silently_ignored(tiny_mlm, tmp_path, capsys):
    directory = copy_of(tiny_mlm, tmp_path / "model")
    torch.save({"unrelated": torch.zeros(2)}, directory / "pytorch_model.bin")
    _, info = hfbert.BertForMaskedLM.from_pretrained(directory, output_loading_info=True)
    reason = "weight file not read: model.safetensors takes precedence"
    assert info["report"].ignored_by_design["pytorch_model.bin"] == reason
    assert reason in str(info["report"])
    assert main(["inspect", str(directory)]) == 0
    assert reason in capsys.readouterr().out


# -- casts that make Inf, dtypes no kernel runs --------------------------------------------------------------------


def scaled_copy(tmp_path) -> object:
    tensors = load_file(minilm_directory() / "model.safetensors")
    tensors["embeddings.word_embeddings.weight"][:56, :56] = 1e6  # 3,136 values beyond fp16's 65504
    return copy_checkpoint(minilm_directory(), tmp_path / "large-values", tensors)


def test_a_cast_that_overflows_to_inf_is_refused_naming_the_tensor_and_the_count(tmp_path, capsys):
    directory = scaled_copy(tmp_path)
    code, stderr = run(capsys, "embed", directory, "hello", "--dtype", "float16")  # printed [NaN, ...], exit 0
    assert_one_line(code, stderr, "hfbert embed:", "3,136 values of tensor 'embeddings.word_embeddings.weight'")
    for dtype in (torch.float16, "float16"):
        with pytest.raises(CheckpointError) as error:
            hfbert.BertModel.from_pretrained(directory, dtype=dtype)
        message = str(error.value)
        assert "model.safetensors: cannot load as float16: 3,136 values of tensor" in message
        assert "'embeddings.word_embeddings.weight' overflow to Inf" in message and "65504" in message
    # the same weights load in the dtypes that hold them
    for dtype in (torch.float32, torch.bfloat16):
        model = hfbert.BertModel.from_pretrained(directory, dtype=dtype)
        assert torch.isfinite(model.embeddings.word_embeddings.weight).all()


def test_a_cast_of_a_task_model_names_the_tensor_as_the_checkpoint_stores_it(tiny_mlm, tmp_path):
    tensors = load_file(tiny_mlm / "model.safetensors")
    tensors["cls.predictions.transform.dense.weight"][0, :4] = -1e5
    directory = copy_checkpoint(tiny_mlm, tmp_path / "head", tensors)
    with pytest.raises(CheckpointError, match=r"4 values of tensor 'cls\.predictions\.transform\.dense\.weight'"):
        hfbert.BertForMaskedLM.from_pretrained(directory, dtype=torch.float16)


def test_stored_non_finite_values_are_not_counted_as_overflow(tmp_path):
    """With strict=False a stored Inf loads (and is reported); a cast blames only the values it turned into Inf."""
    tensors = load_file(minilm_directory() / "model.safetensors")
    tensors["embeddings.word_embeddings.weight"][0, 0] = float("inf")
    directory = copy_checkpoint(minilm_directory(), tmp_path / "stored-inf", tensors)
    model, info = hfbert.BertModel.from_pretrained(
        directory, dtype=torch.float16, strict=False, output_loading_info=True
    )
    assert [name for name, _ in info["report"].non_finite] == ["embeddings.word_embeddings.weight"]
    tensors["embeddings.word_embeddings.weight"][1, :7] = -1e5
    copy_checkpoint(minilm_directory(), directory, tensors)
    with pytest.raises(CheckpointError, match=r": 7 values of tensor 'embeddings\.word_embeddings\.weight' overflow"):
        hfbert.BertModel.from_pretrained(directory, dtype=torch.float16, strict=False)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, "float8_e5m2", torch.float8_e5m2])
def test_a_requested_dtype_no_kernel_runs_is_refused_as_a_stored_one_is(tiny_mlm, dtype):
    with pytest.raises(ValueError, match=r"dtype=float8_e[45]m[23](fn)?: parameters must be one of float32, float16"):
        hfbert.BertModel.from_pretrained(tiny_mlm, dtype=dtype)
    with pytest.raises(ValueError, match=r"dtype=float8"):
        hfbert.BertModel._from_config(hfbert.BertConfig(**TINY_MLM), dtype=dtype)


def test_convert_refuses_a_dtype_no_kernel_runs(tiny_mlm, tmp_path):
    from hfbert.tools.convert import convert

    with pytest.raises(ValueError, match=r"dtype=float8_e4m3fn: parameters must be one of"):
        convert(tiny_mlm, tmp_path / "fp8", dtype=torch.float8_e4m3fn)
    assert not (tmp_path / "fp8").exists()


# -- pickles of tensors that are not plain dense values ------------------------------------------------------------


def bin_checkpoint(tiny_mlm, tmp_path, change) -> object:
    directory = copy_of(tiny_mlm, tmp_path / "model")
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    change(tensors)
    torch.save(tensors, directory / "pytorch_model.bin")
    return directory


WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"


def to_sparse(tensors):
    tensors[WORD_EMBEDDINGS] = tensors[WORD_EMBEDDINGS].to_sparse()


def to_meta(tensors):
    tensors[WORD_EMBEDDINGS] = torch.empty(tensors[WORD_EMBEDDINGS].shape, device="meta")


def to_broadcast(tensors):
    tensors[WORD_EMBEDDINGS] = torch.full((1,), 0.01).expand(tensors[WORD_EMBEDDINGS].shape)


def to_overlapping(tensors):
    rows, columns = tensors[WORD_EMBEDDINGS].shape
    tensors[WORD_EMBEDDINGS] = torch.zeros(rows + columns).as_strided((rows, columns), (1, 1))


@pytest.mark.parametrize(
    "change,expected",
    [
        (to_sparse, "is a sparse_coo tensor, not a dense one"),
        (to_meta, r"is a meta tensor \(shape \(30522, 32\), no values stored\)"),
        (to_broadcast, r"of shape \(30522, 32\) claims 976,704 values but its storage holds 1 \(strides \(0, 0\)"),
        (
            to_overlapping,
            r"of shape \(30522, 32\) claims 976,704 values but its storage holds 30,554 \(strides \(1, 1\)",
        ),
    ],
    ids=["sparse", "meta", "stride 0", "overlapping"],
)
def test_tensors_that_are_not_plain_dense_values_are_refused_by_name(tiny_mlm, tmp_path, capsys, change, expected):
    directory = bin_checkpoint(tiny_mlm, tmp_path, change)
    pattern = rf"pytorch_model\.bin: tensor '{WORD_EMBEDDINGS}' .*{expected}"
    for model_class in (hfbert.BertModel, hfbert.BertForMaskedLM):
        with pytest.raises(CheckpointError, match=pattern):
            model_class.from_pretrained(directory)
    code, stderr = run(capsys, "convert", directory, tmp_path / "converted")
    assert_one_line(code, stderr, "hfbert convert:", f"tensor '{WORD_EMBEDDINGS}'")
    assert not (tmp_path / "converted").exists()


def test_a_small_pickle_of_broadcast_tensors_with_bert_base_shapes_is_refused(tmp_path):
    """The issue's case: 23 KB of stride-0 tensors claimed a 110M-parameter model (318 MB written by convert)."""
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in hfbert.BertModel(hfbert.BertConfig()).state_dict().items()}
    directory = tmp_path / "inflating"
    directory.mkdir()
    torch.save({name: torch.full((1,), 0.02).expand(shape) for name, shape in shapes.items()}, directory / "w.bin")
    (directory / "w.bin").rename(directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps(hfbert.BertConfig().to_dict()))
    assert (directory / "pytorch_model.bin").stat().st_size < 100_000
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: tensor 'embeddings\.word_embeddings\.weight'"):
        hfbert.BertModel.from_pretrained(directory)


def test_ordinary_views_in_a_pickle_still_load(tiny_mlm, tmp_path):
    """Slices of one storage (a fused matrix saved as views, old tied decoders) hold every value they claim."""

    def as_slices(tensors):
        query, key = (
            "bert.encoder.layer.0.attention.self.query.weight",
            "bert.encoder.layer.0.attention.self.key.weight",
        )
        fused = torch.cat([tensors[query], tensors[key]])
        tensors[query], tensors[key] = fused[:32], fused[32:]

    directory = bin_checkpoint(tiny_mlm, tmp_path, as_slices)
    reference = hfbert.BertForMaskedLM.from_pretrained(tiny_mlm)
    assert main(["convert", str(directory), str(tmp_path / "converted"), "--max-shard-size", "100KB"]) == 0
    for source in (directory, tmp_path / "converted"):
        model = hfbert.BertForMaskedLM.from_pretrained(source)
        for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
            assert torch.equal(a, b), name


def test_a_safetensors_shape_that_claims_more_values_than_its_bytes_is_refused(checkpoint):
    """Item 9 for safetensors: the format stores every value, and the library checks each byte range against the
    tensor's shape, so an inflating header fails to open (named as an invalid file)."""
    import struct

    data = (checkpoint / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    header["embeddings.LayerNorm.bias"]["shape"] = [30522, 384]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (checkpoint / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
        hfbert.BertModel.from_pretrained(checkpoint)


# -- config.json of what parity reads beside the model -------------------------------------------------------------


@pytest.mark.parametrize("text", [DEEP_JSON, "[1, 2]"])
def test_a_ctranslate2_config_nested_deeply_or_not_an_object_names_the_file(tmp_path, text):
    pytest.importorskip("ctranslate2")
    from hfbert.tools.parity.engines import ctranslate2_engine
    from hfbert.tools.parity.engines.base import ArtifactError

    (tmp_path / "config.json").write_text(text)
    with pytest.raises(
        ArtifactError, match=r"config\.json: (not valid JSON \(nested too deeply\)|expected a JSON object)"
    ):
        ctranslate2_engine.load(tmp_path, hidden_size=96, threads=1)


@pytest.mark.parametrize("text, expected", [(DEEP_JSON, "not valid JSON"), ("[1]", "expected a JSON object")])
def test_a_parity_reference_with_a_bad_config_names_the_file(tiny_mlm, tmp_path, capsys, text, expected):
    pytest.importorskip("transformers")
    reference = tmp_path / "reference"
    shutil.copytree(tiny_mlm, reference)
    (reference / "config.json").write_text(text)
    texts = tmp_path / "texts.txt"
    texts.write_text("hello world\n")
    code, stderr = run(capsys, "parity", tiny_mlm, "--reference", reference, "--texts", texts)
    assert_one_line(code, stderr, str(reference / "config.json"), expected)
