"""DistilBERT under transformers' Trainer (with and without activation checkpointing) and with a PEFT LoRA adapter on
`q_lin` and `v_lin`, step for step against transformers' own DistilBERT classes (issue #68). One backward through
every task head: test_family_conformance.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import labelled_examples, max_difference, padded_collate, randomize_weights, trainer_losses
from support.members import tiny_config

transformers = pytest.importorskip("transformers")

# The family's tiny DistilBERT (support.members) with a vocabulary of 1000: [PAD] 0, [CLS] 1, [SEP] 2, [MASK] last.
CONFIG = tiny_config("distilbert", vocab_size=1000)
PAD, CLS, SEP, MASK = 0, 1, 2, CONFIG["vocab_size"] - 1
TASKS = ["ForSequenceClassification", "ForMaskedLM"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """transformers' `DistilBert<task>` of CONFIG, randomized and saved with its dropouts on (0.1, 0.2 before the
    classifier)."""
    directory = tmp_path_factory.mktemp("distilbert")
    for task in TASKS:
        torch.manual_seed(0)
        model = getattr(transformers, f"DistilBert{task}")(transformers.DistilBertConfig(**CONFIG))
        randomize_weights(model).save_pretrained(directory / task)
    return {task: directory / task for task in TASKS}


def examples(task: str, count: int = 16) -> list[dict[str, torch.Tensor]]:
    return labelled_examples(task, count, CLS, SEP, MASK, CONFIG["num_labels"])


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return padded_collate(rows, PAD)


# One run in the default test run; the others (a few seconds each) in the slow one.
slow = pytest.mark.slow


@pytest.mark.parametrize(
    ("task", "arguments"),
    [
        ("ForSequenceClassification", {}),
        pytest.param("ForSequenceClassification", {"activation_checkpointing": True}, marks=slow),
        pytest.param("ForMaskedLM", {}, marks=slow),
        pytest.param("ForMaskedLM", {"activation_checkpointing": True}, marks=slow),
    ],
    ids=["classifier", "classifier-checkpointed", "mlm", "mlm-checkpointed"],
)
def test_trainer_fine_tuning_losses_equal_transformers(task, arguments, checkpoints, tmp_path):
    """Dropout on everywhere, both on the eager kernel: the same seed draws the same masks in the same order (a
    recomputed layer too)."""
    ours = getattr(hfbert, f"DistilBert{task}").from_pretrained(checkpoints[task], attn_implementation="eager")
    theirs = getattr(transformers, f"DistilBert{task}").from_pretrained(checkpoints[task], attn_implementation="eager")
    ours_losses = trainer_losses(ours, tmp_path / "ours", examples(task), collate, **arguments)
    theirs_losses = trainer_losses(theirs, tmp_path / "theirs", examples(task), collate, **arguments)
    assert len(ours_losses) == len(theirs_losses) == 4
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )


def lora_model(model_class, base: Path):
    import peft

    # PEFT has no default target modules for DistilBERT (nor for transformers' model): DistilBERT's q and v.
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_lin", "v_lin"], modules_to_save=["pre_classifier", "classifier"]
    )
    model = model_class.from_pretrained(base, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)
    torch.manual_seed(1)  # the same draw of every lora_A
    return peft.get_peft_model(model, lora)


@slow
def test_peft_lora_on_q_lin_v_lin_trains_as_on_transformers(checkpoints, tmp_path):
    import peft

    base = checkpoints["ForSequenceClassification"]
    ours = lora_model(hfbert.DistilBertForSequenceClassification, base)
    theirs = lora_model(transformers.DistilBertForSequenceClassification, base)
    trainable = sorted(name for name, parameter in ours.named_parameters() if parameter.requires_grad)
    assert trainable == sorted(name for name, parameter in theirs.named_parameters() if parameter.requires_grad)
    assert len([name for name in trainable if ".lora_" in name]) == 2 * 2 * CONFIG["num_hidden_layers"]
    task = "ForSequenceClassification"
    ours_losses = trainer_losses(ours, tmp_path / "a", examples(task), collate, learning_rate=1e-2)
    theirs_losses = trainer_losses(theirs, tmp_path / "b", examples(task), collate, learning_rate=1e-2)
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )
    ours.save_pretrained(tmp_path / "ours")
    inputs = {key: value for key, value in collate(examples(task, 4)).items() if key != "labels"}
    ours.eval()
    with torch.no_grad():
        trained = ours(**inputs).logits
        loaded = transformers.DistilBertForSequenceClassification.from_pretrained(base)
        loaded = peft.PeftModel.from_pretrained(loaded, tmp_path / "ours").eval()
        assert max_difference(loaded(**inputs).logits, trained) <= 1e-5
