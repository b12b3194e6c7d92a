"""Numerical guarantees on the real all-MiniLM-L6-v2 weights, each anchored to transformers' output:
padding and batch invariance on both paths, no NaN/Inf in half precision with padding, thread safety."""

from __future__ import annotations

import threading

import pytest
import torch

import hfbert

from support.helpers import max_difference, minilm_directory

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street while people walk by.",
    "Short.",
    "Transformers process all tokens of a sentence in parallel, which makes them fast on modern hardware.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return hfbert.BertTokenizer.from_pretrained(minilm_directory())


@pytest.fixture(scope="module")
def reference_embeddings(tokenizer):
    """transformers' last hidden state of each text encoded alone (no padding at all)."""
    import transformers

    reference = transformers.BertModel.from_pretrained(minilm_directory()).eval()
    with torch.no_grad():
        return [reference(**tokenizer(text, return_tensors="pt")).last_hidden_state[0] for text in TEXTS]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("batch_size", [1, 8, 64])
@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
def test_same_text_same_embedding_in_any_batch(batch_size, padding_side, padding_free, tokenizer, reference_embeddings):
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    model.padding_free = padding_free
    texts = [TEXTS[index % len(TEXTS)] for index in range(batch_size)]
    batch = tokenizer(texts, padding=True, padding_side=padding_side, return_tensors="pt")
    real = batch["attention_mask"].bool()
    # With left padding, positions are given so that every text starts at position 0 as when encoded alone.
    position_ids = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0) if padding_side == "left" else None
    with torch.no_grad():
        output = model(**batch, position_ids=position_ids).last_hidden_state
    for row in range(batch_size):
        expected = reference_embeddings[row % len(TEXTS)]
        assert max_difference(output[row][real[row]], expected) <= 1e-5, row


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
def test_half_precision_with_padding_is_finite(dtype, implementation, padding_free, tokenizer):
    model = hfbert.BertModel.from_pretrained(minilm_directory(), dtype=dtype, attn_implementation=implementation)
    model.padding_free = padding_free
    for padding_side in ("right", "left"):
        batch = tokenizer(TEXTS + [""], padding=True, padding_side=padding_side, return_tensors="pt")
        batch["attention_mask"][-1] = 0  # and one row that is padding only
        with torch.no_grad():
            output = model(**batch, output_hidden_states=True)
        for hidden in output.hidden_states:
            assert torch.isfinite(hidden).all()
        assert torch.isfinite(output.pooler_output).all()


def test_one_model_shared_by_threads(tokenizer, reference_embeddings):
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    torch.set_num_threads(max(1, torch.get_num_threads()))
    failures: list[str] = []

    def work(worker: int) -> None:
        for step in range(6):
            index = (worker + step) % len(TEXTS)
            batch = tokenizer([TEXTS[index], TEXTS[(index + 1) % len(TEXTS)]], padding=True, return_tensors="pt")
            with torch.no_grad():
                output = model(**batch).last_hidden_state
            real = batch["attention_mask"].bool()
            if max_difference(output[0][real[0]], reference_embeddings[index]) > 1e-5:
                failures.append(f"worker {worker} step {step}")

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
