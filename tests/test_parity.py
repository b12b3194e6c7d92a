"""hfbert against transformers, layer by layer, on real and generated checkpoints.

Judged against exact arithmetic: transformers also runs every batch in float64, and every hidden state
(non-pad positions), the pooler and the eager attention probabilities of hfbert must be within 1.5x of
transformers' own error against it (conftest.Accuracy), for both hfbert attention implementations against both
of transformers'. A fixed tolerance would not scale: at bert-base size transformers' own fp32 error is 5e-6 on
these weights and up to 4e-4 with outlier dimensions (test_parity_cli.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

import hfbert

from support.helpers import (
    SMALL_CONFIG,
    Accuracy,
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


@functools.cache
def exact_model(directory: Path, device: str = "cpu"):
    """transformers in float64: the exact reference both fp32 models are judged against."""
    import transformers

    model = transformers.BertModel.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32)
    return model.to(device=device, dtype=torch.float64).eval()


def compare(model, reference_model, directory: Path, device: str = "cpu") -> dict[str, Accuracy]:
    """Run every test batch through both models and the float64 one; assert that hfbert is as accurate as
    transformers on every output; return the errors per output."""
    config, exact = model.config, exact_model(directory, device)
    worst: dict[str, Accuracy] = {}

    with_attentions = model.attn_implementation == "eager" and reference_model.config._attn_implementation == "eager"
    for batch in make_batches(config.vocab_size, config.type_vocab_size, config.hidden_size):
        kwargs = {key: value.to(device) for key, value in batch.kwargs.items()}
        exact_kwargs = {key: value.double() if key == "inputs_embeds" else value for key, value in kwargs.items()}
        if "inputs_embeds" in kwargs:
            kwargs["inputs_embeds"] = kwargs["inputs_embeds"].to(model.dtype)
        real = batch.real.to(device)
        options = dict(output_hidden_states=True, output_attentions=with_attentions)
        with torch.no_grad():
            ours, theirs, truth = (
                model(**kwargs, **options),
                reference_model(**kwargs, **options),
                exact(**exact_kwargs, **options),
            )
        assert len(ours.hidden_states) == len(theirs.hidden_states) == config.num_hidden_layers + 1
        for index, states in enumerate(zip(ours.hidden_states, theirs.hidden_states, truth.hidden_states, strict=True)):
            worst.setdefault(f"{batch.name}: hidden_states[{index}]", Accuracy()).add(*states, real)
        worst.setdefault(f"{batch.name}: pooler_output", Accuracy()).add(
            ours.pooler_output, theirs.pooler_output, truth.pooler_output
        )
        if with_attentions:
            for index, layers in enumerate(zip(ours.attentions, theirs.attentions, truth.attentions, strict=True)):
                # (batch, heads, query, key): compare the rows of real query tokens, over every key.
                worst.setdefault(f"{batch.name}: attentions[{index}]", Accuracy()).add(
                    *(layer.transpose(1, 2) for layer in layers), real
                )
    failures = {key: record for key, record in worst.items() if not record.passed(model.dtype)}
    assert not failures, f"less accurate than transformers against float64: {failures}"
    return worst


def on_path(pair: tuple, padding_free: bool) -> tuple:
    """The padding-free path runs on padded batches in eval mode by default; padding_free=False forces padding."""
    model, reference_model = pair
    model.padding_free = padding_free
    return model, reference_model


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
def test_real_minilm_weights(ours, reference, padding_free):
    compare(*on_path(load_pair(minilm_directory(), ours, reference), padding_free), minilm_directory())


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
@pytest.mark.parametrize("file_format", ["safetensors", "pickle"])
def test_bert_base_uncased_layout(
    file_format, ours, reference, padding_free, bert_base_safetensors_dir, bert_base_pickle_dir
):
    directory = bert_base_safetensors_dir if file_format == "safetensors" else bert_base_pickle_dir
    compare(*on_path(load_pair(directory, ours, reference), padding_free), directory)


def test_padding_free_path_is_taken_and_zeroes_pad_positions():
    import hfbert.modeling.padding

    model, reference_model = on_path(load_pair(minilm_directory(), "sdpa", "sdpa"), True)
    calls = []
    original = hfbert.modeling.padding.PackedBatch.__init__

    def counting(self, attention_mask, *args, **kwargs):
        calls.append(attention_mask.shape)
        original(self, attention_mask, *args, **kwargs)

    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ids = torch.tensor([[101, 7592, 2088, 999, 102], [101, 102, 0, 0, 0]])
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(hfbert.modeling.padding.PackedBatch, "__init__", counting)
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
    compare(*load_pair(small_checkpoints[activation], ours, reference), small_checkpoints[activation])


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


def test_attentions_from_a_default_sdpa_model_equal_transformers_eager():
    # sdpa never writes the probabilities out: a call that asks for them runs the eager kernel (transformers 5.24
    # under sdpa warns and returns an empty tuple, so the reference runs eager).
    model, reference_model = load_pair(minilm_directory(), "sdpa", "eager")
    input_ids = torch.tensor([[101, 7592, 2088, 999, 102], [101, 2023, 102, 0, 0]])
    mask = (input_ids != 0).long()
    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
        theirs = reference_model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
    assert model.attn_implementation == "sdpa"  # the setting is unchanged; only that call ran eager
    assert len(ours.attentions) == len(theirs.attentions) == model.config.num_hidden_layers
    for ours_layer, theirs_layer in zip(ours.attentions, theirs.attentions, strict=True):
        assert max_difference(ours_layer, theirs_layer) <= TOLERANCE_FP32_CPU
    assert max_difference(ours.last_hidden_state, theirs.last_hidden_state, mask.bool()) <= TOLERANCE_FP32_CPU


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("ours,reference", IMPLEMENTATION_PAIRS)
def test_cuda_parity(ours, reference, dtype, small_checkpoints, bert_base_safetensors_dir):
    """Each dtype against transformers in the same dtype, both judged against float64 on the GPU, TF32 off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for directory in (minilm_directory(), bert_base_safetensors_dir, small_checkpoints["gelu_new"]):
        compare(*load_pair(directory, ours, reference, device="cuda", dtype=dtype), directory, device="cuda")
