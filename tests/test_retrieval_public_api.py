"""The retrieval encoders' public calls for callers that hold one batch (issue #65 item 5: the server's engine and
`hfbert.ray_data`): `Embedder.encode(..., output_value="token_embeddings")`, `Embedder.encode_ids`,
`Embedder.embed_m3_ids` and `SparseEncoder.encode_ids`, the model's input given as token ids, and
`SparseEncoder.nonzero`, sparse vectors as arrays.

The references are sentence-transformers itself on the same folders (written by its own classes) and, for bge-m3,
FlagEmbedding's formulas on transformers' model (`test_bge_m3.flag_formulas`); token ids are what the references'
own tokenizers give for the texts, so that ids and texts must compute the same numbers. Every comparison is
element-wise, the max absolute difference over all elements.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from test_bge_m3 import LONGEST, TEXTS_M3, assert_equal, bge_m3_folder, flag_formulas
from test_retrieval_encoder import MAX_ABS, TEXTS, max_abs, prompted_folder

import hfbert
from hfbert.tools.embedding import Embedder

from support.retrieval import DOCUMENTS, splade_folder

sentence_transformers = pytest.importorskip("sentence_transformers")
PROMPTS = {"query": "query: ", "document": "document: "}


@pytest.fixture(scope="module")
def folder(sentence_backbone, tmp_path_factory):
    """A SentenceTransformer whose pooling leaves its prompt out (`include_prompt` false), max_seq_length 24."""
    return prompted_folder(sentence_backbone, tmp_path_factory.mktemp("prompted") / "model", PROMPTS, None)


@pytest.fixture(scope="module")
def theirs(folder):
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def ours(folder):
    return Embedder(folder, batch_size=5)


def assert_rows_equal(mine: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(mine) == len(expected)
    for number, (row, theirs) in enumerate(zip(mine, expected, strict=True)):
        assert row.shape == theirs.shape and row.dtype == theirs.dtype == torch.float32, number
        assert float((row - theirs).abs().max()) <= MAX_ABS, number


def prompt_length(model, prompt: str) -> int:
    """The prompt's leading tokens, as sentence-transformers measures them for `include_prompt` false."""
    return len(model.tokenize([prompt])["input_ids"][0]) - 1


@pytest.mark.parametrize("prompt", [None, "", "search: "], ids=["default", "none", "search"])
def test_token_embeddings_equal_sentence_transformers(ours, theirs, prompt):
    expected = theirs.encode(TEXTS, prompt=prompt, batch_size=5, output_value="token_embeddings")
    mine = ours.encode(TEXTS, prompt=prompt, output_value="token_embeddings", convert_to_tensor=True)
    assert isinstance(mine, list)  # a list whatever convert_to_tensor says, as sentence-transformers gives it
    assert_rows_equal(mine, expected)
    one = ours.encode(TEXTS[3], prompt=prompt, output_value="token_embeddings")
    assert_rows_equal([one], [expected[3]])


@pytest.mark.parametrize("prompt", ["", "query: "], ids=["no-prompt", "prompt-left-out"])
def test_encode_ids_equals_sentence_transformers_on_the_texts(ours, theirs, prompt):
    """The ids the reference's tokenizer gives for prompt + text (truncated at the folder's length) compute what the
    texts compute, the prompt's tokens left out of the pooling by `prompt_length`."""
    ids = theirs.tokenizer([prompt + text for text in TEXTS], truncation=True, max_length=theirs.max_seq_length)
    ids = ids["input_ids"]
    length = prompt_length(theirs, prompt) if prompt else 0
    assert ours.prompt_tokens(prompt) == length
    expected = theirs.encode(TEXTS, prompt=prompt, batch_size=5)
    assert max_abs(ours.encode_ids(ids, prompt_length=length), expected) <= MAX_ABS
    tensor = ours.encode_ids(ids, prompt_length=length, batch_size=len(ids), convert_to_tensor=True)
    assert max_abs(tensor.numpy(), expected) <= MAX_ABS
    if prompt:  # leaving the prompt out changes the vectors: the test can tell
        assert np.abs(ours.encode_ids(ids) - expected).max() > 1e-3
    tokens = theirs.encode(TEXTS, prompt=prompt, output_value="token_embeddings")
    assert_rows_equal(ours.encode_ids(ids, output_value="token_embeddings"), tokens)
    assert ours.prompt_tokens() == 0  # the folder has no default prompt
    # The pooling's prompt is the embedder's again after the call.
    assert max_abs(ours.encode(TEXTS), theirs.encode(TEXTS)) <= MAX_ABS


def test_bad_ids_are_one_error_naming_the_sequence(ours):
    vocabulary = ours.model.config.vocab_size
    with pytest.raises(ValueError, match="token ids 1: an empty sequence"):
        ours.encode_ids([[2, 5, 3], []])
    with pytest.raises(ValueError, match=rf"token ids 0: {vocabulary} is not a token id \(the vocabulary has"):
        ours.encode_ids([[2, vocabulary, 3]])
    with pytest.raises(ValueError, match="token ids 0: 25 ids, over the model's max_length 24"):
        ours.encode_ids([[5] * 25])
    with pytest.raises(ValueError, match="prompt_length must be a non-negative integer, got -1"):
        ours.encode_ids([[2, 5, 3]], prompt_length=-1)
    with pytest.raises(ValueError, match="output_value must be 'sentence_embedding' or 'token_embeddings'"):
        ours.encode(TEXTS, output_value="tokens")


def test_sparse_encode_ids_equals_sentence_transformers(tmp_path):
    directory = splade_folder(tmp_path / "splade")
    theirs = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    ours = hfbert.SparseEncoder(directory)
    ids = theirs.tokenizer(DOCUMENTS, truncation=True, max_length=theirs.max_seq_length)["input_ids"]
    for active in (None, 5):
        expected = theirs.encode(DOCUMENTS, batch_size=4, max_active_dims=active).to_dense()
        got = ours.encode_ids(ids, batch_size=4, max_active_dims=active)
        assert got.is_sparse
        got = got.to_dense()
        assert torch.equal(got != 0, expected != 0), active
        assert float((got.double() - expected.double()).abs().max()) <= MAX_ABS, active
    rows = ours.encode_ids(ids, convert_to_tensor=False, convert_to_sparse_tensor=False)
    assert isinstance(rows, list) and torch.equal(torch.stack(rows), ours.encode_ids(ids).to_dense())
    with pytest.raises(ValueError, match="token ids 0: an empty sequence"):
        ours.encode_ids([[]])


def test_sparse_nonzero_arrays_equal_sentence_transformers(tmp_path):
    """`SparseEncoder.nonzero`: each vector's token ids (ascending) and weights as arrays, from any of `encode`'s
    output forms, equal to the nonzero entries of sentence-transformers' vectors."""
    directory = splade_folder(tmp_path / "splade")
    theirs = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    ours = hfbert.SparseEncoder(directory)
    expected = theirs.encode(DOCUMENTS, batch_size=4, max_active_dims=7).to_dense()
    forms = {
        "sparse": ours.encode(DOCUMENTS, max_active_dims=7),
        "dense": ours.encode(DOCUMENTS, max_active_dims=7, convert_to_sparse_tensor=False),
        "list": ours.encode(DOCUMENTS, max_active_dims=7, convert_to_tensor=False),
    }
    for form, vectors in forms.items():
        arrays = ours.nonzero(vectors)
        assert len(arrays) == len(DOCUMENTS), form
        for number, ((ids, weights), row) in enumerate(zip(arrays, expected, strict=True)):
            assert ids.dtype == np.int64 and weights.dtype == np.float32, form
            assert np.array_equal(ids, row.nonzero().flatten().numpy()), (form, number)
            assert np.abs(weights - row[ids].numpy()).max() <= MAX_ABS, (form, number)
    (ids, weights), *_ = ours.nonzero(ours.encode(DOCUMENTS[0], max_active_dims=7))  # one vector
    assert np.array_equal(ids, expected[0].nonzero().flatten().numpy())


def test_embed_m3_ids_equals_flagembedding_formulas(tmp_path):
    directory = bge_m3_folder(tmp_path / "bge-m3")
    texts = [text for text in TEXTS_M3 if len(text) < 400]
    ids = transformers.AutoTokenizer.from_pretrained(directory)(texts, truncation=True, max_length=LONGEST)
    ours = Embedder(directory)
    reference = flag_formulas(directory, texts, LONGEST)
    assert_equal(ours.embed_m3_ids(ids["input_ids"], batch_size=4), reference)
    dense = ours.embed_m3_ids(ids["input_ids"], "dense")
    assert dense["lexical_weights"] is None and dense["colbert_vecs"] is None
    assert_equal(dense, reference, ("dense",))
