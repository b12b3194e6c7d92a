"""fill-mask's refusal, convert, inspect and sentence-transformers-as-backbone on RoBERTa-family checkpoints (issue
#41), each against transformers or sentence-transformers loading the same folder, element-wise (what every member's
fill-mask, convert and inspect do: test_family_conformance.py)."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

import hfbert
from converters.errors import CheckpointError
from hfbert.cli import main
from hfbert.tools.convert import convert
from hfbert.tools.inspect import summary

from support.family import TEXTS, family_checkpoint

transformers = pytest.importorskip("transformers")


def test_fill_mask_without_the_head_names_lm_head(tmp_path, capsys):
    directory = family_checkpoint(tmp_path / "roberta", "roberta", "Model")
    assert main(["fill-mask", str(directory), "a <mask> b"]) != 0
    assert "no lm_head.* tensors" in capsys.readouterr().err


def test_convert_refuses_bert_keys_under_a_roberta_config(tmp_path):
    directory = family_checkpoint(tmp_path / "source", "roberta", "ForMaskedLM")
    tensors = {name.replace("roberta.", "bert."): t for name, t in load_file(directory / "model.safetensors").items()}
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match="named as a 'bert' checkpoint's, but .* says model_type 'roberta'"):
        convert(directory, tmp_path / "converted")
    assert not (tmp_path / "converted").exists()


def test_inspect_reads_the_roberta_layout(tmp_path, capsys):
    directory = family_checkpoint(tmp_path / "roberta", "roberta", "ForMaskedLM")
    facts = summary(directory)
    assert facts["config"]["model_type"] == "roberta" and facts["config"]["max_sequence_length"] == 38
    actions = {entry["name"]: entry["action"] for entry in facts["tensors"]}
    assert actions["roberta.embeddings.word_embeddings.weight"] == "renamed"
    assert {actions[name] for name in actions if name.startswith("lm_head.")} == {"ignored"}
    assert facts["tokenizer"]["problems"] == []
    assert main(["inspect", str(directory)]) == 0
    assert "roberta, 2 layers" in capsys.readouterr().out


def test_hfbert_as_a_sentence_transformers_backbone_equals_encode(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    models = pytest.importorskip("sentence_transformers.models")
    from hfbert.tools.sentence_transformers_backbone import use_hfbert_backbone

    backbone = family_checkpoint(tmp_path / "backbone", "xlm-roberta", "Model", model_max_length=512)
    modules = [models.Transformer(str(backbone)), models.Pooling(32, pooling_mode="mean"), models.Normalize()]
    built = st.SentenceTransformer(modules=modules, device="cpu")
    built.max_seq_length = 24
    built.save(str(tmp_path / "sentence"))
    reference = st.SentenceTransformer(str(tmp_path / "sentence"), device="cpu")
    expected = reference.encode(TEXTS, convert_to_numpy=True, batch_size=3)
    ours = use_hfbert_backbone(st.SentenceTransformer(str(tmp_path / "sentence"), device="cpu"))
    assert isinstance(ours[0].model, hfbert.XLMRobertaModel)
    assert np.abs(ours.encode(TEXTS, convert_to_numpy=True, batch_size=3) - expected).max() <= 1e-5
