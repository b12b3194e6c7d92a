"""What runs after the encoder in a sentence-transformers checkpoint, as PyTorch modules: `Pooling`, `Dense` and
`Normalize` in one `SentenceModules` (an `nn.Sequential`) whose `forward(token_embeddings, attention_mask)` gives one
vector per text. `hfbert.tools.sentence_transformers_pipeline` reads them from a checkpoint's files;
`hfbert.tools.embedding.Embedder` and parity's sentence statistics (`hfbert.tools.parity.sentences`) run them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# sentence-transformers' pooling modes, in the order its legacy booleans concatenate them.
POOLINGS = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")

__all__ = ["POOLINGS", "Dense", "Normalize", "Pooling", "SentenceModules", "pool"]


def pool(
    token_embeddings: Tensor, attention_mask: Tensor, pooling: str | Sequence[str], prompt_length: int = 0
) -> Tensor:
    """(batch, sequence, hidden) -> (batch, hidden x modes), sentence-transformers' `Pooling` formulas (several
    modes are concatenated in the given order). `prompt_length` > 0: that many leading tokens are left out, as
    `include_prompt=False` does."""
    modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
    original_mask = attention_mask
    if prompt_length:
        attention_mask = attention_mask.clone()
        attention_mask[:, :prompt_length] = 0  # right padding: the prompt is the first tokens
    accumulation = torch.float32 if token_embeddings.dtype in (torch.float16, torch.bfloat16) else None
    accumulation = accumulation or token_embeddings.dtype
    vectors = []
    for mode in modes:
        if mode == "cls":
            first = attention_mask.to(torch.int).argmax(dim=1)
            vectors.append(token_embeddings[torch.arange(len(first)), first])
        elif mode == "max":
            mask = attention_mask.unsqueeze(-1).expand_as(token_embeddings)
            vectors.append(token_embeddings.masked_fill(mask == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            total = (token_embeddings * mask).sum(dim=1, dtype=accumulation)
            count = torch.clamp(mask.sum(dim=1, dtype=accumulation), min=1e-9)
            vectors.append((total / (count if mode == "mean" else count.sqrt())).to(token_embeddings.dtype))
        elif mode == "weightedmean":
            mask = attention_mask.unsqueeze(-1).to(accumulation)
            positions = torch.arange(1, token_embeddings.shape[1] + 1, device=mask.device, dtype=accumulation)
            weights = positions.view(1, -1, 1) - original_mask.to(torch.int32).argmax(dim=1).view(-1, 1, 1)
            weighted = mask * weights
            total = (token_embeddings * weighted).sum(dim=1)
            vectors.append((total / torch.clamp(weighted.sum(dim=1), min=1e-9)).to(token_embeddings.dtype))
        elif mode == "lasttoken":
            length = token_embeddings.shape[1]
            values, indices = attention_mask.flip(1).max(1)
            indices = torch.where(values == 0, length - 1, indices)
            masked = token_embeddings * attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            vectors.append(masked[torch.arange(len(indices)), length - indices - 1])
        else:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {mode!r}")
    return torch.cat(vectors, dim=-1)


class Pooling(nn.Module):
    """sentence-transformers' Pooling module: `pool` in `modes` over token embeddings of `hidden_size`.
    `prompt_length`: leading tokens left out of the pooling, set by whoever prepends a prompt that `include_prompt`
    excludes (sentence-transformers passes it with each batch; here the prompt is one per pipeline)."""

    def __init__(self, modes: Sequence[str], hidden_size: int, include_prompt: bool = True) -> None:
        super().__init__()
        self.modes, self.hidden_size, self.include_prompt = tuple(modes), hidden_size, include_prompt
        self.prompt_length = 0

    @property
    def dimension(self) -> int:
        return self.hidden_size * len(self.modes)

    def forward(self, token_embeddings: Tensor, attention_mask: Tensor) -> Tensor:
        return pool(token_embeddings, attention_mask, self.modes, self.prompt_length)

    def describe(self) -> str:
        return f"Pooling({'+'.join(self.modes)}{'' if self.include_prompt else ', prompt excluded'})"


class Dense(nn.Module):
    """sentence-transformers' Dense module: activation_function(linear(x)) (+ x, or a projection of x, with a
    residual); its submodules are named as sentence-transformers names them, and so are their weights."""

    def __init__(
        self, linear: nn.Linear, activation_function: nn.Module, residual: nn.Linear | nn.Identity | None = None
    ) -> None:
        super().__init__()
        self.linear, self.activation_function, self.residual = linear, activation_function, residual

    def forward(self, vectors: Tensor) -> Tensor:
        output = self.activation_function(self.linear(vectors))
        return output if self.residual is None else output + self.residual(vectors)

    def describe(self) -> str:
        activation = type(self.activation_function).__name__
        return f"Dense({self.linear.in_features}->{self.linear.out_features}, {activation})"


class Normalize(nn.Module):
    """sentence-transformers' Normalize module: each vector to unit length."""

    def forward(self, vectors: Tensor) -> Tensor:
        return F.normalize(vectors, p=2, dim=-1)

    def describe(self) -> str:
        return "Normalize"


class SentenceModules(nn.Sequential):
    """A `Pooling`, then `Dense` and `Normalize` modules in order. The pooling runs in the token embeddings' dtype
    (half types accumulate in float32), what follows in the pipeline's `dtype`: float32 as read, another after
    `.to(dtype)`, as any module's."""

    def __init__(self, pooling: Pooling, *modules: Dense | Normalize) -> None:
        super().__init__(pooling, *modules)
        # Without a Dense there is no parameter whose dtype `.to()` would change: this empty buffer carries it.
        self.register_buffer("dtype_carrier", torch.empty(0, dtype=torch.float32), persistent=False)

    @property
    def pooling(self) -> Pooling:
        return self[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.dtype_carrier.dtype

    @property
    def dimension(self) -> int:
        """The size of the vectors it returns."""
        dense = [module for module in self if isinstance(module, Dense)]
        return dense[-1].linear.out_features if dense else self.pooling.dimension

    def forward(self, token_embeddings: Tensor, attention_mask: Tensor) -> Tensor:
        pooling, *after = self
        vectors = pooling(token_embeddings, attention_mask).to(self.dtype)
        for module in after:
            vectors = module(vectors)
        return vectors
