"""hfbert as the encoder of a `sentence_transformers.SentenceTransformer` (sentence-transformers 6.x).

sentence-transformers keeps the Hugging Face encoder in the `model` attribute of its `Transformer` module (also
read as `auto_model`). `use_hfbert_backbone` puts hfbert's encoder of the same family there (`hfbert.BertModel`,
`hfbert.RobertaModel`, `hfbert.XLMRobertaModel`, `hfbert.MPNetModel`, ...: config.json's model_type picks it) in
place of transformers' one, built on the very same weight tensors (no copy, same device and dtype). Tokenization,
truncation at `max_seq_length`, pooling, normalisation, batching and `encode` stay sentence-transformers' own.

    >>> from hfbert.tools.sentence_transformers_backbone import sentence_transformer_with_hfbert
    >>> model = sentence_transformer_with_hfbert("sentence-transformers/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> model.encode(["A sentence.", "Another one."]).shape  # doctest: +SKIP
    (2, 384)

sentence-transformers is imported inside the functions only: `import hfbert` never needs it. `model.save(...)`
calls the backbone's `save_pretrained(path, safe_serialization=...)`, which `hfbert.BertModel` must provide.
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any

import torch

from hfbert.modeling.attention import ATTENTION_IMPLEMENTATIONS, DEFAULT_ATTENTION
from hfbert.modeling.config import EncoderConfig
from hfbert.modeling.family import MEMBERS, member
from hfbert.modeling.model import BertModel

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer


def sentence_transformer_with_hfbert(
    model_name_or_path: str | os.PathLike,
    *,
    attn_implementation: str | None = None,
    **sentence_transformer_kwargs: Any,
) -> SentenceTransformer:
    """`SentenceTransformer(model_name_or_path, **sentence_transformer_kwargs)` running on hfbert.

    Every keyword (`device`, `revision`, `model_kwargs`, ...) means what it means to `SentenceTransformer`.
    """
    from sentence_transformers import SentenceTransformer

    # os.fspath: SentenceTransformer tests `"/" in model_name_or_path`, which a pathlib.Path does not support.
    model = SentenceTransformer(os.fspath(model_name_or_path), **sentence_transformer_kwargs)
    return use_hfbert_backbone(model, attn_implementation=attn_implementation)


def use_hfbert_backbone(model: SentenceTransformer, *, attn_implementation: str | None = None) -> SentenceTransformer:
    """Replace, in place, transformers' encoder (`BertModel`, `RobertaModel`, `XLMRobertaModel`,
    `CamembertModel`, `MPNetModel`) of every `Transformer` module of `model` by hfbert's encoder of the same family,
    holding the same parameters; return `model`.

    `attn_implementation` ("sdpa" or "eager") defaults to the one transformers was using when hfbert has it, and to
    hfbert's default (sdpa) where transformers' class runs eager only (MPNet's).

    Raises ValueError, before changing anything, when a `Transformer` module holds anything but such an encoder
    (another architecture, a task head such as BertForMaskedLM, an ONNX or OpenVINO backend) or there is none.
    Calling it again is a no-op.
    """
    from sentence_transformers.base.modules import Transformer

    modules = [module for module in model.modules() if isinstance(module, Transformer)]
    if not modules:
        raise ValueError("this SentenceTransformer has no Transformer module: there is no backbone to replace")
    encoders = {row.reference_class("model") for row in MEMBERS}  # transformers' encoder class of each member
    for module in modules:
        if not isinstance(module.model, BertModel) and type(module.model).__name__ not in encoders:
            model_type = getattr(getattr(module.model, "config", None), "model_type", None)
            raise ValueError(
                f"hfbert can only replace a transformers {', '.join(sorted(encoders))} backbone; this Transformer "
                f"module holds a {type(module.model).__name__} (model_type {model_type!r})"
            )
    for module in modules:
        if not isinstance(module.model, BertModel):
            _install(module, _hfbert_from_transformers(module.model, attn_implementation))
    return model


def _hfbert_from_transformers(encoder: torch.nn.Module, attn_implementation: str | None) -> BertModel:
    """hfbert's encoder of `encoder`'s family (`hfbert.BertModel`, `hfbert.XLMRobertaModel`, ...) that takes over
    `encoder`'s parameters (and its training mode)."""
    if attn_implementation is None:
        attn_implementation = getattr(encoder.config, "_attn_implementation", None)
        # A class that cannot run sdpa (transformers' MPNet) runs eager for want of it, not by the user's choice.
        if attn_implementation not in ATTENTION_IMPLEMENTATIONS or not getattr(encoder, "_supports_sdpa", False):
            attn_implementation = DEFAULT_ATTENTION
    config = EncoderConfig.from_object(encoder.config, source=f"{type(encoder).__name__}.config")
    with torch.device("meta"):  # no memory, no random init: the parameters are assigned below
        backbone = member(config.model_type).classes["model"](
            config,
            add_pooling_layer=getattr(encoder, "pooler", None) is not None,
            attn_implementation=attn_implementation,
        )
    # keep_vars + assign: the very Parameter objects move over, so an optimizer built before the swap still
    # holds them. load_state_dict sets requires_grad from the new module; restore which ones were frozen.
    frozen = {name for name, parameter in encoder.named_parameters() if not parameter.requires_grad}
    backbone.load_state_dict(encoder.state_dict(keep_vars=True), strict=True, assign=True)
    for name, parameter in backbone.named_parameters():
        parameter.requires_grad_(name not in frozen)
    return backbone.train(encoder.training)


def _install(module: Transformer, backbone: BertModel) -> None:
    module.model = backbone  # `auto_model` is a read-only property returning `model`
    # Transformer.__init__ records which feature keys the backbone's forward takes: None for transformers' (it
    # has **kwargs), so everything but sentence-transformers' bookkeeping would be passed. hfbert names its
    # arguments; list them, as __init__ does for such a forward, so only those keys are passed.
    parameters = set(inspect.signature(backbone.forward).parameters)
    module._declared_forward_params = parameters
    module.model_forward_params = parameters
    # Padding-free (flattened) batches need transformers' flash-attention interface, which hfbert does not have:
    # assigning re-runs that check, which now turns them off.
    module.unpad_inputs = module.unpad_inputs
