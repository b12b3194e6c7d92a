"""The CLI given bad input: anything a user can type, and anything that goes wrong inside, ends in one line on
stderr (no traceback) that names the culprit, with a failing exit code.

Everything runs in-process on a tiny checkpoint (`hfbert.cli.main`, return code and captured stderr). Broken
checkpoint files given to the CLI are in `test_robust_checkpoint_files.py`, outputs in `test_robust_writes.py`.
"""

from __future__ import annotations

import pytest

import hfbert

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
            "argument --device: 'meta': hfbert runs on cpu or cuda",
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
