"""`save_model`: an hfbert model -> the Hugging Face layout transformers writes, atomically.

config.json (with `architectures` naming the class), `model.safetensors` or shards + index (or
`pytorch_model.bin` when `safe_serialization=False`), tied weights stored once, and the tokenizer files of the
checkpoint the model was loaded from; for a backbone (`BertModel`) also its sentence-transformers files
(modules.json, 1_Pooling/, ...), so `SentenceTransformer(folder)` keeps the checkpoint's pooling and Normalize.
Into an existing folder a save replaces only what the model owns, as transformers' does: config.json and the
weights (old weight files of the naming it writes go, `converters.writing.remove_stale_weights`). Tokenizer and
sentence-transformers files are copied only into a folder that has none of them: a tokenizer saved there first
(an added token), `SentenceTransformer.save` (a default prompt) or the user's own files are never overwritten
or deleted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from converters.dtypes import dtype_name
from converters.hub import CONFIG_FILE
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
    with atomic_directory(destination, replace_files=True) as temporary:
        if safe_serialization:
            written = write_safetensors(tensors, temporary, max_shard_size)
        else:
            written = write_pickle(tensors, temporary, save_function)
        (temporary / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(CONFIG_FILE)
        if model.name_or_path and Path(model.name_or_path).is_dir():
            backbone = not model.base_prefix  # BertModel: what a sentence-transformers pipeline runs
            written += copy_model_files(
                Path(model.name_or_path), temporary, sentence_transformers=backbone, beside=destination
            )
    return written
