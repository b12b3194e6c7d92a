"""The retrieval encoders' one base (`hfbert.tools.retrieval`): `Embedder.encode`, `encode_query` and
`encode_document` with a prompt per call, as sentence-transformers 6 has them, `SparseEncoder.encode_document`'s
choice of prompt, the load options as one value, and `hfbert.Embedder`.

The reference is sentence-transformers itself on the same folder (written by its own classes); every comparison is
element-wise, the max absolute difference over all elements.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import hfbert
from hfbert.tools.embedding import Embedder
from hfbert.tools.retrieval import LoadOptions

from support.retrieval import DOCUMENTS, splade_folder

sentence_transformers = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

# fp32 rounding: hfbert's packed kernels sum in another order than transformers'.
MAX_ABS = 1e-5
TEXTS = ["", "Yes.", *DOCUMENTS[:8], " ".join(DOCUMENTS[:4]), DOCUMENTS[0]]


def max_abs(ours: np.ndarray, theirs: np.ndarray) -> float:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == np.float32
    return float(np.abs(ours - theirs).max())


def prompted_folder(backbone, directory, prompts: dict[str, str], default: str | None):
    """A SentenceTransformer of `backbone` whose pooling leaves the prompt out (so that each prompt's length
    matters), saved by sentence-transformers 6, with exactly `prompts` in config_sentence_transformers.json (it
    saves an empty "query" and "document" prompt beside them; an older release did not)."""
    modules = [Transformer(str(backbone)), Pooling(32, pooling_mode="mean", include_prompt=False), Normalize()]
    model = sentence_transformers.SentenceTransformer(
        modules=modules, device="cpu", prompts=prompts, default_prompt_name=default
    )
    model.max_seq_length = 24
    model.save(str(directory))
    return with_prompts(directory, prompts)


def with_prompts(directory, prompts: dict[str, str], default: str | None = None):
    """`directory` with exactly `prompts` (and the default prompt `default`, when given) in its
    config_sentence_transformers.json."""
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    settings["prompts"] = prompts
    if default is not None:
        settings["default_prompt_name"] = default
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    return directory


@pytest.mark.parametrize(
    ("prompts", "default"),
    [
        ({"query": "query: ", "document": "document: "}, None),
        ({"query": "query: ", "passage": "passage text: ", "other": "other: "}, "other"),  # a default, no document
        ({"other": "other: "}, "other"),  # neither query nor document: no prompt, not the default
    ],
    ids=["query-document", "query-passage-default", "default-only"],
)
def test_encode_query_and_encode_document_equal_sentence_transformers(sentence_backbone, tmp_path, prompts, default):
    directory = prompted_folder(sentence_backbone, tmp_path / "model", prompts, default)
    theirs = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
    ours = Embedder(directory, batch_size=5)  # one embedder, a prompt per call
    for method in ("encode_query", "encode_document", "encode"):
        expected = getattr(theirs, method)(TEXTS, batch_size=5)
        assert max_abs(getattr(ours, method)(TEXTS), expected) <= MAX_ABS, method
    expected = theirs.encode(TEXTS, prompt="search: ")
    assert max_abs(ours.encode(TEXTS, prompt="search: ", batch_size=len(TEXTS)), expected) <= MAX_ABS
    expected = theirs.encode(TEXTS, prompt_name="other" if "other" in prompts else "query")
    assert max_abs(ours.encode(TEXTS, prompt_name="other" if "other" in prompts else "query"), expected) <= MAX_ABS
    # The prompts changed the vectors, and a call's prompt does not stay: the next call has the default again.
    assert np.abs(theirs.encode_document(TEXTS) - theirs.encode(TEXTS, prompt="search: ")).max() > 1e-3
    assert max_abs(ours.encode(TEXTS), theirs.encode(TEXTS)) <= MAX_ABS
    # One text gives one vector, as sentence-transformers; `embed` is `encode` as a tensor.
    assert max_abs(ours.encode_query(TEXTS[3]), theirs.encode_query(TEXTS[3])) <= MAX_ABS
    assert torch.equal(ours.embed(TEXTS), torch.from_numpy(ours.encode(TEXTS)))


def test_a_prompt_name_the_folder_lacks_is_refused(sentence_backbone, tmp_path):
    directory = prompted_folder(sentence_backbone, tmp_path / "model", {"query": "query: "}, None)
    ours = Embedder(directory)
    assert max_abs(ours.encode_document(TEXTS), ours.encode(TEXTS, prompt="")) == 0  # no document prompt: none
    with pytest.raises(ValueError, match=r"prompt name 'passage' is not in the checkpoint's prompts \('query'\)"):
        ours.encode(TEXTS, prompt_name="passage")
    with pytest.raises(ValueError, match="give a prompt or a prompt name, not both"):
        ours.encode(TEXTS, prompt="a: ", prompt_name="query")


def test_sparse_encode_document_never_takes_the_default_prompt(tmp_path):
    """A folder with a default prompt and no "document" prompt: sentence-transformers' `encode_document` runs with
    none (its "document" prompt is empty), `encode` with the default."""
    directory = with_prompts(splade_folder(tmp_path / "splade"), {"query": "query: "})
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    (directory / "config_sentence_transformers.json").write_text(
        json.dumps({**settings, "default_prompt_name": "query"})
    )
    theirs = sentence_transformers.SparseEncoder(str(directory), device="cpu")
    ours = hfbert.SparseEncoder(directory)
    for method in ("encode_document", "encode_query", "encode"):
        expected = getattr(theirs, method)(DOCUMENTS, batch_size=4).to_dense()
        got = getattr(ours, method)(DOCUMENTS, batch_size=4).to_dense()
        assert torch.equal(got != 0, expected != 0), method
        assert float((got.double() - expected.double()).abs().max()) <= MAX_ABS, method
    assert not torch.equal(theirs.encode_document(DOCUMENTS).to_dense(), theirs.encode(DOCUMENTS).to_dense())


def test_load_options_as_one_value(sentence_backbone, tmp_path):
    directory = prompted_folder(sentence_backbone, tmp_path / "model", {"query": "query: "}, None)
    theirs = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
    theirs.max_seq_length = 6
    ours = Embedder(directory, options=LoadOptions(max_length=6, dtype="float32"))
    assert ours.max_length == 6 and ours.options == LoadOptions(max_length=6, dtype="float32")
    assert max_abs(ours.encode(TEXTS), theirs.encode(TEXTS)) <= MAX_ABS
    keywords = Embedder(directory, options=LoadOptions(max_length=6), dtype="float32")  # keywords over the value
    assert keywords.options == ours.options
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_len'; the load options are device, dtype"):
        Embedder(directory, max_len=6)


def test_embedder_is_exported_without_loading_it():
    assert hfbert.Embedder is Embedder and "Embedder" in hfbert.__all__
    # `import hfbert` stays light: the retrieval tools load when first named.
    script = "import sys, hfbert; assert 'hfbert.tools.embedding' not in sys.modules; hfbert.Embedder"
    script += "; assert 'hfbert.tools.embedding' in sys.modules"
    subprocess.run([sys.executable, "-c", script], check=True)
