"""ModernBERT's own cases against transformers' ModernBert classes (the family suite, test_family_conformance.py, runs
every class and tool on the tiny config): sequences much longer than the window, other layer patterns and rotary
bases, mean pooling, the config's two spellings, sparse prediction, and the refusals (too long, token types, a
config of another member)."""

from __future__ import annotations

import json

import pytest
import torch

import hfbert
from hfbert.modeling.config import ConfigError

from support.helpers import randomize_weights
from support.members import tiny_config

transformers = pytest.importorskip("transformers")

ATOL = RTOL = 1e-5


def pair(task: str = "Model", seed: int = 0, **fields):
    """transformers' ModernBert<task> with random weights far from its init, and hfbert's with the same weights."""
    values = {**tiny_config("modernbert"), **fields}
    theirs = getattr(transformers, f"ModernBert{task}")(transformers.ModernBertConfig(**values))
    torch.manual_seed(seed)
    randomize_weights(theirs).eval()
    ours = getattr(hfbert, f"ModernBert{task}")(hfbert.ModernBertConfig(**values)).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def padded_batch(lengths: tuple[int, ...], side: str = "right", vocab: int = 99, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.zeros((len(lengths), width), dtype=torch.long)  # pad_token_id 0 in the tiny config
    mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        where = slice(0, length) if side == "right" else slice(width - length, width)
        input_ids[row, where] = torch.randint(3, vocab, (length,), generator=generator)
        mask[row, where] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


def assert_real_close(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor) -> None:
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"global_attn_every_n_layers": 2, "num_hidden_layers": 4},
        {"local_rope_theta": 500.0, "global_rope_theta": 20_000.0},
        {"local_attention": 6, "num_hidden_layers": 3},
    ],
    ids=["default", "every-2", "thetas", "window-3"],
)
def test_long_sequences_past_the_window_equal_transformers(fields, side, implementation):
    """Rows up to 38 tokens with windows of 2-3 columns each side: the local layers see a small part of each row."""
    theirs, ours = pair(**fields)
    theirs.set_attn_implementation(implementation)
    ours.set_attn_implementation(implementation)
    inputs = padded_batch((38, 21, 7, 30), side)
    with torch.no_grad():
        expected = theirs(**inputs, output_hidden_states=True)
        actual = ours(**inputs, output_hidden_states=True)
    assert len(actual.hidden_states) == len(expected.hidden_states) == ours.config.num_hidden_layers + 1
    for left, right in zip(actual.hidden_states, expected.hidden_states, strict=True):
        assert_real_close(left, right, inputs["attention_mask"])
    assert_real_close(actual.last_hidden_state, expected.last_hidden_state, inputs["attention_mask"])


def test_left_and_right_padding_agree_on_real_tokens():
    """Rotary positions are relative: a row left-padded gives its real tokens what the same row right-padded does."""
    _, ours = pair()
    right, left = padded_batch((38, 9), "right"), padded_batch((38, 9), "left")
    with torch.no_grad():
        a = ours(**right).last_hidden_state
        b = ours(**left).last_hidden_state
    torch.testing.assert_close(a[right["attention_mask"].bool()], b[left["attention_mask"].bool()], atol=2e-6, rtol=0)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_classifier_pooling_equals_transformers(pooling, side):
    """Pooling "cls" reads column 0 even where it is a pad (left padding), as transformers; "mean" averages real
    tokens."""
    theirs, ours = pair("ForSequenceClassification", classifier_pooling=pooling, num_labels=3)
    inputs = padded_batch((12, 5, 9), side)
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        expected, actual = theirs(**inputs, labels=labels), ours(**inputs, labels=labels)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=RTOL)


def test_multiple_choice_mean_pooling_equals_transformers():
    theirs, ours = pair("ForMultipleChoice", classifier_pooling="mean")
    inputs = {name: value.view(2, 2, -1) for name, value in padded_batch((12, 5, 9, 3), "left").items()}
    with torch.no_grad():
        torch.testing.assert_close(ours(**inputs).logits, theirs(**inputs).logits, atol=ATOL, rtol=RTOL)


def test_sparse_prediction_gives_logits_at_labelled_positions_only():
    theirs, ours = pair("ForMaskedLM", sparse_prediction=True)
    inputs = padded_batch((12, 5))
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[0, 3], labels[1, 1], labels[0, 7] = 5, 9, 11
    with torch.no_grad():
        expected, actual = theirs(**inputs, labels=labels), ours(**inputs, labels=labels)
    assert actual.logits.shape == expected.logits.shape == (3, 99)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=RTOL)


def test_decoder_is_tied_to_the_token_embeddings_unless_the_config_says_not():
    _, tied = pair("ForMaskedLM")
    assert tied.decoder.weight is tied.model.embeddings.tok_embeddings.weight
    _, untied = pair("ForMaskedLM", tie_word_embeddings=False)
    assert untied.decoder.weight is not untied.model.embeddings.tok_embeddings.weight


@pytest.mark.parametrize(
    "legacy",
    [
        {"global_attn_every_n_layers": 2, "global_rope_theta": 80_000.0, "local_rope_theta": 5_000.0},
        {"global_attn_every_n_layers": 1},
        {},
    ],
)
def test_the_older_config_keys_read_as_transformers_reads_them(legacy, tmp_path):
    """The Hub checkpoints' `global_attn_every_n_layers` / `global_rope_theta` / `local_rope_theta` become transformers
    5's `layer_types` and `rope_parameters`; what hfbert writes back, transformers reads the same."""
    values = {**tiny_config("modernbert"), "num_hidden_layers": 5, "model_type": "modernbert", **legacy}
    (tmp_path / "config.json").write_text(json.dumps(values))
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    ours = hfbert.ModernBertConfig.from_json_file(tmp_path / "config.json")
    assert ours.layer_types == theirs.layer_types
    for kind in ("full_attention", "sliding_attention"):
        assert ours.rope_parameters[kind]["rope_theta"] == theirs.rope_parameters[kind]["rope_theta"]
    out = tmp_path / "written"
    ours.save_pretrained(out)
    reread = transformers.AutoConfig.from_pretrained(out)
    assert reread.layer_types == theirs.layer_types and reread.rope_parameters == theirs.rope_parameters
    assert reread.local_attention == theirs.local_attention == ours.local_attention


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"layer_types": ["full_attention"]}, "layer_types"),
        ({"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
        ({"local_attention": 0}, "local_attention"),
        ({"global_attn_every_n_layers": 0}, "global_attn_every_n_layers"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e4}}}, "rope_parameters"),
        ({"classifier_pooling": "max"}, "classifier_pooling"),
        ({"hidden_activation": "gelu_of_my_own"}, "hidden_activation"),
    ],
)
def test_an_invalid_window_or_layer_pattern_is_refused_by_field(fields, named, tmp_path):
    values = {**tiny_config("modernbert"), "model_type": "modernbert", **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=rf"config.json: field '{named}'"):
        hfbert.AutoModel.from_pretrained(tmp_path)


def test_a_sequence_past_max_position_embeddings_is_refused_naming_the_limit():
    _, ours = pair()
    with pytest.raises(ValueError, match="sequence length 41 exceeds max_position_embeddings = 40"):
        ours(input_ids=torch.ones((1, 41), dtype=torch.long))


def test_token_types_are_accepted_only_all_zero():
    theirs, ours = pair()
    inputs = padded_batch((9, 5))
    with torch.no_grad():
        zeros = ours(**inputs, token_type_ids=torch.zeros_like(inputs["input_ids"])).last_hidden_state
        assert_real_close(zeros, theirs(**inputs).last_hidden_state, inputs["attention_mask"])
    with pytest.raises(ValueError, match="ModernBERT has no token types"):
        ours(**inputs, token_type_ids=torch.ones_like(inputs["input_ids"]))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['head_mask'\]"):
        ours(**inputs, head_mask=None)


@pytest.mark.parametrize(("saved", "claimed"), [("modernbert", "bert"), ("bert", "modernbert")])
def test_a_checkpoint_under_another_members_config_is_refused(saved, claimed, tmp_path):
    """A ModernBERT masked LM's tensors (`model.`) with a BERT config.json, and the reverse: one error naming the
    file, before anything is built."""
    from support.members import reference_checkpoint

    reference_checkpoint(tmp_path, saved, "masked-lm")
    config = json.loads((tmp_path / "config.json").read_text())
    other = {**tiny_config(claimed), "model_type": claimed}
    if claimed == "modernbert":
        other.update(pad_token_id=0, bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
    other["architectures"] = config.get("architectures")
    (tmp_path / "config.json").write_text(json.dumps(other))
    with pytest.raises(hfbert.CheckpointError, match=r"model\.safetensors: tensor '(model|bert)\..*' is named as"):
        hfbert.AutoModelForMaskedLM.from_pretrained(tmp_path)


def test_inspect_names_the_global_and_local_layers_their_window_and_rotary_bases(tmp_path, capsys):
    """`hfbert inspect` on a checkpoint transformers wrote: the layer kinds as transformers' config lists them."""
    from hfbert.cli import main

    values = {**tiny_config("modernbert"), "num_hidden_layers": 5, "local_attention": 6}
    config = transformers.ModernBertConfig(**values, global_attn_every_n_layers=2, local_rope_theta=5_000.0)
    transformers.ModernBertModel(config).save_pretrained(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("attention")]
    kinds = config.layer_types
    glob = [str(index) for index, kind in enumerate(kinds) if kind == "full_attention"]
    local = [str(index) for index, kind in enumerate(kinds) if kind == "sliding_attention"]
    thetas = {kind: config.rope_parameters[kind]["rope_theta"] for kind in ("full_attention", "sliding_attention")}
    assert shown == [
        f"attention   global layers {', '.join(glob)} (rotary theta {thetas['full_attention']:g}); "
        f"local layers {', '.join(local)} ({config.sliding_window} columns each side, rotary theta "
        f"{thetas['sliding_attention']:g})"
    ]


@pytest.mark.parametrize("prompt_name", [None, "query", "document"])
def test_embed_with_nomic_style_prompts_equals_sentence_transformers(prompt_name, tmp_path, request):
    """A ModernBERT sentence-transformers folder as nomic's modernbert-embed and gte-modernbert ship it (mean
    pooling, normalized, `search_query: ` / `search_document: ` prompts): `Embedder` against `encode`."""
    import numpy as np

    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    from hfbert.tools.embedding import Embedder

    from support.family import TEXTS
    from support.members import tokenized_checkpoint

    backbone = tokenized_checkpoint(tmp_path / "backbone", "modernbert", "model", request)
    modules = [models.Transformer(str(backbone), max_seq_length=30), models.Pooling(32, pooling_mode="mean")]
    prompts = {"query": "search_query: ", "document": "search_document: "}
    st.SentenceTransformer(modules=[*modules, models.Normalize()], device="cpu", prompts=prompts).save(
        str(tmp_path / "sentence")
    )
    texts = [*TEXTS, " ".join(TEXTS)]  # the last one past max_seq_length: truncated after the prompt
    reference = st.SentenceTransformer(str(tmp_path / "sentence"), device="cpu")
    expected = reference.encode(texts, prompt_name=prompt_name, batch_size=3, convert_to_numpy=True)
    ours = Embedder(tmp_path / "sentence", prompt_name=prompt_name, batch_size=3).embed(texts).numpy()
    assert np.abs(ours - expected).max() <= 1e-5


# ModernBERT-base's config.json (answerdotai/ModernBERT-base) but for the vocabulary: random weights at its shape.
BASE_SHAPE = {
    "vocab_size": 2048,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "max_position_embeddings": 8192,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "cls_token_id": 1,
    "eos_token_id": 2,
    "sep_token_id": 2,
}


@pytest.mark.slow
def test_at_modernbert_base_shape_hfbert_is_as_accurate_as_transformers_against_float64():
    """22 layers at ModernBERT-base's shape, a right-padded batch of 2,048 / 700 / 130 tokens (the local layers of
    the long rows run as a band, the rows padding-free): hfbert's RMS error against transformers in float64 (its
    sdpa: its eager kernel takes the softmax in float32; rotary positions in float64: `exact_rotary`) at most 1.5x
    transformers' own fp32 error, plain and after optimize_for_inference; precision="high" within 3x; int8 within
    5% relative RMS."""
    import copy

    from hfbert.tools.parity.engines.reference_adapters import exact_rotary

    values = dict(BASE_SHAPE)
    every = values.pop("global_attn_every_n_layers")
    config = transformers.ModernBertConfig(**values, global_attn_every_n_layers=every)
    torch.manual_seed(0)
    theirs = randomize_weights(transformers.ModernBertModel(config)).eval()
    ours = hfbert.ModernBertModel(hfbert.ModernBertConfig(**BASE_SHAPE)).eval()
    ours.load_state_dict(theirs.state_dict())
    inputs = padded_batch((2048, 700, 130), vocab=2048)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        exact = exact_rotary(copy.deepcopy(theirs).double())(**inputs).last_hidden_state[real]
        reference = theirs(**inputs).last_hidden_state[real].double()
        plain = ours(**inputs).last_hidden_state[real].double()
        hfbert.optimize_for_inference(ours, kernels="always")
        packed = ours(**inputs).last_hidden_state[real].double()
        hfbert.optimize_for_inference(ours, precision="high", kernels="always")
        fast = ours(**inputs).last_hidden_state[real].double()
        hfbert.optimize_for_inference(ours, quantize="int8")
        int8 = ours(**inputs).last_hidden_state[real].double()

    def rms(x: torch.Tensor) -> float:
        return float((x - exact).square().mean().sqrt())

    bound = 1.5 * rms(reference)
    assert rms(plain) <= bound, (rms(plain), rms(reference))
    assert rms(packed) <= bound, (rms(packed), rms(reference))
    assert rms(fast) <= 3.0 * rms(reference), (rms(fast), rms(reference))  # precision="high"'s contract
    assert rms(int8) <= 0.05 * float(exact.square().mean().sqrt()), rms(int8)


@pytest.mark.parametrize("tie", [True, False])
def test_resizing_the_vocabulary_follows_transformers(tie):
    """resize_token_embeddings on the masked LM: the embeddings, the decoder's weight (tied or grown with the mean)
    and its bias (zeros while tied, the old mean untied) as transformers resizes them; the logits then agree."""
    theirs, ours = pair("ForMaskedLM", tie_word_embeddings=tie)
    for model in (theirs, ours):
        model.resize_token_embeddings(105)
    assert ours.decoder.weight.shape == theirs.decoder.weight.shape == (105, 32)
    assert (ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight) == tie
    torch.testing.assert_close(ours.decoder.bias, theirs.decoder.bias, atol=1e-6, rtol=0)
    if not tie:  # transformers samples around the mean with 1e-9 of the covariance: the mean, to fp32 precision
        torch.testing.assert_close(ours.decoder.weight, theirs.decoder.weight, atol=1e-5, rtol=0)
    ours.load_state_dict(theirs.state_dict())
    inputs = padded_batch((9, 5), vocab=105)
    with torch.no_grad():
        assert_real_close(ours(**inputs).logits, theirs(**inputs).logits, inputs["attention_mask"])
