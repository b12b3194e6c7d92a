"""Config and runtime behaviour where transformers' own tests and its users differ from hfbert (issue 49): configs
that round-trip as transformers' do, the generic `PretrainedConfig` fields, masks that are not right padding, and
torch.export against the eager model. Every check compares with transformers' own classes."""

from __future__ import annotations

import json

import pytest
import torch

import hfbert
from hfbert.modeling.family import member as family_member

from support.helpers import max_difference, randomize_weights
from support.members import MODEL_TYPES, tiny_config


def tiny(model_type: str = "bert") -> dict:
    """The family's tiny config of `model_type` (support.members), dropout off (each member's own dropout fields)."""
    probabilities = family_member(model_type).config_class.probabilities
    return tiny_config(model_type, **{name: 0.0 for name in probabilities if name != "classifier_dropout"})


# transformers' `PretrainedConfig` fields every member's config accepts, with values other than their defaults.
GENERIC_FIELDS = dict(return_dict=False, dtype="bfloat16", chunk_size_feed_forward=4, architectures=["BertForMaskedLM"])


def transformers_class(member: str, suffix: str):
    import transformers

    return getattr(transformers, family_member(member).reference + suffix)


# -- 1. a config whose hidden_size the default heads do not divide round-trips; the model build refuses it ----------
def indivisible(member: str) -> tuple[int, int]:
    """A hidden_size the member's default head count (12; ELECTRA's 4) does not divide, and that count."""
    heads = family_member(member).config_class().num_attention_heads
    return (32 if 32 % heads else 34), heads


@pytest.mark.parametrize("member", MODEL_TYPES)
def test_config_round_trips_where_transformers_does(member, tmp_path):
    """hidden_size=32 with the default 12 heads (34 with ELECTRA's 4): transformers saves and reads such a config
    back (only its model refuses it), so hfbert's does too."""
    ours_class = family_member(member).config_class
    size, count = indivisible(member)
    theirs = transformers_class(member, "Config")(hidden_size=size)
    theirs.save_pretrained(tmp_path / "theirs")
    assert transformers_class(member, "Config").from_pretrained(tmp_path / "theirs").hidden_size == size
    ours = ours_class(hidden_size=size)
    ours.save_pretrained(tmp_path / "ours")
    back = ours_class.from_pretrained(tmp_path / "ours")
    assert (back.hidden_size, back.num_attention_heads) == (size, count) and back == ours
    assert ours_class.from_pretrained(tmp_path / "theirs").hidden_size == size


@pytest.mark.parametrize("member", MODEL_TYPES)
def test_model_build_refuses_heads_that_do_not_divide_hidden_size(member, tmp_path):
    ours_class, model_class = family_member(member).config_class, family_member(member).classes["model"]
    size, count = indivisible(member)
    theirs = transformers_class(member, "Config")(hidden_size=size)
    if member == "electra":  # transformers skips its check for configs with an embedding_size; its forward fails
        transformers_class(member, "Model")(theirs)
    else:
        # transformers' DistilBERT says it in its own words, and hfbert names its fields as its config.json spells them.
        with pytest.raises(ValueError, match="multiple of the number of attention heads|must divide"):
            transformers_class(member, "Model")(theirs)
    ours_class(hidden_size=size).save_pretrained(tmp_path)
    config = ours_class.from_pretrained(tmp_path)
    hidden, heads = (ours_class.attribute_map.get(name, name) for name in ("hidden_size", "num_attention_heads"))
    with pytest.raises(hfbert.ConfigError, match=rf"'{hidden}' \({size}\).*{heads} \({count}\)") as error:
        model_class(config)
    assert str(tmp_path / "config.json") in str(error.value)  # the error names the file it came from


# -- 2. transformers' generic config fields ----------------------------------------------------------------------
@pytest.mark.parametrize("member", MODEL_TYPES)
@pytest.mark.parametrize("fields", [{}, GENERIC_FIELDS, {**GENERIC_FIELDS, "dtype": torch.float16}])
def test_generic_config_fields_equal_transformers(member, fields, tmp_path):
    """Accepted, read as attributes, in to_dict() and in the saved config.json as transformers has them."""
    import transformers

    config_class = family_member(member).config_class
    ours = config_class(**tiny(member), **fields)
    theirs = transformers_class(member, "Config")(**tiny(member), **fields)
    ours.save_pretrained(tmp_path / "ours")
    theirs.save_pretrained(tmp_path / "theirs")
    ours_json = json.loads((tmp_path / "ours" / "config.json").read_text())
    theirs_json = json.loads((tmp_path / "theirs" / "config.json").read_text())
    for name in ("return_dict", "dtype", "chunk_size_feed_forward", "architectures"):
        assert getattr(ours, name) == getattr(theirs, name), name
        assert ours.to_dict()[name] == theirs.to_dict()[name], name
        assert ours_json.get(name, "absent") == theirs_json.get(name, "absent"), name
        # each reads the other's file back to the same value
        assert getattr(config_class.from_pretrained(tmp_path / "theirs"), name) == getattr(theirs, name)
        assert getattr(transformers.AutoConfig.from_pretrained(tmp_path / "ours"), name) == getattr(ours, name)


def test_torch_dtype_is_the_older_name_of_dtype():
    import transformers

    for given in ("float16", torch.float16):
        ours, theirs = hfbert.BertConfig(torch_dtype=given), transformers.BertConfig(torch_dtype=given)
        assert ours.dtype == ours.torch_dtype == theirs.dtype == torch.float16
        assert ours.to_dict()["dtype"] == theirs.to_dict()["dtype"] == "float16"
    both = dict(dtype="bfloat16", torch_dtype="float16")  # both given: dtype wins, as in transformers
    assert hfbert.BertConfig(**both).dtype == transformers.BertConfig(**both).dtype == torch.bfloat16


def test_torch_dtype_of_an_older_file_is_read_as_dtype_and_kept_in_step(tmp_path):
    """A transformers 4.x config.json writes `torch_dtype`: hfbert reads it as `dtype` (transformers 5 does) and
    keeps the key, written in step with `dtype`."""
    import transformers

    (tmp_path / "config.json").write_text(json.dumps({**tiny(), "model_type": "bert", "torch_dtype": "float16"}))
    ours = hfbert.BertConfig.from_pretrained(tmp_path)
    assert ours.dtype == transformers.BertConfig.from_pretrained(tmp_path).dtype == torch.float16
    ours.dtype = torch.bfloat16
    saved = ours.to_dict()
    assert saved["dtype"] == saved["torch_dtype"] == "bfloat16"


def test_return_dict_false_in_the_config_returns_tuples_as_transformers(tmp_path):
    import transformers

    torch.manual_seed(0)
    theirs = randomize_weights(transformers.BertModel(transformers.BertConfig(**tiny(), return_dict=False))).eval()
    theirs.save_pretrained(tmp_path)
    ours = hfbert.BertModel.from_pretrained(tmp_path)
    assert ours.config.return_dict is False
    ids = torch.randint(1, 99, (2, 5))
    with torch.no_grad():
        ours_output, theirs_output = ours(input_ids=ids), theirs(input_ids=ids)
    assert type(ours_output) is type(theirs_output) is tuple
    assert max_difference(ours_output[0], theirs_output[0]) <= 1e-5
    assert not isinstance(ours(input_ids=ids, return_dict=True), tuple)
    built = hfbert.BertModel(hfbert.BertConfig(**tiny(), return_dict=False)).eval()  # the constructor takes it too
    assert type(built(input_ids=ids)) is tuple


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("chunk_size_feed_forward", -1, "non-negative integer"),
        ("chunk_size_feed_forward", 1.5, "non-negative integer"),
        ("dtype", "float99", "torch dtype"),
        ("dtype", 16, "torch dtype"),
        ("return_dict", "no", "true or false"),
    ],
)
def test_bad_generic_fields_name_the_field_and_file(field, value, message, tmp_path):
    with pytest.raises(hfbert.ConfigError, match=message) as error:
        hfbert.BertConfig(**{field: value})
    assert f"'{field}'" in str(error.value)
    (tmp_path / "config.json").write_text(json.dumps({**tiny(), "model_type": "bert", field: value}))
    with pytest.raises(hfbert.ConfigError, match=message) as error:
        hfbert.BertConfig.from_pretrained(tmp_path)
    assert f"'{field}'" in str(error.value) and str(tmp_path / "config.json") in str(error.value)


# -- 5. masks that are not right padding run padded, equal to transformers ----------------------------------------
NOT_RIGHT_PADDED = {
    "holes": [[1, 0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1, 0]],
    "left padding": [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]],
}


def tiny_pair(member: str, attention: str, tmp_path, seed: int = 0):
    """transformers' `<member>Model` with random weights and hfbert's loaded from it, both on `attention`
    (transformers' MPNet has the eager kernel only)."""
    torch.manual_seed(seed)
    theirs = randomize_weights(
        transformers_class(member, "Model")(transformers_class(member, "Config")(**tiny(member)))
    )
    theirs.save_pretrained(tmp_path)
    reference_attention = "eager" if member == "mpnet" else attention
    theirs = transformers_class(member, "Model").from_pretrained(tmp_path, attn_implementation=reference_attention)
    return hfbert.AutoModel.from_pretrained(tmp_path, attn_implementation=attention), theirs.eval()


@pytest.mark.parametrize("member", ["bert", "roberta", "mpnet"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("mask", NOT_RIGHT_PADDED)
def test_masks_that_are_not_right_padding_equal_transformers_everywhere(member, attention, mask, tmp_path):
    """Padding-free is for right padding: a mask with holes or left padding runs padded, so every position of those
    rows, pads included, is what transformers computes (MPNet's relative positions count columns, which packing
    would not). A right-padded row among them keeps the zeros it gets at its pads alone
    (tests/test_batch_invariance.py)."""
    ours, theirs = tiny_pair(member, attention, tmp_path)
    attention_mask = torch.tensor(NOT_RIGHT_PADDED[mask])
    input_ids = torch.randint(3, 99, attention_mask.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_output = ours(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        theirs_output = theirs(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    real = attention_mask.bool()
    right_padded = (real == (torch.arange(real.shape[1]) < real.sum(1, keepdim=True))).all(dim=1) & real[:, 0]
    compared = real | ~right_padded[:, None]  # every position, but the pads of right-padded rows
    assert max_difference(ours_output.pooler_output, theirs_output.pooler_output) <= 1e-5
    for ours_states, theirs_states in zip(
        (ours_output.last_hidden_state, *ours_output.hidden_states),
        (theirs_output.last_hidden_state, *theirs_output.hidden_states),
        strict=True,
    ):
        assert max_difference(ours_states, theirs_states, compared) <= 1e-5
        assert not ours_states[~compared].any()


def test_right_padding_still_runs_padding_free(tmp_path):
    """The padding-free path stays on for right padding (pads zero), equal to transformers at real positions."""
    ours, theirs = tiny_pair("mpnet", "sdpa", tmp_path)
    attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0, 0]])
    input_ids = torch.randint(3, 99, attention_mask.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_output = ours(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        theirs_output = theirs(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    real = attention_mask.bool()
    assert max_difference(ours_output, theirs_output, real) <= 1e-5
    assert not ours_output[~real].any()


# -- 4. torch.export gives the eager model's outputs ---------------------------------------------------------------
@pytest.mark.slow  # about 7 s per export on 2 cores
@pytest.mark.parametrize("member", ["bert", "mpnet"])
def test_exported_program_equals_the_eager_model(member, tmp_path):
    """The exported graph zeroes pad positions exactly where the eager model runs padding-free (right padding), and
    computes them as transformers does where it runs padded (holes, left padding)."""
    ours, theirs = tiny_pair(member, "sdpa", tmp_path)
    right_padded = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
    input_ids = torch.randint(3, 99, right_padded.shape, generator=torch.Generator().manual_seed(1))
    batch, sequence = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("sequence", min=2, max=32)
    exported = torch.export.export(
        ours,
        args=(),
        kwargs=dict(input_ids=input_ids, attention_mask=right_padded, output_hidden_states=True),
        dynamic_shapes=dict(
            input_ids={0: batch, 1: sequence}, attention_mask={0: batch, 1: sequence}, output_hidden_states=None
        ),
        strict=False,
    ).module()
    masks = [right_padded, *(torch.tensor(mask)[:2] for mask in NOT_RIGHT_PADDED.values())]
    for attention_mask in masks:
        with torch.no_grad():
            graph = exported(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            eager = ours(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            reference = theirs(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        assert max_difference(graph.last_hidden_state, eager.last_hidden_state) <= 1e-5, attention_mask
        assert max_difference(graph.hidden_states[0], eager.hidden_states[0]) <= 1e-5, attention_mask
        assert max_difference(eager.last_hidden_state, reference, attention_mask.bool()) <= 1e-5


# -- 3. checkpointing keeps the layer's own hooks outside, as transformers' GradientCheckpointingLayer -----------
@pytest.mark.parametrize("member", ["bert", "roberta"])  # transformers' MPNet has no checkpointing
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_layers_run_their_hooks_as_transformers(member, reentrant, tmp_path):
    """transformers checkpoints a layer's `forward`, not its `__call__`: hooks on the layer (FSDP2's, PEFT's) run once
    per step, hooks inside it again in the recomputation. hfbert's layers count the same, with the same gradients."""
    ours, theirs = tiny_pair(member, "eager", tmp_path)
    input_ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(1))
    counts, gradients = [], []
    for model in (ours, theirs):
        model.train()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        model.get_input_embeddings().weight.requires_grad_(True)
        calls = {"layer pre": 0, "layer": 0, "intermediate": 0}

        def counter(name, calls=calls):
            return lambda *arguments: calls.__setitem__(name, calls[name] + 1)

        layer = model.encoder.layer[0]
        layer.register_forward_pre_hook(counter("layer pre"))
        layer.register_forward_hook(counter("layer"))
        layer.intermediate.register_forward_hook(counter("intermediate"))
        model(input_ids=input_ids).last_hidden_state.square().sum().backward()
        counts.append(calls)
        gradients.append(layer.intermediate.dense.weight.grad)
    assert counts[0] == counts[1]
    assert max_difference(gradients[0], gradients[1]) <= 1e-4
