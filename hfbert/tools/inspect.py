"""`describe`: what a checkpoint holds and what hfbert's key map does to it, as plain text (`summary`: as data).

Config summary; custom code the config maps the model to (`auto_map`, which hfbert does not run); files with sizes
and sha256; the tensor table (name, shape, dtype, bytes, key map action) with encoder layers folded when they are
identical; parameter counts.
"""

from __future__ import annotations

import re
from itertools import groupby
from pathlib import Path
from typing import Any

from converters.checkpoint_files import read_checkpoint
from converters.dtypes import dtype_name
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, sha256_of
from converters.key_map import map_key
from converters.loading import check_auto_map

_LAYER = re.compile(r"^(.*?layer\.)(\d+)(\..*)$")


def summary(directory: Path) -> dict[str, Any]:
    """What `describe` prints, as data (`hfbert inspect --json`): config, custom code (`auto_map` and why hfbert
    refuses to load it; null when none), files, tensors, parameter counts."""
    from hfbert.modeling.config import BertConfig

    config = BertConfig.from_json_file(directory / CONFIG_FILE)
    auto_map = config.to_dict().get("auto_map")
    try:
        check_auto_map(auto_map, str(directory / CONFIG_FILE))
        custom_code = None
    except CheckpointError as error:  # the refusal a load would give, as the reason
        custom_code = {"auto_map": auto_map, "refused": str(error)}
    checkpoint = read_checkpoint(directory)
    files = [
        {
            "name": file.name,
            "bytes": file.stat().st_size,
            "sha256": sha256_of(file),
            "not_read": checkpoint.not_read.get(file.name),
        }
        for file in sorted(p for p in directory.iterdir() if p.is_file())
    ]
    tensors = []
    for name, tensor in checkpoint.tensors.items():
        mapped = map_key(name)
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

    counts = {"backbone": 0, "heads": 0}
    seen_storage = set()  # a .bin may store the tied decoder weight as a view of the word embeddings
    for name, tensor in checkpoint.tensors.items():
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        action = map_key(name).action
        if storage in seen_storage or action not in ("loaded", "renamed", "ignored"):
            continue
        seen_storage.add(storage)
        counts["heads" if action == "ignored" else "backbone"] += tensor.numel()
    return {
        "checkpoint": str(directory),
        "config": {
            key: getattr(config, key)
            for key in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
                "max_position_embeddings",
                "type_vocab_size",
                "hidden_act",
            )
        },
        "custom_code": custom_code,
        "files": files,
        "tensors": tensors,
        "parameters": {**counts, "total": counts["backbone"] + counts["heads"]},
    }


def describe(directory: Path) -> str:
    facts = summary(directory)
    c = facts["config"]
    lines = [
        f"checkpoint  {directory}",
        f"config      {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
        f"{c['num_attention_heads']} heads, intermediate {c['intermediate_size']}, vocab {c['vocab_size']}, "
        f"positions {c['max_position_embeddings']}, token types {c['type_vocab_size']}, {c['hidden_act']}",
    ]
    if facts["custom_code"] is not None:
        entries = facts["custom_code"]["auto_map"]
        pairs = entries.items() if isinstance(entries, dict) else [("auto_map", entries)]
        shown = ", ".join(f"{key} -> {value}" for key, value in pairs)
        lines.append(
            f"custom code auto_map maps to code hfbert does not run ({shown}): hfbert refuses to load this checkpoint "
            f"unless told its weights are plain BERT (--ignore-auto-map, ignore_auto_map=True)"
        )
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
        for name, shape, dtype, size, action in sorted(layers[indices[0]]):
            folded.append(
                (
                    _LAYER.sub(rf"\g<1>{label}\3", name),
                    shape,
                    dtype,
                    size,
                    action.replace(f"layer.{indices[0]}.", f"layer.{label}."),
                )
            )
    return others + folded
