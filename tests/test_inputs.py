"""Bad forward inputs: one ValueError naming the argument, the limit and the first offending position, raised
before any kernel runs; all-padding rows give defined outputs in every dtype."""

from __future__ import annotations

import pytest
import torch

import hfbert

from conftest import SMALL_CONFIG

CONFIG = dict(SMALL_CONFIG, type_vocab_size=2)  # vocab 1000, 64 positions, hidden 96


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return hfbert.BertModel(hfbert.BertConfig(**CONFIG)).eval()


IDS = torch.tensor([[101, 5, 6, 102], [101, 7, 102, 0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])


@pytest.mark.parametrize(
    "arguments,message",
    [
        (
            dict(input_ids=torch.tensor([[101, 5, 1000, 102]])),
            r"input_ids must lie in \[0, 1000\).*1000 at position \(0, 2\)",
        ),
        (dict(input_ids=torch.tensor([[101, -1, 5, 102]])), r"input_ids .* found -1 at position \(0, 1\)"),
        (
            dict(input_ids=IDS, token_type_ids=torch.tensor([[0, 0, 1, 1], [0, 2, 0, 0]])),
            r"token_type_ids must lie in \[0, 2\) \(type_vocab_size.*found 2 at position \(1, 1\)",
        ),
        (
            dict(input_ids=torch.ones(1, 65, dtype=torch.long)),
            r"sequence length 65 exceeds max_position_embeddings = 64",
        ),
        (dict(input_ids=IDS, position_ids=torch.tensor([0, 1, 2, 64])), r"position_ids must lie in \[0, 64\).* \(3,\)"),
        (
            dict(input_ids=IDS, attention_mask=torch.ones(2, 5)),
            r"attention_mask has shape \(2, 5\); expected .* \(2, 4\)",
        ),
        (dict(input_ids=IDS, attention_mask=MASK[:, None, None, :]), r"attention_mask has shape \(2, 1, 1, 4\)"),
        (dict(input_ids=IDS, attention_mask=(1.0 - MASK) * -10000.0), r"attention_mask must hold 1 .* -10000"),
        (dict(input_ids=torch.zeros(0, 4, dtype=torch.long)), r"empty batch"),
        (dict(input_ids=torch.zeros(2, 0, dtype=torch.long)), r"empty batch"),
        (dict(input_ids=IDS.float()), r"input_ids has dtype torch.float32; expected an integer dtype"),
        (dict(input_ids=IDS[0]), r"input_ids has shape \(4,\); expected \(batch, sequence\)"),
        (dict(input_ids=IDS, inputs_embeds=torch.zeros(2, 4, 96)), r"exactly one of input_ids or inputs_embeds"),
        (dict(), r"exactly one of input_ids or inputs_embeds"),
        (dict(inputs_embeds=torch.zeros(2, 4, 95)), r"inputs_embeds has size 95 .* hidden_size is 96"),
        (dict(input_ids=IDS.to("meta")), r"input_ids is on meta but the model is on cpu"),
    ],
)
def test_bad_inputs_are_named(model, arguments, message):
    with pytest.raises(ValueError, match=message):
        model(**arguments)


def test_transformers_fails_later_on_the_same_input(model):
    # The reference crashes inside the embedding kernel; hfbert names the argument first.
    import transformers

    reference = transformers.BertModel(transformers.BertConfig(**CONFIG)).eval()
    with pytest.raises(IndexError, match="index out of range"):
        reference(input_ids=torch.tensor([[101, 5, 1000, 102]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("padding_free", [True, False])
def test_all_padding_rows_are_defined(dtype, implementation, padding_free):
    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG), attn_implementation=implementation).to(dtype).eval()
    model.padding_free = padding_free
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    with torch.no_grad():
        output = model(input_ids=IDS.repeat(2, 1)[:3], attention_mask=mask)
    assert torch.isfinite(output.last_hidden_state).all() and torch.isfinite(output.pooler_output).all()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_masked_keys_contribute_exactly_zero(implementation):
    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG), attn_implementation=implementation).eval()
    model.padding_free = False
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    first = torch.tensor([[101, 5, 102, 7, 8]])
    second = torch.tensor([[101, 5, 102, 900, 33]])  # only the masked keys differ
    with torch.no_grad():
        a = model(input_ids=first, attention_mask=mask).last_hidden_state[:, :3]
        b = model(input_ids=second, attention_mask=mask).last_hidden_state[:, :3]
    assert torch.equal(a, b)
