"""The closed set of `hidden_act` values hfbert supports, each with transformers' exact formula.

transformers resolves `hidden_act` through `transformers.activations.ACT2FN`; the functions below compute the
same expressions in the same order, so outputs match bit for bit (tests/test_config.py checks each one).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def gelu_python(x: Tensor) -> Tensor:
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_new(x: Tensor) -> Tensor:
    # The tanh approximation written out as in Google's original BERT code (and OpenAI GPT).
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_fast(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def gelu_pytorch_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


def quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,  # exact erf form, computed by PyTorch's kernel as transformers does
    "gelu_python": gelu_python,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "gelu_pytorch_tanh": gelu_pytorch_tanh,
    "quick_gelu": quick_gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}
