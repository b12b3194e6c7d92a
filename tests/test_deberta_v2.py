"""DeBERTa-v2 / v3 beyond the conformance suite's one tiny config (deberta-v3-base's attention): the shapes of the other
published checkpoints against transformers' own classes, in float64 to float64's rounding (the relative c2p / p2c terms,
their log buckets and their scale), on right-padded batches padding-free, the same padded, left-padded, in sdpa and
eager; the bucketing against transformers' function; the config against transformers' fields; the segment ids
DeBERTa's tokenizer gives for pairs; and bad input (a `position_buckets` the log buckets cannot use, one family's
weights under another's config.json), each one error naming the file, the field and the limit.
"""

from __future__ import annotations

import json

import pytest
import torch

import hfbert
from hfbert.modeling.config import ConfigError
from hfbert.modeling.deberta_v2 import DebertaV2Config, log_bucket

from support.helpers import randomize_weights
from support.members import TINY, tiny_config

transformers = pytest.importorskip("transformers")
from transformers.models.deberta_v2 import modeling_deberta_v2 as reference  # noqa: E402

V3 = tiny_config("deberta-v2")  # deberta-v3-base's attention (the conformance suite's)
# The other published shapes, each on TINY's sizes.
VARIANTS = {
    "v3": V3,
    # deberta-v2-xlarge: its own c2p / p2c projections, the convolution after layer 0 (gelu), normalised table.
    "v2-xlarge": {
        **V3,
        "share_att_key": False,
        "conv_kernel_size": 3,
        "conv_act": "gelu",
        "attention_head_size": 8,
    },
    # An older layout: absolute positions and token types beside the relative terms, c2p only, no buckets (distances
    # clamped at 6), a factorized embedding (`embed_proj`).
    "unbucketed": {
        **TINY,
        "relative_attention": True,
        "max_relative_positions": 6,
        "pos_att_type": "c2p",
        "position_biased_input": True,
        "type_vocab_size": 2,
        "embedding_size": 16,
    },
    # p2c only, buckets without a normalised table.
    "p2c": {**V3, "pos_att_type": ["p2c"], "norm_rel_ebd": "none", "position_buckets": 6, "share_att_key": False},
    "no relative attention": {**TINY, "relative_attention": False},
}
LENGTHS = (9, 5, 3)


def checkpoint(directory, fields: dict, model_class: str = "DebertaV2Model", seed: int = 0):
    config = transformers.DebertaV2Config(**fields)
    model = getattr(transformers, model_class)(config)
    torch.manual_seed(seed)
    randomize_weights(model).eval().save_pretrained(directory)
    return directory


def padded_batch(side: str, token_types: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    width = max(LENGTHS)
    input_ids = torch.zeros((len(LENGTHS), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, length in enumerate(LENGTHS):
        where = slice(0, length) if side == "right" else slice(width - length, width)
        input_ids[row, where] = torch.randint(3, TINY["vocab_size"], (length,), generator=generator)
        mask[row, where] = 1
    batch = {"input_ids": input_ids, "attention_mask": mask}
    if token_types:
        batch["token_type_ids"] = (torch.arange(width) >= 4).long().expand_as(input_ids) * mask
    return batch


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_published_shape_equals_transformers_in_float64(variant, tmp_path):
    """hfbert in float64 against transformers' float64 eager model: every hidden state and attention map, right
    padding padding-free and padded, left padding, both kernels; pad positions too wherever hfbert runs padded."""
    fields = VARIANTS[variant]
    directory = checkpoint(tmp_path, fields)
    theirs = transformers.DebertaV2Model.from_pretrained(directory).double().eval()
    ours = hfbert.AutoModel.from_pretrained(directory).double().eval()
    assert type(ours) is hfbert.DebertaV2Model
    for side, padding_free in (("right", True), ("right", False), ("left", True)):
        batch = padded_batch(side, token_types=fields.get("type_vocab_size", 0) > 0)
        real = batch["attention_mask"].bool()
        ours.padding_free = padding_free
        with torch.no_grad():
            expected = theirs(**batch, output_hidden_states=True, output_attentions=True)
            for implementation in ("sdpa", "eager"):
                ours.set_attn_implementation(implementation)
                actual = ours(**batch, output_hidden_states=True)
                packed = side == "right" and padding_free
                for index, (left, right) in enumerate(zip(actual.hidden_states, expected.hidden_states, strict=True)):
                    if packed:
                        left, right = left[real], right[real]
                    torch.testing.assert_close(
                        left, right, atol=1e-12, rtol=1e-10, msg=f"{side} {implementation} {index}"
                    )
            maps = ours(**batch, output_attentions=True).attentions
        for left, right in zip(maps, expected.attentions, strict=True):
            torch.testing.assert_close(left, right, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("legacy", [True, False])
def test_both_masked_lm_heads_equal_transformers_with_their_loss(legacy, tmp_path):
    """`cls.predictions` (legacy, transformers' default) and `lm_predictions.lm_head` (DeBERTa's own head over the word
    embeddings, untied), in float64, logits and loss."""
    directory = checkpoint(tmp_path, {**V3, "legacy": legacy}, "DebertaV2ForMaskedLM")
    theirs = transformers.DebertaV2ForMaskedLM.from_pretrained(directory).double().eval()
    ours = hfbert.AutoModelForMaskedLM.from_pretrained(directory).double().eval()
    prefix = "cls.predictions." if legacy else "lm_predictions.lm_head."
    assert any(name.startswith(prefix) for name in ours.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    batch = padded_batch("right", token_types=False)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    with torch.no_grad():
        expected, actual = theirs(**batch, labels=labels), ours(**batch, labels=labels)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(actual.logits[real], expected.logits[real], atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-12, rtol=1e-10)
    hidden = torch.randn(2, 3, TINY["hidden_size"], dtype=torch.float64)
    with torch.no_grad():  # what runs a masked LM's head on hidden states of its own (SPLADE) calls
        heads = (
            theirs.cls(hidden) if legacy else theirs.lm_predictions(hidden, theirs.deberta.embeddings.word_embeddings)
        )
        torch.testing.assert_close(ours.prediction_head(hidden), heads, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "labels",
    [
        torch.tensor([2, -1, 0]),  # DeBERTa's rule: rows with a negative label take no part
        torch.tensor([-1, -1, -1]),  # no labelled row: a zero loss
        torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]]),  # a distribution per row: soft targets
    ],
    ids=["ignored rows", "none labelled", "soft"],
)
def test_the_sequence_classifiers_own_loss_equals_transformers(labels, tmp_path):
    directory = checkpoint(tmp_path, {**V3, "num_labels": 3}, "DebertaV2ForSequenceClassification")
    theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(directory).eval()
    ours = hfbert.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    batch = padded_batch("right", token_types=False)
    with torch.no_grad():
        expected, actual = theirs(**batch, labels=labels.clone()), ours(**batch, labels=labels.clone())
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual.loss, expected.loss.to(actual.loss.dtype), atol=1e-5, rtol=1e-5)


def test_the_segment_ids_of_pairs_are_ignored_as_transformers_ignores_them(tmp_path):
    """DeBERTa's tokenizer gives token types 0 / 1 for pairs; without token-type embeddings (every published
    checkpoint) they change nothing, in transformers as in hfbert."""
    directory = checkpoint(tmp_path, {**V3, "num_labels": 3}, "DebertaV2ForSequenceClassification")
    theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(directory).eval()
    ours = hfbert.AutoModelForSequenceClassification.from_pretrained(directory).eval()
    batch = padded_batch("right", token_types=True)
    with torch.no_grad():
        expected = theirs(**batch).logits
        torch.testing.assert_close(ours(**batch).logits, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(**{**batch, "token_type_ids": None}).logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("variant", "reentrant"), [("v3", False), ("v2-xlarge", False), ("v3", True)])
def test_a_checkpointed_training_step_on_left_padding_gives_transformers_gradients(variant, reentrant, tmp_path):
    """Training runs padded (pad queries masked as transformers masks them, so no gradient flows through their rows),
    with activation checkpointing on in both, the relative table and the convolution included. hfbert also in the
    reentrant variant, against transformers' non-reentrant one: transformers' own fails there (its layers share one
    normalised relative table, whose graph the second layer's backward finds freed)."""
    off = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    directory = checkpoint(tmp_path, {**VARIANTS[variant], "num_labels": 2}, "DebertaV2ForQuestionAnswering")
    theirs = transformers.DebertaV2ForQuestionAnswering.from_pretrained(directory, **off).train()
    ours = hfbert.AutoModelForQuestionAnswering.from_pretrained(directory, **off).train()
    theirs.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    batch = padded_batch("left", token_types=False)
    positions = {"start_positions": torch.tensor([1, 4, 8]), "end_positions": torch.tensor([3, 8, 0])}
    expected, actual = theirs(**batch, **positions).loss, ours(**batch, **positions).loss
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    expected.backward()
    actual.backward()
    gradients = dict(ours.named_parameters())
    for name, parameter in theirs.named_parameters():
        torch.testing.assert_close(gradients[name].grad, parameter.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(("buckets", "reach"), [(8, 40), (256, 512), (6, 10), (32, 18)])
def test_the_log_buckets_equal_transformers(buckets, reach):
    distances = torch.arange(-3 * reach, 3 * reach)
    expected = reference.make_log_bucket_position(distances, buckets, reach).long()
    assert torch.equal(log_bucket(distances, buckets, reach), expected)


def test_the_config_has_transformers_fields_and_defaults():
    theirs = transformers.DebertaV2Config().to_dict()
    ours = DebertaV2Config().to_dict()
    generic = {"transformers_version", "_name_or_path", "is_encoder_decoder"}
    assert {key: ours.get(key, "absent") for key in theirs if key not in generic} == {
        key: value for key, value in theirs.items() if key not in generic
    }
    read = DebertaV2Config.from_dict({"model_type": "deberta-v2", "pos_att_type": "p2c|c2p", "hidden_size": 64})
    assert read.pos_att_type == ["p2c", "c2p"] and read.pooler_hidden_size == 64 and read.embedding_size == 64
    # What hfbert saves, transformers reads to the same model.
    saved = transformers.DebertaV2Config(**read.to_dict())
    assert (saved.pos_att_type, saved.pooler_hidden_size, saved.embedding_size) == (["p2c", "c2p"], 64, 64)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"position_buckets": 256, "max_relative_positions": 100}, r"'position_buckets' is 256.*< 99 \(max_relative_"),
        (
            {"position_buckets": 80},
            r"'position_buckets' is 80.*\(max_position_embeddings - 1 = 40 - 1\), so at most 77",
        ),
        ({"position_buckets": 1}, r"'position_buckets' is 1; the log buckets need 2 <= position_buckets"),
        ({"pos_att_type": "p2c|p2p"}, r"'pos_att_type' is \['p2c', 'p2p'\]"),
        ({"norm_rel_ebd": "batch_norm"}, r"'norm_rel_ebd' is 'batch_norm'"),
        ({"pooler_hidden_size": 16}, r"'pooler_hidden_size' is 16.*hidden_size \(32\)"),
        ({"attention_head_size": 4}, r"'attention_head_size' is 4"),
    ],
)
def test_a_config_the_model_cannot_use_is_one_error_naming_file_field_and_limit(fields, named, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "deberta-v2", **V3, **fields}), encoding="utf-8")
    with pytest.raises(ConfigError, match=named) as refused:
        hfbert.AutoConfig.from_pretrained(tmp_path)
    assert str(refused.value).startswith(f"{path}: field ")


def test_the_largest_position_buckets_the_reach_takes_runs(tmp_path):
    """The limit the error states is the real one: at it, transformers and hfbert compute the same buckets."""
    directory = checkpoint(tmp_path, {**V3, "position_buckets": 77})
    theirs = transformers.DebertaV2Model.from_pretrained(directory).eval()
    ours = hfbert.AutoModel.from_pretrained(directory).eval()
    batch = padded_batch("left", token_types=False)
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch)[0], theirs(**batch)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("weights", "config"), [("deberta-v2", "bert"), ("bert", "deberta-v2")])
def test_one_familys_weights_under_anothers_config_json_are_refused_naming_both(weights, config, tmp_path):
    from support.members import reference_checkpoint

    reference_checkpoint(tmp_path / "weights", weights, "masked-lm")
    reference_checkpoint(tmp_path / "config", config, "masked-lm")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "model.safetensors").write_bytes((tmp_path / "weights" / "model.safetensors").read_bytes())
    (mixed / "config.json").write_text((tmp_path / "config" / "config.json").read_text())
    with pytest.raises(Exception, match=rf"{weights}.*but \S*mixed/config\.json says.*{config}") as refused:
        hfbert.AutoModelForMaskedLM.from_pretrained(mixed)
    assert "model_type" in str(refused.value)


@pytest.mark.slow  # an ONNX export with dynamic shapes: tens of seconds on 2 cores
def test_an_onnx_export_with_dynamic_shapes_equals_transformers_in_onnxruntime(tmp_path):
    """The relative terms in a graph that serves every batch and length (no data-dependent slice of the table; the
    buckets of every distance computed in the graph), run by onnxruntime on two shapes, left padding among them."""
    onnxruntime = pytest.importorskip(
        "onnxruntime", reason="ONNX export needs the onnx extra: pip install 'hfbert[onnx]'"
    )
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install 'hfbert[onnx]'")
    directory = checkpoint(tmp_path / "model", V3)
    theirs = transformers.DebertaV2Model.from_pretrained(directory).eval()
    ours = hfbert.AutoModel.from_pretrained(directory).eval()

    class Encoder(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    first, second = padded_batch("right", token_types=False), padded_batch("left", token_types=False, seed=1)
    second = {name: tensor[:2, 2:] for name, tensor in second.items()}  # another batch size and length
    dimensions = {0: torch.export.Dim("batch", min=1, max=64), 1: torch.export.Dim("sequence", min=2, max=40)}
    path = tmp_path / "deberta.onnx"
    torch.onnx.export(
        Encoder(ours),
        (first["input_ids"], first["attention_mask"]),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_shapes={"input_ids": dimensions, "attention_mask": dimensions},
        dynamo=True,
    )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (first, second):
        (output,) = session.run(None, {name: tensor.numpy() for name, tensor in batch.items()})
        with torch.no_grad():
            expected = theirs(**batch).last_hidden_state
        real = batch["attention_mask"].bool()
        torch.testing.assert_close(torch.from_numpy(output)[real], expected[real], atol=1e-4, rtol=1e-4)
