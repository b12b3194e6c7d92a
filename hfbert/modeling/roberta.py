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
from typing import ClassVar

from torch import Tensor

from converters.key_map import CLASSIFIER_HEAD, QA_HEAD, ROBERTA_KEYS, KeyLayout
from hfbert.modeling.config import BertConfig
from hfbert.modeling.heads import BertForQuestionAnswering, BertForTokenClassification
from hfbert.modeling.model import BertEmbeddings, BertModel
from hfbert.modeling.outputs import LogitsOutput
from hfbert.modeling.positions import PositionsAfterPadding, PositionScheme
from hfbert.modeling.shared_heads import (
    ClassificationHeadForSequenceClassification,
    HiddenDropoutForMultipleChoice,
    LMHeadForMaskedLM,
)


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
    base_model_prefix: ClassVar[str] = "roberta"


class RobertaForMaskedLM(_RobertaFamily, LMHeadForMaskedLM):
    """`lm_head`: dense -> exact GELU -> layer_norm -> decoder (tied to the word embeddings)."""


class RobertaForSequenceClassification(_RobertaFamily, ClassificationHeadForSequenceClassification):
    """`classifier` reads `<s>` through its own dense + tanh; the encoder has no pooler."""


class RobertaForTokenClassification(_RobertaFamily, BertForTokenClassification):
    heads = (CLASSIFIER_HEAD,)


class RobertaForQuestionAnswering(_RobertaFamily, BertForQuestionAnswering):
    heads = (QA_HEAD,)


class RobertaForMultipleChoice(_RobertaFamily, HiddenDropoutForMultipleChoice):
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
