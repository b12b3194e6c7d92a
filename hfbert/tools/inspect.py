"""`describe`: what a checkpoint holds and what hfbert's key map does to it, as plain text.

Config summary; files with sizes and sha256; the tensor table (name, shape, dtype, bytes, key map action)
with encoder layers folded when they are identical; parameter counts.
"""

from __future__ import annotations

import re
from itertools import groupby
from pathlib import Path

from converters.checkpoint_files import read_checkpoint
from converters.dtypes import dtype_name
from converters.hub import CONFIG_FILE, sha256_of
from converters.key_map import map_key

_LAYER = re.compile(r"^(.*?layer\.)(\d+)(\..*)$")


def describe(directory: Path) -> str:
    from hfbert.modeling.config import BertConfig

    config = BertConfig.from_json_file(directory / CONFIG_FILE)
    checkpoint = read_checkpoint(directory)
    lines = [
        f"checkpoint  {directory}",
        f"config      {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads, intermediate {config.intermediate_size}, vocab {config.vocab_size}, "
        f"positions {config.max_position_embeddings}, token types {config.type_vocab_size}, {config.hidden_act}",
        "",
        "files",
    ]
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        note = f"  ({checkpoint.not_read[file.name]})" if file.name in checkpoint.not_read else ""
        lines.append(f"  {file.name:<40} {file.stat().st_size:>15,} bytes  sha256 {sha256_of(file)}{note}")

    rows = []  # (name, shape, dtype, bytes, what the key map does)
    for name, tensor in checkpoint.tensors.items():
        mapped = map_key(name)
        action = {
            "loaded": "loaded as is",
            "renamed": f"renamed -> {mapped.target}",
            "ignored": f"ignored by design: {mapped.reason}",
            "legacy buffer": f"legacy buffer, checked then dropped: {mapped.reason}",
        }[mapped.action]
        rows.append((name, list(tensor.shape), dtype_name(tensor.dtype), tensor.nbytes, action))
    lines += ["", f"tensors ({len(rows)}; encoder layers folded where identical)"]
    table = fold_layers(rows)
    width = max(len(row[0]) for row in table)
    lines.append(f"  {'name':<{width}}  {'shape':<14} {'dtype':<9} {'bytes':>13}  key map")
    for name, shape, dtype, size, action in table:
        lines.append(f"  {name:<{width}}  {str(shape):<14} {dtype:<9} {size:>13,}  {action}")

    counts = {"backbone": 0, "heads": 0}
    seen_storage = set()  # a .bin may store the tied decoder weight as a view of the word embeddings
    for name, tensor in checkpoint.tensors.items():
        storage = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        action = map_key(name).action
        if storage in seen_storage or action not in ("loaded", "renamed", "ignored"):
            continue
        seen_storage.add(storage)
        counts["heads" if action == "ignored" else "backbone"] += tensor.numel()
    backbone, ignored = counts["backbone"], counts["heads"]
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
