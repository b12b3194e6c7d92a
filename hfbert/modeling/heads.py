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

from converters.key_map import CLASSIFIER_HEAD, MLM_HEAD, NSP_HEAD, QA_HEAD, head_of
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import BertConfig
from hfbert.modeling.inputs import class_labels
from hfbert.modeling.model import BertModel
from hfbert.modeling.outputs import LogitsOutput, PreTrainingOutput, QuestionAnsweringOutput
from hfbert.modeling.pretrained import BertPreTrainedModel, resized_rows


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


class _BertWithHead(BertPreTrainedModel):
    """Shared by the task models: the encoder call and the transformers-style return."""

    # The encoder's class; it is kept at `base_model_prefix` (`self.bert`, RoBERTa's `self.roberta`).
    backbone_class: type[BertModel] = BertModel
    # Whether the encoder comes after the heads in the module tree, as transformers registers it in XLM-RoBERTa's
    # and CamemBERT's task models: parameter order is what an optimizer state is matched by.
    encoder_after_heads: ClassVar[bool] = False

    # Whether the encoder keeps its pooler (the heads that read it: BERT's next sentence, sequence classification
    # and multiple choice).
    pooling: ClassVar[bool] = False

    def __init__(self, config: BertConfig, attn_implementation: str | None = None) -> None:
        """The encoder at `base_model_prefix`, then the task's heads (`build_heads`), then transformers' init."""
        super().__init__(config)
        encoder = self.backbone_class(self.config, self.pooling, attn_implementation=attn_implementation)
        self.add_module(self.base_model_prefix, encoder)
        self.build_heads(self.config)
        self.init_weights()

    def build_heads(self, config: BertConfig) -> None:
        """Add the task's head modules, under transformers' names (a family member overrides this, not __init__)."""

    def init_weights(self) -> None:
        if self.encoder_after_heads:
            self._modules[self.base_model_prefix] = self._modules.pop(self.base_model_prefix)
        super().init_weights()

    def encode(self, **inputs: Any) -> Any:
        """The encoder on forward's arguments, by keyword (a member without token types takes them only as all-zero
        keywords, `mpnet.py`)."""
        return self.backbone(**inputs, return_dict=True)

    def finish(self, output: Any, return_dict: bool | None) -> Any:
        # As transformers' task models (`can_return_tuple`): by truthiness, the config's when none is given.
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()

    def classifier_dropout(self) -> nn.Dropout:
        probability = self.config.classifier_dropout
        return nn.Dropout(self.config.hidden_dropout_prob if probability is None else probability)


class _MaskedLanguageModel(_BertWithHead):
    @property
    def prediction_head(self) -> nn.Module:
        """The masked-LM head: hidden states -> vocabulary logits, with its `decoder` Linear (the output embeddings).
        Every member's masked LM gives this module under this name (RoBERTa's `lm_head`, ModernBERT's `head` then
        `decoder`): what runs a masked LM's head on hidden states of its own (SPLADE pooling) calls it."""
        return self.cls.predictions

    def tied_weights(self) -> dict[str, str]:
        """As transformers 5: with `tie_word_embeddings` the decoder's weight is the word embeddings and its bias the
        head's `bias`; without, neither is tied (forward reads the decoder's own bias). A tie whose two tensors the
        loaded checkpoint stores with different values is not made (`from_pretrained` warns), as in transformers."""
        if not self.config.tie_word_embeddings:
            return {}
        tied = {}
        for name, source in self.key_layout.tied_decoder.items():
            if name in self._untied_weights:
                continue
            tied[name] = source if head_of(source, self.key_layout) is not None else self.base_prefix + source
        return tied

    def get_output_embeddings(self) -> nn.Linear:
        return self.prediction_head.decoder

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

    @torch.no_grad()
    def fill_mask(self, text: str, tokenizer: Any, top_k: int = 5) -> list[dict[str, Any]]:
        """Top-k tokens for the single [MASK] in `text`, like transformers' fill-mask pipeline.

        >>> model.fill_mask("Paris is the [MASK] of France.", tokenizer)[0]["token_str"]  # doctest: +SKIP
        'capital'
        """
        if not 1 <= top_k <= self.config.vocab_size:
            raise ValueError(f"top_k must be in [1, {self.config.vocab_size}] (the vocabulary size), got {top_k}")
        # One token more than the model takes tells "too long" without tokenising all of a 5 MB text.
        limit = self.config.max_sequence_length
        encoding = tokenizer(text, truncation=True, max_length=limit + 1, return_tensors="pt")
        if encoding["input_ids"].shape[1] > limit:
            raise ValueError(f"the text is longer than the model's {limit} tokens (max_position_embeddings)")
        input_ids = encoding["input_ids"].to(self.device)
        positions = (input_ids[0] == tokenizer.mask_token_id).nonzero().flatten()
        if len(positions) != 1:
            raise ValueError(
                f"fill_mask needs exactly one {tokenizer.mask_token!r} in the text, found {len(positions)}"
            )
        # RoBERTa's tokenizers give no token_type_ids: none means all zeros.
        token_type_ids = encoding.get("token_type_ids")
        logits = self(
            input_ids=input_ids,
            attention_mask=encoding["attention_mask"].to(self.device),
            token_type_ids=token_type_ids.to(self.device) if token_type_ids is not None else None,
            return_dict=True,
        ).logits[0, positions[0]]
        scores, token_ids = logits.float().softmax(-1).topk(top_k)
        results = []
        for score, token_id in zip(scores.tolist(), token_ids.tolist(), strict=True):
            filled = input_ids[0].clone()
            filled[positions[0]] = token_id
            results.append(
                {
                    "score": score,
                    "token": token_id,
                    "token_str": tokenizer.decode([token_id], skip_special_tokens=False),
                    "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=True),
                }
            )
        return results


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

    def problem_type(self, labels: Tensor) -> str:
        """transformers' rule when config.problem_type is unset."""
        if self.config.problem_type is not None:
            return self.config.problem_type
        if self.num_labels == 1:
            return "regression"
        if labels.dtype in (torch.long, torch.int):
            return "single_label_classification"
        return "multi_label_classification"

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
        """transformers' loss for the problem type (`problem_type`): mean squared error, cross-entropy or binary
        cross-entropy on the logits."""
        problem = self.problem_type(labels)
        if problem == "regression":
            if self.num_labels == 1:
                return F.mse_loss(logits.squeeze(), labels.squeeze())
            return F.mse_loss(logits, labels)
        if problem == "single_label_classification":
            return F.cross_entropy(logits, class_labels("labels", labels, self.num_labels, len(logits)))
        return F.binary_cross_entropy_with_logits(logits, labels)


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
        loss = None
        if labels is not None:
            labels = class_labels("labels", labels, self.num_labels, logits.shape[:-1].numel())
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels)
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


def answer_spans(
    logits: Tensor,
    start_positions: Tensor | None,
    end_positions: Tensor | None,
    hidden_states: tuple[Tensor, ...] | None,
    attentions: tuple[Tensor, ...] | None,
) -> QuestionAnsweringOutput:
    """(batch, sequence, 2) logits -> start and end logits, and transformers' loss when both positions are given."""
    start_logits, end_logits = logits.split(1, dim=-1)
    start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
    loss = None
    if start_positions is not None and end_positions is not None:
        # Positions outside the sequence (answers cut off by truncation) are clamped to one past the end and
        # ignored, as in transformers.
        ignored = start_logits.size(1)
        start = start_positions.view(-1).clamp(0, ignored)
        end = end_positions.view(-1).clamp(0, ignored)
        loss = (
            F.cross_entropy(start_logits, start, ignore_index=ignored)
            + F.cross_entropy(end_logits, end, ignore_index=ignored)
        ) / 2
    return QuestionAnsweringOutput(loss, start_logits, end_logits, hidden_states, attentions)


class BertForMultipleChoice(_BertWithHead):
    heads = (CLASSIFIER_HEAD,)

    pooling = True

    def build_heads(self, config: BertConfig) -> None:
        self.dropout = self.classifier_dropout()
        self.classifier = nn.Linear(config.hidden_size, 1)

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

        def flat(tensor: Tensor | None, trailing: int = 1) -> Tensor | None:
            return None if tensor is None else tensor.reshape(-1, *tensor.shape[-trailing:])

        encoded = self.encode(
            input_ids=flat(input_ids),
            attention_mask=flat(attention_mask),
            token_type_ids=flat(token_type_ids),
            position_ids=flat(position_ids),
            inputs_embeds=flat(inputs_embeds, trailing=2),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.classifier(self.dropout(encoded.pooler_output)).view(-1, num_choices)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, class_labels("labels", labels, num_choices, len(logits)))
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)
