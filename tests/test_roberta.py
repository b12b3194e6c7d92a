"""What only the RoBERTa family (RoBERTa, XLM-RoBERTa, CamemBERT) has, element-wise against transformers' own
classes: positions counted after the padding index (from `inputs_embeds`, explicit, restarting for every sequence of
a padding-free batch, in the fast paths), the refusals between BERT's and RoBERTa's layouts, and the limits.

Checkpoints are written by transformers (random weights far from its init, so every difference shows) and loaded by
hfbert. Every head of every member against transformers, padded and padding-free, in both attention kernels, with
training and saving: test_family_conformance.py.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

import hfbert
from hfbert.modeling.positions import positions_after_padding

from support.helpers import randomize_weights
from support.members import tiny_config

transformers = pytest.importorskip("transformers")

# (hfbert class, transformers class) by family member; every head transformers has for the family.
FAMILY = {
    "roberta": ("Roberta", transformers.RobertaConfig),
    "xlm-roberta": ("XLMRoberta", transformers.XLMRobertaConfig),
    "camembert": ("Camembert", transformers.CamembertConfig),
}
PAD = 1


def checkpoint(tmp_path, member: str, task: str, **fields):
    """A transformers model of `member`'s `task`, saved to tmp_path; returns (reference, hfbert's model)."""
    prefix, config_class = FAMILY[member]
    num_labels = 2 if task == "ForQuestionAnswering" else 3  # start and end
    config = config_class(**tiny_config(member, num_labels=num_labels, **fields))
    reference = getattr(transformers, f"{prefix}{task}")(config)
    torch.manual_seed(0)
    randomize_weights(reference).eval()
    directory = tmp_path / f"{member}-{task}"
    reference.save_pretrained(directory)
    return reference, getattr(hfbert, f"{prefix}{task}").from_pretrained(directory), directory


def batch(padding: str) -> dict[str, torch.Tensor]:
    rows = [[0, 5, 6, 7, 8, 2], [0, 9, 2], [0, 11, 12, 2]]
    width = max(map(len, rows))
    if padding == "right":
        ids = [row + [PAD] * (width - len(row)) for row in rows]
    else:
        ids = [[PAD] * (width - len(row)) + row for row in rows]
    input_ids = torch.tensor(ids)
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long()}


def test_positions_from_inputs_embeds_and_explicit_positions_equal_transformers(tmp_path):
    reference, model, _ = checkpoint(tmp_path, "roberta", "Model")
    inputs = batch("right")
    embeds = reference.embeddings.word_embeddings(inputs["input_ids"]).detach()
    positions = torch.arange(3, 3 + inputs["input_ids"].shape[1])[None]
    with torch.no_grad():
        for arguments in ({"inputs_embeds": embeds}, {"input_ids": inputs["input_ids"], "position_ids": positions}):
            expected = reference(**arguments, attention_mask=inputs["attention_mask"]).last_hidden_state
            actual = model(**arguments, attention_mask=inputs["attention_mask"]).last_hidden_state
            real = inputs["attention_mask"].bool()
            torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=1e-5)


def test_positions_restart_for_every_sequence_of_a_padding_free_batch(tmp_path):
    """The shipped bug: a flattened batch numbering positions across sequences. Each row of a padded, padding-free
    batch must equal that row run alone (its positions from padding_idx + 1), and transformers' row."""
    reference, model, _ = checkpoint(tmp_path, "roberta", "Model")
    inputs = batch("right")
    assert model.padding_free and not model.training
    with torch.no_grad():
        together = model(**inputs).last_hidden_state
        for row in range(len(inputs["input_ids"])):
            length = int(inputs["attention_mask"][row].sum())
            alone = reference(input_ids=inputs["input_ids"][row : row + 1, :length]).last_hidden_state
            torch.testing.assert_close(together[row, :length], alone[0], atol=1e-5, rtol=1e-5)


def test_position_ids_follow_transformers_function():
    ids = torch.tensor([[0, 5, 2, 1, 1], [1, 1, 0, 7, 2], [0, 1, 5, 2, 1]])
    expected = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
        ids, padding_idx=1
    )
    assert torch.equal(positions_after_padding(ids, None, 1), expected)


# The fast modes swap large layers only (int8 from 2**16 weights, packed fp32 from 2**19): at hidden 384 the
# feed-forward layers (384 x 1536) are large enough for every mode.
SMALL = dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536, vocab_size=500)


def float64_error(output: torch.Tensor, exact: torch.Tensor, mask: torch.Tensor) -> float:
    real = mask.bool()
    return float((output.double()[real] - exact[real]).square().mean().sqrt())


@pytest.mark.parametrize("options, bound", [({}, 1.5), ({"precision": "high"}, 3.0), ({"quantize": "int8"}, None)])
def test_fast_paths_keep_their_contracts_with_padding_free_positions(tmp_path, options, bound):
    """Each mode against transformers in float64, on a left- and right-padded batch (RoBERTa positions counted per
    row), within its contract: 1.5x transformers' fp32 error by default, 3x for precision="high"; int8 within what
    int8 costs (relative RMS 5%)."""
    from hfbert.inference import inference_mode_of, optimize_for_inference

    reference, _, directory = checkpoint(tmp_path, "xlm-roberta", "Model", **SMALL)
    # kernels="always": every swapped layer runs its kernel (the measured choice may keep small layers plain).
    model = optimize_for_inference(hfbert.XLMRobertaModel.from_pretrained(directory), **options, kernels="always")
    assert inference_mode_of(model).swapped > 0
    exact = copy.deepcopy(reference).double()
    for padding in ("right", "left"):
        inputs = batch(padding)
        with torch.no_grad():
            expected = exact(**inputs).last_hidden_state
            fp32 = float64_error(reference(**inputs).last_hidden_state, expected, inputs["attention_mask"])
            ours = float64_error(model(**inputs).last_hidden_state, expected, inputs["attention_mask"])
        if bound is not None:
            assert ours <= bound * fp32, (padding, ours, fp32)
        else:
            scale = float(expected[inputs["attention_mask"].bool()].square().mean().sqrt())
            assert ours <= 0.05 * scale, (padding, ours, scale)


@pytest.mark.slow
def test_compiled_int8_path_runs_roberta_positions(tmp_path):
    """The compiled path pads to a bucket with the pad id, so RoBERTa's positions of real tokens are unchanged."""
    from hfbert.inference import optimize_for_inference
    from hfbert.inference.compiled import compile_report

    reference, _, directory = checkpoint(tmp_path, "roberta", "Model", **SMALL)
    eager = optimize_for_inference(hfbert.RobertaModel.from_pretrained(directory), quantize="int8")
    compiled = optimize_for_inference(hfbert.RobertaModel.from_pretrained(directory), quantize="int8", compile=True)
    # Four rows of 13 to 16 tokens: the padded 4 x 16 shape is mostly real, so the call runs compiled (MIN_FILL).
    input_ids = torch.randint(3, 500, (4, 16), generator=torch.Generator().manual_seed(0))
    input_ids[:, 0] = 0
    for row, length in enumerate((16, 13, 15, 14)):
        input_ids[row, length - 1], input_ids[row, length:] = 2, PAD
    inputs = {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long()}
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        ours, theirs = compiled(**inputs).last_hidden_state, eager(**inputs).last_hidden_state
    assert compile_report(compiled)
    real = inputs["attention_mask"].bool()
    eager_error = float((theirs[real] - expected[real]).square().mean().sqrt())
    compiled_error = float((ours[real] - expected[real]).square().mean().sqrt())
    assert compiled_error <= 1.5 * eager_error + 1e-6
    assert torch.equal(ours[~real], torch.zeros_like(ours[~real]))


def test_a_roberta_config_with_bert_weights_is_refused_naming_both(tmp_path):
    bert = transformers.BertModel(transformers.BertConfig(**tiny_config("bert")))
    prefixed = transformers.BertForMaskedLM(bert.config)
    prefixed.save_pretrained(tmp_path / "bert")
    config = json.loads((tmp_path / "bert" / "config.json").read_text())
    (tmp_path / "bert" / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(
        hfbert.CheckpointError, match=r"tensor 'bert\.[^']*' is named as a 'bert' checkpoint's.*roberta"
    ):
        hfbert.RobertaForMaskedLM.from_pretrained(tmp_path / "bert")


def test_bert_model_refuses_a_roberta_checkpoint_naming_model_type(tmp_path):
    _, _, directory = checkpoint(tmp_path, "roberta", "ForMaskedLM")
    with pytest.raises(hfbert.CheckpointError, match=r"config\.json: model_type 'roberta' is not loaded by BertModel"):
        hfbert.BertModel.from_pretrained(directory)


def test_limits_are_named(tmp_path):
    _, model, _ = checkpoint(tmp_path, "roberta", "Model")
    too_long = torch.full((1, 39), 5)  # 40 positions - padding_idx 1 - 1 = 38 tokens at most
    with pytest.raises(
        ValueError, match=r"sequence length 39 exceeds 38 = max_position_embeddings = 40 - pad_token_id"
    ):
        model(input_ids=too_long)
    with torch.no_grad():
        model(input_ids=too_long[:, :38])
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 1\) \(type_vocab_size"):
        model(input_ids=too_long[:, :4], token_type_ids=torch.tensor([[0, 0, 1, 1]]))
    with pytest.raises(hfbert.ConfigError, match="max_position_embeddings.*must exceed pad_token_id"):
        hfbert.RobertaConfig(max_position_embeddings=2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "member, fields",
    [
        ("roberta", dict(vocab_size=50265, max_position_embeddings=514, layer_norm_eps=1e-5)),
        ("xlm-roberta", dict(vocab_size=250002, max_position_embeddings=514, layer_norm_eps=1e-5)),
    ],
)
def test_base_shapes_equal_transformers(tmp_path, member, fields):
    base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    prefix, config_class = FAMILY[member]
    torch.manual_seed(0)
    config = config_class(**tiny_config(member, **base, **fields))
    reference = getattr(transformers, f"{prefix}ForMaskedLM")(config).eval()
    reference.save_pretrained(tmp_path / member)
    model = getattr(hfbert, f"{prefix}ForMaskedLM").from_pretrained(tmp_path / member)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 1000, (2, 128), generator=generator)
    input_ids[:, 0], input_ids[0, 100:] = 0, PAD
    mask = (input_ids != PAD).long()
    with torch.no_grad():
        expected, actual = (
            reference(input_ids=input_ids, attention_mask=mask),
            model(input_ids=input_ids, attention_mask=mask),
        )
    real = mask.bool()
    torch.testing.assert_close(actual.logits[real], expected.logits[real], atol=2e-4, rtol=1e-4)
