"""How checkpoint tensor names become hfbert parameter names: a few renames, kept as data.

Read the tables top to bottom; `map_key` applies them in that order:

1. wrappers added by training code (`module.` from DDP, `_orig_mod.` from torch.compile) are stripped;
2. the base-model prefix of the model's family (`bert.`; `roberta.` for RoBERTa, XLM-RoBERTa and CamemBERT;
   `mpnet.`) is stripped, giving a backbone-relative name (`embeddings.word_embeddings...`);
3. exactly `*.LayerNorm.gamma` / `*.LayerNorm.beta` (2018 TensorFlow-port names) become `weight` / `bias`;
   nothing else named gamma or beta is touched;
4. a name under a task head (`HEADS`) goes to that head when the model has it, and is ignored by design when
   it does not (a backbone has no head; a masked-LM model has no next-sentence head);
5. legacy buffers that old transformers versions saved are accepted only if their values equal what the
   model computes (checked in `check_legacy_buffer`);
6. everything else belongs to the backbone, under the model's base prefix (`""` for BertModel, `bert.` for the
   task models, as in transformers).

The families differ only in the names of the prefix and the heads: one `KeyLayout` each (a member's config class
names its own: `key_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from converters.errors import CheckpointError

WRAPPER_PREFIXES = ("module.", "_orig_mod.")
RENAMED_SUFFIXES = {
    ".LayerNorm.gamma": ".LayerNorm.weight",
    ".LayerNorm.beta": ".LayerNorm.bias",
}


@dataclass(frozen=True)
class KeyLayout:
    """How one model family names its tensors: the encoder's prefix in task models, the task heads by the prefix of
    their tensors (-> what they are, shown in the load report when skipped), and the masked-LM decoder's ties to
    backbone-relative names, made only with `tie_word_embeddings` as in transformers 5 (transformers stores neither
    tied copy; a decoder stored equal to its source is the tie written out, one stored different breaks the tie)."""

    prefix: str
    heads: dict[str, str] = field(hash=False)
    tied_decoder: dict[str, str] = field(hash=False)


MLM_HEAD, NSP_HEAD, CLASSIFIER_HEAD, QA_HEAD = "cls.predictions.", "cls.seq_relationship.", "classifier.", "qa_outputs."
BERT_KEYS = KeyLayout(
    prefix="bert.",
    heads={
        MLM_HEAD: "masked-LM pre-training head",
        NSP_HEAD: "next-sentence pre-training head",
        CLASSIFIER_HEAD: "classification head",
        QA_HEAD: "question-answering head",
    },
    tied_decoder={
        MLM_HEAD + "decoder.weight": "embeddings.word_embeddings.weight",
        MLM_HEAD + "decoder.bias": MLM_HEAD + "bias",
    },
)
LM_HEAD = "lm_head."
ROBERTA_KEYS = KeyLayout(
    prefix="roberta.",
    heads={
        LM_HEAD: "masked-LM head",
        CLASSIFIER_HEAD: "classification head",
        QA_HEAD: "question-answering head",
    },
    tied_decoder={
        LM_HEAD + "decoder.weight": "embeddings.word_embeddings.weight",
        LM_HEAD + "decoder.bias": LM_HEAD + "bias",
    },
)
# MPNet names its heads as RoBERTa does; its encoder's own names (`attention.attn.q`, `encoder.relative_attention_bias`)
# are module names, loaded as they are.
MPNET_KEYS = KeyLayout(prefix="mpnet.", heads=ROBERTA_KEYS.heads, tied_decoder=ROBERTA_KEYS.tied_decoder)
# ModernBERT's task models keep the encoder at `model.`; `head` is the prediction head (dense, activation, norm) of its
# masked-LM and classifiers alike, `decoder` the masked-LM's vocabulary projection (tied to the token embeddings, with
# a bias of its own), `classifier` the classifiers' last Linear.
PREDICTION_HEAD, DECODER = "head.", "decoder."
MODERNBERT_KEYS = KeyLayout(
    prefix="model.",
    heads={
        PREDICTION_HEAD: "prediction head",
        DECODER: "masked-LM decoder",
        CLASSIFIER_HEAD: "classification head",
    },
    tied_decoder={DECODER + "weight": "embeddings.tok_embeddings.weight"},
)
# DistilBERT's task models keep the encoder at `distilbert.` and their heads at the top level: the masked LM's
# `vocab_transform`, `vocab_layer_norm` and `vocab_projector` (tied to the word embeddings, a bias of its own), the
# classifiers' `pre_classifier` and `classifier`, question answering's `qa_outputs`.
DISTILBERT_KEYS = KeyLayout(
    prefix="distilbert.",
    heads={
        "vocab_transform.": "masked-LM head",
        "vocab_layer_norm.": "masked-LM head",
        "vocab_projector.": "masked-LM decoder",
        "pre_classifier.": "classification head",
        CLASSIFIER_HEAD: "classification head",
        QA_HEAD: "question-answering head",
    },
    tied_decoder={"vocab_projector.weight": "embeddings.word_embeddings.weight"},
)
# ELECTRA's task models keep the encoder at `electra.`: the discriminator's head `discriminator_predictions`, the
# generator's `generator_predictions` then `generator_lm_head` (its weight tied to the word embeddings, its bias its
# own), multiple choice's `sequence_summary` before `classifier`.
DISCRIMINATOR_HEAD, GENERATOR_HEAD = "discriminator_predictions.", "generator_predictions."
GENERATOR_DECODER, SEQUENCE_SUMMARY = "generator_lm_head.", "sequence_summary."
ELECTRA_KEYS = KeyLayout(
    prefix="electra.",
    heads={
        DISCRIMINATOR_HEAD: "replaced-token discriminator head",
        GENERATOR_HEAD: "generator (masked-LM) head",
        GENERATOR_DECODER: "generator (masked-LM) decoder",
        SEQUENCE_SUMMARY: "multiple-choice summary",
        CLASSIFIER_HEAD: "classification head",
        QA_HEAD: "question-answering head",
    },
    tied_decoder={GENERATOR_DECODER + "weight": "embeddings.word_embeddings.weight"},
)
# DeBERTa-v2's task models keep the encoder at `deberta.`: the masked LM's `cls.predictions` (transformers' legacy head,
# BERT's ties) or `lm_predictions` (the enhanced head over the word embeddings), the classifiers' `pooler` before
# `classifier`, `qa_outputs`. Published checkpoints also store `mask_predictions` (v3's replaced-token detection head,
# which no transformers class has).
DEBERTA_V2_KEYS = KeyLayout(
    prefix="deberta.",
    heads={
        MLM_HEAD: "masked-LM head (legacy)",
        "lm_predictions.": "masked-LM head",
        "mask_predictions.": "replaced-token-detection head (pre-training only)",
        "pooler.": "context pooler of the classification head",
        CLASSIFIER_HEAD: "classification head",
        QA_HEAD: "question-answering head",
    },
    tied_decoder=BERT_KEYS.tied_decoder,
)
# BERT's names under their older constant names.
BACKBONE_PREFIX, HEADS, TIED_DECODER = BERT_KEYS.prefix, BERT_KEYS.heads, BERT_KEYS.tied_decoder
# Buffers that transformers 3.1 - 4.30 stored and hfbert computes: name -> (what the stored value must be,
# that value for a given max_position_embeddings).
LEGACY_BUFFERS = {
    "embeddings.position_ids": ("0, 1, ..., max_position_embeddings - 1", lambda length: torch.arange(length)),
    "embeddings.token_type_ids": ("all zeros", lambda length: torch.zeros(length, dtype=torch.long)),
}


@dataclass(frozen=True)
class MappedKey:
    """What `map_key` decided for one checkpoint name."""

    source: str
    target: str | None  # hfbert name after the renames; None for ignored tensors
    action: str  # "loaded", "renamed", "ignored", "legacy buffer" (checked, then dropped)
    reason: str = ""


def normalize_name(name: str, layout: KeyLayout = BERT_KEYS) -> str:
    """Steps 1-3: strip wrappers and the family's prefix (`bert.`), rename LayerNorm gamma/beta.

    >>> normalize_name("module.bert.encoder.layer.0.output.LayerNorm.beta")
    'encoder.layer.0.output.LayerNorm.bias'
    """
    key = _unwrapped(name).removeprefix(layout.prefix)
    for old_suffix, new_suffix in RENAMED_SUFFIXES.items():
        if key.endswith(old_suffix):
            key = key[: -len(old_suffix)] + new_suffix
    return key


def _unwrapped(name: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    return name


def family_of_prefix(name: str, layouts: dict[str, KeyLayout]) -> str | None:
    """The family (the first model_type of `layouts`, model_type -> its names) whose encoder prefix `name` carries,
    or None.

    >>> family_of_prefix("roberta.embeddings.word_embeddings.weight", {"bert": BERT_KEYS, "roberta": ROBERTA_KEYS})
    'roberta'
    """
    unwrapped = _unwrapped(name)
    return next((model_type for model_type, layout in layouts.items() if unwrapped.startswith(layout.prefix)), None)


def head_of(normalized: str, layout: KeyLayout = BERT_KEYS) -> str | None:
    """The head prefix (of `layout.heads`) this (normalized) name belongs to, or None for a backbone name."""
    return next((prefix for prefix in layout.heads if normalized.startswith(prefix)), None)


def map_key(
    name: str, model_heads: tuple[str, ...] = (), base_prefix: str = "", layout: KeyLayout = BERT_KEYS
) -> MappedKey:
    """Map one checkpoint tensor name to a parameter name of a model of `layout`'s family that has `model_heads`
    (prefixes of `layout.heads`, or of a user's own head modules) and keeps its backbone under `base_prefix`.

    >>> map_key("bert.embeddings.LayerNorm.gamma").target
    'embeddings.LayerNorm.weight'
    >>> map_key("cls.predictions.bias").action
    'ignored'
    >>> map_key("cls.predictions.bias", model_heads=("cls.predictions.",), base_prefix="bert.").action
    'loaded'
    """
    key = normalize_name(name, layout)
    head = next((prefix for prefix in model_heads if key.startswith(prefix)), None) or head_of(key, layout)
    if head is not None and head not in model_heads:
        return MappedKey(name, None, "ignored", f"{layout.heads[head]}; the model has no such head")
    if key in LEGACY_BUFFERS:
        return MappedKey(
            name, key, "legacy buffer", f"computed by hfbert; stored value must be {LEGACY_BUFFERS[key][0]}"
        )
    target = key if head is not None else base_prefix + key
    return MappedKey(name, target, "loaded" if target == name else "renamed")


def check_legacy_buffer(mapped: MappedKey, tensor: Tensor, max_position_embeddings: int, file: str) -> None:
    """Raise unless a stored legacy buffer holds exactly what hfbert computes in its place."""
    description, expected_values = LEGACY_BUFFERS[mapped.target]
    name = mapped.source
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise CheckpointError(f"{file}: legacy buffer '{name}' has dtype {tensor.dtype}; expected an integer tensor")
    if tensor.numel() != max_position_embeddings or tensor.shape[-1] != max_position_embeddings:
        raise CheckpointError(
            f"{file}: legacy buffer '{name}' has shape {tuple(tensor.shape)}; expected "
            f"(1, {max_position_embeddings}) from max_position_embeddings in config.json"
        )
    values = tensor.reshape(-1).to(torch.long)
    expected = expected_values(max_position_embeddings)
    if not torch.equal(values, expected):
        first = int((values != expected).nonzero()[0])
        raise CheckpointError(
            f"{file}: legacy buffer '{name}' must be {description}, as hfbert computes it, but index {first} "
            f"holds {int(values[first])} (expected {int(expected[first])}). This checkpoint uses a position or "
            f"token-type scheme that standard BERT does not."
        )
