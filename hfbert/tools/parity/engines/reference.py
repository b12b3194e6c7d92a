"""transformers as the reference: its fp32 model, and the float64 twin that is the exact reference of every verdict."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hfbert.tools.parity.engines.base import TorchEngine


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


def exact_rotary(model: Any) -> Any:
    """`model` (a transformers model in float64 with rotary positions: ModernBERT's) with its rotary positions
    computed in float64, returned. transformers computes them in float32 also in a float64 model: the angles
    (positions x inverse frequencies), their cosines and sines, and the queries and keys it rotates, rounded to
    float32 first (`apply_rotary_pos_emb`). Its own float32 model shares those roundings, so a reference that keeps
    them judges transformers against itself there and every exact port (hfbert's angles are float64) as off by them:
    at 4,096 positions they are as large as float32's whole error. Here the inverse frequencies are recomputed in
    float64 from config.json's bases, the angles and their cosines and sines computed in float64, and, while this
    model runs, its module's `apply_rotary_pos_emb` rotates float64 queries and keys as they are (any other dtype
    goes to transformers' own, unchanged). A model without rotary positions is returned as it is."""
    import sys
    import types

    owners = [name.rpartition(".")[0] for name, _ in model.named_modules() if name.rsplit(".", 1)[-1] == "rotary_emb"]
    if not owners:
        return model
    rotaries = [model.get_submodule(owner).rotary_emb for owner in owners]
    config = rotaries[0].config
    size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for rotary in rotaries:
        for kind, rope_type in rotary.rope_type.items():
            if rope_type != "default":  # a scaled scheme's frequencies are transformers' to compute
                continue
            base = config.rope_parameters[kind]["rope_theta"]
            buffer = getattr(rotary, f"{kind}_inv_freq")
            setattr(rotary, f"{kind}_inv_freq", inverse_frequencies(base, size, torch.float64).to(buffer.device))
        rotary.forward = types.MethodType(_rotary_in_float64, rotary)

    module = sys.modules[type(rotaries[0]).__module__]
    original = module.apply_rotary_pos_emb

    def rotate(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1) -> tuple[Tensor, Tensor]:
        if q.dtype != torch.float64:
            return original(q, k, cos, sin, unsqueeze_dim)
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + module.rotate_half(q) * sin, k * cos + module.rotate_half(k) * sin

    def install(*_: Any) -> None:
        module.apply_rotary_pos_emb = rotate

    def restore(*_: Any) -> None:
        module.apply_rotary_pos_emb = original

    for owner in owners:  # the encoder that runs the layers: parity calls it directly, the heads through it
        encoder = model.get_submodule(owner)
        encoder.register_forward_pre_hook(install)
        encoder.register_forward_hook(restore, always_call=True)
    return model


def inverse_frequencies(base: float, size: int, dtype: torch.dtype) -> Tensor:
    """Default rotary inverse frequencies for heads of `size`, as transformers computes them, in `dtype`."""
    return 1.0 / (base ** (torch.arange(0, size, 2, dtype=dtype) / size))


def _rotary_in_float64(self: Any, x: Tensor, position_ids: Tensor, layer_type: str) -> tuple[Tensor, Tensor]:
    """transformers' rotary embedding's forward with the angles, cosines and sines in float64 (`exact_rotary`)."""
    frequencies = getattr(self, f"{layer_type}_inv_freq").to(device=x.device, dtype=torch.float64)
    angles = position_ids[..., None].to(torch.float64) * frequencies
    angles = torch.cat((angles, angles), dim=-1)
    scaling = getattr(self, f"{layer_type}_attention_scaling")
    return (angles.cos() * scaling).to(x.dtype), (angles.sin() * scaling).to(x.dtype)


# Position offsets tried when an artifact's token outputs fail: positions counted from 1 (a port that adds an offset
# BERT does not have), or from 2 (RoBERTa's padding_idx + 1 carried into BERT). Negative offsets would need position
# -1, which no embedding lookup has. For a RoBERTa-family model, whose positions start at pad_token_id + 1, the one
# offset tried is back to 0: BERT's positions carried into a RoBERTa port.
POSITION_OFFSETS = (1, 2)
FITS_BETTER = 10.0  # the shifted float64 run must fit the artifact this many times better in RMS error


@dataclass
class PositionOffset:
    """Positions shifted by `offset` fit an artifact's last hidden state far better than the battery's positions."""

    offset: int
    shifted_rms: float  # the artifact's RMS error against float64 run with position_ids + offset
    plain_rms: float  # ... against float64 at the battery's positions
    first_position: int = 0  # where the model's positions start: 0, RoBERTa's pad_token_id + 1

    def describe(self) -> str:
        start = self.first_position + self.offset
        if self.first_position:
            why = (
                f"BERT's positions carried into a port of a model padded at {self.first_position - 1} (RoBERTa, MPNet)"
            )
        else:
            why = "RoBERTa's padding_idx + 1" if self.offset == 2 else "an offset such as RoBERTa's padding_idx"
            why += ", carried into a BERT port"
        return (
            f"position ids offset by {self.offset}: the float64 reference run with position_ids + {self.offset} fits "
            f"the artifact {self.plain_rms / self.shifted_rms:,.0f}x better (RMS error {self.shifted_rms:.3g}, "
            f"against {self.plain_rms:.3g} at positions from {self.first_position}): its positions count from "
            f"{start}, not {self.first_position} ({why})"
        )


def position_offset(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    exact: TorchEngine,
    batch: dict[str, Tensor],
    max_positions: int,
    first_position: int = 0,
) -> PositionOffset | None:
    """The offset (of POSITION_OFFSETS; -first_position for a model whose positions start at first_position) for
    which the float64 reference, run on `batch` (right-padded, no position_ids) with the positions from
    first_position + offset, fits the last hidden state that `run` (an artifact) gives for `batch` FITS_BETTER times
    better than with the battery's positions; None when none does."""
    real = batch["attention_mask"].bool()
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms(positions: Tensor | None) -> float:
        shifted = batch if positions is None else {**batch, "position_ids": positions}
        return float((ours - exact.run(shifted)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    plain = rms(None)
    width = batch["input_ids"].shape[1]
    for offset in (-first_position,) if first_position else POSITION_OFFSETS:
        if width + first_position + offset > max_positions:
            continue
        shifted = rms((torch.arange(width) + first_position + offset).expand_as(batch["input_ids"]))
        if shifted * FITS_BETTER < plain:
            return PositionOffset(offset, shifted, plain, first_position)
    return None


@dataclass
class PaddingBlindPositions:
    """Each column's position, pads counted, fits a left-padded batch through an artifact far better than the
    positions counted over real tokens that its model gives."""

    blind_rms: float  # the artifact's RMS error against float64 run with position_ids = first_position + column
    plain_rms: float  # ... against float64 at the battery's positions (real tokens from first_position)
    first_position: int

    def describe(self) -> str:
        return (
            f"positions ignore padding: on a left-padded batch the float64 reference run with each column's "
            f"position ({self.first_position}, {self.first_position + 1}, ..., pads counted) fits the artifact "
            f"{self.plain_rms / self.blind_rms if self.blind_rms else math.inf:,.0f}x better (RMS error "
            f"{self.blind_rms:.3g}, against "
            f"{self.plain_rms:.3g} at positions over real tokens): its positions count columns, not real tokens, "
            f"which only right padding hides (RoBERTa's create_position_ids_from_input_ids counts real tokens from "
            f"padding_idx + 1)"
        )


def padding_blind_positions(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]],
    exact: TorchEngine,
    batch: dict[str, Tensor],
    max_positions: int,
    first_position: int,
) -> PaddingBlindPositions | None:
    """Whether the last hidden state that `run` (an artifact that computes its own positions, as RoBERTa-family and
    MPNet graphs do) gives for `batch` (left-padded, with the battery's position_ids) is what the float64 reference
    computes with every column's position from `first_position`, FITS_BETTER times better than at the battery's
    positions; None when not, or when those positions do not fit in the table."""
    real = batch["attention_mask"].bool()
    width = batch["input_ids"].shape[1]
    if width + first_position > max_positions:
        return None
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms(positions: Tensor) -> float:
        fed = {**batch, "position_ids": positions}
        return float((ours - exact.run(fed)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    plain = rms(batch["position_ids"])
    blind = rms((torch.arange(width) + first_position).expand_as(batch["input_ids"]))
    return PaddingBlindPositions(blind, plain, first_position) if blind * FITS_BETTER < plain else None


@dataclass
class AttentionMismatch:
    """Another window or rotary base on the local / global layers (ModernBERT's) fits a failing artifact's last hidden
    state far better than the checkpoint's config.json."""

    change: str  # what differs, in words
    fitted_rms: float  # the artifact's RMS error against float64 run with that change
    plain_rms: float  # ... against float64 as config.json says

    def describe(self) -> str:
        return (
            f"{self.change}: the float64 reference run so fits the artifact "
            f"{self.plain_rms / self.fitted_rms if self.fitted_rms else math.inf:,.0f}x better (RMS error "
            f"{self.fitted_rms:.3g}, against {self.plain_rms:.3g} as config.json says)"
        )


@contextmanager
def _changed(model: Any, local_attention: int | None = None, thetas: dict[str, float] | None = None) -> Iterator[None]:
    """transformers' ModernBertModel with another window width (its config's `local_attention`, which its masks
    read) or other rotary bases (its rotary embedding's per-layer-type inverse frequencies, computed as transformers
    computes them, in the buffer's dtype: float64 after `exact_rotary`), put back afterwards."""
    config, rotary = model.config, model.rotary_emb
    saved_width = config.local_attention
    saved = {kind: getattr(rotary, f"{kind}_inv_freq").clone() for kind in (thetas or {})}
    try:
        if local_attention is not None:
            config.local_attention = local_attention
        for kind, theta in (thetas or {}).items():
            buffer = getattr(rotary, f"{kind}_inv_freq")
            buffer.copy_(inverse_frequencies(theta, 2 * buffer.numel(), buffer.dtype))
        yield
    finally:
        config.local_attention = saved_width
        for kind, frequencies in saved.items():
            getattr(rotary, f"{kind}_inv_freq").copy_(frequencies)


def attention_mismatch(
    run: Callable[[dict[str, Tensor]], dict[str, Tensor]], exact: TorchEngine, batch: dict[str, Tensor]
) -> AttentionMismatch | None:
    """For a member with local and global layers (transformers' model has `rotary_emb` and `layer_types`): the
    change of window or rotary base under which the float64 reference fits the last hidden state that `run` (an
    artifact) gives for `batch` FITS_BETTER times better than as config.json says, the best such; None otherwise."""
    model = exact.backbone
    config = model.config
    if not hasattr(model, "rotary_emb") or "sliding_attention" not in set(getattr(config, "layer_types", ()) or ()):
        return None
    real = batch["attention_mask"].bool()
    ours = run(batch)["last_hidden_state"].double()[real]

    def rms() -> float:
        return float((ours - exact.run(batch)["last_hidden_state"].double().cpu()[real]).square().mean().sqrt())

    half = config.local_attention // 2
    local, full = (config.rope_parameters[kind]["rope_theta"] for kind in ("sliding_attention", "full_attention"))
    variants = [
        (
            f"a window of {half + 1} columns each side, not {half} (flash-attention's `local_attention // 2 + 1`, "
            f"whose bound is exclusive, carried into an attention mask, whose bound is inclusive)",
            {"local_attention": 2 * (half + 1)},
        ),
        (f"a window of {half - 1} columns each side, not {half}", {"local_attention": 2 * (half - 1)}),
        ("no window: the local layers attend to every token", {"local_attention": 2 * config.max_position_embeddings}),
        (
            f"the local layers' rotary base is {full:g} (the global layers'), not {local:g}",
            {"thetas": {"sliding_attention": full}},
        ),
        (
            f"the global layers' rotary base is {local:g} (the local layers'), not {full:g}",
            {"thetas": {"full_attention": local}},
        ),
        (
            f"the rotary bases are swapped (local {full:g}, global {local:g})",
            {"thetas": {"sliding_attention": full, "full_attention": local}},
        ),
    ]
    plain = rms()
    found = None
    for change, options in variants:
        if options.get("local_attention", 2) < 2:
            continue
        with _changed(model, **options):
            fitted = rms()
        if fitted * FITS_BETTER < plain and (found is None or fitted < found.fitted_rms):
            found = AttentionMismatch(change, fitted, plain)
    return found
