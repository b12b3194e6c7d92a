"""Gradient (activation) checkpointing of the encoder layers, as one value.

`Checkpointing` says which layers the encoder recomputes in the backward pass and how; the encoder keeps it
(`model.encoder.checkpointing`) and `activation_checkpointing_enable` (pretrained.py) replaces it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class Checkpointing:
    """`enabled`: checkpoint at all (in training only); `every_n_layers`: layers 0, n, 2n, ... are recomputed;
    `offload`: their saved inputs wait in (pinned) host memory; `kwargs`: for `torch.utils.checkpoint.checkpoint`
    (default non-reentrant: no warnings, DDP-safe, same gradients)."""

    enabled: bool = False
    every_n_layers: int = 1
    offload: bool = False
    kwargs: dict[str, Any] = field(default_factory=lambda: {"use_reentrant": False})

    def __post_init__(self) -> None:
        if not (isinstance(self.every_n_layers, int) and self.every_n_layers >= 1):
            raise ValueError(f"every_n_layers must be a positive integer, got {self.every_n_layers!r}")

    def covers(self, layer_index: int) -> bool:
        """Whether layer `layer_index` is recomputed in the backward pass (when training)."""
        return self.enabled and layer_index % self.every_n_layers == 0

    def run(self, layer: Callable[..., Any], hidden_states: torch.Tensor, *inputs: Any) -> Any:
        """`layer(hidden_states, *inputs)`, its activations recomputed in the backward pass instead of kept."""
        if not self.offload:
            return checkpoint(layer, hidden_states, *inputs, **self.kwargs)
        # Pinned host memory only when a GPU will read the saved inputs back.
        with torch.autograd.graph.save_on_cpu(pin_memory=hidden_states.is_cuda):
            return checkpoint(layer, hidden_states, *inputs, **self.kwargs)
