"""MPNet under transformers' Trainer (with and without gradient checkpointing) and with a PEFT LoRA adapter on `q` and
`v`, step for step against transformers' own MPNet classes (issue #42). One backward through every task head of every
member: test_family_conformance.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import labelled_examples, max_difference, padded_collate, randomize_weights, trainer_losses
from support.members import tiny_config

transformers = pytest.importorskip("transformers")


# The family's tiny MPNet (support.members) with a vocabulary of 1000 and all-mpnet-base-v2's 514 positions (no
# tokenizer here; a small embedding and LM head keep the Trainer runs short).
CONFIG = tiny_config("mpnet", vocab_size=1000, max_position_embeddings=514)
PAD, MASK = 1, CONFIG["vocab_size"] - 1  # <pad> at all-mpnet-base-v2's index; <s> is 0 and </s> 2
TOLERANCE = 1e-5
TASKS = ["ForSequenceClassification", "ForMaskedLM"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """transformers' `MPNet<task>` of CONFIG for the two tasks, randomized and saved with dropout on (0.1, MPNetConfig's
    default): both sides load the same file, and a test turns dropout off by overriding the config at load."""
    directory = tmp_path_factory.mktemp("mpnet")
    saved = {}
    for task in TASKS:
        torch.manual_seed(0)
        model = getattr(transformers, f"MPNet{task}")(transformers.MPNetConfig(**CONFIG))
        randomize_weights(model).save_pretrained(directory / task)
        saved[task] = directory / task
    return saved


@pytest.fixture(scope="module")
def reference_losses(checkpoints, tmp_path_factory) -> Callable[[str], list[float]]:
    """transformers' Trainer losses on its own MPNet<task>, computed once per task for the runs compared to it."""
    losses: dict[str, list[float]] = {}

    def of(task: str) -> list[float]:
        if task not in losses:
            model = getattr(transformers, f"MPNet{task}").from_pretrained(checkpoints[task])
            losses[task] = trainer_losses(model, tmp_path_factory.mktemp("reference"), examples(task), collate)
        return losses[task]

    return of


def examples(task: str, count: int = 16) -> list[dict[str, torch.Tensor]]:
    """Sentences of unequal lengths (the collator pads, and positions and the bias must skip the pads) with a class
    label, or, for the masked LM, every third token masked and labelled."""
    return labelled_examples(task, count, 0, 2, MASK, CONFIG["num_labels"])


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return padded_collate(rows, PAD)


def calls_of_first_layer(model: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    # On a submodule: the layer's own hooks run once per step, outside its checkpoint, as transformers' do.
    model.base_model.encoder.layer[0].attention.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    return calls


@pytest.mark.parametrize(
    ("task", "arguments"),
    [
        ("ForSequenceClassification", {}),
        ("ForSequenceClassification", {"gradient_checkpointing": True}),  # the older name most recipes still use
        (
            "ForSequenceClassification",
            {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": True}},
        ),
        ("ForMaskedLM", {}),
        ("ForMaskedLM", {"activation_checkpointing": True}),
    ],
    ids=["classifier", "classifier-checkpointed", "classifier-checkpointed-reentrant", "mlm", "mlm-checkpointed"],
)
def test_trainer_fine_tuning_losses_equal_transformers(task, arguments, checkpoints, reference_losses, tmp_path):
    # Dropout on everywhere: the same seed must draw the same masks in both, in the same order, also when a layer is
    # recomputed. transformers' MPNet attends eagerly only, so ours runs eager too (sdpa draws its own masks).
    ours = getattr(hfbert, f"MPNet{task}").from_pretrained(checkpoints[task], attn_implementation="eager")
    calls = calls_of_first_layer(ours)
    ours_losses = trainer_losses(ours, tmp_path, examples(task), collate, **arguments)
    # transformers' MPNet refuses activation checkpointing (supports_gradient_checkpointing is False); recomputing
    # a layer changes when it runs, not what it computes, so the reference is its plain run.
    theirs_losses = reference_losses(task)
    assert len(ours_losses) == len(theirs_losses) == 4
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )
    assert len(calls) == (8 if arguments else 4)  # checkpointed: layer 0 runs again in every backward pass


def lora_model(model_class, base: Path):
    import peft

    lora = peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q", "v"], modules_to_save=["classifier"]
    )
    # No attention dropout: ours trains on its default sdpa kernel (the bias as an additive mask), which draws
    # other masks than transformers' eager one.
    model = model_class.from_pretrained(base, attention_probs_dropout_prob=0.0)
    torch.manual_seed(1)  # the same draw of every lora_A
    return peft.get_peft_model(model, lora)


def test_peft_lora_on_q_v_trains_as_on_transformers_and_its_adapter_round_trips(checkpoints, tmp_path):
    import peft
    import safetensors.torch

    task = "ForSequenceClassification"
    base = checkpoints[task]
    ours = lora_model(hfbert.MPNetForSequenceClassification, base)
    theirs = lora_model(transformers.MPNetForSequenceClassification, base)
    trainable = sorted(name for name, parameter in ours.named_parameters() if parameter.requires_grad)
    assert trainable == sorted(name for name, parameter in theirs.named_parameters() if parameter.requires_grad)
    lora = [name for name in trainable if ".lora_" in name]
    assert len(lora) == 2 * 2 * CONFIG["num_hidden_layers"]  # A and B on q and v of every layer
    assert {name.split(".lora_")[0].rsplit(".", 1)[1] for name in lora} == {"q", "v"}

    ours_losses = trainer_losses(ours, tmp_path / "a", examples(task), collate, learning_rate=1e-2)
    theirs_losses = trainer_losses(theirs, tmp_path / "b", examples(task), collate, learning_rate=1e-2)
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

    inputs = {key: value for key, value in collate(examples(task, 4)).items() if key != "labels"}
    ours.eval()
    with torch.no_grad():
        trained = ours(**inputs).logits
        for model_class in (hfbert.MPNetForSequenceClassification, transformers.MPNetForSequenceClassification):
            loaded = peft.PeftModel.from_pretrained(model_class.from_pretrained(base), tmp_path / "ours").eval()
            assert max_difference(loaded(**inputs).logits, trained) <= TOLERANCE, model_class
        untrained = hfbert.MPNetForSequenceClassification.from_pretrained(base)(**inputs).logits
    assert max_difference(trained, untrained) > 1e-3  # the adapter changed something
