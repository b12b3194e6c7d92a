"""Each fact a family row states about a member holds in both libraries: the module paths of the layer list, the
masked-LM head and its decoder, and tokenizer precedence. Tools read these from the row (`family.Member`) instead of
probing a model, so a wrong row would mislead every tool at once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hfbert.modeling.family import MEMBERS, member

from support.members import MODEL_TYPES, TINY, reference_class, reference_config

transformers = pytest.importorskip("transformers")


def hfbert_model(model_type: str, task: str) -> nn.Module:
    row = member(model_type)
    return row.classes[task](row.config_class.from_object(reference_config(model_type))).eval()


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_layer_list_sits_where_the_row_says_in_both_libraries(model_type):
    row = member(model_type)
    theirs = reference_class(model_type)(reference_config(model_type))
    for model in (theirs, hfbert_model(model_type, "model")):
        layers = model.get_submodule(row.layers)
        assert isinstance(layers, nn.ModuleList) and len(layers) == TINY["num_hidden_layers"], type(model)
        assert all(layer.get_submodule(row.reference_attention) is not None for layer in layers)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_masked_lm_modules_and_decoder_are_where_the_row_says(model_type):
    """Applied in turn to the last hidden state, the row's modules give transformers' logits, bit for bit; the row's
    decoder is each library's output embeddings."""
    row = member(model_type)
    torch.manual_seed(0)
    theirs = reference_class(model_type, "masked-lm")(reference_config(model_type)).eval()
    ours = hfbert_model(model_type, "masked-lm")
    assert theirs.get_submodule(row.decoder) is theirs.get_output_embeddings()
    assert ours.get_submodule(row.decoder) is ours.get_output_embeddings()
    input_ids = torch.tensor([[1, 5, 6, 7, 2]])
    with torch.no_grad():
        output = theirs(input_ids=input_ids, output_hidden_states=True)
        logits = output.hidden_states[-1]
        for name in row.masked_lm_modules:
            logits = theirs.get_submodule(name)(logits)
    assert torch.equal(logits, output.logits)
    for name in row.masked_lm_modules:
        assert isinstance(ours.get_submodule(name), nn.Module)


def test_tokenizer_precedence_is_transformers():
    """The members whose model_type decides the tokenizer over tokenizer_config.json's class are those transformers
    loads so (its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS)."""
    from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS

    assert {row.model_type for row in MEMBERS if row.tokenizer_over_class} == {
        model_type for model_type in MODEL_TYPES if model_type in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    }
