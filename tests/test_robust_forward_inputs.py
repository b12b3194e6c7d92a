"""Bad forward arguments: one ValueError naming the argument, the limit and the first offending position, raised
before any kernel runs, in every dtype the model runs (ids, masks, positions, segments, embeddings, Python lists,
batch mismatches, head labels); all-padding rows give defined outputs in every dtype."""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import SMALL_CONFIG

CONFIG = dict(SMALL_CONFIG, type_vocab_size=2)  # vocab 1000, 64 positions, hidden 96
IDS = torch.tensor([[101, 5, 6, 102], [101, 7, 102, 0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])


# -- arguments the kernels cannot run: named before any kernel runs, in every dtype --------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", params=DTYPES, ids=["fp32", "bf16", "fp16"])
def typed_model(request):
    torch.manual_seed(0)
    return hfbert.BertModel(hfbert.BertConfig(**CONFIG)).to(request.param).eval()


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
        (dict(input_ids=IDS.float()), r"input_ids has dtype torch.float32; expected torch.int64"),
        (dict(input_ids=IDS[0]), r"input_ids has shape \(4,\); expected \(batch, sequence\)"),
        (dict(input_ids=IDS, inputs_embeds=torch.zeros(2, 4, 96)), r"exactly one of input_ids or inputs_embeds"),
        (dict(), r"exactly one of input_ids or inputs_embeds"),
        (dict(inputs_embeds=torch.zeros(2, 4, 95)), r"inputs_embeds has size 95 .* hidden_size is 96"),
        (dict(input_ids=IDS.to("meta")), r"input_ids is on meta but the model is on cpu"),
        (dict(input_ids=IDS.to(torch.uint8)), r"input_ids has dtype torch.uint8; expected torch.int64"),
        (dict(input_ids=IDS.to(torch.int16)), r"input_ids has dtype torch.int16; expected torch.int64"),
        (
            dict(input_ids=IDS, position_ids=torch.arange(4, dtype=torch.uint8)),
            r"position_ids has dtype torch.uint8; expected torch.int64",
        ),
        (
            dict(input_ids=IDS, position_ids=torch.arange(4, dtype=torch.int16)),
            r"position_ids has dtype torch.int16; expected torch.int64",
        ),
        (
            dict(input_ids=IDS, token_type_ids=torch.zeros(2, 4, dtype=torch.int8)),
            r"token_type_ids has dtype torch.int8",
        ),
        (dict(input_ids=IDS, attention_mask=MASK.tolist()), r"attention_mask must be a torch.Tensor, got list"),
        (dict(input_ids=IDS, token_type_ids=[[0] * 4] * 2), r"token_type_ids must be a torch.Tensor, got list"),
        (dict(input_ids=IDS, position_ids=[0, 1, 2, 3]), r"position_ids must be a torch.Tensor, got list"),
        (dict(input_ids=IDS.tolist()), r"input_ids must be a torch.Tensor, got list"),
        (
            dict(input_ids=IDS, position_ids=torch.arange(4).repeat(3, 1)),
            r"position_ids has shape \(3, 4\); expected .* \(batch, sequence\)",
        ),
        (dict(input_ids=IDS, token_type_ids=torch.zeros(3, 4, dtype=torch.long)), r"token_type_ids has shape \(3, 4\)"),
        (dict(input_ids=IDS, attention_mask=MASK[:1]), r"attention_mask has shape \(1, 4\)"),
    ],
)
def test_bad_inputs_are_named_in_every_dtype(typed_model, arguments, message):
    with pytest.raises(ValueError, match=message):
        typed_model(**arguments)


def test_int32_ids_are_accepted_and_equal_int64(typed_model):
    positions = torch.arange(4)
    types = torch.zeros_like(IDS)
    with torch.no_grad():
        expected = typed_model(input_ids=IDS, attention_mask=MASK, token_type_ids=types, position_ids=positions)
        narrow = typed_model(
            input_ids=IDS.int(), attention_mask=MASK.int(), token_type_ids=types.int(), position_ids=positions.int()
        )
    assert torch.equal(expected.last_hidden_state, narrow.last_hidden_state)


@pytest.mark.parametrize("model_dtype", DTYPES)
@pytest.mark.parametrize("embeds_dtype", [torch.float64, *DTYPES])
def test_inputs_embeds_dtype_is_checked_as_the_kernels_need(model_dtype, embeds_dtype, monkeypatch):
    import hfbert.modeling.encoder
    from hfbert.modeling.inputs import check_inputs

    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG)).to(model_dtype).eval()
    embeds = torch.zeros(2, 4, 96, dtype=embeds_dtype)
    with monkeypatch.context() as unchecked, torch.no_grad():  # what the kernels do without the check
        unchecked.setattr(hfbert.modeling.encoder, "check_inputs", lambda *arguments, **keywords: None)
        try:
            model(inputs_embeds=embeds)
            runs = True
        except RuntimeError as error:  # "mixed dtype (CPU): ..."
            assert "dtype" in str(error)
            runs = False
    arguments = (model.config, torch.device("cpu"), None, None, None, None, embeds)
    if runs:
        check_inputs(*arguments, dtype=model_dtype)
    else:
        with pytest.raises(ValueError, match=rf"inputs_embeds has dtype {embeds_dtype} but the model runs in"):
            check_inputs(*arguments, dtype=model_dtype)


def test_transformers_fails_later_on_the_same_input():
    # The reference crashes inside the embedding kernel; hfbert names the argument first.
    import transformers

    reference = transformers.BertModel(transformers.BertConfig(**CONFIG)).eval()
    with pytest.raises(IndexError, match="index out of range"):
        reference(input_ids=torch.tensor([[101, 5, 1000, 102]]))


# -- labels of the task heads --------------------------------------------------------------------------------------

HEAD_LABELS = [
    ("BertForSequenceClassification", dict(labels=torch.tensor([0, 5])), r"labels must lie in \[0, 3\).*found 5"),
    ("BertForSequenceClassification", dict(labels=torch.tensor([0, 1, 2])), r"labels has shape \(3,\).*2 predictions"),
    ("BertForTokenClassification", dict(labels=torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0]])), r"found 3 at position"),
    ("BertForMaskedLM", dict(labels=torch.full((2, 4), 1000)), r"labels must lie in \[0, 1000\) or be -100"),
    ("BertForNextSentencePrediction", dict(labels=torch.tensor([0, 2])), r"labels must lie in \[0, 2\)"),
    ("BertForMultipleChoice", dict(labels=torch.tensor([0, 2])), r"labels must lie in \[0, 2\)"),
    (
        "BertForPreTraining",
        dict(labels=torch.full((2, 4), -100), next_sentence_label=torch.tensor([0, -5])),
        r"next_sentence_label must lie in \[0, 2\)",
    ),
    ("BertForSequenceClassification", dict(labels=torch.tensor([0, 1], dtype=torch.int16)), r"dtype torch.int16"),
]


@pytest.mark.parametrize("class_name,labels,message", HEAD_LABELS)
def test_head_labels_out_of_range_are_named(class_name, labels, message):
    torch.manual_seed(0)
    model = getattr(hfbert, class_name)(hfbert.BertConfig(**CONFIG, num_labels=3))
    ids = IDS[:, None].expand(2, 2, 4) if class_name == "BertForMultipleChoice" else IDS  # 2 choices each
    if class_name == "BertForSequenceClassification" and labels["labels"].dtype == torch.int16:
        model.config.problem_type = "single_label_classification"
    with pytest.raises(ValueError, match=message):
        model(input_ids=ids, **labels)


def test_ignored_label_positions_are_accepted():
    torch.manual_seed(0)
    model = hfbert.BertForMaskedLM(hfbert.BertConfig(**CONFIG))
    labels = torch.full((2, 4), -100)
    labels[0, 1] = 7
    assert torch.isfinite(model(input_ids=IDS, labels=labels).loss)


# -- padding: defined outputs, masked keys without effect ----------------------------------------------------------


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
