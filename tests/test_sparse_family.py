"""`hfbert.SparseEncoder` and `hfbert embed --sparse` on every member of the family (issue #64): each member's masked
LM gives its hidden states -> vocabulary logits module as `prediction_head` (ModernBERT's is `head` then `decoder`,
two modules at the model's top level), and SPLADE pooling runs it.

The reference is sentence-transformers' SparseEncoder (max pooling of log1p(relu(logits)) over the real tokens) on
checkpoints written by transformers' own `...ForMaskedLM` (`support.members.tokenized_checkpoint`): a plain masked-LM
folder (SparseEncoder's default modules) and a SPLADE folder saved by SparseEncoder (MLMTransformer +
SpladePooling). Weights element-wise within 1e-5, the same nonzero set; texts of mixed lengths in padded batches,
an empty one and a truncated one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hfbert
from hfbert.modeling.family import member

from support.members import MODEL_TYPES, reference_class, tokenized_checkpoint
from support.retrieval import DOCUMENTS

transformers = pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
MAX_ABS = 1e-5


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory, request):
    """model_type -> transformers' masked LM of the member with its tokenizer, written on first use; the decoder's
    bias lowered so that half the vocabulary is absent from a text's vector, as in a trained SPLADE model."""
    folders: dict[str, Path] = {}

    def folder(model_type: str) -> Path:
        if model_type not in folders:
            directory = tokenized_checkpoint(tmp_path_factory.mktemp(model_type), model_type, "masked-lm", request)
            model = reference_class(model_type, "masked-lm").from_pretrained(directory).eval()
            encoded = transformers.AutoTokenizer.from_pretrained(directory)(
                DOCUMENTS[1], truncation=True, return_tensors="pt"
            )
            with torch.no_grad():
                # Zero in the widest gap between the vocabulary's largest logits near their median, not on one: an
                # entry whose logit is 0 would be in or out of the vector by the last bit of fp32 rounding (relu).
                largest = model(input_ids=encoded["input_ids"]).logits[0].amax(dim=0).sort().values
                near = largest[len(largest) // 2 - 10 : len(largest) // 2 + 11]
                widest = int((near[1:] - near[:-1]).argmax())
                model.get_output_embeddings().bias.sub_((near[widest] + near[widest + 1]) / 2)
            model.save_pretrained(directory)
            folders[model_type] = directory
        return folders[model_type]

    return folder


def splade_folder(source: Path, directory: Path) -> Path:
    """`source` saved by sentence-transformers' SparseEncoder as MLMTransformer + SpladePooling("max")."""
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    modules = [MLMTransformer(str(source)), SpladePooling("max")]
    sentence_transformers.SparseEncoder(modules=modules, device="cpu").save_pretrained(str(directory))
    return directory


def assert_same_vectors(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Same layout, shape and dtype, the same nonzero set, weights within MAX_ABS."""
    assert (ours.layout, ours.shape, ours.dtype) == (theirs.layout, theirs.shape, theirs.dtype)
    ours, theirs = ours.to_dense(), theirs.to_dense()
    assert torch.equal(ours != 0, theirs != 0), f"{int(((ours != 0) != (theirs != 0)).sum())} entries differ in zeros"
    assert float((ours.double() - theirs.double()).abs().max()) <= MAX_ABS


def compare_with_sentence_transformers(directory: Path, model_type: str) -> None:
    expected = sentence_transformers.SparseEncoder(str(directory), device="cpu").encode(DOCUMENTS, batch_size=4)
    ours = hfbert.SparseEncoder(directory)
    assert isinstance(ours.model, member(model_type).classes["masked-lm"])
    vectors = ours.encode(DOCUMENTS, batch_size=4)
    present = float((expected.to_dense() != 0).float().mean())
    assert 0.05 < present < 0.95, present  # zeros and weights both: the nonzero set says something
    assert_same_vectors(vectors, expected)
    assert_same_vectors(ours.encode(DOCUMENTS[1]), expected[1])  # one text: one vector


# BERT's and MPNet's 30,522-piece vocabularies make theirs the slow rows; tests/test_sparse.py runs both by default.
SLOW = {"bert", "mpnet"}


@pytest.mark.parametrize(
    "model_type", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in MODEL_TYPES]
)
def test_sparse_encoder_equals_sentence_transformers(model_type, masked_lm):
    """A plain masked-LM folder: SparseEncoder's default modules (MLMTransformer, SpladePooling max of relu)."""
    compare_with_sentence_transformers(masked_lm(model_type), model_type)


def test_sparse_encoder_on_a_modernbert_splade_folder(masked_lm, tmp_path):
    """ModernBERT's masked LM saved by sentence-transformers' SparseEncoder (the other members' SPLADE folders:
    tests/test_sparse.py)."""
    compare_with_sentence_transformers(splade_folder(masked_lm("modernbert"), tmp_path / "splade"), "modernbert")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_prediction_head_gives_transformers_logits(model_type, masked_lm):
    """`prediction_head` of every member's masked LM: the last hidden states -> transformers' logits, and its
    `decoder` the output embeddings."""
    directory = masked_lm(model_type)
    theirs = reference_class(model_type, "masked-lm").from_pretrained(directory).eval()
    ours = hfbert.AutoModelForMaskedLM.from_pretrained(directory).eval()
    input_ids = torch.tensor([[1, 5, 7, 9, 11, 2]]) if model_type == "modernbert" else torch.tensor([[0, 5, 7, 9, 2]])
    with torch.no_grad():
        hidden = ours.backbone(input_ids=input_ids).last_hidden_state
        expected = theirs(input_ids=input_ids).logits
        logits = ours.prediction_head(hidden)
    torch.testing.assert_close(logits, expected, atol=MAX_ABS, rtol=MAX_ABS)
    assert ours.prediction_head.decoder is ours.get_output_embeddings()


def test_embed_sparse_on_modernbert(masked_lm, tmp_path, capsys):
    """`hfbert embed --sparse` on a ModernBERT masked LM: each text's {token: weight}, as sentence-transformers'."""
    from hfbert.cli import main

    directory = masked_lm("modernbert")
    reference = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    expected = reference.encode(DOCUMENTS).to_dense()
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(text + "\n" for text in DOCUMENTS if text), encoding="utf-8")
    out = tmp_path / "weights.jsonl"
    assert main(["embed", str(directory), "--sparse", "--file", str(texts), "--out", str(out)]) == 0, (
        capsys.readouterr()
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [vector for text, vector in zip(DOCUMENTS, expected, strict=True) if text]
    assert len(records) == len(rows)
    for record, vector in zip(records, rows, strict=True):
        ids = vector.nonzero().flatten().tolist()
        weights = dict(zip(reference.tokenizer.convert_ids_to_tokens(ids), vector[ids].tolist(), strict=True))
        assert set(record["embedding"]) == set(weights)
        assert all(abs(record["embedding"][token] - weight) <= MAX_ABS for token, weight in weights.items())
