"""ModernBERT (answerdotai/ModernBERT-base and -large, gte-modernbert, nomic modernbert-embed), top to bottom.

Not BERT with a few differences: a different encoder, read in this order.

- embeddings: `tok_embeddings` -> `norm` (LayerNorm without bias) -> dropout; no positions, no token types;
- layers (`layers.N`): pre-LayerNorm. `attn_norm` (none in layer 0: the embeddings' norm serves) -> `attn` -> add;
  `mlp_norm` -> `mlp` -> add. No biases anywhere by default (`attention_bias`, `mlp_bias`, `norm_bias`);
- attention: one projection `Wqkv` (query, key, value stacked), rotary positions (`rotary.py`) on queries and keys,
  then `Wo`. Layers alternate by `layer_types`: "full_attention" (every key; rotary base 160,000) and
  "sliding_attention" (keys at most `local_attention // 2` columns away, both bounds included; base 10,000). The
  window and the positions ride on the batch layout (`padding.py`), so a padding-free batch applies both within
  each sequence, and so do the rotary tables, computed once per forward and base for every layer of it;
- MLP: GeGLU. `Wi` projects to twice `intermediate_size`; the first half goes through the activation and is
  multiplied by the second (the gate); `Wo` projects back;
- `final_norm` after the last layer; no pooler.

Task models keep the encoder at `model.`, as transformers' do: `head` (dense -> activation -> norm) before every
head, `decoder` for the masked LM (tied to `tok_embeddings` with `tie_word_embeddings`, its own bias), `classifier`
for the classifiers (pooled by `classifier_pooling`: the first column, "cls", or the mean over real tokens).

    >>> import torch, hfbert
    >>> model = hfbert.ModernBertModel(hfbert.ModernBertConfig(num_hidden_layers=2))
    >>> model(input_ids=torch.tensor([[50281, 7592, 50282]])).last_hidden_state.shape
    torch.Size([1, 3, 768])
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import CLASSIFIER_HEAD, DECODER, MODERNBERT_KEYS, PREDICTION_HEAD, KeyLayout
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import EncoderConfig, is_integer, is_number
from hfbert.modeling.encoder import EncoderLayer, EncoderModel
from hfbert.modeling.inputs import check_no_token_types, class_labels
from hfbert.modeling.outputs import BertModelOutput, LogitsOutput, QuestionAnsweringOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch
from hfbert.modeling.positions import PositionScheme, RotaryPositions
from hfbert.modeling.pretrained import BertPreTrainedModel, resized_rows
from hfbert.modeling.rotary import rotate
from hfbert.modeling.task import (
    MaskedLanguageModel,
    TaskModel,
    answer_spans,
    flat_choices,
    pooled,
    sequence_classification_loss,
    token_classification_loss,
)

FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULT_THETAS = {FULL: 160_000.0, SLIDING: 10_000.0}


@dataclass
class ModernBertConfig(EncoderConfig):
    """config.json of a ModernBERT checkpoint, with transformers' ModernBertConfig defaults (ModernBERT-base's shape).

    The layer pattern and the rotary bases are read in both spellings: transformers 5's `layer_types` and
    `rope_parameters`, and the Hub checkpoints' older `global_attn_every_n_layers` (layer i is global when
    i % n == 0), `global_rope_theta` and `local_rope_theta` (kept as written, beside the new keys)."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int | None = 50283
    eos_token_id: int | list[int] | None = 50282
    bos_token_id: int | None = 50281
    cls_token_id: int | None = 50281
    sep_token_id: int | None = 50282
    attention_bias: bool = False
    attention_dropout: float = 0.0
    layer_types: list[str] | None = None
    rope_parameters: dict[str, dict[str, Any]] | None = None
    local_attention: int = 128
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float | None = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    deterministic_flash_attn: bool = False
    sparse_prediction: bool = False
    sparse_pred_ignore_index: int = -100
    model_type: str = "modernbert"
    # The older spellings, as keywords (from config.json they arrive among the unknown keys).
    global_attn_every_n_layers: InitVar[int | None] = None
    global_rope_theta: InitVar[float | None] = None
    local_rope_theta: InitVar[float | None] = None

    positions: ClassVar[PositionScheme] = RotaryPositions()
    key_layout: ClassVar[KeyLayout] = MODERNBERT_KEYS
    positive_integers: ClassVar[tuple[str, ...]] = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    )
    probabilities: ClassVar[tuple[str, ...]] = ("attention_dropout", "embedding_dropout", "mlp_dropout")
    positive_numbers: ClassVar[tuple[str, ...]] = ("initializer_range", "initializer_cutoff_factor", "norm_eps")
    activations: ClassVar[tuple[str, ...]] = ("hidden_activation", "classifier_activation")
    flags: ClassVar[tuple[str, ...]] = (
        *EncoderConfig.flags,
        "norm_bias",
        "attention_bias",
        "mlp_bias",
        "decoder_bias",
        "classifier_bias",
        "sparse_prediction",
    )
    inspect_fields: ClassVar[tuple[str, ...]] = (
        "hidden_activation", "initializer_cutoff_factor", "norm_eps", "norm_bias", "cls_token_id", "sep_token_id",
        "attention_bias", "attention_dropout", "layer_types", "rope_parameters", "local_attention",
        "embedding_dropout", "mlp_bias", "mlp_dropout", "decoder_bias", "classifier_pooling", "classifier_bias",
        "classifier_activation", "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index",
    )  # fmt: skip

    def __post_init__(
        self,
        attn_implementation: str | None,
        torch_dtype: Any,
        global_attn_every_n_layers: int | None = None,
        global_rope_theta: float | None = None,
        local_rope_theta: float | None = None,
    ) -> None:
        legacy = {
            "global_attn_every_n_layers": global_attn_every_n_layers,
            "global_rope_theta": global_rope_theta,
            "local_rope_theta": local_rope_theta,
        }
        for name, value in legacy.items():
            if value is not None:
                self.extra_fields[name] = value
        if self.layer_types is None:
            every = self.extra_fields.get("global_attn_every_n_layers", 3)
            if not is_integer(every) or every < 1:
                raise self._fail("global_attn_every_n_layers", f"must be a positive integer, got {every!r}")
            layers = self.num_hidden_layers if is_integer(self.num_hidden_layers) else 0
            self.layer_types = [FULL if index % every == 0 else SLIDING for index in range(layers)]
        if self.rope_parameters is None:
            thetas = {FULL: "global_rope_theta", SLIDING: "local_rope_theta"}
            self.rope_parameters = {
                kind: {"rope_type": "default", "rope_theta": self.extra_fields.get(key) or DEFAULT_THETAS[kind]}
                for kind, key in thetas.items()
            }
        super().__post_init__(attn_implementation, torch_dtype)

    @property
    def sliding_window(self) -> int:
        """How far a local layer's query sees, each side: `local_attention // 2` columns (transformers' name)."""
        return self.local_attention // 2

    def theta(self, layer_index: int) -> float:
        """The rotary base of layer `layer_index`."""
        return float(self.rope_parameters[self.layer_types[layer_index]]["rope_theta"])

    def window(self, layer_index: int) -> int | None:
        """How many columns away layer `layer_index` attends (None: every column)."""
        return self.sliding_window if self.layer_types[layer_index] == SLIDING else None

    @property
    def feed_forward_activation(self) -> str:
        return self.hidden_activation

    def attention_pattern(self) -> str:
        """Which layers attend globally and which within a window, with each kind's rotary base.

        >>> ModernBertConfig(num_hidden_layers=4).attention_pattern()
        'global layers 0, 3 (rotary theta 160000); local layers 1, 2 (64 columns each side, rotary theta 10000)'
        """
        kinds: dict[str, list[int]] = {}
        for index in range(self.num_hidden_layers):
            kinds.setdefault("global" if self.window(index) is None else "local", []).append(index)
        parts = []
        for kind, layers in kinds.items():
            reach = "" if kind == "global" else f"{self.window(layers[0])} columns each side, "
            parts.append(f"{kind} layers {', '.join(map(str, layers))} ({reach}rotary theta {self.theta(layers[0]):g})")
        return "; ".join(parts)

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.layer_types, list) or len(self.layer_types) != self.num_hidden_layers:
            raise self._fail(
                "layer_types", f"must list one type per layer (num_hidden_layers = {self.num_hidden_layers})"
            )
        unknown = sorted({kind for kind in self.layer_types if kind not in (FULL, SLIDING)}, key=str)
        if unknown:
            raise self._fail("layer_types", f"has {unknown}; each layer is {FULL!r} or {SLIDING!r}")
        if not is_integer(self.local_attention) or self.local_attention < 2:
            raise self._fail(
                "local_attention", f"must be an integer >= 2 (the window's width), got {self.local_attention!r}"
            )
        if not isinstance(self.rope_parameters, dict):
            raise self._fail("rope_parameters", f"must be an object per layer type, got {self.rope_parameters!r}")
        for kind in sorted(set(self.layer_types)):
            rope = self.rope_parameters.get(kind)
            if not isinstance(rope, dict):
                raise self._fail("rope_parameters", f"has no entry for {kind!r}")
            if rope.get("rope_type", "default") != "default":
                raise self._fail(
                    "rope_parameters", f"{kind!r} has rope_type {rope.get('rope_type')!r}; hfbert implements 'default'"
                )
            theta = rope.get("rope_theta")
            if not is_number(theta) or not 1.0 < theta < math.inf:
                raise self._fail("rope_parameters", f"{kind!r} rope_theta must be a number > 1, got {theta!r}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise self._fail("classifier_pooling", f"is {self.classifier_pooling!r}; expected 'cls' or 'mean'")
        # transformers' ModernBERT reads classifier_dropout as a number (0.0 by default), never None.
        if not is_number(self.classifier_dropout) or not 0.0 <= self.classifier_dropout <= 1.0:
            raise self._fail("classifier_dropout", f"must be a number in [0, 1], got {self.classifier_dropout!r}")


def _layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _layer_norm(config)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: Tensor | None, inputs_embeds: Tensor | None) -> Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.tok_embeddings(input_ids)
        return self.drop(self.norm(inputs_embeds))


class ModernBertAttention(nn.Module):
    """`Wqkv` -> rotary on queries and keys -> attention (over the layer's window) -> `Wo`."""

    def __init__(self, config: ModernBertConfig, layer_index: int) -> None:
        super().__init__()
        config.check_heads()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.theta = config.theta(layer_index)
        self.window = config.window(layer_index)
        self.dropout_probability = config.attention_dropout
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        """`hidden_states` (batch, sequence, hidden) padded or (tokens, hidden) padding-free; the positions are the
        layout's, in its own token order."""
        leading = hidden_states.shape[:-1]
        query, key, value = self.Wqkv(hidden_states).view(*leading, 3, self.num_heads, self.head_size).unbind(-3)
        cos, sin = batch.rotary_tables(self.head_size, self.theta, query.dtype)  # one pair per forward and base
        query, key = rotate(query, cos, sin), rotate(key, cos, sin)
        context, probabilities = batch.attend(
            query.flatten(-2),
            key.flatten(-2),
            value.flatten(-2),
            window=self.window,
            num_heads=self.num_heads,
            scale=self.head_size**-0.5,
            dropout=self.dropout_probability if self.training else 0.0,
        )
        return self.out_drop(self.Wo(context)), probabilities


class ModernBertMLP(nn.Module):
    """GeGLU: `Wi` gives the input and the gate side by side; activation(input) * gate; `Wo` back."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = ACTIVATIONS[config.hidden_activation]
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, hidden_states: Tensor) -> Tensor:
        input, gate = self.Wi(hidden_states).chunk(2, dim=-1)
        return self.Wo(self.drop(self.act(input) * gate))


class ModernBertEncoderLayer(EncoderLayer):
    """Pre-LayerNorm: `h + attn(attn_norm(h))`, then `h + mlp(mlp_norm(h))`. Keeps BERT's layer protocol
    (`model.BertLayer`): `forward(hidden_states, batch, checkpointing=None) -> (hidden_states, probabilities)`."""

    def __init__(self, config: ModernBertConfig, layer_index: int) -> None:
        super().__init__()
        # Layer 0 reads the embeddings' output, already normalised.
        self.attn_norm = nn.Identity() if layer_index == 0 else _layer_norm(config)
        self.attn = ModernBertAttention(config, layer_index)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def compute(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        attention_output, probabilities = self.attn(self.attn_norm(hidden_states), batch)
        hidden_states = hidden_states + attention_output
        return hidden_states + self.mlp(self.mlp_norm(hidden_states)), probabilities


class ModernBertPreTrainedModel(BertPreTrainedModel):
    """What every ModernBERT class declares, and transformers' initialisation for it: truncated normals, cut at
    `initializer_cutoff_factor` standard deviations, the output projections scaled by depth."""

    config_class: ClassVar[type[EncoderConfig]] = ModernBertConfig
    base_model_prefix: ClassVar[str] = "model"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        config = self.config
        cutoff = config.initializer_cutoff_factor or 3.0
        standard = config.initializer_range
        output = standard / math.sqrt(2.0 * config.num_hidden_layers)

        def truncated(linear: nn.Module, std: float) -> None:
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=std, a=-cutoff * std, b=cutoff * std)
            if getattr(linear, "bias", None) is not None:
                linear.bias.zero_()

        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, ModernBertEmbeddings):
            truncated(module.tok_embeddings, standard)
        elif isinstance(module, (ModernBertAttention, ModernBertMLP)):
            truncated(module.Wqkv if isinstance(module, ModernBertAttention) else module.Wi, standard)
            truncated(module.Wo, output)
        elif isinstance(module, ModernBertPredictionHead):
            truncated(module.dense, output)
        elif isinstance(module, ModernBertForMaskedLM):
            truncated(module.decoder, output)
        elif isinstance(module, _ModernBertWithHead) and hasattr(module, "classifier"):
            truncated(module.classifier, config.hidden_size**-0.5)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.backbone.embeddings.tok_embeddings

    def set_input_embeddings(self, embeddings: nn.Embedding) -> None:
        self.backbone.embeddings.tok_embeddings = embeddings
        self.tie_weights()
        if getattr(self, "_input_require_grads_hook", None) is not None:
            self.disable_input_require_grads()
            self.enable_input_require_grads()


class ModernBertModel(ModernBertPreTrainedModel, EncoderModel):
    """The ModernBERT encoder; a drop-in for `transformers.ModernBertModel` (same state dict keys, forward arguments
    and outputs: the last hidden state, and with `output_hidden_states` the embeddings' output and every layer's,
    the last one after `final_norm`, as transformers records them).

    `EncoderModel`'s forward: "sdpa" (default) or "eager" attention, attention maps through eager, and in eval mode a
    right-padded batch runs padding-free (pad positions of the outputs are then zeros) unless `padding_free=False`.
    Left padding runs padded with positions counted from the first column, as in transformers (rotary positions
    are relative, so real tokens see the same thing either way). `token_type_ids` are accepted only all zero
    (ModernBERT has none; transformers drops any silently)."""

    layers_path: ClassVar[str] = "layers"

    def __init__(
        self,
        config: ModernBertConfig,
        add_pooling_layer: bool = False,
        attn_implementation: str | None = None,
        padding_free: bool = True,
    ) -> None:
        """`add_pooling_layer` is BertModel's argument, taken so that the tools build every member alike; ModernBERT
        has no pooler (`pooler` is None), so True is refused."""
        if add_pooling_layer:
            raise ValueError("ModernBERT has no pooler: add_pooling_layer must be False")
        super().__init__(config, attn_implementation, padding_free)
        config = self.config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, index) for index in range(config.num_hidden_layers))
        self.final_norm = _layer_norm(config)
        self.pooler = None
        self.init_weights()

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
        """Run the encoder; `attention_mask` (batch, sequence) is 1 for real tokens and 0 for padding. Bad inputs
        raise ValueError naming the argument and the limit (a sequence past `max_position_embeddings` too)."""
        check_no_token_types(kwargs, member="ModernBERT")
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
        """Words only: the positions act inside attention (rotary), and there are no token types."""
        return self.embeddings(input_ids, inputs_embeds)

    def normalize_output(self, hidden_states: Tensor) -> Tensor:
        return self.final_norm(hidden_states)


class ModernBertPredictionHead(nn.Module):
    """`head`: dense -> classifier_activation -> norm, before the decoder or classifier."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = ACTIVATIONS[config.classifier_activation]
        self.norm = _layer_norm(config)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.norm(self.act(self.dense(hidden_states)))


class ModernBertVocabularyLogits(nn.Module):
    """The masked LM's hidden states -> vocabulary logits (`head`, then `decoder`), the module every member's masked LM
    gives as `prediction_head`, so that code running any member's head on hidden states (SPLADE pooling) needs no
    case for ModernBERT, whose two modules sit at the model's top level. It owns no weights and is no submodule of
    the model: the state dict keeps transformers' names (`head.*`, `decoder.*`), and each call reads the model's
    current `head` and `decoder`, so a resized or swapped decoder is followed."""

    def __init__(self, model: ModernBertForMaskedLM) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # a plain reference: registering it would make a module cycle

    @property
    def decoder(self) -> nn.Linear:
        """The vocabulary projection (the output embeddings)."""
        return self._model.decoder

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self._model.decoder(self._model.head(hidden_states))


class _ModernBertWithHead(ModernBertPreTrainedModel, TaskModel):
    """The encoder at `model`, then `head`, then the task's layers (`build_output`)."""

    backbone_class: ClassVar[type[BertPreTrainedModel]] = ModernBertModel

    def build_heads(self, config: ModernBertConfig) -> None:
        self.head = ModernBertPredictionHead(config)
        self.build_output(config)

    def build_output(self, config: ModernBertConfig) -> None:
        """The classifiers' dropout and last Linear (the masked LM builds its decoder instead)."""
        self.num_labels = config.num_labels
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, self.num_outputs(config))

    def num_outputs(self, config: ModernBertConfig) -> int:
        return config.num_labels

    def encode(self, **inputs: Any) -> Any:
        """The encoder by keyword, refusing what ModernBERT cannot take (non-zero token types, unknown keywords)."""
        check_no_token_types(inputs.pop("keywords"), member="ModernBERT")
        return self.model(**inputs, return_dict=True)

    def pool(self, last_hidden_state: Tensor, attention_mask: Tensor | None, first_real: bool = False) -> Tensor:
        """One vector per row, by `classifier_pooling` (`task.pooled`); multiple choice reads each row's first real
        token (`first_real`)."""
        return pooled(last_hidden_state, attention_mask, self.config.classifier_pooling, first_real)

    def classify(self, features: Tensor) -> Tensor:
        return self.classifier(self.drop(self.head(features)))


class ModernBertForMaskedLM(_ModernBertWithHead, MaskedLanguageModel):
    """`head` -> `decoder` over the vocabulary. With `sparse_prediction` and labels, logits only at the labelled
    positions (transformers' option for pre-training), flattened."""

    heads = (PREDICTION_HEAD, DECODER)

    def build_output(self, config: ModernBertConfig) -> None:
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        # Outside the module tree (see ModernBertVocabularyLogits); one object, so hooks on it stay.
        object.__setattr__(self, "_vocabulary_logits", ModernBertVocabularyLogits(self))

    @property
    def prediction_head(self) -> ModernBertVocabularyLogits:
        """hidden states -> vocabulary logits: `head` then `decoder`, as every member's masked LM names it."""
        return self._vocabulary_logits

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
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        hidden_states = encoded.last_hidden_state
        if self.config.sparse_prediction and labels is not None:
            labels = labels.reshape(-1)
            kept = labels != self.config.sparse_pred_ignore_index
            hidden_states, labels = hidden_states.reshape(len(labels), -1)[kept], labels[kept]
        logits = self.prediction_head(hidden_states)
        loss = None
        if labels is not None:
            labels = class_labels("labels", labels, self.config.vocab_size, logits.shape[:-1].numel())
            loss = F.cross_entropy(logits.view(-1, self.config.vocab_size).float(), labels)
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        """The decoder follows a resized vocabulary as in transformers: tied, its weight is the new embeddings and
        its bias grows with zeros; untied, its weight grows as the embeddings do and its bias with the old mean."""
        old = self.decoder
        tied = DECODER + "weight" in self.tied_weights()
        decoder = nn.Linear(self.config.hidden_size, new_num_tokens, bias=old.bias is not None)
        decoder.to(device=old.weight.device, dtype=old.weight.dtype)
        if not tied:
            std = self.config.initializer_range
            decoder.weight = nn.Parameter(resized_rows(old.weight, new_num_tokens, mean_resizing, std))
        if old.bias is not None:
            decoder.bias = nn.Parameter(resized_rows(old.bias, new_num_tokens, mean_resizing and not tied, std=0.0))
        decoder._is_hf_initialized = True
        self.decoder = decoder


class ModernBertForSequenceClassification(_ModernBertWithHead):
    heads = (PREDICTION_HEAD, CLASSIFIER_HEAD)

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
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.classify(self.pool(encoded.last_hidden_state, attention_mask))
        # BERT's rules by problem type, as transformers' ModernBERT has them.
        loss = (
            sequence_classification_loss(self.config, self.num_labels, logits, labels) if labels is not None else None
        )
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class ModernBertForTokenClassification(_ModernBertWithHead):
    heads = (PREDICTION_HEAD, CLASSIFIER_HEAD)

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
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.classify(encoded.last_hidden_state)
        loss = token_classification_loss(logits, labels, self.config.num_labels) if labels is not None else None
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)


class ModernBertForQuestionAnswering(_ModernBertWithHead):
    """Start and end logits from `classifier` (two labels); no `inputs_embeds`, as transformers' has none. Pads take
    part in the loss, so the encoder runs padded."""

    heads = (PREDICTION_HEAD, CLASSIFIER_HEAD)

    def build_output(self, config: ModernBertConfig) -> None:
        super().build_output(config)
        self.model.padding_free = False

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> QuestionAnsweringOutput | tuple:
        encoded = self.encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords=kwargs,
        )
        logits = self.classify(encoded.last_hidden_state)
        output = answer_spans(logits, start_positions, end_positions, encoded.hidden_states, encoded.attentions)
        return self.finish(output, return_dict)


class ModernBertForMultipleChoice(_ModernBertWithHead):
    """One score per choice; "cls" pooling reads each choice's first real token (left padding included)."""

    heads = (PREDICTION_HEAD, CLASSIFIER_HEAD)

    def num_outputs(self, config: ModernBertConfig) -> int:
        return 1

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
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        attention_mask = flat_choices(attention_mask)
        encoded = self.encode(
            input_ids=flat_choices(input_ids),
            attention_mask=attention_mask,
            position_ids=flat_choices(position_ids),
            inputs_embeds=flat_choices(inputs_embeds, trailing=2),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            keywords={
                name: flat_choices(value) if isinstance(value, Tensor) else value for name, value in kwargs.items()
            },
        )
        logits = self.classify(self.pool(encoded.last_hidden_state, attention_mask, first_real=True))
        logits = logits.view(-1, num_choices)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, class_labels("labels", labels, num_choices, len(logits)))
        return self.finish(LogitsOutput(loss, logits, encoded.hidden_states, encoded.attentions), return_dict)
