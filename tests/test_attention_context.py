"""The attention context a batch layout carries (issue #50, step 2): position ids in the layout's token order and a
per-call window, on the padded and the padding-free layout, each checked against attention written out by hand in
float64 (a window is a band of keys at most `w` columns from the query, both bounds included, as transformers'
ModernBERT has it); and the position schemes' length limits, which the input checks ask."""

from __future__ import annotations

import pytest
import torch

import hfbert
from hfbert.modeling import local_attention, padding
from hfbert.modeling.padding import BAND_FROM, PackedBatch, PaddedBatch, key_padding_mask

HEADS, HIDDEN = 2, 8


def reference_attention(query, key, value, lengths, window):
    """Per sequence, over its real tokens only: softmax(q k^T / sqrt(d)) with keys farther than `window` removed."""
    outputs = []
    for row, length in enumerate(lengths):
        q, k, v = (t[row, :length].double().view(length, HEADS, -1).transpose(0, 1) for t in (query, key, value))
        scores = q @ k.transpose(-1, -2) * (HIDDEN // HEADS) ** -0.5
        if window is not None:
            distance = (torch.arange(length)[None, :] - torch.arange(length)[:, None]).abs()
            scores = scores.masked_fill(distance > window, float("-inf"))
        outputs.append((scores.softmax(-1) @ v).transpose(0, 1).reshape(length, HIDDEN))
    return outputs


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("window", [None, 0, 1, 3])
def test_a_window_on_either_layout_equals_attention_written_out(implementation, window):
    torch.manual_seed(0)
    lengths = [7, 5, 2]
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    query, key, value = (torch.randn(3, 7, HIDDEN) for _ in range(3))
    expected = reference_attention(query, key, value, lengths, window)
    options = dict(num_heads=HEADS, scale=(HIDDEN // HEADS) ** -0.5, dropout=0.0, window=window)

    padded, _ = PaddedBatch(key_padding_mask(mask), implementation).attend(query, key, value, **options)
    packed_batch = PackedBatch(mask, implementation)
    packed, _ = packed_batch.attend(*(packed_batch.pack(t) for t in (query, key, value)), **options)
    packed = packed_batch.unpack(packed)
    for row, length in enumerate(lengths):
        torch.testing.assert_close(padded[row, :length].double(), expected[row], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(packed[row, :length].double(), expected[row], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("side", ["right", "left", "holes", "none"])
@pytest.mark.parametrize(("window", "block"), [(1, None), (3, None), (3, 5), (4, 64)])
def test_a_long_window_runs_as_a_band_equal_to_attention_written_out(window, block, side, monkeypatch):
    """Past BAND_FROM windows the sdpa kernel runs the band (`local_attention.py`), blocks of queries against the keys
    they can see: each real query's output equals attention written out, with every padding side; lengths that are
    no multiple of the block, a block longer than the sequence."""
    torch.manual_seed(2)
    lengths, width = [61, 40, 7], 61
    assert width > BAND_FROM * window
    mask = torch.zeros((3, width), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    if side == "left":
        mask = mask.flip(1)
    elif side == "holes":  # real tokens with pads between them: the band must read the key mask, not a length
        mask[0, 10:20] = 0
    elif side == "none":  # no padding: no key mask, and the columns past the sequence must still count for nothing
        mask[:] = 1
    calls = []
    band = local_attention.banded_attention

    def counted(*arguments, **options):
        calls.append(arguments[0].shape)
        return band(*arguments, **options if block is None else {**options, "block": block})

    monkeypatch.setattr(padding, "banded_attention", counted)
    query, key, value = (torch.randn(3, width, HIDDEN) for _ in range(3))
    options = dict(num_heads=HEADS, scale=(HIDDEN // HEADS) ** -0.5, dropout=0.0, window=window)
    key_mask = None if side == "none" else key_padding_mask(mask)
    context, _ = PaddedBatch(key_mask, "sdpa").attend(query, key, value, **options)
    assert calls, "the band did not run"
    real = mask.bool()
    for row in range(3):
        columns = real[row].nonzero().flatten()
        q, k, v = (t[row].double().view(width, HEADS, -1).transpose(0, 1) for t in (query, key, value))
        scores = q @ k.transpose(-1, -2) * (HIDDEN // HEADS) ** -0.5
        distance = (torch.arange(width)[None, :] - torch.arange(width)[:, None]).abs()
        scores = scores.masked_fill((distance > window) | ~real[row][None, :], float("-inf"))
        expected = (scores.softmax(-1) @ v).transpose(0, 1).reshape(width, HIDDEN)
        torch.testing.assert_close(context[row, columns].double(), expected[columns], atol=1e-6, rtol=1e-5)


def test_a_window_also_bounds_an_attention_bias():
    """With a bias (MPNet's relative positions) the window is folded into the bias, the key mask already in it."""
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    query, key, value = (torch.randn(2, 5, HIDDEN) for _ in range(3))
    bias = torch.zeros(1, HEADS, 5, 5)
    batch = PaddedBatch(key_padding_mask(mask), "sdpa").with_attention_bias(bias)
    context, _ = batch.attend(
        query, key, value, num_heads=HEADS, scale=(HIDDEN // HEADS) ** -0.5, dropout=0.0, window=1
    )
    expected = reference_attention(query, key, value, [5, 3], window=1)
    for row, length in enumerate([5, 3]):
        torch.testing.assert_close(context[row, :length].double(), expected[row], atol=1e-6, rtol=1e-5)


def test_positions_ride_on_either_layout_in_its_token_order():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    ids = torch.tensor([[0, 9, 2, 1], [0, 2, 1, 1]])
    positions = hfbert.RobertaConfig.positions.position_ids(hfbert.RobertaConfig(), ids, None)
    assert positions.tolist() == [[2, 3, 4, 1], [2, 3, 1, 1]]  # fairseq's make_positions, padding index 1
    packed = PackedBatch(mask).with_positions(positions)
    assert packed.positions.tolist() == [2, 3, 4, 2, 3]  # the real tokens, row after row
    padded = PaddedBatch(None, "sdpa").with_positions(torch.arange(4))
    assert padded.positions.tolist() == [[0, 1, 2, 3]]


@pytest.mark.parametrize(
    ("config", "longest", "named"),
    [
        (hfbert.BertConfig(max_position_embeddings=40), 40, "max_position_embeddings = 40"),
        (hfbert.RobertaConfig(max_position_embeddings=40), 38, "38 = max_position_embeddings = 40 - pad_token_id (1)"),
        (hfbert.MPNetConfig(max_position_embeddings=40, pad_token_id=0), 38, "pad_token_id (1)"),
    ],
)
def test_the_input_check_asks_the_position_scheme_for_the_longest_input(config, longest, named):
    config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size = 1, 8, 2, 8
    model = hfbert.AutoModel.from_config(config).eval()
    assert config.max_sequence_length == longest
    model(input_ids=torch.full((1, longest), 5))
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        model(input_ids=torch.full((1, longest + 1), 5))
