"""The CLI and the loader under attack (issue 13): nothing lost, nothing half-written, nothing allocated before it
is checked, one line on stderr for every bad input.

Everything runs in-process on tiny checkpoints (`hfbert.cli.main`, SystemExit / return code and captured stderr);
only the signal tests start a process, because a signal must hit a real one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import hfbert
from converters import loading
from converters.errors import CheckpointError
from hfbert.atomic_write import atomic_file, remove_leftovers
from hfbert.cli import main

from conftest import SMALL_CONFIG, minilm_directory

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
# The MiniLM tokenizer's vocabulary, so its tokenizer files fit; one small layer.
TINY = dict(SMALL_CONFIG, vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 4 MB pre-training checkpoint (bert. backbone with pooler, cls.* heads) with the MiniLM tokenizer files."""
    directory = tmp_path_factory.mktemp("tiny") / "tiny-mlm"
    torch.manual_seed(0)
    hfbert.BertForPreTraining(hfbert.BertConfig(**TINY)).save_pretrained(directory)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_directory() / name, directory / name)
    return directory


def copy_of(source: Path, destination: Path) -> Path:
    shutil.copytree(source, destination)
    return destination


def edit_config(directory: Path, **changes) -> Path:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def run(capsys, *arguments) -> tuple[int, str]:
    """Exit code and stderr of `hfbert ARGUMENTS`, in-process; argparse errors exit through SystemExit."""
    try:
        code = main([str(argument) for argument in arguments])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def assert_one_line(code: int, stderr: str, *expected: str) -> None:
    assert code not in (0, None), stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    for text in expected:
        assert text in stderr, stderr


def partials(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if ".partial-" in path.name)


# -- 1. data loss: an output that is its own input ---------------------------------------------------------------


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
def test_embed_refuses_to_write_over_its_input(tiny, tmp_path, capsys, link):
    source = tmp_path / "n.jsonl"
    content = '{"text": "a first text"}\n{"text": "a second one"}\n'
    source.write_text(content)
    out = source
    if link == "symlink":
        (out := tmp_path / "alias.jsonl").symlink_to(source)
    elif link == "hard link":
        os.link(source, out := tmp_path / "alias.jsonl")
    code, stderr = run(capsys, "embed", tiny, "--file", source, "--out", out)
    assert_one_line(code, stderr, "the output is the same file as the input --file")
    assert source.read_text() == content


# -- 2. half-written output --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_failed_embed_leaves_the_previous_output_untouched(tiny, tmp_path, capsys, suffix):
    previous = tmp_path / f"prev{suffix}"
    if suffix == ".npy":
        np.save(previous, np.arange(21, dtype=np.float32).reshape(3, 7))
    else:
        previous.write_text('{"index": 0, "embedding": [1.0]}\n')
    before = previous.read_bytes()
    source = tmp_path / "texts.jsonl"
    lines = [json.dumps({"text": f"text number {number}"}) for number in range(20)] + ['{"no text": 1}']
    source.write_text("\n".join(lines) + "\n")
    code, stderr = run(capsys, "embed", tiny, "--file", source, "--out", previous, "--chunk-size", 5)
    assert_one_line(code, stderr, f"{source}:21:")
    assert previous.read_bytes() == before
    assert partials(tmp_path) == []


def test_successful_embed_replaces_the_output_whole(tiny, tmp_path, capsys):
    out = tmp_path / "out.npy"
    np.save(out, np.zeros((3, 7), dtype=np.float32))
    assert run(capsys, "embed", tiny, "one", "two", "--out", out)[0] == 0
    assert np.load(out).shape == (2, 32) and partials(tmp_path) == []


def test_atomic_file_keeps_the_destination_on_error(tmp_path):
    destination = tmp_path / "kept.txt"
    destination.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(destination) as temporary:
        temporary.write_text("half")
        raise RuntimeError("midway")
    assert destination.read_text() == "old" and partials(tmp_path) == []
    with atomic_file(destination) as temporary:
        temporary.write_text("new")
    assert destination.read_text() == "new" and partials(tmp_path) == []
    assert oct(destination.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- 3. nothing allocated before the config is checked -----------------------------------------------------------


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
    tiny, tmp_path, num_labels, strict, expected, no_initialisation
):
    # 4 MB of weights, a config.json asking for hidden_size 2**24: was 9 s and 4.3 GB of random initialisation
    # before the shape check (2 labels), or a raw 64 GB allocation failure (1024 labels).
    changes = dict(hidden_size=2**24, num_attention_heads=1, intermediate_size=7, num_labels=num_labels)
    directory = edit_config(copy_of(tiny, tmp_path / "huge"), **changes)
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


def test_a_new_head_of_ordinary_size_still_loads(tiny):
    model, info = hfbert.BertForSequenceClassification.from_pretrained(tiny, num_labels=3, output_loading_info=True)
    assert info["report"].new_head == ["classifier.weight", "classifier.bias"]
    assert model.classifier.weight.shape == (3, 32)


def test_fill_mask_on_a_huge_config_is_one_line(tiny, tmp_path, capsys, no_initialisation):
    directory = edit_config(copy_of(tiny, tmp_path / "huge"), hidden_size=2**24, num_attention_heads=1)
    assert_one_line(*run(capsys, "fill-mask", directory, "a [MASK] b"), "hfbert fill-mask:", "shape mismatch")


# -- 4. leftovers of killed runs ---------------------------------------------------------------------------------

KILLED_CONVERT = textwrap.dedent(
    """
    import os, signal, sys
    from converters import convert
    from hfbert.cli import main

    original = convert.write_safetensors

    def write_then_die(tensors, directory, max_shard_size):
        written = original(tensors, directory, max_shard_size)
        os.kill(os.getpid(), getattr(signal, sys.argv[3]))  # the signal arrives with shards on disk
        return written

    convert.write_safetensors = write_then_die
    sys.exit(main(["convert", sys.argv[1], sys.argv[2]]))
    """
)


def convert_killed_by(source: Path, destination: Path, signal_name: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-c", KILLED_CONVERT, str(source), str(destination), signal_name],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def test_sigterm_cleans_up_like_ctrl_c(tiny, tmp_path):
    result = convert_killed_by(tiny, tmp_path / "converted", "SIGTERM")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_the_next_convert_removes_what_sigkill_left(tiny, tmp_path, capsys):
    destination = tmp_path / "converted"
    result = convert_killed_by(tiny, destination, "SIGKILL")
    assert result.returncode == -signal.SIGKILL
    left = partials(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0] / "model.safetensors").is_file()  # what SIGKILL leaves
    assert run(capsys, "convert", tiny, destination)[0] == 0
    assert partials(tmp_path) == [] and (destination / "model.safetensors").is_file()


def test_leftovers_of_live_processes_are_kept(tmp_path):
    destination = tmp_path / "out.npy"
    mine = tmp_path / f".out.npy.partial-{os.getpid()}-abc"
    dead = tmp_path / ".out.npy.partial-999999999-abc"  # beyond pid_max: no such process
    other = tmp_path / ".other.npy.partial-999999999-abc"
    for path in (mine, dead, other):
        path.write_text("x")
    assert remove_leftovers(destination) == [dead]
    assert partials(tmp_path) == sorted([mine.name, other.name])


# -- 5. convert validates what it writes -------------------------------------------------------------------------


def with_tensors(source: Path, destination: Path, change) -> Path:
    directory = copy_of(source, destination)
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def scale_word_embeddings(tensors):
    tensors["bert.embeddings.word_embeddings.weight"][:3, :5] = 1e6  # 15 values beyond fp16's 65504


@pytest.mark.parametrize(
    "change,arguments,expected",
    [
        (scale_word_embeddings, ["--dtype", "float16"], "15 values of tensor 'bert.embeddings.word_embeddings.weight'"),
        (lambda t: t.__setitem__("cls.predictions.bias", torch.zeros(7)), [], "'cls.predictions.bias' has shape (7,)"),
        (lambda t: t["cls.predictions.bias"].__setitem__(4, float("nan")), [], "'cls.predictions.bias' holds 1 NaN"),
        (
            lambda t: t.__setitem__("cls.predictions.extra", torch.zeros(3)),
            [],
            "unknown tensor 'cls.predictions.extra'",
        ),
    ],
    ids=["fp16 overflow", "head shape", "head NaN", "unknown head tensor"],
)
def test_convert_refuses_what_it_cannot_write_faithfully(tiny, tmp_path, capsys, change, arguments, expected):
    source = with_tensors(tiny, tmp_path / "source", change)
    destination = tmp_path / "converted"
    assert_one_line(*run(capsys, "convert", source, destination, *arguments), "hfbert convert:", expected)
    assert not destination.exists() and partials(tmp_path) == []


def test_convert_to_fp16_of_ordinary_weights_still_works(tiny, tmp_path, capsys):
    assert run(capsys, "convert", tiny, tmp_path / "half", "--dtype", "float16")[0] == 0
    assert hfbert.BertForMaskedLM.from_pretrained(tmp_path / "half").dtype == torch.float16


# -- 6. one line on stderr for anything a user can type ----------------------------------------------------------


def test_cli_misuse_is_one_line(tiny, tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    cases = [
        (["fill-mask", tiny, "no mask here"], "exactly one '[MASK]' in the text, found 0"),
        (["fill-mask", tiny, "[MASK] and [MASK]"], "found 2"),
        (["fill-mask", tiny, ""], "found 0"),
        (["fill-mask", tiny, "a [MASK] " + "word " * 100_000], "the text is longer than the model's 64 tokens"),
        (["fill-mask", tiny, "a [MASK]", "--top-k", "-1"], "argument --top-k: must be at least 1, got -1"),
        (["fill-mask", tiny, "a [MASK]", "--top-k", "0"], "argument --top-k: must be at least 1, got 0"),
        (
            ["fill-mask", tiny, "a [MASK]", "--top-k", "1000000"],
            "top_k must be in [1, 30522]",
        ),
        (["fill-mask", tiny, "a [MASK]", "--device", "bogus"], "argument --device: 'bogus' is not a device"),
        (["fill-mask", tiny, "a [MASK]", "--device", "meta"], "argument --device: 'meta': hfbert runs on cpu or cuda"),
        (["embed", tiny, "x", "--device", "meta"], "argument --device"),
        (["embed", tiny, "x", "--device", "cuda:99"], "argument --device: 'cuda:99': this machine has"),
        (["embed", tiny, "x", "--max-length", "-5"], "argument --max-length: must be at least 1, got -5"),
        (["embed", tiny, "x", "--max-length", "65"], "max_length must be in [1, 64]"),
        (["embed", tiny, "x", "--batch-size", "0"], "argument --batch-size"),
        (["embed", tiny, "--file", deep], f"{deep}:1: not a JSON object (RecursionError)"),
        (["embed", tiny, "bytes \udcff that were not UTF-8"], "text 0 is not valid Unicode: '\\udcff' at position 6"),
        (["embed", tiny, "x", "--out", tmp_path / "typo" / "x.npy"], f"the directory {tmp_path / 'typo'} does not"),
        (["convert", tiny, tmp_path / "c", "--max-shard-size", "1e400GB"], "expected a size like 500MB"),
        (["convert", tiny, tmp_path / "c", "--max-shard-size", "9" * 400 + "GB"], "must be between 1 byte and 1PB"),
    ]
    for arguments, expected in cases:
        assert_one_line(*run(capsys, *arguments), expected)
    assert not (tmp_path / "c").exists() and not (tmp_path / "typo").exists()


@pytest.mark.parametrize(
    "file,content,expected",
    [
        ("tokenizer.json", "{ not json", "tokenizer.json: not a valid tokenizer file"),
        ("tokenizer_config.json", "{ not json", "tokenizer_config.json: not valid JSON"),
        ("tokenizer_config.json", "[1]", "tokenizer_config.json: expected a JSON object, got list"),
        ("sentence_bert_config.json", "[1]", "sentence_bert_config.json: expected a JSON object, got list"),
    ],
)
def test_malformed_side_files_are_named(tiny, tmp_path, capsys, file, content, expected):
    directory = copy_of(tiny, tmp_path / "model")
    (directory / file).write_text(content)
    assert_one_line(*run(capsys, "embed", directory, "some text"), "hfbert embed:", expected)


@pytest.mark.parametrize(
    "file,content,expected",
    [
        ("vocab.txt", b"[PAD]\n[UNK]\n\xff\n", "vocab.txt: not valid UTF-8"),
        ("tokenizer_config.json", b'{"added_tokens_decoder": {"5": 3}}', "malformed added_tokens_decoder"),
    ],
)
def test_malformed_vocabulary_files_are_named(tiny, tmp_path, capsys, file, content, expected):
    directory = copy_of(tiny, tmp_path / "model")
    (directory / "tokenizer.json").unlink()  # the tokenizer is then built from vocab.txt + tokenizer_config.json
    (directory / file).write_bytes(content)
    assert_one_line(*run(capsys, "embed", directory, "some text"), "hfbert embed:", expected)


@pytest.mark.parametrize(
    "exception,code,expected",
    [
        (
            RuntimeError("deep inside\na kernel"),
            1,
            "RuntimeError: deep inside a kernel (unexpected",
        ),
        (KeyboardInterrupt(), 130, "hfbert fill-mask: interrupted"),
    ],
)
def test_an_unexpected_exception_is_still_one_line(tiny, capsys, monkeypatch, exception, code, expected):
    def crash(*args, **kwargs):
        raise exception

    monkeypatch.setattr(hfbert.BertForMaskedLM, "fill_mask", crash)
    status, stderr = run(capsys, "fill-mask", tiny, "a [MASK]")
    assert_one_line(status, stderr, expected)
    assert status == code


# -- 9. messages that name the culprit ---------------------------------------------------------------------------


def test_invalid_utf8_names_file_and_line(tiny, tmp_path, capsys):
    source = tmp_path / "texts.txt"
    source.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    assert_one_line(
        *run(capsys, "embed", tiny, "--file", source), f"{source}:3: not valid UTF-8 (byte 0xff at column 8)"
    )


def test_bin_holding_a_non_tensor_names_the_entry(tiny, tmp_path):
    directory = copy_of(tiny, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": {"nested": 1}}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"entry 'bert\.embeddings\.word_embeddings\.weight' holds a dict"):
        hfbert.BertModel.from_pretrained(directory)


def test_dangling_symlink_is_named(tiny, tmp_path):
    directory = copy_of(tiny, tmp_path / "model")
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: a symbolic link to .*gone\.safetensors"):
        hfbert.BertModel.from_pretrained(directory)


@pytest.mark.parametrize("id2label", [{}, {"0": "a", "00": "b", "1": "c"}])
def test_id2label_that_loses_labels_is_refused(tiny, tmp_path, id2label):
    directory = edit_config(copy_of(tiny, tmp_path / "model"), id2label=id2label)
    with pytest.raises(hfbert.ConfigError, match=r"field 'id2label' must map distinct label indices"):
        hfbert.BertForSequenceClassification.from_pretrained(directory)


def test_a_second_weight_file_is_reported_not_silently_ignored(tiny, tmp_path, capsys):
    directory = copy_of(tiny, tmp_path / "model")
    torch.save({"unrelated": torch.zeros(2)}, directory / "pytorch_model.bin")
    _, info = hfbert.BertForMaskedLM.from_pretrained(directory, output_loading_info=True)
    reason = "weight file not read: model.safetensors takes precedence"
    assert info["report"].ignored_by_design["pytorch_model.bin"] == reason
    assert reason in str(info["report"])
    assert main(["inspect", str(directory)]) == 0
    assert reason in capsys.readouterr().out
