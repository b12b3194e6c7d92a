"""hfbert in a parity run, in each mode: as built (`nn.Linear`), "packed" (`optimize_for_inference`, precision
"highest") or "fast" (precision "high"); the masked-LM model when the checkpoint has that head."""

from __future__ import annotations

from pathlib import Path

import torch

from hfbert.tools.parity.engines.base import TorchEngine


def load(
    directory: Path,
    *,
    has_mlm_head: bool,
    has_pooler: bool,
    dtype: torch.dtype,
    device: str,
    attn: str,
    linear_kernel: str | None,
    ignore_auto_map: bool = False,
) -> tuple[TorchEngine, str]:
    """hfbert's model and what its linear layers run on ("F.linear", "oneDNN, packed", ...). `ignore_auto_map`:
    as `from_pretrained` takes it."""
    from hfbert.modeling.heads import BertForMaskedLM
    from hfbert.modeling.model import BertModel, BertPooler
    from hfbert.tools.parity.reference import with_pooler

    if has_mlm_head:
        our_class = with_pooler(BertForMaskedLM, BertPooler) if has_pooler else BertForMaskedLM
        model = our_class.from_pretrained(
            directory, dtype=dtype, device=device, attn_implementation=attn, ignore_auto_map=ignore_auto_map
        )
    else:
        model = BertModel.from_pretrained(
            directory,
            dtype=dtype,
            device=device,
            attn_implementation=attn,
            add_pooling_layer=has_pooler,
            ignore_auto_map=ignore_auto_map,
        )
    ran_kernel = "F.linear"
    if linear_kernel in ("packed", "fast"):
        from hfbert.inference import optimize_for_inference, packed_layers

        # kernels="always": the packed or fused kernels at every row count, not only where they were measured
        # faster here, so that the verdict covers whatever another machine's measurement may pick.
        options = {"precision": "high"} if linear_kernel == "fast" else {}
        optimize_for_inference(model, kernels="always", **options)
        forms = set(packed_layers(model).values())
        ran_kernel = "oneDNN, " + " and ".join(sorted(forms)) if forms else "F.linear"
    if has_mlm_head:
        return TorchEngine(model, model.bert, model.cls.predictions), ran_kernel
    return TorchEngine(model, model, None), ran_kernel
