"""MPNet on hfbert's model, element-wise against transformers' own MPNet classes (issue #42).

Checkpoints are written by transformers (random weights far from its init, so every difference shows) and loaded by
hfbert. Rows run to 150 tokens, so the relative-position bias reaches its logarithmic buckets and the shared last one
(distances >= 128); rows of different lengths make padding-free batches of several buckets, each taking the corner of
the bias. transformers' MPNet has eager attention only: hfbert's sdpa is compared with it too. What every member
shares (state dict keys, forward's parameters, the Auto classes, short rows of every head, a training step):
test_family_conformance.py.
"""

from __future__ import annotations

import json

import pytest
import torch

import hfbert
from hfbert.modeling.padding import PackedBatch
from hfbert.modeling.relative_position import relative_position_bias, relative_position_bucket

from support.helpers import randomize_weights
from support.members import tiny_config

transformers = pytest.importorskip("transformers")

TASKS = (
    "Model",
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)
# The family's tiny MPNet (support.members) with all-mpnet-base-v2's 514 positions: rows of 150 tokens reach the
# bias's logarithmic buckets.
CONFIG = tiny_config("mpnet", max_position_embeddings=514)
PAD, BOS, EOS = 1, 0, 2
LENGTHS = (150, 131, 40, 9, 3)
ATOL = RTOL = 1e-5


def checkpoint(tmp_path, task: str, **fields):
    """transformers' `MPNet<task>` saved to tmp_path; returns (reference, hfbert's model, directory)."""
    num_labels = 2 if task == "ForQuestionAnswering" else 3  # start and end
    config = transformers.MPNetConfig(**{**CONFIG, "num_labels": num_labels, **fields})
    reference = getattr(transformers, f"MPNet{task}")(config)
    torch.manual_seed(0)
    randomize_weights(reference).eval()
    directory = tmp_path / task
    reference.save_pretrained(directory)
    return reference, getattr(hfbert, f"MPNet{task}").from_pretrained(directory), directory


def batch(lengths=LENGTHS, padding: str = "right", seed: int = 0) -> dict[str, torch.Tensor]:
    """`<s> ... </s>` rows of random ids (never the pad id) of the given lengths, padded on one side."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), PAD)
    for row, length in enumerate(lengths):
        tokens = torch.randint(3, CONFIG["vocab_size"], (length,), generator=generator)
        tokens[0], tokens[-1] = BOS, EOS
        if padding == "right":
            input_ids[row, :length] = tokens
        else:
            input_ids[row, width - length :] = tokens
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long()}


def task_inputs(task: str, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A right-padded batch for `task` (multiple choice: 2 questions x 3 choices), and labels for its loss."""
    generator = torch.Generator().manual_seed(seed + 1)
    if task == "ForMultipleChoice":
        inputs = {name: value.view(2, 3, -1) for name, value in batch((150, 40, 9, 131, 3, 20), seed=seed).items()}
        return inputs, {"labels": torch.tensor([2, 0])}
    inputs = batch(seed=seed)
    real, rows = inputs["attention_mask"].bool(), len(LENGTHS)
    labels = {
        "Model": {},
        "ForMaskedLM": {"labels": torch.where(real, inputs["input_ids"], -100)},
        "ForSequenceClassification": {"labels": torch.randint(0, 3, (rows,), generator=generator)},
        "ForTokenClassification": {
            "labels": torch.where(real, torch.randint(0, 3, real.shape, generator=generator), -100)
        },
        "ForQuestionAnswering": {
            "start_positions": torch.tensor([3, 100, 7, 2, 0]),
            "end_positions": torch.tensor([60, 130, 30, 8, 2]),
        },
    }[task]
    return inputs, labels


def assert_close(actual, expected, real: torch.Tensor, name: str) -> None:
    """One output: token-level tensors (sequences, length, ...) at real positions only (hfbert's padding-free path
    leaves pads zero), attention maps at real queries, anything else whole."""
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    real = real.view(-1, real.shape[-1])  # multiple choice: one sequence per choice
    if expected.dim() == 4:  # (sequences, heads, query, key)
        actual, expected = actual.transpose(1, 2)[real], expected.transpose(1, 2)[real]
    elif expected.dim() >= 2 and tuple(expected.shape[:2]) == tuple(real.shape):
        actual, expected = actual[real], expected[real]
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=lambda message: f"{name}: {message}")


def assert_outputs_equal(actual, expected, real: torch.Tensor) -> None:
    """Every field transformers returns (loss, logits, hidden states, attentions ...) against hfbert's."""
    assert [key for key, value in expected.items() if value is not None] == list(actual.keys())
    for field, value in expected.items():
        if isinstance(value, tuple):
            assert len(actual[field]) == len(value), field
            for index, (ours, theirs) in enumerate(zip(actual[field], value, strict=True)):
                assert_close(ours, theirs, real, f"{field}[{index}]")
        elif value is not None:
            assert_close(actual[field], value, real, field)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_every_output_of_every_head_equals_transformers(tmp_path, task, implementation):
    """Losses, logits, pooler, hidden states, attention maps and return_dict=False tuples, right-padded, in eval
    (padding-free unless attention maps are asked)."""
    reference, model, _ = checkpoint(tmp_path, task)
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    inputs, labels = task_inputs(task)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        for options in ({"output_hidden_states": True}, {"output_attentions": True}, {}):
            expected = reference(**inputs, **labels, **options)
            actual = model(**inputs, **labels, **options)
            assert_outputs_equal(actual, expected, real)
        expected = reference(**inputs, **labels, output_hidden_states=True, return_dict=False)
        actual = model(**inputs, **labels, output_hidden_states=True, return_dict=False)
    assert isinstance(actual, tuple) and len(actual) == len(expected)
    for index, (ours, theirs) in enumerate(zip(actual, expected, strict=True)):
        assert type(ours) is type(theirs), index
        pairs = zip(ours, theirs, strict=True) if isinstance(theirs, tuple) else [(ours, theirs)]
        for position, (left, right) in enumerate(pairs):
            assert_close(left, right, real, f"tuple[{index}][{position}]")


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_free_buckets_and_padded_batches_equal_transformers(tmp_path, implementation, monkeypatch):
    """The padding-free path (each bucket takes the top-left corner of the batch's bias) and the padded one, each
    against transformers; the batch makes several buckets of different widths."""
    reference, model, _ = checkpoint(tmp_path, "Model")
    model.set_attn_implementation(implementation)
    widths = []
    attend = PackedBatch.attend

    def recording(self, *arguments, **options):
        widths.append(tuple(bucket.gather.shape[1] for bucket in self.buckets))
        return attend(self, *arguments, **options)

    monkeypatch.setattr(PackedBatch, "attend", recording)
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = reference(**inputs, output_hidden_states=True)
        assert model.padding_free and not model.training
        assert_outputs_equal(model(**inputs, output_hidden_states=True), expected, real)
        assert widths and len(set(widths[0])) > 1, widths  # padding-free, in buckets of several widths
        widths.clear()
        model.padding_free = False
        padded = model(**inputs, output_hidden_states=True)
        assert not widths
    assert_outputs_equal(padded, expected, real)
    # The padded path computes pad positions as transformers does.
    torch.testing.assert_close(padded.last_hidden_state, expected.last_hidden_state, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_left_padding_inputs_embeds_position_ids_and_a_batch_of_one_equal_transformers(tmp_path, implementation):
    reference, model, _ = checkpoint(tmp_path, "ForMaskedLM")
    model.set_attn_implementation(implementation)
    right, left = batch(), batch(padding="left")
    width = right["input_ids"].shape[1]
    embeds = reference.mpnet.embeddings.word_embeddings(right["input_ids"]).detach()
    cases = {
        "left padding": left,
        "inputs_embeds": {"inputs_embeds": embeds, "attention_mask": right["attention_mask"]},
        "position_ids": {**right, "position_ids": torch.arange(7, 7 + width).expand(len(LENGTHS), -1)},
        "left padding, position_ids": {**left, "position_ids": torch.arange(2, 2 + width)[None]},
        "one row": {"input_ids": right["input_ids"][2:3, : LENGTHS[2]]},
        "one row, masked": {name: value[1:2] for name, value in right.items()},
    }
    with torch.no_grad():
        for name, inputs in cases.items():
            mask = inputs["attention_mask"] if "attention_mask" in inputs else torch.ones_like(inputs["input_ids"])
            real = mask.bool()
            expected = reference(**inputs, output_hidden_states=True)
            actual = model(**inputs, output_hidden_states=True)
            try:
                assert_outputs_equal(actual, expected, real)
            except AssertionError as error:
                raise AssertionError(f"{name}: {error}") from None


def test_relative_position_bucket_equals_transformers_on_every_pair_up_to_512():
    columns = torch.arange(512)
    relative = columns[None, :] - columns[:, None]  # key - query, as transformers' compute_position_bias
    expected = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(relative)
    actual = relative_position_bucket(relative)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected)
    # Every bucket is reached but 16: distance 0 falls in the lower half, so the upper half starts at distance 1.
    assert set(actual.unique().tolist()) == set(range(32)) - {16}


def test_relative_position_bias_equals_transformers_compute_position_bias():
    config = transformers.MPNetConfig(**CONFIG)
    encoder = randomize_weights(transformers.models.mpnet.modeling_mpnet.MPNetEncoder(config))
    for length in (1, 8, 9, 130, 300, 512):
        expected = encoder.compute_position_bias(torch.zeros(2, length, config.hidden_size))
        actual = relative_position_bias(encoder.relative_attention_bias, length)
        assert actual.shape == (1, config.num_attention_heads, length, length)
        assert torch.equal(actual.expand_as(expected), expected), length


@pytest.mark.parametrize("task", ["Model", "ForSequenceClassification"])
def test_token_type_ids_all_zero_are_accepted_and_others_refused(tmp_path, task):
    reference, model, _ = checkpoint(tmp_path, task)
    inputs = batch()
    zeros = torch.zeros_like(inputs["input_ids"])
    with torch.no_grad():
        expected = reference(**inputs)
        assert_outputs_equal(model(**inputs, token_type_ids=zeros), expected, inputs["attention_mask"].bool())
    ones = zeros.clone()
    ones[0, 5] = 1
    with pytest.raises(ValueError, match="token_type_ids: MPNet has no token types"):
        model(**inputs, token_type_ids=ones)


def test_inputs_longer_than_the_position_table_are_refused_naming_the_limit(tmp_path):
    reference, model, _ = checkpoint(tmp_path, "Model")
    longest = batch((512,))
    with torch.no_grad():
        expected = reference(**longest)
        assert_outputs_equal(model(**longest), expected, longest["attention_mask"].bool())
    too_long = {"input_ids": torch.cat([longest["input_ids"], longest["input_ids"][:, -1:]], dim=1)}
    with pytest.raises(ValueError, match=r"sequence length 513 exceeds 512 = max_position_embeddings = 514"):
        model(**too_long)


def test_prefixed_task_checkpoints_load_into_the_model_and_the_model_into_every_task(tmp_path):
    """A task checkpoint (`mpnet.` names) into MPNetModel and an MPNetModel checkpoint into each task model: the
    encoder equal to transformers', the same missing keys, and what transformers calls unexpected (the other model's
    head or pooler) ignored by design; a head the checkpoint lacks is reported as new."""
    masked_lm, _, masked_lm_directory = checkpoint(tmp_path, "ForMaskedLM")
    inputs = batch()
    real = inputs["attention_mask"].bool()
    with pytest.raises(hfbert.CheckpointError, match="add_pooling_layer=False"):
        hfbert.MPNetModel.from_pretrained(masked_lm_directory)
    encoder, ours = hfbert.MPNetModel.from_pretrained(
        masked_lm_directory, add_pooling_layer=False, output_loading_info=True
    )
    _, theirs = transformers.MPNetModel.from_pretrained(
        masked_lm_directory, add_pooling_layer=False, output_loading_info=True
    )
    assert ours["missing_keys"] == theirs["missing_keys"] == set()
    assert ours["unexpected_keys"] == set() and set(ours["report"].ignored_by_design) == theirs["unexpected_keys"]
    with torch.no_grad():
        assert_close(encoder(**inputs).last_hidden_state, masked_lm.mpnet(**inputs).last_hidden_state, real, "mpnet")

    base, _, base_directory = checkpoint(tmp_path, "Model")
    with torch.no_grad():
        expected = base(**inputs, output_hidden_states=True).hidden_states
    for task in TASKS[1:]:
        _, theirs = getattr(transformers, f"MPNet{task}").from_pretrained(base_directory, output_loading_info=True)
        model, ours = getattr(hfbert, f"MPNet{task}").from_pretrained(base_directory, output_loading_info=True)
        # transformers also lists lm_head.decoder.bias, its alias of lm_head.bias.
        assert ours["missing_keys"] == theirs["missing_keys"] - {"lm_head.decoder.bias"}, task
        assert sorted(ours["report"].new_head) == sorted(ours["missing_keys"]), task
        assert ours["unexpected_keys"] == set(), task
        assert set(ours["report"].ignored_by_design) == theirs["unexpected_keys"], task
        with torch.no_grad():
            actual = model.backbone(**inputs, output_hidden_states=True).hidden_states
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            assert_close(left, right, real, f"{task} hidden_states[{index}]")


def test_config_round_trips_with_transformers_and_outputs_stay_equal(tmp_path):
    config = hfbert.MPNetConfig(**{**CONFIG, "num_labels": 3})
    torch.manual_seed(0)
    ours = randomize_weights(hfbert.MPNetModel(config)).eval()
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "mpnet" and "type_vocab_size" not in saved
    theirs_config = transformers.MPNetConfig.from_pretrained(tmp_path / "ours")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "relative_attention_num_buckets", "pad_token_id"):
        assert getattr(theirs_config, name) == getattr(config, name), name
    theirs, info = transformers.MPNetModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    inputs = batch()
    with torch.no_grad():
        assert_outputs_equal(ours(**inputs), theirs.eval()(**inputs), inputs["attention_mask"].bool())

    transformers.MPNetConfig(**{**CONFIG, "relative_attention_num_buckets": 40}).save_pretrained(tmp_path / "theirs")
    loaded = hfbert.MPNetConfig.from_pretrained(tmp_path / "theirs")
    assert (loaded.relative_attention_num_buckets, loaded.max_sequence_length) == (40, 512)
    assert hfbert.MPNetModel(loaded).encoder.relative_attention_bias.weight.shape == (40, CONFIG["num_attention_heads"])


def test_fewer_than_32_relative_attention_buckets_are_refused_naming_the_field(tmp_path):
    with pytest.raises(hfbert.ConfigError, match="relative_attention_num_buckets"):
        hfbert.MPNetConfig(relative_attention_num_buckets=16)
    transformers.MPNetConfig(**{**CONFIG, "relative_attention_num_buckets": 16}).save_pretrained(tmp_path)
    with pytest.raises(hfbert.ConfigError, match=r"config\.json.*relative_attention_num_buckets"):
        hfbert.MPNetConfig.from_pretrained(tmp_path)


def masked_lm_gradients(model, inputs, labels) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad()
    loss = model(**inputs, labels=labels).loss
    loss.backward()
    return {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters() if p.grad is not None}}


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_masked_lm_gradients_equal_transformers_with_and_without_checkpointing(tmp_path, implementation):
    """Training with dropout off: the loss and every parameter's gradient, relative_attention_bias included (it gets
    a gradient from every layer), equal transformers' (eager, no checkpointing); then again with gradient
    checkpointing on in hfbert."""
    reference, model, _ = checkpoint(tmp_path, "ForMaskedLM", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model.set_attn_implementation(implementation)
    inputs, labels = task_inputs("ForMaskedLM")
    expected = masked_lm_gradients(reference, inputs, labels["labels"])
    assert "mpnet.encoder.relative_attention_bias.weight" in expected
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable()
            assert model.train().backbone.checkpointed(0)
        actual = masked_lm_gradients(model, inputs, labels["labels"])
        assert set(actual) == set(expected), set(actual) ^ set(expected)
        for name, gradient in expected.items():
            torch.testing.assert_close(
                actual[name],
                gradient,
                atol=1e-5,
                rtol=1e-4,
                msg=lambda m, name=name, checkpointing=checkpointing: f"{name}, checkpointing {checkpointing}: {m}",
            )
