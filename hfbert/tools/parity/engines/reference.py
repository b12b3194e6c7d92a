"""transformers as the reference: its fp32 model, and the float64 twin that is the exact reference of every verdict.
What a member's float64 model needs beyond the cast (ModernBERT's exact eager kernel and rotary positions) is its
adapter's (reference_adapters.py); what a failing artifact is tried against, the causes' (../causes.py)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor


@contextmanager
def _quiet_transformers(transformers: Any) -> Iterator[None]:
    """No load reports or "Loading weights" bars from transformers while the reference models load."""
    logging = transformers.utils.logging
    verbosity = logging.get_verbosity()
    progress = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if progress:
            logging.enable_progress_bar()


@contextmanager
def no_tf32(active: bool) -> Iterator[None]:
    """TF32 off for CUDA matmuls and convolutions while `active` (a CUDA run): with it, fp32 products round to 10
    mantissa bits and every error measured against float64 would be TF32's, not the model's."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if active:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def load_reference(
    transformers: Any,
    class_name: str | type,
    directory: Path,
    attn: str,
    device: str,
    dtype: torch.dtype,
    **kwargs: Any,
) -> Any:
    """A transformers model (`class_name`: a class of transformers, or one) in eval mode, failing (rather than
    comparing against random weights) if it initialised any weight. The float64 one is the exact reference: its
    weights are the checkpoint's, cast up without loss."""
    model_class = getattr(transformers, class_name) if isinstance(class_name, str) else class_name
    with _quiet_transformers(transformers):
        model, info = model_class.from_pretrained(
            directory, attn_implementation=attn, output_loading_info=True, dtype=torch.float32, **kwargs
        )
    if info["missing_keys"] or info["mismatched_keys"]:
        missing = sorted(info["missing_keys"]) + [str(key) for key in info["mismatched_keys"]]
        raise ValueError(f"{directory}: transformers.{model_class.__name__} could not load {', '.join(missing[:5])}")
    return model.to(device=device, dtype=dtype).eval()


class _Float64(torch.nn.Module):
    """A parametrization: the parameter, cast to float64 each time its module reads it."""

    def forward(self, tensor: Tensor) -> Tensor:
        return tensor.to(torch.float64)


def float64_twin(model: Any) -> Any:
    """`model` (float32) in float64 without a float64 copy of its weights: its modules copied, their parameters the
    same tensors, each cast to float64 whenever a module reads it (exact: every float32 is a float64). It computes
    what `model.to(torch.float64)` computes, bit for bit (tests/test_parity.py), at one cast of the weights per
    forward (about 0.1 s for bert-base) instead of 880 MB more held in memory. Its config is its own, so its
    attention implementation can differ from the model's."""
    from torch.nn.utils import parametrize

    twin = copy.deepcopy(model, memo={id(parameter): parameter for parameter in model.parameters()})
    for module in list(twin.modules()):  # listed first: each parametrization adds modules
        if type(module) is torch.nn.Embedding and module.max_norm is None:
            # A lookup: the rows it reads, cast (the same values as a lookup in the cast table, without casting
            # bert-base's 30522 x 768 word embeddings, 188 MB, for a few rows at every forward).
            module.register_forward_hook(lambda _, __, output: output.to(torch.float64))
            continue
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and parameter.is_floating_point():
                parametrize.register_parametrization(module, name, _Float64(), unsafe=True)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point():
                module._buffers[name] = buffer.to(torch.float64)
    return twin.eval()
