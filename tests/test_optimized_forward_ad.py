"""Forward-mode AD and functorch's transforms through an optimized model give the derivatives of the model it speeds
up: the kernels' ops have no forward derivative or batching rule, so the gate runs the plain computation there.
Each is compared element-wise with the same transform of transformers' BertModel holding the same weights (eager
attention in both: torch's CPU sdpa kernel has no forward derivative)."""

from __future__ import annotations

import pytest
import torch
from test_compiled import SMALL
from torch.autograd import forward_ad

import hfbert
from hfbert.inference import packed_layers
from hfbert.inference.int8 import int8_available
from hfbert.inference.packed import packing_supported

int8 = pytest.mark.skipif(not int8_available(), reason="this torch build or CPU has no oneDNN int8 inner product")
packs = pytest.mark.skipif(not packing_supported(), reason="this torch build or CPU has no oneDNN to pack for")
# The default mode packs layers of at least 2**19 weights (MIN_PACKED_WEIGHTS): bert-base's width.
WIDE = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=1)
MODES = {
    "highest": (dict(kernels="always"), WIDE),
    "high": (dict(precision="high", kernels="always"), SMALL),
    "int8": (dict(quantize="int8"), SMALL),
}


def modes(*names: str):
    marks = {"int8": int8, "high": packs, "highest": packs}
    return pytest.mark.parametrize("mode", [pytest.param(name, marks=marks[name]) for name in names])


def optimized_pair(mode: str):
    """An hfbert model optimized in `mode`, transformers' BertModel with the same weights, and inputs (embeddings
    and a tangent) for them."""
    import transformers

    options, shape = MODES[mode]
    torch.manual_seed(0)
    model = hfbert.BertModel(hfbert.BertConfig(**shape, attn_implementation="eager")).eval()
    reference = transformers.BertModel(transformers.BertConfig(**shape, attn_implementation="eager")).eval()
    reference.load_state_dict(model.state_dict())
    hfbert.optimize_for_inference(model, **options)
    assert packed_layers(model)
    embeddings, tangent = torch.randn(2, 16, shape["hidden_size"]), torch.randn(2, 16, shape["hidden_size"])
    return model, reference, embeddings, tangent


def hidden(model: torch.nn.Module):
    return lambda embeddings: model(inputs_embeds=embeddings).last_hidden_state


def assert_equal_in_fp32(output: torch.Tensor, expected: torch.Tensor) -> None:
    """Element-wise, within float32 rounding of values of `expected`'s size."""
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-5 * float(expected.detach().abs().max()))


@modes("highest", "high", "int8")
def test_jvp_gives_the_plain_models_tangents(mode):
    model, reference, embeddings, tangent = optimized_pair(mode)
    with torch.no_grad():
        output, derivative = torch.func.jvp(hidden(model), (embeddings,), (tangent,))
        expected, expected_derivative = torch.func.jvp(hidden(reference), (embeddings,), (tangent,))
    assert_equal_in_fp32(derivative, expected_derivative)
    assert_equal_in_fp32(output, expected)


@modes("highest", "high", "int8")
def test_dual_tensors_give_the_plain_models_tangents(mode):
    model, reference, embeddings, tangent = optimized_pair(mode)
    derivatives = []
    with torch.no_grad(), forward_ad.dual_level():
        for network in (model, reference):
            output = hidden(network)(forward_ad.make_dual(embeddings, tangent))
            derivatives.append(forward_ad.unpack_dual(output).tangent)
    assert derivatives[0] is not None
    assert_equal_in_fp32(*derivatives)


@modes("high", "int8")
def test_vmap_and_grad_give_the_plain_models_results(mode):
    model, reference, embeddings, _ = optimized_pair(mode)
    with torch.no_grad():
        mapped = [torch.func.vmap(lambda row, m=m: hidden(m)(row[None])[0])(embeddings) for m in (model, reference)]
    assert_equal_in_fp32(*mapped)
    gradients = [torch.func.grad(lambda e, m=m: hidden(m)(e).square().sum())(embeddings) for m in (model, reference)]
    assert_equal_in_fp32(*gradients)
