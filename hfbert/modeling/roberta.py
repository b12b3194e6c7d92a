"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with a few named differences, and their task heads.

The encoder is `BertModel` itself; what the family changes is listed here and in docs/architecture.md:

- positions come from the input ids (`BertConfig.positions_after_padding`, `model.positions_after_padding`):
  `pad_token_id + 1` onwards for real tokens, `pad_token_id` at pads, so the longest input is
  `max_position_embeddings - pad_token_id - 1` (`BertConfig.max_sequence_length`);
- one token type (`type_vocab_size: 1` in their config.json), the pad id and LayerNorm epsilon from the config;
- tensor names: the encoder at `roberta.` in task models, the heads `lm_head.` (dense, layer_norm, decoder, bias)
  and `classifier.` (`dense`, `out_proj` for sequence classification) (`converters.key_map.ROBERTA_KEYS`);
- the masked-LM head always uses exact GELU; sequence classification reads `<s>` through its own dense + tanh
  (no pooler); multiple choice drops out with `hidden_dropout_prob`.

XLM-RoBERTa and CamemBERT checkpoints are RoBERTa's key for key; their classes differ in the config class only.

    >>> import torch, hfbert
    >>> model = hfbert.RobertaModel(hfbert.RobertaConfig(num_hidden_layers=1, max_position_embeddings=514))
    >>> model(input_ids=torch.tensor([[0, 31414, 2]])).last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import CLASSIFIER_HEAD, LM_HEAD, QA_HEAD, ROBERTA_KEYS, KeyLayout
from hfbert.modeling.config import BertConfig, CamembertConfig, RobertaConfig, XLMRobertaConfig
from hfbert.modeling.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    _BertWithHead,
)
from hfbert.modeling.model import BertEmbeddings, BertModel


class RobertaEmbeddings(BertEmbeddings):
    """BERT's embeddings, registered in the order of transformers' RobertaEmbeddings: `position_embeddings` last.

    Parameter order is what an optimizer's state is matched by (it stores moments by index), so an optimizer state
    saved from transformers' RoBERTa would otherwise give one tensor's moments to another, or fail on their shapes.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self._modules["position_embeddings"] = self._modules.pop("position_embeddings")


class RobertaModel(BertModel):
    """The RoBERTa encoder: `BertModel` on a RoBERTa config; a drop-in for `transformers.RobertaModel`."""

    config_class: ClassVar[type[BertConfig]] = RobertaConfig
    base_model_prefix: ClassVar[str] = "roberta"
    key_layout: ClassVar[KeyLayout] = ROBERTA_KEYS
    embeddings_class = RobertaEmbeddings


class _RobertaFamily:
    """What every RoBERTa task model declares: its config class, its encoder and where its tensors live."""

    config_class: ClassVar[type[BertConfig]] = RobertaConfig
    backbone_class: ClassVar[type[BertModel]] = RobertaModel
    base_prefix: ClassVar[str] = "roberta."
    base_model_prefix: ClassVar[str] = "roberta"
    key_layout: ClassVar[KeyLayout] = ROBERTA_KEYS


class RobertaLMHead(nn.Module):
    """`lm_head`: dense -> exact GELU (whatever `hidden_act` says, as in transformers) -> layer_norm -> decoder; with
    `tie_word_embeddings` the decoder is tied to the word embeddings and its bias to `lm_head.bias`."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.decoder(self.layer_norm(F.gelu(self.dense(hidden_states))))


class RobertaClassificationHead(nn.Module):
    """`classifier`: the `<s>` token's hidden state -> dropout -> dense -> tanh -> dropout -> out_proj."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        probability = config.classifier_dropout
        self.dropout = nn.Dropout(config.hidden_dropout_prob if probability is None else probability)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: Tensor) -> Tensor:
        first = self.dropout(hidden_states[:, 0])
        return self.out_proj(self.dropout(torch.tanh(self.dense(first))))


class RobertaForMaskedLM(_RobertaFamily, BertForMaskedLM):
    heads = (LM_HEAD,)

    def __init__(self, config: BertConfig, attn_implementation: str | None = None) -> None:
        _BertWithHead.__init__(self, config, add_pooling_layer=False, attn_implementation=attn_implementation)
        self.lm_head = RobertaLMHead(self.config)
        self.init_weights()

    @property
    def prediction_head(self) -> nn.Module:
        return self.lm_head


class RobertaForSequenceClassification(_RobertaFamily, BertForSequenceClassification):
    heads = (CLASSIFIER_HEAD,)

    def __init__(self, config: BertConfig, attn_implementation: str | None = None) -> None:
        _BertWithHead.__init__(self, config, add_pooling_layer=False, attn_implementation=attn_implementation)
        self.num_labels = self.config.num_labels
        self.classifier = RobertaClassificationHead(self.config)
        self.init_weights()

    def classify(self, encoded: Any) -> Tensor:
        return self.classifier(encoded.last_hidden_state)


class RobertaForTokenClassification(_RobertaFamily, BertForTokenClassification):
    heads = (CLASSIFIER_HEAD,)


class RobertaForQuestionAnswering(_RobertaFamily, BertForQuestionAnswering):
    heads = (QA_HEAD,)


class RobertaForMultipleChoice(_RobertaFamily, BertForMultipleChoice):
    heads = (CLASSIFIER_HEAD,)

    def __init__(self, config: BertConfig, attn_implementation: str | None = None) -> None:
        super().__init__(config, attn_implementation)
        self.dropout = nn.Dropout(self.config.hidden_dropout_prob)  # not classifier_dropout, as in transformers


def _member(roberta_class: type, config_class: type[BertConfig], encoder: type[BertModel] | None = None) -> type:
    """`roberta_class` for another family member: the same model, with that member's config (and encoder) class.
    Task models of XLM-RoBERTa and CamemBERT register their head before the encoder, as transformers' do."""
    family = config_class.__name__.removesuffix("Config")
    attributes = {"config_class": config_class, "__doc__": f"`{roberta_class.__name__}` for {family} checkpoints."}
    if encoder is not None:
        attributes["backbone_class"] = encoder
        attributes["encoder_after_heads"] = True
    return type(roberta_class.__name__.replace("Roberta", family), (roberta_class,), attributes)


XLMRobertaModel = _member(RobertaModel, XLMRobertaConfig)
XLMRobertaForMaskedLM = _member(RobertaForMaskedLM, XLMRobertaConfig, XLMRobertaModel)
XLMRobertaForSequenceClassification = _member(RobertaForSequenceClassification, XLMRobertaConfig, XLMRobertaModel)
XLMRobertaForTokenClassification = _member(RobertaForTokenClassification, XLMRobertaConfig, XLMRobertaModel)
XLMRobertaForQuestionAnswering = _member(RobertaForQuestionAnswering, XLMRobertaConfig, XLMRobertaModel)
XLMRobertaForMultipleChoice = _member(RobertaForMultipleChoice, XLMRobertaConfig, XLMRobertaModel)
CamembertModel = _member(RobertaModel, CamembertConfig)
CamembertForMaskedLM = _member(RobertaForMaskedLM, CamembertConfig, CamembertModel)
CamembertForSequenceClassification = _member(RobertaForSequenceClassification, CamembertConfig, CamembertModel)
CamembertForTokenClassification = _member(RobertaForTokenClassification, CamembertConfig, CamembertModel)
CamembertForQuestionAnswering = _member(RobertaForQuestionAnswering, CamembertConfig, CamembertModel)
CamembertForMultipleChoice = _member(RobertaForMultipleChoice, CamembertConfig, CamembertModel)
