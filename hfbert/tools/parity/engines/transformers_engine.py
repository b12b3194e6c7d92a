"""transformers in a parity run: its model in the run's dtype (the yardstick of every verdict), and its float64 twin,
the exact reference (reference.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hfbert.tools.parity.engines.base import TorchEngine


def load(
    transformers: Any,
    directory: Path,
    *,
    has_mlm_head: bool,
    has_pooler: bool,
    dtype: torch.dtype,
    device: str,
    attn: str,
) -> tuple[TorchEngine, TorchEngine]:
    """transformers' model in `dtype`, and the exact reference: eager, once per batch for every output. Eager and
    sdpa differ in float64 by float64 rounding (1e-16 relative), nine orders of magnitude below the float32 errors
    it measures, so one eager run serves the sdpa rows too. In float32 runs it shares transformers' weights
    (float64_twin); a bf16 or fp16 run loads its own, from the checkpoint's float32 values."""
    from hfbert.tools.parity.reference import float64_twin, load_reference, with_pooler

    if has_mlm_head:
        their_class = transformers.BertForMaskedLM
        if has_pooler:
            their_class = with_pooler(their_class, transformers.models.bert.modeling_bert.BertPooler)
        options: dict[str, Any] = {}
    else:
        their_class, options = transformers.BertModel, {"add_pooling_layer": has_pooler}
    theirs = load_reference(transformers, their_class, directory, attn, device, dtype, **options)
    if dtype == torch.float32:
        exact = float64_twin(theirs)
    else:
        exact = load_reference(transformers, their_class, directory, attn, device, torch.float64, **options)
    exact.set_attn_implementation("eager")
    if has_mlm_head:
        return TorchEngine(theirs, theirs.bert, theirs.cls), TorchEngine(exact, exact.bert, exact.cls)
    return TorchEngine(theirs, theirs, None), TorchEngine(exact, exact, None)
