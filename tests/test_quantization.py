"""int8 inference (`hfbert/inference/int8.py`, `optimize_for_inference(model, quantize="int8")`).

The kernel is checked against exact arithmetic on the quantized values (float64 products of the dequantized
weight and activations: only the fp32 rescaling may differ), the quantizers against their definitions, the
product against fp32 `F.linear` within the error int8 costs (measured bounds below), and the whole model against
transformers fp32 on real all-MiniLM-L6-v2 sentence embeddings, closer than ONNX Runtime's and CTranslate2's int8
are. Also on the AVX2 kernels (no VNNI: 63 weight levels), in a subprocess with oneDNN, MKL and ATen capped.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hfbert
import hfbert.inference.int8
from hfbert.inference import packed_layers
from hfbert.inference.fused import FusedSelfAttention as Int8SelfAttention  # int8 attention: the int8 kernel's
from hfbert.inference.int8 import (
    STEPS,
    dequantize_weight,
    int8_available,
    int8_linear,
    quantize_activation,
    quantize_weight,
)
from hfbert.platform.cpu import CAPS, cpu_flags

from support.helpers import minilm_directory

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")


def exact_product(inputs: torch.Tensor, quantized, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 product of the values int8_linear actually multiplies: the quantized activations and weight."""
    integers, scale, zero_point = quantize_activation(inputs.reshape(-1, inputs.shape[-1]))
    activations = (integers.double() - zero_point.double()) * scale.double()
    return F.linear(activations, dequantize_weight(quantized).double(), None if bias is None else bias.double())


def relative_rms(output: torch.Tensor, reference: torch.Tensor) -> float:
    output, reference = output.double(), reference.double()
    return float(((output - reference).square().mean() / reference.square().mean()).sqrt())


@int8
@pytest.mark.parametrize("shape", [(16, 768), (2, 7, 768), (1, 768), (3, 1, 5, 768)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_int8_linear_is_exact_on_the_quantized_values(shape, with_bias):
    torch.manual_seed(0)
    weight, bias = torch.randn(1536, 768) * 0.05, torch.randn(1536) if with_bias else None
    inputs = torch.randn(shape) * 3
    quantized = quantize_weight(weight, bias)
    output = int8_linear(inputs, quantized)
    exact = exact_product(inputs, quantized, bias)
    assert output.shape == (*shape[:-1], 1536) and output.dtype == torch.float32
    assert (output.reshape(-1, 1536).double() - exact).abs().max() <= 1e-5 * exact.abs().max()


@int8
@pytest.mark.parametrize("outliers", [False, True])
def test_int8_linear_is_within_int8_error_of_fp32(outliers):
    """Relative RMS error against fp32 F.linear, measured 1.1% (127 levels) and 1.7% (63, no VNNI) on Gaussian
    inputs; 3.0% and 3.3% with 4 of 768 input dimensions 20x larger (BERT's outlier dimensions), where one scale
    per tensor instead of per token measures 5.3-8.8%."""
    torch.manual_seed(1)
    weight, bias = torch.randn(768, 768) * 0.04, torch.randn(768) * 0.1
    inputs = torch.randn(64, 768)
    if outliers:
        inputs[:, :4] *= 20
    quantized = quantize_weight(weight, bias)
    error = relative_rms(int8_linear(inputs, quantized), F.linear(inputs, weight, bias))
    assert error < (0.04 if outliers else 0.015 if quantized.levels == 127 else 0.025), error


@int8
def test_weights_are_symmetric_per_output_channel():
    weight = torch.randn(64, 128) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different ranges
    weight[5] = 0.0  # an all-zero row stays zero
    quantized = quantize_weight(weight, None)
    levels = quantized.levels
    assert levels in (63, 127) and quantized.scales.shape == (64,)
    nonzero = torch.arange(64) != 5
    integers = (dequantize_weight(quantized) / quantized.scales[:, None]).round()  # exact but for fp32 rounding
    assert (integers.abs().amax(dim=1)[nonzero] == levels).all()  # each row's largest weight takes the top level
    assert torch.allclose(quantized.scales[nonzero], weight.abs().amax(dim=1)[nonzero] / levels)
    error = (dequantize_weight(quantized) - weight).abs()
    assert (error <= quantized.scales[:, None] / 2 * (1 + 1e-5)).all()  # round to nearest, row by row
    assert (dequantize_weight(quantized)[5] == 0).all()


@int8
@pytest.mark.parametrize("shape", [(384, 384), (1536, 384), (384, 1536), (3, 5)])
def test_dequantized_weight_is_the_weight_not_its_transpose(shape):
    """oneDNN's packed tensor reads back as (in, out); a square weight must not be taken as already (out, in)."""
    weight = torch.randn(shape)
    quantized = quantize_weight(weight, None)
    assert dequantize_weight(quantized).shape == shape
    assert (dequantize_weight(quantized) - weight).abs().max() <= quantized.scales.max() / 2 * (1 + 1e-5)


def test_activation_quantization_keeps_zero_exact_and_covers_each_row():
    inputs = torch.tensor([[-2.0, 0.0, 0.5, 6.0], [0.0, 1.0, 3.0, 2.0], [-1.0, -0.5, 0.0, -0.25]])
    integers, scale, zero_point = quantize_activation(inputs)
    assert integers.dtype == torch.uint8 and scale.shape == zero_point.shape == (3, 1)
    assert (integers.amax(dim=1) - integers.amin(dim=1) == STEPS).all()  # each row's own range, in all its steps
    zeros_at = inputs == 0  # one zero per row: it maps to that row's zero point exactly
    assert torch.equal(integers[zeros_at].float(), zero_point.flatten())
    assert ((integers.float() - zero_point) * scale - inputs).abs().le(scale / 2 + 1e-7).all()
    zeros, _, _ = quantize_activation(torch.zeros(2, 3))  # no range at all: no division by zero
    assert (zeros == zeros[0, 0]).all()


@int8
def test_one_rows_outliers_do_not_cost_another_row_its_precision():
    """Per token: a row's quantization, hence its output, does not depend on the other rows."""
    torch.manual_seed(2)
    quantized = quantize_weight(torch.randn(256, 384) * 0.05, torch.randn(256))
    quiet, loud = torch.randn(1, 384), torch.randn(1, 384) * 1000
    together = int8_linear(torch.cat([quiet, loud]), quantized)
    assert torch.allclose(together[:1], int8_linear(quiet, quantized), rtol=1e-6, atol=1e-6)


@int8
def test_zero_input_gives_the_bias_and_no_rows_give_no_rows():
    quantized = quantize_weight(torch.randn(96, 64), torch.arange(96.0))
    assert torch.equal(int8_linear(torch.zeros(4, 64), quantized), torch.arange(96.0).expand(4, 96))
    assert torch.equal(int8_linear(torch.zeros(2, 3, 64), quantize_weight(torch.randn(96, 64))), torch.zeros(2, 3, 96))
    assert int8_linear(torch.zeros(0, 5, 64), quantized).shape == (0, 5, 96)


@int8
def test_wrong_inputs_are_refused():
    quantized = quantize_weight(torch.randn(8, 16))
    with pytest.raises(ValueError, match="last dimension must be 16"):
        int8_linear(torch.randn(2, 15), quantized)
    with pytest.raises(TypeError, match="fp32 CPU input"):
        int8_linear(torch.randn(2, 16, dtype=torch.float64), quantized)
    with pytest.raises(RuntimeError, match="no gradient"):
        int8_linear(torch.randn(2, 16, requires_grad=True), quantized)
    with pytest.raises(ValueError, match="bias must have shape"):
        quantize_weight(torch.randn(8, 16), torch.zeros(16))
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize_weight(torch.full((8, 16), float("nan")))


@int8
def test_an_int8_weight_survives_pickle_and_deepcopy():
    """oneDNN's packed tensors cannot be pickled; the int8 values travel plain and are packed again."""
    quantized = quantize_weight(torch.randn(48, 32), torch.randn(48))
    inputs = torch.randn(3, 32)
    for copied in (pickle.loads(pickle.dumps(quantized)), copy.deepcopy(quantized)):
        assert torch.equal(dequantize_weight(copied), dequantize_weight(quantized))
        assert torch.equal(int8_linear(inputs, copied), int8_linear(inputs, quantized))


@pytest.mark.slow  # real MiniLM, two libraries
@int8
def test_int8_minilm_embeddings_are_closer_than_onnx_runtime_and_ctranslate2_int8():
    """Mean-pooled sentence embeddings on the parity sentences against transformers fp32, at least as close as the
    better of ONNX Runtime's and CTranslate2's int8 on this and 32 longer texts (`python -m benchmarks.int8_accuracy`,
    AVX2, no VNNI: min / mean cosine hfbert 0.9890 / 0.9974, CTranslate2 0.9745 / 0.9957, ONNX Runtime 0.9596 /
    0.9914; hfbert's own product with one activation scale per tensor 0.9744 / 0.9922, which is why it runs per
    token). Here, on the parity sentences alone: hfbert 0.9890 / 0.9974."""
    import transformers

    from hfbert.tools.parity import default_texts

    directory = minilm_directory()
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory).eval()
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), quantize="int8")
    # Per layer: query, key and value as one product, the attention output, the feed-forward pair; and the pooler.
    assert set(packed_layers(model).values()) == {"int8"} and len(packed_layers(model)) == 6 * 4 + 1
    texts = default_texts()
    cosines = []
    with torch.no_grad():
        for start in range(0, len(texts), 8):
            batch = dict(tokenizer(texts[start : start + 8], padding=True, return_tensors="pt"))
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = [(m(**batch).last_hidden_state * mask).sum(1) / mask.sum(1) for m in (model, reference)]
            cosines.append(F.cosine_similarity(*pooled, dim=-1))
    cosines = torch.cat(cosines)
    assert cosines.min() >= 0.9745 and cosines.mean() >= 0.9957, (cosines.min(), cosines.mean())  # CTranslate2's


@int8
def test_an_int8_model_keeps_its_fp32_parameters_and_saves_them_bit_for_bit(tmp_path):
    """int8 is a cache of the weights: the model's parameters, state dict and saved checkpoint are the fp32 ones,
    and training runs F.linear on them; back in eval mode, the changed weights are quantized again."""
    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    parameters = list(model.parameters())
    hfbert.optimize_for_inference(model, quantize="int8")
    assert len(packed_layers(model)) == 4 + 1  # query, key and value as one product; and the pooler
    assert all(a is b for a, b in zip(model.parameters(), parameters, strict=True))
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())
    model.save_pretrained(tmp_path)
    reloaded = hfbert.BertModel.from_pretrained(tmp_path)
    assert all(torch.equal(reloaded.state_dict()[name], tensor) for name, tensor in state.items())
    inputs = dict(input_ids=torch.tensor([[101, 2000, 2001, 102]]))
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
    model.train()
    layer = model.encoder.layer[0].output.dense
    hidden = torch.randn(4, layer.in_features)
    assert torch.equal(layer(hidden), F.linear(hidden, layer.weight, layer.bias))  # training: the fp32 product
    with torch.no_grad():
        layer.weight.mul_(2)
    model.eval()
    with torch.no_grad():
        after = model(**inputs).last_hidden_state
    assert not torch.equal(after, before)  # the doubled weight was quantized again, not the stale int8 copy


@int8
def test_query_key_and_value_are_one_int8_product_of_their_own_weights():
    """int8 attention computes the three projections as one product: each third is the exact product of the
    quantized hidden states and that projection's own quantized weight, as a layer on its own gives it."""
    torch.manual_seed(4)
    model = hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)), quantize="int8")
    attention = model.encoder.layer[0].attention.self
    assert isinstance(attention, Int8SelfAttention) and packed_layers(model)["encoder.layer.0.attention.self"] == "int8"
    projections = (attention.query, attention.key, attention.value)
    assert all(type(layer) is torch.nn.Linear for layer in projections)  # the block's own modules, fp32 parameters
    hidden = torch.randn(2, 9, 768)
    with torch.no_grad():
        assert attention._ready()
        outputs = attention.project(hidden.reshape(-1, 768)).split(768, dim=-1)
        bias = torch.cat([layer.bias for layer in projections])
        exact = exact_product(hidden, attention._form, bias)
        assert (torch.cat(outputs, -1).double() - exact).abs().max() <= 1e-5 * exact.abs().max()
        for output, layer in zip(outputs, projections, strict=True):
            alone = int8_linear(hidden, quantize_weight(layer.weight, layer.bias)).reshape(-1, 768)
            assert torch.allclose(output, alone, rtol=1e-5, atol=1e-5 * alone.abs().max())


@int8
@pytest.mark.parametrize(
    "mode", [dict(quantize="int8"), dict(precision="high", kernels="always")], ids=["int8", "fast"]
)
def test_a_hook_on_a_projection_inside_a_fused_block_still_runs(mode):
    """The fused blocks compute query, key and value in one product: a hook on one of them makes the block run its
    plain way (the projections' own calls), and its output is what that projection computes."""
    model = hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)), **mode)
    key = model.encoder.layer[0].attention.self.key
    seen = []
    key.register_forward_hook(lambda module, args, output: seen.append((args[0], output)))
    with torch.no_grad():
        model(input_ids=torch.tensor([[101, 2000, 102]]))
    assert len(seen) == 1 and seen[0][1].shape == (1, 3, 768)
    assert torch.equal(seen[0][1], F.linear(seen[0][0], key.weight, key.bias))


AVX2_SCRIPT = """
import torch, torch.nn.functional as F
from hfbert.inference import int8 as quantization
from hfbert.inference.int8 import dequantize_weight, int8_linear, quantize_activation, quantize_weight
torch.manual_seed(0)
weight, inputs = torch.randn(3072, 768) * 0.05, torch.randn(64, 768) * 4
quantized = quantize_weight(weight, None)
output = int8_linear(inputs, quantized)
integers, scale, zero_point = quantize_activation(inputs)
exact = ((integers.double() - zero_point.double()) * scale.double()) @ dequantize_weight(quantized).double().T
fp32 = F.linear(inputs, weight)
print(quantization.vnni_available(), quantized.levels, quantization._sums_exactly(127),
      float((output.double() - exact).abs().max() / exact.abs().max()),
      float(((output - fp32).square().mean() / fp32.square().mean()).sqrt()))
"""


@int8
@pytest.mark.skipif("avx2" not in cpu_flags(), reason="not an x86 CPU with AVX2: nothing to cap")
def test_int8_on_avx2_uses_63_levels_and_does_not_saturate():
    """Without VNNI, oneDNN adds pairs of uint8 x int8 products in saturating 16 bits: the probe must see that full
    127-level weights would overflow there, and choose 63, with which the product is exact again."""
    environment = {key: value for key, value in os.environ.items() if key not in CAPS}
    environment.update({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    result = subprocess.run(
        [sys.executable, "-c", AVX2_SCRIPT], capture_output=True, text=True, env=environment, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    vnni, levels, exact_at_127, kernel_error, error = result.stdout.split()
    assert (vnni, levels, exact_at_127) == ("False", "63", "False"), result.stdout
    assert float(kernel_error) <= 1e-5 and float(error) < 0.025, result.stdout
