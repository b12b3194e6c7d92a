"""The float64 reference's touch points in transformers (hfbert/tools/parity/engines/reference_adapters.py), checked
against the installed transformers: every member has an adapter, every name an adapter reaches for is still there
(a transformers upgrade that moves one fails here, naming it), a moved one is named, and the members whose adapter
touches nothing really compute in float64 on transformers' own eager kernel."""

from __future__ import annotations

import types

import pytest
import torch

from hfbert.modeling.family import MEMBERS
from hfbert.tools.parity.engines.reference_adapters import ADAPTERS, ModernBertAdapter, ReferenceAdapter, adapter

from support.members import MODEL_TYPES, reference_class, reference_config

transformers = pytest.importorskip("transformers")


def backbone_of(model_type: str) -> torch.nn.Module:
    """transformers' backbone of `model_type`, tiny, in float64."""
    return reference_class(model_type)(reference_config(model_type)).double().eval()


def test_every_member_states_its_adapter():
    """One adapter per row, and a plain one exactly where the row says transformers' float64 model is exact."""
    assert set(ADAPTERS) == {row.model_type for row in MEMBERS}
    for row in MEMBERS:
        assert (type(adapter(row.model_type)) is ReferenceAdapter) == row.reference_float64_exact, row.model_type
    with pytest.raises(ValueError, match="'xlnet' has no float64 reference adapter.*ADAPTERS"):
        adapter("xlnet")


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_touch_point_is_where_the_adapter_reaches(model_type):
    """The upgrade guard: each name the member's adapter reads or replaces in transformers resolves."""
    assert adapter(model_type).missing(transformers, backbone_of(model_type)) == []


def test_a_moved_touch_point_is_named(monkeypatch):
    """The guard can fail: transformers' rotary helpers renamed, its rotation's formula changed and the window's
    field gone are each named."""
    import transformers.models.modernbert.modeling_modernbert as module

    backbone = backbone_of("modernbert")
    with monkeypatch.context() as patched:
        patched.setattr(module, "apply_rotary_pos_emb", lambda q, k, cos, sin, unsqueeze_dim=1: (q * cos, k * cos))
        assert ModernBertAdapter().missing(transformers, backbone) == [
            f"{module.__name__}.apply_rotary_pos_emb: no longer q * cos + rotate_half(q) * sin"
        ]
    monkeypatch.delattr(module, "rotate_half")
    fields = backbone.config.to_dict()
    fields["window"] = fields.pop("local_attention")  # the field renamed
    backbone.config = types.SimpleNamespace(**fields)
    missing = ModernBertAdapter().missing(transformers, backbone)
    assert f"{module.__name__}.rotate_half" in missing
    assert "config.local_attention" in missing


@pytest.mark.parametrize(
    "model_type",
    [
        row.model_type
        for row in MEMBERS
        if type(adapter(row.model_type)) is ReferenceAdapter and row.model_type != "mpnet"
    ],
)
def test_a_member_with_no_caveat_computes_in_float64_on_transformers_eager(model_type):
    """The claim behind a plain adapter: transformers' eager kernel, in a float64 model, equals its float64 sdpa to
    float64 rounding on a padded batch (an eager kernel that rounded to float32 on the way, as ModernBERT's does,
    would differ by about 1e-7). MPNet is left out: transformers has no sdpa for it."""
    model = backbone_of(model_type)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 99, (3, 12), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    real = mask.bool()
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model(input_ids, attention_mask=mask).last_hidden_state
        model = adapter(model_type).make_exact(transformers, model)
        output = model(input_ids, attention_mask=mask).last_hidden_state
    assert model.config._attn_implementation == "eager"
    torch.testing.assert_close(output[real], expected[real], atol=1e-12, rtol=1e-12)
