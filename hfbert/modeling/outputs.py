"""Model outputs: named fields that also behave like transformers' `ModelOutput`.

`out.last_hidden_state`, `out["last_hidden_state"]` and `out[0]` all work; as in transformers, fields that are
None are skipped by integer indexing, iteration and `to_tuple()`, and are absent as keys. Every output is a
`collections.abc.Mapping` (keys in field order) that can be rebuilt from a dict of its fields
(`type(out)({...})`), which is how tools that walk outputs (accelerate's fp32 conversion under mixed precision,
`to(device)` helpers) find and replace the tensors inside.

Every output class is a pytree node (its fields that are not None are the children), as transformers registers its
outputs: `torch.export`, `torch.compile(fullgraph=True)` and `torch.utils._pytree` see through them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch.utils._pytree as pytree
from torch import Tensor


class ModelOutput(Mapping):
    def __post_init__(self) -> None:
        # transformers' ModelOutput(dict) form: a mapping of field values as the only argument.
        first = fields(self)[0].name
        values = getattr(self, first)
        others = [getattr(self, f.name) for f in fields(self)[1:]]
        if isinstance(values, Mapping) and all(other is None for other in others):
            unknown = set(values) - {f.name for f in fields(self)}
            if unknown:
                raise TypeError(f"{type(self).__name__} has no field(s) {', '.join(sorted(map(str, unknown)))}")
            setattr(self, first, None)
            for name, value in values.items():
                setattr(self, name, value)

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, name) for name in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(name, getattr(self, name)) for name in self.keys()]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(key)
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


@dataclass(eq=False)
class BertModelOutput(ModelOutput):
    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass(eq=False)
class PreTrainingOutput(ModelOutput):
    loss: Tensor | None = None
    prediction_logits: Tensor | None = None
    seq_relationship_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass(eq=False)
class LogitsOutput(ModelOutput):
    """Masked LM, next sentence, sequence / token classification and multiple choice (transformers' fields)."""

    loss: Tensor | None = None
    logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass(eq=False)
class QuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


def _flatten(output: ModelOutput) -> tuple[list[Any], list[str]]:
    return output.values(), output.keys()


def _flatten_with_keys(output: ModelOutput) -> tuple[list[tuple[pytree.KeyEntry, Any]], list[str]]:
    return [(pytree.GetAttrKey(name), value) for name, value in output.items()], output.keys()


def _register_pytree_node(output_type: type[ModelOutput]) -> None:
    def unflatten(values: Any, names: list[str]) -> ModelOutput:
        return output_type(**dict(zip(names, values, strict=True)))

    pytree.register_pytree_node(
        output_type,
        _flatten,
        unflatten,
        serialized_type_name=f"{output_type.__module__}.{output_type.__qualname__}",
        flatten_with_keys_fn=_flatten_with_keys,
    )


for _output_type in (BertModelOutput, PreTrainingOutput, LogitsOutput, QuestionAnsweringOutput):
    _register_pytree_node(_output_type)
