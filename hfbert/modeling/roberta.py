"""RoBERTa, XLM-RoBERTa and CamemBERT: BERT's encoder with a few named differences, and their task heads.

The encoder is `BertModel` itself; what the family changes is listed here and in docs/architecture.md:

- positions come from the input ids (`RobertaConfig.positions`, `positions.PositionsAfterPadding`):
  `pad_token_id + 1` onwards for real tokens, `pad_token_id` at pads, so the longest input is
  `max_position_embeddings - pad_token_id - 1` (`BertConfig.max_sequence_length`);
- one token type (`type_vocab_size: 1` in their config.json), the pad id and LayerNorm epsilon from the config;
- tensor names: the encoder at `roberta.` in task models, the heads `lm_head.` (dense, layer_norm, decoder, bias)
  and `classifier.` (`dense`, `out_proj` for sequence classification) (`converters.key_map.ROBERTA_KEYS`);
- the masked-LM head always uses exact GELU; sequence classification reads `<s>` through its own dense + tanh
  (no pooler); multiple choice drops out with `hidden_dropout_prob`.

XLM-RoBERTa and CamemBERT checkpoints are RoBERTa's key for key; their classes differ in the config class only (and
their task models register the encoder after the heads, as transformers' do).

    >>> import torch, hfbert
    >>> model = hfbert.RobertaModel(hfbert.RobertaConfig(num_hidden_layers=1, max_position_embeddings=514))
    >>> model(input_ids=torch.tensor([[0, 31414, 2]])).last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import CLASSIFIER_HEAD, LM_HEAD, QA_HEAD, ROBERTA_KEYS, KeyLayout
from hfbert.modeling.config import BertConfig
from hfbert.modeling.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from hfbert.modeling.model import BertEmbeddings, BertModel
from hfbert.modeling.outputs import LogitsOutput
from hfbert.modeling.positions import PositionsAfterPadding, PositionScheme


@dataclass
class RobertaConfig(BertConfig):
    """config.json of a RoBERTa checkpoint: BertConfig's fields, with transformers' RobertaConfig defaults."""

    vocab_size: int = 50265
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    model_type: str = "roberta"

    positions: ClassVar[PositionScheme] = PositionsAfterPadding()
    key_layout: ClassVar[KeyLayout] = ROBERTA_KEYS


@dataclass
class XLMRobertaConfig(RobertaConfig):
    """config.json of an XLM-RoBERTa checkpoint, with transformers' XLMRobertaConfig defaults."""

    vocab_size: int = 30522
    model_type: str = "xlm-roberta"


@dataclass
class CamembertConfig(RobertaConfig):
    """config.json of a CamemBERT checkpoint, with transformers' CamembertConfig defaults."""

    vocab_size: int = 30522
    model_type: str = "camembert"


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
    embeddings_class = RobertaEmbeddings


class _RobertaFamily:
    """What every RoBERTa task model declares: its config class, its encoder and where its tensors live."""

    config_class: ClassVar[type[BertConfig]] = RobertaConfig
    backbone_class: ClassVar[type[BertModel]] = RobertaModel
    base_prefix: ClassVar[str] = "roberta."
    base_model_prefix: ClassVar[str] = "roberta"


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

    def build_heads(self, config: BertConfig) -> None:
        self.lm_head = RobertaLMHead(config)

    @property
    def prediction_head(self) -> nn.Module:
        return self.lm_head


class RobertaForSequenceClassification(_RobertaFamily, BertForSequenceClassification):
    """`classifier` reads `<s>` through its own dense + tanh; the encoder has no pooler."""

    heads = (CLASSIFIER_HEAD,)
    pooling = False

    def build_heads(self, config: BertConfig) -> None:
        self.num_labels = config.num_labels
        self.classifier = RobertaClassificationHead(config)
        self.classifier.dropout = self.classifier_dropout()  # the family's rule (MPNet's: hidden_dropout_prob)

    def classify(self, encoded: Any) -> Tensor:
        return self.classifier(encoded.last_hidden_state)


class RobertaForTokenClassification(_RobertaFamily, BertForTokenClassification):
    heads = (CLASSIFIER_HEAD,)


class RobertaForQuestionAnswering(_RobertaFamily, BertForQuestionAnswering):
    heads = (QA_HEAD,)


class RobertaForMultipleChoice(_RobertaFamily, BertForMultipleChoice):
    heads = (CLASSIFIER_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        self.dropout = nn.Dropout(config.hidden_dropout_prob)  # not classifier_dropout, as in transformers
        self.classifier = nn.Linear(config.hidden_size, 1)

    def forward(
        self,
        input_ids: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> LogitsOutput | tuple:
        # transformers' RoBERTa multiple-choice forward takes its arguments in this order, not BERT's: a positional
        # call must bind them as it does there.
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )


# XLM-RoBERTa and CamemBERT: RoBERTa's classes with their own config class. Their task models register the encoder
# after the heads, as transformers' do (parameter order is what an optimizer state is matched by).


class XLMRobertaModel(RobertaModel):
    """`RobertaModel` for XLM-RoBERTa checkpoints; a drop-in for `transformers.XLMRobertaModel`."""

    config_class = XLMRobertaConfig


class _XLMRobertaFamily:
    config_class: ClassVar[type[BertConfig]] = XLMRobertaConfig
    backbone_class: ClassVar[type[BertModel]] = XLMRobertaModel
    encoder_after_heads: ClassVar[bool] = True


class XLMRobertaForMaskedLM(_XLMRobertaFamily, RobertaForMaskedLM):
    """`RobertaForMaskedLM` for XLM-RoBERTa checkpoints."""


class XLMRobertaForSequenceClassification(_XLMRobertaFamily, RobertaForSequenceClassification):
    """`RobertaForSequenceClassification` for XLM-RoBERTa checkpoints."""


class XLMRobertaForTokenClassification(_XLMRobertaFamily, RobertaForTokenClassification):
    """`RobertaForTokenClassification` for XLM-RoBERTa checkpoints."""


class XLMRobertaForQuestionAnswering(_XLMRobertaFamily, RobertaForQuestionAnswering):
    """`RobertaForQuestionAnswering` for XLM-RoBERTa checkpoints."""


class XLMRobertaForMultipleChoice(_XLMRobertaFamily, RobertaForMultipleChoice):
    """`RobertaForMultipleChoice` for XLM-RoBERTa checkpoints."""


class CamembertModel(RobertaModel):
    """`RobertaModel` for CamemBERT checkpoints; a drop-in for `transformers.CamembertModel`."""

    config_class = CamembertConfig


class _CamembertFamily:
    config_class: ClassVar[type[BertConfig]] = CamembertConfig
    backbone_class: ClassVar[type[BertModel]] = CamembertModel
    encoder_after_heads: ClassVar[bool] = True


class CamembertForMaskedLM(_CamembertFamily, RobertaForMaskedLM):
    """`RobertaForMaskedLM` for CamemBERT checkpoints."""


class CamembertForSequenceClassification(_CamembertFamily, RobertaForSequenceClassification):
    """`RobertaForSequenceClassification` for CamemBERT checkpoints."""


class CamembertForTokenClassification(_CamembertFamily, RobertaForTokenClassification):
    """`RobertaForTokenClassification` for CamemBERT checkpoints."""


class CamembertForQuestionAnswering(_CamembertFamily, RobertaForQuestionAnswering):
    """`RobertaForQuestionAnswering` for CamemBERT checkpoints."""


class CamembertForMultipleChoice(_CamembertFamily, RobertaForMultipleChoice):
    """`RobertaForMultipleChoice` for CamemBERT checkpoints."""
