"""DeBERTa-v2 and v3 (microsoft/deberta-v3-base and -large, mDeBERTa, the NLI zero-shot classifiers and rerankers),
top to bottom.

BERT's layer shape (attention, `output`, `intermediate`, `output`, each post-LayerNorm, under BERT's names) with
attention of its own, read in this order:

- embeddings: words (`embedding_size` wide, projected to `hidden_size` by `embed_proj` where it differs), absolute
  positions only with `position_biased_input` (v3 has none), token types only with `type_vocab_size` > 0 (none in
  the published checkpoints: the ids DeBERTa's tokenizer gives are ignored, as transformers ignores them), then
  LayerNorm, then pads set to zero;
- disentangled attention: beside content-to-content `q . k`, content-to-position `q . P_k[d]` ("c2p") and
  position-to-content `k . P_q[d]` ("p2c"), where `d` is the query's distance to the key, `query - key`, in
  columns, put into `position_buckets` log buckets beyond half of them (`log_bucket`), and `P` the shared table
  `encoder.rel_embeddings` (after `encoder.LayerNorm` with `norm_rel_ebd` "layer_norm") projected by the layer's
  own `pos_key_proj` / `pos_query_proj`, or by its key / query projections with `share_att_key`. Every term is
  divided by sqrt(head_size x (1 + the number of terms)), that scale taken in float32 as DeBERTa computes it;
- the relative terms are a function of queries, keys and column distances, so they reach the attention kernels as
  a score term (`padding.py`): sdpa takes them as an additive float mask, and the padding-free layout adds them per
  bucket of sequences, each counted from its own column 0. transformers runs DeBERTa eager only;
- a padded batch masks pad queries as well as pad keys, as transformers' DeBERTa does (its pad positions then
  average every value): outputs at pad positions equal transformers' too;
- DeBERTa-v2's convolution (`conv_kernel_size` > 0, `encoder.conv`) after layer 0, over the embeddings' output, per
  sequence (the padding-free layout scatters its tokens back to rows for it).

Task models keep the encoder at `deberta.`: the masked LM's `cls.predictions` (`legacy`, transformers' default) or
`lm_predictions.lm_head` (the enhanced head over the word embeddings), the classifiers' `pooler` (a ContextPooler:
dropout, dense, `pooler_hidden_act` on the first token) before `classifier`, `qa_outputs`.

    >>> import torch, hfbert
    >>> config = hfbert.DebertaV2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
    ...     intermediate_size=64, vocab_size=100, relative_attention=True, position_buckets=8,
    ...     pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False)
    >>> hfbert.DebertaV2Model(config)(input_ids=torch.tensor([[1, 7, 2]])).last_hidden_state.shape
    torch.Size([1, 3, 64])
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.key_map import DEBERTA_V2_KEYS, KeyLayout
from hfbert.modeling.activations import ACTIVATIONS
from hfbert.modeling.config import EncoderConfig, is_integer, is_number
from hfbert.modeling.encoder import EncoderModel, LayerStack
from hfbert.modeling.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from hfbert.modeling.inputs import class_labels
from hfbert.modeling.model import BertAttention, BertLayer, BertResidualOutput
from hfbert.modeling.outputs import BertModelOutput
from hfbert.modeling.padding import PackedBatch, PaddedBatch
from hfbert.modeling.pretrained import BertPreTrainedModel, resized_rows

ATTENTION_TERMS = ("c2p", "p2c")
MLM_LEGACY_HEAD, MLM_HEAD, POOLER_HEAD = "cls.predictions.", "lm_predictions.", "pooler."


@dataclass
class DebertaV2Config(EncoderConfig):
    """config.json of a DeBERTa-v2 / v3 checkpoint, with transformers' DebertaV2Config fields and defaults
    (deberta-v2-xlarge's shape), and the fields its model reads beyond them with the defaults it reads them with
    (`position_buckets`, `share_att_key`, `norm_rel_ebd`, the convolution's, `embedding_size`, `cls_dropout`).

    deberta-v3-base's config.json sets `relative_attention`, `position_buckets` 256, `share_att_key`,
    `norm_rel_ebd` "layer_norm", `pos_att_type` "p2c|c2p" (read as a list, as transformers reads it) and
    `position_biased_input` false."""

    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1
    pad_token_id: int | None = 0
    position_biased_input: bool = True
    pos_att_type: list[str] | str | None = None
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    legacy: bool = True
    # Read by transformers' model with getattr and these defaults; None: hidden_size (set when constructed).
    pooler_hidden_size: int | None = None
    embedding_size: int | None = None
    position_buckets: int = -1
    share_att_key: bool = False
    norm_rel_ebd: str = "none"
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    cls_dropout: float | None = None
    model_type: str = "deberta-v2"

    key_layout: ClassVar[KeyLayout] = DEBERTA_V2_KEYS
    positive_integers: ClassVar[tuple[str, ...]] = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "embedding_size",
        "pooler_hidden_size",
        "conv_groups",
    )
    probabilities: ClassVar[tuple[str, ...]] = ("hidden_dropout_prob", "attention_probs_dropout_prob", "pooler_dropout")
    positive_numbers: ClassVar[tuple[str, ...]] = ("initializer_range", "layer_norm_eps")
    activations: ClassVar[tuple[str, ...]] = ("hidden_act", "pooler_hidden_act", "conv_act")
    flags: ClassVar[tuple[str, ...]] = (
        *EncoderConfig.flags,
        "relative_attention",
        "position_biased_input",
        "legacy",
        "share_att_key",
    )
    inspect_fields: ClassVar[tuple[str, ...]] = (
        "relative_attention", "max_relative_positions", "position_buckets", "pos_att_type", "share_att_key",
        "norm_rel_ebd", "position_biased_input", "type_vocab_size", "embedding_size", "conv_kernel_size", "legacy",
    )  # fmt: skip

    def __post_init__(self, attn_implementation: str | None, torch_dtype: Any) -> None:
        if isinstance(self.pos_att_type, str):  # older files write "p2c|c2p", as transformers reads them
            self.pos_att_type = [term.strip() for term in self.pos_att_type.lower().split("|")]
        if self.pooler_hidden_size is None:
            self.pooler_hidden_size = self.hidden_size
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        super().__post_init__(attn_implementation, torch_dtype)

    @property
    def attention_terms(self) -> tuple[str, ...]:
        """The relative terms the scores get ("c2p", "p2c"), none without `relative_attention`."""
        return tuple(term for term in ATTENTION_TERMS if term in (self.pos_att_type or []))

    @property
    def relative_reach(self) -> int:
        """The largest distance the log buckets are scaled to: `max_relative_positions`, or below 1
        `max_position_embeddings`, as transformers reads it."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def relative_span(self) -> int:
        """Half the rows of `rel_embeddings`: distances -span .. span - 1 after bucketing (`position_buckets`, else
        `relative_reach`)."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_reach

    @property
    def relative_norms(self) -> list[str]:
        return [name.strip() for name in self.norm_rel_ebd.lower().split("|")]

    def attention_pattern(self) -> str | None:
        if not self.relative_attention:
            return "content only (relative_attention false)"
        buckets = f"{self.position_buckets} log buckets" if self.position_buckets > 0 else "no buckets"
        terms = " + ".join(("c2c", *self.attention_terms))
        return f"disentangled: {terms}; relative distances to {self.relative_reach}, {buckets}"

    def validate(self) -> None:
        super().validate()
        if not is_integer(self.type_vocab_size) or self.type_vocab_size < 0:
            raise self._fail("type_vocab_size", f"must be a non-negative integer, got {self.type_vocab_size!r}")
        if not is_integer(self.max_relative_positions):
            raise self._fail("max_relative_positions", f"must be an integer, got {self.max_relative_positions!r}")
        if not isinstance(self.pos_att_type, list | None) or not all(
            term in ATTENTION_TERMS for term in self.pos_att_type or []
        ):
            raise self._fail("pos_att_type", f"is {self.pos_att_type!r}; expected a list of {list(ATTENTION_TERMS)}")
        if not isinstance(self.norm_rel_ebd, str) or not set(self.relative_norms) <= {"none", "layer_norm"}:
            raise self._fail("norm_rel_ebd", f"is {self.norm_rel_ebd!r}; expected 'none' or 'layer_norm'")
        buckets = self.position_buckets
        if not is_integer(buckets):
            raise self._fail("position_buckets", f"must be an integer, got {buckets!r}")
        if self.relative_attention and buckets > 0:
            # The log buckets scale distances from half the buckets to the reach: log(reach - 1) / log(half) must be
            # a positive number (else bucket indices are NaN or run backwards).
            reach = self.relative_reach
            field = "max_relative_positions" if self.max_relative_positions >= 1 else "max_position_embeddings"
            if buckets < 2 or buckets // 2 >= reach - 1:
                raise self._fail(
                    "position_buckets",
                    f"is {buckets}; the log buckets need 2 <= position_buckets and position_buckets // 2 < "
                    f"{reach - 1} ({field} - 1 = {reach} - 1), so at most {2 * (reach - 1) - 1}",
                )
        if self.pooler_hidden_size != self.hidden_size:
            raise self._fail(
                "pooler_hidden_size",
                f"is {self.pooler_hidden_size}; DeBERTa's pooler reads the hidden state: it must equal hidden_size "
                f"({self.hidden_size})",
            )
        if self.relative_attention and not self.legacy and self.embedding_size != self.hidden_size:
            raise self._fail(
                "legacy",
                f"false projects onto the word embeddings, which needs embedding_size ({self.embedding_size}) = "
                f"hidden_size ({self.hidden_size})",
            )
        if not is_integer(self.conv_kernel_size) or self.conv_kernel_size < 0:
            raise self._fail("conv_kernel_size", f"must be a non-negative integer, got {self.conv_kernel_size!r}")
        if self.conv_kernel_size > 0 and self.hidden_size % self.conv_groups != 0:
            raise self._fail(
                "conv_groups", f"({self.conv_groups}) must divide hidden_size ({self.hidden_size}) for the convolution"
            )
        if self.cls_dropout is not None and (not is_number(self.cls_dropout) or not 0.0 <= self.cls_dropout <= 1.0):
            raise self._fail("cls_dropout", f"must be None or a number in [0, 1], got {self.cls_dropout!r}")
        head_size = self.extra_fields.get("attention_head_size")
        if head_size is not None and head_size * self.num_attention_heads != self.hidden_size:
            raise self._fail(
                "attention_head_size",
                f"is {head_size}; DeBERTa's output projection needs it x num_attention_heads "
                f"({self.num_attention_heads}) = hidden_size ({self.hidden_size})",
            )


# -- relative positions -----------------------------------------------------------------------------------------------
def log_bucket(relative: Tensor, buckets: int, reach: int) -> Tensor:
    """DeBERTa's bucket of each distance (an integer tensor): distances within half the buckets as they are; beyond,
    logarithmically spaced so that `reach - 1` lands in the last bucket, sign kept. Computed in float32 as DeBERTa
    does, so that the boundaries agree.

    >>> log_bucket(torch.tensor([0, 3, -4, 5, 40, -511, 600]), buckets=8, reach=512).tolist()
    [0, 3, -4, 5, 6, -7, 8]
    """
    middle = buckets // 2
    sign = torch.sign(relative)
    inside = (relative < middle) & (relative > -middle)
    distance = torch.where(inside, torch.full_like(relative, middle - 1), relative.abs())
    scale = torch.log(torch.tensor((reach - 1) / middle, dtype=torch.float32))
    logarithmic = torch.ceil(torch.log(distance.float() / middle) / scale * (middle - 1)) + middle
    return torch.where(distance <= middle, relative.float(), logarithmic * sign).long()


def relative_index(query_positions: Tensor, key_positions: Tensor, config: DebertaV2Config) -> Tensor:
    """(batch or 1, query, key): the row of `rel_embeddings` each (query, key) pair reads, `query - key` bucketed,
    shifted by the span and clamped to the table."""
    relative = query_positions[..., :, None] - key_positions[..., None, :]
    if config.position_buckets > 0:
        relative = log_bucket(relative, config.position_buckets, config.relative_reach)
    span = config.relative_span
    return (relative + span).clamp(0, 2 * span - 1)


def distance_rows(columns: int, config: DebertaV2Config, device: torch.device) -> Tensor:
    """(2 x columns - 1,): the row of `rel_embeddings` of each distance `query - key` from -(columns - 1) to
    columns - 1 (`relative_index` of every distance a batch of `columns` columns holds), computed once per forward:
    each layer's term then looks its pairs up instead of bucketing them again."""
    distances = torch.arange(1 - columns, columns, device=device)
    return relative_index(distances, torch.zeros(1, dtype=distances.dtype, device=device), config)[..., 0]


@functools.lru_cache(maxsize=64)
def score_divisor(head_size: int, factor: int, dtype: torch.dtype) -> float:
    """sqrt(head_size x factor) as DeBERTa takes it: in float32, then cast to the scores' dtype (in float64 runs the
    float32 value, exactly)."""
    return torch.sqrt(torch.tensor(head_size, dtype=torch.float32) * factor).to(dtype).item()


def _traced() -> bool:
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.compiler.is_exporting()


# -- the encoder ------------------------------------------------------------------------------------------------------
class DebertaV2Embeddings(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.embedding_size = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.embedding_size)
            if config.position_biased_input
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.embedding_size) if config.type_vocab_size > 0 else None
        )
        self.embed_proj = (
            nn.Linear(config.embedding_size, config.hidden_size, bias=False)
            if config.embedding_size != config.hidden_size
            else None
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
        token_mask: Tensor | None = None,
    ) -> Tensor:
        """`token_mask` (batch, sequence) bool: real tokens; pads come out zero (None: no pads)."""
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds
        if self.position_embeddings is not None:
            if position_ids is None:
                position_ids = torch.arange(inputs_embeds.shape[-2], device=inputs_embeds.device)
            embeddings = embeddings + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.embed_proj is not None:
            embeddings = self.embed_proj(embeddings)
        embeddings = self.LayerNorm(embeddings)
        if token_mask is not None:
            embeddings = embeddings * token_mask[..., None].to(embeddings.dtype)
        return self.dropout(embeddings)


class DisentangledSelfAttention(nn.Module):
    """`attention.self`: query / key / value projections, and the relative terms' own projections of the shared
    relative embeddings (`pos_key_proj` for c2p, `pos_query_proj` for p2c) unless `share_att_key`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        config.check_heads()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        hidden = config.hidden_size
        self.query_proj = nn.Linear(hidden, hidden)
        self.key_proj = nn.Linear(hidden, hidden)
        self.value_proj = nn.Linear(hidden, hidden)
        self.terms = config.attention_terms if config.relative_attention else ()
        self.share_att_key = config.share_att_key
        if config.relative_attention:
            if not self.share_att_key:
                if "c2p" in self.terms:
                    self.pos_key_proj = nn.Linear(hidden, hidden)
                if "p2c" in self.terms:
                    self.pos_query_proj = nn.Linear(hidden, hidden)
            self.pos_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.dropout_probability = config.attention_probs_dropout_prob
        self.factor = 1 + len(self.terms)  # the scores are a sum of this many terms

    def forward(self, hidden_states: Tensor, batch: PaddedBatch | PackedBatch) -> tuple[Tensor, Tensor | None]:
        divisor = score_divisor(self.head_size, self.factor, hidden_states.dtype)
        context = context_of(batch)
        term = None
        if self.terms and context.relative_table is not None:
            term = self.relative_term(context.relative_table(), context.relative_rows, divisor)
        query = self.query_proj(hidden_states)
        token_mask = context.token_mask
        if token_mask is not None:
            # A pad query's row of scores is all masked (it averages every value); zeroing its query and its terms
            # keeps gradients from flowing through that row into queries, keys and the table, as transformers'
            # masked_fill keeps them. The forward is the same either way.
            query = query * token_mask[..., None].to(query.dtype)
            term = _rows_of(term, token_mask) if term is not None else None
        return batch.attend(
            query,
            self.key_proj(hidden_states),
            self.value_proj(hidden_states),
            num_heads=self.num_heads,
            scale=1.0 / divisor,
            dropout=self.dropout_probability if self.training else 0.0,
            score_term=term,
        )

    def relative_term(self, relative_embeddings: Tensor, distances: Tensor, divisor: float) -> Callable:
        """The c2p and p2c terms as a score term (`padding.ScoreTerm`): split queries and keys (batch, heads, length,
        head_size) and their column positions -> (batch, heads, query, key), already divided by `divisor`. Only the
        rows of the table the call's distances reach are projected, once per forward for the widest call (the
        padding-free layout calls it per bucket, longest first); `distances`: each distance's row (`distance_rows`)."""
        table = self.pos_dropout(relative_embeddings)
        projected: dict[str, tuple[int, int, Tensor]] = {}

        def rows(name: str, projection: nn.Linear, low: int, high: int) -> Tensor:
            cached = projected.get(name)
            if cached is None or not cached[0] <= low < high <= cached[1]:
                split = projection(table[low:high]).view(high - low, self.num_heads, self.head_size).transpose(0, 1)
                # Divided here, once, rather than the (query, key) terms in every call.
                cached = projected[name] = (low, high, (split / divisor).contiguous())
            start = low - cached[0]
            return cached[2][:, start : start + high - low]  # (heads, rows, head_size)

        def term(query: Tensor, key: Tensor, query_positions: Tensor, key_positions: Tensor) -> Tensor:
            shift = (distances.shape[0] - 1) // 2  # distance 0's place in `distances`
            relative = query_positions[..., :, None] - key_positions[..., None, :]
            index = distances[relative + shift]  # (batch or 1, query, key)
            if _traced():  # no data-dependent slice in a graph that serves every length
                low, high = 0, table.shape[0]
            else:
                low, high = int(index.min()), int(index.max()) + 1
            index = (index - low)[:, None]
            score = None
            if "c2p" in self.terms:
                keys = rows("c2p", self.key_proj if self.share_att_key else self.pos_key_proj, low, high)
                c2p = _per_head(query, keys)  # (batch, heads, query, rows)
                score = torch.gather(c2p, -1, index.expand(*c2p.shape[:-1], index.shape[-1]))
            if "p2c" in self.terms:
                queries = rows("p2c", self.query_proj if self.share_att_key else self.pos_query_proj, low, high)
                p2c = _per_head(key, queries)  # (batch, heads, key, rows)
                by_key = index.transpose(-1, -2)
                p2c = torch.gather(p2c, -1, by_key.expand(*p2c.shape[:-1], by_key.shape[-1])).transpose(-1, -2)
                score = p2c if score is None else score + p2c
            return score

        return term


class DebertaV2Attention(BertAttention):
    """`attention`: `self` (disentangled) and `output` (dense, residual, LayerNorm) as BERT's."""

    def __init__(self, config: DebertaV2Config) -> None:
        nn.Module.__init__(self)
        self.self = DisentangledSelfAttention(config)
        self.output = BertResidualOutput(config, input_size=config.hidden_size)


class DebertaV2Layer(BertLayer):
    """BERT's layer around disentangled attention."""

    attention_class = DebertaV2Attention


class ConvLayer(nn.Module):
    """`encoder.conv` (DeBERTa-v2's xlarge / xxlarge): a 1-D convolution over the embeddings' output along each
    sequence, pads read as zeros, added to layer 0's output before a LayerNorm."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        size = config.conv_kernel_size
        self.conv = nn.Conv1d(
            config.hidden_size, config.hidden_size, size, padding=(size - 1) // 2, groups=config.conv_groups
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.activation = ACTIVATIONS[config.conv_act]

    def forward(self, hidden_states: Tensor, embedded: Tensor, batch: PaddedBatch | PackedBatch) -> Tensor:
        packed = isinstance(batch, PackedBatch)
        rows = batch.unpack(embedded) if packed else embedded  # (batch, sequence, hidden), pads zero
        convolved = self.conv(rows.transpose(1, 2)).transpose(1, 2)
        token_mask = context_of(batch).token_mask
        if packed:
            convolved = batch.pack(convolved)
        elif token_mask is not None:
            convolved = convolved.masked_fill(~token_mask[..., None], 0.0)
        output = self.LayerNorm(hidden_states + self.activation(self.dropout(convolved)))
        if token_mask is not None:
            output = output * token_mask[..., None].to(output.dtype)
        return output


class DebertaV2Encoder(LayerStack):
    """`encoder`: the layers, the relative embeddings they share (`rel_embeddings`, normalised by `LayerNorm` with
    `norm_rel_ebd` "layer_norm") and the convolution after layer 0 (`conv`)."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__(config, nn.ModuleList(DebertaV2Layer(config) for _ in range(config.num_hidden_layers)))
        if config.relative_attention:
            self.rel_embeddings = nn.Embedding(2 * config.relative_span, config.hidden_size)
        self.normalized = config.relative_attention and "layer_norm" in config.relative_norms
        if "layer_norm" in config.relative_norms:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.conv = ConvLayer(config) if config.conv_kernel_size > 0 else None

    def relative_embeddings(self) -> Tensor | None:
        """The table every layer's relative terms read, once per forward; None without relative attention."""
        if "rel_embeddings" not in self._modules:
            return None
        table = self.rel_embeddings.weight
        return self.LayerNorm(table) if self.normalized else table


class DebertaV2PreTrainedModel(BertPreTrainedModel):
    """What every DeBERTa class declares."""

    config_class: ClassVar[type[EncoderConfig]] = DebertaV2Config
    base_model_prefix: ClassVar[str] = "deberta"


def _per_head(states: Tensor, rows: Tensor) -> Tensor:
    """(batch, heads, length, head_size) x (heads, rows, head_size) -> (batch, heads, length, rows): one product per
    head, over every row of the batch at once, reading `states` where its heads were split by a view (no copy)."""
    batch, heads, length, size = states.shape
    flat = states.transpose(0, 1).reshape(heads, batch * length, size)
    return torch.bmm(flat, rows.transpose(-1, -2)).view(heads, batch, length, -1).transpose(0, 1)


def _rows_of(term, token_mask: Tensor):
    """`term` with the rows of pad queries set to zero."""
    rows = token_mask[:, None, :, None]

    def masked(query: Tensor, key: Tensor, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        return term(query, key, query_positions, key_positions) * rows.to(query.dtype)

    return masked


@dataclass(frozen=True)
class DisentangledContext:
    """What DeBERTa's layers read beside the layout, once per forward."""

    # A padded batch with pads: its real tokens (batch, sequence); DeBERTa zeroes pads and masks pad queries.
    token_mask: Tensor | None = None
    relative_rows: Tensor | None = None  # the table row of each distance (`distance_rows`)
    # The normalised relative table (`DebertaV2Encoder.relative_embeddings`), computed by each layer that reads it:
    # no graph shared between layers, which checkpointing's reentrant variant could not run backward through.
    relative_table: Callable[[], Tensor] | None = None


NO_CONTEXT = DisentangledContext()


@dataclass
class DisentangledPaddedBatch(PaddedBatch):
    """A padded layout that carries DeBERTa's context (`deberta`) through the copies made of it (`replace`: the
    attention bias, and checkpointing, which rebuilds the batch inside each layer)."""

    deberta: DisentangledContext = NO_CONTEXT


def with_context(batch: PaddedBatch | PackedBatch, context: DisentangledContext) -> PaddedBatch | PackedBatch:
    """`batch` carrying `context`. A padded layout becomes a `DisentangledPaddedBatch`; a padding-free one, whose own
    copies keep every attribute, a copy with the attribute."""
    if isinstance(batch, PaddedBatch):
        values = {field.name: getattr(batch, field.name) for field in fields(PaddedBatch)}
        return DisentangledPaddedBatch(**values, deberta=context)
    carried = copy.copy(batch)
    carried.deberta = context
    return carried


def context_of(batch: PaddedBatch | PackedBatch) -> DisentangledContext:
    return getattr(batch, "deberta", NO_CONTEXT)


class DebertaV2Model(DebertaV2PreTrainedModel, EncoderModel):
    """The DeBERTa-v2 encoder; a drop-in for `transformers.DebertaV2Model` (same state dict keys, forward arguments
    and outputs: no pooler output). `EncoderModel`'s forward: "sdpa" (default) or "eager" attention, attention maps
    through eager, padding-free in eval mode for right-padded batches (pad positions of the outputs are then zeros
    unless `padding_free=False`). `token_type_ids` are ignored without token-type embeddings (`type_vocab_size` 0,
    every published checkpoint), as transformers ignores the ones DeBERTa's tokenizer gives for sentence pairs."""

    def __init__(
        self,
        config: DebertaV2Config,
        add_pooling_layer: bool = False,
        attn_implementation: str | None = None,
        padding_free: bool = True,
    ) -> None:
        """`add_pooling_layer` is BertModel's argument, taken so that the tools build every member alike, and has no
        effect: DeBERTa's pooler (`pooler.`, a ContextPooler) belongs to its classifiers, not to the encoder, which
        returns no pooler output (as transformers' has none)."""
        super().__init__(config, attn_implementation, padding_free)
        config = self.config
        self.embeddings = DebertaV2Embeddings(config)
        self.encoder = DebertaV2Encoder(config)
        self.pooler = None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BertModelOutput | tuple[Tensor, ...]:
        """Run the encoder; `attention_mask` (batch, sequence) is 1 for real tokens and 0 for padding."""
        if self.embeddings.token_type_embeddings is None:
            token_type_ids = None  # DeBERTa's tokenizer gives segment ids; without a table they mean nothing
        return self.run(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            output_attentions,
            output_hidden_states,
            return_dict,
        )

    def layout(self, attention_mask: Tensor | None, output_attentions: bool) -> PaddedBatch | PackedBatch:
        """`EncoderModel.layout`; a padded batch with pads also carries the mask itself (`token_mask`): DeBERTa zeroes
        pads in its embeddings and masks pad queries too."""
        batch = super().layout(attention_mask, output_attentions)
        padded = isinstance(batch, PaddedBatch) and batch.key_mask is not None
        return with_context(batch, DisentangledContext(token_mask=attention_mask != 0 if padded else None))

    def embed(
        self,
        batch: PaddedBatch | PackedBatch,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> Tensor:
        return self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, context_of(batch).token_mask)

    def attention_context(self, batch: PaddedBatch | PackedBatch, hidden_states: Tensor) -> PaddedBatch | PackedBatch:
        """The relative embeddings every layer reads, once per forward; on a padded batch with pads, the mask of
        pairs of real query and real key as an additive bias (a pad query's row is all masked: it averages every
        value, as in transformers, and in sdpa as in eager)."""
        context = context_of(batch)
        columns = batch.shape[1] if isinstance(batch, PackedBatch) else hidden_states.shape[1]
        if context.token_mask is not None:
            pairs = context.token_mask[:, None, :, None] & context.token_mask[:, None, None, :]
            zeros = hidden_states.new_zeros(1, 1, columns, columns)
            batch = replace(batch, key_mask=pairs).with_attention_bias(zeros)
        if not self.config.relative_attention:
            return batch
        rows = distance_rows(columns, self.config, hidden_states.device)
        return with_context(
            batch, replace(context, relative_rows=rows, relative_table=self.encoder.relative_embeddings)
        )

    def after_layer(
        self, index: int, hidden_states: Tensor, embedded: Tensor, batch: PaddedBatch | PackedBatch
    ) -> Tensor:
        if index == 0 and self.encoder.conv is not None:
            return self.encoder.conv(hidden_states, embedded, batch)
        return hidden_states


# -- the task models --------------------------------------------------------------------------------------------------
class _DebertaV2Family:
    """What every DeBERTa task model declares: its config class, its encoder and where its tensors live."""

    config_class: ClassVar[type[EncoderConfig]] = DebertaV2Config
    backbone_class: ClassVar[type[EncoderModel]] = DebertaV2Model
    base_model_prefix: ClassVar[str] = "deberta"

    def classifier_dropout(self) -> nn.Dropout:
        """`cls_dropout`, else `hidden_dropout_prob`, as transformers' DeBERTa classifiers read it."""
        probability = self.config.cls_dropout
        return nn.Dropout(self.config.hidden_dropout_prob if probability is None else probability)


class LegacyPredictionTransform(nn.Module):
    """`cls.predictions.transform`: dense to `embedding_size` -> `hidden_act` -> LayerNorm."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.LayerNorm(self.activation(self.dense(hidden_states)))


class LegacyPredictionHead(nn.Module):
    """`cls.predictions` (transformers' default, `legacy`): BERT's head, `embedding_size` wide; its decoder is tied to
    the word embeddings and its bias to `bias`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.transform = LegacyPredictionTransform(config)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden_states))


class LegacyMaskedLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.predictions = LegacyPredictionHead(config)


class EnhancedPredictionHead(nn.Module):
    """`lm_predictions.lm_head` (`legacy` false, DeBERTa's own head): dense -> `hidden_act` -> LayerNorm, then the
    word embeddings transposed, plus `bias`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden_states: Tensor, word_embeddings: nn.Embedding) -> Tensor:
        hidden_states = self.LayerNorm(self.activation(self.dense(hidden_states)))
        return torch.matmul(hidden_states, word_embeddings.weight.t()) + self.bias


class EnhancedMaskedLMHead(nn.Module):
    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.lm_head = EnhancedPredictionHead(config)


class EnhancedVocabularyLogits(nn.Module):
    """The enhanced head as a module of hidden states alone (what every masked LM gives as `prediction_head`); it
    owns no weights and is no submodule: each call reads the model's current head and word embeddings."""

    def __init__(self, model: DebertaV2ForMaskedLM) -> None:
        super().__init__()
        object.__setattr__(self, "_model", model)  # a plain reference: registering it would make a module cycle

    @property
    def decoder(self) -> nn.Module:
        return self._model.get_output_embeddings()

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self._model.lm_predictions.lm_head(hidden_states, self._model.get_input_embeddings())


class DebertaV2ForMaskedLM(_DebertaV2Family, BertForMaskedLM):
    """`cls.predictions` with `legacy` (transformers' default), else `lm_predictions.lm_head`; BERT's loss."""

    heads = (MLM_LEGACY_HEAD,)  # transformers' default; a model with `legacy` false has `lm_predictions.` instead

    def build_heads(self, config: DebertaV2Config) -> None:
        self.heads = (MLM_LEGACY_HEAD,) if config.legacy else (MLM_HEAD,)
        if config.legacy:
            self.cls = LegacyMaskedLMHead(config)
        else:
            self.lm_predictions = EnhancedMaskedLMHead(config)
            object.__setattr__(self, "_vocabulary_logits", EnhancedVocabularyLogits(self))

    @property
    def prediction_head(self) -> nn.Module:
        return self.cls.predictions if self.config.legacy else self._vocabulary_logits

    def get_output_embeddings(self) -> nn.Module:
        """As transformers: the decoder, or in the enhanced head its `dense`."""
        return self.cls.predictions.decoder if self.config.legacy else self.lm_predictions.lm_head.dense

    def tied_weights(self) -> dict[str, str]:
        """The legacy head's ties (BERT's); the enhanced head reads the word embeddings and ties nothing."""
        return super().tied_weights() if self.config.legacy else {}

    def resize_output_layer(self, new_num_tokens: int, mean_resizing: bool) -> None:
        if self.config.legacy:
            return super().resize_output_layer(new_num_tokens, mean_resizing)
        head = self.lm_predictions.lm_head
        head.bias = nn.Parameter(resized_rows(head.bias, new_num_tokens, mean_resizing, std=0.0))


class DebertaV2ContextPooler(nn.Module):
    """`pooler`: the first token -> dropout (`pooler_dropout`) -> dense -> `pooler_hidden_act`."""

    def __init__(self, config: DebertaV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.pooler_hidden_size, config.pooler_hidden_size)
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.activation = ACTIVATIONS[config.pooler_hidden_act]

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.activation(self.dense(self.dropout(hidden_states[:, 0])))


class DebertaV2ForSequenceClassification(_DebertaV2Family, BertForSequenceClassification):
    """`pooler` -> dropout -> `classifier`; with no `problem_type`, DeBERTa's own loss rules (`deberta_loss`)."""

    heads = (POOLER_HEAD, "classifier.")
    pooling = False

    def build_heads(self, config: DebertaV2Config) -> None:
        self.num_labels = config.num_labels
        self.pooler = DebertaV2ContextPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.dropout = self.classifier_dropout()

    def classify(self, encoded: Any) -> Tensor:
        return self.classifier(self.dropout(self.pooler(encoded.last_hidden_state)))

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        return deberta_loss(self.config, self.num_labels, logits, labels)


def deberta_loss(config: DebertaV2Config, num_labels: int, logits: Tensor, labels: Tensor) -> Tensor:
    """transformers' DeBERTa sequence-classification loss. A `problem_type` picks BERT's loss; without one: one label,
    mean squared error; one label per row, cross-entropy over the rows whose label is >= 0 (zero with none); a
    distribution per row, soft cross-entropy."""
    problem = config.problem_type
    if problem == "regression":
        return F.mse_loss(logits.squeeze(), labels.squeeze()) if num_labels == 1 else F.mse_loss(logits, labels)
    if problem == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), class_labels("labels", labels, num_labels, len(logits)))
    if problem == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels)
    if num_labels == 1:
        return F.mse_loss(logits.view(-1).to(labels.dtype), labels.view(-1))
    if labels.dim() == 1 or labels.size(-1) == 1:
        labels = labels.view(-1)
        kept = labels >= 0
        if not bool(kept.any()):
            return logits.new_zeros(())
        labels = class_labels("labels", labels[kept].long(), num_labels, int(kept.sum()))
        return F.cross_entropy(logits[kept].view(-1, num_labels).float(), labels)
    return -(F.log_softmax(logits, dim=-1) * labels).sum(-1).mean()


class DebertaV2ForTokenClassification(_DebertaV2Family, BertForTokenClassification):
    """BERT's token classification, dropping out with `hidden_dropout_prob`."""

    def classifier_dropout(self) -> nn.Dropout:
        return nn.Dropout(self.config.hidden_dropout_prob)


class DebertaV2ForQuestionAnswering(_DebertaV2Family, BertForQuestionAnswering):
    """BERT's question answering (`qa_outputs`); pads take part in the loss, so the encoder runs padded."""


class DebertaV2ForMultipleChoice(_DebertaV2Family, BertForMultipleChoice):
    """`pooler` -> dropout -> `classifier` (one logit per choice)."""

    heads = (POOLER_HEAD, "classifier.")
    pooling = False

    def build_heads(self, config: DebertaV2Config) -> None:
        self.pooler = DebertaV2ContextPooler(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.dropout = self.classifier_dropout()

    def choice_scores(self, encoded: Any) -> Tensor:
        return self.classifier(self.dropout(self.pooler(encoded.last_hidden_state)))
