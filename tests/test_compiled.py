"""The compiled int8 path, `optimize_for_inference(model, quantize="int8", compile=True)` (`inference/compiled.py`).

The compiled model is held to transformers fp32 within the error int8 costs (the eager int8 model's own, measured
in the same test) and to exact zeros at pad positions; the calls the compiled graph does not cover run the eager
model; a missing C++ compiler is one clear error that changes nothing; changed weights compile anew. Compiling
takes tens of seconds per shape, so the tests that compile are `slow`; the MiniLM test holds the compiled model to
the same bound as the eager int8 one (CTranslate2's int8 accuracy, `test_quantization.py`).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import hfbert
from hfbert.inference import packed_layers
from hfbert.inference.compiled import CompiledForward, check_compiler, compile_report, is_compiled
from hfbert.inference.int8 import int8_available

from support.helpers import minilm_directory

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")


def has_compiler() -> bool:
    try:
        check_compiler()
    except RuntimeError:
        return False
    return True


compiler = pytest.mark.skipif(not has_compiler(), reason="no C++ compiler for inductor (g++ or $CXX)")
# int8 runs layers with at least 2**16 weights (MIN_INT8_WEIGHTS): hidden 256 is the smallest model that has them.
SMALL = dict(hidden_size=256, num_attention_heads=4, intermediate_size=1024, num_hidden_layers=2)


def small_pair(seed: int = 0):
    """A small random hfbert model and transformers' BertModel with the same weights."""
    import transformers

    torch.manual_seed(seed)
    model = hfbert.BertModel(hfbert.BertConfig(**SMALL)).eval()
    reference = transformers.BertModel(transformers.BertConfig(**SMALL), add_pooling_layer=True).eval()
    reference.load_state_dict(model.state_dict())
    return model, reference


def relative_rms(output: torch.Tensor, reference: torch.Tensor) -> float:
    output, reference = output.double(), reference.double()
    return float(((output - reference).square().mean() / reference.square().mean()).sqrt())


def right_padded(batch: int, length: int, real: list[int]) -> dict[str, torch.Tensor]:
    ids = torch.randint(1000, 20000, (batch, length))
    mask = (torch.arange(length)[None, :] < torch.tensor(real)[:, None]).long()
    return dict(input_ids=ids * mask, attention_mask=mask)


@int8
def test_without_a_cpp_compiler_it_fails_naming_the_compiler_and_changes_nothing():
    from torch._inductor import config

    model = hfbert.BertModel(hfbert.BertConfig(**SMALL))
    with config.patch({"cpp.cxx": (None, "no-such-c++")}), pytest.raises(RuntimeError, match=r"'no-such-c\+\+'.*CXX"):
        hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    assert not packed_layers(model) and not is_compiled(model)
    hfbert.optimize_for_inference(model, quantize="int8")  # the eager int8 path needs no compiler
    assert set(packed_layers(model).values()) == {"int8"}


def test_int8_cannot_take_the_fast_fp32_precision_compiled_or_not():
    model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    for compile in (False, True):
        with pytest.raises(ValueError, match="precision='high' is an fp32 mode"):
            hfbert.optimize_for_inference(model, quantize="int8", precision="high", compile=compile)
    assert not packed_layers(model) and not is_compiled(model)


@int8
@compiler
def test_calls_the_graph_does_not_cover_run_eager_and_restore_weights_uncompiles():
    """Gradients, attention maps, embeddings given and batches mostly padding run the eager model: no compilation."""
    model, reference = small_pair()
    hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    assert isinstance(model.__dict__["forward"], CompiledForward) and is_compiled(model)
    inputs = right_padded(2, 16, [16, 3])  # 19 real tokens of 32: padding-free eager is faster
    with torch.no_grad():
        model(**inputs)
        model(**inputs, output_attentions=True)
        model(inputs_embeds=torch.randn(1, 4, 256))
    model(input_ids=inputs["input_ids"][:1])  # gradients enabled
    assert compile_report(model) == {}
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        output = model(**inputs).last_hidden_state
    assert relative_rms(output[0], expected[0]) < 0.05  # int8 against fp32 (about 0.01 here)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        forward = copied.__dict__["forward"]
        assert forward.model is copied and forward.compiled == {} and forward._compiled is None
    hfbert.restore_weights(model)
    assert not is_compiled(model) and "forward" not in model.__dict__ and not packed_layers(model)


@pytest.mark.slow  # two compilations of a small model
@int8
@compiler
def test_compiled_int8_matches_transformers_as_the_eager_int8_model_does():
    """Padded to a bucket shape (2 x 14 -> 2 x 16) and cut back: real positions as close to transformers fp32 as the
    eager int8 model is, pad positions exactly zero (as the eager padding-free path gives them), the pooler, the
    tuple form and the hidden states cut the same way."""
    model, reference = small_pair()
    inputs = right_padded(2, 14, [14, 12])
    hfbert.optimize_for_inference(model, quantize="int8")
    with torch.no_grad():
        expected = reference(**inputs, output_hidden_states=True)
        eager = model(**inputs)
        hfbert.optimize_for_inference(model, quantize="int8", compile=True)
        output = model(**inputs)
        as_tuple = model(**inputs, return_dict=False)
        with_states = model(**inputs, output_hidden_states=True)
        positions = torch.arange(14)
        with_positions = model(**inputs, position_ids=positions)  # (sequence,), padded as (1, sequence)
        expected_positions = reference(**inputs, position_ids=positions[None]).last_hidden_state
    assert set(compile_report(model)) == {
        (2, 16, (True, False, False, False), 0),
        (2, 16, (True, False, False, True), 0),
        (2, 16, (True, False, True, False), 0),
    }
    real = inputs["attention_mask"].bool()
    assert output.last_hidden_state.shape == (2, 14, 256) and output.pooler_output.shape == (2, 256)
    assert torch.equal(output.last_hidden_state[~real], torch.zeros(2, 256))
    eager_error = relative_rms(eager.last_hidden_state[real], expected.last_hidden_state[real])
    error = relative_rms(output.last_hidden_state[real], expected.last_hidden_state[real])
    assert 0 < error <= 1.2 * eager_error + 1e-4, (error, eager_error)
    assert (
        relative_rms(output.pooler_output, expected.pooler_output)
        <= 1.2 * relative_rms(eager.pooler_output, expected.pooler_output) + 1e-4
    )
    assert torch.equal(as_tuple[0], output.last_hidden_state) and torch.equal(as_tuple[1], output.pooler_output)
    assert relative_rms(with_positions.last_hidden_state[real], expected_positions[real]) <= 1.2 * eager_error + 1e-4
    assert len(with_states.hidden_states) == 3
    for states, exact in zip(with_states.hidden_states, expected.hidden_states, strict=True):
        assert states.shape == (2, 14, 256) and torch.equal(states[~real], torch.zeros(2, 256))
        assert relative_rms(states[real], exact[real]) < 0.05


@pytest.mark.slow  # two compilations of a small model
@int8
@compiler
def test_changed_weights_compile_anew():
    """The weights are folded into the graph: after a change, the next call quantizes and compiles again, and
    follows the new weights (checked against transformers with the same change)."""
    model, reference = small_pair(seed=1)
    hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    inputs = dict(input_ids=torch.randint(1000, 20000, (1, 16)))
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        for network in (model, reference):
            network.encoder.layer[0].intermediate.dense.weight.mul_(3)
        after = model(**inputs).last_hidden_state
        expected = reference(**inputs).last_hidden_state
        # An all-ones mask is dropped, as the eager model drops it: the same graph runs.
        masked = model(**inputs, attention_mask=torch.ones(1, 16, dtype=torch.long)).last_hidden_state
    assert [key[-1] for key in compile_report(model)] == [0, 1]
    assert torch.equal(masked, after)
    assert relative_rms(after, expected) < 0.05 < relative_rms(before, expected)


@pytest.mark.slow  # real MiniLM, a few compilations
@int8
@compiler
def test_compiled_int8_minilm_embeddings_keep_the_int8_accuracy():
    """Batch 1, sentence by sentence (the latency case the compiled path is for): element-wise as close to
    transformers fp32 as the eager int8 model, and mean-pooled embeddings at least as close as CTranslate2's int8
    (the eager int8 model's bound, test_quantization.py)."""
    import transformers

    from hfbert.tools.parity import default_texts

    directory = minilm_directory()
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory).eval()
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), quantize="int8")
    inputs = [dict(tokenizer([text], return_tensors="pt")) for text in default_texts()]
    with torch.no_grad():
        expected = [reference(**batch).last_hidden_state for batch in inputs]
        eager = [model(**batch).last_hidden_state for batch in inputs]
        hfbert.optimize_for_inference(model, quantize="int8", compile=True)
        compiled = [model(**batch).last_hidden_state for batch in inputs]
    assert compile_report(model)  # the calls ran compiled
    error = relative_rms(torch.cat(compiled, 1), torch.cat(expected, 1))
    eager_error = relative_rms(torch.cat(eager, 1), torch.cat(expected, 1))
    assert error <= 1.2 * eager_error, (error, eager_error)
    cosines = torch.cat([F.cosine_similarity(a.mean(1), b.mean(1)) for a, b in zip(compiled, expected, strict=True)])
    assert cosines.min() >= 0.9745 and cosines.mean() >= 0.9957, (cosines.min(), cosines.mean())


@pytest.mark.slow  # torch.compile of a small model
@int8
@compiler
def test_a_users_torch_compile_of_a_compiled_model_traces_the_plain_computation():
    """As for every optimized model: the user's compiler sees the fp32 computation (the oneDNN ops are invisible to
    it), which then matches transformers fp32 closely, not within int8's error only."""
    model, reference = small_pair(seed=2)
    hfbert.optimize_for_inference(model, quantize="int8", compile=True)
    inputs = dict(input_ids=torch.randint(1000, 20000, (1, 16)))
    with torch.no_grad():
        output = torch.compile(model, backend="aot_eager")(**inputs).last_hidden_state
        expected = reference(**inputs).last_hidden_state
    assert (output - expected).abs().max() <= 1e-4
    assert compile_report(model) == {}


@pytest.mark.slow  # one compilation of a small model
@int8
@compiler
def test_a_compiled_and_an_eager_model_side_by_side():
    """The flag that has torch.compile trace the int8 kernels belongs to the model being compiled, for its own calls:
    an eager int8 model of the same weights, called and compiled by the user between the compiled model's calls,
    computes its own way (the user's compile traces the plain fp32 computation, as for every optimized model)."""
    compiled, reference = small_pair(seed=3)
    eager = copy.deepcopy(compiled)
    hfbert.optimize_for_inference(compiled, quantize="int8", compile=True)
    hfbert.optimize_for_inference(eager, quantize="int8")
    inputs = dict(input_ids=torch.randint(1000, 20000, (1, 16)))
    with torch.no_grad():
        first = compiled(**inputs).last_hidden_state
        eager_output = eager(**inputs).last_hidden_state
        users = torch.compile(eager, backend="aot_eager")(**inputs).last_hidden_state
        second = compiled(**inputs).last_hidden_state
        expected = reference(**inputs).last_hidden_state
    assert compile_report(compiled) and not is_compiled(eager) and torch.equal(first, second)
    assert (users - expected).abs().max() <= 1e-4  # fp32, not int8
    assert relative_rms(eager_output, expected) < 0.05 and relative_rms(first, expected) < 0.05
    assert not any(module.__dict__.get("_trace_kernels") for model in (compiled, eager) for module in model.modules())
