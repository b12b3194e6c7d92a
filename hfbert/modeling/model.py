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

import torch
from torch import Tensor, nn

from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import BertConfig
from hfbert.modeling.encoder import EncoderLayer, EncoderModel, LayerStack
from hfbert.modeling.encoder import wants_tuple as wants_tuple  # where the inference floor imports it from
from hfbert.modeling.padding import PackedBatch, PaddedBatch


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig, width: int | None = None) -> None:
        """`width`: the embeddings' size where it is not hidden_size (ELECTRA's factorized `embedding_size`)."""
        super().__init__()
        width = width or config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        # RoBERTa's pad position has its own row, initialised to zero and never trained, as its pad token's.
        position_padding = config.positions.padding_index(config)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, width, position_padding)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, width)
        self.LayerNorm = nn.LayerNorm(width, eps=config.layer_norm_eps)
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
            # padding, pass position_ids to start real tokens at 0. (RoBERTa's come from `EncoderModel.run`.)
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


class BertLayer(EncoderLayer):
    """One encoder layer: attention, then the feed-forward block, each with its residual and post-LayerNorm. It keeps
    the layer protocol (`encoder.EncoderLayer`). A member whose layer differs in its parts names them
    (`attention_class`, MPNet's) or overrides `feed_forward`; one that differs in shape (pre-LayerNorm, a gated MLP)
    writes a sibling class with the same protocol.
    """

    attention_class: type[nn.Module] = BertAttention  # MPNet's names its parts differently

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = self.attention_class(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, input_size=config.intermediate_size)

    def compute(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        """The layer itself: attention, then the feed-forward block."""
        attention_output, probabilities = self.attention(hidden_states, batch)
        return self.feed_forward(attention_output), probabilities

    def feed_forward(self, hidden_states: Tensor) -> Tensor:
        """The MLP block after attention: `intermediate` (dense -> activation), then `output` (dense, the residual,
        LayerNorm)."""
        return self.output(self.intermediate(hidden_states), hidden_states)


class BertEncoder(LayerStack):
    """`encoder`: the stack of layers (`layer`), and how it is checkpointed in training (`checkpointing`, set by
    `activation_checkpointing_enable` in pretrained.py); `EncoderModel.run` runs them."""

    layer_class: type[nn.Module] = BertLayer

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config, nn.ModuleList(self.layer_class(config) for _ in range(config.num_hidden_layers)))


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: Tensor) -> Tensor:
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class BertModel(EncoderModel):
    """The BERT encoder; a drop-in for `transformers.BertModel` (same state dict keys, forward arguments and
    output fields). Its forward is `EncoderModel`'s (the kernel, the padding-free layout and their rules are told
    there), on BERT's embeddings, `encoder.layer` and pooler.
    """

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
        super().__init__(config, attn_implementation, padding_free)
        config = self.config  # hfbert's own, also when a transformers config was given
        self.embeddings = self.embeddings_class(config)
        self.encoder = self.encoder_class(config)
        # Without a pooler the module tree has no pooler at all, so DDP sees no unused parameters.
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def pool(self, last_hidden_state: Tensor) -> Tensor | None:
        return self.pooler(last_hidden_state) if self.pooler is not None else None
