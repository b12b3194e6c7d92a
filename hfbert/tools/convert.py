"""`convert`: any supported BERT checkpoint -> a canonical Hugging Face checkpoint, written atomically.

Canonical means what transformers' own `save_pretrained` writes: `config.json`, `model.safetensors` (or
`model-0000i-of-0000n.safetensors` shards and `model.safetensors.index.json`), LayerNorm `weight` / `bias`
names, no legacy buffers, no wrappers, the tied MLM decoder weight not stored (it is the word embeddings).
A backbone-only source is written as transformers' `BertModel` stores it (no prefix); a source with task heads
keeps them, with the backbone under `bert.`, as `BertFor...` models store it. RoBERTa, XLM-RoBERTa and CamemBERT
(config.json's model_type) are written as their transformers classes store them: `roberta.`, `lm_head.`,
`classifier.dense / out_proj`, the tied `lm_head.decoder` not stored; MPNet the same under `mpnet.`, with its
`encoder.relative_attention_bias` and `attention.attn.q / k / v / o`. Tokenizer files are copied, and the
sentence-transformers files too (modules.json, 1_Pooling/, ...: `SentenceTransformer(destination)` keeps the source's
pooling and Normalize, `CrossEncoder` its activation, `SparseEncoder` its SPLADE pooling). A bge-m3 folder's
`sparse_linear.pt` and `colbert_linear.pt` (pickles, read through `torch.load(weights_only=True)` and checked:
`hfbert.tools.bge_m3`) are written as `sparse_linear.safetensors` and `colbert_linear.safetensors`, which hfbert
reads in their place.

Everything is written into a temporary directory beside the destination and renamed into place at the end, so
an interrupted or failed conversion leaves no destination and no partial files (a run killed by SIGKILL leaves
its temporary directory, which the next conversion to that destination removes).

Only what hfbert would load back is written: backbone tensors are checked as a strict load checks them, task-head
tensors get the same checks (known name, the shape config.json implies, dtype, finite values), and a `dtype` cast
must not overflow to Inf.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor

from converters.checkpoint_files import read_checkpoint
from converters.dtypes import PARAMETER_DTYPES, dtype_name
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, resolve_checkpoint
from converters.json_files import read_json_object
from converters.key_map import head_of, normalize_name
from converters.loading import (
    check_auto_map,
    check_cast,
    check_family,
    check_requested_dtype,
    match_checkpoint,
    non_finite,
    skipped_initialisation,
    without_model_auto_map,
)
from converters.writing import atomic_directory, copy_model_files, parse_size, write_safetensors
from hfbert.modeling.config import ConfigError, EncoderConfig
from hfbert.modeling.family import member
from hfbert.tools.bge_m3 import present_heads


def canonical_tensors(
    directory: Path, dtype: torch.dtype | None, *, ignore_auto_map: bool = False
) -> tuple[dict[str, Tensor], dict]:
    """Read, validate against config.json and rename every tensor to transformers' canonical name. A config whose
    `auto_map` sends the model to custom code is refused, as `from_pretrained` refuses it; with `ignore_auto_map`
    it converts as plain BERT and the written config keeps only a tokenizer's `auto_map` entries (the model's code
    is not copied: the result is a plain BERT checkpoint)."""
    config = EncoderConfig.from_json_file(directory / CONFIG_FILE)
    if not ignore_auto_map:
        check_auto_map(config.to_dict().get("auto_map"), str(directory / CONFIG_FILE))
    checkpoint = read_checkpoint(directory)
    family = member(config.model_type)
    encoder, layout = family.classes["model"], family.key_layout
    check_family(encoder, config, checkpoint)
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in encoder(config).state_dict().items()}
    backbone, report = match_checkpoint(
        checkpoint, expected, config.max_position_embeddings, str(directory), layout=layout
    )
    if report.missing == ["pooler.dense.weight", "pooler.dense.bias"]:
        report.missing = []  # a checkpoint without pooler is a valid BertModel(add_pooling_layer=False)
    if report.problems:
        raise CheckpointError(f"{directory}: cannot convert: " + "; ".join(report.problems[:5]))

    normalized = {normalize_name(name, layout): tensor for name, tensor in checkpoint.tensors.items()}
    heads: dict[str, Tensor] = {}
    for name, tensor in normalized.items():
        if head_of(name, layout) is None:
            continue  # backbone tensors and legacy buffers were handled by match_checkpoint
        partner = normalized.get(layout.tied_decoder.get(name, ""))
        if partner is not None and torch.equal(partner, tensor):
            continue
        heads[name] = tensor
    allowed = head_shapes(config)
    check_heads(heads, allowed, directory, config.model_type)
    prefix = layout.prefix if heads else ""
    # In the order of the model's state_dict, as transformers saves a model (the shards it cuts follow that order),
    # not in the source file's (safetensors stores names sorted).
    tensors = {prefix + name: backbone[name] for name in expected if name in backbone}
    tensors |= {name: heads[name] for name in allowed if name in heads}
    # The file's own keys: config.to_dict() would write every default too.
    config_values = without_model_auto_map(read_json_object(directory / CONFIG_FILE, error=ConfigError))
    if dtype is not None:
        tensors = {name: cast(name, tensor, dtype, directory) for name, tensor in tensors.items()}
        config_values |= {"dtype": dtype_name(dtype), "torch_dtype": dtype_name(dtype)}
    return tensors, config_values


def head_shapes(config: EncoderConfig) -> dict[str, set[tuple[int, ...]]]:
    """Every task-head tensor name transformers' models of `config`'s family store, with the shapes `config` allows
    for it (a `classifier` is (num_labels, hidden) in sequence / token classification, (1, hidden) in multiple
    choice; RoBERTa's sequence classifier is `classifier.dense` + `classifier.out_proj`)."""
    family = member(config.model_type)
    layout = family.key_layout
    shapes: dict[str, set[tuple[int, ...]]] = {}
    with torch.device("meta"), skipped_initialisation():
        for task, model_class in family.classes.items():
            if task == "model":
                continue
            try:
                model = model_class(config)
            except ConfigError:  # a head this config cannot have (DistilBERT's question answering needs 2 labels)
                continue
            for name, tensor in model.state_dict().items():
                if head_of(name, layout) is not None:
                    shapes.setdefault(name, set()).add(tuple(tensor.shape))
    return shapes


def check_heads(
    heads: dict[str, Tensor], allowed: dict[str, set[tuple[int, ...]]], directory: Path, model_type: str = "bert"
) -> None:
    """Task-head tensors get the backbone's checks: a known name, a shape config.json implies (`allowed`, from
    `head_shapes`), a floating-point dtype the kernels run, finite values; `CheckpointError` listing what fails."""
    problems = []
    family = "BERT" if model_type == "bert" else model_type
    for name, tensor in heads.items():
        if name not in allowed:
            problems.append(f"unknown tensor '{name}' (no {family} head has it)")
        elif tuple(tensor.shape) not in allowed[name]:
            expected = " or ".join(str(shape) for shape in sorted(allowed[name]))
            problems.append(f"'{name}' has shape {tuple(tensor.shape)}; config.json implies {expected}")
        elif tensor.dtype not in PARAMETER_DTYPES:
            problems.append(f"'{name}' has dtype {tensor.dtype}")
        elif problem := non_finite(tensor):
            problems.append(f"'{name}' holds {problem}")
    if problems:
        raise CheckpointError(f"{directory}: cannot convert: " + "; ".join(problems[:5]))


def cast(name: str, tensor: Tensor, dtype: torch.dtype, directory: Path) -> Tensor:
    """`tensor` in `dtype` (floating-point tensors only); `CheckpointError` when values overflow to Inf."""
    if not tensor.is_floating_point():
        return tensor
    result = tensor.to(dtype)
    check_cast(name, tensor, result, str(directory), "convert to")
    return result


def convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: str | int = "2GB",
    ignore_auto_map: bool = False,
) -> list[str]:
    """Convert `source` (local directory or repo id) into a canonical checkpoint at `destination`.

    Returns the names of the files written. Raises if `destination` exists; never leaves a partial one. A config
    whose `auto_map` sends the model to custom code is refused unless `ignore_auto_map=True` says the weights are
    plain BERT (the result then maps no model to custom code).

        >>> convert("google-bert/bert-base-uncased", "bert-base-canonical", dtype=torch.bfloat16)  # doctest: +SKIP
    """
    from safetensors.torch import save_file

    destination = Path(destination)
    if destination.exists():
        raise CheckpointError(f"{destination}: already exists; choose a new destination or remove it first")
    parse_size(max_shard_size)  # a bad size fails before any work
    check_requested_dtype(dtype)
    directory = resolve_checkpoint(source, include_tokenizer=True, include_sentence_transformers=True)
    tensors, config_values = canonical_tensors(directory, dtype, ignore_auto_map=ignore_auto_map)
    hidden_size = EncoderConfig.from_json_file(directory / CONFIG_FILE).hidden_size
    m3_heads = {  # bge-m3's layers beside the encoder, read and checked before anything is written
        stem: {
            name: cast(f"{stem}.{name}", t, dtype, directory) if dtype is not None else t for name, t in layer.items()
        }
        for stem, layer in present_heads(directory, hidden_size).items()
    }
    with atomic_directory(destination) as temporary:
        written = write_safetensors(tensors, temporary, max_shard_size)
        (temporary / CONFIG_FILE).write_text(json.dumps(config_values, indent=2) + "\n", encoding="utf-8")
        written.append(CONFIG_FILE)
        # The sentence-transformers files of any folder: a SentenceTransformer's backbone, a CrossEncoder's classifier
        # (its activation) and a SparseEncoder's masked LM (its pooling) alike.
        written += copy_model_files(directory, temporary, sentence_transformers=True)
        for stem, layer in m3_heads.items():
            save_file(
                {name: t.contiguous() for name, t in layer.items()},
                temporary / f"{stem}.safetensors",
                metadata={"format": "pt"},
            )
            written.append(f"{stem}.safetensors")
    return written
