"""Task heads on top of `BertModel`, with transformers' module names so checkpoints load both ways.

The encoder is `bert.`; the pre-training heads are `cls.predictions` (masked LM; with `tie_word_embeddings` its
decoder is tied to the word embeddings and its bias to `cls.predictions.bias`) and `cls.seq_relationship` (next
sentence); fine-tuning heads are `classifier` and `qa_outputs`. Losses follow transformers exactly (including how
BertForSequenceClassification picks regression / single-label / multi-label).

    >>> import torch, hfbert
    >>> model = hfbert.BertForSequenceClassification(hfbert.BertConfig(num_hidden_layers=1, num_labels=3))
    >>> model(input_ids=torch.tensor([[101, 102]]), labels=torch.tensor([2])).logits.shape
    torch.Size([1, 3])
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import CLASSIFIER_HEAD, MLM_HEAD, NSP_HEAD, QA_HEAD
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import BertConfig
from hfbert.modeling.inputs import class_labels
from hfbert.modeling.model import BertModel
from hfbert.modeling.outputs import LogitsOutput, PreTrainingOutput, QuestionAnsweringOutput
from hfbert.modeling.pretrained import resized_rows
from hfbert.modeling.task import (
    MaskedLanguageModel,
    TaskModel,
    answer_spans,
    flat_choices,
    sequence_classification_loss,
    token_classification_loss,
)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.LayerNorm(self.activation(self.dense(hidden_states)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # With tie_word_embeddings, decoder.weight is the word embeddings and decoder.bias is `bias`; without, both
        # are the decoder's own and forward reads decoder.bias, as in transformers 5 (see tied_weights).
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden_states))


class BertPreTrainingHeads(nn.Module):
    """`cls`: the masked-LM head, and the next-sentence head when the model has one."""

    def __init__(self, config: BertConfig, next_sentence: bool, masked_lm: bool = True) -> None:
        super().__init__()
        if masked_lm:
            self.predictions = BertLMPredictionHead(config)
        if next_sentence:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


class _BertWithHead(TaskModel):
    """BERT's task models: `BertModel` at `bert.` (RoBERTa's and MPNet's at their prefix), and BERT's dropout rule
    before a classifier."""

    backbone_class: ClassVar[type[BertModel]] = BertModel

    def classifier_dropout(self) -> nn.Dropout:
        probability = self.config.classifier_dropout
        return nn.Dropout(self.config.hidden_dropout_prob if probability is None else probability)


class _MaskedLanguageModel(_BertWithHead, MaskedLanguageModel):
    """BERT's masked LMs (RoBERTa's and MPNet's too): a head whose `decoder` bias is also kept as its `bias`."""

    @property
    def prediction_head(self) -> nn.Module:
        return self.cls.predictions

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        predictions = self.prediction_head
        tied = self.tied_weights()
        weight_tied = any(name.endswith(".decoder.weight") for name in tied)
        bias_tied = any(name.endswith(".decoder.bias") for name in tied)
        old_bias, old_decoder = predictions.bias, predictions.decoder
        # transformers (5.24) grows the bias with zeros while the decoder is tied, with the old mean once untied.
        grow_with_mean = mean_resizing and not weight_tied
        if bias_tied:  # the decoder's bias follows when tie_weights runs
            predictions.bias = nn.Parameter(resized_rows(old_bias, new_num_tokens, grow_with_mean, std=0.0))
        if not weight_tied:
            decoder = nn.Linear(self.config.hidden_size, new_num_tokens).to(old_bias.device, old_bias.dtype)
            std = self.config.initializer_range
            decoder.weight = nn.Parameter(resized_rows(old_decoder.weight, new_num_tokens, mean_resizing, std))
            decoder._is_hf_initialized = True
            predictions.decoder = decoder
        if not bias_tied:
            bias = resized_rows(old_decoder.bias, new_num_tokens, grow_with_mean, std=0.0)
            predictions.decoder.bias = nn.Parameter(bias)
            # transformers' BERT and MPNet then take the decoder's bias as `bias` too (its RoBERTa keeps the old one,
            # whose size no longer fits the vocabulary): a copy, so that the two save as two tensors.
            predictions.bias = nn.Parameter(bias.clone())
        predictions.decoder.out_features = new_num_tokens


class BertForPreTraining(_MaskedLanguageModel):
    heads = (MLM_HEAD, NSP_HEAD)

    pooling = True

    def build_heads(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, next_sentence=True)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        next_sentence_label: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> PreTrainingOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        prediction_logits = self.cls.predictions(encoded.last_hidden_state)
        seq_relationship_logits = self.cls.seq_relationship(encoded.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            rows = prediction_logits.shape[:-1].numel()
            labels = class_labels("labels", labels, self.config.vocab_size, rows)
            next_sentence_label = class_labels(
                "next_sentence_label", next_sentence_label, 2, len(seq_relationship_logits)
            )
            loss = F.cross_entropy(prediction_logits.view(-1, self.config.vocab_size), labels)
            loss = loss + F.cross_entropy(seq_relationship_logits.view(-1, 2), next_sentence_label)
        output = PreTrainingOutput(
            loss, prediction_logits, seq_relationship_logits, encoded.hidden_states, encoded.attentions
        )
        return self.finish(output, return_dict)


class BertForMaskedLM(_MaskedLanguageModel):
    heads = (MLM_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, next_sentence=False)

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
        logits = self.prediction_head(encoded.last_hidden_state)
        loss = None
        if labels is not None:  # label -100 marks positions without a target
            labels = class_labels("labels", labels, self.config.vocab_size, logits.shape[:-1].numel())
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size), labels)
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class BertForNextSentencePrediction(_BertWithHead):
    heads = (NSP_HEAD,)

    pooling = True

    def build_heads(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, next_sentence=True, masked_lm=False)

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
        logits = self.cls.seq_relationship(encoded.pooler_output)
        loss = F.cross_entropy(logits, class_labels("labels", labels, 2, len(logits))) if labels is not None else None
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class BertForSequenceClassification(_BertWithHead):
    heads = (CLASSIFIER_HEAD,)

    pooling = True

    def build_heads(self, config: BertConfig) -> None:
        self.num_labels = config.num_labels
        self.dropout = self.classifier_dropout()
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def classify(self, encoded: Any) -> Tensor:
        """The encoder's output -> (batch, num_labels) logits: BERT's classifier reads the pooler."""
        return self.classifier(self.dropout(encoded.pooler_output))

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
        logits = self.classify(encoded)
        loss = self.loss(logits, labels) if labels is not None else None
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return sequence_classification_loss(self.config, self.num_labels, logits, labels)


class BertForTokenClassification(_BertWithHead):
    heads = (CLASSIFIER_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        self.num_labels = config.num_labels
        self.dropout = self.classifier_dropout()
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

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
        logits = self.classifier(self.dropout(encoded.last_hidden_state))
        loss = token_classification_loss(logits, labels, self.num_labels) if labels is not None else None
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class BertForQuestionAnswering(_BertWithHead):
    heads = (QA_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        # Start / end logits at pad positions take part in the loss (as in transformers), so the encoder keeps
        # computing pad positions instead of running padding-free.
        self.backbone.padding_free = False
        self.num_labels = config.num_labels
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> QuestionAnsweringOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.qa_outputs(encoded.last_hidden_state)
        output = answer_spans(logits, start_positions, end_positions, encoded.hidden_states, encoded.attentions)
        return self.finish(output, return_dict)


class BertForMultipleChoice(_BertWithHead):
    heads = (CLASSIFIER_HEAD,)

    pooling = True

    def build_heads(self, config: BertConfig) -> None:
        self.dropout = self.classifier_dropout()
        self.classifier = nn.Linear(config.hidden_size, 1)

    def choice_scores(self, encoded: Any) -> Tensor:
        """One score per encoded choice (a row of `encoded`): BERT's pooled output -> dropout -> `classifier`."""
        return self.classifier(self.dropout(encoded.pooler_output))

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
        # (batch, choices, sequence) -> (batch * choices, sequence): every choice is encoded as its own row.
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        encoded = self.encode(
            input_ids=flat_choices(input_ids),
            attention_mask=flat_choices(attention_mask),
            token_type_ids=flat_choices(token_type_ids),
            position_ids=flat_choices(position_ids),
            inputs_embeds=flat_choices(inputs_embeds, trailing=2),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.choice_scores(encoded).view(-1, num_choices)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, class_labels("labels", labels, num_choices, len(logits)))
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)
