"""BERT's task heads against transformers: problem types, loading both ways (bert-base-uncased's file layout: small in
the default run, at its own size in the slow one), saving, training, drop-in methods. Every head's outputs and losses,
padded and padding-free, and one training step: test_family_conformance.py."""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import HEAD_CLASSES, SMALL_CONFIG, max_difference, randomize_weights

TOLERANCE = 1e-5
CONFIG = dict(SMALL_CONFIG, type_vocab_size=2, num_labels=3)


def reference_model(class_name: str, directory, seed: int = 0, **config_fields):
    """A transformers model with random (not tiny) weights, saved to `directory`."""
    import transformers

    if class_name == "BertForQuestionAnswering":
        config_fields.setdefault("num_labels", 2)  # start and end logits
    torch.manual_seed(seed)
    model = randomize_weights(getattr(transformers, class_name)(transformers.BertConfig(**{**CONFIG, **config_fields})))
    model.save_pretrained(directory)
    return model.eval()


def inputs(class_name: str, generator: torch.Generator) -> dict:
    batch, length = 3, 11
    shape = (batch, 4, length) if class_name == "BertForMultipleChoice" else (batch, length)
    input_ids = torch.randint(1, CONFIG["vocab_size"], shape, generator=generator)
    attention_mask = torch.ones(shape, dtype=torch.long)
    attention_mask[..., -3:] = 0
    attention_mask[0] = 1
    token_type_ids = torch.zeros(shape, dtype=torch.long)
    token_type_ids[..., length // 2 :] = 1
    return dict(input_ids=input_ids * attention_mask, attention_mask=attention_mask, token_type_ids=token_type_ids)


def labels(class_name: str, generator: torch.Generator, problem: str = "single_label_classification") -> dict:
    batch, length, vocab = 3, 11, CONFIG["vocab_size"]
    masked_lm = torch.randint(0, vocab, (batch, length), generator=generator)
    masked_lm[:, ::2] = -100
    masked_lm[1:, -3:] = -100  # no targets at pad positions (see inputs()), as data collators do
    if class_name == "BertForPreTraining":
        return dict(labels=masked_lm, next_sentence_label=torch.tensor([0, 1, 0]))
    if class_name == "BertForMaskedLM":
        return dict(labels=masked_lm)
    if class_name == "BertForNextSentencePrediction":
        return dict(labels=torch.tensor([1, 0, 1]))
    if class_name == "BertForTokenClassification":
        token_labels = torch.randint(0, 3, (batch, length), generator=generator)
        token_labels[1:, -3:] = -100
        return dict(labels=token_labels)
    if class_name == "BertForQuestionAnswering":
        return dict(start_positions=torch.tensor([1, 4, 40]), end_positions=torch.tensor([3, 9, 2]))
    if class_name == "BertForMultipleChoice":
        return dict(labels=torch.tensor([0, 3, 1]))
    if problem == "regression":
        return dict(labels=torch.randn(batch, 3, generator=generator))
    if problem == "multi_label_classification":
        return dict(labels=torch.randint(0, 2, (batch, 3), generator=generator).float())
    return dict(labels=torch.tensor([2, 0, 1]))


def compare_outputs(ours, theirs, real: torch.Tensor | None = None) -> None:
    """Every output field; token-level fields (batch, sequence, ...) only at `real` positions when given."""
    assert list(ours.keys()) == list(theirs.keys()), (ours.keys(), theirs.keys())
    for key in theirs.keys():
        if isinstance(theirs[key], torch.Tensor):
            token_level = real is not None and theirs[key].shape[:2] == real.shape
            assert max_difference(ours[key], theirs[key], real if token_level else None) <= TOLERANCE, key


@pytest.mark.parametrize("problem", ["regression", "single_label_classification", "multi_label_classification"])
@pytest.mark.parametrize("num_labels", [1, 3])
@pytest.mark.parametrize("explicit", [True, False])
def test_sequence_classification_problem_types(problem, num_labels, explicit, tmp_path):
    if problem != "regression" and num_labels == 1 and not explicit:
        pytest.skip("with one label and no problem_type both libraries pick regression")
    fields = dict(num_labels=num_labels, problem_type=problem if explicit else None)
    if problem == "single_label_classification" and num_labels == 1 and explicit:
        with pytest.raises(ValueError, match="single_label_classification"):
            reference_model("BertForSequenceClassification", tmp_path, **fields)
        with pytest.raises(hfbert.ConfigError, match="'problem_type'"):
            hfbert.BertConfig(**fields)
        return
    theirs_model = reference_model("BertForSequenceClassification", tmp_path, **fields)
    ours_model = hfbert.BertForSequenceClassification.from_pretrained(tmp_path)
    generator = torch.Generator().manual_seed(2)
    batch = inputs("BertForSequenceClassification", generator)
    target = labels("BertForSequenceClassification", generator, problem)["labels"]
    if num_labels == 1:
        target = target[:, :1].float() if problem != "single_label_classification" else torch.zeros(3, dtype=torch.long)
    with torch.no_grad():
        compare_outputs(ours_model(**batch, labels=target), theirs_model(**batch, labels=target))


@pytest.mark.parametrize("class_name", ["BertForPreTraining", "BertForMaskedLM"])
def test_bert_base_uncased_layout_loads_into_pretraining_heads(class_name, layout):
    import transformers

    model, info = getattr(hfbert, class_name).from_pretrained(layout.safetensors, output_loading_info=True)
    report = info["report"]
    assert report.missing == [] and report.unexpected == [] and report.new_head == []
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    reference = getattr(transformers, class_name).from_pretrained(layout.safetensors).eval()
    batch = dict(input_ids=torch.tensor([[101, 2023, 103, 1037, 102, 2000, 102]]))
    # The default kernel is transformers' own, so 1e-5 proves the port (test_linear.py holds the logits to
    # transformers' fp32 accuracy against float64).
    with torch.no_grad():
        compare_outputs(model(**batch), reference(**batch))


def test_question_answering_stays_padded():
    # Start / end logits at pad positions take part in transformers' QA loss: the padded path keeps them equal.
    model = hfbert.BertForQuestionAnswering(hfbert.BertConfig(**CONFIG)).eval()
    assert model.backbone.padding_free is False


def test_pickle_with_stored_decoder_loads_into_masked_lm(layout):
    _, info = hfbert.BertForMaskedLM.from_pretrained(layout.pickle, output_loading_info=True)
    assert info["report"].ignored_by_design["cls.predictions.decoder.weight"].startswith("tied to")


def test_new_classifier_on_a_backbone_checkpoint(layout):
    model, info = hfbert.BertForSequenceClassification.from_pretrained(
        layout.safetensors, num_labels=5, output_loading_info=True
    )
    assert info["report"].new_head == ["classifier.weight", "classifier.bias"]
    assert model.classifier.out_features == 5 and model.config.num_labels == 5
    assert torch.equal(model.classifier.bias, torch.zeros(5))
    assert 0.015 < float(model.classifier.weight.detach().std()) < 0.025  # transformers' init: normal(0, 0.02)


@pytest.mark.parametrize("class_name", HEAD_CLASSES + ["BertModel"])
@pytest.mark.parametrize("safe_serialization", [True, False])
def test_save_pretrained_round_trip_through_transformers(class_name, safe_serialization, tmp_path):
    import transformers

    reference_model(class_name if class_name != "BertModel" else "BertModel", tmp_path / "source")
    ours = getattr(hfbert, class_name).from_pretrained(tmp_path / "source")
    ours.save_pretrained(tmp_path / "saved", safe_serialization=safe_serialization, max_shard_size="200KB")
    theirs, info = getattr(transformers, class_name).from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    theirs.save_pretrained(tmp_path / "back")
    again = getattr(hfbert, class_name).from_pretrained(tmp_path / "back")
    for (name, a), b in zip(ours.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_save_is_atomic_and_replaces_old_shards(tmp_path, monkeypatch):
    reference_model("BertForMaskedLM", tmp_path / "source")
    model = hfbert.BertForMaskedLM.from_pretrained(tmp_path / "source")
    model.save_pretrained(tmp_path / "out", max_shard_size="100KB")
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    model.save_pretrained(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]

    import safetensors.torch

    def failing(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", failing)
    with pytest.raises(OSError):
        model.save_pretrained(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "source"]


def training_pair(class_name: str, directory, dropout: float = 0.0):
    fields = dict(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    theirs = reference_model(class_name, directory, **fields).train()
    ours = getattr(hfbert, class_name).from_pretrained(directory).train()
    return ours, theirs


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("class_name", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_loss_and_gradients_with_checkpointing_match_transformers(class_name, tmp_path):
    """hfbert with gradient checkpointing on against transformers without (without it on both, every head of every
    member: test_family_conformance.py)."""
    ours, theirs = training_pair(class_name, tmp_path)
    ours.gradient_checkpointing_enable()
    generator = torch.Generator().manual_seed(3)
    batch = {**inputs(class_name, generator), **labels(class_name, generator)}
    ours_loss, theirs_loss = ours(**batch).loss, theirs(**batch).loss
    assert abs(float(ours_loss) - float(theirs_loss)) <= TOLERANCE
    ours_loss.backward()
    theirs_loss.backward()
    ours_gradients, theirs_gradients = gradients(ours), gradients(theirs)
    assert set(ours_gradients) == set(theirs_gradients)  # tied decoder: one parameter in both, same names kept
    for name, gradient in theirs_gradients.items():
        assert max_difference(ours_gradients[name], gradient) <= TOLERANCE, name


def test_optimizer_steps_track_transformers(tmp_path):
    ours, theirs = training_pair("BertForSequenceClassification", tmp_path)
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-3) for model in (ours, theirs)]
    generator = torch.Generator().manual_seed(4)
    for _ in range(5):
        batch = {
            **inputs("BertForSequenceClassification", generator),
            **labels("BertForSequenceClassification", generator),
        }
        losses = []
        for model, optimizer in zip((ours, theirs), optimizers, strict=True):
            optimizer.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        assert abs(losses[0] - losses[1]) <= 1e-4, losses


@pytest.mark.parametrize("class_name", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_dropout_is_where_transformers_puts_it(class_name, tmp_path):
    # Same dropout sites, probabilities and order: with the same seed, training-mode outputs are identical.
    ours, theirs = training_pair(class_name, tmp_path, dropout=0.3)
    batch = inputs(class_name, torch.Generator().manual_seed(5))
    for implementation in ("eager", "sdpa"):
        ours.set_attn_implementation(implementation)
        theirs.set_attn_implementation(implementation)
        torch.manual_seed(0)
        ours_logits = ours(**batch).logits
        torch.manual_seed(0)
        theirs_logits = theirs(**batch).logits
        assert max_difference(ours_logits, theirs_logits) <= TOLERANCE, implementation


def test_without_pooler_there_is_no_pooler_module():
    model = hfbert.BertModel(hfbert.BertConfig(**SMALL_CONFIG), add_pooling_layer=False)
    assert model.pooler is None and not any("pooler" in name for name, _ in model.named_parameters())


def test_drop_in_methods(tmp_path):
    import transformers

    theirs = reference_model("BertForMaskedLM", tmp_path)
    ours = hfbert.BertForMaskedLM.from_pretrained(tmp_path)
    assert ours.num_parameters() == theirs.num_parameters()
    assert ours.num_parameters(exclude_embeddings=True) == theirs.num_parameters(exclude_embeddings=True)
    assert ours.config.hidden_size == theirs.config.hidden_size
    assert ours.device == theirs.device and ours.dtype == theirs.dtype
    assert torch.equal(ours.get_input_embeddings().weight, theirs.get_input_embeddings().weight)
    ours.resize_token_embeddings(1010)
    theirs.resize_token_embeddings(1010)
    assert ours.config.vocab_size == 1010 and ours.cls.predictions.bias.shape == (1010,)
    assert ours.cls.predictions.decoder.weight is ours.get_input_embeddings().weight
    batch = dict(input_ids=torch.tensor([[101, 5, 999, 102]]))
    with torch.no_grad():
        assert max_difference(ours(**batch).logits[..., :1000], theirs(**batch).logits[..., :1000]) <= TOLERANCE
        assert ours(**batch).logits.shape == theirs(**batch).logits.shape
    replacement = torch.nn.Embedding(1010, CONFIG["hidden_size"])
    ours.set_input_embeddings(replacement)
    assert ours.cls.predictions.decoder.weight is replacement.weight
    assert isinstance(theirs, transformers.BertForMaskedLM)


def test_fill_mask_matches_transformers_pipeline(layout):
    import transformers

    model = hfbert.BertForMaskedLM.from_pretrained(layout.safetensors)
    tokenizer = hfbert.BertTokenizer.from_pretrained(layout.safetensors)
    pipeline = transformers.pipeline(
        "fill-mask",
        model=transformers.BertForMaskedLM.from_pretrained(layout.safetensors),
        tokenizer=transformers.BertTokenizerFast.from_pretrained(layout.safetensors),
        device="cpu",
    )
    for text in ("Paris is the [MASK] of France.", "Hello I'm a [MASK] model."):
        ours, theirs = model.fill_mask(text, tokenizer, top_k=5), pipeline(text, top_k=5)
        assert [r["token"] for r in ours] == [r["token"] for r in theirs]
        assert [r["token_str"] for r in ours] == [r["token_str"] for r in theirs]
        assert [r["sequence"] for r in ours] == [r["sequence"] for r in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert abs(a["score"] - b["score"]) <= 1e-6


@pytest.mark.parametrize("class_name", ["BertModel", *HEAD_CLASSES])
def test_fresh_models_are_initialised_like_transformers(class_name):
    import transformers

    torch.manual_seed(0)
    ours = getattr(hfbert, class_name)(hfbert.BertConfig(**CONFIG, initializer_range=0.05))
    theirs = getattr(transformers, class_name)(transformers.BertConfig(**CONFIG, initializer_range=0.05))
    theirs_parameters = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        reference = theirs_parameters[name]
        assert parameter.shape == reference.shape, name
        if reference.numel() > 1000:  # spread of the random ones: std 0.05 in both
            assert abs(float(parameter.std()) - float(reference.std())) < 0.005, name
        elif reference.std() == 0:  # constant ones: biases 0, LayerNorm weights 1
            assert torch.equal(parameter, reference), name
    if class_name in ("BertForMaskedLM", "BertForPreTraining"):
        assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight


# -- problem_type and num_labels set on a config, as transformers runs them -----------------------------------------


HEAD_CONFIG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)


@pytest.mark.parametrize("config_of", ["transformers", "hfbert"])
def test_problem_types_as_transformers_own_test_runs_them(config_of):
    """transformers' test_problem_types: one config, problem_type then num_labels set on it, a model built from it,
    the loss of labels of the given dtype. Both models share the weights; logits and loss must agree."""
    import transformers

    problems = [
        ("multi_label_classification", 2, torch.float),
        ("single_label_classification", 1, torch.long),
        ("regression", 1, torch.float),
    ]
    theirs_config = transformers.BertConfig(**HEAD_CONFIG)
    ours_config = hfbert.BertConfig(**HEAD_CONFIG) if config_of == "hfbert" else theirs_config
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    for problem, num_labels, dtype in problems:
        for config in (theirs_config, ours_config):
            config.problem_type, config.num_labels = problem, num_labels
        torch.manual_seed(0)
        theirs = transformers.BertForSequenceClassification(theirs_config).eval()
        ours = hfbert.BertForSequenceClassification(ours_config).eval()
        ours.load_state_dict(theirs.state_dict())
        labels = torch.zeros(2, dtype=torch.long)
        if problem == "multi_label_classification":
            labels = labels.unsqueeze(1).repeat(1, num_labels)
        labels = labels.to(dtype)
        with torch.no_grad():
            expected, got = theirs(input_ids=ids, labels=labels), ours(input_ids=ids, labels=labels)
        assert torch.allclose(got.logits, expected.logits, atol=1e-6, rtol=0)
        assert torch.allclose(got.loss, expected.loss, atol=1e-6, rtol=0), problem
        assert ours.config.id2label == {index: f"LABEL_{index}" for index in range(num_labels)}
        assert ours.config.num_labels == num_labels


def test_num_labels_set_on_a_config_makes_labels_as_transformers(tmp_path):
    import transformers

    ours, theirs = hfbert.BertConfig(), transformers.BertConfig()
    for count in (5, 5, 1, 3):
        ours.num_labels = theirs.num_labels = count
        assert ours.id2label == theirs.id2label and ours.label2id == theirs.label2id
    model = hfbert.BertForSequenceClassification(hfbert.BertConfig(**HEAD_CONFIG))
    model.config.num_labels = 3  # as run_glue does before building a head: config.json must say 3 labels
    model.config.save_pretrained(tmp_path)
    assert hfbert.BertConfig.from_pretrained(tmp_path).num_labels == 3
