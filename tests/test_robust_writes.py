"""What hfbert writes, under attack: an output is never its own input, a failed or killed run leaves the previous
output untouched and nothing half-written (the next run cleans up after SIGKILL), and convert refuses what it
cannot write faithfully.

Everything runs in-process on a tiny checkpoint (`hfbert.cli.main`, return code and captured stderr); only the
signal tests start a process, because a signal must hit a real one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import hfbert
from converters.atomic_write import atomic_file, remove_leftovers

from support.helpers import minilm_directory
from support.robust import assert_one_line, copy_of, partials, run

# -- an output that is its own input -------------------------------------------------------------------------------


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
def test_embed_refuses_to_write_over_its_input(tiny_mlm, tmp_path, capsys, link):
    source = tmp_path / "n.jsonl"
    content = '{"text": "a first text"}\n{"text": "a second one"}\n'
    source.write_text(content)
    out = source
    if link == "symlink":
        (out := tmp_path / "alias.jsonl").symlink_to(source)
    elif link == "hard link":
        os.link(source, out := tmp_path / "alias.jsonl")
    code, stderr = run(capsys, "embed", tiny_mlm, "--file", source, "--out", out)
    assert_one_line(code, stderr, "the output is the same file as the input --file")
    assert source.read_text() == content


def test_embed_refuses_an_output_that_standard_input_reads(tmp_path):
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a"}\n{"text": "b"}\n')
    before = texts.read_bytes()
    command = [sys.executable, "-m", "hfbert", "embed", str(minilm_directory()), "--file", "-", "--out", str(texts)]
    with open(texts, "rb") as stdin:
        result = subprocess.run(command, stdin=stdin, capture_output=True, timeout=600)
    assert result.returncode == 1, result.stderr
    message = result.stderr.decode()
    assert message.count("\n") == 1 and "standard input" in message and str(texts) in message
    assert texts.read_bytes() == before


# -- half-written output -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_failed_embed_leaves_the_previous_output_untouched(tiny_mlm, tmp_path, capsys, suffix):
    previous = tmp_path / f"prev{suffix}"
    if suffix == ".npy":
        np.save(previous, np.arange(21, dtype=np.float32).reshape(3, 7))
    else:
        previous.write_text('{"index": 0, "embedding": [1.0]}\n')
    before = previous.read_bytes()
    source = tmp_path / "texts.jsonl"
    lines = [json.dumps({"text": f"text number {number}"}) for number in range(20)] + ['{"no text": 1}']
    source.write_text("\n".join(lines) + "\n")
    code, stderr = run(capsys, "embed", tiny_mlm, "--file", source, "--out", previous, "--chunk-size", 5)
    assert_one_line(code, stderr, f"{source}:21:")
    assert previous.read_bytes() == before
    assert partials(tmp_path) == []


def test_successful_embed_replaces_the_output_whole(tiny_mlm, tmp_path, capsys):
    out = tmp_path / "out.npy"
    np.save(out, np.zeros((3, 7), dtype=np.float32))
    assert run(capsys, "embed", tiny_mlm, "one", "two", "--out", out)[0] == 0
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


# -- leftovers of killed runs --------------------------------------------------------------------------------------

KILLED_CONVERT = textwrap.dedent(
    """
    import os, signal, sys
    from hfbert.tools import convert
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


def test_sigterm_cleans_up_like_ctrl_c(tiny_mlm, tmp_path):
    result = convert_killed_by(tiny_mlm, tmp_path / "converted", "SIGTERM")
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_the_next_convert_removes_what_sigkill_left(tiny_mlm, tmp_path, capsys):
    destination = tmp_path / "converted"
    result = convert_killed_by(tiny_mlm, destination, "SIGKILL")
    assert result.returncode == -signal.SIGKILL
    left = partials(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0] / "model.safetensors").is_file()  # what SIGKILL leaves
    assert run(capsys, "convert", tiny_mlm, destination)[0] == 0
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


# -- convert validates what it writes ------------------------------------------------------------------------------


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
def test_convert_refuses_what_it_cannot_write_faithfully(tiny_mlm, tmp_path, capsys, change, arguments, expected):
    source = with_tensors(tiny_mlm, tmp_path / "source", change)
    destination = tmp_path / "converted"
    assert_one_line(*run(capsys, "convert", source, destination, *arguments), "hfbert convert:", expected)
    assert not destination.exists() and partials(tmp_path) == []


def test_convert_to_fp16_of_ordinary_weights_still_works(tiny_mlm, tmp_path, capsys):
    assert run(capsys, "convert", tiny_mlm, tmp_path / "half", "--dtype", "float16")[0] == 0
    assert hfbert.BertForMaskedLM.from_pretrained(tmp_path / "half").dtype == torch.float16


# -- permissions: what a plain open() / mkdir() would give ---------------------------------------------------------


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def modes(directory: Path) -> dict[str, str]:
    """Relative path -> octal permission bits, for `directory` itself ('.') and everything under it."""
    paths = [directory, *directory.rglob("*")]
    return {path.relative_to(directory).as_posix(): oct(path.stat().st_mode & 0o777) for path in paths}


def assert_follows_umask_022(directory: Path) -> None:
    found = modes(directory)
    expected = {path: oct(0o755 if (directory / path).is_dir() else 0o644) for path in found}
    assert found == expected


def test_save_pretrained_follows_the_umask(tmp_path, umask_022):
    hfbert.BertModel.from_pretrained(minilm_directory()).save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "1_Pooling" / "config.json").is_file()  # a subfolder too
    assert_follows_umask_022(tmp_path / "saved")


def test_save_pretrained_of_a_legacy_bin_and_shards_follows_the_umask(tiny_mlm, tmp_path, umask_022):
    model = hfbert.BertForMaskedLM.from_pretrained(tiny_mlm)
    model.save_pretrained(tmp_path / "bin", safe_serialization=False)
    model.save_pretrained(tmp_path / "shards", max_shard_size="500KB")
    assert_follows_umask_022(tmp_path / "bin")
    assert_follows_umask_022(tmp_path / "shards")


def test_convert_follows_the_umask(tiny_mlm, tmp_path, capsys, umask_022):
    assert run(capsys, "convert", tiny_mlm, tmp_path / "converted")[0] == 0
    assert_follows_umask_022(tmp_path / "converted")


def test_a_stricter_umask_is_followed_too(tiny_mlm, tmp_path):
    previous = os.umask(0o077)
    try:
        hfbert.BertForMaskedLM.from_pretrained(tiny_mlm).save_pretrained(tmp_path / "private")
    finally:
        os.umask(previous)
    found = modes(tmp_path / "private")
    assert found == {path: oct(0o700 if path == "." else 0o600) for path in found}


def test_atomic_file_keeps_the_mode_of_the_file_it_replaces(tmp_path, umask_022):
    private, new = tmp_path / "private.jsonl", tmp_path / "new.jsonl"
    private.write_text("old")
    private.chmod(0o600)
    for destination in (private, new):
        with atomic_file(destination) as temporary:
            temporary.write_text("new")
    assert private.read_text() == "new" and oct(private.stat().st_mode & 0o777) == oct(0o600)
    assert oct(new.stat().st_mode & 0o777) == oct(0o644)


def test_embed_onto_an_existing_private_file_keeps_it_private(tiny_mlm, tmp_path, capsys, umask_022):
    out = tmp_path / "embeddings.jsonl"
    out.write_text("")
    out.chmod(0o600)
    assert run(capsys, "embed", tiny_mlm, "one", "--out", out)[0] == 0
    assert out.read_text().strip() and oct(out.stat().st_mode & 0o777) == oct(0o600)


def test_a_save_into_an_existing_folder_keeps_the_modes_there(tiny_mlm, tmp_path, umask_022):
    folder = tmp_path / "saved"
    model = hfbert.BertForMaskedLM.from_pretrained(tiny_mlm)
    model.save_pretrained(folder)
    folder.chmod(0o750)
    (folder / "config.json").chmod(0o600)
    model.save_pretrained(folder, safe_serialization=False)  # pytorch_model.bin is new, config.json replaced
    found = modes(folder)
    assert found.pop(".") == oct(0o750) and found.pop("config.json") == oct(0o600)
    assert set(found.values()) == {oct(0o644)} and "pytorch_model.bin" in found


def test_the_example_writes_a_model_others_can_read(tiny_mlm, tmp_path):
    root = Path(__file__).resolve().parents[1]
    output = tmp_path / "finetuned"
    command = [sys.executable, str(root / "examples" / "finetune_classifier.py"), "--model", str(tiny_mlm)]
    command += ["--epochs", "1", "--output", str(output)]
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=root,
        env={**environment, "PYTHONPATH": str(root)},
        preexec_fn=lambda: os.umask(0o022),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert (output / "model.safetensors").is_file()
    assert_follows_umask_022(output)
