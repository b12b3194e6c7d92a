"""transformers in a parity run: its model in the run's dtype (the yardstick of every verdict), and its float64 twin,
the exact reference (reference.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from hfbert.modeling.family import Member
from hfbert.tools.parity.engines.base import ModelSpec, TorchEngine


def load(transformers: Any, directory: Path, spec: ModelSpec) -> tuple[TorchEngine, TorchEngine]:
    """transformers' model in `spec.dtype` (in `spec.attn` where it has it: `reference_attention`), and the exact
    reference: eager, once per batch for every output (why one eager run serves the sdpa rows too:
    hfbert.tools.parity), with rotary positions in float64 (`exact_rotary`). In float32 runs it shares
    transformers' weights (float64_twin); a bf16 or fp16 run loads its own, from the checkpoint's float32 values."""
    from hfbert.tools.parity.engines.reference import exact_rotary, float64_twin, load_reference

    model_class, options = spec.model_class(*reference_classes(transformers, spec.member))
    attn = reference_attention(model_class, spec.attn)
    theirs = load_reference(transformers, model_class, directory, attn, spec.device, spec.dtype, **options)
    if spec.dtype == torch.float32:
        exact = float64_twin(theirs)
    else:
        exact = load_reference(transformers, model_class, directory, attn, spec.device, torch.float64, **options)
    exact.set_attn_implementation(exact_eager(transformers) if spec.model_type in EAGER_NOT_FLOAT64 else "eager")
    exact_rotary(exact)  # ModernBERT's: transformers rounds it to float32 in float64 models too
    return spec.engine(theirs), spec.engine(exact)


# Members whose transformers eager kernel does not compute in float64 when the model does: ModernBERT's takes the
# softmax in float32 (so its "float64" probabilities carry float32's rounding), and its float64 mask minimum, cast to
# float32, becomes -inf: a pad query whose window holds only pads gets NaN, which the next layer spreads to every
# token through the pad keys. Their float64 reference runs `exact_eager` instead.
EAGER_NOT_FLOAT64 = frozenset({"modernbert"})
EXACT_EAGER = "hfbert_exact_eager"


def exact_eager(transformers: Any) -> str:
    """The name of an eager attention kernel registered with transformers (its `AttentionInterface`, with
    transformers' sdpa mask builder for it) that computes in the query's dtype throughout: scores, the masked keys
    at that dtype's lowest value, softmax, and the probabilities it returns for the attention maps. It is
    transformers' eager formula without the float32 step; tests/test_parity_modernbert.py checks the float64 model
    on it against the same model on transformers' own float64 sdpa."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    def attention(
        module: Any,
        query: Any,
        key: Any,
        value: Any,
        attention_mask: Any,
        scaling: float,
        dropout: float = 0.0,
        **_: Any,
    ) -> tuple[Any, Any]:
        scores = torch.matmul(query, key.transpose(2, 3)) * scaling
        if attention_mask is not None:  # boolean, True where a key may be attended (sdpa's mask)
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        probabilities = torch.softmax(scores, dim=-1)
        return torch.matmul(probabilities, value).transpose(1, 2).contiguous(), probabilities

    AttentionInterface.register(EXACT_EAGER, attention)
    AttentionMaskInterface.register(EXACT_EAGER, sdpa_mask)
    return EXACT_EAGER


def reference_attention(model_class: type, attn: str) -> str:
    """The attention transformers' `model_class` runs for a run asking `attn`: the same, or eager where the class
    has no sdpa (MPNet's), since transformers refuses to build it otherwise. The comparison then holds hfbert's sdpa
    against transformers' eager, both judged against the float64 run."""
    return attn if attn == "eager" or getattr(model_class, "_supports_sdpa", False) else "eager"


def reference_classes(transformers: Any, member: Member) -> tuple[type, type, type | None]:
    """transformers' masked-LM model, backbone and pooler of a family member, by the names the family table gives
    them (BertForMaskedLM, BertModel, BertPooler; RobertaForMaskedLM, ...)."""
    masked_lm = getattr(transformers, member.reference_class("masked-lm"))
    backbone = getattr(transformers, member.reference_class("model"))
    pooler = getattr(sys.modules[backbone.__module__], f"{member.reference}Pooler", None)  # ModernBERT has none
    return masked_lm, backbone, pooler
