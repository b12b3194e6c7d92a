"""What the batch layout carries for attention per forward (issue #65, item 6): a score term of query and key added
to the scores (`attend(score_term=...)`, the hook DeBERTa's disentangled attention needs), checked against attention
written out by hand in float64 on padded, left-padded and padding-free batches with both kernels; and ModernBERT's
rotary tables, computed once per forward and base, not once per layer."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import hfbert
from hfbert.modeling.padding import PackedBatch, PaddedBatch, key_padding_mask

from support.members import tiny_config

HEADS, HIDDEN, SPAN = 2, 8, 3
HEAD_SIZE = HIDDEN // HEADS


class RelativeTerm(torch.nn.Module):
    """A toy c2p term: per head, a learned scalar times query . embedding of the clamped relative position of the key
    (as DeBERTa's content-to-position score reads a relative-position table with the query)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(HEADS))
        self.table = torch.nn.Parameter(torch.randn(2 * SPAN + 1, HEAD_SIZE))

    def forward(self, query, key, query_positions, key_positions):
        relative = (query_positions[:, :, None] - key_positions[:, None, :]).clamp(-SPAN, SPAN) + SPAN
        embedded = self.table.to(query.dtype)[relative]  # (batch or 1, query, key, head_size)
        return self.weight.to(query.dtype)[None, :, None, None] * torch.einsum("bhqd,bqkd->bhqk", query, embedded)


def written_out(query, key, value, mask, positions, term, window):
    """softmax(q k^T / sqrt(d) + term) v per row over its real keys (and keys at most `window` columns away), in
    float64, every (batch, sequence, hidden) tensor split into heads by hand."""
    q, k, v = (t.double().view(*t.shape[:2], HEADS, HEAD_SIZE).transpose(1, 2) for t in (query, key, value))
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * HEAD_SIZE**-0.5
    with torch.no_grad():
        scores = scores + term.double()(q, k, positions, positions)
    allowed = mask.bool()[:, None, None, :]
    if window is not None:
        columns = torch.arange(mask.shape[1])
        allowed = allowed & ((columns[None, :] - columns[:, None]).abs() <= window)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v).transpose(1, 2).reshape(*query.shape)


CASES = {
    "right": [[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5],
    "left": [[1] * 7, [0] * 2 + [1] * 5, [0] * 5 + [1] * 2],
}


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize(
    ("layout", "side", "positioned"),
    [
        ("padded", "right", False),
        ("padded", "left", False),
        ("padded", "left", True),
        ("packed", "right", False),
        ("packed", "right", True),
    ],
)
def test_a_score_term_on_every_layout_equals_attention_written_out(implementation, window, layout, side, positioned):
    """The term sees the layout's positions (the columns when it carries none; per bucket when packed) and joins the
    key mask and the window in both kernels. Left padding with positions counted after the pads (as RoBERTa's) shows
    the term reads the given positions, not the columns."""
    torch.manual_seed(0)
    term = RelativeTerm()
    mask = torch.tensor(CASES[side])
    query, key, value = (torch.randn(3, 7, HIDDEN) for _ in range(3))
    columns = torch.arange(7).expand(3, 7)
    positions = (mask.cumsum(1) - 1).clamp(min=0) + 5 if positioned else columns
    expected = written_out(query, key, value, mask, positions, term, window)
    options = dict(num_heads=HEADS, scale=HEAD_SIZE**-0.5, dropout=0.0, window=window, score_term=term)

    with torch.no_grad():
        if layout == "padded":
            batch = PaddedBatch(key_padding_mask(mask), implementation)
            batch = batch.with_positions(positions) if positioned else batch
            context, _ = batch.attend(query, key, value, **options)
        else:
            batch = PackedBatch(mask, implementation)
            batch = batch.with_positions(positions) if positioned else batch
            context, _ = batch.attend(*(batch.pack(t) for t in (query, key, value)), **options)
            context = batch.unpack(context)
    real = mask.bool()
    torch.testing.assert_close(context[real].double(), expected[real], atol=1e-6, rtol=1e-5)


def test_a_score_term_gets_the_split_heads_and_gradients_reach_its_weights():
    """The term is called with (batch, heads, length, head_size) queries and keys and its parameters train."""
    torch.manual_seed(1)
    term = RelativeTerm()
    shapes = []

    def recorded(query, key, query_positions, key_positions):
        shapes.append((tuple(query.shape), tuple(key.shape), tuple(query_positions.shape)))
        return term(query, key, query_positions, key_positions)

    mask = torch.tensor([[1] * 7, [1] * 6 + [0], [1] * 2 + [0] * 5])
    batch = PackedBatch(mask, "sdpa")
    query, key, value = (batch.pack(torch.randn(3, 7, HIDDEN)) for _ in range(3))
    context, _ = batch.attend(
        query, key, value, num_heads=HEADS, scale=HEAD_SIZE**-0.5, dropout=0.0, score_term=recorded
    )
    context.sum().backward()
    # Lengths 7 and 6 share a bucket (6 >= 0.75 * 7); length 2 has its own.
    assert shapes == [
        ((2, HEADS, 7, HEAD_SIZE), (2, HEADS, 7, HEAD_SIZE), (1, 7)),
        ((1, HEADS, 2, HEAD_SIZE),) * 2 + ((1, 2),),
    ]
    assert term.weight.grad is not None and bool(term.weight.grad.abs().sum() > 0)


class CountCos(TorchFunctionMode):
    """Counts the cosines computed: ModernBERT computes them only for its rotary tables."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.cos, torch.Tensor.cos):
            self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mask", [None, [[1] * 9, [1] * 6 + [0] * 3], [[1] * 9, [0] * 3 + [1] * 6]])
def test_modernbert_computes_its_rotary_tables_once_per_forward_and_base(mask):
    """Four layers, two rotary bases (global and local): two table pairs per forward on every layout (unmasked,
    padding-free, left-padded), not one per layer; the outputs' parity with transformers is `test_modernbert.py`'s."""
    config = hfbert.ModernBertConfig(**tiny_config("modernbert", num_hidden_layers=4, global_attn_every_n_layers=2))
    model = hfbert.ModernBertModel(config).eval()
    ids = torch.randint(5, config.vocab_size, (2, 9))
    counter = CountCos()
    with torch.no_grad(), counter:
        model(input_ids=ids, attention_mask=None if mask is None else torch.tensor(mask))
    assert counter.calls == 2
