"""`EncoderModel` (hfbert/modeling/encoder.py) runs a member that is not BERT-shaped from its hooks alone.

DistilBERT, the next member planned, keeps its layers at `transformer.layer` and names every part otherwise; here it
is written as a member would write it, by filling the hooks (`layers_path`, `embed`) and the layer protocol
(`EncoderLayer.compute`), with no forward of its own, and held element-wise against transformers' DistilBertModel on
a padded batch, padded and padding-free. The holder of its layer list (`LayerStack`) keeps its checkpointing, as
BERT's `encoder` does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.modeling.config import BertConfig
from hfbert.modeling.encoder import EncoderLayer, EncoderModel, LayerStack

transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40)


class Embeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.dropout = nn.Dropout(0.0)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None) -> Tensor:
        embeddings = self.word_embeddings(input_ids)
        if position_ids is None:
            position_ids = torch.arange(embeddings.shape[1], device=embeddings.device)
        return self.dropout(self.LayerNorm(embeddings + self.position_embeddings(position_ids)))


class SelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.q_lin, self.k_lin, self.v_lin, self.out_lin = (
            nn.Linear(config.hidden_size, config.hidden_size) for _ in range(4)
        )

    def forward(self, hidden_states: Tensor, batch) -> tuple[Tensor, Tensor | None]:
        q, k, v = self.q_lin(hidden_states), self.k_lin(hidden_states), self.v_lin(hidden_states)
        scale = (hidden_states.shape[-1] // self.num_heads) ** -0.5
        context, probabilities = batch.attend(q, k, v, num_heads=self.num_heads, scale=scale, dropout=0.0)
        return self.out_lin(context), probabilities


class FFN(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.lin1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.lin2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.lin2(F.gelu(self.lin1(hidden_states)))


class TransformerBlock(EncoderLayer):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.hidden_size, eps=1e-12)
        self.ffn = FFN(config)
        self.output_layer_norm = nn.LayerNorm(config.hidden_size, eps=1e-12)

    def compute(self, hidden_states: Tensor, batch) -> tuple[Tensor, Tensor | None]:
        attention_output, probabilities = self.attention(hidden_states, batch)
        attention_output = self.sa_layer_norm(attention_output + hidden_states)
        return self.output_layer_norm(self.ffn(attention_output) + attention_output), probabilities


class DistilBertModel(EncoderModel):
    """DistilBERT as a member fills the encoder: where its layers sit and how it embeds; nothing else."""

    layers_path = "transformer.layer"

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(self.config)
        layers = nn.ModuleList(TransformerBlock(self.config) for _ in range(self.config.num_hidden_layers))
        self.transformer = LayerStack(self.config, layers)
        self.init_weights()

    def embed(self, batch, input_ids, token_type_ids, position_ids, inputs_embeds) -> Tensor:
        return self.embeddings(input_ids, position_ids)


def models() -> tuple[nn.Module, DistilBertModel]:
    torch.manual_seed(0)
    theirs = transformers.DistilBertModel(transformers.DistilBertConfig(**SIZES, dropout=0.0, attention_dropout=0.0))
    config = BertConfig(
        vocab_size=SIZES["vocab_size"],
        hidden_size=SIZES["dim"],
        num_hidden_layers=SIZES["n_layers"],
        num_attention_heads=SIZES["n_heads"],
        intermediate_size=SIZES["hidden_dim"],
        max_position_embeddings=SIZES["max_position_embeddings"],
    )
    ours = DistilBertModel(config)
    ours.load_state_dict(theirs.state_dict())  # strict: the same module names, key for key
    return theirs.eval(), ours.eval()


@pytest.mark.parametrize("padding_free", [True, False])
def test_a_member_filling_only_the_hooks_equals_transformers(padding_free):
    theirs, ours = models()
    ours.padding_free = padding_free
    input_ids = torch.randint(3, SIZES["vocab_size"], (3, 9))
    attention_mask = (torch.arange(9) < torch.tensor([[9], [5], [2]])).long()
    with torch.no_grad():
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        got = ours(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    real = attention_mask.bool()
    assert len(got.hidden_states) == len(expected.hidden_states) == SIZES["n_layers"] + 1
    for mine, reference in zip(
        (got.last_hidden_state, *got.hidden_states), (expected.last_hidden_state, *expected.hidden_states), strict=True
    ):
        torch.testing.assert_close(mine[real], reference[real], rtol=1e-5, atol=1e-5)
    assert got.pooler_output is None


def test_its_layer_stack_keeps_the_checkpointing_and_the_gradients_match():
    theirs, ours = models()
    ours.train().gradient_checkpointing_enable()
    assert ours.transformer.checkpointing.enabled and ours.is_gradient_checkpointing
    assert [ours.checkpointed(index) for index in range(SIZES["n_layers"])] == [True, True]
    theirs.train()
    input_ids = torch.randint(3, SIZES["vocab_size"], (2, 6))
    ours(input_ids=input_ids).last_hidden_state.square().sum().backward()
    theirs(input_ids=input_ids).last_hidden_state.square().sum().backward()
    for (name, mine), reference in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-4, atol=1e-5, msg=name)
