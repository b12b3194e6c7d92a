"""The task heads RoBERTa and MPNet both have, under the same names: `lm_head` (dense -> exact GELU -> layer_norm ->
decoder), `classifier` reading the first token through its own dense + tanh (`dense`, `out_proj`), and multiple
choice dropping out with `hidden_dropout_prob`. Each member's task classes declare their family (config class,
encoder, prefix) and take these; neither member imports the other.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import CLASSIFIER_HEAD, LM_HEAD
from hfbert.modeling.config import BertConfig
from hfbert.modeling.heads import BertForMaskedLM, BertForMultipleChoice, BertForSequenceClassification


class LMHead(nn.Module):
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


class ClassificationHead(nn.Module):
    """`classifier`: the first token's hidden state -> dropout -> dense -> tanh -> dropout -> out_proj."""

    def __init__(self, config: BertConfig, dropout: nn.Dropout) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = dropout  # the family's rule (`classifier_dropout()`; MPNet's: hidden_dropout_prob)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states: Tensor) -> Tensor:
        first = self.dropout(hidden_states[:, 0])
        return self.out_proj(self.dropout(torch.tanh(self.dense(first))))


class LMHeadForMaskedLM(BertForMaskedLM):
    """A masked LM whose head is `lm_head`."""

    heads = (LM_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        self.lm_head = LMHead(config)

    @property
    def prediction_head(self) -> nn.Module:
        return self.lm_head


class ClassificationHeadForSequenceClassification(BertForSequenceClassification):
    """`classifier` reads the first token through its own dense + tanh; the encoder has no pooler."""

    heads = (CLASSIFIER_HEAD,)
    pooling = False

    def build_heads(self, config: BertConfig) -> None:
        self.num_labels = config.num_labels
        self.classifier = ClassificationHead(config, self.classifier_dropout())

    def classify(self, encoded: Any) -> Tensor:
        return self.classifier(encoded.last_hidden_state)


class HiddenDropoutForMultipleChoice(BertForMultipleChoice):
    """BERT's multiple choice (the pooler, one logit per choice), dropping out with `hidden_dropout_prob`."""

    heads = (CLASSIFIER_HEAD,)

    def build_heads(self, config: BertConfig) -> None:
        self.dropout = nn.Dropout(config.hidden_dropout_prob)  # not classifier_dropout, as in transformers
        self.classifier = nn.Linear(config.hidden_size, 1)
