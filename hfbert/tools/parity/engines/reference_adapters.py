"""Where the float64 reference reaches into transformers: one adapter per family member, each naming what it touches.

transformers' model cast to float64 is the exact reference of every verdict (reference.py), and for most members it
is exact as it is: its eager kernel computes in the query's dtype. Some members' transformers code rounds to float32
on the way even in a float64 model, and parity corrects exactly those steps, which means reaching into transformers'
internals (a module function, a buffer's name, a config field). Each adapter here does that for one member and lists
every name it reaches for (`touch_points`): tests/test_reference_adapters.py resolves them on a model transformers
builds, so an upgrade of transformers that moves one fails there, naming it, instead of quietly changing verdicts.

- `ReferenceAdapter`: members whose float64 model is exact as transformers runs it (BERT, RoBERTa, XLM-RoBERTa,
  CamemBERT, MPNet, ELECTRA, DistilBERT): eager, nothing touched.
- `ModernBertAdapter`: ModernBERT's eager kernel takes the softmax in float32 and its float64 mask minimum becomes
  -inf in float32 (`exact_eager`), and its rotary positions are computed in float32 (`exact_rotary`); its local and
  global layers give the causes module (../causes.py) other windows and rotary bases to try (`variants`).
- `DebertaV2Adapter`: the relative-position table cast to float64 where DeBERTa reads it; other bucket sizes,
  reaches and relative terms for the causes module (`variants`).

`adapter(model_type)` is the one door: a member with no adapter is refused by name, so a new member states its
caveats (or that it has none) here before parity runs it.
"""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import Tensor

EXACT_EAGER = "hfbert_exact_eager"


class ReferenceAdapter:
    """A member whose transformers model, cast to float64, computes in float64 throughout: its reference runs
    transformers' own eager kernel, untouched."""

    # Every name in transformers this adapter reads or replaces, as "where: what" for the upgrade check.
    touch_points: tuple[str, ...] = ()

    def make_exact(self, transformers: Any, model: Any) -> Any:
        """`model` (a transformers model in float64) set to compute its reference: eager attention here."""
        model.set_attn_implementation("eager")
        return model

    def variants(self, backbone: Any) -> list[tuple[str, AbstractContextManager]]:
        """Changes of the reference's attention (each: what changed, in words, and a context in which `backbone`,
        transformers' float64 backbone, runs so) that the causes module tries against a failing artifact. None for
        a member with one kind of layer."""
        return []

    def missing(self, transformers: Any, backbone: Any) -> list[str]:
        """The touch points that `transformers` (the installed package) and `backbone` (a model it built for this
        member) no longer have: empty while this adapter still fits the installed transformers."""
        return []


class ModernBertAdapter(ReferenceAdapter):
    """ModernBERT: transformers' eager kernel does not compute in float64 when the model does. It takes the softmax in
    float32 (so its "float64" probabilities carry float32's rounding), and its float64 mask minimum, cast to float32,
    becomes -inf: a pad query whose window holds only pads gets NaN, which the next layer spreads to every token
    through the pad keys. Its rotary positions are computed in float32 too. So the reference runs `exact_eager` and
    `exact_rotary`."""

    touch_points = (
        "transformers.AttentionInterface.register: the exact eager kernel, by name",
        "transformers.AttentionMaskInterface.register: its mask builder",
        "transformers.masking_utils.sdpa_mask: the boolean mask the kernel takes",
        "modeling_modernbert.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): replaced while the encoder runs",
        "modeling_modernbert.rotate_half: the rotation, called from the replacement",
        "backbone.rotary_emb: the encoder's rotary embedding module",
        "rotary_emb.forward(x, position_ids, layer_type): replaced by a float64 one",
        "rotary_emb.rope_type: {layer type: rope type}",
        "rotary_emb.<layer type>_inv_freq: the inverse frequencies (a buffer)",
        "rotary_emb.<layer type>_attention_scaling: the scaling of cos and sin",
        "config.rope_parameters[<layer type>]['rope_theta']: each layer type's base",
        "config.layer_types: 'sliding_attention' and 'full_attention'",
        "config.local_attention: the window its masks read",
    )

    def make_exact(self, transformers: Any, model: Any) -> Any:
        model.set_attn_implementation(exact_eager(transformers))
        return exact_rotary(model)

    def variants(self, backbone: Any) -> list[tuple[str, AbstractContextManager]]:
        config = backbone.config
        half = config.local_attention // 2
        local, full = (config.rope_parameters[kind]["rope_theta"] for kind in ("sliding_attention", "full_attention"))
        changes = [
            (
                f"a window of {half + 1} columns each side, not {half} (flash-attention's `local_attention // 2 + 1`, "
                f"whose bound is exclusive, carried into an attention mask, whose bound is inclusive)",
                {"local_attention": 2 * (half + 1)},
            ),
            (f"a window of {half - 1} columns each side, not {half}", {"local_attention": 2 * (half - 1)}),
            (
                "no window: the local layers attend to every token",
                {"local_attention": 2 * config.max_position_embeddings},
            ),
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
        return [
            (change, _changed(backbone, **options))
            for change, options in changes
            if options.get("local_attention", 2) >= 2
        ]

    def missing(self, transformers: Any, backbone: Any) -> list[str]:
        gone = []
        for name in ("AttentionInterface", "AttentionMaskInterface"):
            if not callable(getattr(getattr(transformers, name, None), "register", None)):
                gone.append(f"transformers.{name}.register")
        masking = sys.modules.get("transformers.masking_utils") or _import("transformers.masking_utils")
        if not callable(getattr(masking, "sdpa_mask", None)):
            gone.append("transformers.masking_utils.sdpa_mask")
        rotary = getattr(backbone, "rotary_emb", None)
        if rotary is None:
            return [*gone, f"{type(backbone).__name__}.rotary_emb"]
        module = sys.modules[type(rotary).__module__]
        for name in ("apply_rotary_pos_emb", "rotate_half"):
            if not callable(getattr(module, name, None)):
                gone.append(f"{module.__name__}.{name}")
        if not any(name.startswith(module.__name__) for name in gone):
            gone += _rotation_differs(module)
        parameters = list(inspect.signature(type(rotary).forward).parameters)
        if parameters[1:] != ["x", "position_ids", "layer_type"]:
            gone.append(f"{type(rotary).__name__}.forward(x, position_ids, layer_type): now {parameters[1:]}")
        config = backbone.config
        kinds = set(getattr(config, "layer_types", None) or ())
        if kinds != {"sliding_attention", "full_attention"}:
            gone.append(f"config.layer_types: sliding_attention and full_attention, now {sorted(kinds)}")
        if not isinstance(getattr(config, "local_attention", None), int):
            gone.append("config.local_attention")
        if not isinstance(getattr(rotary, "rope_type", None), dict):
            gone.append(f"{type(rotary).__name__}.rope_type")
        for kind in sorted(kinds):
            for name in (f"{kind}_inv_freq", f"{kind}_attention_scaling"):
                if not hasattr(rotary, name):
                    gone.append(f"{type(rotary).__name__}.{name}")
            try:
                float(config.rope_parameters[kind]["rope_theta"])
            except (AttributeError, KeyError, TypeError):
                gone.append(f"config.rope_parameters[{kind!r}]['rope_theta']")
        return gone


class DebertaV2Adapter(ReferenceAdapter):
    """DeBERTa-v2: transformers' eager kernel computes in float64 (its score scale is a float32 square root in every
    dtype, which is DeBERTa's definition, and hfbert's), but its encoder reads the relative-position table as a
    weight (`rel_embeddings.weight`), not by lookup: the float64 twin casts only what embeddings look up
    (reference.py), so that table is cast where it is read. Its relative positions give the causes module
    (../causes.py) other bucket sizes, reaches and relative terms to try (`variants`): what a port gets wrong."""

    touch_points = (
        "backbone.encoder.rel_embeddings: the relative-position table, read as .weight (an nn.Embedding)",
        "backbone.encoder.position_buckets, .max_relative_positions: what get_rel_pos buckets every layer's "
        "distances with, read at forward time",
        "DisentangledSelfAttention.position_buckets, .max_relative_positions: its own bucketing, where it is given "
        "no relative positions",
        "DisentangledSelfAttention.pos_ebd_size: the half-width of the table its c2p / p2c terms read",
        "DisentangledSelfAttention.pos_att_type: which relative terms it adds (and so their scale)",
    )

    def make_exact(self, transformers: Any, model: Any) -> Any:
        from torch.nn.utils import parametrize

        model.set_attn_implementation("eager")
        table = getattr(model.base_model.encoder, "rel_embeddings", None)  # none without relative_attention
        if table is not None and not parametrize.is_parametrized(table, "weight"):
            parametrize.register_parametrization(table, "weight", _Float64Cast(), unsafe=True)
        return model

    def variants(self, backbone: Any) -> list[tuple[str, AbstractContextManager]]:
        encoder = backbone.encoder
        if not getattr(encoder, "relative_attention", False):
            return []
        buckets, reach = encoder.position_buckets, encoder.max_relative_positions
        terms = list(self._attentions(backbone)[0].pos_att_type)
        changes: list[tuple[str, dict[str, Any]]] = []
        if buckets > 0:
            changes.append(
                (
                    f"no log buckets: distances clamped at {buckets} as they are (position_buckets read as -1), "
                    f"not put in {buckets} log buckets reaching {reach}",
                    {"buckets": -1},
                )
            )
            # The table has 2 x position_buckets rows: a port that takes its row count for the bucket count.
            for other in (2 * buckets, buckets // 2):
                if other >= 2 and other // 2 < reach - 1:  # what the log bucket formula takes
                    changes.append(
                        (
                            f"log buckets of {other}, not {buckets} (position_buckets), on the same table",
                            {"buckets": other},
                        )
                    )
            for other in (2 * reach, reach // 2):
                if buckets // 2 < other - 1:
                    changes.append(
                        (f"log buckets reaching {other}, not {reach} (max_relative_positions)", {"reach": other})
                    )
        elif reach // 2 >= 1:  # no buckets: the reach is the table's half-width
            changes.append(
                (
                    f"distances clamped at {reach // 2}, not {reach} (max_relative_positions), on the same table",
                    {"reach": reach // 2, "span": reach // 2},
                )
            )
        if len(terms) > 1:
            names = {"c2p": "content-to-position", "p2c": "position-to-content"}
            for term in terms:
                kept = [other for other in terms if other != term]
                changes.append(
                    (
                        f"no {term} ({names.get(term, term)}) term: only {', '.join(kept)}, scaled as pos_att_type "
                        f"{kept} scales it",
                        {"terms": kept},
                    )
                )
        if terms:
            changes.append(
                ("no relative terms: content-to-content scores only, scaled by sqrt(head size)", {"terms": []})
            )
        return [(change, self._changed(backbone, **options)) for change, options in changes]

    def missing(self, transformers: Any, backbone: Any) -> list[str]:
        encoder = getattr(backbone, "encoder", None)
        if not getattr(backbone.config, "relative_attention", False):
            return []
        name = type(backbone).__name__
        table = getattr(encoder, "rel_embeddings", None)
        gone = [] if isinstance(table, torch.nn.Embedding) else [f"{name}.encoder.rel_embeddings"]
        for field in ("position_buckets", "max_relative_positions"):
            if not isinstance(getattr(encoder, field, None), int):
                gone.append(f"{name}.encoder.{field}")
        attentions = self._attentions(backbone)
        if not attentions:
            return [*gone, f"{name}: no attention module with pos_att_type"]
        attention = attentions[0]
        kind = type(attention).__name__
        for field, kinds in (
            ("position_buckets", int),
            ("max_relative_positions", int),
            ("pos_ebd_size", int),
            ("pos_att_type", list),
        ):
            if not isinstance(getattr(attention, field, None), kinds):
                gone.append(f"{kind}.{field}")
        try:
            source = inspect.getsource(type(attention))
        except (OSError, TypeError):
            source = ""
        for read in ("self.pos_ebd_size", "self.pos_att_type"):
            if read not in source:
                gone.append(f"{kind}: no longer reads {read}")
        if not gone:
            gone += self._bucketing_unread(backbone)
        return gone

    @staticmethod
    def _attentions(backbone: Any) -> list[Any]:
        """DeBERTa's disentangled attention modules in `backbone` (those with relative terms to add), in order."""
        return [module for module in backbone.modules() if hasattr(module, "pos_att_type")]

    @staticmethod
    @contextmanager
    def _changed(
        backbone: Any,
        buckets: int | None = None,
        reach: int | None = None,
        span: int | None = None,
        terms: list[str] | None = None,
    ) -> Iterator[None]:
        """transformers' DebertaV2Model bucketing its relative distances with other `buckets` or `reach` (the encoder's
        fields, which get_rel_pos reads, and each attention's own), reading `span` rows each side of the table's middle,
        or adding only the relative `terms`, put back afterwards. The table itself is not touched: a wrong port still
        loads the checkpoint's."""
        encoder, attentions = backbone.encoder, DebertaV2Adapter._attentions(backbone)
        fields = ("position_buckets", "max_relative_positions", "pos_ebd_size", "pos_att_type")
        saved = [(encoder, {name: getattr(encoder, name) for name in fields[:2]})]
        saved += [(attention, {name: getattr(attention, name) for name in fields}) for attention in attentions]
        try:
            for module, _ in saved:
                if buckets is not None:
                    module.position_buckets = buckets
                if reach is not None:
                    module.max_relative_positions = reach
            for attention in attentions:
                if span is not None:
                    attention.pos_ebd_size = span
                if terms is not None:
                    attention.pos_att_type = list(terms)
            yield
        finally:
            for module, values in saved:
                for name, value in values.items():
                    setattr(module, name, value)

    @classmethod
    def _bucketing_unread(cls, backbone: Any) -> list[str]:
        """Whether the encoder's get_rel_pos still buckets with its `position_buckets` field at forward time: under
        `_changed(backbone, buckets=-1)` its distances over the whole reach must be plain query - key."""
        encoder = backbone.encoder
        width = min(encoder.max_relative_positions, backbone.config.max_position_embeddings)
        hidden = torch.zeros(1, width, 1)
        with cls._changed(backbone, buckets=-1):
            try:
                distances = encoder.get_rel_pos(hidden)
            except TypeError as error:
                return [f"{type(encoder).__name__}.get_rel_pos(hidden_states): {error}"]
        positions = torch.arange(width)
        if not torch.equal(distances.reshape(width, width), positions[:, None] - positions[None, :]):
            return [f"{type(encoder).__name__}.get_rel_pos: no longer buckets with its position_buckets field"]
        return []


class _Float64Cast(torch.nn.Module):
    """A parametrization: the weight, cast to float64 each time it is read."""

    def forward(self, tensor: Tensor) -> Tensor:
        return tensor.to(torch.float64)


def _import(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _rotation_differs(module: types.ModuleType) -> list[str]:
    """transformers' `apply_rotary_pos_emb` checked against the formula `exact_rotary` replaces it with, on a toy
    input: a change of its arguments or of its formula would make the replacement compute something else."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 3, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    cos, sin = (torch.randn(1, 3, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    try:
        theirs = module.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    except TypeError as error:
        return [f"{module.__name__}.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim): {error}"]
    ours = _rotate(module, q, k, cos, sin, 1)
    if not all(torch.allclose(a.to(torch.float64), b, rtol=0, atol=1e-6) for a, b in zip(theirs, ours, strict=True)):
        return [f"{module.__name__}.apply_rotary_pos_emb: no longer q * cos + rotate_half(q) * sin"]
    return []


ADAPTERS: dict[str, ReferenceAdapter] = {
    "bert": ReferenceAdapter(),
    "roberta": ReferenceAdapter(),
    "xlm-roberta": ReferenceAdapter(),
    "camembert": ReferenceAdapter(),
    "mpnet": ReferenceAdapter(),
    "modernbert": ModernBertAdapter(),
    "electra": ReferenceAdapter(),
    "distilbert": ReferenceAdapter(),
    "deberta-v2": DebertaV2Adapter(),
}


def adapter(model_type: str) -> ReferenceAdapter:
    """The float64 reference's adapter for `model_type` (config.json's); a member without one is refused by name."""
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise ValueError(
            f"model type {model_type!r} has no float64 reference adapter: state its transformers caveats (or "
            f"ReferenceAdapter() for none) in hfbert/tools/parity/engines/reference_adapters.py's ADAPTERS"
        ) from None


# -- ModernBERT ------------------------------------------------------------------------------------------------------
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
        return _rotate(module, q, k, cos, sin, unsqueeze_dim)

    def install(*_: Any) -> None:
        module.apply_rotary_pos_emb = rotate

    def restore(*_: Any) -> None:
        module.apply_rotary_pos_emb = original

    for owner in owners:  # the encoder that runs the layers: parity calls it directly, the heads through it
        encoder = model.get_submodule(owner)
        encoder.register_forward_pre_hook(install)
        encoder.register_forward_hook(restore, always_call=True)
    return model


def _rotate(
    module: types.ModuleType, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int
) -> tuple[Tensor, Tensor]:
    """Rotary positions applied to queries and keys in their own dtype, with `module`'s `rotate_half`."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + module.rotate_half(q) * sin, k * cos + module.rotate_half(k) * sin


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


__all__ = [
    "ADAPTERS",
    "DebertaV2Adapter",
    "ModernBertAdapter",
    "ReferenceAdapter",
    "adapter",
    "exact_eager",
    "exact_rotary",
]
