"""`hfbert parity` on ModernBERT (issue #51): the float64 verdict over every case, sequences longer than the window;
the float64 reference's attention kernel (transformers' eager takes its softmax in float32, so the reference runs an
exact eager kernel registered with transformers) against transformers' own float64 sdpa; its rotary positions in
float64 (transformers rounds them to float32); and `--artifact` with ONNX
Runtime on an export of transformers' ModernBertModel: the exact export passes, one whose window or rotary base is
wrong fails, the cause named (the float64 reference rerun with that window or base fits it)."""

from __future__ import annotations

import warnings

import pytest
import torch

from hfbert.tools.parity import run_parity

from support.family import TEXTS
from support.members import tokenized_checkpoint

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, request):
    """transformers' ModernBertForMaskedLM (tiny: 2 layers, global then local with 2 columns each side) with
    ModernBERT's kind of tokenizer."""
    return tokenized_checkpoint(tmp_path_factory.mktemp("modernbert"), "modernbert", "masked-lm", request)


def test_the_float64_verdict_passes_on_every_case(checkpoint):
    report = run_parity(checkpoint, texts=TEXTS, progress=False)
    assert report.passed, report.table()
    names = {row.name for row in report.rows}
    assert {"embeddings", "layer 0", "layer 1", "attentions layer 0", "attentions layer 1", "mlm logits"} <= names
    assert "pooler" not in names  # ModernBERT has none
    cases = {case["name"]: case for case in report.cases}
    assert list(cases) == ["single", "pairs", "right padding", "left padding", "max length"]
    assert cases["max length"]["longest"] == 40  # max_position_embeddings, far past the window of 2 + 1 + 2


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_exact_eager_reference_equals_transformers_float64_sdpa(checkpoint, side):
    """The float64 reference's kernel (`exact_eager`) against the same transformers model on its own sdpa kernel in
    float64, on a padded batch longer than the window: equal to float64 rounding, and finite (transformers' eager in
    float64 takes the softmax in float32)."""
    from hfbert.tools.parity.engines.reference_adapters import exact_eager

    model = transformers.ModernBertModel.from_pretrained(checkpoint, dtype=torch.float64).eval()
    width = 38
    input_ids, mask = padded((38, 17, 6), width, side)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        expected = model(input_ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation(exact_eager(transformers))
        output = model(input_ids, attention_mask=mask, output_attentions=True)
    real = mask.bool()
    assert torch.isfinite(output.last_hidden_state).all()
    torch.testing.assert_close(output.last_hidden_state[real], expected[real], atol=1e-12, rtol=1e-12)
    # The local layer's maps: every real query's weights sum to 1 within its window of 2 columns each side.
    local = output.attentions[1][0, 0]
    columns = torch.arange(width)
    outside = (columns[None, :] - columns[:, None]).abs() > 2
    assert float(local[outside].abs().max()) == 0.0


def padded(lengths: tuple[int, ...], width: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (seeded) for rows of `lengths`, padded to `width` on `side`, and their attention mask."""
    input_ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    generator = torch.Generator().manual_seed(0)
    for row, length in enumerate(lengths):
        where = slice(0, length) if side == "right" else slice(width - length, width)
        input_ids[row, where] = torch.randint(3, 300, (length,), generator=generator)
        mask[row, where] = 1
    return input_ids, mask


def test_the_float64_reference_rotates_in_float64(checkpoint):
    """transformers rounds rotary positions to float32 in a float64 model (angles, cosines, sines, and the queries
    and keys it rotates), a rounding its fp32 model shares; `exact_rotary` computes them in float64. Rotary
    attention depends on relative positions only, and transformers counts positions from the first column also
    under left padding, so in exact arithmetic a left-padded row equals its right-padded twin: with `exact_rotary`
    to float64 rounding, without it only to float32's. Its cosines equal Python's math.cos of the exact angle, the
    fp32 model beside it is untouched, and transformers' function is back after each call."""
    import math

    import transformers.models.modernbert.modeling_modernbert as modernbert

    from hfbert.tools.parity.engines.reference_adapters import exact_rotary

    original = modernbert.apply_rotary_pos_emb
    width = 40
    (right, right_mask), (left, left_mask) = (padded((40, 23, 9), width, side) for side in ("right", "left"))
    model = transformers.ModernBertModel.from_pretrained(checkpoint, dtype=torch.float64).eval()
    fp32 = transformers.ModernBertModel.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        fp32_before = fp32(right, attention_mask=right_mask).last_hidden_state

        def difference() -> float:
            on_right = model(right, attention_mask=right_mask).last_hidden_state[right_mask.bool()]
            on_left = model(left, attention_mask=left_mask).last_hidden_state[left_mask.bool()]
            return float((on_right - on_left).abs().max())

        rounded = difference()
        exact_rotary(model)
        installed = []
        model.layers[0].attn.register_forward_pre_hook(lambda *_: installed.append(modernbert.apply_rotary_pos_emb))
        exact = difference()
        assert modernbert.apply_rotary_pos_emb is original
        fp32_after = fp32(right, attention_mask=right_mask).last_hidden_state
    torch.testing.assert_close(fp32_after, fp32_before, rtol=0, atol=0)
    assert rounded > 1e-12, rounded  # float32's rounding of the angles (measured 3.6e-11): the test can fail
    assert exact < 1e-14, (exact, rounded)  # measured 1.1e-16
    # The queries and keys are rotated as they are in float64, by transformers' function in any other dtype.
    assert installed and installed[0] is not original
    generator = torch.Generator().manual_seed(1)
    q, k, cos, sin = (torch.randn(2, 4, 5, 8, generator=generator, dtype=torch.float64) for _ in range(4))
    cos, sin = cos[:, 0], sin[:, 0]
    rotated = installed[0](q, k, cos, sin)
    half = lambda x: torch.cat((-x[..., 4:], x[..., :4]), dim=-1)  # noqa: E731
    torch.testing.assert_close(rotated[0], q * cos[:, None] + half(q) * sin[:, None], rtol=0, atol=0)
    assert not torch.equal(rotated[0], original(q, k, cos, sin)[0])
    single = [x.float() for x in (q, k, cos, sin)]
    for ours, theirs in zip(installed[0](*single), original(*single), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    config = model.config
    rotary, position = model.rotary_emb, 37
    for kind in ("full_attention", "sliding_attention"):
        cos, _ = rotary(torch.zeros(1, dtype=torch.float64), torch.tensor([[position]]), kind)
        size = config.hidden_size // config.num_attention_heads
        theta = config.rope_parameters[kind]["rope_theta"]
        expected = [math.cos(position / theta ** (2 * i / size)) for i in range(size // 2)] * 2
        torch.testing.assert_close(cos[0, 0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)


def export_onnx(directory, path, **changes):
    """transformers' ModernBertModel as ONNX (input_ids, attention_mask -> last_hidden_state), with config fields
    changed before export (`local_attention`, rope thetas) to make a wrong port."""
    config = transformers.AutoConfig.from_pretrained(directory)
    for name, value in changes.items():
        if name == "local_rope_theta":
            config.rope_parameters["sliding_attention"]["rope_theta"] = value
        else:
            setattr(config, name, value)
    model = transformers.ModernBertModel.from_pretrained(directory, config=config, attn_implementation="sdpa").eval()

    class Exporter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(3, 300, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    axes = {name: {0: "batch", 1: "sequence"} for name in ("input_ids", "attention_mask", "last_hidden_state")}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Exporter(),
            (ids, mask),
            path,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    return path


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_exact_onnx_export_passes_and_a_wrong_window_or_rotary_base_fails(checkpoint, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    exact = export_onnx(checkpoint, tmp_path / "exact.onnx")
    # flash-attention's convention (`local_attention // 2 + 1`) carried into sdpa: one column too many each side.
    wide = export_onnx(checkpoint, tmp_path / "wide-window.onnx", local_attention=6)
    theta = export_onnx(checkpoint, tmp_path / "theta.onnx", local_rope_theta=160_000.0)
    report = run_parity(checkpoint, texts=TEXTS, progress=False, artifacts=[exact, wide, theta])
    assert report.hfbert_passed, report.table()
    good, window, base = report.artifacts
    assert good.verdict == "pass", good.rows
    assert window.verdict == "fail", window.rows
    assert base.verdict == "fail", base.rows
    assert good.attention_mismatch is None
    assert window.attention_mismatch is not None
    assert "a window of 3 columns each side, not 2" in window.likely_causes()[0]
    assert base.attention_mismatch is not None
    assert "the local layers' rotary base is 160000 (the global layers'), not 10000" in base.likely_causes()[0]
