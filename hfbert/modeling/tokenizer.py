"""`BertTokenizer`: BERT's WordPiece tokenizer on the `tokenizers` library, matching transformers' BertTokenizerFast.

A folder with `tokenizer.json` loads that file; a folder with only `vocab.txt` (+ `tokenizer_config.json`) gets the
pipeline transformers builds for it: BertNormalizer -> BertPreTokenizer -> WordPiece -> `[CLS] A [SEP] B [SEP]`.
Padding and truncation follow transformers' rules (argument defaults, `model_max_length`, strategies).

    >>> tokenizer = BertTokenizer.from_pretrained("path/to/bert-base-uncased")  # doctest: +SKIP
    >>> tokenizer("Hello world!")["input_ids"]  # doctest: +SKIP
    [101, 7592, 2088, 999, 102]
    >>> tokenizer(["a", "b c"], padding=True, return_tensors="pt")["attention_mask"]  # doctest: +SKIP
    tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from converters.atomic_write import atomic_file
from converters.tokenizer_files import read_vocab_txt
from hfbert.modeling.tokenizer_files import (
    LARGE_INTEGER,
    NO_MAX_LENGTH,
    SPECIAL_TOKENS,
    added_tokens,
    check_wordpiece_class,
    model_max_length,
    read_tokenizer_options,
    token_text,
)

# The file reading moved to tokenizer_files.py; its public names stay importable from here.
__all__ = [
    "NO_MAX_LENGTH",
    "SPECIAL_TOKENS",
    "BatchEncoding",
    "BertTokenizer",
    "model_max_length",
    "read_tokenizer_options",
]

_PADDING = {True: "longest", "longest": "longest", "max_length": "max_length", False: None, "do_not_pad": None}
_TRUNCATION = {True: "longest_first", False: None, "do_not_truncate": None}
_TRUNCATION.update({name: name for name in ("longest_first", "only_first", "only_second")})


class BatchEncoding(dict):
    """The tokenizer's output: a dict (`input_ids`, `token_type_ids`, `attention_mask`, ...) with attribute access."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> BatchEncoding:
        """Move every tensor to `device` (only for `return_tensors="pt"`), as `transformers.BatchEncoding.to`."""
        return BatchEncoding({key: value.to(device) for key, value in self.items()})


class BertTokenizer:
    """WordPiece tokenizer for BERT checkpoints; `__call__` returns what `hfbert.BertModel` takes."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self._tokenizer = tokenizer
        # transformers sets padding/truncation per call and ignores what tokenizer.json stores; so do we.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        # One call's padding/truncation settings live on the shared backend until the call ends.
        self._lock = threading.Lock()
        self.special_tokens = {key: token_text(config.get(key), default) for key, default in SPECIAL_TOKENS.items()}
        self.model_max_length: int = model_max_length(config.get("model_max_length"), "the tokenizer config")
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        ids = {key: tokenizer.token_to_id(token) for key, token in self.special_tokens.items()}
        self.unk_token_id, self.sep_token_id, self.pad_token_id = ids["unk_token"], ids["sep_token"], ids["pad_token"]
        self.cls_token_id, self.mask_token_id = ids["cls_token"], ids["mask_token"]

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, revision: str | None = None
    ) -> BertTokenizer:
        """Load from a local folder, or a Hub repo id (downloaded and sha256-verified by `converters.hub`)."""
        directory = _local_directory(pretrained_model_name_or_path, revision)
        has_config = (directory / "tokenizer_config.json").is_file()
        own = read_tokenizer_options(directory / "tokenizer_config.json")
        legacy = "added_tokens_decoder" not in own  # a config from before transformers 4.34
        # transformers lets the legacy map override the config then.
        special_map = read_tokenizer_options(directory / "special_tokens_map.json") if legacy else {}
        config = {**own, **special_map}
        if (directory / "tokenizer.json").is_file():
            try:
                tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
            except Exception as error:  # the tokenizers library raises a bare Exception for a malformed file
                reason = " ".join(str(error).split())
                raise ValueError(f"{directory / 'tokenizer.json'}: not a valid tokenizer file ({reason})") from None
            # transformers (4.x and 5.x) rebuilds BERT's normalizer from tokenizer_config.json over the one
            # stored in tokenizer.json, so `do_lower_case` there wins when the two disagree.
            if has_config and _normalizer_options(tokenizer) is not None:
                tokenizer.normalizer = _bert_normalizer(config)
        elif (directory / "vocab.txt").is_file():
            check_wordpiece_class(own.get("tokenizer_class"), directory / "tokenizer_config.json")
            try:
                tokenizer = _build_from_vocab(directory / "vocab.txt", config)
            except UnicodeDecodeError as error:
                raise ValueError(f"{directory / 'vocab.txt'}: not valid UTF-8 ({error.reason})") from None
        else:
            raise FileNotFoundError(f"{directory}: no tokenizer.json or vocab.txt (one is needed to tokenize)")
        _add_tokens(tokenizer, added_tokens(config, own, special_map, directory))
        return cls(tokenizer, config)

    def __getattr__(self, name: str) -> str:
        # `tokenizer.mask_token` etc. give the special tokens' texts, as on transformers' tokenizers.
        if name in SPECIAL_TOKENS and "special_tokens" in self.__dict__:
            return self.__dict__["special_tokens"][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"BertTokenizer(vocab_size={self.vocab_size}, model_max_length={self.model_max_length})"

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of `text`, without [CLS]/[SEP]: `tokenize("Hello")` -> `["hello"]`."""
        with self._lock:
            return self._tokenizer.encode(text, add_special_tokens=False).tokens

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            index = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        # As transformers: only the five named special tokens (decode also skips other added special tokens).
        skip = {self.cls_token_id, self.sep_token_id, self.pad_token_id, self.mask_token_id, self.unk_token_id}
        skip = skip if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str | list[str]:
        """Text from ids (a list, a tensor, or a batch of them -> a list of texts): `decode([101, 7592, 102])`
        -> `"hello"`. Unlike transformers, special tokens are skipped unless `skip_special_tokens=False`."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        ids = [ids] if isinstance(ids, int) else list(ids)
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(row, skip_special_tokens) for row in ids]
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    def __call__(
        self,
        text: str | list[str],
        text_pair: str | list[str] | None = None,
        *,
        padding: bool | str = False,
        truncation: bool | str | None = None,
        max_length: int | None = None,
        return_tensors: str | None = None,
        return_offsets_mapping: bool = False,
        return_token_type_ids: bool = True,
        return_attention_mask: bool = True,
        padding_side: str = "right",
    ) -> BatchEncoding:
        """Encode one text (or pair) into lists, or a batch into lists of lists; `return_tensors="pt"` gives int64
        tensors with a batch dimension in both cases. `truncation=None` means: on if only `max_length` is given."""
        batched = isinstance(text, (list, tuple))
        if batched:
            if isinstance(text_pair, str):
                raise TypeError("text is a batch (a list), so text_pair must be a list of the same length, not a str")
            if text_pair is not None and len(text_pair) != len(text):
                raise ValueError(f"text has {len(text)} entries but text_pair has {len(text_pair)}")
            inputs = list(zip(text, text_pair, strict=True)) if text_pair is not None else list(text)
            if not inputs:
                raise ValueError("text is an empty list: nothing to tokenize")
        elif isinstance(text, str) and (text_pair is None or isinstance(text_pair, str)):
            # As transformers: an empty second text of a single example means no pair (a batch keeps it).
            inputs = [(text, text_pair) if text_pair else text]
        else:
            kinds = f"{type(text).__name__}, {type(text_pair).__name__}"
            raise TypeError(f"text (and text_pair) must be a str, or lists of str for a batch (got {kinds})")
        pad, truncate, max_length = self._strategies(padding, truncation, max_length)
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', not {padding_side!r}")
        if pad and self.pad_token_id is None:
            raise ValueError(f"padding needs the pad token {self.special_tokens['pad_token']!r} in the vocabulary")

        with self._lock:
            try:
                if truncate and self._can_shorten():
                    inputs = [self._shorten(item, max_length) if isinstance(item, str) else item for item in inputs]
                if truncate:
                    self._tokenizer.enable_truncation(max_length, strategy=truncate)
                if pad:
                    length = max_length if pad == "max_length" else None
                    pad_token = self.special_tokens["pad_token"]
                    self._tokenizer.enable_padding(
                        direction=padding_side, pad_id=self.pad_token_id, pad_token=pad_token, length=length
                    )
                encodings = self._tokenizer.encode_batch(inputs)
            except TypeError:
                _check_encodable(inputs)  # the library's TypeError does not say which text, nor why
                raise
            finally:
                self._tokenizer.no_truncation()
                self._tokenizer.no_padding()

        output = {"input_ids": [encoding.ids for encoding in encodings]}
        if return_token_type_ids:
            output["token_type_ids"] = [encoding.type_ids for encoding in encodings]
        if return_attention_mask:
            output["attention_mask"] = [encoding.attention_mask for encoding in encodings]
        if return_offsets_mapping:
            output["offset_mapping"] = [encoding.offsets for encoding in encodings]
        if return_tensors is not None:
            return BatchEncoding({key: _as_tensor(key, value, return_tensors) for key, value in output.items()})
        return BatchEncoding(output if batched else {key: value[0] for key, value in output.items()})

    def lowercase_first(self) -> None:
        """Lowercase every text before the normalizer runs, after added and special tokens are split off (so
        "[MASK]" in a text stays one token): what sentence-transformers' `do_lower_case` does to a tokenizer (it puts
        tokenizers' `Lowercase` in front of the normalizer, unless the normalizer has one already)."""
        normalizer = self._tokenizer.normalizer
        parts = _normalizer_parts(normalizer)
        if any(isinstance(part, normalizers.Lowercase) for part in parts):
            return
        self._tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *parts])

    def _can_shorten(self) -> bool:
        # Cutting a text at whitespace keeps every token before the cut only for pipelines that split words at
        # whitespace and normalise character by character: BERT's own (with a Lowercase in front, as
        # sentence-transformers' do_lower_case puts it).
        per_character = (normalizers.BertNormalizer, normalizers.Lowercase)
        return isinstance(self._tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer) and all(
            isinstance(part, per_character) for part in _normalizer_parts(self._tokenizer.normalizer)
        )

    def _shorten(self, text: str, max_length: int) -> str:
        """A prefix of `text` that truncates to the same tokens as the whole text, found at a cost proportional to
        `max_length`, not to the text: a 5 MB line would otherwise be tokenised whole (about 200 bytes of memory
        per character) before truncation keeps its first 512 tokens.

        The prefix ends at whitespace, where BERT always ends a word, so its tokens are exactly the first tokens
        of the whole text; it is used once it has more than `max_length` of them. Must hold `self._lock`."""
        budget = 8 * max_length + 256
        while budget < len(text):
            cut = max(text.rfind(space, 0, budget) for space in " \t\n\r")
            if cut > 0 and len(self._tokenizer.encode(text[:cut], add_special_tokens=False)) > max_length:
                return text[:cut]
            budget *= 4
        return text

    def _strategies(self, padding: Any, truncation: Any, max_length: int | None) -> tuple[str | None, str | None, int]:
        """transformers' `_get_padding_truncation_strategies`, for the strategies this tokenizer offers."""
        if truncation is None:  # legacy rule kept by transformers: `max_length` alone turns truncation on
            truncation = max_length is not None and padding is False
        for name, value, choices in (("padding", padding, _PADDING), ("truncation", truncation, _TRUNCATION)):
            if value not in choices:
                raise ValueError(f"{name}={value!r}: expected one of {list(choices)}")
        pad, truncate = _PADDING[padding], _TRUNCATION[truncation]
        if pad == "longest" and max_length is not None and not truncate:
            message = "max_length is ignored by padding=True without truncation (padding='max_length' uses it)"
            warnings.warn(message, stacklevel=3)
        if max_length is None:
            has_limit = self.model_max_length <= LARGE_INTEGER
            max_length = self.model_max_length
            pad = None if pad == "max_length" and not has_limit else pad
            truncate = truncate if has_limit else None
        return pad, truncate, max_length

    def save_pretrained(self, directory: str | os.PathLike) -> list[Path]:
        """Write tokenizer.json, vocab.txt, tokenizer_config.json and special_tokens_map.json (each atomically)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            tokenizer_json = self._tokenizer.to_str(pretty=True)
        vocab = sorted(self._tokenizer.get_vocab(with_added_tokens=False).items(), key=lambda item: item[1])
        config: dict[str, Any] = {"tokenizer_class": "BertTokenizer", **(_normalizer_options(self._tokenizer) or {})}
        config.update(self.special_tokens, model_max_length=self.model_max_length)
        config["clean_up_tokenization_spaces"] = self.clean_up_tokenization_spaces
        files = {
            "tokenizer.json": tokenizer_json,
            "vocab.txt": "".join(token + "\n" for token, _ in vocab),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps(self.special_tokens, indent=2, ensure_ascii=False) + "\n",
        }
        for name, content in files.items():
            _write_atomic(directory / name, content)
        return [directory / name for name in files]


def _local_directory(path_or_repo_id: str | os.PathLike, revision: str | None) -> Path:
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir() and revision is None:
        return path
    # converters.hub imports huggingface_hub only when a repo id is resolved
    from converters.hub import looks_like_local_path, resolve_checkpoint

    if not path.is_dir() and looks_like_local_path(path_or_repo_id):
        raise FileNotFoundError(f"{os.fspath(path_or_repo_id)}: no such tokenizer directory")

    return Path(resolve_checkpoint(path_or_repo_id, revision, include_tokenizer=True, include_weights=False))


def _build_from_vocab(vocab_file: Path, config: dict[str, Any]) -> Tokenizer:
    """The pipeline transformers' BertTokenizer(Fast)/BertConverter builds from vocab.txt and its options."""
    vocab = read_vocab_txt(vocab_file)
    specials = {key: token_text(config.get(key), default) for key, default in SPECIAL_TOKENS.items()}
    for key in ("unk_token", "cls_token", "sep_token"):
        if specials[key] not in vocab:
            raise ValueError(f"{vocab_file}: the {key} {specials[key]!r} is not in the vocabulary")
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=specials["unk_token"], max_input_chars_per_word=100))
    tokenizer.normalizer = _bert_normalizer(config)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    for _, spec in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0])):
        options = {key: spec[key] for key in ("single_word", "lstrip", "rstrip", "normalized") if key in spec}
        added = AddedToken(spec["content"], special=bool(spec.get("special")), **options)
        (tokenizer.add_special_tokens if spec.get("special") else tokenizer.add_tokens)([added])
    cls, sep = specials["cls_token"], specials["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    return tokenizer


def _normalizer_parts(normalizer: normalizers.Normalizer | None) -> list[normalizers.Normalizer]:
    """The normalizers a tokenizer applies, in order: the members of a Sequence, or the one normalizer."""
    if normalizer is None:
        return []
    return list(normalizer) if isinstance(normalizer, normalizers.Sequence) else [normalizer]


def _add_tokens(tokenizer: Tokenizer, tokens: list[AddedToken]) -> None:
    """Add each token unless the tokenizer has it already (tokenizer.json may list it)."""
    known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    for token in tokens:
        if token.content not in known:
            (tokenizer.add_special_tokens if token.special else tokenizer.add_tokens)([token])
            known.add(token.content)


def _bert_normalizer(config: dict[str, Any]) -> normalizers.Normalizer:
    # strip_accents=None lets the normalizer follow `lowercase`, as in the original BERT.
    return normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=config.get("tokenize_chinese_chars", True),
        strip_accents=config.get("strip_accents"),
        lowercase=config.get("do_lower_case", True),
    )


def _normalizer_options(tokenizer: Tokenizer) -> dict[str, Any] | None:
    """tokenizer_config.json's options for a BertNormalizer backend; None for any other normalizer."""
    state = json.loads(tokenizer.to_str()).get("normalizer") or {}
    if state.get("type") != "BertNormalizer":
        return None
    return {
        "do_lower_case": state["lowercase"],
        "strip_accents": state["strip_accents"],
        "tokenize_chinese_chars": state["handle_chinese_chars"],
    }


def _check_encodable(inputs: list[str | tuple[str, str]]) -> None:
    """Name the first text that is not valid Unicode (a lone surrogate, e.g. from undecodable command-line bytes)."""
    for index, item in enumerate(inputs):
        for text in item if isinstance(item, tuple) else (item,):
            if not isinstance(text, str):
                raise TypeError(f"text {index} is a {type(text).__name__}, not a str")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ValueError(
                    f"text {index} is not valid Unicode: {text[error.start]!r} at position {error.start} (a lone "
                    f"surrogate; was it decoded from bytes that are not UTF-8?)"
                ) from None


def _as_tensor(key: str, rows: list[list[Any]], return_tensors: str) -> Any:
    if return_tensors != "pt":
        raise ValueError(f"return_tensors={return_tensors!r}: only 'pt' (torch) is supported")
    import torch

    try:
        return torch.tensor(rows, dtype=torch.int64)
    except ValueError as error:
        raise ValueError(f"{key}: sequences of different lengths make no tensor; pass padding=True") from error


def _clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization`, used only when the config sets clean_up_tokenization_spaces."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")):
        text = text.replace(before, after)
    for suffix in ("'m", "'s", "'ve", "'re"):
        text = text.replace(" " + suffix, suffix)
    return text


def _write_atomic(path: Path, content: str) -> None:
    with atomic_file(path) as temporary:  # a reader never sees half a file
        temporary.write_text(content, encoding="utf-8")
