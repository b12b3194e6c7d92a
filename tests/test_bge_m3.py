"""bge-m3's three outputs (issue #52 part 3): `Embedder.embed_m3` and `hfbert embed --output dense,sparse,colbert`
return what FlagEmbedding's `BGEM3FlagModel.encode(..., return_dense=True, return_sparse=True,
return_colbert_vecs=True)` returns on the same folder: dense vectors and ColBERT vectors element-wise within 1e-5
(the same number of ColBERT vectors per text), lexical weights within 1e-5 with the same key set.

The folder is built in bge-m3's layout by the references' own classes: transformers' XLMRobertaModel (2 layers of
width 32, random weights far from its init: `support.helpers.randomize_weights`) and an XLM-R Unigram tokenizer of
97 pieces (`support.family.tokenizer_of`: a text is many ids), saved by sentence-transformers' Transformer,
Pooling("cls") and Normalize modules, and `torch.save` of two `nn.Linear` state_dicts, `sparse_linear.pt` (32 -> 1)
and `colbert_linear.pt` (32 -> 32). Texts of mixed lengths in batches of 4 (padded batches), an empty one (an empty
lexical dict: its only tokens are <s> and </s>), repeated words (a repeated id keeps its largest weight) and one of
528 tokens, beyond FlagEmbedding's default 512 and within the folder's max_seq_length of 1,024.

Two references, on the same weights:
- `flag_formulas`, always: FlagEmbedding 1.4.2's formulas written out on transformers' XLMRobertaModel, read from
  FlagEmbedding/finetune/embedder/encoder_only/m3/modeling.py (`EncoderOnlyEmbedderM3Model._dense_embedding` with
  "cls", `_sparse_embedding`'s relu(sparse_linear(h)), `_colbert_embedding`'s colbert_linear(h[:, 1:]) * mask[:, 1:],
  `forward`'s F.normalize) and FlagEmbedding/inference/embedder/encoder_only/m3.py (`M3Embedder.encode_single_device`:
  `_process_token_weights`, `_process_colbert_vecs`). FlagEmbedding is not in the test extra: its requirements
  (datasets, ir-datasets, pandas, pyarrow) are not the project's.
- FlagEmbedding itself, where it is importable (e.g. `pip install --target DIR --no-deps flagembedding datasets
  ir_datasets ...` and PYTHONPATH=DIR; it leaves transformers and torch as they are): `test_equals_flagembedding`
  also checks the formulas above against it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import hfbert
from converters.errors import CheckpointError
from hfbert.cli import main
from hfbert.tools.bge_m3 import m3_file
from hfbert.tools.convert import convert
from hfbert.tools.embedding import Embedder

from support.family import TEXTS, tokenizer_of
from support.helpers import randomize_weights, swap_as_at_bert_base

sentence_transformers = pytest.importorskip("sentence_transformers")
MAX_ABS = 1e-5
THRESHOLD_MARGIN = 1e-4  # every sparse score of the folder's texts at least this far from relu's 0 (the fixture's)
HIDDEN = 32
LONGEST = 1024  # the folder's max_seq_length: FlagEmbedding's default of 512 would cut the long text
LONG_TEXT = " ".join(TEXTS * 2)  # 528 tokens
TEXTS_M3 = [
    *TEXTS,
    "",
    "the the the capital capital of France France",
    LONG_TEXT,
    "Yes.",
    " ".join(TEXTS[:3]),
    TEXTS[1].upper(),
    UNKNOWN := "emoji 😀 and €",  # characters the tokenizer has no piece for: <unk>
]


def bge_m3_folder(directory: Path) -> Path:
    """A folder in BAAI/bge-m3's layout (see the module docstring)."""
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    raw = directory.with_name(directory.name + "-transformers")
    tokenizer = tokenizer_of("xlm-roberta", LONGEST)
    tokenizer.save_pretrained(raw)
    config = transformers.XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=LONGEST + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    randomize_weights(transformers.XLMRobertaModel(config)).eval().save_pretrained(raw)
    modules = [Transformer(str(raw), max_seq_length=LONGEST), Pooling(HIDDEN, "cls"), Normalize()]
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    sparse, colbert = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, HIDDEN)
    with torch.no_grad():
        # A random model's hidden states share one direction, so a random sparse_linear scores nearly every token
        # alike. Tilted towards the special tokens and centred on the median score instead: <s>, </s> and <unk>
        # get weights > 0 (which FlagEmbedding drops) and about half the other tokens relu's 0 (no key), as in real
        # outputs.
        batch = tokenizer([*TEXTS_M3, UNKNOWN], padding=True, return_tensors="pt")
        hidden = transformers.XLMRobertaModel.from_pretrained(raw).eval()(**batch).last_hidden_state
        real = batch["attention_mask"].bool()
        special = real & (batch["input_ids"] <= 3)  # <s> <pad> </s> <unk>
        direction = hidden[special].mean(0) - hidden[real & ~special].mean(0)
        sparse.weight.copy_(direction / direction.norm() + 0.1 * torch.randn(HIDDEN))
        sparse.bias.copy_(-sparse.weight @ hidden[real & ~special].median(0).values)
        # Zero in the middle of the widest gap between the scores near the median, not on the median score: a
        # token scored 0 would be kept or dropped by the last bit of fp32 rounding (relu's threshold), which
        # differs between any two batchings of the same text, in transformers as in hfbert.
        scores = sparse(hidden[real & ~special]).squeeze(-1).sort().values
        middle = len(scores) // 2
        near = scores[middle - 10 : middle + 11]
        widest = int((near[1:] - near[:-1]).argmax())
        sparse.bias.sub_((near[widest] + near[widest + 1]) / 2)
        colbert.weight.normal_(0.0, 0.2)
        colbert.bias.normal_(0.0, 0.2)
    torch.save(sparse.state_dict(), directory / "sparse_linear.pt")
    torch.save(colbert.state_dict(), directory / "colbert_linear.pt")
    return directory


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return bge_m3_folder(tmp_path_factory.mktemp("bge-m3") / "model")


@torch.no_grad()
def flag_formulas(directory: Path, texts: list[str], max_length: int, batch_size: int = 4) -> dict:
    """FlagEmbedding's `BGEM3FlagModel.encode` with return_dense, return_sparse and return_colbert_vecs, written
    out from its source (see the module docstring) on transformers' own model and tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.XLMRobertaModel.from_pretrained(directory).eval()
    sparse_linear, colbert_linear = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, HIDDEN)
    sparse_linear.load_state_dict(torch.load(directory / "sparse_linear.pt", map_location="cpu", weights_only=True))
    colbert_linear.load_state_dict(torch.load(directory / "colbert_linear.pt", map_location="cpu", weights_only=True))
    unused = {
        tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[name])
        for name in ("cls_token", "eos_token", "pad_token", "unk_token")
        if name in tokenizer.special_tokens_map
    }
    dense, lexical, colbert = [], [], []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(
            texts[start : start + batch_size],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_token_type_ids=False,
            return_tensors="pt",
        )
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"]
        dense.append(torch.nn.functional.normalize(hidden[:, 0], dim=-1))
        token_weights = torch.relu(sparse_linear(hidden)).squeeze(-1)
        vectors = colbert_linear(hidden[:, 1:]) * mask[:, 1:][:, :, None].float()
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
        for weights, ids, text_vectors, text_mask in zip(
            token_weights, batch["input_ids"].tolist(), vectors, mask, strict=True
        ):
            result: dict[str, float] = {}
            for weight, index in zip(weights.tolist(), ids, strict=True):
                if index not in unused and weight > 0 and weight > result.get(str(index), 0):
                    result[str(index)] = weight
            lexical.append(result)
            colbert.append(text_vectors[: int(text_mask.sum()) - 1])
    return {"dense_vecs": torch.cat(dense), "lexical_weights": lexical, "colbert_vecs": colbert}


def assert_equal(ours: dict, reference: dict, outputs=("dense", "sparse", "colbert")) -> None:
    if "dense" in outputs:
        dense = torch.as_tensor(np.asarray(reference["dense_vecs"]))
        assert ours["dense_vecs"].shape == dense.shape
        assert (ours["dense_vecs"] - dense).abs().max() <= MAX_ABS
    if "sparse" in outputs:
        assert len(ours["lexical_weights"]) == len(reference["lexical_weights"])
        for number, (mine, theirs) in enumerate(
            zip(ours["lexical_weights"], reference["lexical_weights"], strict=True)
        ):
            assert all(isinstance(key, str) for key in mine)
            assert all(weight > 0 for weight in mine.values()), f"text {number}: a weight <= 0 kept"
            # Vectors over the vocabulary, an absent id weighing 0: every id's weight within MAX_ABS. On the
            # folder's texts no score lies within THRESHOLD_MARGIN of 0, so there the key sets are equal too
            # (`test_embed_m3_equals_flagembedding_formulas`); on other inputs an id scored within fp32 rounding of 0
            # may be kept on one side only, with a weight of that rounding.
            worst = max(
                (abs(mine.get(key, 0.0) - float(theirs.get(key, 0.0))) for key in {*mine, *theirs}), default=0.0
            )
            assert worst <= MAX_ABS, f"text {number}: max abs difference {worst}"
    if "colbert" in outputs:
        assert len(ours["colbert_vecs"]) == len(reference["colbert_vecs"])
        for number, (mine, theirs) in enumerate(zip(ours["colbert_vecs"], reference["colbert_vecs"], strict=True)):
            theirs = torch.as_tensor(np.asarray(theirs))
            assert mine.shape == theirs.shape, f"text {number}: {tuple(mine.shape)} against {tuple(theirs.shape)}"
            assert (mine - theirs).abs().max() <= MAX_ABS, f"text {number}"


@pytest.fixture(scope="module")
def reference(folder) -> dict:
    return flag_formulas(folder, TEXTS_M3, LONGEST)


@torch.no_grad()
def test_the_texts_exercise_what_the_formulas_handle(folder, reference):
    """Guards the fixture: padded batches, many ids per text, special tokens with weights > 0 (to drop), repeated
    ids merged, an empty dict, dropped zeros, a text beyond 512 tokens."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(TEXTS_M3, padding=True, return_tensors="pt")
    hidden = transformers.XLMRobertaModel.from_pretrained(folder).eval()(**batch).last_hidden_state
    sparse_linear = torch.nn.Linear(HIDDEN, 1)
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt", weights_only=True))
    scores = sparse_linear(hidden).squeeze(-1)
    positive = (scores > 0) & batch["attention_mask"].bool()
    for special in ("<s>", "</s>", "<unk>"):
        assert positive[batch["input_ids"] == tokenizer.convert_tokens_to_ids(special)].any(), special
    # No token within rounding of relu's threshold: which side a score of about 0 falls is fp32's last bit.
    assert scores[batch["attention_mask"].bool() & (batch["input_ids"] > 3)].abs().min() > THRESHOLD_MARGIN
    lengths = [len(tokenizer(text)["input_ids"]) for text in TEXTS_M3]
    assert len(set(lengths[:4])) > 1 and min(lengths[:6]) >= 10
    assert lengths[TEXTS_M3.index(LONG_TEXT)] > 512
    lexical = reference["lexical_weights"]
    assert lexical[TEXTS_M3.index("")] == {}
    repeated = TEXTS_M3.index("the the the capital capital of France France")
    ids = tokenizer(TEXTS_M3[repeated])["input_ids"]
    assert len(ids) - 2 > len(set(ids) - {0, 2}) >= len(lexical[repeated]) > 0
    assert sum(len(weights) for weights in lexical) < sum(len(set(ids)) for ids in tokenizer(TEXTS_M3)["input_ids"])


@pytest.mark.parametrize("batch_size", [4, 1])
def test_embed_m3_equals_flagembedding_formulas(folder, reference, batch_size):
    """The folder's max_seq_length (1,024) applies: the long text gets a ColBERT vector for every token but <s>."""
    embedder = Embedder(folder, batch_size=batch_size)
    assert embedder.max_length == LONGEST
    ours = embedder.embed_m3(TEXTS_M3)
    assert_equal(ours, reference)
    for number, (mine, theirs) in enumerate(zip(ours["lexical_weights"], reference["lexical_weights"], strict=True)):
        assert set(mine) == set(theirs), f"text {number}: different token ids"
    tokens = len(transformers.AutoTokenizer.from_pretrained(folder)(LONG_TEXT)["input_ids"])
    assert len(ours["colbert_vecs"][TEXTS_M3.index(LONG_TEXT)]) == tokens - 1 > 512
    assert torch.equal(ours["dense_vecs"], embedder.embed(TEXTS_M3))


def test_int8_runs_the_encoder_in_int8_and_stays_near_flagembedding(folder, reference, monkeypatch):
    """`Embedder(quantize="int8")` (opt-in, lossy) on bge-m3: the encoder's products in int8 (the size threshold
    lowered to these small layers', where bge-m3's sit), sparse_linear and colbert_linear in fp32 on its output. Each
    output moves off fp32's and stays near FlagEmbedding's. Measured on this folder: dense max abs 2.7e-3, ColBERT
    3.1e-3, lexical weights' RMS difference over the shared token ids 0.0044 of their RMS; bounds 0.02, 0.02, 0.03."""
    swap_as_at_bert_base(monkeypatch, HIDDEN)
    embedder = Embedder(folder, quantize="int8")
    kernels = hfbert.inference.packed_layers(embedder.model)
    assert sum(kind == "int8" for kind in kernels.values()) >= 3 * embedder.model.config.num_hidden_layers, kernels
    ours = embedder.embed_m3(TEXTS_M3)
    dense = torch.as_tensor(np.asarray(reference["dense_vecs"]))
    assert 0 < (ours["dense_vecs"] - dense).abs().max() <= 0.02
    colbert = torch.cat([torch.as_tensor(np.asarray(vectors)) for vectors in reference["colbert_vecs"]])
    assert 0 < (torch.cat(ours["colbert_vecs"]) - colbert).abs().max() <= 0.02
    shared = [
        (mine[key], float(theirs[key]))
        for mine, theirs in zip(ours["lexical_weights"], reference["lexical_weights"], strict=True)
        for key in set(mine) & set(theirs)
    ]
    mine, theirs = torch.tensor(shared, dtype=torch.float64).T
    assert len(shared) > 20 and 0 < (mine - theirs).square().mean().sqrt() <= 0.03 * theirs.square().mean().sqrt()


def test_one_text_gives_its_outputs_alone_as_flagembedding(folder, tmp_path):
    """FlagEmbedding's `encode` of a str returns that text's outputs, not lists of them: a (dimension,) dense vector,
    one lexical dict, one (tokens - 1, dimension) ColBERT tensor. `m3_file` refuses a str, naming `texts`."""
    text = TEXTS_M3[1]
    reference = flag_formulas(folder, [text], LONGEST)
    embedder = Embedder(folder)
    ours = embedder.embed_m3(text)
    assert ours["dense_vecs"].shape == (HIDDEN,) and isinstance(ours["lexical_weights"], dict)
    assert ours["colbert_vecs"].shape == reference["colbert_vecs"][0].shape
    batched = {key: [value] for key, value in ours.items()}
    assert_equal({**batched, "dense_vecs": ours["dense_vecs"][None]}, reference)
    assert set(ours["lexical_weights"]) == set(reference["lexical_weights"][0])
    only_sparse = embedder.embed_m3(text, "sparse")
    assert only_sparse["dense_vecs"] is None and only_sparse["lexical_weights"] == ours["lexical_weights"]
    with pytest.raises(TypeError, match="texts is a str"):
        m3_file(embedder, text, tmp_path / "m3.jsonl", progress=False)


def test_max_length_512_is_flagembeddings_default(folder):
    ours = Embedder(folder, max_length=512).embed_m3(TEXTS_M3)
    assert_equal(ours, flag_formulas(folder, TEXTS_M3, 512))
    assert len(ours["colbert_vecs"][TEXTS_M3.index(LONG_TEXT)]) == 511


@pytest.mark.parametrize("outputs", ["sparse", "colbert,dense", ["dense"]])
def test_some_outputs(folder, reference, outputs):
    names = outputs.split(",") if isinstance(outputs, str) else outputs
    ours = Embedder(folder).embed_m3(TEXTS_M3, outputs)
    keys = {"dense": "dense_vecs", "sparse": "lexical_weights", "colbert": "colbert_vecs"}
    assert {key for key, value in ours.items() if value is not None} == {keys[name] for name in names}
    assert_equal(ours, reference, names)


def test_equals_flagembedding(folder, reference):
    reason = "FlagEmbedding is not installed (it brings datasets, pandas and pyarrow); its formulas are tested above"
    flag_embedding = pytest.importorskip("FlagEmbedding", reason=reason)
    model = flag_embedding.BGEM3FlagModel(str(folder), use_fp16=False, devices="cpu")
    theirs = model.encode(
        TEXTS_M3, batch_size=4, max_length=LONGEST, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    assert_equal(reference, theirs)  # the formulas above are FlagEmbedding's
    assert_equal(Embedder(folder).embed_m3(TEXTS_M3), theirs)


def test_cli_writes_the_requested_outputs_in_input_order(folder, reference, tmp_path, capsys):
    texts = [text for text in TEXTS_M3 if text]  # a text file has no empty line to give
    (tmp_path / "texts.txt").write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    out = tmp_path / "m3.jsonl"
    arguments = ["embed", str(folder), "--file", str(tmp_path / "texts.txt"), "--batch-size", "4", "--chunk-size", "5"]
    assert main([*arguments, "--output", "dense,sparse,colbert", "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(texts)))
    assert all(list(line) == ["index", "dense", "sparse", "colbert"] for line in lines)
    expected = [TEXTS_M3.index(text) for text in texts]
    ours = {
        "dense_vecs": torch.tensor([line["dense"] for line in lines]),
        "lexical_weights": [line["sparse"] for line in lines],
        "colbert_vecs": [torch.tensor(line["colbert"]) for line in lines],
    }
    subset = {
        "dense_vecs": reference["dense_vecs"][expected],
        "lexical_weights": [reference["lexical_weights"][i] for i in expected],
        "colbert_vecs": [reference["colbert_vecs"][i] for i in expected],
    }
    assert_equal(ours, subset)
    assert "sparse_linear.pt" in capsys.readouterr().err

    assert main([*arguments, "--output", "sparse", "--out", str(tmp_path / "sparse.jsonl")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "sparse.jsonl").read_text().splitlines()]
    assert all(list(line) == ["index", "sparse"] for line in lines)

    assert main([*arguments, "--output", "dense", "--out", str(tmp_path / "dense.npy")]) == 0
    dense = torch.from_numpy(np.load(tmp_path / "dense.npy"))
    assert (dense - reference["dense_vecs"][expected]).abs().max() <= MAX_ABS


def test_cli_refuses_what_does_not_fit(folder, tmp_path, capsys):
    base = ["embed", str(folder), "A text."]
    assert main([*base, "--output", "sparse", "--out", str(tmp_path / "x.npy")]) == 1
    assert ".jsonl" in capsys.readouterr().err and not (tmp_path / "x.npy").exists()
    for arguments in (["--output", "dense,lexical"], ["--output", ""], ["--output", "dense", "--sparse"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*base, *arguments])
        assert exit_info.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def save_linear(path: Path, out_features: int, in_features: int, **extra) -> None:
    torch.save({**torch.nn.Linear(in_features, out_features).state_dict(), **extra}, path)


BAD_FILES = {
    "extra tensor": ("sparse_linear.pt", lambda path: save_linear(path, 1, HIDDEN, extra=torch.zeros(3)), "'extra'"),
    "wrong shape": ("colbert_linear.pt", lambda path: save_linear(path, 16, HIDDEN), "(16, 32)"),
    "no bias": ("sparse_linear.pt", lambda path: torch.save({"weight": torch.zeros(1, HIDDEN)}, path), "'bias'"),
    "a pickled module": (
        "colbert_linear.pt",
        lambda path: torch.save(torch.nn.Linear(HIDDEN, HIDDEN), path),
        "unpickle",
    ),
    "missing": ("colbert_linear.pt", lambda path: path.unlink(), "missing"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_linear_file_is_one_error_naming_it(folder, case, tmp_path, capsys):
    name, damage, said = BAD_FILES[case]
    bad = shutil.copytree(folder, tmp_path / "bad")
    damage(bad / name)
    embedder = Embedder(bad)
    with pytest.raises(CheckpointError, match=said) as error:
        embedder.embed_m3(["A text."])
    assert str(bad / name) in str(error.value)
    assert embedder.embed_m3(["A text."], "dense")["dense_vecs"].shape == (1, HIDDEN)  # dense needs neither file
    assert main(["embed", str(bad), "A text.", "--output", "colbert,sparse", "--out", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad / name) in err[0]
    assert not (tmp_path / "o.jsonl").exists()
    with pytest.raises(CheckpointError, match=said):
        convert(bad, tmp_path / "converted")
    assert not (tmp_path / "converted").exists()


def test_convert_writes_the_layers_as_safetensors_read_in_place_of_the_pickles(folder, reference, tmp_path):
    converted = tmp_path / "converted"
    written = convert(folder, converted)
    assert {"sparse_linear.safetensors", "colbert_linear.safetensors"} <= set(written)
    assert not list(converted.glob("*.pt"))
    assert_equal(Embedder(converted).embed_m3(TEXTS_M3), reference)
    # Both beside each other: the safetensors files are read (the pickles here would fail).
    torch.save({"weight": torch.zeros(2, 2)}, converted / "sparse_linear.pt")
    torch.save({"weight": torch.zeros(2, 2)}, converted / "colbert_linear.pt")
    embedder = Embedder(converted)
    assert_equal(embedder.embed_m3(TEXTS_M3), reference)
    assert [path.name for path in embedder.m3_heads.files] == [
        "sparse_linear.safetensors",
        "colbert_linear.safetensors",
    ]
