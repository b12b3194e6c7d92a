"""Shared fixtures: checkpoints in bert-base-uncased's exact layout and a tiny one to break, written once per session.

The helpers the tests import (checkpoint builders, the fake Hub, configs, inputs and measures) live in `support/`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from support.checkpoints import write_bert_base_layout, write_bert_base_pickle
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
