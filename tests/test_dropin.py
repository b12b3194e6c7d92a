"""hfbert inside the tools built around transformers: Trainer, PEFT, torch.export, and the PreTrainedModel surface
they read. Every check runs the real client on hfbert and on transformers' own class, and compares the two.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import hfbert
from converters import CheckpointError

from support.helpers import HEAD_CLASSES, max_difference, randomize_weights
from support.helpers import trainer_losses as shared_trainer_losses
from support.members import tiny_config

# transformers' BertModelTester config (tests/models/bert/test_modeling_bert.py): the family's tiny config
# (support.members) with its 16 token types and 512 positions, dropout off so runs compare.
TESTER_CONFIG = tiny_config(
    "bert",
    type_vocab_size=16,
    max_position_embeddings=512,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
CLASSES = ["BertModel", *HEAD_CLASSES]
TOLERANCE = 1e-5


def reference_checkpoint(directory, class_name: str = "BertForSequenceClassification", seed: int = 0, **fields):
    """A transformers model with random (not tiny) weights, saved to `directory`; returned in eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(**{**TESTER_CONFIG, **fields})
    model = randomize_weights(getattr(transformers, class_name)(config))
    model.save_pretrained(directory)
    return model.eval()


def batch_of_ids(seed: int = 0, batch: int = 4, length: int = 9) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, TESTER_CONFIG["vocab_size"], (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1:, -3:] = 0
    return dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask)


# -- the PreTrainedModel surface ---------------------------------------------------------------------------------
@pytest.mark.parametrize("class_name", CLASSES)
def test_model_attributes_equal_transformers(class_name):
    import transformers

    theirs_class, ours_class = getattr(transformers, class_name), getattr(hfbert, class_name)
    for name in ("main_input_name", "base_model_prefix", "supports_gradient_checkpointing", "_supports_sdpa"):
        assert getattr(ours_class, name) == getattr(theirs_class, name), name
    assert ours_class.can_generate() == theirs_class.can_generate() is False
    assert ours_class._can_set_attn_implementation() and theirs_class._can_set_attn_implementation()

    theirs = theirs_class._from_config(transformers.BertConfig(**TESTER_CONFIG))
    ours = ours_class._from_config(hfbert.BertConfig(**TESTER_CONFIG))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert type(ours.base_model).__name__ == type(theirs.base_model).__name__ == "BertModel"
    assert (ours.get_output_embeddings() is None) == (theirs.get_output_embeddings() is None)
    if theirs.get_output_embeddings() is not None:
        assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight  # tied, as theirs
    half = ours_class._from_config(hfbert.BertConfig(**TESTER_CONFIG), dtype=torch.float16)
    assert half.dtype == theirs_class._from_config(transformers.BertConfig(**TESTER_CONFIG), dtype=torch.float16).dtype


def test_config_round_trips_with_transformers(tmp_path):
    import transformers

    theirs = transformers.BertConfig(**TESTER_CONFIG)
    theirs.save_pretrained(tmp_path / "theirs")
    ours = hfbert.BertConfig.from_pretrained(tmp_path / "theirs", num_labels=7)
    assert ours.get_text_config() is ours
    assert (ours.num_labels, ours.id2label[6]) == (7, "LABEL_6")
    ours.save_pretrained(tmp_path / "ours")
    back = transformers.BertConfig.from_pretrained(tmp_path / "ours")
    for name in [field.name for field in dataclasses.fields(hfbert.BertConfig)]:
        if name not in ("extra_fields", "source"):
            assert getattr(back, name) == getattr(ours, name), name
    assert hfbert.BertConfig.from_dict(json.loads(ours.to_json_string())) == ours


@pytest.mark.parametrize("class_name", ["BertForSequenceClassification", "BertForTokenClassification"])
def test_loading_info_equals_transformers(class_name, tmp_path):
    """Same types (sets) and contents; a head the checkpoint lacks is missing_keys in both (and "new head" in
    hfbert's report)."""
    import transformers

    reference_checkpoint(tmp_path, "BertForSequenceClassification")
    _, theirs = getattr(transformers, class_name).from_pretrained(tmp_path, output_loading_info=True)
    _, ours = getattr(hfbert, class_name).from_pretrained(tmp_path, output_loading_info=True)
    if class_name == "BertForTokenClassification":  # same classifier shapes, but the pooler is not used
        theirs["unexpected_keys"] -= {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}  # "ignored by design"
    for key, value in theirs.items():
        assert type(ours[key]) is type(value) and ours[key] == value, key


def test_new_head_missing_keys_equal_transformers(tmp_path):
    import transformers

    reference_checkpoint(tmp_path, "BertModel")
    _, theirs = transformers.BertForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    _, ours = hfbert.BertForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    assert ours["missing_keys"] == theirs["missing_keys"] == {"qa_outputs.weight", "qa_outputs.bias"}
    assert ours["report"].new_head == ["qa_outputs.weight", "qa_outputs.bias"]


def test_a_new_head_is_warned_about_naming_its_parameters_as_transformers_does(tmp_path, caplog):
    """A base checkpoint loaded into a task class initialises the head afresh: transformers warns (its load report
    lists the head's parameters as MISSING, "newly initialized"); hfbert says so on its logger, naming the class, the
    checkpoint and the same parameters. A load that fills every parameter says nothing."""
    import logging

    import transformers

    reference_checkpoint(tmp_path, "BertModel")
    _, theirs = transformers.BertForQuestionAnswering.from_pretrained(tmp_path, output_loading_info=True)
    with caplog.at_level(logging.WARNING, logger="hfbert"):
        hfbert.BertForQuestionAnswering.from_pretrained(tmp_path)
    (record,) = [record for record in caplog.records if "newly initialized" in record.getMessage()]
    message = record.getMessage()
    assert "BertForQuestionAnswering" in message and str(tmp_path) in message and "TRAIN" in message
    assert set(re.findall(r"'([\w.]+)'", message)) == theirs["missing_keys"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfbert"):
        hfbert.BertModel.from_pretrained(tmp_path)
    assert not [record for record in caplog.records if "newly initialized" in record.getMessage()]


def test_attention_implementation_lives_on_the_config_as_in_transformers(tmp_path):
    import transformers

    reference_checkpoint(tmp_path, "BertForMaskedLM")
    for requested in (None, "eager", "sdpa"):
        kwargs = {} if requested is None else {"attn_implementation": requested}
        theirs = transformers.BertForMaskedLM.from_pretrained(tmp_path, **kwargs)
        ours = hfbert.BertForMaskedLM.from_pretrained(tmp_path, **kwargs)
        assert ours.config._attn_implementation == theirs.config._attn_implementation == (requested or "sdpa")
    config = hfbert.BertConfig(**TESTER_CONFIG, attn_implementation="eager")
    model = hfbert.BertForMaskedLM(config)
    assert model.bert.attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    assert config._attn_implementation == "sdpa" and "_attn_implementation" not in config.to_dict()
    with pytest.raises(ValueError, match='attn_implementation="flash"'):
        model.set_attn_implementation("flash")


def test_from_pretrained_takes_transformers_dtype_spellings(tmp_path):
    import transformers

    reference_checkpoint(tmp_path, "BertModel")
    for kwargs in ({"dtype": "float16"}, {"dtype": "auto"}, {"torch_dtype": torch.bfloat16}):
        theirs = transformers.BertModel.from_pretrained(tmp_path, **kwargs)
        assert hfbert.BertModel.from_pretrained(tmp_path, **kwargs).dtype == theirs.dtype, kwargs


def test_legacy_gradient_checkpointing_config_key_as_transformers():
    import transformers

    theirs = transformers.BertConfig(**TESTER_CONFIG)
    theirs.gradient_checkpointing = True
    ours = hfbert.BertConfig.from_dict({**TESTER_CONFIG, "gradient_checkpointing": True})
    for model in (hfbert.BertForMaskedLM(ours), transformers.BertForMaskedLM(theirs)):
        assert model.is_activation_checkpointing


@pytest.mark.parametrize("class_name", ["BertModel", "BertForMaskedLM", "BertForPreTraining"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("mean_resizing", [True, False])
def test_resize_token_embeddings_as_transformers(class_name, tied, mean_resizing):
    import transformers

    fields = {**TESTER_CONFIG, "tie_word_embeddings": tied}
    theirs = randomize_weights(getattr(transformers, class_name)(transformers.BertConfig(**fields)))
    ours = getattr(hfbert, class_name)(hfbert.BertConfig(**fields))
    ours.load_state_dict(theirs.state_dict())
    assert {name: source for name, source in ours._tied_weights_keys.items()} == (
        dict(theirs._tied_weights_keys or {}) if tied or class_name == "BertModel" else ours.tied_weights()
    )
    previous = TESTER_CONFIG["vocab_size"]
    for new_size, multiple in ((109, None), (90, None), (None, 64)):
        torch.manual_seed(0)
        theirs_embeddings = theirs.resize_token_embeddings(
            new_size, pad_to_multiple_of=multiple, mean_resizing=mean_resizing
        )
        torch.manual_seed(0)
        ours_embeddings = ours.resize_token_embeddings(
            new_size, pad_to_multiple_of=multiple, mean_resizing=mean_resizing
        )
        assert ours.config.vocab_size == theirs.config.vocab_size == ours_embeddings.num_embeddings
        kept, previous = min(ours_embeddings.num_embeddings, previous), ours_embeddings.num_embeddings
        assert torch.equal(ours_embeddings.weight[:kept], theirs_embeddings.weight[:kept])
        if not mean_resizing:  # new rows are random in both: normal(0, initializer_range)
            continue
        # transformers samples the new rows around the old rows' mean with 1e-9 of their covariance: the mean.
        assert max_difference(ours_embeddings.weight, theirs_embeddings.weight) <= 1e-4
        if class_name != "BertModel":
            ours_head, theirs_head = ours.get_output_embeddings(), theirs.get_output_embeddings()
            assert max_difference(ours_head.weight, theirs_head.weight) <= 1e-4
            assert max_difference(ours_head.bias, theirs_head.bias) <= 1e-4
            assert ours_head.weight.shape == theirs_head.weight.shape
    assert ours.resize_token_embeddings() is ours.get_input_embeddings()


def test_enable_input_require_grads_as_transformers():
    """PEFT freezes the embeddings and asks for input grads, so gradients reach adapters behind them."""
    import transformers

    inputs = batch_of_ids()
    for model in (
        hfbert.BertModel(hfbert.BertConfig(**TESTER_CONFIG)),
        transformers.BertModel(transformers.BertConfig(**TESTER_CONFIG)),
    ):
        model.requires_grad_(False)
        model.enable_input_require_grads()
        assert model(**inputs).last_hidden_state.requires_grad
        model.disable_input_require_grads()
        assert not model(**inputs).last_hidden_state.requires_grad


# -- loading -------------------------------------------------------------------------------------------------------
def test_ignore_mismatched_sizes_reheads_a_classifier_as_transformers(tmp_path):
    import transformers

    reference_checkpoint(tmp_path, num_labels=2)
    with pytest.raises(CheckpointError, match=r"classifier\.weight is \(2, 32\).*ignore_mismatched_sizes=True"):
        hfbert.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=7)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        transformers.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=7)

    theirs, theirs_info = transformers.BertForSequenceClassification.from_pretrained(
        tmp_path, num_labels=7, ignore_mismatched_sizes=True, output_loading_info=True
    )
    ours, ours_info = hfbert.BertForSequenceClassification.from_pretrained(
        tmp_path, num_labels=7, ignore_mismatched_sizes=True, output_loading_info=True
    )
    assert ours_info["mismatched_keys"] == {(name, tuple(a), tuple(b)) for name, a, b in theirs_info["mismatched_keys"]}
    assert ours_info["missing_keys"] == theirs_info["missing_keys"] == set()
    assert "shape mismatched, reinitialised" in str(ours_info["report"])
    assert ours.classifier.weight.shape == theirs.classifier.weight.shape == (7, 32)
    # Initialised as transformers initialises a new head: weight normal(0, initializer_range), bias zero.
    assert abs(float(ours.classifier.weight.detach().std()) - ours.config.initializer_range) < 0.005
    assert not ours.classifier.bias.any()
    with torch.no_grad():  # the encoder is the checkpoint's
        ours_pooled = ours.bert(**batch_of_ids()).pooler_output
        assert max_difference(ours_pooled, theirs.bert(**batch_of_ids()).pooler_output) <= TOLERANCE


# -- Trainer -------------------------------------------------------------------------------------------------------
def trainer_losses(model, checkpointing: bool, output_dir) -> list[float]:
    generator = torch.Generator().manual_seed(0)
    data = [
        dict(
            input_ids=torch.randint(1, TESTER_CONFIG["vocab_size"], (9,), generator=generator),
            attention_mask=torch.ones(9, dtype=torch.long),
            labels=torch.tensor(index % 3),
        )
        for index in range(16)
    ]
    losses = shared_trainer_losses(model, output_dir, data, activation_checkpointing=checkpointing)
    assert model.is_activation_checkpointing == checkpointing
    return losses


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_trainer_fine_tuning_loss_equals_transformers(checkpointing, tmp_path):
    import transformers

    # Dropout on: the same seed must give the same dropout masks in both libraries.
    reference_checkpoint(tmp_path / "model", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ours = trainer_losses(
        hfbert.BertForSequenceClassification.from_pretrained(tmp_path / "model"), checkpointing, tmp_path / "ours"
    )
    theirs = trainer_losses(
        transformers.BertForSequenceClassification.from_pretrained(tmp_path / "model"),
        checkpointing,
        tmp_path / "theirs",
    )
    assert len(ours) == len(theirs) == 4
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= 1e-4


def test_checkpointing_options_as_transformers(tmp_path):
    """every_n_layers picks the same layers; use_reentrant=True with frozen embeddings still trains (input grads)."""
    import transformers

    theirs = reference_checkpoint(tmp_path, "BertForSequenceClassification", num_hidden_layers=3).train()
    ours = hfbert.BertForSequenceClassification.from_pretrained(tmp_path).train()
    # The spelling Trainer used until transformers 5 on hfbert, the current one on transformers (the old one warns).
    ours.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True}, every_n_layers=2)
    theirs.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True}, every_n_layers=2)
    for model in (ours, theirs):
        model.bert.embeddings.requires_grad_(False)
    assert [ours.bert.checkpointed(i) for i in range(3)] == [
        layer.gradient_checkpointing for layer in theirs.bert.encoder.layer
    ]
    inputs = {**batch_of_ids(), "labels": torch.tensor([0, 2, 1, 0])}
    for model in (ours, theirs):
        model(**inputs).loss.backward()
    ours_gradients = {name: p.grad for name, p in ours.named_parameters() if p.grad is not None}
    theirs_gradients = {name: p.grad for name, p in theirs.named_parameters() if p.grad is not None}
    assert set(ours_gradients) == set(theirs_gradients) and "bert.encoder.layer.0.attention.self.query.weight" in (
        ours_gradients
    )
    for name, gradient in theirs_gradients.items():
        assert max_difference(ours_gradients[name], gradient) <= TOLERANCE, name
    ours.gradient_checkpointing_disable()
    theirs.activation_checkpointing_disable()
    assert not ours.is_activation_checkpointing and not theirs.is_activation_checkpointing
    assert isinstance(theirs, transformers.PreTrainedModel)


# -- PEFT ----------------------------------------------------------------------------------------------------------
def test_peft_lora_train_save_load(tmp_path):
    import peft
    import transformers

    reference_checkpoint(tmp_path / "base")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"])
    torch.manual_seed(1)
    model = peft.get_peft_model(hfbert.BertForSequenceClassification.from_pretrained(tmp_path / "base"), lora)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    inputs, labels = batch_of_ids(), torch.tensor([0, 2, 1, 0])
    for _ in range(3):
        model(**inputs, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        trained = model(**inputs).logits
    model.save_pretrained(tmp_path / "adapter")

    fresh = hfbert.BertForSequenceClassification.from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "base")
    reference = peft.PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, trained)
        assert max_difference(reference(**inputs).logits, trained) <= TOLERANCE
        untrained = hfbert.BertForSequenceClassification.from_pretrained(tmp_path / "base")(**inputs).logits
        assert max_difference(trained, untrained) > 1e-3  # the adapter changed something


# -- torch.export and pytree ---------------------------------------------------------------------------------------
def test_outputs_are_pytree_nodes_like_transformers():
    import torch.utils._pytree as pytree
    import transformers

    ours_model = hfbert.BertForQuestionAnswering(hfbert.BertConfig(**{**TESTER_CONFIG, "num_labels": 2})).eval()
    theirs_model = transformers.BertForQuestionAnswering(transformers.BertConfig(**{**TESTER_CONFIG, "num_labels": 2}))
    theirs_model.load_state_dict(ours_model.state_dict())
    with torch.no_grad():
        ours, theirs = ours_model(**batch_of_ids()), theirs_model.eval()(**batch_of_ids())
    ours_leaves, spec = pytree.tree_flatten(ours)
    theirs_leaves, _ = pytree.tree_flatten(theirs)
    assert len(ours_leaves) == len(theirs_leaves) == 2
    for a, b in zip(ours_leaves, theirs_leaves, strict=True):
        assert max_difference(a, b) <= TOLERANCE
    rebuilt = pytree.tree_unflatten(ours_leaves, spec)
    assert type(rebuilt) is type(ours) and rebuilt.keys() == ours.keys()
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(ours)[0]]
    assert paths == [".start_logits", ".end_logits"]  # torch.export names the outputs by these


def test_torch_export_round_trip_with_default_outputs(tmp_path):
    import transformers

    theirs = reference_checkpoint(tmp_path, "BertModel")
    model = hfbert.BertModel.from_pretrained(tmp_path)
    inputs = batch_of_ids()
    exported = torch.export.export(model, args=(), kwargs=inputs)
    torch.export.save(exported, tmp_path / "bert.pt2")
    loaded = torch.export.load(tmp_path / "bert.pt2").module()
    with torch.no_grad():
        output = loaded(**inputs)
        reference = theirs(**inputs)
    assert isinstance(output, hfbert.BertModelOutput)
    assert max_difference(output.pooler_output, reference.pooler_output) <= TOLERANCE
    # Real positions: like the eager model, the graph gives zeros at the pads of a right-padded batch.
    real = inputs["attention_mask"].bool()
    assert max_difference(output.last_hidden_state, reference.last_hidden_state, real) <= TOLERANCE
    assert isinstance(theirs, transformers.BertModel)


@pytest.mark.slow
def test_compile_fullgraph_with_default_outputs(tmp_path):
    theirs = reference_checkpoint(tmp_path, "BertForSequenceClassification")
    model = hfbert.BertForSequenceClassification.from_pretrained(tmp_path)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # any graph break, e.g. on the output class, is an error
    inputs = batch_of_ids()
    with torch.no_grad():
        output, reference = compiled(**inputs, output_attentions=True), theirs(**inputs)
    assert type(output).__name__ == "LogitsOutput" and len(output.attentions) == TESTER_CONFIG["num_hidden_layers"]
    assert max_difference(output.logits, reference.logits) <= TOLERANCE
