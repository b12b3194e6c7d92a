"""Every tool on every checkpoint layout a member ships as (issue #64): a grid over the rows of
`hfbert.modeling.family.MEMBERS`, so that a member added there runs through every tool at once.

The layouts are the ones published checkpoints come in: the base model alone (gte-modernbert-base, the backbones of
sentence-transformers models), the masked LM (roberta-base, ModernBERT-base, SPLADE models), a sequence classifier of
one label (a reranker: gte-reranker-modernbert, cross-encoder/ms-marco-*), every other task head of the member, and
the folders sentence-transformers writes: a SentenceTransformer (the base model, mean pooling, Normalize), a
CrossEncoder (the classifier, an Identity activation where the default is Sigmoid) and a SparseEncoder (the masked LM,
SpladePooling "sum" where the default is "max"), so that a tool that drops the folder's settings gives other numbers.
Each checkpoint is written by transformers' own class (`support.members`: random weights far from its init, the
member's tokenizer), each folder by sentence-transformers, and each tool runs in-process (`support.cli.in_process`)
against its reference:

- `parity`: exit 0, every output within the float64 verdict, and the rows the layout has (the pooler where the
  checkpoint stores one, the masked-LM logits where it has that head); with an ONNX export of transformers' model of
  the checkpoint (`--artifact`), the artifact passes too;
- `inspect`: config.json's fields, every stored tensor with its shape, the parameters of the backbone (those
  transformers' base model takes) and of the heads;
- `convert`: transformers' class of the layout loads the result with the same outputs, bit for bit, and
  sentence-transformers' class of a folder gives the same numbers from the converted folder;
- `embed`: sentence-transformers' `encode` on the same folder, element-wise;
- `embed --sparse` on a masked LM: sentence-transformers' `SparseEncoder.encode`, element-wise, the same tokens;
- `rerank` on a sequence classifier: sentence-transformers' `CrossEncoder.rank`, element-wise, in the same order;
- `fill-mask` on a masked LM: transformers' fill-mask pipeline, the same tokens and scores;
- and where a layout lacks what the tool needs (`fill-mask` without a masked-LM head, `embed --sparse` without a
  masked-LM model, `rerank` without a classifier): exit 1, one line naming what is missing (and only what is), no
  traceback and no warning before it.

The default run takes the layouts people deploy (base model, masked LM, sequence classifier and the folders); the
other task heads, the `--artifact` rows and the rows that repeat a default one's work are marked slow.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from converters.key_map import head_of, normalize_name
from hfbert.modeling.family import member

from support.cli import in_process
from support.family import TEXTS
from support.members import MODEL_TYPES, reference_class, tokenized_checkpoint

transformers = pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")
st_models = pytest.importorskip("sentence_transformers.models")

MAX_ABS = 1e-5
# The layouts people deploy, besides the folders: in the default run for every tool that applies to them.
DEPLOYED = ("model", "masked-lm", "sequence-classification")
# The folders sentence-transformers writes, and the task layout each one holds.
FOLDERS = {"sentence-transformers": "model", "cross-encoder": "sequence-classification", "sparse-encoder": "masked-lm"}
MLM_LAYOUTS = ("masked-lm", "pretraining", "sparse-encoder")
# One label: a reranker's classifier (the layout `rerank` takes); the other tools read it as any classifier.
FIELDS = {"sequence-classification": {"num_labels": 1}}
TEXTS_AND_EDGES = [*TEXTS, " ".join(TEXTS), "x"]  # one longer than the longest input (truncated), one of a word
# Fewer for sparse vectors: a masked LM of random weights gives most of a 30,000-token vocabulary a weight in a text.
SPARSE_TEXTS = [TEXTS[3], " ".join(TEXTS), "x"]


def task_of(layout: str) -> str:
    """The task whose transformers class wrote a layout's weights."""
    return FOLDERS.get(layout, layout)


def grid(layouts_of, slow=lambda model_type, layout: False) -> list:
    """pytest params (model_type, layout) over every member, for the layouts `layouts_of(model_type)` gives; a layout
    no member deploys as such, or where `slow` says so, marked slow."""
    rows = []
    for model_type in MODEL_TYPES:
        for layout in layouts_of(model_type):
            deployed = layout in DEPLOYED or layout in FOLDERS
            marks = pytest.mark.slow if not deployed or slow(model_type, layout) else ()
            rows.append(pytest.param(model_type, layout, id=f"{model_type}-{layout}", marks=marks))
    return rows


def tasks(model_type: str) -> list[str]:
    return list(member(model_type).classes)


def has_mlm_head(model_type: str, layout: str) -> bool:
    """Whether the layout's checkpoint stores a masked-LM head: ELECTRA's pre-training model is its discriminator,
    which has none (transformers' fill-mask pipeline runs it on a random generator head; hfbert refuses it)."""
    return task_of(layout) in MLM_LAYOUTS and not (model_type == "electra" and task_of(layout) == "pretraining")


def with_mlm_head(model_type: str) -> list[str]:
    return [task for task in tasks(model_type) if has_mlm_head(model_type, task)]


def without_mlm_layouts(model_type: str) -> list[str]:
    without = [task for task in tasks(model_type) if not has_mlm_head(model_type, task)]
    return without + ["sentence-transformers", "cross-encoder"]


def not_splade(model_type: str) -> list[str]:
    """The layouts sentence-transformers' SparseEncoder runs no SPLADE model on: all but a masked LM's."""
    return [task for task in tasks(model_type) if task != "masked-lm"] + ["sentence-transformers", "cross-encoder"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, request):
    """(model_type, layout) -> the folder of that layout, written on first use and only read by the tests: a task's
    checkpoint by transformers' class with the member's tokenizer, or a folder sentence-transformers wrote (`FOLDERS`)
    around one."""
    folders: dict[tuple[str, str], Path] = {}

    def folder(model_type: str, layout: str) -> Path:
        if (model_type, layout) in folders:
            return folders[model_type, layout]
        if layout in FOLDERS:
            directory = sentence_folder(tmp_path_factory.mktemp(layout) / layout, folder(model_type, FOLDERS[layout]))
        else:
            directory = tmp_path_factory.mktemp(f"{model_type}-{layout}")
            tokenized_checkpoint(directory, model_type, layout, request, **FIELDS.get(layout, {}))
        folders[model_type, layout] = directory
        return directory

    return folder


def sentence_folder(directory: Path, source: Path) -> Path:
    """The sentence-transformers folder `directory.name` names (`FOLDERS`) around the checkpoint `source`, written by
    sentence-transformers' own class, with settings other than the class's defaults."""
    if directory.name == "sentence-transformers":
        modules = [st_models.Transformer(str(source), max_seq_length=24), st_models.Pooling(32, pooling_mode="mean")]
        st.SentenceTransformer(modules=[*modules, st_models.Normalize()], device="cpu").save(str(directory))
    elif directory.name == "cross-encoder":
        st.CrossEncoder(str(source), activation_fn=torch.nn.Identity(), device="cpu").save(str(directory))
    else:
        from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

        modules = [MLMTransformer(str(source)), SpladePooling("sum")]
        st.SparseEncoder(modules=modules, device="cpu").save_pretrained(str(directory))
    return directory


def stored(directory: Path) -> dict[str, list[int]]:
    """Every tensor of the checkpoint's model.safetensors and its shape, read with safetensors."""
    with safe_open(directory / "model.safetensors", "pt") as handle:
        return {name: list(handle.get_slice(name).get_shape()) for name in handle.keys()}  # noqa: SIM118


def refused(capsys, caplog, *arguments: object, naming: tuple[str, ...]):
    """`hfbert ARGUMENTS` in-process, refused as users should see it: exit 1, one line on stderr naming each of
    `naming`, no traceback, and no warning logged before it (transformers' "newly initialized ... TRAIN this model"
    about the head it then refuses). Returns the run."""
    caplog.clear()  # what the test's own set-up logged (building the checkpoint) is not the command's
    ran = in_process(capsys, *arguments)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1, (ran.returncode, ran.stderr[-2000:])
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr[-2000:]
    for part in naming:
        assert part in lines[0], lines[0]
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warnings == [], warnings
    return ran


def assert_named_tensors_absent(message: str, directory: Path) -> None:
    """Every `prefix.*` a refusal names as missing is missing: no stored tensor starts with it."""
    names = stored(directory)
    for prefix in re.findall(r"([\w.]+)\.\*", message):
        assert not any(name.startswith(prefix + ".") for name in names), (prefix, message)


# -- parity ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("texts") / "texts.txt"
    path.write_text("".join(text + "\n" for text in TEXTS), encoding="utf-8")
    return path


def parity(capsys, directory: Path, texts_file: Path, report: Path, *arguments) -> dict:
    """`hfbert parity DIRECTORY` in-process on TEXTS: exit 0, passed, every case run; the JSON report."""
    ran = in_process(capsys, "parity", directory, "--texts", texts_file, "--json", report, *arguments)
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    written = json.loads(report.read_text())
    assert written["passed"] is True and written["hfbert_passed"] is True
    cases = [case["name"] for case in written["cases"]]
    assert cases == ["single", "pairs", "right padding", "left padding", "max length"]
    return written


# The masked LM's row repeats test_family_conformance's test_parity_passes (default run); a folder's, the row of the
# checkpoint inside it (its files are read with --artifact only).
PARITY_SLOW = {"masked-lm", *FOLDERS}


@pytest.mark.parametrize(
    ("model_type", "layout"),
    grid(lambda model_type: [*tasks(model_type), *FOLDERS], lambda _, layout: layout in PARITY_SLOW),
)
def test_parity(model_type, layout, checkpoint, texts_file, tmp_path, capsys):
    """`hfbert parity` passes on every layout, comparing what the checkpoint has: the pooler where it stores one (in
    a task model's backbone too), the masked-LM logits where it has that head."""
    directory = checkpoint(model_type, layout)
    written = parity(capsys, directory, texts_file, tmp_path / "report.json")
    names = {row["name"] for row in written["rows"]}
    assert {"embeddings", "layer 0", "layer 1", "attentions layer 0", "attentions layer 1"} <= names
    # the encoder's pooler, not a head of that name (DeBERTa's classifiers keep a ContextPooler in `pooler.`)
    keys = member(model_type).key_layout
    encoder = [
        normalize_name(name, keys) for name in stored(directory) if head_of(normalize_name(name, keys), keys) is None
    ]
    pooler = any(name.split(".")[-3:-1] == ["pooler", "dense"] for name in encoder)
    assert ("pooler" in names) == pooler, names
    assert ("mlm logits" in names) == has_mlm_head(model_type, layout), names


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """(directory) -> transformers' encoder of the checkpoint as ONNX (benchmarks.artifacts.export_onnx: its base
    model, whatever task the checkpoint is of)."""
    pytest.importorskip("onnxruntime", reason="the artifact runs in ONNX Runtime (pip install 'hfbert[deploy]')")
    pytest.importorskip("onnx", reason="the artifact is exported to ONNX (pip install 'hfbert[deploy]')")
    from benchmarks.artifacts import export_onnx

    def export(directory: Path) -> Path:
        return export_onnx(directory, tmp_path_factory.mktemp("onnx") / "model.onnx")

    return export


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("model_type", "layout"), grid(lambda _: [*DEPLOYED, *FOLDERS]))
def test_parity_with_an_onnx_artifact(model_type, layout, checkpoint, onnx_export, texts_file, tmp_path, capsys):
    """`hfbert parity --artifact` with an exact ONNX export of transformers' model of the checkpoint: it passes (on
    a sentence-transformers folder, its sentence embeddings are read too)."""
    directory = checkpoint(model_type, layout)
    artifact = onnx_export(directory)
    written = parity(capsys, directory, texts_file, tmp_path / "report.json", "--artifact", artifact)
    (found,) = written["artifacts"]
    assert found["verdict"] == "pass", found
    assert "last_hidden_state" in found["outputs"]
    # The sentence embeddings a SentenceTransformer folder's pipeline makes are judged too; a CrossEncoder's or a
    # SparseEncoder's modules make none.
    pipeline = written["sentence_pipeline"]
    assert ("Normalize" in pipeline) if layout == "sentence-transformers" else pipeline == "", pipeline


# -- inspect and convert --------------------------------------------------------------------------------------------


def backbone_parameters(directory: Path, model_type: str) -> int:
    """The stored values transformers' base model of the checkpoint takes: the tensors whose names, without the
    task model's prefix (`base_model_prefix`), are in its state dict."""
    config = transformers.AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        base = reference_class(model_type)(config)
    names, prefix = set(base.state_dict()), base.base_model_prefix + "."
    return sum(math.prod(shape) for name, shape in stored(directory).items() if name.removeprefix(prefix) in names)


@pytest.mark.parametrize(("model_type", "layout"), grid(lambda model_type: [*tasks(model_type), *FOLDERS]))
def test_inspect(model_type, layout, checkpoint, capsys):
    """`hfbert inspect --json`: config.json's fields, every stored tensor with its shape, no tokenizer problem, the
    backbone's parameters as transformers' base model counts them and the rest as heads."""
    directory = checkpoint(model_type, layout)
    ran = in_process(capsys, "inspect", directory, "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    facts = json.loads(ran.stdout)
    config = json.loads((directory / "config.json").read_text())
    assert facts["config"]["model_type"] == model_type
    spelled = member(model_type).config_class.attribute_map  # DistilBERT's file says n_layers, dim, n_heads
    for field in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings"):
        assert facts["config"][field] == config[spelled.get(field, field)], field
    assert facts["tokenizer"]["problems"] == []
    shapes = stored(directory)
    assert {entry["name"]: entry["shape"] for entry in facts["tensors"]} == shapes
    total, backbone = sum(map(math.prod, shapes.values())), backbone_parameters(directory, model_type)
    assert facts["parameters"] == {"backbone": backbone, "heads": total - backbone, "total": total}
    ran = in_process(capsys, "inspect", directory)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"{model_type}, 2 layers" in ran.stdout


def inputs_of(directory: Path, task: str) -> dict[str, torch.Tensor]:
    """Two texts of unequal length through transformers' tokenizer of the checkpoint, padded; multiple choice: one
    question with the two as its choices."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    encoded = tokenizer(TEXTS[:2], padding=True, truncation=True, return_tensors="pt")
    if task == "multiple-choice":
        return {name: value[None] for name, value in encoded.items()}
    return dict(encoded)


def folder_outputs(directory: Path, layout: str):
    """What sentence-transformers' class of a folder gives on TEXTS_AND_EDGES: embeddings, sparse vectors (dense) or
    scores against TEXTS[2]."""
    if layout == "sentence-transformers":
        return st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS_AND_EDGES, batch_size=3)
    if layout == "sparse-encoder":
        encoder = st.SparseEncoder(str(directory), device="cpu")
        return encoder.encode(TEXTS_AND_EDGES, batch_size=3, convert_to_sparse_tensor=False).numpy()
    return st.CrossEncoder(str(directory), device="cpu").predict([(TEXTS[2], text) for text in TEXTS_AND_EDGES])


# test_family_conformance's test_convert_writes_transformers_layout_of_every_task converts every task's checkpoint
# in the default run: here the task layouts are slow, the folders not.
@pytest.mark.parametrize(
    ("model_type", "layout"),
    grid(lambda model_type: [*tasks(model_type), *FOLDERS], lambda _, layout: layout not in FOLDERS),
)
def test_convert(model_type, layout, checkpoint, tmp_path, capsys):
    """`hfbert convert`: the tensors the source stores, which transformers' class of the layout loads with the same
    outputs, and its tokenizer; sentence-transformers' class of a folder gives the same numbers from the result (the
    folder's pipeline files are carried over)."""
    directory, converted = checkpoint(model_type, layout), tmp_path / "converted"
    ran = in_process(capsys, "convert", directory, converted)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert stored(converted) == stored(directory)
    task = task_of(layout)
    reference = reference_class(model_type, task)
    with torch.no_grad():
        before = reference.from_pretrained(directory).eval()(**inputs_of(directory, task))
        after = reference.from_pretrained(converted).eval()(**inputs_of(converted, task))
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    if layout in FOLDERS:
        np.testing.assert_array_equal(folder_outputs(converted, layout), folder_outputs(directory, layout))


# -- embed ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "layout"), grid(lambda model_type: ["sentence-transformers", *tasks(model_type)])
)
def test_embed(model_type, layout, checkpoint, tmp_path, capsys):
    """`hfbert embed` on a sentence-transformers folder, and on each task layout as it is (the backbone of the task
    model, mean pooling: what `SentenceTransformer(folder)` makes of it), against `SentenceTransformer.encode`."""
    directory = checkpoint(model_type, layout)
    expected = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS_AND_EDGES, batch_size=3)
    out = tmp_path / "out.npy"
    ran = in_process(capsys, "embed", directory, *TEXTS_AND_EDGES, "--batch-size", "3", "--out", out)
    assert ran.returncode == 0, ran.stderr[-3000:]
    ours = np.load(out)
    assert ours.shape == expected.shape
    assert np.abs(ours - expected).max() <= MAX_ABS


@pytest.mark.parametrize(("model_type", "layout"), grid(lambda _: ["cross-encoder", "sparse-encoder"]))
def test_embed_on_a_reranker_or_sparse_folder_names_the_tool_that_runs_it(
    model_type, layout, checkpoint, capsys, caplog
):
    """A CrossEncoder or SparseEncoder folder is no sentence embedding model (`SentenceTransformer(folder)` would
    mean-pool its encoder and ignore what the folder says): `hfbert embed` refuses, naming the tool that runs it."""
    directory = checkpoint(model_type, layout)
    tool = "hfbert rerank" if layout == "cross-encoder" else "hfbert embed --sparse"
    refused(capsys, caplog, "embed", directory, "a text", naming=(str(directory), tool))


# The folder's rows are slow: a masked LM of random weights gives most of a 30,000-token vocabulary (BERT's, MPNet's)
# a weight in every text, so that a row reads and writes 100,000 weights; the masked LM's rows run the same path.
@pytest.mark.parametrize(
    ("model_type", "layout"),
    grid(lambda _: ["masked-lm", "sparse-encoder"], lambda _, layout: layout in FOLDERS),
)
def test_embed_sparse(model_type, layout, checkpoint, tmp_path, capsys):
    """`hfbert embed --sparse` on a masked-LM checkpoint (sentence-transformers' default for it: the head's logits,
    log(1 + relu), max over the tokens) and on a SparseEncoder folder (its SpladePooling sum), against
    `SparseEncoder.encode`: the same tokens, the same weights."""
    directory = checkpoint(model_type, layout)
    reference = st.SparseEncoder(str(directory), device="cpu")
    expected = reference.encode(SPARSE_TEXTS, batch_size=3, convert_to_sparse_tensor=False)
    tokens = reference.tokenizer.convert_ids_to_tokens(list(range(expected.shape[1])))
    assert len(set(tokens)) == len(tokens)  # a token names one entry
    assert int((expected == 0).sum()) > 0 and bool((expected != 0).any(dim=1).all())  # zeros, and weights in each
    out = tmp_path / "out.jsonl"
    ran = in_process(capsys, "embed", directory, *SPARSE_TEXTS, "--sparse", "--batch-size", "3", "--out", out)
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(SPARSE_TEXTS)))
    for line, vector in zip(lines, expected, strict=True):
        nonzero = vector.nonzero().flatten().tolist()
        assert sorted(line["embedding"]) == sorted(tokens[i] for i in nonzero)
        weights = np.array([line["embedding"][tokens[i]] for i in nonzero])
        assert np.abs(weights - vector[nonzero].numpy()).max() <= MAX_ABS


# BERT's pre-training checkpoint has the masked-LM head, but its architectures name no ...ForMaskedLM: there
# sentence-transformers' SparseEncoder builds another model (a CSR one, on the encoder's pooled output), which hfbert
# does not run, and says so.
@pytest.mark.parametrize(("model_type", "layout"), grid(not_splade))
def test_embed_sparse_without_a_masked_lm_model_is_refused(model_type, layout, checkpoint, capsys, caplog):
    directory = checkpoint(model_type, layout)
    refused(capsys, caplog, "embed", directory, "a text", "--sparse", naming=(str(directory), "masked-LM head"))


# -- rerank ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model_type", "layout"), grid(lambda _: ["sequence-classification", "cross-encoder"]))
def test_rerank(model_type, layout, checkpoint, capsys):
    """`hfbert rerank` on a one-label sequence classifier (sentence-transformers' default: Sigmoid) and on a
    CrossEncoder folder (its Identity), against `CrossEncoder.rank`: the same order, the same scores."""
    directory = checkpoint(model_type, layout)
    query = TEXTS[2]
    expected = st.CrossEncoder(str(directory), device="cpu").rank(query, TEXTS_AND_EDGES)
    ran = in_process(capsys, "rerank", directory, *TEXTS_AND_EDGES, "--query", query, "--batch-size", "3")
    assert ran.returncode == 0, ran.stderr[-3000:]
    lines = [json.loads(line) for line in ran.stdout.splitlines()]
    assert [line["index"] for line in lines] == [entry["corpus_id"] for entry in expected]
    ours = np.array([line["score"] for line in lines])
    assert np.abs(ours - np.array([entry["score"] for entry in expected])).max() <= MAX_ABS


# A multiple-choice classifier is (1, hidden), as a one-label sequence classifier's: it loads as one (in transformers
# too), and is no refusal; a token classifier of three labels is refused for its labels.
@pytest.mark.parametrize(
    ("model_type", "layout"),
    grid(lambda model_type: ["model", *with_mlm_head(model_type), "sentence-transformers", "sparse-encoder"]),
)
def test_rerank_without_a_classifier_is_refused(model_type, layout, checkpoint, capsys, caplog):
    """A base model or a masked LM: the missing classifier named, and only what is missing (ModernBERT's masked LM
    has the prediction head its classifier reads through)."""
    directory = checkpoint(model_type, layout)
    naming = (str(directory), "no classification head", "classifier.*")
    ran = refused(capsys, caplog, "rerank", directory, "a document", "--query", "q", naming=naming)
    assert_named_tensors_absent(ran.stderr, directory)


# -- fill-mask ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_type", "layout"), grid(lambda model_type: [*with_mlm_head(model_type), "sparse-encoder"])
)
def test_fill_mask(model_type, layout, checkpoint, capsys):
    """`hfbert fill-mask --json` against transformers' fill-mask pipeline: the same tokens, the same scores."""
    directory = checkpoint(model_type, layout)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    text = f"Paris is the {tokenizer.mask_token} of France."
    pipeline = transformers.pipeline("fill-mask", model=str(directory), tokenizer=tokenizer, device="cpu")
    expected = pipeline(text, top_k=5)
    ran = in_process(capsys, "fill-mask", directory, text, "--top-k", "5", "--json")
    assert ran.returncode == 0, ran.stderr[-3000:]
    ours = json.loads(ran.stdout)
    assert [entry["token"] for entry in ours] == [entry["token"] for entry in expected]
    scores = np.array([[a["score"], b["score"]] for a, b in zip(ours, expected, strict=True)])
    assert np.abs(scores[:, 0] - scores[:, 1]).max() <= MAX_ABS


@pytest.mark.parametrize(("model_type", "layout"), grid(without_mlm_layouts))
def test_fill_mask_without_a_masked_lm_head_is_refused(model_type, layout, checkpoint, capsys, caplog):
    directory = checkpoint(model_type, layout)
    mask = transformers.AutoTokenizer.from_pretrained(directory).mask_token
    ran = refused(
        capsys, caplog, "fill-mask", directory, f"Paris is the {mask} of France.", naming=("no masked-LM head",)
    )
    assert_named_tensors_absent(ran.stderr, directory)
