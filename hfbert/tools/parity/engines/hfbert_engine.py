"""hfbert in a parity run, in each mode: as built (`nn.Linear`), "packed" (`optimize_for_inference`, precision
"highest") or "fast" (precision "high"); the masked-LM model when the checkpoint has that head."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfbert.tools.parity.engines.base import ModelSpec, TorchEngine


def load(
    directory: Path, spec: ModelSpec, linear_kernel: str | None, ignore_auto_map: bool = False, config: Any = None
) -> tuple[TorchEngine, str]:
    """hfbert's model and what its linear layers run on ("F.linear", "oneDNN, packed", ...). `ignore_auto_map` and
    `config` (the checkpoint's config.json, already read: it is not read again): as `from_pretrained` takes them."""
    from hfbert.modeling.model import BertPooler

    classes = spec.member.classes
    model_class, loading = spec.model_class(classes["masked-lm"], classes["model"], BertPooler)
    loading |= {"dtype": spec.dtype, "device": spec.device, "attn_implementation": spec.attn}
    model = model_class.from_pretrained(directory, config=config, ignore_auto_map=ignore_auto_map, **loading)
    ran_kernel = "F.linear"
    if linear_kernel in ("packed", "fast"):
        from hfbert.inference import optimize_for_inference, packed_layers

        # kernels="always": the packed or fused kernels at every row count, not only where they were measured
        # faster here, so that the verdict covers whatever another machine's measurement may pick.
        options = {"precision": "high"} if linear_kernel == "fast" else {}
        optimize_for_inference(model, kernels="always", **options)
        forms = set(packed_layers(model).values())
        ran_kernel = "oneDNN, " + " and ".join(sorted(forms)) if forms else "F.linear"
    return spec.engine(model), ran_kernel
