"""`hfbert embed` on XLM-RoBERTa and RoBERTa sentence-transformers folders (issue #41), element-wise against
`SentenceTransformer.encode` loading the same folder: multilingual-e5's "query: " / "passage: " prompts, bge-m3's
CLS pooling + Normalize, paraphrase-multilingual's mean pooling. Folders are written by sentence-transformers itself
(`models.Transformer` on a saved random transformers model, `SentenceTransformer(modules=...).save`), and a
max_seq_length of 24 makes truncation run. Every member's backbone under mean pooling and Normalize:
test_family_conformance.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hfbert.cli import main
from hfbert.tools.embedding import Embedder

from support.family import TEXTS, family_checkpoint

st = pytest.importorskip("sentence_transformers")
models = pytest.importorskip("sentence_transformers.models")

LONG = " ".join(TEXTS)  # past max_seq_length: truncated
PIPELINES = {  # name -> (member, pooling, normalize, prompts)
    "multilingual-e5": ("xlm-roberta", "mean", True, {"query": "query: ", "passage": "passage: "}),
    "bge-m3": ("xlm-roberta", "cls", True, None),
    "paraphrase-multilingual": ("xlm-roberta", "mean", False, None),
}


def sentence_folder(tmp_path, name: str):
    member, pooling, normalize, prompts = PIPELINES[name]
    backbone = family_checkpoint(tmp_path / f"{name}-backbone", member, "Model", model_max_length=512)
    modules = [models.Transformer(str(backbone)), models.Pooling(32, pooling_mode=pooling)]
    if normalize:
        modules.append(models.Normalize())
    model = st.SentenceTransformer(modules=modules, device="cpu", prompts=prompts)
    model.max_seq_length = 24
    model.save(str(tmp_path / name))
    return tmp_path / name


@pytest.mark.parametrize("name", PIPELINES)
def test_each_pipeline_equals_encode(name, tmp_path):
    directory = sentence_folder(tmp_path, name)
    reference = st.SentenceTransformer(str(directory), device="cpu")
    texts = [*TEXTS, LONG, "x"]
    prompt_names = [None, *(PIPELINES[name][3] or {})]
    for prompt_name in prompt_names:
        expected = reference.encode(texts, prompt_name=prompt_name, convert_to_numpy=True, batch_size=3)
        ours = Embedder(directory, prompt_name=prompt_name, batch_size=3).embed(texts).numpy()
        assert ours.shape == expected.shape
        assert np.abs(ours - expected).max() <= 1e-5, (prompt_name, np.abs(ours - expected).max())


def test_the_command_line_with_a_prompt(tmp_path, capsys):
    directory = sentence_folder(tmp_path, "multilingual-e5")
    expected = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS, prompt_name="passage")
    out = tmp_path / "out.jsonl"
    assert main(["embed", str(directory), *TEXTS, "--prompt-name", "passage", "--out", str(out)]) == 0
    ours = np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()], np.float32)
    assert np.abs(ours - expected).max() <= 1e-5


def test_max_length_past_the_familys_longest_input_is_refused(tmp_path):
    directory = sentence_folder(tmp_path, "bge-m3")
    with pytest.raises(ValueError, match=r"max_length must be in \[1, 38\]"):
        Embedder(directory, max_length=40)
