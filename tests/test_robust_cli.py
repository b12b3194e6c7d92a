"""The CLI given bad input: anything a user can type, and anything that goes wrong inside, ends in one line on
stderr (no traceback) that names the culprit, with a failing exit code.

Everything runs in-process on a tiny checkpoint (`hfbert.cli.main`, return code and captured stderr). Broken
checkpoint files given to the CLI are in `test_robust_checkpoint_files.py`, outputs in `test_robust_writes.py`.
"""

from __future__ import annotations

import shutil

import pytest

import hfbert

from support.helpers import minilm_directory
from support.robust import assert_one_line, run

# -- anything a user can type --------------------------------------------------------------------------------------


def test_cli_misuse_is_one_line(tiny_mlm, tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    cases = [
        (["fill-mask", tiny_mlm, "no mask here"], "exactly one '[MASK]' in the text, found 0"),
        (["fill-mask", tiny_mlm, "[MASK] and [MASK]"], "found 2"),
        (["fill-mask", tiny_mlm, ""], "found 0"),
        (["fill-mask", tiny_mlm, "a [MASK] " + "word " * 100_000], "the text is longer than the model's 64 tokens"),
        (["fill-mask", tiny_mlm, "a [MASK]", "--top-k", "-1"], "argument --top-k: must be at least 1, got -1"),
        (["fill-mask", tiny_mlm, "a [MASK]", "--top-k", "0"], "argument --top-k: must be at least 1, got 0"),
        (
            ["fill-mask", tiny_mlm, "a [MASK]", "--top-k", "1000000"],
            "top_k must be in [1, 30522]",
        ),
        (["fill-mask", tiny_mlm, "a [MASK]", "--device", "bogus"], "argument --device: 'bogus' is not a device"),
        (
            ["fill-mask", tiny_mlm, "a [MASK]", "--device", "meta"],
            "argument --device: 'meta': hfbert runs on cpu, cuda (cuda:N) or mps",
        ),
        (["embed", tiny_mlm, "x", "--device", "meta"], "argument --device"),
        (["embed", tiny_mlm, "x", "--device", "cuda:99"], "argument --device: 'cuda:99': this machine has"),
        (["embed", tiny_mlm, "x", "--max-length", "-5"], "argument --max-length: must be at least 1, got -5"),
        (["embed", tiny_mlm, "x", "--max-length", "65"], "max_length must be in [1, 64]"),
        (["embed", tiny_mlm, "x", "--batch-size", "0"], "argument --batch-size"),
        (["embed", tiny_mlm, "--file", deep], f"{deep}:1: not a JSON object (RecursionError)"),
        (
            ["embed", tiny_mlm, "bytes \udcff that were not UTF-8"],
            "text 0 is not valid Unicode: '\\udcff' at position 6",
        ),
        (["embed", tiny_mlm, "x", "--out", tmp_path / "typo" / "x.npy"], f"the directory {tmp_path / 'typo'} does not"),
        (["convert", tiny_mlm, tmp_path / "c", "--max-shard-size", "1e400GB"], "expected a size like 500MB"),
        (["convert", tiny_mlm, tmp_path / "c", "--max-shard-size", "9" * 400 + "GB"], "must be between 1 byte and 1PB"),
    ]
    for arguments, expected in cases:
        assert_one_line(*run(capsys, *arguments), expected)
    assert not (tmp_path / "c").exists() and not (tmp_path / "typo").exists()


def test_invalid_utf8_names_file_and_line(tiny_mlm, tmp_path, capsys):
    source = tmp_path / "texts.txt"
    source.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    assert_one_line(
        *run(capsys, "embed", tiny_mlm, "--file", source), f"{source}:3: not valid UTF-8 (byte 0xff at column 8)"
    )


@pytest.fixture(scope="module")
def minilm_embedder():
    from hfbert.tools.embedding import Embedder

    return Embedder(minilm_directory())


def test_a_lone_surrogate_in_a_jsonl_line_names_file_and_line(tmp_path, capsys):
    texts = tmp_path / "texts.jsonl"
    lines = ['{"text": "a"}', '{"text": "x\\ud800"}', '{"text": "a much longer text than the others"}']
    texts.write_text("\n".join(lines * 3) + "\n")
    code, stderr = run(capsys, "embed", minilm_directory(), "--file", texts, "--out", tmp_path / "e.npy")
    assert_one_line(code, stderr, f"{texts}:2:", "not valid Unicode")
    assert not (tmp_path / "e.npy").exists()


def test_a_lone_surrogate_in_a_text_is_named_by_its_place_in_the_input(minilm_embedder, tmp_path, capsys):
    from hfbert.tools.embedding import embed_file

    texts = ["a", "a much longer text than the others", "b", "x\udc80", "c"]
    with pytest.raises(ValueError, match=r"^text 3 is not valid Unicode: '\\udc80' at position 1"):
        minilm_embedder.embed(texts)
    with pytest.raises(ValueError, match=r"^text 3 is not valid Unicode"):
        embed_file(minilm_embedder, iter(texts), tmp_path / "e.npy", chunk_size=2, progress=False)
    code, stderr = run(capsys, "embed", minilm_directory(), *texts)
    assert_one_line(code, stderr, "text 3 is not valid Unicode")


# -- anything that goes wrong inside -------------------------------------------------------------------------------


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
def test_an_unexpected_exception_is_still_one_line(tiny_mlm, capsys, monkeypatch, exception, code, expected):
    def crash(*args, **kwargs):
        raise exception

    monkeypatch.setattr(hfbert.BertForMaskedLM, "fill_mask", crash)
    status, stderr = run(capsys, "fill-mask", tiny_mlm, "a [MASK]")
    assert_one_line(status, stderr, expected)
    assert status == code


# -- outputs over inputs -------------------------------------------------------------------------------------------


def test_no_command_writes_over_one_of_its_inputs(tiny_mlm, tmp_path, capsys):
    """Every output that is an input file, a file of an input checkpoint (also through a hard link), or a name a
    checkpoint loader would read once created, is refused before anything runs; the inputs stay byte for byte."""
    import os

    model = tmp_path / "model"
    shutil.copytree(tiny_mlm, model)
    texts = tmp_path / "t.txt"
    texts.write_text("A sentence.\nAnother one.\n", encoding="utf-8")
    linked = tmp_path / "linked.npy"
    os.link(model / "model.safetensors", linked)
    before = {path: path.read_bytes() for path in [*model.iterdir(), texts]}
    cases = [
        (["parity", model, "--texts", texts, "--json", model / "config.json"], "is a file of the checkpoint MODEL"),
        (["parity", model, "--texts", texts, "--json", texts], "the same file as the input --texts"),
        (["parity", model, "--texts", texts, "--plot", model / "vocab.txt"], "is a file of the checkpoint MODEL"),
        (["parity", model, "--texts", texts, "--json", model / "tokenizer.json"], "is a file of the checkpoint"),
        (["parity", model, "--texts", texts, "--json", model / "modules.json"], "would become the file modules.json"),
        (["parity", model, "--texts", texts, "--json", tmp_path / "r", "--plot", tmp_path / "r"], "name the same file"),
        (["parity", tiny_mlm, "--reference", model, "--texts", texts, "--json", model / "config.json"], "--reference"),
        (["embed", model, "--file", texts, "--out", linked], "is a file of the checkpoint MODEL"),
        (["embed", model, "--file", texts, "--out", model / "pytorch_model.bin.npy"], None),
    ]
    for arguments, expected in cases:
        code, stderr = run(capsys, *arguments)
        if expected is None:  # a new file of another name beside the checkpoint is allowed
            assert code == 0, stderr
            (model / "pytorch_model.bin.npy").unlink()
            continue
        assert_one_line(code, stderr, expected)
    assert {path: path.read_bytes() for path in [*model.iterdir(), texts]} == before


def test_an_output_inside_the_cache_snapshot_is_refused(tiny_mlm, tmp_path, capsys, monkeypatch):
    """A Hub snapshot links to blobs/<sha256>: writing over the blob (or the link) is writing over the model."""
    import hashlib
    import os

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the cache only, no network call

    cache = tmp_path / "hub"
    repo = cache / "models--someone--tiny"
    snapshot = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in tiny_mlm.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    weights = (snapshot / "model.safetensors").resolve()
    out = tmp_path / "weights.npy"
    os.link(weights, out)
    code, stderr = run(capsys, "embed", "someone/tiny", "x", "--cache-dir", cache, "--out", out)
    assert_one_line(code, stderr, "is a file of the checkpoint MODEL")
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == weights.name


@pytest.mark.parametrize(
    "artifact, companion", [("model.xml", "model.bin"), ("model.onnx", "model.onnx_data"), ("m.onnx", "m.onnx.data")]
)
def test_parity_output_over_an_artifacts_weights_is_refused(tiny_mlm, tmp_path, capsys, artifact, companion):
    """An OpenVINO IR reads its weights from the .bin beside the .xml, an ONNX file its external data: outputs
    over them were written (the .xml / .onnx alone was checked)."""
    folder = tmp_path / "deployed"
    folder.mkdir()
    (folder / artifact).write_bytes(b"graph")
    (folder / companion).write_bytes(b"weights")
    for option in ("--json", "--plot"):
        code, stderr = run(capsys, "parity", tiny_mlm, "--artifact", folder / artifact, option, folder / companion)
        assert_one_line(code, stderr, companion, "refusing to overwrite")
        assert (folder / companion).read_bytes() == b"weights"
