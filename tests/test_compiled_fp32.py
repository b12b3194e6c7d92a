"""The compiled fp32 paths, `optimize_for_inference(model, compile=True)` and with `precision="high"`
(`inference/compiled.py`'s FP32 compilation: the mode's products traced, inductor's C++ GEMM template timed against
ATen's product where the mode runs `F.linear`, each new shape timed against the eager mode).

Held to each precision's numerical contract against transformers run in float64 (RMS error at most 1.5x, or 3x,
transformers fp32's own), pad positions exactly zero, and to the eager model wherever the measured choice runs it.
Compiling with max-autotune takes tens of seconds per shape: those tests are `slow`.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_compiled import compiler, right_padded

import hfbert
from hfbert.inference import inference_mode_of, packed_layers
from hfbert.inference.compiled import compile_report, eager_shapes, is_compiled
from hfbert.inference.optimize import ACCURACY_BOUNDS
from hfbert.inference.packed import packing_supported

packing = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN fp32 packing")
# 512 x 2048 feed-forward weights: above MIN_PACKED_WEIGHTS, so the packed and fused kernels are traced too.
CONFIG = dict(hidden_size=512, num_attention_heads=8, intermediate_size=2048, num_hidden_layers=1)


def pair(seed: int = 0):
    """A random hfbert model, transformers' BertModel with the same weights, and that model in float64."""
    import transformers

    torch.manual_seed(seed)
    model = hfbert.BertModel(hfbert.BertConfig(**CONFIG)).eval()
    reference = transformers.BertModel(transformers.BertConfig(**CONFIG)).eval()
    reference.load_state_dict(model.state_dict())
    return model, reference, copy.deepcopy(reference).double()


def rms_error(output: torch.Tensor, exact: torch.Tensor) -> float:
    return float((output.double() - exact).square().mean().sqrt())


def test_every_fp32_precision_has_a_compiled_mode_recorded_by_name():
    for precision, name in (("highest", "fp32 compiled"), ("high", "fp32 high compiled")):
        model = hfbert.BertModel(hfbert.BertConfig(**CONFIG))
        hfbert.optimize_for_inference(model, precision=precision, compile=True)
        applied = inference_mode_of(model)
        assert applied.mode == name if packing_supported() else applied.unavailable
        assert is_compiled(model) == packing_supported()
        hfbert.restore_weights(model)
        assert not is_compiled(model) and not packed_layers(model)


@pytest.mark.slow  # two max-autotune compilations of a small model
@packing
@compiler
@pytest.mark.parametrize("precision", ["highest", "high"])
def test_compiled_fp32_holds_the_precisions_contract_against_float64(precision):
    """kernels="always": the compiled graph runs (no measured choice). Padded to a bucket (2 x 14 -> 2 x 16) and cut
    back: every real position within the contract, pad positions exactly zero, the pooler too."""
    model, reference, exact = pair()
    hfbert.optimize_for_inference(model, precision=precision, kernels="always", compile=True)
    inputs = right_padded(2, 14, [14, 11])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        output = model(**inputs)
        expected = reference(**inputs)
        wanted = exact(**inputs)
    assert set(compile_report(model)) == {(2, 16, (True, False, False, False), 0)} and eager_shapes(model) == []
    bound = ACCURACY_BOUNDS[precision]
    for ours, theirs, truth in (
        (output.last_hidden_state[real], expected.last_hidden_state[real], wanted.last_hidden_state[real]),
        (output.pooler_output, expected.pooler_output, wanted.pooler_output),
    ):
        assert 0 < rms_error(ours, truth) <= bound * rms_error(theirs, truth), precision
    assert torch.equal(output.last_hidden_state[~real], torch.zeros(int((~real).sum()), 512))


@pytest.mark.slow  # two max-autotune compilations of a small model
@packing
@compiler
def test_measured_choice_runs_the_faster_and_both_follow_a_load_state_dict():
    """kernels="measured": the first call of a shape times the graph against the eager mode; whichever runs, the
    outputs are within the contract of transformers', before and after new weights are loaded (a new graph)."""
    model, reference, exact = pair(seed=2)
    hfbert.optimize_for_inference(model, compile=True)
    inputs = dict(input_ids=torch.randint(1000, 20000, (1, 16)))
    other, other_reference, other_exact = pair(seed=3)
    results = []
    with torch.no_grad():
        for state in (None, other.state_dict()):
            if state is not None:
                model.load_state_dict(state)
                reference, exact = other_reference, other_exact
            first = model(**inputs).last_hidden_state  # compiles, then measures
            again = model(**inputs).last_hidden_state  # the faster of the two
            results.append((first, again, reference(**inputs).last_hidden_state, exact(**inputs).last_hidden_state))
    assert [key[-1] for key in compile_report(model)] == [0, 1]
    assert set(eager_shapes(model)) <= set(compile_report(model))
    for first, again, expected, wanted in results:
        for output in (first, again):
            assert rms_error(output, wanted) <= ACCURACY_BOUNDS["highest"] * rms_error(expected, wanted)


@pytest.mark.slow  # a compilation of each kind
@packing
@compiler
def test_compiled_fp32_after_an_int8_model_compiled_in_the_same_process():
    """The int8 path compiles with inductor's weight prepacking, which registers its fp32 patterns for the rest of
    the process: a later fp32 compilation must not trip on them (inductor asserted on hfbert's packed weights)."""
    from hfbert.inference.int8 import int8_available

    if not int8_available():
        pytest.skip("this torch build or CPU has no oneDNN int8 inner product")
    int8_model, _, _ = pair(seed=4)
    model, reference, exact = pair(seed=5)
    hfbert.optimize_for_inference(int8_model, quantize="int8", compile=True)
    hfbert.optimize_for_inference(model, precision="high", kernels="always", compile=True)
    inputs = dict(input_ids=torch.randint(1000, 20000, (2, 32)))
    with torch.no_grad():
        int8_model(**inputs)
        output = model(**inputs).last_hidden_state
        expected, wanted = reference(**inputs).last_hidden_state, exact(**inputs).last_hidden_state
    assert [key[:2] for key in compile_report(int8_model)] == [(2, 32)] == [key[:2] for key in compile_report(model)]
    assert 0 < rms_error(output, wanted) <= ACCURACY_BOUNDS["high"] * rms_error(expected, wanted)


@pytest.mark.slow  # a max-autotune compilation
@packing
@compiler
def test_a_graph_that_disagrees_with_the_eager_mode_never_runs(monkeypatch, caplog):
    """The measured choice also compares the new graph's output with the eager mode's: where they disagree (as when
    another compilation in the process left inductor's packing patterns behind), the shape runs eager, said once."""
    import hfbert.inference.compiled as compiled

    model, reference, exact = pair(seed=6)
    hfbert.optimize_for_inference(model, compile=True)
    monkeypatch.setattr(compiled, "_agrees", lambda ours, theirs, tolerance=1e-3: False)
    inputs = dict(input_ids=torch.randint(1000, 20000, (1, 16)))
    with torch.no_grad():
        outputs = [model(**inputs, return_dict=False)[0] for _ in range(2)]
        expected, wanted = reference(**inputs).last_hidden_state, exact(**inputs).last_hidden_state
    assert eager_shapes(model) == list(compile_report(model)) and len(eager_shapes(model)) == 1
    assert sum("disagrees with the eager one" in record.getMessage() for record in caplog.records) == 1
    for output in outputs:
        assert rms_error(output, wanted) <= ACCURACY_BOUNDS["highest"] * rms_error(expected, wanted)
