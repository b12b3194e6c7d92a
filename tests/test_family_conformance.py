"""Every member of the family against transformers' own classes: one suite over the rows of
`hfbert.modeling.family.MEMBERS`, so that a member added there is tested here at once.

Per member and task (`support.members.CLASSES`): the classes are the ones transformers names
(`Member.reference_class`); state dict keys and parameters come in transformers' order (an Adam state saved from
transformers' model steps hfbert's the same); forward takes transformers' parameters in transformers' order; every
output of every head equals transformers' element-wise, right-padded (padding-free where the head allows it) and
left-padded, in both attention kernels, as tuples too; one training step gives transformers' loss and gradients; and
what hfbert saves, transformers loads. Per member, the tools on a checkpoint with the member's tokenizer:
`hfbert.AutoTokenizer`, `hfbert parity`, `fill-mask` against transformers' pipeline, `embed` against
sentence-transformers, `convert` and `inspect`, and the fast path (`optimize_for_inference`).

Every checkpoint is written by transformers (`support.members`: random weights far from its init, saved by
`save_pretrained`) and loaded by hfbert's Auto classes. What only one member has (RoBERTa's positions, MPNet's
relative-position bias, the tokenizers' details) is tested in that member's own files.
"""

from __future__ import annotations

import inspect
import io
import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import hfbert
from hfbert.modeling.family import member
from hfbert.modeling.padding import PackedBatch

from support.family import TEXTS
from support.members import (
    CLASSES,
    MODEL_TYPES,
    num_labels_of,
    reference_checkpoint,
    reference_class,
    reference_config,
    tiny_config,
    tokenized_checkpoint,
)

transformers = pytest.importorskip("transformers")

ATOL = RTOL = 1e-5
LENGTHS = (9, 5, 3)  # three rows of unequal lengths: a right-padded batch runs padding-free in buckets
CHOICES = 3
# hfbert's Auto class of each task it has one for (transformers has none for pre-training and next-sentence either).
AUTO = {
    value.task: value
    for value in vars(hfbert).values()
    if isinstance(value, type) and issubclass(value, hfbert.AutoModel)
}
# transformers' forward parameters that belong to decoders (cross-attention, the key/value cache): an encoder-only
# library has none of them.
DECODER_PARAMETERS = {"encoder_hidden_states", "encoder_attention_mask", "cache", "past_key_values", "use_cache"}
DECODER_OUTPUTS = {"cross_attentions", "past_key_values"}
# The config fields that turn a member's dropout off, where they are not BERT's.
DROPOUT_FIELDS = {
    "modernbert": {"embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0, "classifier_dropout": 0.0},
    "electra": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "summary_last_dropout": 0.0},
    "distilbert": {"dropout": 0.0, "attention_dropout": 0.0, "qa_dropout": 0.0, "seq_classif_dropout": 0.0},
}


def ids(pair) -> str:
    return "-".join(pair)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(model_type, task) -> the folder of transformers' class for it (random weights), written on first use and only
    read by the tests."""
    folders = {}

    def folder(model_type: str, task: str):
        if (model_type, task) not in folders:
            directory = tmp_path_factory.mktemp(f"{model_type}-{task}")
            folders[model_type, task] = reference_checkpoint(directory, model_type, task)
        return folders[model_type, task]

    return folder


def load(model_type: str, task: str, directory, **options):
    """hfbert's model of `task` from `directory`, through its Auto class where it has one; it must be the member's,
    with every tensor of the checkpoint loaded and none missing."""
    expected = member(model_type).classes[task]
    model, info = AUTO.get(task, expected).from_pretrained(directory, output_loading_info=True, **options)
    assert type(model) is expected and type(model).__name__ == member(model_type).reference_class(task)
    assert (info["missing_keys"], info["unexpected_keys"], info["report"].new_head) == (set(), set(), [])
    return model


def takes(model_class, name: str) -> bool:
    return name in inspect.signature(model_class.forward).parameters


def batch(model_type: str, task: str, padding: str, seed: int = 0) -> tuple[dict, dict]:
    """Inputs (input_ids, attention_mask, token types where the member has two) padded on one side, and labels for
    `task`'s loss. Multiple choice: 2 questions x 3 choices."""
    reference, config = reference_class(model_type, task), reference_config(model_type)
    generator = torch.Generator().manual_seed(seed)
    lengths = LENGTHS * 2 if task == "multiple-choice" else LENGTHS
    width, pad = max(lengths), config.pad_token_id
    input_ids = torch.full((len(lengths), width), pad)
    mask = torch.zeros_like(input_ids)
    for row, length in enumerate(lengths):
        tokens = torch.randint(3, config.vocab_size, (length,), generator=generator)
        tokens[tokens == pad] = 3 if pad != 3 else 4
        where = slice(0, length) if padding == "right" else slice(width - length, width)
        input_ids[row, where], mask[row, where] = tokens, 1
    inputs = {"input_ids": input_ids, "attention_mask": mask}
    if takes(reference, "token_type_ids") and getattr(config, "type_vocab_size", 1) > 1:
        inputs["token_type_ids"] = (torch.arange(width) >= width // 2).long().expand_as(input_ids) * mask
    real, rows = mask.bool(), len(lengths)
    if task == "multiple-choice":
        inputs = {name: value.view(2, CHOICES, width) for name, value in inputs.items()}
        return inputs, {"labels": torch.randint(0, CHOICES, (2,), generator=generator)}

    def token_labels(high: int) -> torch.Tensor:
        return torch.where(real, torch.randint(0, high, real.shape, generator=generator), -100)

    def row_labels(high: int) -> torch.Tensor:
        return torch.randint(0, high, (rows,), generator=generator)

    labels = {
        "model": lambda: {},
        "pretraining": lambda: (
            {"labels": token_labels(config.vocab_size), "next_sentence_label": row_labels(2)}
            if takes(reference, "next_sentence_label")
            else {"labels": token_labels(2)}  # ELECTRA's discriminator: 1 for a replaced token, 0 for an original
        ),
        "masked-lm": lambda: {"labels": token_labels(config.vocab_size)},
        "next-sentence": lambda: {"labels": row_labels(2)},
        "sequence-classification": lambda: {"labels": row_labels(config.num_labels)},
        "token-classification": lambda: {"labels": token_labels(config.num_labels)},
        "question-answering": lambda: {"start_positions": row_labels(width), "end_positions": row_labels(width)},
    }
    return inputs, labels[task]()


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, real: torch.Tensor, packed: bool, name: str) -> None:
    """One output. Where hfbert ran padding-free (it leaves pad positions zero), token-level tensors at real positions
    only; everything else whole, pad positions included."""
    assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
    real = real.reshape(-1, real.shape[-1])  # multiple choice: one sequence per choice
    if packed and theirs.dim() >= 2 and tuple(theirs.shape[:2]) == tuple(real.shape):
        ours, theirs = ours[real], theirs[real]
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL, msg=lambda message: f"{name}: {message}")


def assert_outputs_equal(ours, theirs, real: torch.Tensor, packed: bool, case: str) -> None:
    """Every field transformers returns (loss, logits, pooler, hidden states, attentions ...) against hfbert's."""
    fields = [key for key, value in theirs.items() if value is not None and key not in DECODER_OUTPUTS]
    assert list(ours.keys()) == fields, case
    for field in fields:
        if isinstance(theirs[field], tuple):
            assert len(ours[field]) == len(theirs[field]), (case, field)
            for index, (left, right) in enumerate(zip(ours[field], theirs[field], strict=True)):
                assert_close(left, right, real, packed, f"{case}: {field}[{index}]")
        else:
            assert_close(ours[field], theirs[field], real, packed, f"{case}: {field}")


class PackedBatches:
    """Counts the padding-free batches hfbert builds."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        built = PackedBatch.__init__

        def counting(batch, *arguments, **options):
            self.count += 1
            built(batch, *arguments, **options)

        monkeypatch.setattr(PackedBatch, "__init__", counting)


# -- per member and task ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model_type", "task"), CLASSES, ids=map(ids, CLASSES))
def test_state_dict_parameters_and_optimizer_state_follow_transformers(model_type, task):
    torch.manual_seed(0)
    labels = {"num_labels": num_labels_of(task)}  # DistilBERT's question answering refuses any other count than 2
    theirs = reference_class(model_type, task)(reference_config(model_type, **labels))
    ours = member(model_type).classes[task](member(model_type).config_class(**tiny_config(model_type, **labels)))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [name for name, _ in ours.named_parameters()] == [name for name, _ in theirs.named_parameters()]
    ours.load_state_dict(theirs.state_dict())

    # Adam's state as transformers' model left it after two steps, then one more step on both with the same
    # gradients: every parameter must come out equal (another tensor's moments would move it otherwise).
    theirs_optimizer = torch.optim.Adam(theirs.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(2)
    for _ in range(2):
        for parameter in theirs.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator)
        theirs_optimizer.step()
    ours.load_state_dict(theirs.state_dict())
    ours_optimizer = torch.optim.Adam(ours.parameters(), lr=1e-2)
    saved = io.BytesIO()  # as a training script saves it: a copy, not the live moments transformers' steps change
    torch.save(theirs_optimizer.state_dict(), saved)
    saved.seek(0)
    ours_optimizer.load_state_dict(torch.load(saved))
    gradients = {name: torch.randn(p.shape, generator=generator) for name, p in theirs.named_parameters()}
    for model in (theirs, ours):
        for name, parameter in model.named_parameters():
            parameter.grad = gradients[name].clone()
    theirs_optimizer.step()
    ours_optimizer.step()
    ours_parameters = dict(ours.named_parameters())
    for name, parameter in theirs.named_parameters():
        assert torch.equal(ours_parameters[name], parameter), name


@pytest.mark.parametrize(
    ("model_type", "task"),
    CLASSES,
    ids=map(ids, CLASSES),
)
def test_forward_takes_transformers_parameters_in_transformers_order(model_type, task):
    """The parameters transformers' forward names, in its order (decoder-only ones aside); beyond them hfbert takes
    only what transformers' forward takes as keyword arguments (output_attentions, output_hidden_states,
    return_dict)."""
    reference = reference_class(model_type, task)
    theirs = inspect.signature(reference.forward).parameters
    ours = inspect.signature(member(model_type).classes[task].forward).parameters
    named = [name for name, p in theirs.items() if p.kind is not p.VAR_KEYWORD and name not in DECODER_PARAMETERS]
    assert list(ours)[: len(named)] == named
    takes_keywords = any(p.kind is p.VAR_KEYWORD for p in theirs.values())
    assert takes_keywords or all(p.kind is not p.VAR_KEYWORD for p in ours.values())
    extra = [name for name, p in ours.items() if p.kind is not p.VAR_KEYWORD][len(named) :]
    if takes_keywords:
        assert set(extra) <= {"output_attentions", "output_hidden_states", "return_dict"}, extra
    else:
        assert extra == [], extra
    assert all(p.kind is not p.VAR_POSITIONAL for p in ours.values())


@pytest.mark.parametrize(("model_type", "task"), CLASSES, ids=map(ids, CLASSES))
def test_every_output_equals_transformers(model_type, task, saved, monkeypatch):
    """Right padding, padding-free where the head allows it (its backbone's `padding_free`) and padded; left padding;
    in sdpa and eager (with attention maps), with losses, and as return_dict=False tuples."""
    directory = saved(model_type, task)
    reference = reference_class(model_type, task).from_pretrained(directory, attn_implementation="eager").eval()
    model = load(model_type, task, directory)
    assert not model.training
    backbone = getattr(model, "backbone", model)
    allowed = backbone.padding_free
    packed = PackedBatches(monkeypatch)
    for padding in ("right", "right, padded", "left"):
        inputs, labels = batch(model_type, task, padding.split(",")[0])
        real = inputs["attention_mask"].bool()
        backbone.padding_free = allowed and padding != "right, padded"
        with torch.no_grad():
            for implementation in ("sdpa", "eager"):
                # Each kernel against transformers' same kernel: where a pad query's window holds only pads
                # (ModernBERT's local layers), transformers' eager and sdpa kernels give it different values.
                reference.set_attn_implementation(implementation)
                expected = reference(**inputs, **labels, output_hidden_states=True)
                model.set_attn_implementation(implementation)
                packed.count = 0
                actual = model(**inputs, **labels, output_hidden_states=True)
                free = packed.count > 0
                # hfbert runs a right-padded batch padding-free unless the head keeps pads (question answering)
                assert free == (padding == "right" and allowed), (padding, implementation)
                assert_outputs_equal(actual, expected, real, free, f"{padding} padding, {implementation}")
            attentions = reference(**inputs, **labels, output_attentions=True)
            assert_outputs_equal(model(**inputs, **labels, output_attentions=True), attentions, real, False, "maps")
            reference.set_attn_implementation("sdpa")
            expected = reference(**inputs, **labels, output_hidden_states=True, return_dict=False)
            model.set_attn_implementation("sdpa")
            packed.count = 0
            actual = model(**inputs, **labels, output_hidden_states=True, return_dict=False)
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for index, (ours, theirs) in enumerate(zip(actual, expected, strict=True)):
            assert type(ours) is type(theirs), index
            pairs = zip(ours, theirs, strict=True) if isinstance(theirs, tuple) else [(ours, theirs)]
            for position, (left, right) in enumerate(pairs):
                assert_close(left, right, real, packed.count > 0, f"{padding} padding, tuple[{index}][{position}]")


def training_loss(output, real: torch.Tensor) -> torch.Tensor:
    """The head's loss; for the backbone, one over its outputs at real positions."""
    if getattr(output, "loss", None) is not None:
        return output.loss
    pooler = getattr(output, "pooler_output", None)  # ModernBERT has none
    pooled = pooler.square().mean() if pooler is not None else 0.0
    return output.last_hidden_state[real].square().mean() + pooled


@pytest.mark.parametrize(("model_type", "task"), CLASSES, ids=map(ids, CLASSES))
def test_one_training_step_gives_transformers_loss_and_gradients(model_type, task, saved):
    """Dropout off in both (set at load); the loss and every parameter's gradient."""
    directory = saved(model_type, task)
    off = DROPOUT_FIELDS.get(model_type, {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    reference = reference_class(model_type, task).from_pretrained(directory, **off).train()
    model = load(model_type, task, directory, **off).train()
    inputs, labels = batch(model_type, task, "right", seed=1)
    real = inputs["attention_mask"].bool()
    expected = training_loss(reference(**inputs, **labels), real)
    actual = training_loss(model(**inputs, **labels), real)
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)
    expected.backward()
    actual.backward()
    theirs = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}
    ours = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for name, gradient in theirs.items():
        torch.testing.assert_close(ours[name], gradient, atol=ATOL, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(("model_type", "task"), CLASSES, ids=map(ids, CLASSES))
def test_what_hfbert_saves_transformers_loads(model_type, task, saved, tmp_path):
    """The tensors transformers saved, under the same names (a tied decoder not stored), and a config.json of the
    member; transformers loads them with nothing missing and computes the same."""
    directory = saved(model_type, task)
    load(model_type, task, directory).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    source, written = load_file(directory / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert sorted(written) == sorted(source)
    assert all(torch.equal(written[name], source[name]) for name in source)
    reference = reference_class(model_type, task)
    original = reference.from_pretrained(directory).eval()
    reloaded, info = reference.from_pretrained(tmp_path, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    for name, tensor in original.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    inputs, _ = batch(model_type, task, "right")
    with torch.no_grad():
        assert torch.equal(reloaded.eval()(**inputs)[0], original(**inputs)[0])


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_auto_reads_config_json_once_and_names_it_in_a_refusal(model_type, saved, monkeypatch, tmp_path):
    """The Auto class reads config.json to pick the class and hands it on: one read per load. A refusal after that
    still names the file the config came from, not the argument it was passed as."""
    import converters.json_files
    import hfbert.modeling.config

    directory = saved(model_type, "model")
    reads = []
    real = converters.json_files.read_json

    def counted(path, *args, **kwargs):
        reads.append(path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(hfbert.modeling.config, "read_json", counted)
    load(model_type, "model", directory)
    assert [path.name for path in reads if path.name == "config.json"] == ["config.json"]
    # Weights named for another member than config.json says: refused after the read, naming the file.
    other = "bert" if model_type != "bert" else "roberta"
    source = saved(other, "masked-lm")
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    (wrong / "config.json").write_text((saved(model_type, "masked-lm") / "config.json").read_text())
    with pytest.raises(Exception, match=r"but \S*wrong/config\.json says") as refused:
        hfbert.AutoModelForMaskedLM.from_pretrained(wrong)
    assert "(config=)" not in str(refused.value)


# -- per member: the tools on a checkpoint with the member's tokenizer ------------------------------------------------


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory, request):
    """(model_type, task) -> transformers' checkpoint of `task` with the member's tokenizer; written on first use."""
    folders = {}

    def folder(model_type: str, task: str):
        if (model_type, task) not in folders:
            directory = tmp_path_factory.mktemp(f"{model_type}-{task}-tokenized")
            folders[model_type, task] = tokenized_checkpoint(directory, model_type, task, request)
        return folders[model_type, task]

    return folder


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_auto_tokenizer_equals_transformers(model_type, tokenized):
    from test_tokenizer import assert_same

    directory = tokenized(model_type, "masked-lm")
    ours = hfbert.AutoTokenizer.from_pretrained(directory)
    reference = transformers.AutoTokenizer.from_pretrained(directory)
    assert type(ours).__name__ == member(model_type).tokenizer
    assert len(ours) == len(reference) and ours.get_vocab() == reference.get_vocab()
    firsts, seconds = TEXTS[:3], TEXTS[3:]
    for arguments in ({}, {"padding": True, "return_tensors": "pt"}, {"padding": True, "padding_side": "left"}):
        assert_same(ours(TEXTS, **arguments), reference(TEXTS, **arguments))
        assert_same(ours(firsts, seconds, **arguments), reference(firsts, seconds, **arguments))
    truncated = {"truncation": True, "max_length": 12, "padding": True, "return_tensors": "pt"}
    assert_same(ours(TEXTS, **truncated), reference(TEXTS, **truncated))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_parity_passes(model_type, tokenized, tmp_path, capsys):
    """`hfbert parity` in-process on the masked LM: exit 0, every case run, every layer and the head compared."""
    from hfbert.cli import main

    directory = tokenized(model_type, "masked-lm")
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(text + "\n" for text in TEXTS), encoding="utf-8")
    report = tmp_path / "report.json"
    assert main(["parity", str(directory), "--texts", str(texts), "--json", str(report)]) == 0, capsys.readouterr()
    assert "PASS" in capsys.readouterr().out.upper()
    written = json.loads(report.read_text())
    assert written["passed"] is True
    names = {row["name"] for row in written["rows"]}
    assert {"embeddings", "layer 0", "layer 1", "mlm logits", "mlm top-5"} <= names
    cases = [case["name"] for case in written["cases"]]
    assert cases == ["single", "pairs", "right padding", "left padding", "max length"]


# The mask between words, first, glued to a word (RoBERTa's and MPNet's <mask> takes the space before it), and in a
# sentence every member's tokenizer here knows.
MASKED = [
    "Paris is the {} of France.",
    "{} is a city in Europe.",
    "A sentence ending in a{}.",
    "The quick brown {} jumps over the lazy dog.",
]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_fill_mask_equals_transformers_pipeline(model_type, tokenized, capsys):
    """`hfbert fill-mask` in-process on the masked LM with the member's tokenizer and mask token: transformers'
    pipeline's tokens, scores and sequences."""
    from hfbert.cli import main

    directory = tokenized(model_type, "masked-lm")
    fill = transformers.pipeline("fill-mask", model=str(directory), tokenizer=str(directory), device="cpu")
    for template in MASKED:
        text = template.format(fill.tokenizer.mask_token)
        expected = fill(text, top_k=5)
        assert main(["fill-mask", str(directory), text, "--top-k", "5", "--json"]) == 0
        ours = json.loads(capsys.readouterr().out)
        assert [p["token"] for p in ours] == [p["token"] for p in expected], text
        assert np.abs(np.array([p["score"] for p in ours]) - [p["score"] for p in expected]).max() <= 1e-6, text
        assert [p["sequence"] for p in ours] == [p["sequence"] for p in expected], text


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_embed_equals_sentence_transformers(model_type, tokenized, tmp_path, capsys):
    """A sentence-transformers folder (the member's backbone, mean pooling, Normalize) written by
    sentence-transformers: `Embedder` and `hfbert embed` in-process against `SentenceTransformer.encode`."""
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    from hfbert.cli import main
    from hfbert.tools.embedding import Embedder

    backbone = tokenized(model_type, "model")
    modules = [models.Transformer(str(backbone), max_seq_length=24), models.Pooling(32, pooling_mode="mean")]
    st.SentenceTransformer(modules=[*modules, models.Normalize()], device="cpu").save(str(tmp_path / "sentence"))
    texts = [*TEXTS, " ".join(TEXTS), "x"]  # one past max_seq_length: truncated
    expected = st.SentenceTransformer(str(tmp_path / "sentence"), device="cpu").encode(texts, batch_size=3)
    ours = Embedder(tmp_path / "sentence", batch_size=3).embed(texts).numpy()
    assert ours.shape == expected.shape
    assert np.abs(ours - expected).max() <= 1e-5
    out = tmp_path / "out.npy"
    assert main(["embed", str(tmp_path / "sentence"), *texts, "--batch-size", "2", "--out", str(out)]) == 0
    assert np.abs(np.load(out) - expected).max() <= 1e-5
    assert f"wrote {len(texts)} embeddings of size 32" in capsys.readouterr().err


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_convert_writes_transformers_layout_of_every_task(model_type, saved, tmp_path, capsys):
    """`hfbert convert` in-process on each task's checkpoint: transformers' names and values (the member's prefix,
    its head names, a tied decoder not stored; no prefix for the backbone), which transformers loads with the same
    outputs; converting the result again gives the same bytes."""
    from hfbert.cli import main

    for task in member(model_type).classes:
        directory, converted = saved(model_type, task), tmp_path / task
        assert main(["convert", str(directory), str(converted)]) == 0
        assert f"wrote {converted}" in capsys.readouterr().out
        source = load_file(directory / "model.safetensors")
        written = load_file(converted / "model.safetensors")
        assert sorted(written) == sorted(source), task
        assert all(torch.equal(written[name], source[name]) for name in source), task
        assert json.loads((converted / "config.json").read_text())["model_type"] == model_type
        inputs, _ = batch(model_type, task, "right")
        reference = reference_class(model_type, task)
        with torch.no_grad():
            before = reference.from_pretrained(directory).eval()(**inputs)[0]
            after = reference.from_pretrained(converted).eval()(**inputs)[0]
        assert torch.equal(after, before), task
        assert main(["convert", str(converted), str(tmp_path / f"{task}-again")]) == 0
        again = (tmp_path / f"{task}-again" / "model.safetensors").read_bytes()
        assert again == (converted / "model.safetensors").read_bytes(), task


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_inspect_reads_the_members_layout(model_type, tokenized, capsys):
    """`hfbert inspect` in-process on a masked LM with the member's tokenizer: config.json's fields, every tensor,
    and no tokenizer problem."""
    from hfbert.cli import main

    directory = tokenized(model_type, "masked-lm")
    assert main(["inspect", str(directory), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    config = json.loads((directory / "config.json").read_text())
    assert facts["config"]["model_type"] == model_type
    spelled = member(model_type).config_class.attribute_map  # DistilBERT's file says n_layers, dim, n_heads
    for field in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        assert facts["config"][field] == config[spelled.get(field, field)], field
    assert facts["tokenizer"]["problems"] == []
    with safe_open(directory / "model.safetensors", "pt") as handle:
        shapes = {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118
    assert {entry["name"]: entry["shape"] for entry in facts["tensors"]} == shapes
    assert main(["inspect", str(directory)]) == 0
    assert f"{model_type}, 2 layers" in capsys.readouterr().out


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_fast_path_equals_the_plain_model_and_transformers(model_type, saved, monkeypatch):
    """`optimize_for_inference` with every linear layer swapped (the size threshold lowered for the tiny model):
    on a right- and a left-padded batch, its outputs equal the plain model's and transformers'."""
    import hfbert.inference.optimize as optimize
    from hfbert.inference import inference_mode_of

    monkeypatch.setattr(optimize, "MIN_PACKED_WEIGHTS", 0)
    directory = saved(model_type, "masked-lm")
    reference = reference_class(model_type, "masked-lm").from_pretrained(directory).eval()
    plain = load(model_type, "masked-lm", directory)
    fast = hfbert.optimize_for_inference(load(model_type, "masked-lm", directory), kernels="always")
    assert inference_mode_of(fast).swapped > 0, inference_mode_of(fast)
    for padding in ("right", "left"):
        inputs, _ = batch(model_type, "masked-lm", padding)
        real = inputs["attention_mask"].bool()
        with torch.no_grad():
            expected, ours = plain(**inputs).logits[real], fast(**inputs).logits[real]
            theirs = reference(**inputs).logits[real]
        torch.testing.assert_close(ours, expected, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)
