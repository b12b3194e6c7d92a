"""DeBERTa-v3 (issue #68) with a PEFT LoRA adapter on its attention's `query_proj` / `value_proj`, against
transformers' own DebertaV2ForSequenceClassification with the same adapter: the loss and every trainable gradient of
one step, the losses of transformers' Trainer, the saved adapter's tensors, and that adapter loaded into
transformers' model giving the trained model's logits. (One backward through every head: the conformance suite.)

The checkpoint is the family's tiny DeBERTa-v3 (`support.members`: relative c2p and p2c terms, shared keys, 8 log
buckets), written by transformers with random weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import labelled_examples, max_difference, padded_collate, trainer_losses
from support.members import TINY, reference_checkpoint

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

CLS, SEP, PAD = 1, 2, 0  # deberta-v3-base's [CLS], [SEP] and [PAD]
TARGETS = ["query_proj", "value_proj"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return reference_checkpoint(tmp_path_factory.mktemp("deberta-v2"), "deberta-v2", "sequence-classification")


def examples(count: int = 16) -> list[dict[str, torch.Tensor]]:
    """Sentences of 5 to 8 tokens (the collator pads them, and the relative terms must skip the pads) with labels."""
    return labelled_examples("ForSequenceClassification", count, CLS, SEP, TINY["vocab_size"] - 1, TINY["num_labels"])


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return padded_collate(rows, PAD)


def lora(model_class, base: Path, init_lora_weights: bool = True, **fields):
    """`model_class` from `base` with the same LoRA adapter: r 4 on TARGETS, the pooler and classifier trained;
    `init_lora_weights` False draws lora_B at random too (PEFT's default zeroes it)."""
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=TARGETS,
        modules_to_save=["pooler", "classifier"],
        init_lora_weights=init_lora_weights,
    )
    model = model_class.from_pretrained(base, **fields)
    torch.manual_seed(1)  # the same draw of every lora_A
    return peft.get_peft_model(model, config)


def test_lora_loss_and_gradients_equal_transformers(base):
    """No dropout: one step's loss and the gradient of every trainable tensor, with lora_A and lora_B both drawn at
    random, so that the adapter changes the disentangled attention's queries and values and every LoRA tensor gets a
    gradient."""
    off = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pooler_dropout": 0.0}
    ours = lora(hfbert.DebertaV2ForSequenceClassification, base, False, **off).train()
    theirs = lora(transformers.DebertaV2ForSequenceClassification, base, False, **off).train()
    trainable = {name: parameter for name, parameter in ours.named_parameters() if parameter.requires_grad}
    reference = {name: parameter for name, parameter in theirs.named_parameters() if parameter.requires_grad}
    assert sorted(trainable) == sorted(reference)
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[1] for name in trainable if ".lora_" in name}
    assert adapted == set(TARGETS)
    assert sum(".lora_" in name for name in trainable) == 2 * len(TARGETS) * TINY["num_hidden_layers"]

    batch = collate(examples(8))
    assert (batch["attention_mask"] == 0).any()  # padded rows
    ours_loss, theirs_loss = ours(**batch).loss, theirs(**batch).loss
    ours_loss.backward()
    theirs_loss.backward()
    assert abs(ours_loss.item() - theirs_loss.item()) <= TOLERANCE
    for name, parameter in reference.items():
        assert parameter.grad is not None and trainable[name].grad is not None, name
        scale = max(1.0, float(parameter.grad.abs().max()))
        assert max_difference(trainable[name].grad, parameter.grad) <= TOLERANCE * scale, name
    assert all(float(gradient.grad.abs().max()) > 1e-4 for gradient in reference.values())


@pytest.mark.slow  # two Trainer runs
def test_lora_trains_as_on_transformers_and_its_adapter_loads_into_transformers(base, tmp_path):
    import safetensors.torch

    # Attention dropout off: ours attends with sdpa (the relative terms as an additive mask), which draws other masks
    # than transformers' eager softmax; the other dropouts stay on and draw the same masks in the same order.
    ours = lora(hfbert.DebertaV2ForSequenceClassification, base, attention_probs_dropout_prob=0.0)
    theirs = lora(transformers.DebertaV2ForSequenceClassification, base, attention_probs_dropout_prob=0.0)
    ours_losses = trainer_losses(ours, tmp_path / "a", examples(), collate, learning_rate=1e-2)
    theirs_losses = trainer_losses(theirs, tmp_path / "b", examples(), collate, learning_rate=1e-2)
    assert len(ours_losses) == 4
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )

    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    ours_adapter = safetensors.torch.load_file(tmp_path / "ours" / "adapter_model.safetensors")
    theirs_adapter = safetensors.torch.load_file(tmp_path / "theirs" / "adapter_model.safetensors")
    assert sorted(ours_adapter) == sorted(theirs_adapter)
    for name, tensor in theirs_adapter.items():
        assert max_difference(ours_adapter[name], tensor) <= 1e-4, name

    inputs = {key: value for key, value in collate(examples(4)).items() if key != "labels"}
    with torch.no_grad():
        trained = ours.eval()(**inputs).logits
        model = transformers.DebertaV2ForSequenceClassification.from_pretrained(base)
        loaded = peft.PeftModel.from_pretrained(model, tmp_path / "ours").eval()
        assert max_difference(loaded(**inputs).logits, trained) <= TOLERANCE
        untrained = hfbert.DebertaV2ForSequenceClassification.from_pretrained(base).eval()(**inputs).logits
    assert max_difference(trained, untrained) > 1e-3  # the adapter changed something
