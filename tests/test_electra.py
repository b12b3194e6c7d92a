"""ELECTRA where the conformance suite (test_family_conformance.py, which runs every class of the row against
transformers) cannot reach: its config against transformers' ElectraConfig, an embedding as wide as the layers (no
`embeddings_project`, as electra-base's), every multiple-choice summary, the discriminator's loss without a mask,
resizing the generator's vocabulary, bad fields and a checkpoint of another family; the tokenizer on the hard texts
of test_tokenizer.py in both of ELECTRA's Hub layouts; `rerank` on an ms-marco-ELECTRA-shaped cross-encoder and
`fill-mask` on the generator. Every expected value comes from transformers or sentence-transformers.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import hfbert
from converters.errors import CheckpointError
from hfbert.cli import main

from support.checkpoints import REFERENCE
from support.helpers import randomize_weights
from support.members import reference_checkpoint, tiny_config, tokenized_checkpoint
from support.retrieval import DOCUMENTS, QUERIES

transformers = pytest.importorskip("transformers")

OFF = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "summary_last_dropout": 0.0}


def pair(task: str = "Model", seed: int = 0, **fields):
    """transformers' Electra`task` with the tiny config and random weights, and hfbert's with its state dict."""
    config = tiny_config("electra", **fields)
    theirs = getattr(transformers, f"Electra{task}")(transformers.ElectraConfig(**config))
    torch.manual_seed(seed)
    theirs = randomize_weights(theirs).eval()
    ours = getattr(hfbert, f"Electra{task}")(hfbert.ElectraConfig(**config)).eval()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def padded(lengths=(9, 5, 3), choices: int = 0) -> dict:
    """Right-padded random ids with two segments (a (rows / choices, choices, width) view for multiple choice)."""
    generator = torch.Generator().manual_seed(0)
    width = max(lengths)
    input_ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(3, 99, (length,), generator=generator)
        mask[row, :length] = 1
    token_type_ids = (torch.arange(width) >= width // 2).long().expand_as(input_ids) * mask
    inputs = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": token_type_ids}
    if choices:
        inputs = {name: value.view(-1, choices, width) for name, value in inputs.items()}
    return inputs


def test_config_has_transformers_fields_and_defaults():
    theirs = json.loads(json.dumps(transformers.ElectraConfig().to_dict()))
    ours = json.loads(json.dumps(hfbert.ElectraConfig().to_dict()))
    generic = {"transformers_version", "_name_or_path", "is_encoder_decoder"}
    assert {key: ours.get(key) for key in theirs if key not in generic} == {
        key: value for key, value in theirs.items() if key not in generic
    }
    # The one field more: transformers' BERT-family checkpoints write it, and hfbert refuses any but "absolute".
    assert set(ours) - set(theirs) == {"position_embedding_type"}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("summary_type", "attn", r"'summary_type' is 'attn'; expected one of \('first', 'last', 'mean', 'cls_index'\)"),
        ("summary_activation", "softmax", r"'summary_activation' is 'softmax'; supported: '' \(none\), gelu"),
        ("summary_activation", None, r"'summary_activation' is None; supported: '' \(none\), gelu"),
        ("embedding_size", 0, r"'embedding_size' must be a positive integer, got 0"),
        ("summary_last_dropout", 1.5, r"'summary_last_dropout' must be a number in \[0, 1\]"),
        ("position_embedding_type", "relative_key", r"'position_embedding_type' is 'relative_key'"),
        ("summary_use_proj", "yes", r"'summary_use_proj' must be true or false"),
    ],
)
def test_a_bad_field_is_named_with_its_file(field, value, message, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "electra", field: value}))
    with pytest.raises(hfbert.ConfigError, match=rf"{tmp_path / 'config.json'}: field {message}"):
        hfbert.AutoConfig.from_pretrained(tmp_path)


def test_an_embedding_as_wide_as_the_layers_has_no_projection():
    """electra-base's shape (embedding_size == hidden_size, the ms-marco cross-encoders'): no `embeddings_project`,
    in both libraries, and the same outputs."""
    theirs, ours = pair("Model", embedding_size=32)
    assert "embeddings_project" not in dict(ours.named_children())
    inputs = padded()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected, actual = theirs(**inputs, output_hidden_states=True), ours(**inputs, output_hidden_states=True)
    torch.testing.assert_close(actual.last_hidden_state[real], expected.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual.hidden_states[0][real], expected.hidden_states[0][real], atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="ELECTRA has no pooler"):
        hfbert.ElectraModel(hfbert.ElectraConfig(**tiny_config("electra")), add_pooling_layer=True)


@pytest.mark.parametrize(
    "summary",
    [
        {"summary_type": "last"},
        {"summary_type": "mean", "summary_use_proj": False, "summary_activation": ""},
        {"summary_type": "cls_index", "summary_activation": "tanh"},
    ],
    ids=lambda summary: ",".join(f"{key}={value}" for key, value in summary.items()),
)
def test_every_multiple_choice_summary_equals_transformers(summary):
    """The summaries that read pad columns ("last", "mean", "cls_index") keep the encoder padded, so their scores
    equal transformers' on right-padded choices too."""
    theirs, ours = pair("ForMultipleChoice", **OFF, **summary)
    assert ours.electra.padding_free == (summary["summary_type"] == "first")
    inputs, labels = padded((9, 5, 3, 7, 2, 4), choices=3), torch.tensor([2, 0])
    with torch.no_grad():
        expected, actual = theirs(**inputs, labels=labels), ours(**inputs, labels=labels)
    torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-5, rtol=1e-5)


def test_the_discriminator_loss_without_a_mask_and_bad_labels():
    theirs, ours = pair("ForPreTraining")
    input_ids = padded((6, 6))["input_ids"]
    labels = torch.tensor([[0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 1]])
    with torch.no_grad():
        expected, actual = theirs(input_ids, labels=labels), ours(input_ids, labels=labels)
    torch.testing.assert_close(actual.loss, expected.loss, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match=r"labels has shape \(2, 5\); expected \(2, 6\), one per token"):
        ours(input_ids, labels=labels[:, :5])


@pytest.mark.parametrize("tie", [True, False])
def test_resizing_the_generators_vocabulary_follows_transformers(tie):
    """The decoder's weight (the new embeddings when tied, grown with the mean when not) and its bias (zeros while
    tied, the old mean untied), as transformers resizes them; the logits then agree."""
    theirs, ours = pair("ForMaskedLM", tie_word_embeddings=tie)
    for model in (theirs, ours):
        model.resize_token_embeddings(105)
    assert ours.generator_lm_head.weight.shape == theirs.generator_lm_head.weight.shape == (105, 16)
    assert (ours.generator_lm_head.weight is ours.electra.embeddings.word_embeddings.weight) == tie
    torch.testing.assert_close(ours.generator_lm_head.bias, theirs.generator_lm_head.bias, atol=1e-6, rtol=0)
    if not tie:  # transformers samples around the mean with 1e-9 of the covariance: the mean, to fp32 precision
        torch.testing.assert_close(ours.generator_lm_head.weight, theirs.generator_lm_head.weight, atol=1e-5, rtol=0)
    ours.load_state_dict(theirs.state_dict())
    inputs = padded()
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits[real], theirs(**inputs).logits[real], atol=1e-5, rtol=1e-5)


def test_inputs_embeds_are_embedding_size_wide():
    theirs, ours = pair("Model")
    inputs_embeds = torch.randn(2, 4, 16)
    with torch.no_grad():
        expected, actual = theirs(inputs_embeds=inputs_embeds), ours(inputs_embeds=inputs_embeds)
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)


def test_an_electra_checkpoint_under_a_bert_config_is_refused_naming_the_file(tmp_path):
    directory = reference_checkpoint(tmp_path / "electra", "electra", "masked-lm")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(CheckpointError, match=r"named as a 'electra' checkpoint's, but \S*config\.json says"):
        hfbert.AutoModelForMaskedLM.from_pretrained(directory)


def test_a_factorized_checkpoint_under_an_unfactorized_config_names_the_tensors(tmp_path):
    """electra-small's weights (embedding 16 wide, then `embeddings_project`) under a config.json whose
    embedding_size is hidden_size: refused, naming the projection and the embeddings' widths against config.json."""
    directory = reference_checkpoint(tmp_path / "electra", "electra", "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "embedding_size": config["hidden_size"]}))
    with pytest.raises(CheckpointError) as refused:
        hfbert.AutoModel.from_pretrained(directory)
    message = str(refused.value)
    assert f"does not match the model built from {directory / 'config.json'}" in message
    assert "unexpected in the checkpoint: embeddings_project.weight" in message
    assert "embeddings.word_embeddings.weight is (99, 16) in the checkpoint, (99, 32) in the model" in message


# -- the tokenizer -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["tokenizer_class ElectraTokenizer", "model_type electra"])
def test_the_tokenizer_equals_transformers_on_the_hard_texts(layout, tmp_path):
    """google/electra-*'s files: vocab.txt and a tokenizer_config.json, naming ElectraTokenizer or (the discriminators'
    own) nothing, beside a config.json of model_type electra: BERT's WordPiece pipeline, built from vocab.txt."""
    from test_tokenizer import CORPUS, PAIRS, assert_same

    shutil.copy(REFERENCE / "vocab.txt", tmp_path / "vocab.txt")
    named = {"tokenizer_class": "ElectraTokenizer"} if layout.startswith("tokenizer_class") else {}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, **named}))
    (tmp_path / "config.json").write_text(
        json.dumps({**tiny_config("electra", vocab_size=30522), "model_type": "electra"})
    )
    ours, theirs = hfbert.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert type(ours) is hfbert.BertTokenizer
    assert ours("hello world")["input_ids"] == theirs("hello world")["input_ids"] == [101, 7592, 2088, 102]
    options = {"padding": True, "truncation": True, "max_length": 64, "return_offsets_mapping": True}
    assert_same(ours(CORPUS, **options), theirs(CORPUS, **options))
    firsts, seconds = zip(*PAIRS, strict=True)
    assert_same(ours(list(firsts), list(seconds), **options), theirs(list(firsts), list(seconds), **options))


# -- the tools -------------------------------------------------------------------------------------------------------


def test_rerank_on_an_ms_marco_electra_cross_encoder_equals_sentence_transformers(tmp_path, request, capsys):
    """cross-encoder/ms-marco-electra-base's shape: ElectraForSequenceClassification with one label, an embedding
    as wide as the layers, ELECTRA's tokenizer; saved by sentence-transformers' CrossEncoder (Sigmoid by default)."""
    st = pytest.importorskip("sentence_transformers")
    raw = tokenized_checkpoint(tmp_path / "raw", "electra", "sequence-classification", request, num_labels=1)
    model = transformers.ElectraForSequenceClassification.from_pretrained(raw)
    with torch.no_grad():  # scores spread over units, not hundredths
        model.classifier.out_proj.weight.mul_(5.0)
    model.save_pretrained(raw)
    st.CrossEncoder(str(raw), device="cpu").save(str(tmp_path / "cross"))
    directory = tmp_path / "cross"
    theirs, ours = st.CrossEncoder(str(directory), device="cpu"), hfbert.CrossEncoder(directory)
    pairs = [(query, document) for query in QUERIES for document in DOCUMENTS]
    expected, actual = theirs.predict(pairs, batch_size=8), ours.predict(pairs, batch_size=8)
    assert np.ptp(expected) > 0.01
    assert np.abs(actual - expected).max() <= 1e-5
    documents = tmp_path / "docs.txt"
    documents.write_text("".join(document + "\n" for document in DOCUMENTS), encoding="utf-8")
    ranked = theirs.rank(QUERIES[1], DOCUMENTS)
    assert main(["rerank", str(directory), "--query", QUERIES[1], "--file", str(documents)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["index"] for line in lines] == [entry["corpus_id"] for entry in ranked]
    assert max(abs(line["score"] - entry["score"]) for line, entry in zip(lines, ranked, strict=True)) <= 1e-5


@pytest.mark.slow  # the masked LM's parity runs in the conformance suite; this is the head-less layout
def test_parity_on_the_discriminator_passes_layer_by_layer(tmp_path, request):
    """`hfbert parity` on a discriminator's save (google/electra-*-discriminator's layout: no generator head): the
    embeddings (after `embeddings_project`) and every layer against transformers in float64."""
    from support.family import TEXTS

    directory = tokenized_checkpoint(tmp_path / "discriminator", "electra", "pretraining", request)
    texts, report = tmp_path / "texts.txt", tmp_path / "report.json"
    texts.write_text("".join(text + "\n" for text in TEXTS), encoding="utf-8")
    assert main(["parity", str(directory), "--texts", str(texts), "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    assert written["passed"] is True
    assert {"embeddings", "layer 0", "layer 1"} <= {row["name"] for row in written["rows"]}


def test_fill_mask_on_the_generator_equals_transformers_pipeline(tmp_path, request, capsys):
    directory = tokenized_checkpoint(tmp_path / "generator", "electra", "masked-lm", request)
    text = "Paris is the [MASK] of France."
    fill = transformers.pipeline("fill-mask", model=str(directory), tokenizer=str(directory), device="cpu")
    expected = fill(text, top_k=5)
    assert main(["fill-mask", str(directory), text, "--top-k", "5", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert [p["token"] for p in ours] == [p["token"] for p in expected]
    assert np.abs(np.array([p["score"] for p in ours]) - [p["score"] for p in expected]).max() <= 1e-6
    assert [p["sequence"] for p in ours] == [p["sequence"] for p in expected]
    # Without the generator's head (a discriminator's save), the error names the row's head tensors.
    discriminator = reference_checkpoint(tmp_path / "discriminator", "electra", "pretraining")
    assert main(["fill-mask", str(discriminator), "a [MASK] b"]) != 0
    assert "generator_predictions" in capsys.readouterr().err


# -- the fast paths ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "bound"),
    [
        pytest.param({}, None, id="packed"),
        pytest.param({"precision": "high"}, None, id="high"),
        pytest.param({"quantize": "int8"}, 0.05, id="int8"),
        pytest.param({"precision": "bf16"}, 0.05, id="bf16", marks=pytest.mark.slow),  # measures its kernels first
    ],
)
def test_the_fast_paths_on_the_cross_encoder_keep_their_contract(options, bound, monkeypatch):
    """`optimize_for_inference` on the sequence classifier (every linear layer swapped, `embeddings_project`
    included): the fp32 modes as close to float64 as transformers' fp32 (1e-6 here), int8 and bf16 within 5% of the
    logits' scale."""
    import hfbert.inference.optimize as optimize
    from hfbert.inference import inference_mode_of
    from hfbert.platform.cpu import bfloat16_native

    if options.get("precision") == "bf16" and not bfloat16_native():
        pytest.skip("bf16 runs only on CPUs that compute it natively")
    monkeypatch.setattr(optimize, "MIN_PACKED_WEIGHTS", 0)
    monkeypatch.setattr(optimize, "MIN_INT8_WEIGHTS", 0)
    theirs, ours = pair("ForSequenceClassification")
    fast = hfbert.optimize_for_inference(ours, kernels="always", **options)
    assert inference_mode_of(fast).swapped > 0, inference_mode_of(fast)
    inputs = padded((12, 7, 3))
    with torch.no_grad():
        exact = theirs.double()(**inputs).logits
        logits = fast(**inputs).logits.double()
    error = (logits - exact).abs().max().item()
    if bound is None:
        assert error <= 1e-6, error
    else:
        assert error <= bound * exact.square().mean().sqrt().item(), error


@pytest.mark.slow  # two ONNX exports and a parity run
def test_parity_judges_an_onnx_export_of_the_discriminator(tmp_path, request):
    """`hfbert parity --artifact` on transformers' ElectraModel exported to ONNX (benchmarks/artifacts.py): the exact
    export passes against float64; one whose graph drops token_type_ids fails, naming them."""
    pytest.importorskip("onnxruntime")
    import benchmarks.artifacts as artifacts
    from hfbert.tools.parity import run_parity

    from support.family import TEXTS

    directory = tokenized_checkpoint(tmp_path / "electra", "electra", "model", request)
    exact = artifacts.export_onnx(directory, tmp_path / "electra.onnx")
    untyped = artifacts.export_onnx(directory, tmp_path / "untyped.onnx", token_type_ids=False)
    report = run_parity(directory, texts=TEXTS, progress=False, artifacts=[exact, untyped]).to_dict()
    verdicts = {entry["path"]: entry for entry in report["artifacts"]}
    assert verdicts[str(exact)]["verdict"] == "pass", verdicts[str(exact)]
    assert verdicts[str(untyped)]["verdict"] == "fail"
    assert "token_type_ids" in json.dumps(verdicts[str(untyped)]["likely_causes"])


# -- training ------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # four Trainer runs
def test_trainer_and_a_peft_lora_adapter_train_as_on_transformers(tmp_path):
    """transformers' Trainer on the sequence classifier, dropout on (eager in both, so the same seed draws the same
    masks): the same losses as on transformers' class; then a PEFT LoRA adapter on `query` / `value` trains the
    same, and its saved adapter loads into transformers' model with the same logits."""
    import peft

    from support.helpers import labelled_examples, max_difference, padded_collate, trainer_losses

    def collate(rows):
        return padded_collate(rows, 0)

    examples = labelled_examples("ForSequenceClassification", 16, 1, 2, 98, 3)
    base = reference_checkpoint(tmp_path / "base", "electra", "sequence-classification")
    ours = hfbert.ElectraForSequenceClassification.from_pretrained(base, attn_implementation="eager")
    theirs = transformers.ElectraForSequenceClassification.from_pretrained(base, attn_implementation="eager")
    ours_losses = trainer_losses(ours, tmp_path / "ours", examples, collate)
    theirs_losses = trainer_losses(theirs, tmp_path / "theirs", examples, collate)
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )

    def lora(model_class):
        model = model_class.from_pretrained(base, attention_probs_dropout_prob=0.0)
        torch.manual_seed(1)  # the same draw of every lora_A
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], modules_to_save=["classifier"])
        return peft.get_peft_model(model, config)

    ours, theirs = lora(hfbert.ElectraForSequenceClassification), lora(transformers.ElectraForSequenceClassification)
    ours_losses = trainer_losses(ours, tmp_path / "a", examples, collate, learning_rate=1e-2)
    theirs_losses = trainer_losses(theirs, tmp_path / "b", examples, collate, learning_rate=1e-2)
    assert max(abs(a - b) for a, b in zip(ours_losses, theirs_losses, strict=True)) <= 1e-4, (
        ours_losses,
        theirs_losses,
    )
    ours.save_pretrained(tmp_path / "adapter")
    inputs = {key: value for key, value in collate(examples[:4]).items() if key != "labels"}
    with torch.no_grad():
        trained = ours.eval()(**inputs).logits
        model = transformers.ElectraForSequenceClassification.from_pretrained(base)
        loaded = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
        assert max_difference(loaded(**inputs).logits, trained) <= 1e-5
        untrained = hfbert.ElectraForSequenceClassification.from_pretrained(base).eval()(**inputs).logits
    assert max_difference(trained, untrained) > 1e-3  # the adapter changed something
