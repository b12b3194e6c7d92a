"""Shared fixtures: checkpoints in bert-base-uncased's exact layout, a tiny one to break and a sentence-transformers
backbone, written once per session; another model with its own small vocabulary, written per test.

The helpers the tests import (checkpoint builders, the fake Hub, configs, inputs and measures) live in `support/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from support.checkpoints import (
    Layout,
    small_layout_config,
    write_bert_base_layout,
    write_bert_base_pickle,
    write_small_layout,
)
from support.helpers import (
    HELLO_WORLD_VOCABULARY,
    SMALL_CONFIG,
    write_random_transformers_checkpoint,
    write_sentence_backbone,
)
from support.robust import write_tiny_mlm


@pytest.fixture(scope="session", autouse=True)
def hfbert_cache_in_a_temporary_folder(tmp_path_factory):
    """hfbert's on-disk caches (the measured kernel choices, `hfbert/inference/kernel_cache.py`) go to this session's
    temporary folder, for the tests and every subprocess they start: a test never writes to the user's ~/.cache."""
    previous = os.environ.get("HFBERT_CACHE")
    os.environ["HFBERT_CACHE"] = str(tmp_path_factory.mktemp("hfbert-cache"))
    yield
    if previous is None:
        os.environ.pop("HFBERT_CACHE", None)
    else:
        os.environ["HFBERT_CACHE"] = previous


@pytest.fixture(scope="session")
def bert_base_tensors(tmp_path_factory) -> dict[str, torch.Tensor]:
    return write_bert_base_layout(tmp_path_factory.getbasetemp() / "bert-base-safetensors")


@pytest.fixture(scope="session")
def bert_base_safetensors_dir(bert_base_tensors, tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "bert-base-safetensors"


@pytest.fixture(scope="session")
def bert_base_pickle_dir(bert_base_tensors, tmp_path_factory) -> Path:
    directory = tmp_path_factory.getbasetemp() / "bert-base-pickle"
    write_bert_base_pickle(directory, bert_base_tensors)
    return directory


@pytest.fixture(scope="session")
def small_layout_tensors(tmp_path_factory) -> dict[str, torch.Tensor]:
    """`support.checkpoints.write_small_layout`: bert-base-uncased's file layout at 2 layers of hidden 96."""
    return write_small_layout(tmp_path_factory.getbasetemp() / "small-layout-safetensors")


@pytest.fixture(scope="session")
def small_layout_safetensors_dir(small_layout_tensors, tmp_path_factory) -> Path:
    return tmp_path_factory.getbasetemp() / "small-layout-safetensors"


@pytest.fixture(scope="session")
def small_layout_pickle_dir(small_layout_tensors, tmp_path_factory) -> Path:
    directory = tmp_path_factory.getbasetemp() / "small-layout-pickle"
    write_bert_base_pickle(directory, small_layout_tensors, small_layout_config())
    return directory


@pytest.fixture(params=["small layout", pytest.param("bert-base", marks=pytest.mark.slow)])
def layout(request) -> Layout:
    """bert-base-uncased's file layout at 2 layers of hidden 96 in the default run, at its own size in the slow one
    (`support.checkpoints.Layout`: its folders, tensors and config)."""
    return Layout(request.param, request.getfixturevalue)


@pytest.fixture(params=["in-process", pytest.param("subprocess", marks=pytest.mark.slow)])
def hfbert_command(request, capsys):
    """`hfbert_command(*arguments, stdin=b"...")` -> `support.cli.Ran` (returncode, stdout, stderr): `hfbert ARGUMENTS`
    in-process in the default run, as `python -m hfbert` in a fresh process in the slow one (`support.cli`)."""
    from support.cli import in_process, in_subprocess

    if request.param == "subprocess":
        return in_subprocess
    return lambda *arguments, stdin=None: in_process(capsys, *arguments, stdin=stdin)


@pytest.fixture(scope="session")
def tiny_mlm(tmp_path_factory) -> Path:
    """A 4 MB pre-training checkpoint with the MiniLM tokenizer files (`support.robust.write_tiny_mlm`); tests that
    change it change a copy."""
    return write_tiny_mlm(tmp_path_factory.mktemp("tiny") / "tiny-mlm")


@pytest.fixture(scope="session")
def sentence_backbone(tmp_path_factory) -> Path:
    """`support.helpers.write_sentence_backbone`: read by the tests, never changed."""
    return write_sentence_backbone(tmp_path_factory.mktemp("backbone") / "bert")


@pytest.fixture
def other_model(tmp_path) -> Path:
    """A checkpoint with a vocab.txt-only tokenizer of its own 14 tokens (no tokenizer.json, no
    special_tokens_map.json) and no sentence-transformers files."""
    directory = write_random_transformers_checkpoint(tmp_path / "other", **dict(SMALL_CONFIG, vocab_size=14))
    (directory / "vocab.txt").write_text("".join(token + "\n" for token in HELLO_WORLD_VOCABULARY))
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 64}))
    return directory


@pytest.fixture(scope="session")
def real_mpnet(request) -> Path:
    """sentence-transformers/all-mpnet-base-v2 with its real weights (`support.mpnet`), read-only; skips naming the
    packages where they are not installed."""
    from support.mpnet import MissingPackagesError, mpnet_directory

    try:
        return mpnet_directory(request.config.cache.mkdir("hfbert-real-checkpoints"))
    except MissingPackagesError as missing:
        pytest.skip(str(missing))
