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
    reference: eager, once per batch for every output (why one eager run serves the sdpa rows too: hfbert.tools.parity),
    made exact by the member's reference adapter (reference_adapters.py: ModernBERT's float32 steps in float64). In
    float32 runs it shares transformers' weights (float64_twin); a bf16 or fp16 run loads its own, from the checkpoint's
    float32 values."""
    from hfbert.tools.parity.engines.reference import float64_twin, load_reference
    from hfbert.tools.parity.engines.reference_adapters import adapter

    model_class, options = spec.model_class(*reference_classes(transformers, spec.member))
    attn = reference_attention(model_class, spec.attn)
    theirs = load_reference(transformers, model_class, directory, attn, spec.device, spec.dtype, **options)
    if spec.dtype == torch.float32:
        exact = float64_twin(theirs)
    else:
        exact = load_reference(transformers, model_class, directory, attn, spec.device, torch.float64, **options)
    exact = adapter(spec.model_type).make_exact(transformers, exact)
    return spec.engine(theirs), spec.engine(exact)


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
