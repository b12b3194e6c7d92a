"""The family's members as the tests build them: one tiny config (`TINY`, with each member's own differences in
`DIFFERENCES`), transformers' class of each member and task (by `Member.reference_class`), checkpoints written by
transformers itself (random weights far from its init, so that every difference shows, saved by `save_pretrained`),
and a tokenizer per member for the tools.

Every member is a row of `hfbert.modeling.family.MEMBERS`; `tests/test_family_conformance.py` runs over all of them,
so a new row is tested as soon as it exists. A row whose tiny config must differ from `TINY` gets an entry in
`DIFFERENCES`; one without a tokenizer here fails the tools' tests, naming `TOKENIZERS`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from hfbert.modeling.family import MEMBERS, member

from .helpers import randomize_weights, with_minilm_tokenizer

# The family's tiny config: 2 layers of hidden 32, 4 heads, 40 positions; small enough for every test.
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=40,
    num_labels=3,
)
# Where a member's tiny config must differ from TINY, as its published checkpoints do.
DIFFERENCES: dict[str, dict] = {
    "bert": {"type_vocab_size": 2},  # sentence pairs: segments 0 and 1
    "roberta": {"type_vocab_size": 1},  # one token type, as roberta-base's (pad 1, <s> 0, </s> 2: the defaults)
    "xlm-roberta": {"type_vocab_size": 1},
    "camembert": {"type_vocab_size": 1},
    "mpnet": {"layer_norm_eps": 1e-5},  # all-mpnet-base-v2's; MPNet has no token types
    # Special ids inside the tiny vocabulary (the tokenizer's, `support.modernbert_tokenizer`); a window of 2 columns
    # each side, shorter than the test batches, so that the local layer (layer 1 of 2) differs from a global one.
    "modernbert": {
        "pad_token_id": 0,
        "bos_token_id": 1,
        "cls_token_id": 1,
        "eos_token_id": 2,
        "sep_token_id": 2,
        "local_attention": 4,
    },
    # A factorized embedding narrower than the layers (electra-small's 128 -> 256), so `embeddings_project` exists.
    "electra": {"embedding_size": 16, "type_vocab_size": 2},
    # transformers' DistilBertConfig reads hidden_size, num_attention_heads and num_hidden_layers as dim, n_heads and
    # n_layers, but not intermediate_size: the feed-forward width under its own name.
    "distilbert": {"hidden_dim": 37},
    # deberta-v3-base's attention: relative c2p and p2c terms, shared keys, normalised relative embeddings, no
    # absolute positions; 8 log buckets (exact distances to 4), so that the test batches' 9 tokens reach the log ones.
    "deberta-v2": {
        "relative_attention": True,
        "position_buckets": 8,
        "pos_att_type": ["p2c", "c2p"],
        "share_att_key": True,
        "norm_rel_ebd": "layer_norm",
        "position_biased_input": False,
    },
}
MODEL_TYPES = [row.model_type for row in MEMBERS]
# Every (model_type, task) of the family, in the table's order.
CLASSES = [(row.model_type, task) for row in MEMBERS for task in row.classes]


def tiny_config(model_type: str, **fields) -> dict:
    """`model_type`'s tiny config fields: TINY, the member's differences, then `fields`."""
    return {**TINY, **DIFFERENCES.get(model_type, {}), **fields}


def reference_class(model_type: str, task: str = "model"):
    """transformers' class of `model_type`'s `task` (`Member.reference_class` names it)."""
    import transformers

    return getattr(transformers, member(model_type).reference_class(task))


def reference_config(model_type: str, **fields):
    """transformers' config of `model_type` with its tiny fields."""
    import transformers

    return getattr(transformers, member(model_type).reference + "Config")(**tiny_config(model_type, **fields))


def num_labels_of(task: str) -> int:
    """Question answering's head gives start and end logits: two labels; every other head gets TINY's three."""
    return 2 if task == "question-answering" else TINY["num_labels"]


def reference_checkpoint(directory: Path, model_type: str, task: str = "model", seed: int = 0, **fields) -> Path:
    """transformers' `model_type` class of `task` with tiny fields and random weights, saved to `directory`."""
    fields = {"num_labels": num_labels_of(task), **fields}
    model = reference_class(model_type, task)(reference_config(model_type, **fields))
    torch.manual_seed(seed)
    randomize_weights(model).eval().save_pretrained(directory)
    return directory


# -- tokenizers: one per member, as its published checkpoints ship it ---------------------------------------------


def _minilm(directory: Path, request) -> None:
    with_minilm_tokenizer(directory)  # uncased WordPiece, 30522 tokens


def _trained(model_type: str) -> Callable[[Path, object], None]:
    def write(directory: Path, request) -> None:
        from support.family import tokenizer_of

        tokenizer_of(model_type).save_pretrained(directory)  # trained here, in transformers' fast class

    return write


def _all_mpnet(directory: Path, request) -> None:
    from support.mpnet import TOKENIZER_FILES

    real = request.getfixturevalue("real_mpnet")  # skips, naming the packages, where they are not installed
    for name in TOKENIZER_FILES:
        shutil.copy(real / name, directory / name)


def _modernbert(directory: Path, request) -> None:
    from support.modernbert_tokenizer import modernbert_tokenizer

    modernbert_tokenizer(directory)  # ModernBERT's shape: byte-level BPE, [CLS] / [SEP], no token types


def _electra(directory: Path, request) -> None:
    with_minilm_tokenizer(directory)  # uncased WordPiece, as google/electra-*'s vocab.txt, under ELECTRA's class name
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "ElectraTokenizer"}), "utf-8")


def _distilbert(directory: Path, request) -> None:
    with_minilm_tokenizer(directory)  # uncased WordPiece, as distilbert-base-uncased's vocab.txt, under its class name
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": "DistilBertTokenizer"}), "utf-8")


def _deberta_v2(directory: Path, request) -> None:
    from support.deberta import deberta_tokenizer

    deberta_tokenizer(directory)  # DeBERTa-v2's SentencePiece Unigram in transformers' class, [CLS] / [SEP]


TOKENIZERS: dict[str, Callable[[Path, object], None]] = {
    "bert": _minilm,
    "roberta": _trained("roberta"),
    "xlm-roberta": _trained("xlm-roberta"),
    "camembert": _trained("camembert"),
    "mpnet": _all_mpnet,
    "modernbert": _modernbert,
    "electra": _electra,
    "distilbert": _distilbert,
    "deberta-v2": _deberta_v2,
}


def with_tokenizer(directory: Path, model_type: str, request) -> Path:
    """`model_type`'s tokenizer files written into `directory` (`request`: the test's, for fixtures it needs)."""
    if model_type not in TOKENIZERS:
        raise LookupError(f"no tokenizer for model_type {model_type!r}: add one to TOKENIZERS in {__file__}")
    directory.mkdir(parents=True, exist_ok=True)
    TOKENIZERS[model_type](directory, request)
    return directory


def tokenized_checkpoint(directory: Path, model_type: str, task: str, request, **fields) -> Path:
    """`reference_checkpoint` with the member's tokenizer beside it: the vocabulary sized to the tokenizer, and the
    tokenizer's `model_max_length` cut to 38, the longest input every member's 40 positions take."""
    import transformers

    with_tokenizer(directory, model_type, request)
    tokenizer_config = directory / "tokenizer_config.json"
    saved = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    saved["model_max_length"] = TINY["max_position_embeddings"] - 2
    tokenizer_config.write_text(json.dumps(saved, indent=2), encoding="utf-8")
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(directory))
    return reference_checkpoint(directory, model_type, task, vocab_size=vocab_size, **fields)
