"""`convert`: any supported BERT checkpoint -> a canonical Hugging Face checkpoint, written atomically.

Canonical means what transformers' own `save_pretrained` writes: `config.json`, `model.safetensors` (or
`model-0000i-of-0000n.safetensors` shards and `model.safetensors.index.json`), LayerNorm `weight` / `bias`
names, no legacy buffers, no wrappers, the tied MLM decoder weight not stored (it is the word embeddings).
A backbone-only source is written as transformers' `BertModel` stores it (no prefix); a source with task heads
keeps them, with the backbone under `bert.`, as `BertFor...` models store it. Tokenizer files are copied.

Everything is written into a temporary directory beside the destination and renamed into place at the end, so
an interrupted or failed conversion leaves no destination and no partial files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from torch import Tensor

from converters.checkpoint_files import read_checkpoint
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, TOKENIZER_FILES, resolve_checkpoint
from converters.key_map import BACKBONE_PREFIX, head_of, normalize_name
from converters.loading import match_checkpoint
from converters.writing import atomic_directory, parse_size, write_safetensors

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# A decoder weight equal to the word embeddings is tied: transformers does not store it either.
TIED_DECODER = {
    "cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def copy_tokenizer_files(source: Path, destination: Path) -> list[str]:
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, destination / name)
    return copied


def canonical_tensors(directory: Path, dtype: torch.dtype | None) -> tuple[dict[str, Tensor], dict]:
    """Read, validate against config.json and rename every tensor to transformers' canonical name."""
    from hfbert.config import BertConfig
    from hfbert.model import BertModel

    config = BertConfig.from_json_file(directory / CONFIG_FILE)
    checkpoint = read_checkpoint(directory)
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in BertModel(config).state_dict().items()}
    backbone, report = match_checkpoint(checkpoint, expected, config.max_position_embeddings, str(directory))
    if report.missing == ["pooler.dense.weight", "pooler.dense.bias"]:
        report.missing = []  # a checkpoint without pooler is a valid BertModel(add_pooling_layer=False)
    if report.problems:
        raise CheckpointError(f"{directory}: cannot convert: " + "; ".join(report.problems[:5]))

    normalized = {normalize_name(name): tensor for name, tensor in checkpoint.tensors.items()}
    heads: dict[str, Tensor] = {}
    for name, tensor in normalized.items():
        if head_of(name) is None:
            continue  # backbone tensors and legacy buffers were handled by match_checkpoint
        partner = normalized.get(TIED_DECODER.get(name, ""))
        if partner is not None and torch.equal(partner, tensor):
            continue
        heads[name] = tensor
    prefix = BACKBONE_PREFIX if heads else ""
    tensors = {prefix + name: tensor for name, tensor in backbone.items()} | heads
    if dtype is not None:
        tensors = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
    config_values = json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8"))
    if dtype is not None:
        for key in ("dtype", "torch_dtype"):
            config_values[key] = str(dtype).removeprefix("torch.")
    return tensors, config_values


def convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "2GB",
) -> list[str]:
    """Convert `source` (local directory or repo id) into a canonical checkpoint at `destination`.

    Returns the names of the files written. Raises if `destination` exists; never leaves a partial one.

        >>> convert("google-bert/bert-base-uncased", "bert-base-canonical", dtype=torch.bfloat16)  # doctest: +SKIP
    """
    destination = Path(destination)
    if destination.exists():
        raise CheckpointError(f"{destination}: already exists; choose a new destination or remove it first")
    parse_size(max_shard_size)  # a bad size fails before any work
    directory = resolve_checkpoint(source, include_tokenizer=True)
    tensors, config_values = canonical_tensors(directory, dtype)
    with atomic_directory(destination) as temporary:
        written = write_safetensors(tensors, temporary, max_shard_size)
        (temporary / CONFIG_FILE).write_text(json.dumps(config_values, indent=2) + "\n", encoding="utf-8")
        written.append(CONFIG_FILE)
        written += copy_tokenizer_files(directory, temporary)
    return written
