"""Helpers the robustness tests (`test_robust_*.py`) share: a tiny pre-training checkpoint to break, copies of it,
and the CLI run in-process with the one-line-on-stderr promise checked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from support.helpers import SMALL_CONFIG, with_minilm_tokenizer

# The MiniLM tokenizer's vocabulary, so its tokenizer files fit; one small layer.
TINY_MLM = dict(SMALL_CONFIG, vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
# JSON nested 100,000 deep: Python's json module raises RecursionError on it.
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def write_tiny_mlm(directory: Path) -> Path:
    """A 4 MB pre-training checkpoint (bert. backbone with pooler, cls.* heads) with the MiniLM tokenizer files."""
    import hfbert

    torch.manual_seed(0)
    hfbert.BertForPreTraining(hfbert.BertConfig(**TINY_MLM)).save_pretrained(directory)
    return with_minilm_tokenizer(directory)


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
    from hfbert.cli import main

    try:
        code = main([str(argument) for argument in arguments])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def assert_one_line(code: int, stderr: str, *expected: str) -> None:
    """A failure (exit code neither 0 nor None), one line on stderr, no traceback, every `expected` text in it."""
    assert code not in (0, None), stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    for text in expected:
        assert text in stderr, stderr


def partials(directory: Path) -> list[str]:
    """The names of the temporary files and folders an atomic write left in `directory`."""
    return sorted(path.name for path in directory.iterdir() if ".partial-" in path.name)
