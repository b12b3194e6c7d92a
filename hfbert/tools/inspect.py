"""`describe`: what a checkpoint holds and what hfbert's key map does to it, as plain text (`summary`: as data).

Config summary (with the fields a family adds to BERT's, such as MPNet's relative_attention_num_buckets, and no
token types where the model has none); custom code the config maps the model to (`auto_map`, which hfbert does not
run); the tokenizer and whether it fits the model (ids past `vocab_size`, a `model_max_length` past the position
embeddings); files with sizes and sha256; the tensor table (name, shape, dtype, bytes, key map action) with encoder
layers folded when they are identical; parameter counts.
"""

from __future__ import annotations

import re
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.checkpoint_files import read_checkpoint
from converters.dtypes import dtype_name
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, TOKENIZER_FILES, sha256_of
from converters.key_map import map_key
from converters.loading import check_auto_map, check_family

if TYPE_CHECKING:
    from hfbert.modeling.config import EncoderConfig

_LAYER = re.compile(r"^(.*?layer\.)(\d+)(\..*)$")
# A model_max_length above this is transformers' "no limit" (hfbert.modeling.tokenizer.model_max_length).
_NO_LIMIT_ABOVE = 10**20
# The config fields `summary` reports, in the order `describe` prints them.
_CONFIG_FIELDS = (
    "model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
    "max_position_embeddings", "max_sequence_length", "type_vocab_size", "hidden_act",
)  # fmt: skip


# Shown on lines of their own, or summed up there (ModernBERT's layer pattern, window and rotary bases).
_SHOWN_APART = (*_CONFIG_FIELDS, "attention", "layer_types", "rope_parameters", "local_attention", "hidden_activation")


def summary(directory: Path) -> dict[str, Any]:
    """What `describe` prints, as data (`hfbert inspect --json`): config, custom code (`auto_map` and why hfbert
    refuses to load it; null when none), files, tensors, parameter counts. CheckpointError, the loaders' own, when
    the tensors are named for another family than config.json says (`bert.` tensors beside model_type "roberta")."""
    from hfbert.modeling.config import EncoderConfig
    from hfbert.modeling.family import member

    config = EncoderConfig.from_json_file(directory / CONFIG_FILE)
    family = member(config.model_type)
    auto_map = config.to_dict().get("auto_map")
    try:
        check_auto_map(auto_map, str(directory / CONFIG_FILE))
        custom_code = None
    except CheckpointError as error:  # the refusal a load would give, as the reason
        custom_code = {"auto_map": auto_map, "refused": str(error)}
    checkpoint = read_checkpoint(directory)
    # The loaders' own check, so that inspect never lists as loadable tensors every loader refuses (`bert.` tensors
    # beside model_type "xlm-roberta" would map as if they had no prefix: "loaded as is").
    check_family(family.classes["model"], config, checkpoint)
    files = [
        {**facts, "not_read": checkpoint.not_read.get(facts["name"])}
        for facts in describe_files(sorted(p for p in directory.iterdir() if p.is_file()))
    ]
    tensors = []
    counts = {"backbone": 0, "heads": 0}
    seen_storage = set()  # a .bin may store the tied decoder weight as a view of the word embeddings
    limit_name = "longest input" if config.positions_after_padding else "max_position_embeddings"
    layout = family.key_layout  # RoBERTa's `roberta.` prefix and `lm_head.` / `classifier.` heads
    for name, tensor in checkpoint.tensors.items():
        mapped = map_key(name, layout=layout)
        action = {
            "loaded": "loaded as is",
            "renamed": f"renamed -> {mapped.target}",
            "ignored": f"ignored by design: {mapped.reason}",
            "legacy buffer": f"legacy buffer, checked then dropped: {mapped.reason}",
        }[mapped.action]
        tensors.append(
            {
                "name": name,
                "shape": list(tensor.shape),
                "dtype": dtype_name(tensor.dtype),
                "bytes": tensor.nbytes,
                "action": mapped.action,
                "key_map": action,
            }
        )
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if storage not in seen_storage and mapped.action in ("loaded", "renamed", "ignored"):
            seen_storage.add(storage)
            counts["heads" if mapped.action == "ignored" else "backbone"] += tensor.numel()
    return {
        "checkpoint": str(directory),
        "config": config_facts(config),
        "custom_code": custom_code,
        "tokenizer": tokenizer_summary(directory, config.vocab_size, config.max_sequence_length, limit_name),
        "files": files,
        "tensors": tensors,
        "parameters": {**counts, "total": counts["backbone"] + counts["heads"]},
    }


def config_facts(config: EncoderConfig) -> dict[str, Any]:
    """The config fields `describe` shows: the member's own statement of them (`EncoderConfig.inspect_facts`), with
    `type_vocab_size` None for a member without token types (MPNet takes no token_type_ids, whatever config.json
    says)."""
    from hfbert.modeling.family import member

    facts = config.inspect_facts()
    facts["type_vocab_size"] = config.type_vocab_size if member(config.model_type).token_types else None
    return facts


def describe_files(files: list[Path]) -> list[dict[str, Any]]:
    """Name, size in bytes and sha256 of each file."""
    return [{"name": file.name, "bytes": file.stat().st_size, "sha256": sha256_of(file)} for file in files]


def tokenizer_summary(
    directory: Path, vocab_size: int, max_positions: int, limit_name: str = "max_position_embeddings"
) -> dict[str, Any] | None:
    """The tokenizer in `directory` as hfbert builds it, and what in it does not fit the model (`problems`): ids
    past `vocab_size` (special tokens named first: every text has them), a `model_max_length` past the position
    embeddings (`max_positions`: the longest input, RoBERTa's `max_position_embeddings - pad_token_id - 1`), or
    why it cannot be built. None when the folder has no tokenizer file."""
    from hfbert.modeling.tokenizer import AutoTokenizer

    files = [name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not files:
        return None
    facts: dict[str, Any] = {"files": files, "tokens": None, "largest_id": None, "model_max_length": None}
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory)
    except (ValueError, OSError) as error:  # ConfigError is a ValueError
        return {**facts, "problems": [f"cannot be built: {error}"]}
    ids = tokenizer.get_vocab()
    limit = tokenizer.model_max_length
    facts |= {"tokens": len(ids), "largest_id": max(ids.values(), default=None)}
    facts["model_max_length"] = limit if limit <= _NO_LIMIT_ABOVE else None
    problems = []
    special = set(tokenizer.special_tokens.values())
    past = sorted((token not in special, index, token) for token, index in ids.items() if index >= vocab_size)
    if past:
        shown = ", ".join(f"{token!r} = {index}" for _, index, token in past[:4]) + (", ..." if len(past) > 4 else "")
        problems.append(
            f"{len(past)} token id(s) past the model's vocab_size {vocab_size} (they index past the word "
            f"embeddings): {shown}"
        )
    if facts["model_max_length"] is not None and limit > max_positions:
        problems.append(
            f"model_max_length {limit} is more than the model's {limit_name} {max_positions}: texts "
            "truncated to it can be longer than the model takes"
        )
    return {**facts, "problems": problems}


def describe(directory: Path) -> str:
    facts = summary(directory)
    c = facts["config"]
    lines = [
        f"checkpoint  {directory}",
        f"config      {c['model_type']}, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
        f"{c['num_attention_heads']} heads, intermediate {c['intermediate_size']}, vocab {c['vocab_size']}, "
        f"positions {c['max_position_embeddings']} (longest input {c['max_sequence_length']}), "
        + ("no token types" if c["type_vocab_size"] is None else f"token types {c['type_vocab_size']}")
        + "".join(f", {key} {value}" for key, value in c.items() if key not in _SHOWN_APART)
        + f", {c['hidden_act']}",
    ]
    if "attention" in c:
        lines.append(f"attention   {c['attention']}")
    if facts["custom_code"] is not None:
        entries = facts["custom_code"]["auto_map"]
        pairs = entries.items() if isinstance(entries, dict) else [("auto_map", entries)]
        shown = ", ".join(f"{key} -> {value}" for key, value in pairs)
        lines.append(
            f"custom code auto_map maps to code hfbert does not run ({shown}): hfbert refuses to load this checkpoint "
            f"unless told its weights are plain BERT (--ignore-auto-map, ignore_auto_map=True)"
        )
    tokenizer = facts["tokenizer"]
    if tokenizer is None:
        lines.append("tokenizer   none in this folder")
    else:
        if tokenizer["tokens"] is not None:
            limit = tokenizer["model_max_length"]
            lines.append(
                f"tokenizer   {tokenizer['tokens']} tokens, ids up to {tokenizer['largest_id']} (the model has "
                f"{c['vocab_size']} rows), model_max_length {'none' if limit is None else limit}"
            )
        lines += [f"warning     tokenizer: {problem}" for problem in tokenizer["problems"]]
    lines += ["", "files"]
    for file in facts["files"]:
        note = f"  ({file['not_read']})" if file["not_read"] else ""
        lines.append(f"  {file['name']:<40} {file['bytes']:>15,} bytes  sha256 {file['sha256']}{note}")

    rows = [(t["name"], t["shape"], t["dtype"], t["bytes"], t["key_map"]) for t in facts["tensors"]]
    lines += ["", f"tensors ({len(rows)}; encoder layers folded where identical)"]
    table = fold_layers(rows)
    width = max(len(row[0]) for row in table)
    lines.append(f"  {'name':<{width}}  {'shape':<14} {'dtype':<9} {'bytes':>13}  key map")
    for name, shape, dtype, size, action in table:
        lines.append(f"  {name:<{width}}  {str(shape):<14} {dtype:<9} {size:>13,}  {action}")

    backbone, ignored = facts["parameters"]["backbone"], facts["parameters"]["heads"]
    lines += [
        "",
        f"parameters  backbone {backbone:,}   heads (ignored by a backbone) {ignored:,}   total {backbone + ignored:,}",
    ]
    return "\n".join(lines)


def fold_layers(rows: list[tuple]) -> list[tuple]:
    """Replace runs of identical encoder layers by one set of rows named `layer.{first-last}`."""
    layers: dict[int, list[tuple]] = {}
    others = []
    for row in rows:
        match = _LAYER.match(row[0])
        if match:
            layers.setdefault(int(match.group(2)), []).append(row)
        else:
            others.append(row)

    def signature(index: int) -> tuple:
        return tuple(
            (_LAYER.sub(r"\1#\3", name), tuple(shape), dtype, size, action.replace(f"layer.{index}.", "layer.#."))
            for name, shape, dtype, size, action in sorted(layers[index])
        )

    folded = []
    for _, run in groupby(sorted(layers), key=signature):
        indices = list(run)
        label = str(indices[0]) if len(indices) == 1 else f"{{{indices[0]}-{indices[-1]}}}"
        old, new = f"layer.{indices[0]}.", f"layer.{label}."
        for name, shape, dtype, size, action in sorted(layers[indices[0]]):
            folded.append((_LAYER.sub(rf"\g<1>{label}\3", name), shape, dtype, size, action.replace(old, new)))
    return others + folded
