"""DeBERTa-v2 / v3 tokenizers as transformers writes them, for the tests: a SentencePiece Unigram trained here on the
family's texts (so that they split into many ids), wrapped in transformers' own `DebertaV2Tokenizer`, and saved by
`save_pretrained` (tokenizer.json, tokenizer_config.json).

Two ways to the vocabulary: the tokenizers library's trainer (always available; its tokenizer.json then has no
SentencePiece charsmap, so transformers builds the plain normalizer), and the sentencepiece library's trainer
(`spm.model`, with the charsmap DeBERTa's published files carry), which skips, naming the package, where
sentencepiece or protobuf is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def deberta_tokenizer(directory: Path, model_max_length: int = 38, **options) -> Path:
    """transformers' DebertaV2Tokenizer over a Unigram vocabulary trained with the tokenizers library, saved to
    `directory`; `options` (do_lower_case, split_by_punct, add_prefix_space) go to its constructor."""
    import transformers
    from tokenizers import SentencePieceUnigramTokenizer

    from support.family import TEXTS

    trained = SentencePieceUnigramTokenizer()
    trained.train_from_iterator(TEXTS * 3, vocab_size=200, special_tokens=SPECIALS, unk_token="[UNK]")
    vocab = [tuple(entry) for entry in json.loads(trained.to_str())["model"]["vocab"]]
    tokenizer = transformers.DebertaV2Tokenizer(vocab=vocab, model_max_length=model_max_length, **options)
    tokenizer.save_pretrained(directory)
    return directory


def sentencepiece_tokenizer(directory: Path, model_max_length: int = 38, **options) -> Path:
    """transformers' DebertaV2Tokenizer converted from an `spm.model` trained with the sentencepiece library (as
    DeBERTa's published folders hold it), saved to `directory` with its tokenizer.json; skips without sentencepiece
    or protobuf."""
    spm = pytest.importorskip("sentencepiece", reason="sentencepiece is not installed (pip install sentencepiece)")
    pytest.importorskip("google.protobuf", reason="protobuf is not installed (pip install protobuf)")
    import transformers

    from support.family import TEXTS

    directory.mkdir(parents=True, exist_ok=True)
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(directory / "spm"),
        vocab_size=80,
        hard_vocab_limit=False,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        bos_piece="[CLS]",
        eos_piece="[SEP]",
        user_defined_symbols=["[MASK]"],
        minloglevel=2,
    )
    corpus.unlink()
    tokenizer = transformers.DebertaV2Tokenizer(
        vocab_file=str(directory / "spm.model"), model_max_length=model_max_length, **options
    )
    tokenizer.save_pretrained(directory)
    return directory
