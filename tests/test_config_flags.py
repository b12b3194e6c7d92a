"""Flags in config.json and in calls read by truthiness, as transformers reads them: the legacy
`gradient_checkpointing`, `output_hidden_states` / `output_attentions` written as integers, and `return_dict` false in
the config or the call (the task models take any falsy value), on the API and on the commands that run a model.
"""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import SMALL_CONFIG, write_random_transformers_checkpoint
from support.robust import edit_config, run, write_tiny_mlm

ONE_LAYER = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=37, vocab_size=50)


@pytest.mark.parametrize("value", [True, 1, "yes", 0, False, None])
def test_legacy_gradient_checkpointing_flag_read_as_transformers_reads_it(value):
    import transformers

    ours = hfbert.BertModel(hfbert.BertConfig.from_dict({**ONE_LAYER, "gradient_checkpointing": value}))
    theirs = transformers.BertModel(transformers.BertConfig(**ONE_LAYER, gradient_checkpointing=value))
    assert ours.is_gradient_checkpointing == theirs.is_gradient_checkpointing


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
@pytest.mark.parametrize("value", [1, 0, None])
def test_output_flags_written_as_integers_read_as_transformers_reads_them(tmp_path, flag, value):
    """transformers takes `"output_hidden_states": 1` (or 0, or null) in config.json and reads it by truthiness
    (5.x's own output collection then gives a tuple with holes for 1, so the reference is transformers with the flag
    passed as the bool it means)."""
    import transformers

    directory = edit_config(write_random_transformers_checkpoint(tmp_path / "m", **SMALL_CONFIG), **{flag: value})
    ours = hfbert.BertModel.from_pretrained(directory, attn_implementation="eager")
    theirs = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
    ids = torch.tensor([[2, 12, 13, 5, 3]])
    with torch.no_grad():
        expected = getattr(theirs(input_ids=ids, **{flag: bool(value)}), flag[7:])
        got = getattr(ours(input_ids=ids), flag[7:])
    assert (got is None) == (expected is None) == (not value)
    for mine, reference in zip(got or (), expected or (), strict=True):
        assert torch.allclose(mine, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("class_name", ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"])
@pytest.mark.parametrize("in_config", [None, False, 0])
@pytest.mark.parametrize("in_call", [None, False, 0, True])
def test_return_dict_of_the_config_and_the_call_as_transformers_reads_them(class_name, in_config, in_call):
    """transformers' BertModel returns a tuple when `return_dict` (the call's, else config.json's) is False; its task
    models when it is falsy. hfbert ignored config.json's `return_dict: false` and read the call's as `is False`."""
    import transformers

    values = ONE_LAYER if in_config is None else {**ONE_LAYER, "return_dict": in_config}
    ours = getattr(hfbert, class_name)(hfbert.BertConfig.from_dict(values)).eval()
    theirs = getattr(transformers, class_name)(transformers.BertConfig(**values)).eval()
    call = {} if in_call is None else {"return_dict": in_call}
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert isinstance(ours(ids, **call), tuple) == isinstance(theirs(ids, **call), tuple)


def test_embed_and_fill_mask_run_a_checkpoint_whose_config_says_return_dict_false(tmp_path, capsys):
    directory = edit_config(write_tiny_mlm(tmp_path / "mlm"), return_dict=False)
    code, stderr = run(capsys, "fill-mask", directory, "Paris is the [MASK] of France.")
    assert code == 0, stderr
    code, stderr = run(capsys, "embed", directory, "hello world")
    assert code == 0, stderr
