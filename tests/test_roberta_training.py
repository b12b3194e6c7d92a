"""RoBERTa under transformers' Trainer and with a PEFT LoRA adapter, step for step against transformers' own class."""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import randomize_weights, trainer_losses
from support.members import tiny_config

transformers = pytest.importorskip("transformers")
PAD = 1
CONFIG = tiny_config("roberta")


def checkpoint(directory, **fields):
    config = transformers.RobertaConfig(**{**CONFIG, **fields})
    torch.manual_seed(0)
    randomize_weights(transformers.RobertaForSequenceClassification(config)).save_pretrained(directory)
    return directory


def examples(count: int = 16) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for index in range(count):
        length = 5 + index % 4  # unequal lengths: the collator pads with the pad id, positions must skip it
        ids = torch.randint(3, CONFIG["vocab_size"], (length,), generator=generator)
        ids[0], ids[-1] = 0, 2
        rows.append({"input_ids": ids, "labels": torch.tensor(index % 3)})
    return rows


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    longest = max(len(row["input_ids"]) for row in rows)
    input_ids = torch.full((len(rows), longest), PAD)
    for index, row in enumerate(rows):
        input_ids[index, : len(row["input_ids"])] = row["input_ids"]
    labels = torch.stack([row["labels"] for row in rows])
    return {"input_ids": input_ids, "attention_mask": (input_ids != PAD).long(), "labels": labels}


def test_trainer_fine_tuning_losses_equal_transformers(tmp_path):
    # Dropout on: the same seed must give the same dropout masks in both (the classification head drops out twice).
    checkpoint(tmp_path / "model", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    ours = trainer_losses(
        hfbert.RobertaForSequenceClassification.from_pretrained(tmp_path / "model"), tmp_path / "a", examples(), collate
    )
    theirs = trainer_losses(
        transformers.RobertaForSequenceClassification.from_pretrained(tmp_path / "model"),
        tmp_path / "b",
        examples(),
        collate,
    )
    assert len(ours) == len(theirs) == 4
    assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) <= 1e-4


def test_peft_lora_adapter_trained_on_hfbert_loads_into_transformers(tmp_path):
    import peft

    checkpoint(tmp_path / "base")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"])
    torch.manual_seed(1)
    model = peft.get_peft_model(hfbert.RobertaForSequenceClassification.from_pretrained(tmp_path / "base"), lora)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = collate(examples(4))
    for _ in range(3):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        trained = model(**inputs).logits
    model.save_pretrained(tmp_path / "adapter")
    reference = transformers.RobertaForSequenceClassification.from_pretrained(tmp_path / "base")
    reference = peft.PeftModel.from_pretrained(reference, tmp_path / "adapter").eval()
    untrained = hfbert.RobertaForSequenceClassification.from_pretrained(tmp_path / "base")
    with torch.no_grad():
        torch.testing.assert_close(reference(**inputs).logits, trained, atol=1e-5, rtol=1e-5)
        assert (trained - untrained(**inputs).logits).abs().max() > 1e-3  # the adapter changed something
