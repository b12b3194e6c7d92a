"""all-mpnet-base-v2 with its real weights (the `real_mpnet` fixture, read-only): hfbert's MPNetModel against
transformers' on real texts of mixed lengths in one right-padded batch, element-wise and against float64 (issue #42).

Four of the sixteen texts run well past 128 tokens, so the relative-position bias reaches its last, shared bucket.
Both tests are slow (a base model in float64 on the CPU): `pytest -m slow tests/test_mpnet_real.py`.
"""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import Accuracy, max_difference, parity_texts

transformers = pytest.importorskip("transformers")


def texts() -> list[str]:
    """Twelve sentences of the parity battery and four paragraphs of twelve of them each (about 180 tokens)."""
    battery = parity_texts(42)
    return battery[:12] + [" ".join(battery[start : start + 12]) for start in (12, 18, 24, 30)]


@pytest.fixture(scope="module")
def real_batch(real_mpnet) -> dict[str, torch.Tensor]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(real_mpnet)
    inputs = dict(tokenizer(texts(), padding=True, return_tensors="pt"))
    lengths = inputs["attention_mask"].sum(dim=1)
    assert int(lengths.max()) > 129 and int(lengths.min()) < 20, lengths  # mixed, past the last bucket's distance
    return inputs


@pytest.fixture(scope="module")
def transformers_outputs(real_mpnet, real_batch):
    """transformers' MPNetModel in float32 and in float64 on the batch: (fp32 outputs, fp64 outputs)."""
    reference = transformers.MPNetModel.from_pretrained(real_mpnet).eval()
    with torch.no_grad():
        fp32 = reference(**real_batch)
        fp64 = reference.double()(**real_batch)
    return fp32, fp64


@pytest.mark.slow
def test_real_weights_equal_transformers_at_every_real_position(real_mpnet, real_batch, transformers_outputs):
    model, info = hfbert.MPNetModel.from_pretrained(real_mpnet, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"]) == (set(), set())
    expected, _ = transformers_outputs
    real = real_batch["attention_mask"].bool()
    with torch.no_grad():
        actual = model(**real_batch)
    assert max_difference(actual.last_hidden_state, expected.last_hidden_state, real) < 1e-5
    assert max_difference(actual.pooler_output, expected.pooler_output) < 1e-5


@pytest.mark.slow
def test_real_weights_as_accurate_as_transformers_against_float64(real_mpnet, real_batch, transformers_outputs):
    """hfbert's float32 error against transformers' float64 at most 1.5x transformers' own float32 error (RMS over
    real positions); hfbert in float64 equal to transformers in float64 to float64's rounding."""
    theirs, exact = transformers_outputs
    real = real_batch["attention_mask"].bool()
    model = hfbert.MPNetModel.from_pretrained(real_mpnet)
    with torch.no_grad():
        ours = model(**real_batch)
        ours64 = model.double()(**real_batch)
    hidden = Accuracy().add(ours.last_hidden_state, theirs.last_hidden_state, exact.last_hidden_state, real)
    assert hidden.passed(), hidden
    pooled = Accuracy().add(ours.pooler_output, theirs.pooler_output, exact.pooler_output)
    assert pooled.passed(), pooled
    assert max_difference(ours64.last_hidden_state, exact.last_hidden_state, real) < 1e-12
