"""What every member's task models share: `TaskModel` (the encoder at its prefix, then the heads), `MaskedLanguageModel`
(ties, output embeddings, `fill_mask`), and transformers' losses and pooling rules as functions.

A member's task classes subclass these and build their own head modules (`build_heads`); what they compute the same
way (a sequence classifier's loss by problem type, question answering's spans, a pooled vector per row) they call
here, so that no member's class borrows another's methods.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import head_of
from hfbert.modeling.config import BertConfig
from hfbert.modeling.inputs import class_labels
from hfbert.modeling.outputs import QuestionAnsweringOutput
from hfbert.modeling.pretrained import BertPreTrainedModel


class TaskModel(BertPreTrainedModel):
    """A task model: the member's encoder (`backbone_class`) at `base_model_prefix`, then the task's heads
    (`build_heads`), then transformers' initialisation."""

    backbone_class: ClassVar[type[BertPreTrainedModel]]
    # Whether the encoder comes after the heads in the module tree, as transformers registers it in XLM-RoBERTa's
    # and CamemBERT's task models: parameter order is what an optimizer state is matched by.
    encoder_after_heads: ClassVar[bool] = False
    # Whether the encoder keeps its pooler (the heads that read it: BERT's next sentence, sequence classification
    # and multiple choice).
    pooling: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The encoder's tensors sit under its attribute (`bert.`, `roberta.`, ModernBERT's `model.`): stated once, as
        # transformers states it, in `base_model_prefix`.
        cls.base_prefix = cls.base_model_prefix + "."

    def __init__(self, config: BertConfig, attn_implementation: str | None = None) -> None:
        super().__init__(config)
        encoder = self.backbone_class(self.config, self.pooling, attn_implementation=attn_implementation)
        self.add_module(self.base_model_prefix, encoder)
        self.build_heads(self.config)
        self.init_weights()

    def build_heads(self, config: BertConfig) -> None:
        """Add the task's head modules, under transformers' names (a member overrides this, not __init__)."""

    def init_weights(self) -> None:
        if self.encoder_after_heads:
            self._modules[self.base_model_prefix] = self._modules.pop(self.base_model_prefix)
        super().init_weights()

    def encode(self, **inputs: Any) -> Any:
        """The encoder on forward's arguments, by keyword (a member without token types takes them only as all-zero
        keywords, `inputs.check_no_token_types`)."""
        return self.backbone(**inputs, return_dict=True)

    def finish(self, output: Any, return_dict: bool | None) -> Any:
        # As transformers' task models (`can_return_tuple`): by truthiness, the config's when none is given.
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()


class MaskedLanguageModel(TaskModel):
    """A masked LM: `prediction_head` (hidden states -> vocabulary logits, with its `decoder`), its ties to the word
    embeddings (`key_layout.tied_decoder`), and `fill_mask`."""

    @property
    def prediction_head(self) -> nn.Module:
        """The masked-LM head: hidden states -> vocabulary logits, with its `decoder` Linear (the output embeddings).
        Every member's masked LM gives this module under this name (BERT's `cls.predictions`, RoBERTa's `lm_head`,
        ModernBERT's `head` then `decoder`): what runs a masked LM's head on hidden states of its own (SPLADE
        pooling) calls it."""
        raise NotImplementedError

    def tied_weights(self) -> dict[str, str]:
        """As transformers 5: with `tie_word_embeddings` the decoder's weight is the word embeddings (and, where the
        layout says so, its bias the head's `bias`); without, nothing is tied. A tie whose two tensors the loaded
        checkpoint stores with different values is not made (`from_pretrained` warns), as in transformers."""
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

    @torch.no_grad()
    def fill_mask(self, text: str, tokenizer: Any, top_k: int = 5) -> list[dict[str, Any]]:
        """Top-k tokens for the single mask token in `text`, like transformers' fill-mask pipeline.

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


# -- transformers' losses and pooling rules -------------------------------------------------------------------------
def problem_type(config: BertConfig, num_labels: int, labels: Tensor) -> str:
    """A sequence classifier's problem type: the config's, else transformers' rule (one label: regression; integer
    labels: single-label; else multi-label)."""
    if config.problem_type is not None:
        return config.problem_type
    if num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def sequence_classification_loss(config: BertConfig, num_labels: int, logits: Tensor, labels: Tensor) -> Tensor:
    """transformers' loss for the problem type (`problem_type`): mean squared error, cross-entropy or binary
    cross-entropy on the logits."""
    problem = problem_type(config, num_labels, labels)
    if problem == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if problem == "single_label_classification":
        return F.cross_entropy(logits, class_labels("labels", labels, num_labels, len(logits)))
    return F.binary_cross_entropy_with_logits(logits, labels)


def token_classification_loss(logits: Tensor, labels: Tensor, num_labels: int) -> Tensor:
    """Cross-entropy over every position; label -100 marks positions without a target."""
    labels = class_labels("labels", labels, num_labels, logits.shape[:-1].numel())
    return F.cross_entropy(logits.view(-1, num_labels), labels)


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


def pooled(
    last_hidden_state: Tensor, attention_mask: Tensor | None, pooling: str = "cls", first_real: bool = False
) -> Tensor:
    """One vector per row: "cls", column 0 (even when it is a pad under left padding, as transformers' sequence
    classifiers read it; with `first_real`, each row's first real token), or "mean", the mean over real tokens."""
    if pooling == "mean":
        if attention_mask is None:
            return last_hidden_state.mean(dim=1)
        weights = attention_mask.to(last_hidden_state.dtype).unsqueeze(-1)
        return (last_hidden_state * weights).sum(dim=1) / weights.sum(dim=1)
    if first_real and attention_mask is not None:
        rows = torch.arange(len(last_hidden_state), device=last_hidden_state.device)
        return last_hidden_state[rows, attention_mask.argmax(dim=-1)]
    return last_hidden_state[:, 0]


def flat_choices(tensor: Tensor | None, trailing: int = 1) -> Tensor | None:
    """(batch, choices, ...) -> (batch * choices, ...) keeping `trailing` dimensions: every choice is its own row."""
    return None if tensor is None else tensor.reshape(-1, *tensor.shape[-trailing:])
