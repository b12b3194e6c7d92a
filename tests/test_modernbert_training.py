"""ModernBERT under the training tools users bring, step for step against transformers' own ModernBert classes and
sentence-transformers on the same folders: transformers' Trainer (with and without activation checkpointing, dropout
off and on), gradient checkpointing's loss and gradients, a PEFT LoRA adapter on `Wqkv`, `Wo` and `Wi`, and hfbert's
encoder swapped into a `SentenceTransformer`. One backward through every task head: test_family_conformance.py.

The checkpoints are transformers' own (`support.members`): 2 layers, layer 1 local with a window of 2 columns each
side, shorter than every example here, so that the sliding layer differs from a global one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import hfbert

from support.helpers import labelled_examples, max_difference, padded_collate, trainer_losses
from support.members import reference_checkpoint, tiny_config, tokenized_checkpoint

transformers = pytest.importorskip("transformers")
# transformers 5 deprecates the older names (`gradient_checkpointing`, `is_gradient_checkpointing`) that recipes and
# PEFT still use, and that these tests use on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing` is deprecated:FutureWarning")

CONFIG = tiny_config("modernbert")
PAD, CLS, SEP = CONFIG["pad_token_id"], CONFIG["cls_token_id"], CONFIG["sep_token_id"]
MASK = CONFIG["vocab_size"] - 1  # the tiny vocabulary has no [MASK]; the last id stands in, never drawn
TOLERANCE = 1e-5
TASKS = {"ForSequenceClassification": "sequence-classification", "ForMaskedLM": "masked-lm"}
# Every dropout of ModernBertConfig at 0.1 (the published checkpoints train with 0.0, fine-tuning recipes raise them).
DROPOUT = dict(embedding_dropout=0.1, attention_dropout=0.1, mlp_dropout=0.1, classifier_dropout=0.1)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """transformers' `ModernBert<task>` of the family's tiny config for the two tasks, random weights far from init,
    saved by `save_pretrained` with ModernBertConfig's dropouts (all 0.0)."""
    directory = tmp_path_factory.mktemp("modernbert")
    return {task: reference_checkpoint(directory / task, "modernbert", name) for task, name in TASKS.items()}


def examples(task: str, count: int = 16) -> list[dict[str, torch.Tensor]]:
    """Sequences of 5 to 8 tokens (wider than the local window, and the collator pads: the window and the rotary
    positions must skip the pads) with a class label, or, for the masked LM, every third token masked and labelled."""
    return labelled_examples(task, count, CLS, SEP, MASK, CONFIG["num_labels"])


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return padded_collate(rows, PAD)


def inputs_of(task: str, count: int = 4) -> dict[str, torch.Tensor]:
    return {key: value for key, value in collate(examples(task, count)).items() if key != "labels"}


def calls_of_first_attention(model: torch.nn.Module) -> list[int]:
    """One entry per run of layer 0's attention: twice per step where the layer is recomputed in the backward."""
    calls: list[int] = []
    model.base_model.layers[0].attn.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    return calls


def assert_same_parameters(ours: torch.nn.Module, theirs: torch.nn.Module, what: str = "weight") -> None:
    """Same names, and every value (or gradient, `what="grad"`) within TOLERANCE of transformers'."""
    ours_parameters, theirs_parameters = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert sorted(ours_parameters) == sorted(theirs_parameters)
    for name, reference in theirs_parameters.items():
        actual = ours_parameters[name] if what == "weight" else ours_parameters[name].grad
        expected = reference if what == "weight" else reference.grad
        assert actual is not None and expected is not None, name
        assert max_difference(actual.detach(), expected.detach()) <= TOLERANCE, name


@pytest.mark.parametrize(
    ("task", "fields", "arguments"),
    [
        ("ForSequenceClassification", {}, {}),
        ("ForSequenceClassification", {}, {"gradient_checkpointing": True}),  # the older name most recipes use
        (
            "ForSequenceClassification",
            {},
            {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": True}},
        ),
        ("ForSequenceClassification", DROPOUT, {"gradient_checkpointing": True}),
        ("ForMaskedLM", {}, {}),
    ],
    ids=["classifier", "classifier-checkpointed", "classifier-checkpointed-reentrant", "classifier-dropout", "mlm"],
)
def test_trainer_fine_tuning_losses_and_weights_equal_transformers(task, fields, arguments, checkpoints, tmp_path):
    """Trainer, 4 steps of AdamW, on hfbert's and transformers' `ModernBert<task>` from the same folder: the same
    losses, the same weights after the last step, layer 0 recomputed where the arguments ask. With dropout on
    (sdpa's attention dropout included) the same seed must draw the same masks in the same order on both sides, also
    when a layer is recomputed."""
    models = {}
    losses = {}
    for side, library in (("ours", hfbert), ("theirs", transformers)):
        model = getattr(library, f"ModernBert{task}").from_pretrained(checkpoints[task], **fields)
        calls = calls_of_first_attention(model)
        losses[side] = trainer_losses(model, tmp_path / side, examples(task), collate, **arguments)
        # Both sides recompute: transformers' ModernBERT checkpoints its layers too, so the reference ran as ours.
        assert len(calls) == (8 if arguments else 4), side
        models[side] = model
    assert len(losses["ours"]) == len(losses["theirs"]) == 4
    assert max(abs(a - b) for a, b in zip(losses["ours"], losses["theirs"], strict=True)) <= 1e-4, losses
    assert_same_parameters(models["ours"], models["theirs"])
    untrained = transformers.AutoModel.from_pretrained(checkpoints[task]).state_dict()
    moved = models["ours"].base_model.state_dict()
    assert max(max_difference(moved[name], tensor) for name, tensor in untrained.items()) > 1e-3  # it trained


@pytest.fixture(scope="module")
def reference_gradients(checkpoints) -> tuple[float, torch.nn.Module]:
    """transformers' classifier after one forward and backward in training mode without checkpointing, and the
    loss."""
    model = transformers.ModernBertForSequenceClassification.from_pretrained(checkpoints["ForSequenceClassification"])
    model.train()
    loss = model(**collate(examples("ForSequenceClassification", 8))).loss
    loss.backward()
    return loss.item(), model


@pytest.mark.parametrize(
    "kwargs", [None, {"use_reentrant": True}, {"use_reentrant": False}], ids=["default", "reentrant", "non-reentrant"]
)
def test_gradient_checkpointing_gives_the_loss_and_gradients_of_transformers(kwargs, checkpoints, reference_gradients):
    """`gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)` on hfbert's classifier: the loss and
    every parameter's gradient of transformers' run without checkpointing, as hfbert's own run without it and
    transformers' run with the same kwargs give them; the checkpointed layers really are recomputed (layer 0's
    attention runs twice)."""
    expected_loss, reference = reference_gradients
    batch = collate(examples("ForSequenceClassification", 8))
    for library, checkpointed in ((hfbert, False), (hfbert, True), (transformers, True)):
        model = library.ModernBertForSequenceClassification.from_pretrained(checkpoints["ForSequenceClassification"])
        if checkpointed and library is hfbert:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # as Trainer and PEFT call it
            assert model.is_gradient_checkpointing
        elif checkpointed:  # transformers' current name: the older one warns of its removal
            model.activation_checkpointing_enable(kwargs)
        calls = calls_of_first_attention(model)
        model.train()
        loss = model(**batch).loss
        loss.backward()
        assert abs(loss.item() - expected_loss) <= TOLERANCE, (library.__name__, checkpointed)
        assert len(calls) == (2 if checkpointed else 1), (library.__name__, checkpointed)
        assert_same_parameters(model, reference, what="grad")


def lora_model(library, base: Path):
    import peft

    lora = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.1,
        target_modules=["Wqkv", "Wo", "Wi"],  # `Wo` names both the attention's and the MLP's output projection
        modules_to_save=["classifier"],
    )
    model = library.ModernBertForSequenceClassification.from_pretrained(base)
    torch.manual_seed(1)  # the same draw of every lora_A, in module order
    return peft.get_peft_model(model, lora)


def test_peft_lora_on_wqkv_wo_wi_trains_as_on_transformers_and_its_adapter_round_trips(checkpoints, tmp_path):
    """LoRA on `Wqkv`, both `Wo` and `Wi` of every layer: the same trainable parameters as on transformers' model,
    the same Trainer losses (LoRA dropout on, reentrant checkpointing behind the frozen embeddings), the same adapter
    and outputs after training; the adapter hfbert saves loads into transformers' model (and back into hfbert's) with
    the trained outputs."""
    peft = pytest.importorskip("peft")
    import safetensors.torch

    task = "ForSequenceClassification"
    base = checkpoints[task]
    ours, theirs = lora_model(hfbert, base), lora_model(transformers, base)
    trainable = sorted(name for name, parameter in ours.named_parameters() if parameter.requires_grad)
    assert trainable == sorted(name for name, parameter in theirs.named_parameters() if parameter.requires_grad)
    lora = [name for name in trainable if ".lora_" in name]
    assert len(lora) == 2 * 4 * CONFIG["num_hidden_layers"]  # A and B on Wqkv, attn.Wo, mlp.Wi, mlp.Wo per layer
    assert {name.split(".lora_")[0].rsplit(".", 1)[1] for name in lora} == {"Wqkv", "Wo", "Wi"}
    assert_same_parameters(ours, theirs)  # the same lora_A draws

    arguments = dict(
        learning_rate=1e-2,
        activation_checkpointing=True,
        activation_checkpointing_kwargs={"use_reentrant": True},
    )
    ours_losses = trainer_losses(ours, tmp_path / "a", examples(task), collate, **arguments)
    theirs_losses = trainer_losses(theirs, tmp_path / "b", examples(task), collate, **arguments)
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )
    assert_same_parameters(ours, theirs)

    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    ours_adapter = safetensors.torch.load_file(tmp_path / "ours" / "adapter_model.safetensors")
    theirs_adapter = safetensors.torch.load_file(tmp_path / "theirs" / "adapter_model.safetensors")
    assert sorted(ours_adapter) == sorted(theirs_adapter)
    for name, tensor in theirs_adapter.items():
        assert max_difference(ours_adapter[name], tensor) <= TOLERANCE, name

    inputs = inputs_of(task)
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        trained = ours(**inputs).logits
        assert max_difference(trained, theirs(**inputs).logits) <= TOLERANCE
        for library in (transformers, hfbert):
            model = library.ModernBertForSequenceClassification.from_pretrained(base)
            loaded = peft.PeftModel.from_pretrained(model, tmp_path / "ours").eval()
            assert max_difference(loaded(**inputs).logits, trained) <= TOLERANCE, library.__name__
        untrained = transformers.ModernBertForSequenceClassification.from_pretrained(base)(**inputs).logits
    assert max_difference(trained, untrained) > 1e-3  # the adapter changed something


TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world!",
    "café naïve résumé",
    "It's a dog's life, isn't it? We're here, they've gone, I'm staying.",
    "x",
    " ".join(["the quick brown fox"] * 12),  # past max_seq_length: truncated
]


@pytest.fixture(scope="module")
def sentence_folder(tmp_path_factory, request) -> Path:
    """A sentence-transformers folder written by sentence-transformers: its `models.Transformer` on transformers'
    ModernBertModel (the ModernBERT tokenizer fixture beside it) and mean `models.Pooling`, `max_seq_length` 24."""
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    root = tmp_path_factory.mktemp("sentence")
    backbone = tokenized_checkpoint(root / "backbone", "modernbert", "model", request)
    modules = [models.Transformer(str(backbone), max_seq_length=24), models.Pooling(32, pooling_mode="mean")]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(root / "sentence"))
    return root / "sentence"


def test_hfbert_as_the_sentence_transformers_backbone_equals_encode(sentence_folder):
    """`sentence_transformer_with_hfbert` on the folder: hfbert's ModernBertModel in the Transformer module, on sdpa
    as transformers' was, and `encode` (mean pooling over real tokens, truncation included) equal element-wise."""
    import sentence_transformers as st

    from hfbert.tools.sentence_transformers_backbone import sentence_transformer_with_hfbert

    reference = st.SentenceTransformer(str(sentence_folder), device="cpu")
    lengths = [len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"]]
    assert min(lengths) <= 4 and max(lengths) > reference.max_seq_length, lengths
    expected = reference.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    ours = sentence_transformer_with_hfbert(sentence_folder, device="cpu")
    assert isinstance(ours[0].model, hfbert.ModernBertModel)
    assert ours[0].model.attn_implementation == "sdpa"
    actual = ours.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    assert actual.shape == expected.shape == (len(TEXTS), 32)
    assert np.abs(actual - expected).max() <= TOLERANCE


def sentence_training_step(model, texts: list[str], optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """One step of a user's loss on the sentence embeddings (training mode); returns the loss."""
    model.train()
    features = model.preprocess(texts)
    embeddings = model(features)["sentence_embedding"]
    loss = (embeddings[0::2] - embeddings[1::2]).square().sum()
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_fine_tuning_through_the_swapped_backbone_equals_sentence_transformers(sentence_folder, tmp_path):
    """A training step through the SentenceTransformer with hfbert's encoder swapped in after the optimizer's
    parameters were collected: the loss and every encoder gradient of sentence-transformers on transformers' encoder;
    saved by `SentenceTransformer.save`, the folder loads back in plain sentence-transformers with the trained
    embeddings."""
    import sentence_transformers as st

    from hfbert.tools.sentence_transformers_backbone import use_hfbert_backbone

    texts = TEXTS[:4]
    reference = st.SentenceTransformer(str(sentence_folder), device="cpu")
    expected_loss = sentence_training_step(reference, texts, torch.optim.SGD(reference.parameters(), lr=0.5))

    ours = st.SentenceTransformer(str(sentence_folder), device="cpu")
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.5)  # before the swap: it must keep updating the encoder
    before = dict(ours[0].model.named_parameters())
    use_hfbert_backbone(ours)
    assert isinstance(ours[0].model, hfbert.ModernBertModel)
    after = dict(ours[0].model.named_parameters())
    assert after.keys() == before.keys() and all(after[name] is before[name] for name in before)
    loss = sentence_training_step(ours, texts, optimizer)
    assert abs(loss.item() - expected_loss.item()) <= TOLERANCE * max(1.0, abs(expected_loss.item()))
    assert_same_parameters(ours[0].model, reference[0].model, what="grad")
    assert_same_parameters(ours[0].model, reference[0].model)

    reference.eval()
    expected = reference.encode(TEXTS, batch_size=4, convert_to_numpy=True)
    ours.save(str(tmp_path / "trained"))
    reloaded = st.SentenceTransformer(str(tmp_path / "trained"), device="cpu")
    assert not isinstance(reloaded[0].model, hfbert.ModernBertModel)
    assert np.abs(reloaded.encode(TEXTS, batch_size=4, convert_to_numpy=True) - expected).max() <= TOLERANCE
    untrained = st.SentenceTransformer(str(sentence_folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(expected - untrained).max() > 1e-3  # the step changed something
