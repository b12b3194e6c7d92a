"""`save_model`: an hfbert model -> the Hugging Face layout transformers writes, atomically.

config.json (with `architectures` naming the class), `model.safetensors` or shards + index (or
`pytorch_model.bin` when `safe_serialization=False`), tied weights stored once, and the tokenizer files of the
checkpoint the model was loaded from; for a backbone (`BertModel`) also its sentence-transformers files
(modules.json, 1_Pooling/, ...), so `SentenceTransformer(folder)` keeps the checkpoint's pooling and Normalize.
Into an existing folder a save replaces only what the model owns, as transformers' does: config.json and the
weights (old weight files of the naming it writes go, `converters.writing.remove_stale_weights`). Tokenizer and
sentence-transformers files are copied only into a folder that has none of them: a tokenizer saved there first
(an added token), `SentenceTransformer.save` (a default prompt) or the user's own files are never overwritten
or deleted. A save that leaves the folder with a tokenizer that is not this model's (another vocabulary than the
checkpoint's, or ids past `vocab_size`) warns, naming the files: transformers' own save writes no tokenizer, and
Trainer and sentence-transformers save the tokenizer right after the model, so a refusal would fail their saves.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from converters.dtypes import dtype_name
from converters.hub import CONFIG_FILE, TOKENIZER_FILES
from converters.tokenizer_files import token_ids, vocabulary
from converters.writing import atomic_directory, copy_model_files, write_pickle, write_safetensors


def save_model(
    model: nn.Module,
    save_directory: str | os.PathLike,
    *,
    safe_serialization: bool = True,
    max_shard_size: str | int,
    state_dict: dict[str, Tensor] | None = None,
    save_function: Callable[[Any, Path], Any] | None = None,
) -> list[str]:
    """Write `model` (or `state_dict`, named as `model.state_dict()` names it) and its config; returns the names of
    the files written. `save_function(obj, path)` writes the legacy `.bin` (default `torch.save`)."""
    destination = Path(save_directory)
    tied = model.tied_weights()
    if state_dict is None:
        state_dict = model.state_dict()
    tensors = {name: tensor for name, tensor in state_dict.items() if name not in tied}
    config = model.config.to_dict()
    config["architectures"] = [type(model).__name__]
    config["dtype"] = dtype_name(model.dtype)
    source = Path(model.name_or_path) if model.name_or_path and Path(model.name_or_path).is_dir() else None
    mismatch = tokenizer_mismatch(source, destination, model.config.vocab_size)
    with atomic_directory(destination, replace_files=True) as temporary:
        if safe_serialization:
            written = write_safetensors(tensors, temporary, max_shard_size)
        else:
            written = write_pickle(tensors, temporary, save_function)
        (temporary / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(CONFIG_FILE)
        if source is not None:
            backbone = not model.base_prefix  # BertModel: what a sentence-transformers pipeline runs
            written += copy_model_files(source, temporary, sentence_transformers=backbone, beside=destination)
    if mismatch:
        warnings.warn(f"save_pretrained into {destination}: {mismatch}", UserWarning, stacklevel=3)
    return written


def tokenizer_mismatch(source: Path | None, destination: Path, vocab_size: int) -> str | None:
    """Why the tokenizer a save into `destination` leaves there does not go with the model, or None: the folder
    keeps tokenizer files of another vocabulary than `source`'s (the checkpoint the model was loaded from), or the
    tokenizer it will hold (kept, else copied from `source`) gives ids past the model's `vocab_size` rows."""
    try:
        return _tokenizer_mismatch(source, destination, vocab_size)
    except OSError:  # an unreadable tokenizer file: the tokenizer's loader names it; the save goes ahead
        return None


def _tokenizer_mismatch(source: Path | None, destination: Path, vocab_size: int) -> str | None:
    kept = [name for name in TOKENIZER_FILES if os.path.lexists(destination / name)]
    theirs = [name for name in TOKENIZER_FILES if source is not None and (source / name).is_file()]
    problems, hint = [], "resize_token_embeddings(len(tokenizer)) before saving"
    if kept and theirs and vocabulary(destination) != vocabulary(source):
        problems.append(f"another vocabulary than that of {source}, the checkpoint this model was loaded from")
        hint = "save this model's tokenizer there (tokenizer.save_pretrained), or save into an empty folder"
    held = destination if kept else source if theirs else None
    past = sorted((index, token) for token, index in token_ids(held).items() if index >= vocab_size) if held else []
    if past:
        shown = ", ".join(f"{token!r} = {index}" for index, token in past[:3]) + (", ..." if len(past) > 3 else "")
        problems.append(f"{len(past)} id(s) past the model's {vocab_size} rows of word embeddings: {shown}")
    if not problems:
        return None
    if kept:
        return (
            f"the tokenizer files it keeps ({', '.join(kept)}) do not go with this model ({'; '.join(problems)}); "
            f"save_pretrained never overwrites or deletes tokenizer files (transformers' writes none): {hint}"
        )
    return f"the tokenizer files it copies from {source} ({', '.join(theirs)}) give {problems[0]}: {hint}"
