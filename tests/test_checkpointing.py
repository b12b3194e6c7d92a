"""Gradient checkpointing options as transformers has them: offload and every_n_layers give transformers' gradients,
and the `gradient_checkpointing` flag that PEFT reads on every module says what transformers' says."""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import SMALL_CONFIG, max_difference, randomize_weights

CONFIG = {**SMALL_CONFIG, "num_labels": 3, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def model_pair():
    import transformers

    torch.manual_seed(0)
    theirs = randomize_weights(transformers.BertForSequenceClassification(transformers.BertConfig(**CONFIG))).train()
    ours = hfbert.BertForSequenceClassification(hfbert.BertConfig(**CONFIG)).train()
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


def gradients(model) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, CONFIG["vocab_size"], (4, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 2, 1, 0])).loss.backward()
    return {name: parameter.grad for name, parameter in model.named_parameters() if parameter.grad is not None}


def test_offloaded_checkpointing_every_second_layer_gives_transformers_gradients():
    ours, theirs = model_pair()
    ours.activation_checkpointing_enable(every_n_layers=2, offload=True)
    # transformers' offload pins host memory, which needs a GPU: offloading moves where the saved inputs wait,
    # not what is computed, so its gradients are those of plain checkpointing.
    theirs.activation_checkpointing_enable(every_n_layers=2)
    assert [ours.bert.checkpointed(i) for i in range(CONFIG["num_hidden_layers"])] == [
        layer.gradient_checkpointing for layer in theirs.bert.encoder.layer
    ]
    calls = []
    # On a submodule: the layer's own hooks run once per step, outside its checkpoint, as transformers' do.
    ours.bert.encoder.layer[0].attention.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    ours_gradients, theirs_gradients = gradients(ours), gradients(theirs)
    assert len(calls) == 2  # layer 0 recomputed in the backward pass
    assert set(ours_gradients) == set(theirs_gradients)
    for name, gradient in theirs_gradients.items():
        assert max_difference(ours_gradients[name], gradient) <= 1e-5, name


def test_gradient_checkpointing_flag_on_modules_as_transformers():
    """PEFT refuses prefix tuning when any module of the base model has `gradient_checkpointing` true."""
    ours, theirs = model_pair()

    def flagged(model) -> bool:
        return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())

    assert flagged(ours) == flagged(theirs) == False  # noqa: E712
    ours.gradient_checkpointing_enable()
    theirs.activation_checkpointing_enable()
    assert flagged(ours) == flagged(theirs) == True  # noqa: E712
    assert ours.is_gradient_checkpointing and theirs.is_gradient_checkpointing
    ours.gradient_checkpointing_disable()
    theirs.activation_checkpointing_disable()
    assert flagged(ours) == flagged(theirs) == False  # noqa: E712


def test_refused_every_n_layers_changes_nothing():
    ours, _ = model_pair()
    ours.activation_checkpointing_enable(every_n_layers=2)
    before = ours.bert.encoder.checkpointing
    with pytest.raises(ValueError, match="every_n_layers must be a positive integer, got 0"):
        ours.activation_checkpointing_enable(every_n_layers=0)
    assert ours.bert.encoder.checkpointing == before and ours.is_activation_checkpointing
