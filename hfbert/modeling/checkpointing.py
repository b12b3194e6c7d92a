"""Gradient (activation) checkpointing of the encoder layers, as one value.

`Checkpointing` says which layers the encoder recomputes in the backward pass and how; the encoder keeps it
(`model.encoder.checkpointing`) and `activation_checkpointing_enable` (pretrained.py) replaces it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from hfbert.modeling.padding import PaddedBatch


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

    def run(self, layer: Callable[..., Any], hidden_states: torch.Tensor, batch: PaddedBatch) -> Any:
        """`layer(hidden_states, batch)`, its activations recomputed in the backward pass instead of kept (training
        runs padded: `EncoderModel.layout`). `layer` is a layer's computation (`BertLayer.compute`), not the module:
        the layer calls this from its forward, so hooks on the layer run once, outside the recomputation."""

        # The batch's attention bias (MPNet's, one graph shared by every layer) goes in as a tensor argument of its
        # own: the reentrant variant backpropagates only into its tensor arguments, and would otherwise run the
        # shared graph's backward from inside each layer (an error from the second layer on).
        def biased_layer(hidden_states: torch.Tensor, bias: torch.Tensor | None) -> Any:
            return layer(hidden_states, batch if bias is None else batch.with_attention_bias(bias))

        inputs = (biased_layer, hidden_states, batch.attention_bias)
        if not self.offload:
            return checkpoint(*inputs, **self.kwargs)
        # Pinned host memory only when a GPU will read the saved inputs back.
        with torch.autograd.graph.save_on_cpu(pin_memory=hidden_states.is_cuda):
            return checkpoint(*inputs, **self.kwargs)
