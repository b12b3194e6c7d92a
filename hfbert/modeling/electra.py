"""ELECTRA (google/electra-*-discriminator and -generator, the ms-marco ELECTRA cross-encoders): BERT's encoder with a
factorized embedding, and its two pre-training heads.

What ELECTRA changes, part by part:

- embeddings: BERT's (words + token types + positions, LayerNorm), `embedding_size` wide; `embeddings_project`, a
  Linear to `hidden_size`, follows them when the two differ (there is none when they are equal), and its output is
  the first hidden state. The layers are BERT's, under BERT's names (`electra.encoder.layer.N...`); no pooler;
- the discriminator (`ElectraForPreTraining`): `discriminator_predictions` (dense -> `hidden_act` -> dense to one
  logit per token), its binary cross-entropy over the tokens the attention mask keeps;
- the generator (`ElectraForMaskedLM`): `generator_predictions` (dense to `embedding_size` -> exact GELU ->
  LayerNorm), then `generator_lm_head`, whose weight is the word embeddings with `tie_word_embeddings`;
- sequence classification: `classifier` as RoBERTa's (`dense`, `out_proj` on the first token) with exact GELU where
  RoBERTa has tanh; multiple choice summarises each choice with `sequence_summary` (`summary_type`,
  `summary_use_proj`, `summary_activation`, `summary_last_dropout`) before `classifier`; token classification and
  question answering are BERT's.

    >>> import torch, hfbert
    >>> model = hfbert.ElectraModel(hfbert.ElectraConfig(num_hidden_layers=1))
    >>> model(input_ids=torch.tensor([[101, 7592, 102]])).last_hidden_state.shape
    torch.Size([1, 3, 256])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import (
    CLASSIFIER_HEAD,
    DISCRIMINATOR_HEAD,
    ELECTRA_KEYS,
    GENERATOR_DECODER,
    GENERATOR_HEAD,
    SEQUENCE_SUMMARY,
    KeyLayout,
)
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import BertConfig, EncoderConfig
from hfbert.modeling.encoder import EncoderModel
from hfbert.modeling.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForTokenClassification,
)
from hfbert.modeling.model import BertEmbeddings, BertEncoder
from hfbert.modeling.outputs import LogitsOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch
from hfbert.modeling.pretrained import resized_rows
from hfbert.modeling.shared_heads import ClassificationHead, ClassificationHeadForSequenceClassification
from hfbert.modeling.task import TaskModel

# transformers' ElectraSequenceSummary's ways of reading one vector per choice ("attn" is not implemented there).
SUMMARY_TYPES = ("first", "last", "mean", "cls_index")


@dataclass
class ElectraConfig(EncoderConfig):
    """config.json of an ELECTRA checkpoint, with transformers' ElectraConfig fields and defaults (electra-small's
    discriminator shape): BERT's fields, `embedding_size`, and the multiple-choice summary's `summary_*`."""

    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    summary_type: str = "first"
    summary_use_proj: bool = True
    summary_activation: str = "gelu"
    summary_last_dropout: float = 0.1
    pad_token_id: int | None = 0
    position_embedding_type: str = "absolute"
    use_cache: bool = True
    classifier_dropout: float | None = None
    is_decoder: bool = False
    add_cross_attention: bool = False
    model_type: str = "electra"

    key_layout: ClassVar[KeyLayout] = ELECTRA_KEYS
    positive_integers: ClassVar[tuple[str, ...]] = (*BertConfig.positive_integers, "embedding_size")
    probabilities: ClassVar[tuple[str, ...]] = (*BertConfig.probabilities, "summary_last_dropout")
    positive_numbers: ClassVar[tuple[str, ...]] = BertConfig.positive_numbers
    activations: ClassVar[tuple[str, ...]] = BertConfig.activations
    flags: ClassVar[tuple[str, ...]] = (*EncoderConfig.flags, "summary_use_proj")
    inspect_fields: ClassVar[tuple[str, ...]] = ("embedding_size",)
    inputs_embeds_field: ClassVar[str] = "embedding_size"

    def validate(self) -> None:
        super().validate()
        if self.position_embedding_type != "absolute":
            raise self._fail(
                "position_embedding_type",
                f"is {self.position_embedding_type!r}; hfbert implements only 'absolute' position embeddings",
            )
        for name in ("is_decoder", "add_cross_attention"):
            if getattr(self, name) is not False:
                raise self._fail(name, "must be false: hfbert is an encoder (no causal mask, no cross-attention)")
        if self.summary_type not in SUMMARY_TYPES:
            raise self._fail("summary_type", f"is {self.summary_type!r}; expected one of {SUMMARY_TYPES}")
        # An empty name means no activation, as in transformers (which refuses null and fails on an unknown name).
        name = self.summary_activation
        if not isinstance(name, str) or (name and name not in ACTIVATIONS):
            raise self._fail(
                "summary_activation",
                f"is {name!r}; supported: '' (none), {', '.join(sorted(ACTIVATIONS))}",
            )


class ElectraModel(EncoderModel):
    """The ELECTRA encoder; a drop-in for `transformers.ElectraModel` (same state dict keys, forward arguments and
    outputs: no pooler). `EncoderModel`'s forward on BERT's layers, after the factorized embedding."""

    config_class: ClassVar[type[EncoderConfig]] = ElectraConfig
    base_model_prefix: ClassVar[str] = "electra"

    def __init__(
        self,
        config: ElectraConfig,
        add_pooling_layer: bool = False,
        attn_implementation: str | None = None,
        padding_free: bool = True,
    ) -> None:
        """`add_pooling_layer` is BertModel's argument, taken so that the tools build every member alike; ELECTRA has
        no pooler, so True is refused."""
        if add_pooling_layer:
            raise ValueError("ELECTRA has no pooler: add_pooling_layer must be False")
        super().__init__(config, attn_implementation, padding_free)
        config = self.config
        self.embeddings = BertEmbeddings(config, width=config.embedding_size)
        if config.embedding_size != config.hidden_size:
            self.embeddings_project = nn.Linear(config.embedding_size, config.hidden_size)
        self.encoder = BertEncoder(config)
        self.init_weights()

    def embed(
        self,
        batch: PaddedBatch | PackedBatch,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        embedded = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        project = self._modules.get("embeddings_project")
        return embedded if project is None else project(embedded)


class _ElectraFamily:
    """What every ELECTRA task model declares: its config class, its encoder and where its tensors live."""

    config_class: ClassVar[type[EncoderConfig]] = ElectraConfig
    backbone_class: ClassVar[type[EncoderModel]] = ElectraModel
    base_model_prefix: ClassVar[str] = "electra"


class ElectraDiscriminatorPredictions(nn.Module):
    """`discriminator_predictions`: dense -> `hidden_act` -> one logit per token (replaced or original)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.dense_prediction(self.activation(self.dense(hidden_states))).squeeze(-1)


class ElectraForPreTraining(_ElectraFamily, TaskModel):
    """The discriminator: a logit per token that it was replaced; with `labels` (1 replaced, 0 original), the binary
    cross-entropy over the tokens `attention_mask` keeps (every token without one)."""

    heads = (DISCRIMINATOR_HEAD,)

    def build_heads(self, config: ElectraConfig) -> None:
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> LogitsOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.discriminator_predictions(encoded.last_hidden_state)
        loss = None
        if labels is not None:
            if labels.shape != logits.shape:
                raise ValueError(
                    f"labels has shape {tuple(labels.shape)}; expected {tuple(logits.shape)}, one per token"
                )
            active = attention_mask == 1 if attention_mask is not None else slice(None)
            loss = F.binary_cross_entropy_with_logits(logits[active], labels[active].to(logits.dtype))
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class ElectraGeneratorPredictions(nn.Module):
    """`generator_predictions`: dense to `embedding_size` -> exact GELU (whatever `hidden_act` says) -> LayerNorm."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)  # transformers' order
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.LayerNorm(F.gelu(self.dense(hidden_states)))


class ElectraGeneratorLogits(nn.Module):
    """hidden states -> vocabulary logits (`generator_predictions`, then `generator_lm_head`): the `prediction_head`
    every member's masked LM gives. It owns no weights and is no submodule (the two modules sit at the model's top
    level, under transformers' names); each call reads the model's current modules, so a resized decoder is
    followed."""

    def __init__(self, model: ElectraForMaskedLM) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # a plain reference: registering it would make a module cycle

    @property
    def decoder(self) -> nn.Linear:
        return self._model.generator_lm_head

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self._model.generator_lm_head(self._model.generator_predictions(hidden_states))


class ElectraForMaskedLM(_ElectraFamily, BertForMaskedLM):
    """The generator: `generator_predictions` -> `generator_lm_head` over the vocabulary."""

    heads = (GENERATOR_HEAD, GENERATOR_DECODER)

    def build_heads(self, config: ElectraConfig) -> None:
        self.generator_predictions = ElectraGeneratorPredictions(config)
        self.generator_lm_head = nn.Linear(config.embedding_size, config.vocab_size)
        object.__setattr__(self, "_generator_logits", ElectraGeneratorLogits(self))  # one object: hooks on it stay

    @property
    def prediction_head(self) -> ElectraGeneratorLogits:
        return self._generator_logits

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        """As transformers: tied, the decoder's weight is the new embeddings and its bias grows with zeros; untied,
        its weight grows as the embeddings do and its bias with the old mean."""
        old = self.generator_lm_head
        tied = GENERATOR_DECODER + "weight" in self.tied_weights()
        decoder = nn.Linear(self.config.embedding_size, new_num_tokens).to(old.weight.device, old.weight.dtype)
        if not tied:
            std = self.config.initializer_range
            decoder.weight = nn.Parameter(resized_rows(old.weight, new_num_tokens, mean_resizing, std))
        decoder.bias = nn.Parameter(resized_rows(old.bias, new_num_tokens, mean_resizing and not tied, std=0.0))
        decoder._is_hf_initialized = True
        self.generator_lm_head = decoder


class ElectraClassificationHead(ClassificationHead):
    """RoBERTa's `classifier` (dense, out_proj on the first token) with exact GELU where RoBERTa has tanh, as
    ELECTRA's authors had it."""

    def forward(self, hidden_states: Tensor) -> Tensor:
        first = self.dropout(hidden_states[:, 0])
        return self.out_proj(self.dropout(F.gelu(self.dense(first))))


class ElectraForSequenceClassification(_ElectraFamily, ClassificationHeadForSequenceClassification):
    """`classifier` reads the first token through its own dense + exact GELU (the ms-marco ELECTRA cross-encoders)."""

    def build_heads(self, config: ElectraConfig) -> None:
        self.num_labels = config.num_labels
        self.classifier = ElectraClassificationHead(config, self.classifier_dropout())


class ElectraForTokenClassification(_ElectraFamily, BertForTokenClassification):
    """BERT's token classification."""


class ElectraForQuestionAnswering(_ElectraFamily, BertForQuestionAnswering):
    """BERT's question answering (`qa_outputs`)."""


class ElectraSequenceSummary(nn.Module):
    """`sequence_summary`: one vector per sequence by `summary_type` ("first" token, "last" column, "mean" over every
    column, pads included, or "cls_index": the last column, as no index is passed), then the optional projection
    (`summary`), activation and dropouts, as transformers' ElectraSequenceSummary."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.summary_type = config.summary_type
        use_proj = config.summary_use_proj
        self.summary = nn.Linear(config.hidden_size, config.hidden_size) if use_proj else nn.Identity()
        name = config.summary_activation
        self.activation = ACTIVATIONS[name] if name else nn.Identity()
        # summary_first_dropout is no ElectraConfig field; transformers reads it when config.json has one.
        first, last = getattr(config, "summary_first_dropout", 0.0), config.summary_last_dropout
        self.first_dropout = nn.Dropout(first) if first > 0 else nn.Identity()
        self.last_dropout = nn.Dropout(last) if last > 0 else nn.Identity()

    def forward(self, hidden_states: Tensor) -> Tensor:
        if self.summary_type == "first":
            output = hidden_states[:, 0]
        elif self.summary_type == "mean":
            output = hidden_states.mean(dim=1)
        else:
            output = hidden_states[:, -1]
        return self.last_dropout(self.activation(self.summary(self.first_dropout(output))))


class ElectraForMultipleChoice(_ElectraFamily, BertForMultipleChoice):
    """One score per choice: `sequence_summary`, then `classifier`. A summary that reads pad columns ("last",
    "mean", "cls_index") keeps the encoder padded, so pads hold what transformers computes there."""

    heads = (SEQUENCE_SUMMARY, CLASSIFIER_HEAD)
    pooling = False

    def build_heads(self, config: ElectraConfig) -> None:
        self.backbone.padding_free = config.summary_type == "first"
        self.sequence_summary = ElectraSequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)

    def choice_scores(self, encoded: Any) -> Tensor:
        return self.classifier(self.sequence_summary(encoded.last_hidden_state))


__all__ = [
    "ElectraConfig",
    "ElectraForMaskedLM",
    "ElectraForMultipleChoice",
    "ElectraForPreTraining",
    "ElectraForQuestionAnswering",
    "ElectraForSequenceClassification",
    "ElectraForTokenClassification",
    "ElectraModel",
]
