"""A small tokenizer folder shaped like ModernBERT's (answerdotai/ModernBERT-base, gte-modernbert-base,
nomic-ai/modernbert-embed-base), for tests that need one without the Hub.

ModernBERT's tokenizer.json is a byte-level BPE (OLMo's vocabulary) with an NFC normalizer, the ByteLevel
pre-tokenizer (no prefix space) and decoder, a `[CLS] $A [SEP] ($B [SEP])` TemplateProcessing post-processor, and
added tokens: runs of spaces and `|||IP_ADDRESS|||` (plain, normalized), `<|padding|>` / `<|endoftext|>`,
`[UNK] [CLS] [SEP] [PAD] [MASK]` (special, `[MASK]` taking the space before it) and `[unused0]`... (special). Its
tokenizer_config.json (written by transformers 4.x) names `PreTrainedTokenizerFast`, lists `added_tokens_decoder`
and `model_input_names: ["input_ids", "attention_mask"]`, and sets `clean_up_tokenization_spaces: true` and
`model_max_length: 8192`; special_tokens_map.json names the five special tokens. This folder has the same shape,
with a vocabulary of `VOCAB_SIZE` tokens trained on `CORPUS`, so a model of `vocab_size >= VOCAB_SIZE` takes its ids.

`modernbert_tokenizer(folder, tokenizer_class="TokenizersBackend")` leaves the files as transformers 5's
`save_pretrained` writes them instead: tokenizer_class `TokenizersBackend`, no added_tokens_decoder, no
model_input_names, no special_tokens_map.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# English with the punctuation and contractions a decoder's clean-up would touch, accents (composed and not, for
# NFC), other scripts, emoji, code and runs of spaces.
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! This is a small corpus for a byte-level tokenizer, trained here for the tests.",
    "ModernBERT reads long documents, code and the web; it was trained on two trillion tokens.",
    "It's a dog's life, isn't it? We're here, they've gone, I'm staying.",
    "Numbers: 3.14159, 1,000,000 and -42; e-mail me@example.com or see https://example.org/path?q=1",
    "café naïve résumé Ångström über Straße, cafe\u0301 combining",
    "emoji 👍🏽 and 🤗 faces 😀 in the text",
    "中文字符 日本語のテキスト 한국어 문장 Ελληνικά русский עברית",
    "def main():\n    return 42  # indented code\n\tand a tab",
    "the the the and and of of to to in in is is that that for for with with on on",
]
# The trained byte-level BPE: the 256 bytes and the merges above them.
TRAINED_SIZE = 330
# Added after training, in order (ModernBERT's kinds of added token; ids from TRAINED_SIZE on): (token, special).
_ADDED = [
    (AddedToken("|||IP_ADDRESS|||", normalized=True, special=False), False),
    (AddedToken("<|padding|>", normalized=False, special=True), True),
    (AddedToken("   ", normalized=True, special=False), False),
    (AddedToken("  ", normalized=True, special=False), False),
    (AddedToken("<|endoftext|>", normalized=False, special=True), True),
    (AddedToken("[UNK]", normalized=False, special=True), True),
    (AddedToken("[CLS]", normalized=False, special=True), True),
    (AddedToken("[SEP]", normalized=False, special=True), True),
    (AddedToken("[PAD]", normalized=False, special=True), True),
    # As ModernBERT's: "[MASK]" takes the space before it, so "a [MASK]" masks the word with its space.
    (AddedToken("[MASK]", lstrip=True, normalized=False, special=True), True),
    (AddedToken("[unused0]", normalized=False, special=True), True),
    (AddedToken("[unused1]", normalized=False, special=True), True),
]
VOCAB_SIZE = TRAINED_SIZE + len(_ADDED)
# The ids of the special tokens, fixed by TRAINED_SIZE and the order above (checked when the folder is written).
SPECIAL_TOKEN_IDS = {token.content: TRAINED_SIZE + index for index, (token, _) in enumerate(_ADDED)}
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
}


def trained_tokenizer() -> Tokenizer:
    """The tokenizers-library pipeline of ModernBERT's tokenizer.json, trained on CORPUS (deterministic)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_SIZE,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    # The corpus must yield enough merges for TRAINED_SIZE, or every added token's id would move.
    assert tokenizer.get_vocab_size() == TRAINED_SIZE, tokenizer.get_vocab_size()
    for token, special in _ADDED:
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    cls, sep = SPECIAL_TOKEN_IDS["[CLS]"], SPECIAL_TOKEN_IDS["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0",
        pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tokenizer


def modernbert_tokenizer(directory: Path, tokenizer_class: str = "PreTrainedTokenizerFast") -> Path:
    """Write a ModernBERT-shaped tokenizer folder into `directory` (made if missing) and return it.

    Written by transformers' `PreTrainedTokenizerFast.save_pretrained`, then, for the default `tokenizer_class`,
    given the Hub's tokenizer_config.json fields (see the module docstring) and special_tokens_map.json. Special
    token ids: `SPECIAL_TOKEN_IDS`; the whole vocabulary: `VOCAB_SIZE` tokens."""
    import transformers  # only the writing needs it

    tokenizer = trained_tokenizer()
    for content, index in SPECIAL_TOKEN_IDS.items():
        assert tokenizer.token_to_id(content) == index, content
    directory.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=8192, clean_up_tokenization_spaces=True, **SPECIAL_TOKENS
    )
    fast.save_pretrained(directory)
    # transformers 5 builds an empty vocabulary from some constructor arguments without a word: make sure it kept
    # the trained one, which splits a plain sentence into many pieces, none unknown.
    ids = fast("The quick brown fox jumps over the lazy dog.")["input_ids"]
    assert len(ids) > 5 and len(fast) == VOCAB_SIZE and SPECIAL_TOKEN_IDS["[UNK]"] not in ids, ids
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "TokenizersBackend", config  # what transformers 5 writes
    if tokenizer_class == "TokenizersBackend":
        return directory
    saved = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    config.pop("backend", None)  # transformers 5's own field; the Hub files have none
    config.update(
        tokenizer_class=tokenizer_class,
        model_input_names=["input_ids", "attention_mask"],
        added_tokens_decoder={str(token.pop("id")): token for token in saved},
    )
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    flags = {token["content"]: token for token in config["added_tokens_decoder"].values()}
    special_map = {
        key: {name: flags[text][name] for name in ("content", "lstrip", "normalized", "rstrip", "single_word")}
        for key, text in SPECIAL_TOKENS.items()
    }
    (directory / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")
    return directory
