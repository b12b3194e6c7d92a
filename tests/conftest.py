"""Shared fixtures: checkpoints in bert-base-uncased's exact layout, a tiny one to break and a sentence-transformers
backbone, written once per session; another model with its own small vocabulary, written per test.

The helpers the tests import (checkpoint builders, the fake Hub, configs, inputs and measures) live in `support/`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support.checkpoints import write_bert_base_layout, write_bert_base_pickle
from support.helpers import (
    HELLO_WORLD_VOCABULARY,
    SMALL_CONFIG,
    write_random_transformers_checkpoint,
    write_sentence_backbone,
)
from support.robust import write_tiny_mlm


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
