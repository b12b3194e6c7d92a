"""DistilBERT (distilbert-base-uncased, the sentiment-analysis pipeline's default model, msmarco-distilbert), top to
bottom: BERT's math with other names, six layers, no token types, no pooler.

- config: transformers' own names (`dim`, `n_layers`, `n_heads`, `hidden_dim`, `dropout`, `attention_dropout`,
  `activation`), read under the common ones too (`attribute_map`); every LayerNorm's eps is 1e-12, not a field;
- embeddings: words + positions (learned, or initialised to transformers' sinusoidal table with
  `sinusoidal_pos_embds`) -> LayerNorm -> dropout; positions count columns from 0, as BERT's;
- layers (`transformer.layer.N`): attention `q_lin / k_lin / v_lin`, then `out_lin` (no dropout after it), the
  residual, `sa_layer_norm`; `ffn.lin1` -> activation -> `ffn.lin2` -> dropout, the residual, `output_layer_norm`;
- heads beside `distilbert.`: the masked LM `vocab_transform` -> activation -> `vocab_layer_norm` ->
  `vocab_projector` (tied to the word embeddings, a bias of its own); sequence classification and multiple choice
  read column 0 through `pre_classifier` -> ReLU -> dropout (`seq_classif_dropout`) -> `classifier`; token
  classification drops out with `dropout`, question answering with `qa_dropout` before `qa_outputs`;
- forward: transformers' DistilBERT arguments (`inputs_embeds` before `position_ids`, no `token_type_ids`: all-zero
  ones are accepted by keyword, any other refused, where transformers drops them unseen).

    >>> import torch, hfbert
    >>> model = hfbert.DistilBertModel(hfbert.DistilBertConfig(n_layers=1))
    >>> model(input_ids=torch.tensor([[101, 7592, 102]])).last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import DISTILBERT_KEYS, KeyLayout
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import EncoderConfig
from hfbert.modeling.encoder import EncoderLayer, EncoderModel, LayerStack
from hfbert.modeling.inputs import check_no_token_types, class_labels
from hfbert.modeling.outputs import BertModelOutput, LogitsOutput, QuestionAnsweringOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch
from hfbert.modeling.pretrained import BertPreTrainedModel, resized_rows
from hfbert.modeling.task import (
    MaskedLanguageModel,
    TaskModel,
    answer_spans,
    flat_choices,
    sequence_classification_loss,
    token_classification_loss,
)

LAYER_NORM_EPS = 1e-12  # every DistilBERT LayerNorm's, fixed in transformers' code
# transformers' aliases (its `attribute_map`): a keyword or config.json key under the common name sets the field.
ALIASES = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}


@dataclass
class DistilBertConfig(EncoderConfig):
    """config.json of a DistilBERT checkpoint, with transformers' DistilBertConfig fields and defaults."""

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    pad_token_id: int | None = 0
    model_type: str = "distilbert"
    # The common names as keywords. transformers' three set the field they name, over it; `intermediate_size`,
    # which transformers' DistilBertConfig does not map, is kept as written (it reads as `hidden_dim`).
    hidden_size: InitVar[int | None] = None
    num_attention_heads: InitVar[int | None] = None
    num_hidden_layers: InitVar[int | None] = None
    intermediate_size: InitVar[int | None] = None

    key_layout: ClassVar[KeyLayout] = DISTILBERT_KEYS
    positive_integers: ClassVar[tuple[str, ...]] = (
        "vocab_size", "dim", "n_layers", "n_heads", "hidden_dim", "max_position_embeddings",
    )  # fmt: skip
    probabilities: ClassVar[tuple[str, ...]] = ("dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout")
    positive_numbers: ClassVar[tuple[str, ...]] = ("initializer_range",)
    activations: ClassVar[tuple[str, ...]] = ("activation",)
    flags: ClassVar[tuple[str, ...]] = (*EncoderConfig.flags, "sinusoidal_pos_embds")
    attribute_map: ClassVar[dict[str, str]] = {**ALIASES, "intermediate_size": "hidden_dim"}
    inspect_fields: ClassVar[tuple[str, ...]] = (
        "sinusoidal_pos_embds", "dropout", "attention_dropout", "qa_dropout", "seq_classif_dropout",
    )  # fmt: skip

    def __post_init__(
        self,
        attn_implementation: str | None,
        torch_dtype: Any,
        hidden_size: int | None = None,
        num_attention_heads: int | None = None,
        num_hidden_layers: int | None = None,
        intermediate_size: int | None = None,
    ) -> None:
        given = dict(
            hidden_size=hidden_size, num_attention_heads=num_attention_heads, num_hidden_layers=num_hidden_layers
        )
        for common, own in ALIASES.items():
            # From config.json the common names arrive among the unknown keys (`from_dict`).
            value = self.extra_fields.pop(common, None) if given[common] is None else given[common]
            if value is not None:
                setattr(self, own, value)
        if intermediate_size is not None:
            self.extra_fields["intermediate_size"] = intermediate_size
        super().__post_init__(attn_implementation, torch_dtype)

    @property
    def feed_forward_activation(self) -> str:
        return self.activation

    def check_heads(self) -> None:
        """Raise ConfigError unless `dim` splits evenly into `n_heads` (transformers' model refuses it too)."""
        if self.dim % self.n_heads != 0:
            raise self._fail("dim", f"({self.dim}) must be divisible by n_heads ({self.n_heads})")


# The common names read through `attribute_map` (EncoderConfig.__getattr__), not as the InitVars' class defaults.
for _name in DistilBertConfig.attribute_map:
    delattr(DistilBertConfig, _name)


def sinusoidal_positions(positions: int, dim: int) -> Tensor:
    """transformers' fixed table: sin at even columns, cos at odd ones, of `position / 10000 ** (2 * (j // 2) / dim)`,
    computed in float64 (as its numpy code) and rounded to float32: the same bits."""
    exponents = torch.tensor([2 * (column // 2) / dim for column in range(dim)], dtype=torch.float64)
    angles = torch.arange(positions, dtype=torch.float64).unsqueeze(1) / torch.pow(10000.0, exponents)
    table = torch.empty(positions, dim)
    table[:, 0::2] = angles[:, 0::2].sin().float()
    table[:, 1::2] = angles[:, 1::2].cos().float()
    return table


class Activation(nn.Module):
    """The activation as a module, as transformers registers DistilBERT's (`activation`), so that the masked LM's
    head is a sequence of modules in both libraries (`hfbert parity` runs them in turn)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.function = ACTIVATIONS[name]

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.function(hidden_states)


class DistilBertEmbeddings(nn.Module):
    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.LayerNorm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, input_ids: Tensor | None, position_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        if position_ids is None:  # a padded batch: column indices (the padding-free layout packs them)
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        return self.dropout(self.LayerNorm(inputs_embeds + self.position_embeddings(position_ids)))


class DistilBertSelfAttention(nn.Module):
    """`attention`: q, k, v projections, attention over the batch's layout, and `out_lin` back."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        config.check_heads()
        self.num_heads = config.n_heads
        self.scale = (config.dim // config.n_heads) ** -0.5
        self.dropout_probability = config.attention_dropout
        self.q_lin = nn.Linear(config.dim, config.dim)
        self.k_lin = nn.Linear(config.dim, config.dim)
        self.v_lin = nn.Linear(config.dim, config.dim)
        self.out_lin = nn.Linear(config.dim, config.dim)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        context, probabilities = batch.attend(
            self.q_lin(hidden_states),
            self.k_lin(hidden_states),
            self.v_lin(hidden_states),
            num_heads=self.num_heads,
            scale=self.scale,
            dropout=self.dropout_probability if self.training else 0.0,
        )
        return self.out_lin(context), probabilities


class DistilBertFeedForward(nn.Module):
    """`ffn`: lin1 -> activation -> lin2 -> dropout."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.dropout = nn.Dropout(config.dropout)
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.dropout(self.lin2(self.activation(self.lin1(hidden_states))))


class DistilBertLayer(EncoderLayer):
    """transformers' TransformerBlock: attention, add, `sa_layer_norm`; feed-forward, add, `output_layer_norm`."""

    def __init__(self, config: DistilBertConfig) -> None:
        super().__init__()
        self.attention = DistilBertSelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.ffn = DistilBertFeedForward(config)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)

    def compute(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        attended, probabilities = self.attention(hidden_states, batch)
        attended = self.sa_layer_norm(attended + hidden_states)
        return self.output_layer_norm(self.ffn(attended) + attended), probabilities


class DistilBertPreTrainedModel(BertPreTrainedModel):
    """What every DistilBERT class declares, and BERT's initialisation with transformers' sinusoidal table for the
    positions where `sinusoidal_pos_embds` asks for it."""

    config_class: ClassVar[type[EncoderConfig]] = DistilBertConfig
    base_model_prefix: ClassVar[str] = "distilbert"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, DistilBertEmbeddings) and self.config.sinusoidal_pos_embds:
            table = module.position_embeddings
            table.weight.copy_(sinusoidal_positions(*table.weight.shape))
            table._is_hf_initialized = True  # visited after its parent: the table stays


class DistilBertModel(DistilBertPreTrainedModel, EncoderModel):
    """The DistilBERT encoder; a drop-in for `transformers.DistilBertModel` (same state dict keys, forward arguments
    and outputs: no pooler output). `EncoderModel`'s forward: sdpa (default) or eager, attention maps through eager,
    and in eval mode a right-padded batch runs padding-free (pad positions of the outputs are then zeros) unless
    `padding_free=False`."""

    layers_path: ClassVar[str] = "transformer.layer"

    def __init__(
        self,
        config: DistilBertConfig,
        add_pooling_layer: bool = False,
        attn_implementation: str | None = None,
        padding_free: bool = True,
    ) -> None:
        """`add_pooling_layer` is BertModel's argument, taken so that the tools build every member alike; DistilBERT
        has no pooler (`pooler` is None), so True is refused."""
        if add_pooling_layer:
            raise ValueError("DistilBERT has no pooler: add_pooling_layer must be False")
        super().__init__(config, attn_implementation, padding_free)
        config = self.config
        self.embeddings = DistilBertEmbeddings(config)
        self.transformer = LayerStack(config, nn.ModuleList(DistilBertLayer(config) for _ in range(config.n_layers)))
        self.pooler = None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """Run the encoder; `attention_mask` (batch, sequence) is 1 for real tokens and 0 for padding. Bad inputs
        raise ValueError naming the argument and the limit."""
        check_no_token_types(kwargs, member="DistilBERT")
        return self.run(
            input_ids,
            attention_mask,
            None,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
        )

    def embed(
        self,
        batch: PaddedBatch | PackedBatch,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        return self.embeddings(input_ids, position_ids, inputs_embeds)


class _DistilBertWithHead(DistilBertPreTrainedModel, TaskModel):
    """The encoder at `distilbert`, then the task's heads."""

    backbone_class: ClassVar[type[BertPreTrainedModel]] = DistilBertModel

    def encode(self, **inputs: Any) -> Any:
        """The encoder by keyword, refusing what DistilBERT cannot take (non-zero token types, unknown keywords)."""
        check_no_token_types(inputs.pop("keywords"), member="DistilBERT")
        return self.distilbert(**inputs, return_dict=True)


class DistilBertVocabularyLogits(nn.Module):
    """The masked LM's hidden states -> vocabulary logits, the module every member's masked LM gives as
    `prediction_head`; its four modules sit at the model's top level, as transformers keeps them. It owns no weights
    and is no submodule (the state dict keeps transformers' names); each call reads the model's current modules."""

    def __init__(self, model: DistilBertForMaskedLM) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # a plain reference: registering it would make a module cycle

    @property
    def decoder(self) -> nn.Linear:
        """The vocabulary projection (the output embeddings)."""
        return self._model.vocab_projector

    def forward(self, hidden_states: Tensor) -> Tensor:
        model = self._model
        return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(hidden_states))))


class DistilBertForMaskedLM(_DistilBertWithHead, MaskedLanguageModel):
    heads = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.")

    def build_heads(self, config: DistilBertConfig) -> None:
        self.activation = Activation(config.activation)
        self.vocab_transform = nn.Linear(config.dim, config.dim)
        self.vocab_layer_norm = nn.LayerNorm(config.dim, eps=LAYER_NORM_EPS)
        self.vocab_projector = nn.Linear(config.dim, config.vocab_size)
        object.__setattr__(self, "_vocabulary_logits", DistilBertVocabularyLogits(self))

    @property
    def prediction_head(self) -> DistilBertVocabularyLogits:
        return self._vocabulary_logits

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.prediction_head(encoded.last_hidden_state)
        loss = None
        if labels is not None:  # label -100 marks positions without a target
            labels = class_labels("labels", labels, self.config.vocab_size, logits.shape[:-1].numel())
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), labels)
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        """`vocab_projector` follows a resized vocabulary as in transformers: tied, its weight is the new embeddings;
        untied, it grows as the embeddings do; its bias grows with zeros while tied, with the old mean once not."""
        old = self.vocab_projector
        tied = "vocab_projector.weight" in self.tied_weights()
        projector = nn.Linear(self.config.dim, new_num_tokens).to(device=old.weight.device, dtype=old.weight.dtype)
        std = self.config.initializer_range
        if not tied:
            projector.weight = nn.Parameter(resized_rows(old.weight, new_num_tokens, mean_resizing, std))
        projector.bias = nn.Parameter(resized_rows(old.bias, new_num_tokens, mean_resizing and not tied, std=0.0))
        projector._is_hf_initialized = True
        self.vocab_projector = projector


class _ColumnZeroClassifier(_DistilBertWithHead):
    """Sequence classification and multiple choice: column 0 -> `pre_classifier` -> ReLU -> dropout
    (`seq_classif_dropout`) -> `classifier`."""

    heads = ("pre_classifier.", "classifier.")
    outputs_per_row: ClassVar[int | None] = None  # None: one per label

    def build_heads(self, config: DistilBertConfig) -> None:
        self.num_labels = config.num_labels
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, self.outputs_per_row or config.num_labels)
        self.dropout = nn.Dropout(config.seq_classif_dropout)

    def classify(self, last_hidden_state: Tensor) -> Tensor:
        return self.classifier(self.dropout(F.relu(self.pre_classifier(last_hidden_state[:, 0]))))


class DistilBertForSequenceClassification(_ColumnZeroClassifier):
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.classify(encoded.last_hidden_state)
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(self.config, self.num_labels, logits, labels)
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class DistilBertForMultipleChoice(_ColumnZeroClassifier):
    """One score per choice, from each choice's column 0."""

    outputs_per_row = 1

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        encoded = self.encode(
            input_ids=flat_choices(input_ids),
            attention_mask=flat_choices(attention_mask),
            inputs_embeds=flat_choices(inputs_embeds, trailing=2),
            position_ids=flat_choices(position_ids),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords={
                name: flat_choices(value) if isinstance(value, Tensor) else value for name, value in kwargs.items()
            },
        )
        logits = self.classify(encoded.last_hidden_state).view(-1, num_choices)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, class_labels("labels", labels, num_choices, len(logits)))
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class DistilBertForTokenClassification(_DistilBertWithHead):
    """Every position: dropout (`dropout`) -> `classifier`."""

    heads = ("classifier.",)

    def build_heads(self, config: DistilBertConfig) -> None:
        self.num_labels = config.num_labels
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.dim, config.num_labels)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.classifier(self.dropout(encoded.last_hidden_state))
        loss = token_classification_loss(logits, labels, self.num_labels) if labels is not None else None
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class DistilBertForQuestionAnswering(_DistilBertWithHead):
    """Start and end logits: dropout (`qa_dropout`) -> `qa_outputs`. Pads take part in the loss, so the encoder runs
    padded. A config whose `num_labels` is not 2 is refused, as transformers' model refuses it."""

    heads = ("qa_outputs.",)

    def build_heads(self, config: DistilBertConfig) -> None:
        if config.num_labels != 2:
            raise config._fail("num_labels", f"is {config.num_labels}; DistilBERT's question answering needs 2")
        self.backbone.padding_free = False
        self.qa_outputs = nn.Linear(config.dim, 2)
        self.dropout = nn.Dropout(config.qa_dropout)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        position_ids: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.qa_outputs(self.dropout(encoded.last_hidden_state))
        output = answer_spans(logits, start_positions, end_positions, encoded.hidden_states, encoded.attentions)
        return self.finish(output, return_dict)
