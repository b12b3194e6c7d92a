"""RoBERTa-family checkpoints as transformers writes them, for the tools' tests (issue #41): a small tokenizer trained
with the tokenizers library and wrapped in transformers' fast tokenizer class, a model of transformers' own class
with random weights far from its init (so that every difference shows), both saved by `save_pretrained`."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import AddedToken, ByteLevelBPETokenizer, SentencePieceUnigramTokenizer

from support.helpers import randomize_weights
from support.members import tiny_config

# The family's tiny config (`support.members`) as RoBERTa's: one token type, 40 positions (38 tokens after padding_idx
# 1).
TINY = tiny_config("roberta")


TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin the capital of Germany.",
    "query: how much protein should a female eat",
    "passage: As a general guideline, the average requirement of protein for women is 46 grams per day.",
    "Ein kleiner Satz auf Deutsch, und une phrase en français.",
    "Numbers like 3.14 and 2024 and symbols & < > stay.",
]
# As roberta-base's and xlm-roberta-base's tokenizer.json: <mask> takes the space before it.
MASK = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", MASK]
PREFIXES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}


def tokenizer_of(member: str, model_max_length: int = 38) -> transformers.PreTrainedTokenizerFast:
    """RoBERTa's byte-level BPE, or XLM-R's (and CamemBERT's) SentencePiece Unigram, in transformers' fast class."""
    if member == "roberta":
        trained = ByteLevelBPETokenizer()
        trained.train_from_iterator(TEXTS * 3, vocab_size=400, min_frequency=1, special_tokens=SPECIALS)
    else:
        trained = SentencePieceUnigramTokenizer()
        trained.train_from_iterator(TEXTS * 3, vocab_size=200, special_tokens=SPECIALS, unk_token="<unk>")
    fast_class = getattr(transformers, f"{PREFIXES[member]}TokenizerFast")
    return fast_class(tokenizer_object=trained._tokenizer, model_max_length=model_max_length)


def family_checkpoint(directory: Path, member: str = "roberta", task: str = "ForMaskedLM", **fields) -> Path:
    """transformers' `<Prefix><task>` of `member` (random weights) and its tokenizer, saved to `directory`."""
    tokenizer = tokenizer_of(member, fields.pop("model_max_length", 38))
    tokenizer.save_pretrained(directory)
    config_class = getattr(transformers, f"{PREFIXES[member]}Config")
    ids = {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}  # as roberta-base's
    config = config_class(**{**TINY, **ids, "vocab_size": len(tokenizer), "num_labels": 3, **fields})
    model = getattr(transformers, f"{PREFIXES[member]}{task}")(config)
    torch.manual_seed(0)
    randomize_weights(model).eval().save_pretrained(directory)
    return directory
