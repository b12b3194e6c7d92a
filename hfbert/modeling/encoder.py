"""`EncoderModel`: the encoder's forward, written once for every member, and the hooks a member fills.

Every member's encoder runs the same steps: check the inputs, count the positions, pick the batch layout
(`padding.py`: padded or padding-free, the attention kernel), embed, run the layers (checkpointed in training,
recording hidden states and attention maps when asked), normalise after the last layer, unpack, return transformers'
outputs. `EncoderModel.run` is those steps; a member states only what differs, in these hooks:

- `layers_path`: where its layer list sits, by module name (BERT's "encoder.layer", ModernBERT's "layers",
  DistilBERT's "transformer.layer"); the module holding the list keeps the `checkpointing` value (BERT's `encoder`,
  a `LayerStack`), or the model itself when the list sits at its top level;
- `embed(batch, input_ids, token_type_ids, position_ids, inputs_embeds)`: the embeddings' output, from inputs
  already in the layout's order (a member without token types ignores them; `batch` gives the key mask to one that
  masks its embeddings, as DeBERTa does);
- `attention_context(batch, hidden_states)`: what every layer of one forward reads beside the layout, computed once
  (MPNet's relative-position bias; DeBERTa's relative embeddings, as a score term);
- `after_layer(index, hidden_states, embedded, batch)`: a step between layers (DeBERTa-v2's convolution after
  layer 0, which reads the embeddings' output); none by default;
- `normalize_output(hidden_states)`: a norm after the last layer (ModernBERT's `final_norm`); none by default;
- `pool(last_hidden_state)`: the pooler's output (BERT's `pooler`), None without one;
- each layer keeps the layer protocol (`EncoderLayer`):
  `layer(hidden_states, batch, checkpointing=None) -> (hidden_states, probabilities)`.

`forward` has BERT's arguments; a member whose transformers class takes others (no `token_type_ids`) restates the
signature and calls `run`.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from hfbert.modeling.attention import DEFAULT_ATTENTION, check_attention_implementation
from hfbert.modeling.checkpointing import Checkpointing
from hfbert.modeling.config import BertConfig
from hfbert.modeling.inputs import check_inputs
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch, batch_layout
from hfbert.modeling.pretrained import BertPreTrainedModel


def initial_checkpointing(config: BertConfig) -> Checkpointing:
    """A legacy `"gradient_checkpointing": true` in config.json turns checkpointing on, as in transformers, which reads
    it by truthiness (older configs write 1)."""
    return Checkpointing(enabled=bool(getattr(config, "gradient_checkpointing", False)))


class EncoderLayer(nn.Module):
    """The layer protocol every member's layer keeps: `forward(hidden_states, batch, checkpointing=None) ->
    (hidden_states, probabilities)`, where `batch` is the call's layout (`padding.py`: the key mask, the attention
    context, padded or padding-free) and `probabilities` the attention maps when the kernel computes them (else
    None). A layer writes `compute(hidden_states, batch)`, its computation; with `checkpointing`, its activations are
    recomputed in the backward pass."""

    def forward(
        self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch, checkpointing: Checkpointing | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """`hidden_states` is (batch, sequence, hidden) on a PaddedBatch, (tokens, hidden) on a PackedBatch."""
        if checkpointing is not None:
            # Inside forward, as transformers' GradientCheckpointingLayer does: hooks on the layer itself (FSDP2's,
            # PEFT's) run once, outside the recomputation.
            return checkpointing.run(self.compute, hidden_states, batch)
        return self.compute(hidden_states, batch)

    def compute(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError


class LayerStack(nn.Module):
    """A module that holds the layer list under `layer` (BERT's `encoder`, DistilBERT's `transformer`) and how it is
    checkpointed in training (`checkpointing`, set by `activation_checkpointing_enable` in pretrained.py). The model
    runs the layers (`EncoderModel.run`); a member's stack adds what sits beside them (MPNet's position bias)."""

    def __init__(self, config: BertConfig, layers: nn.ModuleList) -> None:
        super().__init__()
        self.layer = layers
        self.checkpointing = initial_checkpointing(config)

    def checkpointed(self, layer_index: int) -> bool:
        """Whether this layer is recomputed in the backward pass (training with checkpointing on)."""
        return self.training and self.checkpointing.covers(layer_index)


class EncoderModel(BertPreTrainedModel):
    """The encoder's forward and what goes with it (the layout of a call, the attention kernel, checkpointing); a
    member's model class builds its modules and fills the hooks (module docstring).

    `attn_implementation` is "sdpa" (default; fused kernel) or "eager". A call with `output_attentions=True` runs the
    eager kernel whatever the setting (sdpa never writes the probabilities out), as transformers does. In eval mode,
    a right-padded batch runs padding-free (see `padding.py`) unless `padding_free=False`; outputs at the pads of
    every right-padded row are then zeros instead of the values a padded computation gives them, whatever the row
    is batched with, also in a graph traced or exported from the model. Other masks (left padding, holes) run
    padded, as transformers computes them.
    """

    base_prefix: ClassVar[str] = ""
    layers_path: ClassVar[str] = "encoder.layer"

    def __init__(self, config: BertConfig, attn_implementation: str | None = None, padding_free: bool = True) -> None:
        super().__init__(config)
        config = self.config  # hfbert's own, also when a transformers config was given
        # An explicit argument wins, then what the config says (transformers' `config._attn_implementation`).
        self.attn_implementation = attn_implementation or config._attn_implementation or DEFAULT_ATTENTION
        self.padding_free = padding_free
        # Kept here only when the layer list sits at the model's top level (`checkpointing`).
        self._top_level_checkpointing = initial_checkpointing(config)

    # -- the hooks -------------------------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        """The layer list, at `layers_path`."""
        return self._submodule(self.layers_path)

    def embed(
        self,
        batch: PaddedBatch | PackedBatch,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        """The embeddings' output; the inputs are in `batch`'s layout (BERT's embeddings take all four)."""
        return self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)

    def attention_context(self, batch: PaddedBatch | PackedBatch, hidden_states: Tensor) -> PaddedBatch | PackedBatch:
        """`batch` with what every layer of this forward reads (a position bias, a score term); unchanged here."""
        return batch

    def after_layer(
        self, index: int, hidden_states: Tensor, embedded: Tensor, batch: PaddedBatch | PackedBatch
    ) -> Tensor:
        """A step after layer `index`, given the embeddings' output `embedded`; none here."""
        return hidden_states

    def normalize_output(self, hidden_states: Tensor) -> Tensor:
        """A norm after the last layer; none here."""
        return hidden_states

    def pool(self, last_hidden_state: Tensor) -> Tensor | None:
        """The pooler's output; None for an encoder without a pooler."""
        return None

    # -- forward ---------------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """Run the encoder.

        `attention_mask` is (batch, sequence) with 1 (or True) for real tokens and 0 for padding. Returns a
        `BertModelOutput` (or its `to_tuple()` when `return_dict=False`). Bad inputs raise `ValueError` naming the
        argument, the limit and the first offending position, before any kernel runs.
        """
        return self.run(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
        )

    def run(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        return_dict: bool | None,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """The encoder's steps, in order (the module docstring); `forward`'s arguments by position."""
        config = self.config
        if output_attentions is None:
            output_attentions = config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        check_inputs(
            config, self.device, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds, self.dtype
        )
        scheme = config.positions
        if position_ids is None:  # on the padded rows, before a padding-free batch packs them
            position_ids = scheme.position_ids(config, input_ids, inputs_embeds)
        batch = self.layout(attention_mask, output_attentions)
        if scheme.in_attention:  # rotary positions: attention reads them from the layout
            batch = batch.with_positions(position_ids)
        embedded = self.embed(batch, *batch.embedding_inputs(input_ids, token_type_ids, position_ids, inputs_embeds))
        batch = self.attention_context(batch, embedded)
        hidden_states = embedded
        all_hidden_states, all_attentions = [], []
        for index, layer in enumerate(self.layers):
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            checkpointing = self.checkpointing if self.checkpointed(index) else None
            hidden_states, probabilities = layer(hidden_states, batch, checkpointing)
            hidden_states = self.after_layer(index, hidden_states, embedded, batch)
            if output_attentions:
                all_attentions.append(probabilities)
        hidden_states = self.normalize_output(hidden_states)
        if output_hidden_states:
            all_hidden_states.append(hidden_states)
        hidden_states = batch.unpack(hidden_states)
        output = BertModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pool(hidden_states),
            hidden_states=tuple(batch.unpack(states) for states in all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output.to_tuple() if wants_tuple(config, return_dict) else output

    def layout(self, attention_mask: Tensor | None, output_attentions: bool) -> PaddedBatch | PackedBatch:
        """The batch layout and attention kernel of one call. Padding-free only where nothing observable changes
        (inference, no attention maps asked); attention maps asked run the eager kernel (sdpa never materialises
        the probabilities)."""
        implementation = self.attn_implementation
        if output_attentions and implementation != "eager":
            _warn_once_eager_for_attentions(implementation)
            implementation = "eager"
        padding_free = self.padding_free and not self.training and not output_attentions
        return batch_layout(attention_mask, implementation, padding_free)

    # -- the kernel and checkpointing ------------------------------------------------------------------------------
    @property
    def attn_implementation(self) -> str:
        """The attention kernel, "sdpa" or "eager"; kept on the config, where transformers keeps it."""
        return self.config._attn_implementation

    @attn_implementation.setter
    def attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = check_attention_implementation(name)

    def _layer_holder(self) -> nn.Module:
        return self._submodule(self.layers_path.rpartition(".")[0])

    def _submodule(self, path: str) -> nn.Module:
        # Through the registered modules, not attributes: ModernBERT's layer list is named `layers`, as this property.
        module = self
        for name in filter(None, path.split(".")):
            module = module._modules[name]
        return module

    @property
    def checkpointing(self) -> Checkpointing:
        """Which layers are recomputed in the backward pass, and how (kept by the module holding the layers)."""
        holder = self._layer_holder()
        return self._top_level_checkpointing if holder is self else holder.checkpointing

    @checkpointing.setter
    def checkpointing(self, checkpointing: Checkpointing) -> None:
        holder = self._layer_holder()
        if holder is self:
            self._top_level_checkpointing = checkpointing
        else:
            holder.checkpointing = checkpointing

    def checkpointed(self, layer_index: int) -> bool:
        """Whether this layer is recomputed in the backward pass (training with checkpointing on)."""
        return self.training and self.checkpointing.covers(layer_index)

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether checkpointing is on: the attribute transformers' models have and PEFT reads on every module."""
        return self.checkpointing.enabled

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enabled: bool) -> None:
        self.checkpointing = replace(self.checkpointing, enabled=bool(enabled))

    @property
    def backbone(self) -> EncoderModel:
        return self


_warned_eager_for_attentions = False


def _warn_once_eager_for_attentions(implementation: str) -> None:
    global _warned_eager_for_attentions
    if not _warned_eager_for_attentions and not torch.compiler.is_compiling():
        _warned_eager_for_attentions = True
        warnings.warn(
            f"output_attentions=True: attn_implementation={implementation!r} does not compute attention "
            f"probabilities, so calls that ask for them run the eager kernel (said once).",
            stacklevel=2,
        )


def wants_tuple(config: Any, return_dict: bool | None) -> bool:
    """Whether an encoder's forward returns a tuple, as transformers' BertModel decides: `return_dict=False`, or none
    given and the config's `return_dict` (true unless config.json says otherwise) false."""
    if return_dict is None:
        return_dict = getattr(config, "return_dict", True)
    return return_dict is False
