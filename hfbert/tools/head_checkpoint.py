"""A checkpoint folder whose task head a tool runs the way sentence-transformers runs it, for the two jobs beside
`embed` (`hfbert.tools.reranking`: the classification head of a cross-encoder; `hfbert.tools.sparse`: the masked-LM
head of a SPLADE model): the folder resolved, its tokenizer, the head model (refused, naming the folder and the
missing tensors, when the checkpoint has no such head), its sentence-transformers files and the input length.

Which files decide what, as sentence-transformers (6.x) reads them:

- `modules.json` with `config_sentence_transformers.json`'s `model_type` equal to the job's class ("CrossEncoder",
  "SparseEncoder"): the modules listed are the pipeline; `sentence_bert_config.json`'s `max_seq_length` and
  `do_lower_case` apply, and so do the prompts of `config_sentence_transformers.json`;
- otherwise (no modules.json, or one written for another class): the class's default modules on the checkpoint,
  none of those files read;
- the input length is `max_seq_length` when given, else the tokenizer's `model_max_length`, capped at the model's
  longest input (`EncoderConfig.max_sequence_length`: 512 for RoBERTa's 514 positions; sentence-transformers caps at
  `max_position_embeddings` itself, where an input of 513 or 514 tokens would index past the position table).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from converters.dtypes import DTYPES
from converters.errors import CheckpointError
from converters.json_files import read_json_object
from hfbert.tools.sentence_transformers_pipeline import (
    MODULES_FILE,
    PROMPTS_FILE,
    FolderSettings,
    prompt_text,
    read_folder,
)

__all__ = ["FolderSettings", "held_warnings", "load_head_model", "read_folder_settings", "resolve_folder"]


def resolve_folder(
    model_path: str | os.PathLike,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
) -> Path:
    """The local folder of a model argument (a Hub repo id is downloaded with its tokenizer and sentence-transformers
    files)."""
    from converters.hub import resolve_checkpoint

    return Path(
        resolve_checkpoint(
            model_path,
            revision,
            include_tokenizer=True,
            include_sentence_transformers=True,
            cache_dir=cache_dir,
            token=token,
        )
    )


def read_folder_settings(directory: Path, model_type: str) -> FolderSettings:
    """The sentence-transformers files of `directory` as the class `model_type` ("CrossEncoder", "SparseEncoder")
    reads them (`read_folder`); ValueError naming the file and field for a malformed one."""
    model_config = read_json_object(directory / PROMPTS_FILE, missing_ok=True)
    # As sentence-transformers: a folder without a model_type was written by SentenceTransformer.
    if not (directory / MODULES_FILE).is_file() or model_config.get("model_type", "SentenceTransformer") != model_type:
        return FolderSettings()
    return read_folder(directory)


def prompt_of(settings: FolderSettings, directory: Path, prompt: str | None, prompt_name: str | None) -> str:
    """The text put before every input: `prompt`, else the folder's prompt `prompt_name`, else its default prompt
    (sentence-transformers' `_resolve_prompt`); "" for none."""
    if prompt is not None and prompt_name is not None:
        raise ValueError("give a prompt or a prompt name, not both")
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else settings.default_prompt_name
    if name is None:
        return ""
    if name not in settings.prompts:
        names = ", ".join(map(repr, settings.prompts)) or "none"
        raise ValueError(f"prompt name {name!r} is not in the checkpoint's prompts ({names})")
    return prompt_text(settings.prompts, name, directory) or ""


def input_length(settings: FolderSettings, tokenizer: Any, limit: int, max_length: int | None) -> int:
    """Tokens per input: `max_length` when given (in [1, limit]), else the folder's (see the module docstring)."""
    if max_length is not None:
        if not 1 <= max_length <= limit:
            raise ValueError(f"max_length must be in [1, {limit}] (the model's longest input), got {max_length}")
        return max_length
    length = settings.max_seq_length if settings.max_seq_length is not None else tokenizer.model_max_length
    return min(length, limit)


def load_head_model(
    directory: Path,
    task: str,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    quantize: str | None = None,
    precision: str = "highest",
    ignore_auto_map: bool = False,
) -> Any:
    """The family's model for `task` ("sequence-classification", "masked-lm") from `directory`, in eval mode with
    its linear layers packed for inference (`quantize="int8"`: int8, `precision="bf16"`: bf16 products, as
    `optimize_for_inference`); ValueError naming
    the folder when the checkpoint has no tensor of the task's head (transformers would initialise one at random:
    scores of noise)."""
    from hfbert.inference import optimize_for_inference
    from hfbert.modeling.auto import absent_heads, model_class
    from hfbert.modeling.config import EncoderConfig

    config = EncoderConfig.from_json_file(directory / "config.json")
    cls = model_class(config, task)
    options = dict(device=device, dtype=DTYPES[dtype] if isinstance(dtype, str) else dtype)
    options.update(output_loading_info=True, ignore_auto_map=ignore_auto_map)
    try:
        with held_warnings() as held:  # the loader's "newly initialized" warning, shown only if the model is kept
            model, info = cls.from_pretrained(directory, **options)
    except CheckpointError as error:
        # A checkpoint of another task (a masked LM read as a classifier) also lacks parts the head's model needs
        # beside the head (BERT's pooler); the missing head is what to say, when it is missing.
        # (On the CPU, in the stored dtype: the weights stay memory-mapped, only what is missing is allocated.)
        try:
            with held_warnings():  # this load only finds what is missing: its warnings are never shown
                _, info = cls.from_pretrained(
                    directory, strict=False, output_loading_info=True, ignore_auto_map=ignore_auto_map
                )
        except CheckpointError:
            raise error from None
        if not info["report"].new_head:
            raise
    if info["report"].new_head:
        # Only the heads absent (ModernBERT's masked LM, read as a classifier, has the prediction head the classifier
        # reads through, not the classifier).
        missing = absent_heads(cls, info["report"].new_head) or cls.heads
        what = ", no ".join(cls.key_layout.heads.get(head, "task head") for head in missing)
        tensors = ", ".join(f"{head}*" for head in missing)
        raise ValueError(
            f"{directory}: the checkpoint has no {what} (no {tensors} tensors in its weights); {cls.__name__} needs "
            f"{'them' if len(missing) > 1 else 'one'}"
        )
    for record in held:
        logging.getLogger(record.name).handle(record)
    # fp32 packed weights give the plain model's numbers within hfbert's contract (a no-op off x86 CPUs); int8 is
    # lossy, and only when asked (bf16 too).
    return optimize_for_inference(model, quantize=quantize, precision=precision)


@contextmanager
def held_warnings(logger: str = "hfbert") -> Iterator[list[logging.LogRecord]]:
    """The records `logger` emits in the block, held back (not shown) and listed, for the caller to show
    (`logging.getLogger(record.name).handle(record)`) or drop: a load that is then refused for its missing head
    says that once, without first warning that the head was initialised for training."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        held.append(record)
        return False

    target = logging.getLogger(logger)
    target.addFilter(hold)
    try:
        yield held
    finally:
        target.removeFilter(hold)
