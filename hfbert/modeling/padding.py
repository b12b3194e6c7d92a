"""Batch layouts for the encoder: padded (`PaddedBatch`) and padding-free (`PackedBatch`).

Every Linear, LayerNorm and activation in BERT works token by token, so in a padded batch the work spent on pad
positions is pure waste: a batch of sentences of mixed lengths is often more than half padding. `PackedBatch`
packs the real tokens of a batch into one (tokens, hidden) tensor before the encoder, runs every layer on those
tokens only, and scatters the result back once at the end. Attention, the only step that mixes tokens, runs per
sequence: sequences of similar length are gathered into small padded buckets (at most a quarter padding each)
and attended with the same kernels as the padded path.

Both layouts expose the same four steps (`embedding_inputs`, `attend`, `unpack`, and the kernel name they
attend with), so the layers do not know which one they run on; `batch_layout` picks the layout of a call.

A layout also carries the attention context of one forward, computed once and read by every layer:
- an additive bias over column positions (MPNet's relative-position bias, `with_attention_bias`): a bucket's
  sequences all start at column 0, so its bias is the top-left corner of the padded batch's. The key mask is folded
  into the bias there, once per forward, not in every layer;
- position ids in the layout's own token order (`with_positions`: (batch, sequence) padded, (tokens,) packed), for
  a scheme that acts inside attention (rotary embeddings rotate each token's query and key by its position, token
  by token, so the packed order serves the buckets as it is);
- the rotary tables of those positions (`rotary_tables`), computed by the first layer that asks for a base and
  dtype and read by every later one (ModernBERT's layers use two bases: one table pair each per forward);
- a window, per layer and per call of `attend` (`window=w`: a query attends the keys at most `w` columns away, both
  bounds included), for layers of local attention; a long sequence then runs as a band (`local_attention.py`);
- a score term, per call of `attend` (`score_term=term`): `term(query, key, query_positions, key_positions)`, a
  function of the split queries and keys (batch, heads, length, head_size) and their position ids (the layout's,
  else the column index; per bucket on the packed layout), whose (batch, heads, query, key) result is added to the
  scaled scores before the softmax (a term of query and key together, as DeBERTa's disentangled attention has).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from hfbert.modeling import rotary
from hfbert.modeling.attention import multi_head_attention
from hfbert.modeling.local_attention import banded_attention

# term(query, key, query_positions, key_positions) -> (batch, heads, query, key), added to the scaled scores.
ScoreTerm = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]

# A bucket holds sequences at least this fraction as long as its longest, bounding the padding inside it.
BUCKET_FILL = 0.75
# A windowed attention runs as a band past this many windows of length: below, the dense kernel on the masked
# square is as fast (docs/cpu-inference.md, "Thresholds": where it was measured).
BAND_FROM = 12


def batch_layout(attention_mask: Tensor | None, implementation: str, padding_free: bool) -> PaddedBatch | PackedBatch:
    """The layout one forward runs on. Unmasked when there is no padding (as in transformers, the kernels then get
    no mask at all); padding-free (`PackedBatch`) where `runs_padding_free`; else padded. While tracing
    (torch.compile / export / jit) the mask is not inspected: the padded path has no data-dependent shapes.
    Wherever padding-free runs are allowed, every right-padded row's pads come out zero on every layout
    (`zeroed_pads`): a row's outputs are the same alone, beside rows with holes, and in a traced graph."""
    if attention_mask is None:
        return PaddedBatch(None, implementation)
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return PaddedBatch(
            key_padding_mask(attention_mask), implementation, zeroed=zeroed_pads(attention_mask, padding_free)
        )
    if bool((attention_mask != 0).all()):
        return PaddedBatch(None, implementation)
    if runs_padding_free(attention_mask, padding_free):
        return PackedBatch(attention_mask, implementation)
    # Another row has holes or left padding: the batch runs padded, and the right-padded rows still get the zeros
    # they get alone, so that no row's output depends on what it was batched with.
    return PaddedBatch(
        key_padding_mask(attention_mask), implementation, zeroed=zeroed_pads(attention_mask, padding_free)
    )


def runs_padding_free(attention_mask: Tensor | None, padding_free: bool) -> bool:
    """Whether a forward with this mask runs padding-free: the caller allows it (`padding_free`: inference with no
    attention maps asked), the batch has padding, and it is right padding, every row's real tokens one run from the
    first column (the pooler reads that column; packing a row with holes would close them up, and MPNet's relative
    positions count columns). Other masks (left padding, holes) run padded, as transformers computes them."""
    if attention_mask is None or not padding_free:
        return False
    real = attention_mask != 0
    return not bool(real.all()) and bool(_right_padded(real))


def _right_padded(real: Tensor) -> Tensor:
    """A 0-dim bool tensor: every row of `real` (batch, sequence) is a run of True from column 0, then False."""
    return _right_padded_rows(real).all()


def _right_padded_rows(real: Tensor) -> Tensor:
    """(batch,) bool: each row of `real` (batch, sequence) is a run of True from column 0, then False."""
    # Compared with each row's prefix of its length, not column with column: slices one column shorter would make
    # torch.export specialise a sequence of 2 (its size-1 slices broadcast).
    lengths = real.sum(dim=1, keepdim=True)
    prefix = torch.arange(real.shape[1], device=real.device)[None, :] < lengths
    return real[:, 0] & (real == prefix).all(dim=1)


def zeroed_pads(attention_mask: Tensor | None, padding_free: bool) -> Tensor | None:
    """(batch, sequence, 1) bool, True at the positions whose outputs are zero: the pads of every right-padded row
    (the rows a padding-free run drops), decided row by row so that it does not depend on the other rows; None
    where padding-free runs are not allowed (`padding_free` False: training, attention maps, or the user's choice)
    or there is no mask. Rows with holes or left padding keep the values transformers computes at their pads.
    Tensor operations only, so that a traced graph computes it for every mask."""
    if attention_mask is None or not padding_free:
        return None
    real = attention_mask != 0
    return (~real & _right_padded_rows(real)[:, None])[:, :, None]


def key_padding_mask(attention_mask: Tensor) -> Tensor:
    """(batch, sequence) 0/1 mask -> boolean (batch, 1, 1, sequence), True where a key may be attended."""
    key_mask = (attention_mask != 0)[:, None, None, :]
    # A row with no real token at all attends to every position instead of to nothing: a defined output
    # (never NaN) that is the same in both attention implementations.
    return key_mask | ~key_mask.any(dim=-1, keepdim=True)


def window_mask(length: int, window: int, device: torch.device | None = None) -> Tensor:
    """(length, length) bool, True where key column j is at most `window` columns from query column i.

    >>> window_mask(4, 1).int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    columns = torch.arange(length, device=device)
    return (columns[None, :] - columns[:, None]).abs() <= window


def windowed(key_mask: Tensor | None, bias: Tensor | None, length: int, window: int | None, device: torch.device):
    """The key mask and bias of one attention call with a window applied: folded into the bias where there is one
    (its key mask is already in it), else into the mask. A pad query whose window holds only pads is then left to
    each kernel's own rule, as in transformers: equal weights everywhere in eager, a zero context in sdpa."""
    if window is None:
        return key_mask, bias
    band = window_mask(length, window, device)
    if bias is not None:
        return None, bias.masked_fill(~band, torch.finfo(bias.dtype).min)
    return (band if key_mask is None else key_mask & band), None


def as_band(length: int, window: int | None, implementation: str, bias: Tensor | None) -> bool:
    """Whether a windowed attention call runs as a band (`local_attention.py`: cost length x window): with the sdpa
    kernel (eager computes the attention maps), no additive bias, and a sequence long enough for the band to pay
    (`BAND_FROM` windows). The result is the dense computation's either way, to the order of floating-point sums.
    Never in a graph traced or exported for later calls (jit.trace, torch.export, the ONNX exporters): that graph
    serves every length, and the choice would be baked in at the example's; torch.compile keeps the band."""
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        return False
    return window is not None and implementation == "sdpa" and bias is None and length > BAND_FROM * window


def masked_bias(bias: Tensor, key_mask: Tensor | None) -> Tensor:
    """An additive attention bias with the key mask folded in: the dtype's lowest finite value where a key may not be
    attended (as the eager kernel's masked_fill), so that one tensor does both jobs in every layer."""
    if key_mask is None:
        return bias
    return bias.masked_fill(~key_mask, torch.finfo(bias.dtype).min)


class _RotaryTables:
    """What both layouts share for rotary attention: the tables of their positions, computed on the first request of
    a forward for a head size, base and dtype, so that every layer of the same base reads the same pair."""

    positions: Tensor | None
    tables: dict

    def rotary_tables(self, head_size: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos and sin of the layout's positions (`rotary.rotary_tables`), computed once per forward and base."""
        if self.positions is None:
            raise ValueError("rotary_tables needs the layout's position ids: call with_positions first")
        key = (head_size, float(theta), dtype)
        if key not in self.tables:
            self.tables[key] = rotary.rotary_tables(self.positions, head_size, theta, dtype)
        return self.tables[key]


def bound_score_term(
    score_term: ScoreTerm | None, positions: Tensor | None, length: int, device: torch.device
) -> Callable[[Tensor, Tensor], Tensor] | None:
    """`score_term` with the query and key positions of one attention call filled in (self-attention: the same):
    `positions` (batch or 1, length), else the column index."""
    if score_term is None:
        return None
    if positions is None:
        positions = torch.arange(length, device=device)[None]
    return lambda query, key: score_term(query, key, positions, positions)


@dataclass
class PaddedBatch(_RotaryTables):
    """The dense layout: (batch, sequence, hidden) with a boolean key mask (batch, 1, 1, sequence) or None."""

    key_mask: Tensor | None
    implementation: str  # the attention kernel, "sdpa" or "eager"
    attention_bias: Tensor | None = None  # (1, heads, sequence, sequence), added to every row's scores
    zeroed: Tensor | None = None  # (batch, sequence, 1) bool: positions `unpack` sets to zero (`zeroed_pads`)
    positions: Tensor | None = None  # position ids (batch or 1, sequence), for attention that reads them
    tables: dict = field(default_factory=dict, repr=False)  # rotary tables of `positions`, by head size, base, dtype

    def embedding_inputs(self, *inputs: Tensor | None) -> tuple[Tensor | None, ...]:
        return inputs

    def with_attention_bias(self, bias: Tensor) -> PaddedBatch:
        """This layout with `bias` (1, heads, sequence, sequence) added to the scores, the key mask folded in."""
        return replace(self, key_mask=None, attention_bias=masked_bias(bias, self.key_mask))

    def with_positions(self, position_ids: Tensor) -> PaddedBatch:
        """This layout with the call's position ids, (sequence,) or (batch, sequence), for attention to read."""
        return replace(self, positions=position_ids if position_ids.dim() == 2 else position_ids[None], tables={})

    def attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        window: int | None = None,
        score_term: ScoreTerm | None = None,
        **options,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention over (batch, sequence, hidden) projections; `window`: keys at most that many columns away;
        `score_term`: a term of queries and keys added to the scores (`ScoreTerm`), at the layout's positions."""
        length = query.shape[1]
        if score_term is None and as_band(length, window, self.implementation, self.attention_bias):
            return banded_attention(query, key, value, self.key_mask, window, **options), None
        key_mask, bias = windowed(self.key_mask, self.attention_bias, length, window, query.device)
        return multi_head_attention(
            query,
            key,
            value,
            key_mask,
            implementation=self.implementation,
            bias=bias,
            score_term=bound_score_term(score_term, self.positions, length, query.device),
            **options,
        )

    def unpack(self, hidden_states: Tensor) -> Tensor:
        if self.zeroed is None:
            return hidden_states
        return hidden_states.masked_fill(self.zeroed, 0.0)


@dataclass
class _Bucket:
    gather: Tensor  # (sequences, longest): packed row of each position (0 at pad positions)
    key_mask: Tensor | None  # (sequences, 1, 1, longest), None when all sequences have the same length
    real: Tensor  # (sequences, longest) bool


class PackedBatch(_RotaryTables):
    """The real tokens of a padded batch as one (tokens, ...) tensor, in row-major order.

    >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> packed = PackedBatch(mask)
    >>> packed.pack(torch.arange(6).view(2, 3)).tolist()
    [0, 1, 2, 3, 4]
    """

    bucket_biases: tuple[Tensor, ...] | None = None  # each bucket's attention bias, its key mask folded in
    positions: Tensor | None = None  # (tokens,) position ids in packed order, for attention that reads them
    tables: dict  # rotary tables of `positions`, by head size, base and dtype

    def __init__(self, attention_mask: Tensor, implementation: str = "sdpa") -> None:
        self.implementation = implementation
        self.tables = {}
        real = attention_mask != 0
        self.shape = tuple(real.shape)
        self.token_index = real.flatten().nonzero().squeeze(1)
        lengths = real.sum(dim=1)
        starts = lengths.cumsum(0) - lengths
        self.buckets = []
        rows_in_bucket_order = []
        for members in _length_buckets(lengths.tolist()):
            member_index = torch.tensor(members, device=real.device)
            member_lengths, member_starts = lengths[member_index], starts[member_index]
            longest = int(member_lengths.max())
            offsets = torch.arange(longest, device=real.device)
            in_sequence = offsets[None, :] < member_lengths[:, None]
            gather = torch.where(in_sequence, member_starts[:, None] + offsets[None, :], 0)
            uniform = bool(in_sequence.all())
            key_mask = None if uniform else in_sequence[:, None, None, :]
            self.buckets.append(_Bucket(gather, key_mask, in_sequence))
            rows_in_bucket_order.append(gather[in_sequence])
        # Attention outputs come bucket by bucket; this permutation puts them back in packed order.
        self.restore = torch.argsort(torch.cat(rows_in_bucket_order))

    def pack(self, padded: Tensor) -> Tensor:
        """(batch, sequence, ...) -> (tokens, ...)."""
        return padded.flatten(0, 1)[self.token_index]

    def embedding_inputs(
        self,
        input_ids: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        inputs_embeds: Tensor | None,
    ) -> tuple[Tensor | None, ...]:
        """The embeddings' inputs, packed; positions default to the column index, as in the padded computation."""
        if position_ids is None:
            position_ids = torch.arange(self.shape[1], device=self.token_index.device)
        position_ids = position_ids.expand(self.shape)
        inputs = (input_ids, token_type_ids, position_ids, inputs_embeds)
        return tuple(None if tensor is None else self.pack(tensor) for tensor in inputs)

    def with_attention_bias(self, bias: Tensor) -> PackedBatch:
        """This layout with `bias` (1, heads, sequence, sequence), over the padded batch's columns, added to the
        scores: each bucket takes its top-left corner."""
        biased = copy.copy(self)
        biased.bucket_biases = tuple(
            masked_bias(bias[..., : bucket.real.shape[1], : bucket.real.shape[1]], bucket.key_mask)
            for bucket in self.buckets
        )
        return biased

    def with_positions(self, position_ids: Tensor) -> PackedBatch:
        """This layout with the call's position ids ((sequence,) or (batch, sequence), counted on the padded rows),
        packed into token order for attention to read."""
        positioned = copy.copy(self)
        positioned.positions = self.pack(position_ids.expand(self.shape))
        positioned.tables = {}
        return positioned

    def unpack(self, packed: Tensor) -> Tensor:
        """(tokens, ...) -> (batch, sequence, ...), zeros at pad positions."""
        batch, sequence = self.shape
        padded = packed.new_zeros(batch * sequence, *packed.shape[1:])
        padded = padded.index_copy(0, self.token_index, packed)
        return padded.view(batch, sequence, *packed.shape[1:])

    def attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        window: int | None = None,
        score_term: ScoreTerm | None = None,
        **options,
    ) -> tuple[Tensor, None]:
        """Attention over (tokens, hidden) projections, bucket by bucket; `window` and `score_term` as
        `PaddedBatch.attend`, the term called per bucket with the bucket's positions."""
        outputs = []
        for index, bucket in enumerate(self.buckets):
            bias = None if self.bucket_biases is None else self.bucket_biases[index]
            key_mask = bucket.key_mask if bias is None else None
            inputs = query[bucket.gather], key[bucket.gather], value[bucket.gather]
            length = bucket.real.shape[1]
            if score_term is None and as_band(length, window, self.implementation, bias):
                context = banded_attention(*inputs, key_mask, window, **options)
            else:
                key_mask, bias = windowed(key_mask, bias, length, window, query.device)
                # A bucket's sequences start at its column 0, so the column index serves when there are no positions;
                # a pad slot reads some token's position, but its key is masked and its query's output dropped.
                positions = None if self.positions is None or score_term is None else self.positions[bucket.gather]
                context, _ = multi_head_attention(
                    *inputs,
                    key_mask,
                    implementation=self.implementation,
                    bias=bias,
                    score_term=bound_score_term(score_term, positions, length, query.device),
                    **options,
                )
            outputs.append(context[bucket.real])
        return torch.cat(outputs)[self.restore], None


def _length_buckets(lengths: list[int]) -> list[list[int]]:
    """Sequence indices grouped so that each group's lengths lie within BUCKET_FILL of its longest."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    buckets: list[list[int]] = []
    for index in order:
        if buckets and lengths[index] >= BUCKET_FILL * lengths[buckets[-1][0]]:
            buckets[-1].append(index)
        else:
            buckets.append([index])
    return buckets
