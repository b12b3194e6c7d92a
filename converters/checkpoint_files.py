"""Reading the weight files of a checkpoint directory: which files, and their tensors.

Preference order (the first one present wins): `model.safetensors`, `model.safetensors.index.json` (shards),
`pytorch_model.bin`, `pytorch_model.bin.index.json`. Safetensors files are memory-mapped, so reading costs no
copy. Pickled `.bin` files are read only through `torch.load(weights_only=True)`, which refuses any object
that is not a tensor or plain container: no code from a checkpoint ever runs. A pickle can also hold tensors
that are not plain dense values: sparse or meta tensors, and tensors whose storage holds fewer values than their
shape claims (`torch.full((1,), v).expand(30522, 768)` is stored as one value, a 94 MB tensor in 4 bytes). Each
is refused by name (`dense_values_problem`); a safetensors file cannot hold any of them (its format stores every
value, and the library checks each tensor's byte range against its shape).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from converters.errors import CheckpointError
from converters.json_files import read_json

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILE_PREFERENCE = (SAFETENSORS_FILE, SAFETENSORS_INDEX, PICKLE_FILE, PICKLE_INDEX)


@dataclass
class CheckpointTensors:
    """Every tensor of a checkpoint, by its stored name, and the file each came from."""

    tensors: dict[str, Tensor] = field(default_factory=dict)
    origin: dict[str, Path] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    # Weight files present but not read, because one earlier in WEIGHT_FILE_PREFERENCE won: name -> why.
    not_read: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, tensor: Tensor, file: Path) -> None:
        if name in self.tensors:
            raise CheckpointError(f"{file}: tensor '{name}' is also stored in {self.origin[name]}")
        self.tensors[name] = tensor
        self.origin[name] = file


def find_weight_file(directory: Path) -> Path:
    """The weight file (or shard index) this directory would be loaded from."""
    for name in WEIGHT_FILE_PREFERENCE:
        if (directory / name).is_file():
            return directory / name
        if (directory / name).is_symlink():  # is_file() follows links: a dangling one would read as "no file"
            raise CheckpointError(
                f"{directory / name}: a symbolic link to {os.readlink(directory / name)}, which does not exist "
                f"(an incomplete download or a moved cache?)"
            )
    raise CheckpointError(f"{directory}: no weight file found (looked for {', '.join(WEIGHT_FILE_PREFERENCE)})")


def read_checkpoint(directory: Path) -> CheckpointTensors:
    """Read every tensor of the checkpoint in `directory` (memory-mapped where the format allows)."""
    weight_file = find_weight_file(directory)
    checkpoint = CheckpointTensors()
    for name in WEIGHT_FILE_PREFERENCE:
        if name != weight_file.name and (directory / name).is_file():
            checkpoint.not_read[name] = f"weight file not read: {weight_file.name} takes precedence"
    if weight_file.name.endswith(".index.json"):
        weight_map = read_shard_index(weight_file)
        for shard in dict.fromkeys(weight_map.values()):
            read_weight_file(shard, checkpoint)
        for name, shard in weight_map.items():
            if checkpoint.origin.get(name) != shard:
                raise CheckpointError(
                    f"{weight_file}: tensor '{name}' is listed in shard '{shard.name}' but not stored there"
                )
    else:
        read_weight_file(weight_file, checkpoint)
    return checkpoint


def read_shard_index(index_file: Path, must_exist: bool = True) -> dict[str, Path]:
    """tensor name -> shard file, from a `*.index.json`; each shard checked to lie in the index's directory
    (and to exist)."""
    try:
        index = read_json(index_file, error=CheckpointError)
    except OSError as error:
        raise CheckpointError(f"{index_file}: cannot read the shard index: {error}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_file}: expected a 'weight_map' object of tensor name -> shard file name")
    if not weight_map:
        raise CheckpointError(f"{index_file}: the 'weight_map' lists no tensors")
    directory = index_file.parent
    shards = {}
    for shard_name in dict.fromkeys(weight_map.values()):
        # A plain file name, checked lexically: in the Hugging Face cache every file is a symlink into blobs/,
        # so resolving links would not tell an escape from a normal shard.
        if Path(shard_name).name != shard_name or shard_name in (".", "..") or "\\" in shard_name:
            raise CheckpointError(
                f"{index_file}: shard '{shard_name}' is outside the checkpoint directory; shard names must be plain "
                f"file names"
            )
        # A safetensors index never sends a file to the pickle reader.
        if index_file.name.endswith(".safetensors.index.json") and not shard_name.endswith(".safetensors"):
            raise CheckpointError(f"{index_file}: shard '{shard_name}' is not a .safetensors file")
        shard = directory / shard_name
        if must_exist and not shard.is_file():
            raise CheckpointError(f"{index_file}: shard '{shard_name}' does not exist in {directory}")
        shards[shard_name] = shard
    return {name: shards[shard_name] for name, shard_name in weight_map.items()}


def read_weight_file(path: Path, checkpoint: CheckpointTensors) -> None:
    checkpoint.files.append(path)
    if path.suffix == ".safetensors":
        _read_safetensors(path, checkpoint)
    else:
        _read_pickle(path, checkpoint)


def _read_safetensors(path: Path, checkpoint: CheckpointTensors) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as file:
            for name in file.keys():
                checkpoint.add(name, file.get_tensor(name), path)
    except SafetensorError as error:
        raise CheckpointError(f"{path}: not a valid safetensors file ({error}); re-download or re-convert it") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error}") from None


def _read_pickle(path: Path, checkpoint: CheckpointTensors) -> None:
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            # Files saved before PyTorch 1.6 are not zip archives and cannot be memory-mapped.
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(
            f"{path}: refused to unpickle: the file holds objects other than tensors ({first_line}). hfbert loads "
            f".bin files only with torch.load(weights_only=True) and never runs code from a checkpoint; convert "
            f"trusted files to safetensors."
        ) from None
    except Exception as error:  # a corrupt archive or pickle fails anywhere in torch.load, with any exception type
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of tensor name -> tensor, got a {type(state).__name__}")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, Tensor):
            raise CheckpointError(
                f"{path}: expected a dict of tensor name -> tensor, but entry {name!r} holds a {type(value).__name__}"
                + ("" if isinstance(name, str) else f" under a {type(name).__name__} key")
            )
    for name, tensor in state.items():
        problem = dense_values_problem(tensor)
        if problem:
            raise CheckpointError(f"{path}: tensor '{name}' {problem}")
    for name, tensor in state.items():
        checkpoint.add(name, tensor, path)


def dense_values_problem(tensor: Tensor) -> str:
    """'' for a dense tensor whose storage holds every value its shape claims; else what it is instead."""
    if tensor.is_meta:
        return f"is a meta tensor (shape {tuple(tensor.shape)}, no values stored)"
    if tensor.layout != torch.strided:
        return f"is a {str(tensor.layout).removeprefix('torch.')} tensor, not a dense one (save tensor.to_dense())"
    size = tensor.element_size()
    held = max(tensor.untyped_storage().nbytes() // size - tensor.storage_offset(), 0)
    if tensor.numel() > held:
        return (
            f"of shape {tuple(tensor.shape)} claims {tensor.numel():,} values but its storage holds {held:,} "
            f"(strides {tensor.stride()}: a broadcast or overlapping view; save tensor.contiguous())"
        )
    return ""
