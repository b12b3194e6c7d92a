"""BERT encoder, top to bottom.

Module names equal the tensor names of Hugging Face BERT checkpoints (`embeddings.word_embeddings`,
`encoder.layer.0.attention.self.query`, `pooler.dense`, ...), so `model.state_dict()` has exactly the keys of
`transformers.BertModel(config).state_dict()` and loading a checkpoint is a plain copy. Position ids and the
default token type ids are computed in `forward`, never stored.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=2))
    >>> out = model(input_ids=torch.tensor([[101, 7592, 102]]))
    >>> out.last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.attention import DEFAULT_ATTENTION, check_attention_implementation
from hfbert.modeling.checkpointing import Checkpointing
from hfbert.modeling.config import BertConfig
from hfbert.modeling.inputs import check_inputs
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch, batch_layout
from hfbert.modeling.pretrained import BertPreTrainedModel


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        # RoBERTa's pad position has its own row, initialised to zero and never trained, as its pad token's.
        position_padding = config.positions.padding_index(config)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size, position_padding)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if token_type_ids is None:
            # Row 0 broadcast over every position: the same values an all-zero id tensor would look up.
            token_type_embeddings = self.token_type_embeddings.weight[0]
        else:
            token_type_embeddings = self.token_type_embeddings(token_type_ids)
        if position_ids is None:
            # BERT's positions count from 0 at the first column, padding included (as in transformers): with left
            # padding, pass position_ids to start real tokens at 0. (RoBERTa's come from `BertModel.forward`.)
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        # Same summation order as transformers, so fp32 results agree to the last bits.
        embeddings = inputs_embeds + token_type_embeddings
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.check_heads()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.scale = self.head_size**-0.5
        self.dropout_probability = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        return batch.attend(
            self.query(hidden_states),
            self.key(hidden_states),
            self.value(hidden_states),
            num_heads=self.num_heads,
            scale=self.scale,
            dropout=self.dropout_probability if self.training else 0.0,
        )


class BertResidualOutput(nn.Module):
    """Project back to hidden_size, add the residual, normalise: the `output` block after attention and after
    the feed-forward layer (the two differ only in input width)."""

    def __init__(self, config: BertConfig, input_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(input_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, input_size=config.hidden_size)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        context, probabilities = self.self(hidden_states, batch)
        return self.output(context, hidden_states), probabilities


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACTIVATIONS[config.hidden_act]

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.activation(self.dense(hidden_states))


class BertLayer(nn.Module):
    """One encoder layer: attention, then the feed-forward block, each with its residual and post-LayerNorm.

    The layer protocol, which `BertEncoder`, checkpointing, the fast paths and a member's own layer all keep:
    `forward(hidden_states, batch, checkpointing=None) -> (hidden_states, probabilities)`, where `batch` is the
    call's layout (`padding.py`: the key mask, the attention context, padded or padding-free) and `probabilities`
    the attention maps when the kernel computes them (else None). A member whose layer differs in its parts names
    them (`attention_class`, MPNet's) or overrides `feed_forward`; one that differs in shape (pre-LayerNorm, a gated
    MLP) writes a sibling class with the same protocol.
    """

    attention_class: type[nn.Module] = BertAttention  # MPNet's names its parts differently

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = self.attention_class(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, input_size=config.intermediate_size)

    def forward(
        self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch, checkpointing: Checkpointing | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """`hidden_states` is (batch, sequence, hidden) on a PaddedBatch, (tokens, hidden) on a PackedBatch.
        With `checkpointing`, the layer's activations are recomputed in the backward pass."""
        if checkpointing is not None:
            # Inside forward, as transformers' GradientCheckpointingLayer does: hooks on the layer itself (FSDP2's,
            # PEFT's) run once, outside the recomputation.
            return checkpointing.run(self.compute, hidden_states, batch)
        return self.compute(hidden_states, batch)

    def compute(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        """The layer itself: attention, then the feed-forward block."""
        attention_output, probabilities = self.attention(hidden_states, batch)
        return self.feed_forward(attention_output), probabilities

    def feed_forward(self, hidden_states: Tensor) -> Tensor:
        """The MLP block after attention: `intermediate` (dense -> activation), then `output` (dense, the residual,
        LayerNorm)."""
        return self.output(self.intermediate(hidden_states), hidden_states)


class BertEncoder(nn.Module):
    """The stack of layers, and how it is checkpointed in training (`checkpointing`, set by
    `activation_checkpointing_enable` in pretrained.py)."""

    layer_class: type[nn.Module] = BertLayer

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(self.layer_class(config) for _ in range(config.num_hidden_layers))
        # A legacy `"gradient_checkpointing": true` in config.json turns it on, as in transformers, which reads it by
        # truthiness (older configs write 1).
        self.checkpointing = Checkpointing(enabled=bool(getattr(config, "gradient_checkpointing", False)))

    def forward(
        self,
        hidden_states: Tensor,
        batch: PaddedBatch | PackedBatch,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor | None]]:
        """Run every layer, in `batch`'s layout. Returns the last hidden states, the input and every layer's output
        (when `output_hidden_states`, else empty) and every layer's attention probabilities (when
        `output_attentions`, else empty)."""
        all_hidden_states, all_attentions = [], []
        for index, layer in enumerate(self.layer):
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            checkpointing = self.checkpointing if self.checkpointed(index) else None
            hidden_states, probabilities = layer(hidden_states, batch, checkpointing)
            if output_attentions:
                all_attentions.append(probabilities)
        if output_hidden_states:
            all_hidden_states.append(hidden_states)
        return hidden_states, all_hidden_states, all_attentions

    def checkpointed(self, layer_index: int) -> bool:
        """Whether this layer is recomputed in the backward pass (training with checkpointing on)."""
        return self.training and self.checkpointing.covers(layer_index)


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: Tensor) -> Tensor:
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class BertModel(BertPreTrainedModel):
    """The BERT encoder; a drop-in for `transformers.BertModel` (same state dict keys, forward arguments and
    output fields).

    `attn_implementation` is "sdpa" (default; fused kernel) or "eager". A call with `output_attentions=True`
    runs the eager kernel whatever the setting (sdpa never writes the probabilities out), as transformers does.
    In eval mode, a right-padded batch runs padding-free (see `padding.py`) unless `padding_free=False`;
    outputs at the pads of every right-padded row are then zeros instead of the values a padded computation gives
    them, whatever the row is batched with, also in a graph traced or exported from the model. Other masks (left
    padding, holes) run padded, as transformers computes them.
    """

    base_prefix = ""
    # The parts a family replaces (MPNet's embeddings have no token types; its encoder adds a position bias).
    embeddings_class: type[nn.Module] = BertEmbeddings
    encoder_class: type[nn.Module] = BertEncoder

    def __init__(
        self,
        config: BertConfig,
        add_pooling_layer: bool = True,
        attn_implementation: str | None = None,
        padding_free: bool = True,
    ) -> None:
        super().__init__(config)
        config = self.config  # hfbert's own, also when a transformers config was given
        # An explicit argument wins, then what the config says (transformers' `config._attn_implementation`).
        self.attn_implementation = attn_implementation or config._attn_implementation or DEFAULT_ATTENTION
        self.padding_free = padding_free
        self.embeddings = self.embeddings_class(config)
        self.encoder = self.encoder_class(config)
        # Without a pooler the module tree has no pooler at all, so DDP sees no unused parameters.
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

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
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        check_inputs(
            self.config,
            self.device,
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            dtype=self.dtype,
        )
        scheme = self.config.positions
        if position_ids is None:  # on the padded rows, before a padding-free batch packs them
            position_ids = scheme.position_ids(self.config, input_ids, inputs_embeds)
        batch = self.layout(attention_mask, output_attentions)
        if scheme.in_attention:  # rotary positions: attention reads them from the layout
            batch = batch.with_positions(position_ids)
        hidden_states = self.embeddings(*batch.embedding_inputs(input_ids, token_type_ids, position_ids, inputs_embeds))
        hidden_states, all_hidden_states, all_attentions = self.encoder(
            hidden_states, batch, output_hidden_states, output_attentions
        )
        hidden_states = batch.unpack(hidden_states)
        output = BertModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states) if self.pooler is not None else None,
            hidden_states=tuple(batch.unpack(states) for states in all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output.to_tuple() if wants_tuple(self.config, return_dict) else output

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

    def checkpointed(self, layer_index: int) -> bool:
        """Whether this layer is recomputed in the backward pass (training with checkpointing on)."""
        return self.encoder.checkpointed(layer_index)

    @property
    def checkpointing(self) -> Checkpointing:
        """Which layers are recomputed in the backward pass, and how (kept by the encoder, which runs the layers)."""
        return self.encoder.checkpointing

    @checkpointing.setter
    def checkpointing(self, checkpointing: Checkpointing) -> None:
        self.encoder.checkpointing = checkpointing

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether checkpointing is on: the attribute transformers' models have and PEFT reads on every module."""
        return self.encoder.checkpointing.enabled

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enabled: bool) -> None:
        self.encoder.checkpointing = replace(self.encoder.checkpointing, enabled=bool(enabled))

    @property
    def backbone(self) -> BertModel:
        return self

    @property
    def attn_implementation(self) -> str:
        """The attention kernel, "sdpa" or "eager"; kept on the config, where transformers keeps it."""
        return self.config._attn_implementation

    @attn_implementation.setter
    def attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = check_attention_implementation(name)


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
    """Whether `BertModel.forward` returns a tuple, as transformers' BertModel decides: `return_dict=False`, or none
    given and the config's `return_dict` (true unless config.json says otherwise) false."""
    if return_dict is None:
        return_dict = getattr(config, "return_dict", True)
    return return_dict is False
