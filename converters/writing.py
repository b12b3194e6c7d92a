"""Writing checkpoints: safetensors files (sharded above a size limit) into a directory that appears atomically.

Used by `hfbert convert` and `save_pretrained`. Shards are cut by huggingface_hub's
`split_torch_state_dict_into_shards`, as transformers' `save_pretrained` cuts them, so the files are the ones
transformers writes: `model-00001-of-00003.safetensors` and `model.safetensors.index.json` with
`metadata.total_parameters` / `metadata.total_size`, keys sorted, two-space indent.

A save into an existing folder replaces what the model owns, as transformers' `save_pretrained` does: config.json
and its weights. Weight files of the written format's naming that the new save does not write (old shards, an old
index or single file) are removed, and, for a `pytorch_model.bin` save, the safetensors weights every loader would
read instead of it. Nothing else is deleted or overwritten: tokenizer files, sentence-transformers files, a
README.md, the user's notes stay as a tokenizer, sentence-transformers or the user wrote them, in this process or
earlier (`copy_model_files` adds the source checkpoint's tokenizer / pipeline files only where the folder has none).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from converters.atomic_write import follow_umask, mode_for, temporary_sibling
from converters.checkpoint_files import PICKLE_FILE, SAFETENSORS_INDEX
from converters.hub import TOKENIZER_FILES, sentence_transformers_files

# Our own parser, not huggingface_hub's `parse_size_to_int`, which (2.4) raises OverflowError on "1e400GB" and on a
# 400-digit size, takes "-5GB" (every tensor then gets a shard of its own) and knows neither "500B" nor "500MiB".
# Its decimal units give the same byte counts as ours (tests/test_convert_inspect.py checks it).
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_MAX_SHARD_SIZE = 10**15  # beyond any disk: a larger value is a typo
_SHARD_PATTERN = "model{suffix}.safetensors"
# The weight files of one format (whole, index, shards), by transformers' names.
_SAFETENSORS_WEIGHTS = re.compile(r"^(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json)$")
_PICKLE_WEIGHTS = re.compile(r"^(pytorch_model(-\d{5}-of-\d{5})?\.bin|pytorch_model\.bin\.index\.json)$")
# sentence-transformers' model card: copied by neither convert nor save_pretrained.
_MODEL_CARD = "README.md"
_MODULE_FOLDER = re.compile(r"^[0-9]+_")  # sentence-transformers' module folders: 1_Pooling, 2_Dense, ...


def parse_size(text: str | int) -> int:
    """'2GB' -> 2_000_000_000 (decimal units, as transformers and huggingface_hub; KiB/MiB/GiB/TiB binary)."""
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
    """Write one file, or shards of at most `max_shard_size` bytes plus an index; return the file names.

    The split is huggingface_hub's, computed on meta stand-ins (shape and dtype only): each tensor counts its own
    bytes, as in transformers' saves of a model's parameters, where `get_torch_storage_size` would count the whole
    storage of a view (a slice of a fused matrix) and force tensors sharing one storage into one shard. Only one
    shard at a time is copied, and only the tensors safetensors cannot write as they are.
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    stand_ins = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta") for name, tensor in tensors.items()}
    split = split_torch_state_dict_into_shards(stand_ins, filename_pattern=_SHARD_PATTERN, max_shard_size=limit)
    for filename, names in split.filename_to_tensors.items():
        save_file(_standalone({name: tensors[name] for name in names}), directory / filename, metadata={"format": "pt"})
    written = list(split.filename_to_tensors)
    if split.is_sharded:
        parameters = sum(tensor.numel() for tensor in tensors.values())
        index = {"metadata": {"total_parameters": parameters, **split.metadata}, "weight_map": split.tensor_to_filename}
        (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(SAFETENSORS_INDEX)
    return written


def _standalone(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The tensors as safetensors writes them: contiguous, each the whole of its own storage (it refuses tensors
    that share memory, e.g. views into one pickled storage); those that are not are copied."""
    result, seen = {}, set()
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        storage = tensor.untyped_storage()
        whole = tensor.is_contiguous() and tensor.storage_offset() == 0
        whole = whole and storage.nbytes() == tensor.numel() * tensor.element_size()
        if not whole or (storage.nbytes() and storage.data_ptr() in seen):
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        elif storage.nbytes():
            seen.add(storage.data_ptr())
        result[name] = tensor
    return result


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

    A new destination appears by one rename, with the permissions `mkdir()` / `open()` give under the umask (not
    mkdtemp's 0700). With `replace_files=True` an existing destination is updated file by file (each `os.replace`
    is atomic; a file replaced keeps its mode), then the weight files of an earlier save that this one replaces
    are removed (`remove_stale_weights`), so old shards never mix with new ones. Every other file stays.
    """
    # Beside the destination, named after this process: a run killed by SIGKILL leaves it behind, and the next
    # write to this destination removes it (converters.atomic_write.remove_leftovers).
    temporary = temporary_sibling(destination, directory=True)
    try:
        yield temporary
        follow_umask(temporary)
        if not destination.exists():
            os.rename(temporary, destination)
            return
        if not replace_files:
            raise FileExistsError(f"{destination}: already exists")
        written = _relative_files(temporary)
        for relative in written:
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(temporary / relative, mode_for(target))
            os.replace(temporary / relative, target)
        remove_stale_weights(destination, written)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _relative_files(root: Path) -> list[str]:
    """Every file under `root`, as "/"-separated paths relative to it (as on the Hub)."""
    return sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if not path.is_dir())


def remove_stale_weights(directory: Path, written: Iterable[str]) -> list[str]:
    """Remove the weight files directly in `directory` that a save which wrote `written` replaces, as transformers'
    `save_pretrained` removes the shards of its own naming it did not write: the safetensors weights (single file,
    index, shards) it did not write; after a `pytorch_model.bin` save also every safetensors weight file (loaders
    prefer them, so they would be read instead) and the pickle shards and index it did not write. Returns the names
    removed; no other file is touched."""
    written = set(written)
    owned = [_SAFETENSORS_WEIGHTS]
    if any(_PICKLE_WEIGHTS.match(name) for name in written):
        owned.append(_PICKLE_WEIGHTS)
    stale = []
    for entry in os.scandir(directory):
        if entry.name in written or not (entry.is_symlink() or entry.is_file(follow_symlinks=False)):
            continue
        if any(pattern.match(entry.name) for pattern in owned):
            os.unlink(entry.path)
            stale.append(entry.name)
    return sorted(stale)


def _present(directory: Path | None) -> list[str]:
    """The files directly in `directory` and one level down in sentence-transformers' module folders ("1_Pooling"):
    every place a tokenizer or sentence-transformers file can be. [] when there is no such directory."""
    if directory is None or not directory.is_dir():
        return []
    found = []
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) or entry.is_symlink():
            found.append(entry.name)
        elif entry.is_dir(follow_symlinks=False) and _MODULE_FOLDER.match(entry.name):
            found += [f"{entry.name}/{inner.name}" for inner in os.scandir(entry.path) if not inner.is_dir()]
    return found


def copy_model_files(
    source: Path, destination: Path, *, sentence_transformers: bool, beside: Path | None = None
) -> list[str]:
    """Copy the tokenizer files `source` has into `destination`, and with `sentence_transformers` (a backbone,
    which `SentenceTransformer(folder)` can run) its sentence-transformers files (modules.json, 1_Pooling/, ...),
    so the pipeline the checkpoint describes (pooling, Normalize, max_seq_length) survives. Returns their paths.

    `beside`: the folder the result will replace files in. Each group (tokenizer files; sentence-transformers files)
    is copied only when `beside` holds no file of that group: what a tokenizer, sentence-transformers or the user
    saved there (an added token, a default prompt) is never overwritten, nor mixed with another checkpoint's."""
    present = _present(beside)
    copied = []
    if not any(name in TOKENIZER_FILES for name in present):
        copied += [name for name in TOKENIZER_FILES if (source / name).is_file()]
    pipeline_present = [path for path in sentence_transformers_files(present) if path != _MODEL_CARD]
    if sentence_transformers and source.is_dir() and not pipeline_present:
        copied += [path for path in sentence_transformers_files(_relative_files(source)) if path != _MODEL_CARD]
    for relative in copied:
        (destination / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, destination / relative)
    return copied
