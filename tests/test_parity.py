"""hfbert against transformers, layer by layer, on real and generated checkpoints.

fp32 CPU: every hidden state (non-pad positions), the pooler and the eager attention probabilities agree to
1e-5 max abs, for both hfbert attention implementations against both of transformers'. The bert-base layout
(weights 2.5x bert-base's spread, so larger activations) runs with `standard_linear()`, the kernel transformers
uses: there the 1e-5 proves the port (observed 0.0). The default oneDNN kernel moves last bits, up to 1.3e-5 on
those weights; test_linear.py holds it to transformers' own fp32 accuracy against float64.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

import hfbert
from hfbert.linear import standard_linear

from conftest import (
    SMALL_CONFIG,
    cuda,
    make_batches,
    max_difference,
    minilm_directory,
    write_random_transformers_checkpoint,
)

ACTIVATIONS = [
    "gelu",
    "gelu_python",
    "gelu_new",
    "gelu_fast",
    "gelu_pytorch_tanh",
    "quick_gelu",
    "relu",
    "silu",
    "swish",
    "tanh",
]
IMPLEMENTATION_PAIRS = [("eager", "eager"), ("sdpa", "sdpa"), ("eager", "sdpa"), ("sdpa", "eager")]
TOLERANCE_FP32_CPU = 1e-5


@pytest.fixture(scope="module")
def small_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("small")
    return {
        activation: write_random_transformers_checkpoint(
            root / activation, seed=index, hidden_act=activation, **SMALL_CONFIG
        )
        for index, activation in enumerate(ACTIVATIONS)
    }


@functools.cache
def load_pair(directory: Path, ours: str, reference: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    import transformers

    model = hfbert.BertModel.from_pretrained(directory, attn_implementation=ours, device=device, dtype=dtype)
    reference_model = transformers.BertModel.from_pretrained(directory, attn_implementation=reference, dtype=dtype)
    return model, reference_model.to(device).eval()


def compare(model, reference_model, tolerance: float, device: str = "cpu") -> dict[str, float]:
    """Run every test batch through both models; return the worst difference per compared output."""
    config = model.config
    worst: dict[str, float] = {}

    def record(key: str, value: float) -> None:
        worst[key] = max(worst.get(key, 0.0), value)

    with_attentions = model.attn_implementation == "eager" and reference_model.config._attn_implementation == "eager"
    for batch in make_batches(config.vocab_size, config.type_vocab_size, config.hidden_size):
        kwargs = {key: value.to(device) for key, value in batch.kwargs.items()}
        if "inputs_embeds" in kwargs:
            kwargs["inputs_embeds"] = kwargs["inputs_embeds"].to(model.dtype)
        real = batch.real.to(device)
        with torch.no_grad():
            ours = model(**kwargs, output_hidden_states=True, output_attentions=with_attentions)
            theirs = reference_model(**kwargs, output_hidden_states=True, output_attentions=with_attentions)
        assert len(ours.hidden_states) == len(theirs.hidden_states) == config.num_hidden_layers + 1
        for index, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states, strict=True)):
            record(f"{batch.name}: hidden_states[{index}]", max_difference(a, b, real))
        record(
            f"{batch.name}: last_hidden_state", max_difference(ours.last_hidden_state, theirs.last_hidden_state, real)
        )
        record(f"{batch.name}: pooler_output", max_difference(ours.pooler_output, theirs.pooler_output))
        if with_attentions:
            for index, (a, b) in enumerate(zip(ours.attentions, theirs.attentions, strict=True)):
                # (batch, heads, query, key): compare the rows of real query tokens, over every key.
                record(f"{batch.name}: attentions[{index}]", max_difference(a.transpose(1, 2), b.transpose(1, 2), real))
    failures = {key: value for key, value in worst.items() if not value <= tolerance}
    assert not failures, f"differences above {tolerance}: {failures}"
    return worst


def on_path(pair: tuple, padding_free: bool) -> tuple:
    """The padding-free path runs on padded batches in eval mode by default; padding_free=False forces padding."""
    model, reference_model = pair
    model.padding_free = padding_free
    return model, reference_model


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
def test_real_minilm_weights(ours, reference, padding_free):
    compare(*on_path(load_pair(minilm_directory(), ours, reference), padding_free), TOLERANCE_FP32_CPU)


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
@pytest.mark.parametrize("file_format", ["safetensors", "pickle"])
def test_bert_base_uncased_layout(
    file_format, ours, reference, padding_free, bert_base_safetensors_dir, bert_base_pickle_dir
):
    directory = bert_base_safetensors_dir if file_format == "safetensors" else bert_base_pickle_dir
    with standard_linear():
        compare(*on_path(load_pair(directory, ours, reference), padding_free), TOLERANCE_FP32_CPU)


def test_padding_free_path_is_taken_and_zeroes_pad_positions():
    import hfbert.padding

    model, reference_model = on_path(load_pair(minilm_directory(), "sdpa", "sdpa"), True)
    calls = []
    original = hfbert.padding.PackedBatch.__init__

    def counting(self, attention_mask):
        calls.append(attention_mask.shape)
        original(self, attention_mask)

    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids = torch.tensor([[101, 7592, 2088, 999, 102], [101, 102, 0, 0, 0]])
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(hfbert.padding.PackedBatch, "__init__", counting)
        ours = model(input_ids=ids, attention_mask=mask).last_hidden_state
        model(input_ids=ids, attention_mask=mask.flip(-1))  # left padding: stays padded
        model.train()
        model(input_ids=ids, attention_mask=mask)  # training: stays padded (dropout order as transformers)
        model.eval()
    assert calls == [(2, 5)]
    theirs = reference_model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert max_difference(ours, theirs, mask.bool()) <= TOLERANCE_FP32_CPU
    assert torch.equal(ours[1, 2:], torch.zeros_like(ours[1, 2:]))


@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_small_configs_every_activation(activation, ours, reference, small_checkpoints):
    compare(*load_pair(small_checkpoints[activation], ours, reference), TOLERANCE_FP32_CPU)


def test_outputs_index_like_transformers():
    model, reference_model = load_pair(minilm_directory(), "sdpa", "sdpa")
    input_ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        ours, theirs = model(input_ids=input_ids), reference_model(input_ids=input_ids)
        ours_tuple = model(input_ids=input_ids, return_dict=False)
        theirs_tuple = reference_model(input_ids=input_ids, return_dict=False)
    assert list(ours.keys()) == list(theirs.keys())
    assert len(ours_tuple) == len(theirs_tuple) == 2
    for key in theirs.keys():
        assert torch.allclose(ours[key], theirs[key], atol=TOLERANCE_FP32_CPU)
    for index in range(len(theirs_tuple)):
        assert torch.allclose(ours[index], theirs[index], atol=TOLERANCE_FP32_CPU)
        assert torch.allclose(ours_tuple[index], theirs_tuple[index], atol=TOLERANCE_FP32_CPU)
    assert "hidden_states" not in ours and "hidden_states" not in theirs


def test_attentions_under_sdpa_are_refused_not_switched():
    model = hfbert.BertModel.from_pretrained(minilm_directory())
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        model(input_ids=torch.tensor([[101, 102]]), output_attentions=True)


CUDA_CASES = [(torch.float32, 1e-4), (torch.float16, 1e-2), (torch.bfloat16, 1e-2)]


@cuda
@pytest.mark.parametrize("dtype,tolerance", CUDA_CASES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
def test_cuda_parity(ours, reference, dtype, tolerance, small_checkpoints, bert_base_safetensors_dir):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for directory in (minilm_directory(), bert_base_safetensors_dir, small_checkpoints["gelu_new"]):
        compare(*load_pair(directory, ours, reference, device="cuda", dtype=dtype), tolerance, device="cuda")
