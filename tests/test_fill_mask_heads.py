"""The masked-LM head of every member, as its row states it, is what transformers finds missing in a save without it.

`hfbert fill-mask` on an encoder-only save refuses it by naming the head's tensors; the answer comes from the family
row (`Member.masked_lm_heads`, read by `auto.absent_heads`), never from a tool's own table of head names (the CLI's
knew BERT's and RoBERTa's, and a ModernBERT save ended in `StopIteration`).
"""

from __future__ import annotations

import pytest

from hfbert.modeling.auto import AutoModelForMaskedLM, absent_heads
from hfbert.modeling.family import member

from support.members import MODEL_TYPES, reference_checkpoint, reference_class

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_row_names_the_head_transformers_finds_missing_in_an_encoder_only_save(model_type, tmp_path):
    directory = reference_checkpoint(tmp_path, model_type, "model")
    _, theirs = reference_class(model_type, "masked-lm").from_pretrained(directory, output_loading_info=True)
    missing = set(theirs["missing_keys"])
    heads = member(model_type).masked_lm_heads
    assert missing and heads
    # Every prefix the row names is missing, and every missing tensor is under one of them.
    assert all(any(key.startswith(prefix) for key in missing) for prefix in heads), (heads, missing)
    assert all(any(key.startswith(prefix) for prefix in heads) for key in missing), (heads, missing)
    # hfbert's loader initialises exactly that head, and the family's function says it is absent.
    _, ours = AutoModelForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert absent_heads(member(model_type).classes["masked-lm"], ours["report"].new_head) == heads


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_save_with_the_head_has_none_absent(model_type, tmp_path):
    directory = reference_checkpoint(tmp_path, model_type, "masked-lm")
    _, ours = AutoModelForMaskedLM.from_pretrained(directory, output_loading_info=True)
    assert absent_heads(member(model_type).classes["masked-lm"], ours["report"].new_head) == ()
