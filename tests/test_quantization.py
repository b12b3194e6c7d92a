"""int8 inference (`hfbert/quantization.py`, `optimize_for_inference(model, quantize="int8")`).

The kernel is checked against exact arithmetic on the quantized values (float64 products of the dequantized
weight and activation: only the int32-to-fp32 rescale may differ), the quantizers against their definitions, and
the whole model against transformers fp32 on real all-MiniLM-L6-v2 sentence embeddings, at least as close as
ONNX Runtime's dynamic int8 is (measured: benchmarks/peers.py). Also on the AVX2 kernels (no VNNI, 7-bit
weights), in a subprocess with oneDNN capped.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hfbert
from hfbert.cpu import CAPS, cpu_flags
from hfbert.inference import packed_layers
from hfbert.linear import PackedWeightError
from hfbert.quantization import dequantize_weight, int8_available, int8_linear, quantize_activation, quantize_weight

from conftest import minilm_directory

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")


@int8
@pytest.mark.parametrize("shape", [(16, 768), (2, 7, 768), (1, 768), (3, 1, 5, 768)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_int8_linear_is_exact_on_the_quantized_values(shape, with_bias):
    torch.manual_seed(0)
    weight, bias = torch.randn(1536, 768) * 0.05, torch.randn(1536) if with_bias else None
    inputs = torch.randn(shape) * 3
    quantized = quantize_weight(weight, bias)
    output = int8_linear(inputs, quantized)
    integers, scale, zero_point = quantize_activation(inputs.reshape(-1, 768))
    activations = (integers.double() - zero_point.double()) * scale.double()
    exact = F.linear(activations, dequantize_weight(quantized).double(), None if bias is None else bias.double())
    assert output.shape == (*shape[:-1], 1536) and output.dtype == torch.float32
    assert (output.reshape(-1, 1536).double() - exact).abs().max() <= 1e-5 * exact.abs().max()
    # and close to the fp32 product: int8 noise, about 1% of the output's RMS
    fp32 = F.linear(inputs, weight, bias)
    assert ((output - fp32).square().mean() / fp32.square().mean()).sqrt() < 0.03


@int8
def test_weights_are_symmetric_per_output_channel():
    weight = torch.randn(64, 128) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different ranges
    quantized = quantize_weight(weight, None)
    levels = quantized.levels
    assert levels in (63, 127)
    assert torch.allclose(quantized.scales, weight.abs().amax(dim=1) / levels)
    error = (dequantize_weight(quantized) - weight).abs()
    assert (error <= quantized.scales[:, None] / 2 * (1 + 1e-5)).all()  # round to nearest, row by row


def test_activation_quantization_keeps_zero_exact_and_covers_the_range():
    inputs = torch.tensor([[-2.0, 0.0, 0.5, 6.0]])
    integers, scale, zero_point = quantize_activation(inputs)
    assert integers.dtype == torch.uint8 and integers.min() == 0 and integers.max() == 255
    assert integers[0, 1] == zero_point  # 0.0 maps to the zero point exactly
    assert torch.allclose((integers.float() - zero_point) * scale, inputs, atol=float(scale) / 2 + 1e-7)
    zeros, _, _ = quantize_activation(torch.zeros(2, 3))  # no range at all: no division by zero
    assert (zeros == zeros[0, 0]).all()


@int8
def test_int8_minilm_embeddings_are_as_close_as_onnx_runtime_int8():
    """Mean-pooled, normalised sentence embeddings on the parity sentences against transformers fp32. ONNX
    Runtime's dynamic int8 (per-channel weights) reached min 0.743 / mean 0.947 on these sentences
    (benchmarks/peers.py, AMD EPYC AVX-512); CTranslate2 int8 reached min 0.786 / mean 0.950."""
    import transformers

    from hfbert.parity import default_texts

    directory = minilm_directory()
    tokenizer = hfbert.BertTokenizer.from_pretrained(directory)
    reference = transformers.BertModel.from_pretrained(directory).eval()
    model = hfbert.optimize_for_inference(hfbert.BertModel.from_pretrained(directory), quantize="int8")
    assert set(packed_layers(model).values()) == {"int8"} and len(packed_layers(model)) == 6 * 6 + 1  # and the pooler
    texts = default_texts()
    cosines = []
    with torch.no_grad():
        for start in range(0, len(texts), 8):
            batch = dict(tokenizer(texts[start : start + 8], padding=True, return_tensors="pt"))
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = [(m(**batch).last_hidden_state * mask).sum(1) / mask.sum(1) for m in (model, reference)]
            cosines.append(F.cosine_similarity(*pooled, dim=-1))
    cosines = torch.cat(cosines)
    assert cosines.min() >= 0.95 and cosines.mean() >= 0.99, (cosines.min(), cosines.mean())


@int8
def test_an_int8_model_refuses_to_save_or_train(tmp_path):
    model = hfbert.optimize_for_inference(hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1)), quantize="int8")
    with pytest.raises(PackedWeightError, match="quantized to int8.*save the model before"):
        model.state_dict()
    with pytest.raises(PackedWeightError, match="cannot train"):
        model.train()
    with pytest.raises(PackedWeightError, match="int8"):
        model.encoder.layer[0].intermediate.dense.weight  # noqa: B018


AVX2_SCRIPT = """
import torch, torch.nn.functional as F
from hfbert.quantization import int8_linear, quantize_weight, vnni_available
torch.manual_seed(0)
weight, inputs = torch.randn(3072, 768) * 0.05, torch.randn(64, 768) * 4
output, fp32 = int8_linear(inputs, quantize_weight(weight, None)), F.linear(inputs, weight)
print(vnni_available(), float(((output - fp32).square().mean() / fp32.square().mean()).sqrt()))
"""


@int8
@pytest.mark.skipif("avx2" not in cpu_flags(), reason="not an x86 CPU with AVX2: nothing to cap")
def test_int8_on_avx2_uses_7_bit_weights_and_does_not_saturate():
    """Without VNNI, oneDNN sums pairs of u8 x s8 products in 16 bits; 7-bit weights keep that from saturating,
    which would show as errors of many percent on inputs this wide."""
    import os

    environment = {key: value for key, value in os.environ.items() if key not in CAPS}
    environment.update({"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"})
    result = subprocess.run([sys.executable, "-c", AVX2_SCRIPT], capture_output=True, text=True, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    vnni, error = result.stdout.split()
    assert vnni == "False" and float(error) < 0.03, result.stdout
