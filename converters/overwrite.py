"""A command never writes over one of its inputs: `refuse_overwriting_inputs`, which every CLI command that writes
calls before anything runs. It lives here, beside the checkpoint files, because knowing what an output must not
become is knowing which files make a checkpoint.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path

from converters.atomic_write import refuse_same_file
from converters.checkpoint_files import WEIGHT_FILE_PREFERENCE
from converters.hub import CONFIG_FILE, TOKENIZER_FILES, sentence_transformers_files


def _checkpoint_files(directory: Path) -> list[Path]:
    """The files of a checkpoint directory and of its module folders (1_Pooling/...), one level deep."""
    files = []
    for entry in sorted(directory.iterdir()):
        if entry.is_dir():
            files += [child for child in sorted(entry.iterdir()) if child.is_file()]
        elif entry.is_file():
            files.append(entry)
    return files


def _is_checkpoint_file_name(relative: str) -> bool:
    """Whether a path relative to a checkpoint is a name hfbert or transformers would load (config, weights,
    tokenizer, sentence-transformers files), so that creating it would change the checkpoint."""
    patterns = (CONFIG_FILE, *WEIGHT_FILE_PREFERENCE, *TOKENIZER_FILES, "model-*.safetensors", "pytorch_model-*.bin")
    if "/" not in relative and any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns):
        return True
    return bool(sentence_transformers_files([relative]))


def refuse_overwriting_inputs(
    outputs: Mapping[str, str | os.PathLike | None],
    files: Mapping[str, str | os.PathLike | None] = {},  # noqa: B006 - read only
    checkpoints: Mapping[str, Path | None] = {},  # noqa: B006 - read only
) -> None:
    """ValueError, before anything runs, when an output (option -> path; None or "-" is stdout) is one of the
    input `files` (same file, also through links), a file of an input checkpoint directory (also a blob of the
    Hugging Face cache its snapshot links to), a file a checkpoint loader would read there once created, or
    another output."""
    named = {option: Path(path) for option, path in outputs.items() if path is not None and os.fspath(path) != "-"}
    seen: dict[Path, str] = {}
    for option, output in named.items():
        where = output.absolute()
        if where in seen:
            raise ValueError(f"{output}: {seen[where]} and {option} name the same file; give each its own")
        seen[where] = option
        refuse_same_file(output, {name: path for name, path in files.items() if path is not None and path != "-"})
        for description, directory in checkpoints.items():
            if directory is None:
                continue
            if output.exists() and any(os.path.samefile(output, file) for file in _checkpoint_files(directory)):
                raise ValueError(
                    f"{option} {output}: the output is a file of the checkpoint {description} ({directory}); refusing "
                    f"to overwrite it, choose another output"
                )
            try:
                relative = where.resolve().relative_to(directory.resolve()).as_posix()
            except ValueError:
                continue
            if _is_checkpoint_file_name(relative):
                raise ValueError(
                    f"{option} {output}: would become the file {relative} of the checkpoint {description} "
                    f"({directory}) and change what loads from it; choose another output"
                )
