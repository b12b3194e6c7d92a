"""`load_pretrained`: checkpoint directory or repo id -> a validated model in eval mode, in one pass.

1. resolve the source to a local directory (`hub.resolve_checkpoint`);
2. read config.json into a `BertConfig` and build the model on the meta device (no memory, no random init);
3. read the tensors (memory-mapped) and map every name through `key_map.map_key`;
4. compare against the model's parameters: missing, unexpected, shape-mismatched -> `LoadReport`;
5. with `strict=True` any problem raises `CheckpointError` before the model is touched: never half-loaded;
6. assign the tensors as the parameters (`load_state_dict(assign=True)`), casting only if `dtype` asks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from converters.checkpoint_files import CheckpointTensors, read_checkpoint
from converters.errors import CheckpointError
from converters.hub import CONFIG_FILE, resolve_checkpoint
from converters.key_map import check_legacy_buffer, map_key
from converters.load_report import LoadReport


def load_pretrained(
    model_class: type[nn.Module],
    path_or_repo_id: str | os.PathLike,
    *,
    revision: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str = "sdpa",
    strict: bool = True,
    output_loading_info: bool = False,
    model_kwargs: dict[str, Any] | None = None,
) -> nn.Module | tuple[nn.Module, dict[str, Any]]:
    from hfbert.config import BertConfig

    if dtype is not None and not dtype.is_floating_point:
        raise ValueError(f"dtype={dtype} is not a floating-point dtype")
    directory = resolve_checkpoint(path_or_repo_id, revision)
    config = BertConfig.from_json_file(directory / CONFIG_FILE)
    checkpoint = read_checkpoint(directory)
    with torch.device("meta"):
        model = model_class(config, attn_implementation=attn_implementation, **(model_kwargs or {}))

    expected_shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    state, report = match_checkpoint(checkpoint, expected_shapes, config.max_position_embeddings, str(directory))
    if strict and report.problems:
        raise CheckpointError(_strict_failure_message(directory, report, checkpoint))
    if not strict:
        for name in report.missing:
            state[name] = initial_value(name, expected_shapes[name], config)
            report.initialized.append(name)
        for name, _, _ in report.mismatched:
            state[name] = initial_value(name, expected_shapes[name], config)
            report.initialized.append(name)

    dtype = dtype or _stored_dtype(state, checkpoint)
    state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.eval()
    if output_loading_info:
        return model, report.to_loading_info()
    return model


def match_checkpoint(
    checkpoint: CheckpointTensors,
    expected_shapes: dict[str, tuple[int, ...]],
    max_position_embeddings: int,
    source: str,
) -> tuple[dict[str, Tensor], LoadReport]:
    """Map every checkpoint tensor to a model parameter; report what fits and what does not."""
    report = LoadReport(source=source)
    state: dict[str, Tensor] = {}
    claimed_by: dict[str, str] = {}
    for name, tensor in checkpoint.tensors.items():
        mapped = map_key(name)
        file = str(checkpoint.origin[name])
        if mapped.action == "ignored":
            report.ignored_by_design[name] = mapped.reason
            continue
        if mapped.action == "legacy buffer":
            check_legacy_buffer(mapped, tensor, max_position_embeddings, file)
            report.legacy_buffers.append(name)
            continue
        target = mapped.target
        if target in claimed_by:
            raise CheckpointError(f"{file}: tensors '{claimed_by[target]}' and '{name}' both map to '{target}'")
        claimed_by[target] = name
        if target not in expected_shapes:
            report.unexpected.append(name)
            continue
        if tuple(tensor.shape) != expected_shapes[target]:
            report.mismatched.append((target, tuple(tensor.shape), expected_shapes[target]))
            continue
        if not tensor.is_floating_point():
            raise CheckpointError(
                f"{file}: tensor '{name}' has dtype {tensor.dtype}; parameters must be floating point"
            )
        state[target] = tensor
        report.loaded.append(target)
        if mapped.action == "renamed":
            report.renamed[name] = target
    report.missing = [name for name in expected_shapes if name not in state and name not in _names(report.mismatched)]
    return state, report


def initial_value(name: str, shape: tuple[int, ...], config: Any) -> Tensor:
    """transformers' initialisation for a parameter the checkpoint lacks (only with strict=False)."""
    if name.endswith("LayerNorm.weight"):
        return torch.ones(shape)
    if name.endswith("bias"):
        return torch.zeros(shape)
    value = torch.empty(shape).normal_(mean=0.0, std=config.initializer_range)
    if name == "embeddings.word_embeddings.weight" and config.pad_token_id is not None:
        value[config.pad_token_id] = 0.0
    return value


def _names(mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]]) -> set[str]:
    return {name for name, _, _ in mismatched}


def _stored_dtype(state: dict[str, Tensor], checkpoint: CheckpointTensors) -> torch.dtype | None:
    dtypes = {tensor.dtype for tensor in state.values()}
    if len(dtypes) > 1:
        files = ", ".join(str(file) for file in checkpoint.files)
        raise CheckpointError(
            f"{files}: parameters are stored in several dtypes ({', '.join(sorted(map(str, dtypes)))}); pass dtype= "
            f"to from_pretrained to choose one"
        )
    return next(iter(dtypes), None)


def _strict_failure_message(directory: Path, report: LoadReport, checkpoint: CheckpointTensors) -> str:
    files = ", ".join(str(file) for file in checkpoint.files)
    shown = report.problems[:10]
    lines = [f"{files}: the checkpoint does not match the model built from {directory / CONFIG_FILE}:"]
    lines += [f"  - {line}" for line in shown]
    if len(report.problems) > len(shown):
        lines.append(f"  ... and {len(report.problems) - len(shown)} more")
    if report.missing and all(name.startswith("pooler.") for name in report.missing):
        lines.append("This checkpoint has no pooler: load it with add_pooling_layer=False.")
    lines.append("Nothing was loaded. Pass strict=False to load anyway (missing parameters are then initialised).")
    return "\n".join(lines)
