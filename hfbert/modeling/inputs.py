"""`check_inputs`: every argument of an encoder's forward checked before any kernel runs.

An id outside the vocabulary, a sequence longer than the position table or a mask of the wrong shape otherwise
ends deep inside a kernel ("index out of range in self", or a device-side assert on GPU). Here each problem is a
`ValueError` that names the argument, the limit and the first offending position.

Value checks (ranges) read the tensors, so they are skipped while torch.compile / torch.export / jit trace the
model: shapes are still checked there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hfbert.modeling.config import BertConfig

INDEX_DTYPES = (torch.int64, torch.int32)


def check_inputs(
    config: BertConfig,
    device: torch.device,
    input_ids: Tensor | None,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    position_ids: Tensor | None,
    inputs_embeds: Tensor | None,
    dtype: torch.dtype | None = None,
) -> None:
    """Raise ValueError naming the first argument that the model cannot run: type (a tensor, not a list), dtype
    (`dtype`: the model's, which `inputs_embeds` must have), shape (batch and sequence agree across arguments),
    device, and values (ids in their tables, a 0/1 mask)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        _check_tensor("input_ids", input_ids, dimensions=2, integer=True)
        shape = tuple(input_ids.shape)
    else:
        _check_tensor("inputs_embeds", inputs_embeds, dimensions=3, integer=False)
        field = config.inputs_embeds_field
        if inputs_embeds.shape[-1] != getattr(config, field):
            raise ValueError(
                f"inputs_embeds has size {inputs_embeds.shape[-1]} in its last dimension; the model's {field} "
                f"is {getattr(config, field)}"
            )
        # The embeddings' sum promotes to the wider dtype: fp16 embeddings into an fp32 model work, fp64 ones (or
        # fp32 into a bf16 model) would reach LayerNorm in a dtype its weights are not ("mixed dtype").
        if dtype is not None and torch.promote_types(inputs_embeds.dtype, dtype) != dtype:
            raise ValueError(
                f"inputs_embeds has dtype {inputs_embeds.dtype} but the model runs in {dtype}; cast it: .to({dtype})"
            )
        shape = tuple(inputs_embeds.shape[:2])
    if 0 in shape:
        raise ValueError(f"empty batch: inputs have shape {shape} (batch, sequence); both must be at least 1")
    given = {
        "input_ids": input_ids,
        "inputs_embeds": inputs_embeds,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "position_ids": position_ids,
    }
    for name, tensor in given.items():
        if isinstance(tensor, Tensor) and tensor.device != device:  # other types are named below
            raise ValueError(f"{name} is on {tensor.device} but the model is on {device}; move both to one device")
    if attention_mask is not None:
        _check_tensor("attention_mask", attention_mask, dimensions=None, integer=False, floating_allowed=True)
        if tuple(attention_mask.shape) != shape:
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)}; expected (batch, sequence) = {shape}"
            )
        if attention_mask.is_complex():
            raise ValueError(f"attention_mask has dtype {attention_mask.dtype}; expected bool, integer or float 0/1")
    if token_type_ids is not None:
        _check_tensor("token_type_ids", token_type_ids, dimensions=2, integer=True)
        if tuple(token_type_ids.shape) != shape:
            raise ValueError(f"token_type_ids has shape {tuple(token_type_ids.shape)}; expected {shape}")
    if position_ids is not None:
        _check_tensor("position_ids", position_ids, dimensions=None, integer=True)
        if position_ids.shape[-1] != shape[1] or position_ids.dim() > 2 or not _broadcasts(position_ids, shape[0]):
            raise ValueError(
                f"position_ids has shape {tuple(position_ids.shape)}; expected (sequence,), (1, sequence) or "
                f"(batch, sequence) with sequence = {shape[1]}"
            )
    elif shape[1] > config.positions.max_length(config):  # the member's position scheme sets the limit
        raise ValueError(
            f"sequence length {shape[1]} exceeds {config.positions.limit(config)}; "
            f"truncate the input (tokenizer truncation=True, max_length={config.positions.max_length(config)})"
        )
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    _check_range("input_ids", input_ids, config.vocab_size, "vocab_size")
    if token_type_ids is not None:  # a member without token types refuses them before this, and has no such field
        _check_range("token_type_ids", token_type_ids, config.type_vocab_size, "type_vocab_size")
    _check_range("position_ids", position_ids, config.max_position_embeddings, "max_position_embeddings")
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        not_binary = (attention_mask != 0) & (attention_mask != 1)
        if bool(not_binary.any()):
            position = _first(not_binary)
            raise ValueError(
                f"attention_mask must hold 1 for real tokens and 0 for padding; found {attention_mask[position].item()}"
                f" at position {position} (an additive mask such as 0 / -10000 is not accepted)"
            )


def _check_tensor(
    name: str, tensor: Tensor, dimensions: int | None, integer: bool, floating_allowed: bool = False
) -> None:
    if not isinstance(tensor, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__} (use torch.tensor(...))")
    if dimensions is not None and tensor.dim() != dimensions:
        expected = "(batch, sequence)" if dimensions == 2 else "(batch, sequence, hidden)"
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}; expected {expected}")
    if floating_allowed:  # a mask: any real dtype, its values are checked to be 0 / 1
        return
    # Embedding lookups take int64 or int32 indices only: uint8 / int16 ids would fail inside the kernel.
    if integer and tensor.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} has dtype {tensor.dtype}; expected torch.int64 (or torch.int32): use .long()")
    if not integer and not tensor.is_floating_point():
        raise ValueError(f"{name} has dtype {tensor.dtype}; expected a floating-point dtype")


def _broadcasts(position_ids: Tensor, batch: int) -> bool:
    """(sequence,), (1, sequence) and (batch, sequence) position ids apply to a batch of `batch` rows."""
    return position_ids.dim() < 2 or position_ids.shape[0] in (1, batch)


def class_labels(name: str, labels: Tensor, classes: int, rows: int, ignore_index: int = -100) -> Tensor:
    """`labels` for a cross-entropy loss over `rows` predictions of `classes` classes, checked and flattened to
    (rows,): a tensor of integers in [0, classes), or `ignore_index` for a position without a target. A wrong
    value otherwise ends in "IndexError: Target 5 is out of bounds" (or a device-side assert on GPU)."""
    if not isinstance(labels, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
    if labels.dtype not in INDEX_DTYPES:
        raise ValueError(f"{name} has dtype {labels.dtype}; class labels must be torch.int64 (or torch.int32)")
    if labels.numel() != rows:
        raise ValueError(f"{name} has shape {tuple(labels.shape)} ({labels.numel()} labels) for {rows} predictions")
    if not (torch.compiler.is_compiling() or torch.jit.is_tracing()):
        outside = ((labels < 0) | (labels >= classes)) & (labels != ignore_index)
        if bool(outside.any()):
            position = _first(outside)
            raise ValueError(
                f"{name} must lie in [0, {classes}) or be {ignore_index} (ignored); found {labels[position].item()} "
                f"at position {position}"
            )
    return labels.reshape(-1)


def _check_range(name: str, tensor: Tensor | None, limit: int, field: str) -> None:
    if tensor is None:
        return
    outside = (tensor < 0) | (tensor >= limit)
    if bool(outside.any()):
        position = _first(outside)
        raise ValueError(
            f"{name} must lie in [0, {limit}) ({field} in config.json); found {tensor[position].item()} at position "
            f"{position}"
        )


def _first(flags: Tensor) -> tuple[int, ...]:
    return tuple(int(index) for index in flags.nonzero()[0])


def check_no_token_types(keywords: dict[str, Any], member: str = "MPNet") -> None:
    """The keywords a forward of a member without token types (MPNet, ModernBERT) takes beyond transformers' named
    arguments: `token_type_ids` only. Without token-type embeddings, all-zero ids (what a BERT tokenizer gives one
    text) mean nothing and are accepted; any other id would be silently dropped, so it is refused. Any other keyword
    is refused rather than dropped unseen (`BertPreTrainedModel.accepts_loss_kwargs` keeps the Trainer from passing
    `num_items_in_batch`)."""
    unknown = sorted(set(keywords) - {"token_type_ids"})
    if unknown:
        raise TypeError(f"{member}'s forward got unexpected keyword arguments {unknown}")
    token_type_ids = keywords.get("token_type_ids")
    if token_type_ids is not None and bool((token_type_ids != 0).any()):
        raise ValueError(
            f"token_type_ids: {member} has no token types (no token_type_embeddings), but non-zero ids were given; "
            f"pass none ({member}'s tokenizer gives none) or all zeros"
        )
