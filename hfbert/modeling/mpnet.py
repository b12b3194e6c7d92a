"""MPNet (all-mpnet-base-v2): BERT's encoder with other names, no token types and a relative-position bias, and its
task heads.

What MPNet changes, part by part (docs/architecture.md has the table):

- embeddings: words + positions, no token types; positions count from 2 over non-pad tokens and are 1 at pads
  (RoBERTa's scheme with the padding index fixed at 1, `MPNetConfig.position_padding_idx`);
- attention: `attention.attn.q / k / v` project, `attention.attn.o` projects back (inside `attn`), then
  `attention.LayerNorm` on the residual sum (BERT's `attention.self.*` / `attention.output.*`);
- scores: one learned bias per head and relative distance, `encoder.relative_attention_bias`, shared by every layer
  and added to the scaled scores (`relative_position.py`). It depends on column distances only, so the padding-free
  layout gives each bucket the top-left corner of the batch's bias;
- forward: BERT's arguments less `token_type_ids`, written out as transformers' MPNet has them; every class runs
  BERT's body by keyword (all-zero token_type_ids are accepted by keyword, and refused otherwise);
- heads: RoBERTa's names (`lm_head`, `classifier.dense / out_proj`, `qa_outputs`) under `mpnet.`, every dropout
  `hidden_dropout_prob` (MPNet has no classifier_dropout).

    >>> import torch, hfbert
    >>> model = hfbert.MPNetModel(hfbert.MPNetConfig(num_hidden_layers=1))
    >>> model(input_ids=torch.tensor([[0, 7592, 2]])).last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from converters.key_map import MPNET_KEYS, KeyLayout
from hfbert.modeling.config import MAX_SIZE, BertConfig, EncoderConfig, is_integer
from hfbert.modeling.heads import BertForQuestionAnswering, BertForTokenClassification
from hfbert.modeling.inputs import check_no_token_types
from hfbert.modeling.model import BertEncoder, BertLayer, BertModel
from hfbert.modeling.outputs import BertModelOutput, LogitsOutput, QuestionAnsweringOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch
from hfbert.modeling.positions import PositionsAfterPadding, PositionScheme
from hfbert.modeling.relative_position import relative_position_bias
from hfbert.modeling.shared_heads import (
    ClassificationHeadForSequenceClassification,
    HiddenDropoutForMultipleChoice,
    LMHeadForMaskedLM,
)


@dataclass
class MPNetConfig(EncoderConfig):
    """config.json of an MPNet checkpoint (all-mpnet-base-v2), with transformers' MPNetConfig fields and defaults.

    BERT's shape and dropouts without token types, and one field of its own, `relative_attention_num_buckets`: the
    rows of the relative-position bias table. Its positions count from 2 with the padding index fixed at 1, whatever
    `pad_token_id` says, as transformers' MPNetEmbeddings has it."""

    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    relative_attention_num_buckets: int = 32
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    model_type: str = "mpnet"

    positions: ClassVar[PositionScheme] = PositionsAfterPadding()
    key_layout: ClassVar[KeyLayout] = MPNET_KEYS
    positive_integers: ClassVar[tuple[str, ...]] = BertConfig.positive_integers[:-1]  # no type_vocab_size
    probabilities: ClassVar[tuple[str, ...]] = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    positive_numbers: ClassVar[tuple[str, ...]] = BertConfig.positive_numbers
    activations: ClassVar[tuple[str, ...]] = BertConfig.activations
    inspect_fields: ClassVar[tuple[str, ...]] = ("relative_attention_num_buckets",)

    @property
    def position_padding_idx(self) -> int:
        return 1

    def validate(self) -> None:
        super().validate()
        buckets = self.relative_attention_num_buckets
        # The bucketing (relative_position.py) uses 32 buckets whatever the config says, as transformers' does.
        if not is_integer(buckets) or not 32 <= buckets <= MAX_SIZE:
            raise self._fail(
                "relative_attention_num_buckets",
                f"must be an integer >= 32 (the relative positions use 32 buckets), got {buckets!r}",
            )


class MPNetEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        padding = config.position_padding_idx
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=padding)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size, padding)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,  # always None: MPNet has no token types
        position_ids: Tensor,  # from `EncoderModel.run` (positions after padding)
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        return self.dropout(self.LayerNorm(inputs_embeds + self.position_embeddings(position_ids)))


class MPNetSelfAttention(nn.Module):
    """`attn`: q, k, v projections, attention with the batch's position bias, and the `o` projection back."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        config.check_heads()
        self.num_heads = config.num_attention_heads
        self.scale = config.head_size**-0.5
        self.dropout_probability = config.attention_probs_dropout_prob
        self.q = nn.Linear(config.hidden_size, config.hidden_size)
        self.k = nn.Linear(config.hidden_size, config.hidden_size)
        self.v = nn.Linear(config.hidden_size, config.hidden_size)
        self.o = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        context, probabilities = batch.attend(
            self.q(hidden_states),
            self.k(hidden_states),
            self.v(hidden_states),
            num_heads=self.num_heads,
            scale=self.scale,
            dropout=self.dropout_probability if self.training else 0.0,
        )
        return self.o(context), probabilities


class MPNetAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attn = MPNetSelfAttention(config)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        projected, probabilities = self.attn(hidden_states, batch)
        return self.LayerNorm(self.dropout(projected) + hidden_states), probabilities


class MPNetLayer(BertLayer):
    """BERT's layer (`intermediate`, `output` as BERT's) around MPNet's attention."""

    attention_class = MPNetAttention


class MPNetEncoder(BertEncoder):
    """BERT's stack of layers, and the relative-position bias table they share (`relative_attention_bias`)."""

    layer_class = MPNetLayer

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_attention_heads)


class MPNetModel(BertModel):
    """The MPNet encoder; a drop-in for `transformers.MPNetModel` (same state dict keys, forward arguments and outputs).
    Unlike transformers' (eager only), it runs sdpa with the bias as an additive mask, and padding-free in eval."""

    config_class: ClassVar[type[BertConfig]] = MPNetConfig
    base_model_prefix: ClassVar[str] = "mpnet"
    embeddings_class = MPNetEmbeddings
    encoder_class = MPNetEncoder

    def attention_context(self, batch: PaddedBatch | PackedBatch, hidden_states: Tensor) -> PaddedBatch | PackedBatch:
        """The relative-position bias over the batch's columns, once per call (transformers' MPNet ignores
        position_ids here too)."""
        length = batch.shape[1] if isinstance(batch, PackedBatch) else hidden_states.shape[1]
        return batch.with_attention_bias(relative_position_bias(self.encoder.relative_attention_bias, length))

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """The encoder (`EncoderModel.run`) with transformers' MPNet arguments (no token types)."""
        check_no_token_types(kwargs)
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


class _MPNetFamily:
    """What every MPNet task model declares: its config class, its encoder, where its tensors live, and MPNet's
    dropout before every head (`hidden_dropout_prob`)."""

    config_class: ClassVar[type[BertConfig]] = MPNetConfig
    backbone_class: ClassVar[type[BertModel]] = MPNetModel
    base_model_prefix: ClassVar[str] = "mpnet"

    def classifier_dropout(self) -> nn.Dropout:
        return nn.Dropout(self.config.hidden_dropout_prob)


class MPNetForMaskedLM(_MPNetFamily, LMHeadForMaskedLM):
    """`lm_head` as RoBERTa's: dense -> exact GELU -> layer_norm -> decoder (tied to the word embeddings)."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        check_no_token_types(kwargs)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )


class MPNetForSequenceClassification(_MPNetFamily, ClassificationHeadForSequenceClassification):
    """`classifier` as RoBERTa's (`<s>` -> dense -> tanh -> out_proj), dropping out with `hidden_dropout_prob`."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        check_no_token_types(kwargs)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )


class MPNetForTokenClassification(_MPNetFamily, BertForTokenClassification):
    """BERT's token classification, dropping out with `hidden_dropout_prob`."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        check_no_token_types(kwargs)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )


class MPNetForQuestionAnswering(_MPNetFamily, BertForQuestionAnswering):
    """BERT's question answering (`qa_outputs`)."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringOutput | tuple:
        check_no_token_types(kwargs)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            start_positions=start_positions,
            end_positions=end_positions,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )


class MPNetForMultipleChoice(_MPNetFamily, HiddenDropoutForMultipleChoice):
    """BERT's multiple choice (the pooler, dropout, one logit per choice)."""

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> LogitsOutput | tuple:
        check_no_token_types(kwargs)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
        )
