"""Writing checkpoints: safetensors files (sharded above a size limit) into a directory that appears atomically.

Used by `hfbert convert` and `save_pretrained`. Shard names and the index follow transformers:
`model-00001-of-00003.safetensors` and `model.safetensors.index.json` with `metadata.total_size`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from converters.atomic_write import temporary_sibling
from converters.checkpoint_files import PICKLE_FILE, SAFETENSORS_FILE, SAFETENSORS_INDEX
from converters.hub import TOKENIZER_FILES

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_MAX_SHARD_SIZE = 10**15  # beyond any disk: a larger value is a typo
_WEIGHT_FILE = re.compile(
    r"^(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json|pytorch_model\.bin)$"
)


def parse_size(text: str | int) -> int:
    """'2GB' -> 2_000_000_000 (decimal units, as transformers; KiB/MiB/GiB binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        match = _SIZE.match(text) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"max_shard_size {text!r}: expected a size like 500MB or 2GB")
        # Exact decimal arithmetic: float() would turn a 400-digit size into inf and int(inf) raise OverflowError.
        size = int(Fraction(match.group(1)) * _UNITS[(match.group(2) or "B").upper()])
    if not 0 < size <= _MAX_SHARD_SIZE:
        raise ValueError(f"max_shard_size {text!r}: must be between 1 byte and 1PB")
    return size


def write_safetensors(tensors: dict[str, Tensor], directory: Path, max_shard_size: str | int) -> list[str]:
    """Write one file, or shards of at most `max_shard_size` bytes plus an index; return the file names."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, Tensor]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and shard_bytes + size > limit:
            shards.append({})
            shard_bytes = 0
        # clone: safetensors refuses tensors that share storage (e.g. views into one memory-mapped pickle)
        shards[-1][name] = tensor.detach().contiguous().clone()
        shard_bytes += size
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], directory / SAFETENSORS_FILE, metadata=metadata)
        return [SAFETENSORS_FILE]
    names = [f"model-{index:05d}-of-{len(shards):05d}.safetensors" for index in range(1, len(shards) + 1)]
    weight_map = {}
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, directory / name, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [*names, SAFETENSORS_INDEX]


def write_pickle(
    tensors: dict[str, Tensor], directory: Path, save: Callable[[Any, Path], Any] | None = None
) -> list[str]:
    """The legacy `pytorch_model.bin` (plain tensors only, so `torch.load(weights_only=True)` reads it), written by
    `save(obj, path)` (default `torch.save`; accelerate passes its own)."""
    (save or torch.save)(
        {name: tensor.detach().contiguous().clone() for name, tensor in tensors.items()}, directory / PICKLE_FILE
    )
    return [PICKLE_FILE]


@contextmanager
def atomic_directory(destination: Path, *, replace_files: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `destination`; on success it becomes `destination`, on any error it is
    removed and `destination` is untouched.

    A new destination appears by one rename. With `replace_files=True` an existing destination is updated file by
    file (each `os.replace` is atomic), and weight files of an earlier save that the new one does not write are
    removed afterwards, so old shards never mix with new ones.
    """
    # Beside the destination, named after this process: a run killed by SIGKILL leaves it behind, and the next
    # write to this destination removes it (converters.atomic_write.remove_leftovers).
    temporary = temporary_sibling(destination, directory=True)
    try:
        yield temporary
        if not destination.exists():
            os.rename(temporary, destination)
            return
        if not replace_files:
            raise FileExistsError(f"{destination}: already exists")
        written = {file.name for file in temporary.iterdir()}
        for file in temporary.iterdir():
            if file.is_dir():
                shutil.rmtree(destination / file.name, ignore_errors=True)
            os.replace(file, destination / file.name)
        for stale in destination.iterdir():
            if _WEIGHT_FILE.match(stale.name) and stale.name not in written:
                stale.unlink()
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def copy_tokenizer_files(source: Path, destination: Path) -> list[str]:
    """Copy the tokenizer files `source` has into `destination`; returns their names."""
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, destination / name)
    return copied
