"""DistilBERT (issue #68) where the conformance suite (tests/test_family_conformance.py, its rows) cannot say it: its
config's own names and transformers' aliases, the sinusoidal position table, the refusal of token types, and the tools
on its folders (fill-mask, a CLS-pooled sentence-transformers folder as msmarco-distilbert-base-tas-b's, a
cross-encoder whose tokenizer transformers 5 picks by model type). Every expected value comes from transformers or
sentence-transformers on the same files, element-wise."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hfbert
from hfbert.modeling.distilbert import sinusoidal_positions
from hfbert.modeling.family import member

from support.family import TEXTS
from support.helpers import randomize_weights
from support.members import reference_checkpoint, tiny_config, tokenized_checkpoint

transformers = pytest.importorskip("transformers")

TASKS = tuple(member("distilbert").classes)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, request):
    """task -> transformers' tiny DistilBERT of that task with distilbert-base-uncased's tokenizer layout (vocab.txt
    and a config without `tokenizer_class`: the model type picks it); written on first use, only read."""
    made = {}

    def folder(task: str):
        if task not in made:
            directory = tmp_path_factory.mktemp(f"distilbert-{task}")
            one_label = task == "cross-encoder"  # a sequence classifier of one label, as the ms-marco rerankers
            fields = {"num_labels": 1} if one_label else {}
            tokenized_checkpoint(
                directory, "distilbert", "sequence-classification" if one_label else task, request, **fields
            )
            config = json.loads((directory / "tokenizer_config.json").read_text())
            config.pop("tokenizer_class")
            (directory / "tokenizer_config.json").write_text(json.dumps(config))
            made[task] = directory
        return made[task]

    return folder


# -- the config ---------------------------------------------------------------------------------------------------
def test_fields_and_defaults_are_transformers():
    theirs = transformers.DistilBertConfig().to_dict()
    ours = hfbert.DistilBertConfig().to_dict()
    own = ("vocab_size", "max_position_embeddings", "sinusoidal_pos_embds", "n_layers", "n_heads", "dim", "hidden_dim")
    own += ("dropout", "attention_dropout", "activation", "initializer_range", "qa_dropout", "seq_classif_dropout")
    own += ("pad_token_id", "eos_token_id", "bos_token_id", "tie_word_embeddings", "model_type")
    assert {name: ours[name] for name in own} == {name: theirs[name] for name in own}
    assert not {"hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"} & set(ours)


def test_common_names_read_and_set_as_transformers_aliases(tmp_path):
    """hidden_size, num_attention_heads and num_hidden_layers are dim, n_heads and n_layers, as keywords (over the
    own name), in a config.json and as attributes; intermediate_size (no alias in transformers) is kept as given and
    reads as hidden_dim."""
    given = dict(dim=64, hidden_size=32, n_heads=2, num_attention_heads=4, num_hidden_layers=3, intermediate_size=37)
    ours, theirs = hfbert.DistilBertConfig(**given), transformers.DistilBertConfig(**given)
    assert (ours.dim, ours.n_heads, ours.n_layers) == (theirs.dim, theirs.n_heads, theirs.n_layers) == (32, 4, 3)
    assert (ours.hidden_size, ours.num_attention_heads, ours.num_hidden_layers) == (32, 4, 3)
    assert ours.intermediate_size == ours.hidden_dim == 3072 and ours.to_dict()["intermediate_size"] == 37
    ours.hidden_size = 48
    assert ours.dim == 48
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert", "hidden_size": 96, "n_heads": 3}))
    read = hfbert.AutoConfig.from_pretrained(tmp_path)
    assert type(read) is hfbert.DistilBertConfig
    assert read.dim == transformers.AutoConfig.from_pretrained(tmp_path).dim == 96
    read.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert (saved["dim"], saved["n_heads"]) == (96, 3) and "hidden_size" not in saved
    back = transformers.AutoConfig.from_pretrained(tmp_path / "saved")
    assert (type(back).__name__, back.dim, back.n_heads) == ("DistilBertConfig", 96, 3)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"dim": 30, "n_heads": 4}, r"field 'dim' \(30\) must be divisible by n_heads \(4\)"),
        ({"n_layers": 0}, "field 'n_layers' must be a positive integer"),
        ({"seq_classif_dropout": 1.5}, r"field 'seq_classif_dropout' must be a number in \[0, 1\]"),
        ({"activation": "gelu_magic"}, "field 'activation' is 'gelu_magic'; supported:"),
        ({"sinusoidal_pos_embds": "yes"}, "field 'sinusoidal_pos_embds' must be true or false"),
    ],
)
def test_a_bad_config_json_is_refused_naming_file_and_field(fields, named, tmp_path):
    tiny = {"dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 37, "vocab_size": 99, "max_position_embeddings": 40}
    (tmp_path / "config.json").write_text(json.dumps({**tiny, "model_type": "distilbert", **fields}))
    with pytest.raises(hfbert.ConfigError, match=named) as refused:
        hfbert.AutoModel.from_config(hfbert.AutoConfig.from_pretrained(tmp_path))
    assert str(tmp_path / "config.json") in str(refused.value)


@pytest.mark.parametrize(("weights", "config"), [("distilbert", "bert"), ("bert", "distilbert")])
def test_weights_of_another_member_are_refused_naming_both_files(weights, config, tmp_path):
    """DistilBERT's tensors under BERT's config.json and the reverse: one error naming the tensor, its member, and
    the config.json that says otherwise."""
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    source = reference_checkpoint(tmp_path / weights, weights, "masked-lm")
    (wrong / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    named = reference_checkpoint(tmp_path / config, config, "masked-lm") / "config.json"
    (wrong / "config.json").write_text(named.read_text())
    message = rf"named as a '{weights}' checkpoint's, but \S*wrong/config\.json says model_type '{config}'"
    with pytest.raises(hfbert.CheckpointError, match=message):
        hfbert.AutoModelForMaskedLM.from_pretrained(wrong)


# -- positions ------------------------------------------------------------------------------------------------------
# distilbert-base's shape and a larger one are slow in transformers' numpy loop, which computes the expected table.
SINUSOIDAL_SHAPES = [
    (40, 32),
    (17, 30),
    pytest.param(512, 768, marks=pytest.mark.slow),
    pytest.param(514, 1024, marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("positions", "dim"), SINUSOIDAL_SHAPES)
def test_the_sinusoidal_table_is_transformers_bit_for_bit(positions, dim):
    from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings

    expected = create_sinusoidal_embeddings(positions, dim, torch.empty(positions, dim))
    assert torch.equal(sinusoidal_positions(positions, dim), expected)


def test_a_sinusoidal_model_is_built_and_run_as_transformers(tmp_path):
    fields = tiny_config("distilbert", sinusoidal_pos_embds=True, dropout=0.0, attention_dropout=0.0)
    built = hfbert.DistilBertModel(hfbert.DistilBertConfig(**fields))
    theirs = transformers.DistilBertModel(transformers.DistilBertConfig(**fields))
    table = theirs.embeddings.position_embeddings.weight
    assert torch.equal(built.embeddings.position_embeddings.weight, table)
    torch.manual_seed(0)
    randomize_weights(theirs).eval()
    theirs.embeddings.position_embeddings.weight.data.copy_(table)  # the fixed table, as a checkpoint stores it
    theirs.save_pretrained(tmp_path)
    ours = hfbert.AutoModel.from_pretrained(tmp_path)
    ids = torch.randint(1, 99, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(input_ids=ids).last_hidden_state
        torch.testing.assert_close(ours(input_ids=ids).last_hidden_state, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_resizing_the_vocabulary_follows_transformers(tie, tmp_path):
    """`resize_token_embeddings` on the masked LM: `vocab_projector` follows the embeddings (tied: the same tensor;
    untied: grown as the embeddings), its bias grown as transformers grows it; the old rows and their logits kept."""
    directory = reference_checkpoint(tmp_path, "distilbert", "masked-lm", tie_word_embeddings=tie)
    ours = hfbert.DistilBertForMaskedLM.from_pretrained(directory).eval()
    theirs = transformers.DistilBertForMaskedLM.from_pretrained(directory).eval()
    for model in (ours, theirs):
        model.resize_token_embeddings(120, mean_resizing=False)
    state, expected = ours.state_dict(), theirs.state_dict()
    assert list(state) == list(expected)
    assert {name: state[name].shape for name in state} == {name: expected[name].shape for name in expected}
    assert torch.equal(state["vocab_projector.bias"], expected["vocab_projector.bias"])
    tied = ours.vocab_projector.weight is ours.distilbert.embeddings.word_embeddings.weight
    assert tied == (theirs.vocab_projector.weight is theirs.distilbert.embeddings.word_embeddings.weight) == tie
    ids = torch.randint(1, 99, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours_logits, theirs_logits = ours(input_ids=ids).logits[..., :99], theirs(input_ids=ids).logits[..., :99]
    torch.testing.assert_close(ours_logits, theirs_logits, atol=1e-5, rtol=1e-5)


# -- token types ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_token_types_all_zero_are_nothing_and_others_are_refused(task, tmp_path):
    """transformers' DistilBERT drops any token_type_ids unseen (its forward has no such argument); hfbert takes all
    zeros (what BERT's tokenizer gives one text) and refuses others by name, as for every member without them."""
    model = member("distilbert").classes[task].from_pretrained(reference_checkpoint(tmp_path, "distilbert", task))
    model.eval()
    ids = torch.randint(1, 99, (2, 3, 6) if task == "multiple-choice" else (2, 6), generator=torch.Generator())
    with torch.no_grad():
        plain = model(input_ids=ids)[0]
        assert torch.equal(model(input_ids=ids, token_type_ids=torch.zeros_like(ids))[0], plain)
        with pytest.raises(ValueError, match="token_type_ids: DistilBERT has no token types"):
            model(input_ids=ids, token_type_ids=(torch.arange(6) > 2).long().expand_as(ids).contiguous())
        with pytest.raises(TypeError, match="unexpected keyword arguments \\['head_mask'\\]"):
            model(input_ids=ids, head_mask=None)


# -- the tools ------------------------------------------------------------------------------------------------------
def test_fill_mask_equals_transformers_pipeline(folders, capsys):
    from hfbert.cli import main

    directory = folders("masked-lm")
    fill = transformers.pipeline("fill-mask", model=str(directory), tokenizer=str(directory), device="cpu")
    for text in ("Paris is the [MASK] of France.", "[MASK] is a city.", "a sentence ending in a[MASK]."):
        expected = fill(text, top_k=5)
        assert main(["fill-mask", str(directory), text, "--top-k", "5", "--json"]) == 0
        ours = json.loads(capsys.readouterr().out)
        assert [p["token"] for p in ours] == [p["token"] for p in expected], text
        assert np.abs(np.array([p["score"] for p in ours]) - [p["score"] for p in expected]).max() <= 1e-6, text
        assert [p["sequence"] for p in ours] == [p["sequence"] for p in expected], text
    assert main(["fill-mask", str(folders("model")), "Paris is the [MASK] of France."]) != 0
    assert "no vocab_transform.* or vocab_layer_norm.* or vocab_projector.* tensors" in capsys.readouterr().err


def test_embed_of_a_cls_pooled_folder_equals_sentence_transformers(folders, tmp_path, capsys):
    """msmarco-distilbert-base-tas-b's pipeline: the CLS token's vector, no normalisation (dot-product scores)."""
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    from hfbert.cli import main

    modules = [models.Transformer(str(folders("model")), max_seq_length=24), models.Pooling(32, pooling_mode="cls")]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "sentence"))
    texts = [*TEXTS, " ".join(TEXTS), "x"]
    expected = st.SentenceTransformer(str(tmp_path / "sentence"), device="cpu").encode(texts, batch_size=3)
    ours = np.asarray(hfbert.Embedder(tmp_path / "sentence", batch_size=3).encode(texts))
    assert ours.shape == expected.shape and np.abs(ours - expected).max() <= 1e-5
    out = tmp_path / "out.npy"
    assert main(["embed", str(tmp_path / "sentence"), *texts, "--batch-size", "2", "--out", str(out)]) == 0
    assert np.abs(np.load(out) - expected).max() <= 1e-5


def test_rerank_equals_sentence_transformers_cross_encoder(folders):
    """A DistilBERT cross-encoder (one label): transformers 5's tokenizer for the folder gives token types of the
    pairs, which its DistilBERT drops; hfbert's gives none. The scores are the same."""
    st = pytest.importorskip("sentence_transformers")
    directory = folders("cross-encoder")
    assert "token_type_ids" in transformers.AutoTokenizer.from_pretrained(directory)("a", "b")
    pairs = [(TEXTS[2], text) for text in [*TEXTS, " ".join(TEXTS), "x"]]
    expected = st.CrossEncoder(str(directory), device="cpu").predict(pairs, batch_size=3)
    ours = hfbert.CrossEncoder(directory).predict(pairs, batch_size=3)
    assert np.abs(np.asarray(ours) - expected).max() <= 1e-5


# -- the fast paths beyond packing (packing: the conformance suite) ------------------------------------------------
@pytest.mark.parametrize(
    ("options", "bound"),
    # bf16 measures its kernels first: slow.
    [({"quantize": "int8"}, 0.05), pytest.param({"precision": "bf16"}, 0.02, marks=pytest.mark.slow)],
)
def test_int8_and_bf16_hold_their_error_against_transformers(options, bound, tmp_path, monkeypatch):
    """Every linear layer swapped (the size thresholds lowered for the tiny model): the masked LM's logits at real
    positions within the mode's relative RMS error of transformers' fp32, on a right-padded batch."""
    import hfbert.inference.optimize as optimize
    from hfbert.inference.bf16 import BF16
    from hfbert.inference.int8 import int8_available

    if "quantize" in options and not int8_available():
        pytest.skip("this torch build or CPU has no oneDNN int8 inner product")
    if "precision" in options and not BF16.supports(torch.zeros(2, 2)):
        pytest.skip("this CPU does not compute bf16 natively (no AVX512-BF16 or AMX)")
    monkeypatch.setattr(optimize, "MIN_PACKED_WEIGHTS", 0)
    monkeypatch.setattr(optimize, "MIN_INT8_WEIGHTS", 0)
    fields = tiny_config("distilbert", hidden_size=64, hidden_dim=128, vocab_size=200)
    torch.manual_seed(0)
    theirs = randomize_weights(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**fields))).eval()
    theirs.save_pretrained(tmp_path)
    fast = hfbert.optimize_for_inference(hfbert.AutoModelForMaskedLM.from_pretrained(tmp_path), **options)
    assert hfbert.inference.inference_mode_of(fast).swapped >= 13  # 6 linear layers a layer, and the head's two
    input_ids = torch.randint(1, 200, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(12) < torch.tensor([[12], [8], [4]])).long()
    real = mask.bool()
    with torch.no_grad():
        ours, expected = (model(input_ids=input_ids, attention_mask=mask).logits[real] for model in (fast, theirs))
    error = (ours - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()
    assert 0 < error <= bound, error


@pytest.mark.slow
def test_parity_passes_on_an_onnx_export(folders, tmp_path, capsys):
    """`hfbert parity --artifact` on transformers' DistilBertModel exported to ONNX: the float64 verdict for hfbert
    and for the artifact in ONNX Runtime."""
    pytest.importorskip("onnxruntime", reason="the artifact runs in ONNX Runtime (pip install 'hfbert[deploy]')")
    pytest.importorskip("onnx", reason="the artifact is exported to ONNX (pip install 'hfbert[deploy]')")
    import benchmarks.artifacts as artifacts
    from hfbert.cli import main

    directory = folders("masked-lm")
    exported = artifacts.export_onnx(directory, tmp_path / "exact.onnx")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(text + "\n" for text in TEXTS), encoding="utf-8")
    report = tmp_path / "report.json"
    arguments = ["parity", str(directory), "--texts", str(texts), "--artifact", str(exported), "--json", str(report)]
    assert main(arguments) == 0, capsys.readouterr()
    assert "artifacts: 1 of 1 pass" in capsys.readouterr().out
    assert json.loads(report.read_text())["passed"] is True


def test_question_answering_refuses_other_than_two_labels_as_transformers_does(tmp_path):
    """transformers' DistilBertForQuestionAnswering refuses num_labels != 2; so does hfbert's, naming the field,
    while `hfbert convert` still reads a 3-label classifier's folder (its question-answering head is skipped)."""
    fields = tiny_config("distilbert", num_labels=3)
    with pytest.raises(ValueError, match="num_labels"):
        transformers.DistilBertForQuestionAnswering(transformers.DistilBertConfig(**fields))
    with pytest.raises(hfbert.ConfigError, match="'num_labels' is 3"):
        hfbert.DistilBertForQuestionAnswering(hfbert.DistilBertConfig(**fields))
    from hfbert.tools.convert import head_shapes

    shapes = head_shapes(hfbert.DistilBertConfig(**fields))
    assert (3, 32) in shapes["classifier.weight"] and "qa_outputs.weight" not in shapes
