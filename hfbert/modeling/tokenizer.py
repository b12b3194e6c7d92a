"""The BERT family's tokenizers on the `tokenizers` library, each matching transformers' fast tokenizer of its name.

`BertTokenizer` (WordPiece): a folder with `tokenizer.json` loads that file; a folder with only `vocab.txt`
(+ `tokenizer_config.json`) gets the pipeline transformers builds for it: BertNormalizer -> BertPreTokenizer ->
WordPiece -> `[CLS] A [SEP] B [SEP]`. `RobertaTokenizer` (byte-level BPE, from `tokenizer.json` or `vocab.json` +
`merges.txt`) and `XLMRobertaTokenizer` (XLM-R's and CamemBERT's SentencePiece Unigram, from `tokenizer.json`) keep
the file's model and added tokens and build the rest of the pipeline from tokenizer_config.json as transformers 5
does: `<s> A </s></s> B </s>`, no token types, no normalizer but SentencePiece's own (so no lowercasing).
`MPNetTokenizer` (from `tokenizer.json` or `vocab.txt`) is BERT's WordPiece pipeline with RoBERTa's framing.
`ModernBertTokenizer` (byte-level BPE, from `tokenizer.json` only) runs that file's whole pipeline as it is, as
transformers 5's generic TokenizersBackend does. `AutoTokenizer` picks the class from tokenizer_config.json's
`tokenizer_class` or config.json's `model_type` (transformers' generic class names leave it to `model_type`).
The five share everything after the pipeline: encoding, padding and truncation (transformers' rules: argument
defaults, `model_max_length`, strategies), decoding and saving. tokenizer_config.json sets a call's defaults as in
transformers 5: `padding_side`, `truncation_side` (else the direction tokenizer.json stores, else "right"),
`model_input_names` (which of token_type_ids / attention_mask a call returns), `split_special_tokens`,
`clean_up_tokenization_spaces` (never for byte-level BPE, whose decoder already restores the spaces); arguments
of the same names to `from_pretrained` win over the file. What transformers' data collators and `Trainer` call on a
tokenizer is there too, with transformers' semantics: `pad` (what `DataCollatorWithPadding` and its siblings call),
`get_special_tokens_mask(ids, already_has_special_tokens=True)`, `all_special_ids`, `pad_token_type_id`,
`is_fast`, `len()` and `save_pretrained`.

    >>> tokenizer = BertTokenizer.from_pretrained("path/to/bert-base-uncased")  # doctest: +SKIP
    >>> tokenizer("Hello world!")["input_ids"]  # doctest: +SKIP
    [101, 7592, 2088, 999, 102]
    >>> tokenizer(["a", "b c"], padding=True, return_tensors="pt")["attention_mask"]  # doctest: +SKIP
    tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
"""

from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from converters.atomic_write import atomic_file
from converters.json_files import read_json_object
from converters.tokenizer_files import read_merges_txt, read_vocab_json, read_vocab_txt
from hfbert.modeling.family import MEMBERS
from hfbert.modeling.tokenizer_files import (
    CALL_OPTIONS,
    LARGE_INTEGER,
    MPNET_SPECIAL_TOKENS,
    NO_MAX_LENGTH,
    ROBERTA_SPECIAL_TOKENS,
    SIDES,
    SPECIAL_TOKENS,
    added_tokens,
    check_call_options,
    check_wordpiece_class,
    model_max_length,
    read_tokenizer_options,
    token_text,
)

# The file reading moved to tokenizer_files.py; its public names stay importable from here.
__all__ = [
    "NO_MAX_LENGTH",
    "SPECIAL_TOKENS",
    "AutoTokenizer",
    "BatchEncoding",
    "BertTokenizer",
    "DebertaV2Tokenizer",
    "MPNetTokenizer",
    "ModernBertTokenizer",
    "RobertaTokenizer",
    "XLMRobertaTokenizer",
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
        """Move every tensor to `device`, as `transformers.BatchEncoding.to`; other values (lists, arrays: a
        collator's fields) stay as they are."""
        return BatchEncoding(
            {key: value.to(device) if _tensor_kind(value) == "pt" else value for key, value in self.items()}
        )


class BertTokenizer:
    """WordPiece tokenizer for BERT checkpoints; `__call__` returns what `hfbert.BertModel` takes.

    The RoBERTa family's tokenizers below are subclasses: they differ only in how the pipeline is built from the
    files (`_backend`) and in the facts given as class attributes."""

    # What `__call__` returns by default, as transformers' tokenizer of the same name.
    model_input_names: tuple[str, ...] = ("input_ids", "token_type_ids", "attention_mask")
    # The named special tokens and their texts when the config names none.
    special_token_defaults: dict[str, str] = SPECIAL_TOKENS
    # tokenizer_config.json's options the pipeline is built from (beyond BERT's normalizer), with their defaults.
    pipeline_options: dict[str, Any] = {}
    # The named special tokens that take the space before them even when the config gives them as a plain string.
    lstrip_tokens: tuple[str, ...] = ()
    # The `tokenizer_class` save_pretrained writes (None: the class's own name, which transformers knows).
    saved_tokenizer_class: str | None = None
    unk_token_id: int | None
    sep_token_id: int | None
    pad_token_id: int | None
    cls_token_id: int | None
    mask_token_id: int | None

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self._tokenizer = tokenizer
        # transformers sets padding/truncation per call; of what tokenizer.json stores it keeps only the directions,
        # as the sides a config that names none gets.
        stored = {"truncation": tokenizer.truncation or {}, "padding": tokenizer.padding or {}}
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self.truncation_side: str = config.get("truncation_side", stored["truncation"].get("direction", "right"))
        self.padding_side: str = config.get("padding_side", stored["padding"].get("direction", "right"))
        # The token type id pads get (in `__call__` and `pad`): 0, unless tokenizer.json's padding stores another.
        self.pad_token_type_id: int = int(stored["padding"].get("pad_type_id", 0))
        self.model_input_names = tuple(config.get("model_input_names", type(self).model_input_names))
        self.split_special_tokens: bool = bool(config.get("split_special_tokens", False))
        tokenizer.encode_special_tokens = self.split_special_tokens
        # One call's padding/truncation settings live on the shared backend until the call ends.
        self._lock = threading.Lock()
        defaults = self.special_token_defaults
        self.special_tokens = {key: token_text(config.get(key), default) for key, default in defaults.items()}
        self.options = self._options(config)
        self.model_max_length: int = model_max_length(config.get("model_max_length"), "the tokenizer config")
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        # transformers 5 skips the clean-up for BPE models unless this says otherwise: it would remove real spaces.
        bpe_clean_up = config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False)
        self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = bool(bpe_clean_up)
        for key, token in self.special_tokens.items():  # unk_token_id, ..., as on transformers' tokenizers
            setattr(self, f"{key}_id", tokenizer.token_to_id(token))
        extras = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        self.extra_special_tokens = [token_text(token, "") for token in extras]

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        revision: str | None = None,
        *,
        padding_side: str | None = None,
        truncation_side: str | None = None,
        model_input_names: list[str] | None = None,
        split_special_tokens: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        model_max_length: int | None = None,
        subfolder: str = "",
    ) -> BertTokenizer:
        """Load from a local folder, or a Hub repo id (downloaded and sha256-verified by `converters.hub`);
        `subfolder`: the tokenizer's folder inside it, as in transformers.

        The keyword arguments, where given, replace tokenizer_config.json's fields of the same names (as in
        transformers): the defaults of every call (`padding_side="left"`, `model_input_names=["input_ids",
        "attention_mask"]` for no token_type_ids, ...). A bad value is a `ConfigError` naming the argument, before
        any file is read."""
        given = {
            "padding_side": padding_side,
            "truncation_side": truncation_side,
            "model_input_names": model_input_names,
            "split_special_tokens": split_special_tokens,
            "clean_up_tokenization_spaces": clean_up_tokenization_spaces,
            "model_max_length": model_max_length,
        }
        overrides = check_call_options(
            {name: value for name, value in given.items() if value is not None}, "from_pretrained", kind="argument"
        )
        directory = _local_directory(pretrained_model_name_or_path, revision, subfolder)
        own = read_tokenizer_options(directory / "tokenizer_config.json")
        legacy = "added_tokens_decoder" not in own  # a config from before transformers 4.34
        # transformers lets the legacy map override the config then.
        special_map = read_tokenizer_options(directory / "special_tokens_map.json") if legacy else {}
        config = {**own, **special_map, **overrides}
        for key in cls.lstrip_tokens:
            if not isinstance(config.get(key), dict):
                text = token_text(config.get(key), cls.special_token_defaults[key])
                config[key] = {"content": text, "lstrip": True, "rstrip": False, "normalized": False}
        tokenizer = cls._backend(directory, config, own)
        _add_tokens(tokenizer, added_tokens(config, own, special_map, directory, cls.special_token_defaults))
        cls._post_process(tokenizer, config)
        return cls(tokenizer, config)

    @classmethod
    def _backend(cls, directory: Path, config: dict[str, Any], own: dict[str, Any]) -> Tokenizer:
        """The pipeline from the folder's files, before the special and added tokens of the config."""
        if (directory / "tokenizer.json").is_file():
            tokenizer = _read_tokenizer_json(directory / "tokenizer.json")
            # transformers (4.x and 5.x) rebuilds BERT's normalizer from tokenizer_config.json over the one
            # stored in tokenizer.json, so `do_lower_case` there wins when the two disagree.
            has_config = (directory / "tokenizer_config.json").is_file()
            if has_config and _normalizer_options(tokenizer) is not None:
                tokenizer.normalizer = _bert_normalizer(config)
            return tokenizer
        if (directory / "vocab.txt").is_file():
            check_wordpiece_class(own.get("tokenizer_class"), directory / "tokenizer_config.json")
            return _build_from_vocab(directory / "vocab.txt", config)
        raise FileNotFoundError(f"{directory}: no tokenizer.json or vocab.txt (one is needed to tokenize)")

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        """Set what needs the special tokens' ids; BERT's template is built with its pipeline."""

    @classmethod
    def _options(cls, config: dict[str, Any]) -> dict[str, Any]:
        return {key: config.get(key, default) for key, default in cls.pipeline_options.items()}

    def __getattr__(self, name: str) -> str:
        # `tokenizer.mask_token` etc. give the special tokens' texts, as on transformers' tokenizers.
        if name in self.__dict__.get("special_tokens", {}):
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
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, model_max_length={self.model_max_length})"

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def tokenize(self, text: str, *, split_special_tokens: bool | None = None) -> list[str]:
        """The tokens of `text`, without the special tokens around it: BERT's `tokenize("Hello")` -> `["hello"]`.
        `split_special_tokens` (default: the attribute, from tokenizer_config.json) tokenizes "[MASK]" in the text
        as plain text."""
        with self._lock:
            self._tokenizer.encode_special_tokens = self._split(split_special_tokens)
            try:
                return self._tokenizer.encode(text, add_special_tokens=False).tokens
            finally:
                self._tokenizer.encode_special_tokens = self.split_special_tokens

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            index = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if index is None else index
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False) -> str | list[str]:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        # As transformers: the named and the extra special tokens (decode also skips other added special tokens).
        specials = [*self.special_tokens.values(), *self.extra_special_tokens]
        skip = {self._tokenizer.token_to_id(token) for token in specials} if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def decode(
        self, ids: Any, skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool | None = None
    ) -> str | list[str]:
        """Text from ids (a list, a tensor, or a batch of them -> a list of texts): `decode([101, 7592, 102])`
        -> `"hello"`. Unlike transformers, special tokens are skipped unless `skip_special_tokens=False`.

        `clean_up_tokenization_spaces` (default: the attribute, from tokenizer_config.json) joins " ," " ." " 's"
        " n't" ... to the word before, as transformers 5 does for WordPiece and Unigram; never for a BPE model
        (RoBERTa's), whose decoder already gives back the text's own spaces, unless
        `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output` is set."""
        ids = ids.tolist() if hasattr(ids, "tolist") else ids
        ids = [ids] if isinstance(ids, int) else list(ids)
        if ids and isinstance(ids[0], (list, tuple)):
            return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in ids]
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        bpe = isinstance(self._tokenizer.model, models.BPE)
        if bpe and not self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output:
            return text
        return _clean_up_tokenization(text) if clean_up_tokenization_spaces else text

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
        return_token_type_ids: bool | None = None,
        return_attention_mask: bool | None = None,
        padding_side: str | None = None,
        split_special_tokens: bool | None = None,
        pad_to_multiple_of: int | None = None,
        return_special_tokens_mask: bool = False,
    ) -> BatchEncoding:
        """Encode one text (or pair) into lists, or a batch into lists of lists; `return_tensors="pt"` (or "np")
        gives int64 tensors (arrays) with a batch dimension in both cases. `truncation=None` means: on if only
        `max_length` is given; `return_token_type_ids` / `return_attention_mask` None: as `model_input_names` (RoBERTa
        has no token types); `padding_side` / `split_special_tokens` None: the attributes (from
        tokenizer_config.json). Truncation cuts on the side `truncation_side` names. `pad_to_multiple_of` rounds the
        padded length up; `return_special_tokens_mask` adds 1 for each special token and pad, 0 for the text's
        tokens (what `DataCollatorForLanguageModeling` reads to never mask them)."""
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
        _check_multiple(pad_to_multiple_of)
        if truncate and pad and pad_to_multiple_of is not None and max_length % pad_to_multiple_of:
            # As transformers: a batch truncated to max_length could not be padded to a multiple of another number.
            raise ValueError(
                f"truncation and padding are both on, but the truncation length {max_length} is not a multiple of "
                f"pad_to_multiple_of={pad_to_multiple_of}"
            )
        _check_return_tensors(return_tensors)
        padding_side = self.padding_side if padding_side is None else padding_side
        # The attributes may have been set since loading; the tokenizers library would name neither.
        for name, side in (("padding_side", padding_side), ("truncation_side", self.truncation_side)):
            if side not in SIDES:
                raise ValueError(f"{name} must be 'right' or 'left', not {side!r}")
        if pad and self.pad_token_id is None:
            raise ValueError(f"padding needs the pad token {self.special_tokens['pad_token']!r} in the vocabulary")
        split = self._split(split_special_tokens)

        # Where a text was shortened from the left, its offsets count from the cut: `starts` moves them back.
        starts = [0] * len(inputs)
        with self._lock:
            self._tokenizer.encode_special_tokens = split
            try:
                if truncate and self._can_shorten():
                    cut = [self._cut(item, max_length) if isinstance(item, str) else (item, 0) for item in inputs]
                    inputs, starts = [item for item, _ in cut], [start for _, start in cut]
                if truncate:
                    self._tokenizer.enable_truncation(max_length, strategy=truncate, direction=self.truncation_side)
                if pad:
                    length = max_length if pad == "max_length" else None
                    pad_token = self.special_tokens["pad_token"]
                    self._tokenizer.enable_padding(
                        direction=padding_side,
                        pad_id=self.pad_token_id,
                        pad_type_id=self.pad_token_type_id,
                        pad_token=pad_token,
                        length=length,
                        pad_to_multiple_of=pad_to_multiple_of,
                    )
                encodings = self._tokenizer.encode_batch(inputs)
            except TypeError:
                _check_encodable(inputs)  # the library's TypeError does not say which text, nor why
                raise
            finally:
                self._tokenizer.no_truncation()
                self._tokenizer.no_padding()
                self._tokenizer.encode_special_tokens = self.split_special_tokens

        if return_token_type_ids is None:
            return_token_type_ids = "token_type_ids" in self.model_input_names
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        output = {"input_ids": [encoding.ids for encoding in encodings]}
        if return_token_type_ids:
            output["token_type_ids"] = [encoding.type_ids for encoding in encodings]
        if return_attention_mask:
            output["attention_mask"] = [encoding.attention_mask for encoding in encodings]
        if return_special_tokens_mask:
            output["special_tokens_mask"] = [encoding.special_tokens_mask for encoding in encodings]
        if return_offsets_mapping:
            output["offset_mapping"] = [
                _offsets(encoding, start) for encoding, start in zip(encodings, starts, strict=True)
            ]
        if return_tensors is not None:
            return BatchEncoding({key: _as_tensor(key, value, return_tensors) for key, value in output.items()})
        return BatchEncoding(output if batched else {key: value[0] for key, value in output.items()})

    # -- what transformers' data collators and Trainer call on a tokenizer ------------------------------------------

    @property
    def is_fast(self) -> bool:
        """True: a `tokenizers` pipeline, with offsets (whole-word masking in transformers' collators asks)."""
        return True

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens' texts (`bos_token` ... `mask_token`, in transformers' order) and the extra
        special tokens, each once."""
        return list(dict.fromkeys([*self.special_tokens.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        """The ids of `all_special_tokens` (a token not in the vocabulary gives the unknown token's id)."""
        return [self.convert_tokens_to_ids(token) for token in self.all_special_tokens]

    def get_special_tokens_mask(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        """1 for each id of a special token (`all_special_ids`: [CLS], [SEP], [PAD], [UNK], [MASK], ...), 0 for the
        others, in ids that already have their special tokens, as transformers' fast tokenizers give it:
        `DataCollatorForLanguageModeling` calls `get_special_tokens_mask(ids, already_has_special_tokens=True)` so
        that it never masks them. Ids without their special tokens are refused, as transformers 5 refuses them
        (`__call__(..., return_special_tokens_mask=True)` gives the mask of a text)."""
        if not already_has_special_tokens:
            raise NotImplementedError(
                f"{type(self).__name__}.get_special_tokens_mask takes ids that already have their special tokens "
                f"(already_has_special_tokens=True); for a text, call the tokenizer with "
                f"return_special_tokens_mask=True"
            )
        if token_ids_1 is not None:
            raise ValueError(
                "token_ids_1 must be None with already_has_special_tokens=True: token_ids_0 is the whole formatted "
                "sequence"
            )
        special = set(self.all_special_ids)
        return [1 if int(index) in special else 0 for index in token_ids_0]

    def pad(
        self,
        encoded_inputs: Mapping[str, Any] | list[Mapping[str, Any]],
        padding: bool | str = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """Pad encoded inputs, as transformers' `PreTrainedTokenizerBase.pad` (what `DataCollatorWithPadding`,
        `DataCollatorForTokenClassification` and `DataCollatorForLanguageModeling` call): one example (a dict of
        lists) or a batch (a list of dicts, as a DataLoader gives them, or a dict of lists of lists).

        `padding`: True / "longest" pads to the longest row, "max_length" to `max_length` (else
        `model_max_length`, or not at all when there is none), False / "do_not_pad" not at all; the length is
        then rounded up to `pad_to_multiple_of`. Pads go on `padding_side` (default: the attribute). `input_ids` get
        the pad token's id, `token_type_ids` `pad_token_type_id`, `special_tokens_mask` 1 and `attention_mask` 0
        (one of ones is added when it is missing and `return_attention_mask`, default: as `model_input_names`, is
        on); any other field (`labels`, ...) is left as it is. Tensors or numpy arrays are taken too, and give the
        same kind back unless `return_tensors` ("pt", "np" or None for lists) says otherwise.

            >>> tokenizer.pad([tokenizer("a b"), tokenizer("c")])["attention_mask"]  # doctest: +SKIP
            [[1, 1, 1, 1], [1, 1, 1, 0]]
        """
        inputs = _padding_inputs(encoded_inputs)
        # transformers stacks 4-D attention masks (one matrix per row) as they are, and pads none of them.
        stacked_mask = None
        mask = inputs.get("attention_mask")
        if isinstance(mask, list) and mask and getattr(mask[0], "ndim", 0) > 1:
            stacked_mask = inputs.pop("attention_mask")
        main = self.model_input_names[0]
        if main not in inputs:
            raise ValueError(f"encoded_inputs has no {main!r} to pad (it has {sorted(inputs)})")
        if inputs[main] is None or len(inputs[main]) == 0:
            if return_attention_mask:
                inputs["attention_mask"] = []
            return BatchEncoding(inputs)
        first = _first_element(inputs[main])
        if not isinstance(first, (int, list, tuple)):
            kind = _tensor_kind(first)
            if kind is None:
                raise ValueError(
                    f"encoded_inputs[{main!r}] holds {type(first).__name__} values; expected ints, or torch tensors "
                    f"or numpy arrays of them"
                )
            return_tensors = kind if return_tensors is None else return_tensors
            inputs = {key: _as_python(value) for key, value in inputs.items()}
        return_tensors = return_tensors.value if isinstance(return_tensors, Enum) else return_tensors
        _check_return_tensors(return_tensors)
        _check_multiple(pad_to_multiple_of)
        pad, _, max_length = self._strategies(padding, None, max_length, verbose=verbose)
        if pad and self.pad_token_id is None:
            raise ValueError(f"padding needs the pad token {self.special_tokens['pad_token']!r} in the vocabulary")
        side = self.padding_side if padding_side is None else padding_side
        if side not in SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', not {side!r}")
        if return_attention_mask is None:
            return_attention_mask = "attention_mask" in self.model_input_names
        pad_row = dict(pad=pad, multiple=pad_to_multiple_of, side=side, attention_mask=return_attention_mask)

        rows = inputs[main]
        if not isinstance(rows[0], (list, tuple)):  # one example
            output = self._pad_row(inputs, max_length if pad == "max_length" else len(rows), **pad_row)
            return BatchEncoding(_converted(output, return_tensors))
        for key, value in inputs.items():
            size = len(value) if hasattr(value, "__len__") and not isinstance(value, (str, bytes)) else None
            if size != len(rows):
                size = type(value).__name__ if size is None else size
                raise ValueError(f"encoded_inputs[{key!r}] has {size} rows, but {main!r} has {len(rows)}")
        length = max(len(row) for row in rows) if pad == "longest" else max_length
        output: dict[str, list[Any]] = {}
        for index in range(len(rows)):
            padded = self._pad_row({key: value[index] for key, value in inputs.items()}, length, **pad_row)
            for key, value in padded.items():
                output.setdefault(key, []).append(value)
        if stacked_mask is not None:
            output["attention_mask"] = _stacked(stacked_mask)
        return BatchEncoding(_converted(output, return_tensors))

    def _pad_row(
        self, row: dict[str, Any], length: int, pad: str | None, multiple: int | None, side: str, attention_mask: bool
    ) -> dict[str, Any]:
        """One example's fields padded to `length` (rounded up to `multiple`) on `side`, as transformers' `_pad`;
        a row already longer stays as it is."""
        row = dict(row)
        main = self.model_input_names[0]
        ids = list(row[main])
        if multiple is not None and length % multiple:
            length = (length // multiple + 1) * multiple
        if attention_mask and "attention_mask" not in row:
            row["attention_mask"] = [1] * len(ids)
        missing = length - len(ids) if pad else 0
        if missing <= 0:
            return row
        # Which fields take pads, and with what; any other field (labels, offsets) is the caller's to pad.
        fills = {"token_type_ids": self.pad_token_type_id, "special_tokens_mask": 1, main: self.pad_token_id}
        if attention_mask:
            fills["attention_mask"] = 0
        for key, fill in fills.items():
            if key in row:
                values = list(row[key])
                row[key] = values + [fill] * missing if side == "right" else [fill] * missing + values
        return row

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

    def _split(self, split_special_tokens: bool | None) -> bool:
        """A call's `split_special_tokens`: the argument, else the attribute; ValueError for anything but a bool."""
        split = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        if not isinstance(split, bool):
            raise ValueError(f"split_special_tokens must be True or False, not {split!r}")
        return split

    def _cut(self, text: str, max_length: int) -> tuple[str, int]:
        """The part of `text` that truncates on `truncation_side` to the same tokens as the whole text, and where it
        starts in `text`. Must hold `self._lock`."""
        if self.truncation_side == "left":
            suffix = self._shorten_left(text, max_length)
            return suffix, len(text) - len(suffix)
        return self._shorten(text, max_length), 0

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

    def _shorten_left(self, text: str, max_length: int) -> str:
        """`_shorten` for truncation on the left: a suffix of `text` that starts at whitespace, where BERT always
        starts a word, so its tokens are exactly the last tokens of the whole text. Must hold `self._lock`."""
        budget = 8 * max_length + 256
        while budget < len(text):
            start = len(text) - budget
            cut = min((index for index in (text.find(space, start) for space in " \t\n\r") if index >= 0), default=-1)
            if cut > 0 and len(self._tokenizer.encode(text[cut:], add_special_tokens=False)) > max_length:
                return text[cut:]
            budget *= 4
        return text

    def _strategies(
        self, padding: Any, truncation: Any, max_length: int | None, verbose: bool = True
    ) -> tuple[str | None, str | None, int]:
        """transformers' `_get_padding_truncation_strategies`, for the strategies this tokenizer offers."""
        # transformers' PaddingStrategy / TruncationStrategy members (str enums, as its collators may pass them).
        padding = padding.value if isinstance(padding, Enum) else padding
        truncation = truncation.value if isinstance(truncation, Enum) else truncation
        if truncation is None:  # legacy rule kept by transformers: `max_length` alone turns truncation on
            truncation = max_length is not None and padding is False
        for name, value, choices in (("padding", padding, _PADDING), ("truncation", truncation, _TRUNCATION)):
            if not isinstance(value, (bool, str)) or value not in choices:
                raise ValueError(f"{name}={value!r}: expected one of {list(choices)}")
        if max_length is not None and not (_is_int(max_length) and max_length >= 1):
            raise ValueError(f"max_length={max_length!r}: expected a positive integer, or None")
        pad, truncate = _PADDING[padding], _TRUNCATION[truncation]
        if pad == "longest" and max_length is not None and not truncate and verbose:
            message = "max_length is ignored by padding=True without truncation (padding='max_length' uses it)"
            warnings.warn(message, stacklevel=3)
        if max_length is None:
            has_limit = self.model_max_length <= LARGE_INTEGER
            max_length = self.model_max_length
            pad = None if pad == "max_length" and not has_limit else pad
            truncate = truncate if has_limit else None
        return pad, truncate, max_length

    def save_pretrained(self, directory: str | os.PathLike) -> list[Path]:
        """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json (each atomically), and BERT's
        vocab.txt."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            tokenizer_json = self._tokenizer.to_str(pretty=True)
        name = self.saved_tokenizer_class or type(self).__name__
        config: dict[str, Any] = {"tokenizer_class": name, **self._saved_options()}
        config.update(self.special_tokens, model_max_length=self.model_max_length)
        config["clean_up_tokenization_spaces"] = self.clean_up_tokenization_spaces
        if self.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output:
            config["clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"] = True
        # The call defaults, as transformers writes them: tokenizer.json is written without the directions it
        # may have stored.
        config.update(
            padding_side=self.padding_side,
            truncation_side=self.truncation_side,
            model_input_names=list(self.model_input_names),
            split_special_tokens=self.split_special_tokens,
        )
        files = {
            "tokenizer.json": tokenizer_json,
            **self._vocabulary_files(),
            "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False) + "\n",
            "special_tokens_map.json": json.dumps(self.special_tokens, indent=2, ensure_ascii=False) + "\n",
        }
        for name, content in files.items():
            _write_atomic(directory / name, content)
        return [directory / name for name in files]

    def _saved_options(self) -> dict[str, Any]:
        """tokenizer_config.json's options that rebuild this pipeline: BERT's normalizer options, `options`."""
        return {**(_normalizer_options(self._tokenizer) or {}), **self.options}

    def _vocabulary_files(self) -> dict[str, str]:
        """vocab.txt, for readers of BERT's slow format; tokenizer.json holds the rest of the family's vocabularies."""
        vocab = sorted(self._tokenizer.get_vocab(with_added_tokens=False).items(), key=lambda item: item[1])
        return {"vocab.txt": "".join(token + "\n" for token, _ in vocab)}


class RobertaTokenizer(BertTokenizer):
    """RoBERTa's byte-level BPE tokenizer, as transformers' RobertaTokenizer(Fast): `<s> A </s></s> B </s>`, no token
    types; `add_prefix_space` and `trim_offsets` from tokenizer_config.json.

    From `tokenizer.json` (its BPE model and added tokens) or from `vocab.json` + `merges.txt`; the rest of the
    pipeline is rebuilt as transformers 5 rebuilds it: no normalizer (a Lowercase stored in tokenizer.json is
    dropped), the ByteLevel pre-tokenizer and decoder, the RobertaProcessing post-processor."""

    model_input_names = ("input_ids", "attention_mask")
    special_token_defaults = ROBERTA_SPECIAL_TOKENS
    pipeline_options = {"add_prefix_space": False, "trim_offsets": True}
    bos_token_id: int | None
    eos_token_id: int | None

    @classmethod
    def _backend(cls, directory: Path, config: dict[str, Any], own: dict[str, Any]) -> Tokenizer:
        source = cls._source(directory)
        tokenizer = Tokenizer(source.model)
        _keep_call_settings(tokenizer, source)
        cls._pipeline(tokenizer, source, cls._options(config))
        # transformers adds the config's added tokens where it has them (a 4.x config), else tokenizer.json's.
        _add_tokens(tokenizer, _decoder_tokens(own) if "added_tokens_decoder" in own else _file_tokens(source))
        return tokenizer

    @classmethod
    def _source(cls, directory: Path) -> Tokenizer:
        """The folder's model (and tokenizer.json's added tokens): BPE as transformers' RobertaTokenizer builds it."""
        if (directory / "tokenizer.json").is_file():
            source = _read_tokenizer_json(directory / "tokenizer.json")
            model = _check_model(source, models.BPE, directory / "tokenizer.json", cls.__name__)
        elif (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
            merges_file = directory / "merges.txt"
            try:
                model = models.BPE(read_vocab_json(directory / "vocab.json"), read_merges_txt(merges_file))
            except Exception as error:  # the tokenizers library raises a bare Exception for a merge of unknown tokens
                reason = " ".join(str(error).split())
                raise ValueError(f"{merges_file}: does not go with vocab.json ({reason})") from None
            source = Tokenizer(model)
        else:
            raise FileNotFoundError(
                f"{directory}: no tokenizer.json, nor vocab.json and merges.txt (RoBERTa's tokenizer needs one of them)"
            )
        # The BPE transformers builds: no dropout, no unknown token (every byte has a token), no affixes.
        model.dropout, model.unk_token, model.fuse_unk, model.byte_fallback = None, None, False, False
        model.continuing_subword_prefix, model.end_of_word_suffix = "", ""
        return source

    @classmethod
    def _pipeline(cls, tokenizer: Tokenizer, source: Tokenizer, options: dict[str, Any]) -> None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=options["add_prefix_space"])
        tokenizer.decoder = decoders.ByteLevel()

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        options = cls._options(config)
        tokenizer.post_processor = _roberta_processing(tokenizer, config, cls.special_token_defaults, **options)

    def _vocabulary_files(self) -> dict[str, str]:
        return {}


class XLMRobertaTokenizer(RobertaTokenizer):
    """XLM-RoBERTa's (and CamemBERT's) SentencePiece Unigram tokenizer, as transformers' XLMRobertaTokenizer(Fast):
    `<s> A </s></s> B </s>`, no token types; `add_prefix_space` (default true) from tokenizer_config.json.

    From `tokenizer.json` only (its Unigram model and added tokens): the slow `sentencepiece.bpe.model` needs the
    sentencepiece library to convert, so a folder with only that file is refused with how to convert it. The rest of
    the pipeline is rebuilt as transformers 5 rebuilds it: only SentencePiece's precompiled normalizer, whitespace
    split + Metaspace ("▁") pre-tokenizer, Metaspace decoder, `<s> $A </s> (</s> $B </s>)` template."""

    pipeline_options = {"add_prefix_space": True}

    @classmethod
    def _source(cls, directory: Path) -> Tokenizer:
        if (directory / "tokenizer.json").is_file():
            source = _read_tokenizer_json(directory / "tokenizer.json")
            _check_model(source, models.Unigram, directory / "tokenizer.json", cls.__name__)
            return source
        convert = (
            "make tokenizer.json once, with transformers and sentencepiece installed: "
            "transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )
        if (directory / "sentencepiece.bpe.model").is_file():
            raise ValueError(
                f"{directory}: no tokenizer.json, only sentencepiece.bpe.model (the slow SentencePiece file, which "
                f"hfbert does not read); {convert}"
            )
        raise FileNotFoundError(f"{directory}: no tokenizer.json (XLM-RoBERTa's tokenizer needs it; {convert})")

    @classmethod
    def _pipeline(cls, tokenizer: Tokenizer, source: Tokenizer, options: dict[str, Any]) -> None:
        precompiled = [
            part for part in _normalizer_parts(source.normalizer) if isinstance(part, normalizers.Precompiled)
        ]
        tokenizer.normalizer = precompiled[0] if precompiled else None
        scheme = "always" if options["add_prefix_space"] else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)]
        )
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        bos, eos = (token_text(config.get(key), cls.special_token_defaults[key]) for key in ("bos_token", "eos_token"))
        tokenizer.post_processor = processors.TemplateProcessing(
            single=[bos, "$A", eos],
            pair=[bos, "$A", eos, eos, "$B", eos],
            special_tokens=[(bos, tokenizer.token_to_id(bos)), (eos, tokenizer.token_to_id(eos))],
        )


# DeBERTa-v2's normalizer: runs of spaces after SentencePiece's own; without it, any whitespace run or control space.
_SPACES, _BLANKS = Regex(r" {2,}"), Regex(r"\s{2,}|[\n\r\t]")


class DebertaV2Tokenizer(XLMRobertaTokenizer):
    """DeBERTa-v2 / v3's SentencePiece Unigram tokenizer, as transformers' DebertaV2Tokenizer(Fast): `[CLS] A [SEP]
    B [SEP]` with token types 0 for the first text and its [SEP], 1 for the second; `do_lower_case`,
    `split_by_punct` and `add_prefix_space` (default true) from tokenizer_config.json.

    From `tokenizer.json` only (its Unigram model and added tokens): the slow `spm.model` needs the sentencepiece and
    protobuf libraries to convert, so a folder with only that file is refused with how to convert it. The rest is
    rebuilt as transformers 5 rebuilds it: with SentencePiece's precompiled normalizer (when tokenizer.json has one),
    it, a right strip and runs of spaces made one, else whitespace runs and control spaces made one space, NFC and
    a right strip (lowercased first with `do_lower_case`); punctuation isolated with `split_by_punct`; Metaspace
    ("▁", on the first word only without `add_prefix_space`)."""

    model_input_names = ("input_ids", "attention_mask", "token_type_ids")
    special_token_defaults = {
        "bos_token": "[CLS]",
        "eos_token": "[SEP]",
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    pipeline_options = {"add_prefix_space": True, "do_lower_case": False, "split_by_punct": False}

    @classmethod
    def _source(cls, directory: Path) -> Tokenizer:
        if (directory / "tokenizer.json").is_file():
            source = _read_tokenizer_json(directory / "tokenizer.json")
            _check_model(source, models.Unigram, directory / "tokenizer.json", cls.__name__)
            return source
        convert = (
            "make tokenizer.json once, with transformers, sentencepiece and protobuf installed: "
            "transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)"
        )
        if (directory / "spm.model").is_file():
            raise ValueError(
                f"{directory / 'spm.model'}: DeBERTa's slow SentencePiece file, which hfbert does not read, and no "
                f"tokenizer.json beside it; {convert}"
            )
        raise FileNotFoundError(f"{directory}: no tokenizer.json (DeBERTa-v2's tokenizer needs it; {convert})")

    @classmethod
    def _pipeline(cls, tokenizer: Tokenizer, source: Tokenizer, options: dict[str, Any]) -> None:
        precompiled = [
            part for part in _normalizer_parts(source.normalizer) if isinstance(part, normalizers.Precompiled)
        ]
        steps: list[normalizers.Normalizer] = [normalizers.Lowercase()] if options["do_lower_case"] else []
        if precompiled:
            steps += [precompiled[0], normalizers.Strip(left=False, right=True), normalizers.Replace(_SPACES, " ")]
        else:
            steps += [normalizers.Replace(_BLANKS, " "), normalizers.NFC(), normalizers.Strip(left=False, right=True)]
        tokenizer.normalizer = normalizers.Sequence(steps)
        scheme = "always" if options["add_prefix_space"] else "first"
        splits = [pre_tokenizers.Punctuation(behavior="isolated")] if options["split_by_punct"] else []
        metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*splits, metaspace])
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        cls_token, sep = (
            token_text(config.get(key), cls.special_token_defaults[key]) for key in ("cls_token", "sep_token")
        )
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls_token}:0 $A:0 {sep}:0",
            pair=f"{cls_token}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls_token, tokenizer.token_to_id(cls_token) or 0), (sep, tokenizer.token_to_id(sep) or 0)],
        )


class DistilBertTokenizer(BertTokenizer):
    """DistilBERT's tokenizer, as transformers' DistilBertTokenizer(Fast): BERT's WordPiece pipeline, whose calls
    return no token types (DistilBERT has none)."""

    model_input_names = ("input_ids", "attention_mask")


class MPNetTokenizer(BertTokenizer):
    """MPNet's tokenizer (all-mpnet-base-v2, microsoft/mpnet-base), as transformers' MPNetTokenizer(Fast): BERT's
    WordPiece with RoBERTa's framing, `<s> A </s></s> B </s>`, no token types; `<mask>` takes the space before it
    (even when tokenizer_config.json gives it as a plain string).

    From `tokenizer.json` (its WordPiece vocabulary and added tokens) or from `vocab.txt`; the rest is rebuilt from
    tokenizer_config.json as transformers 5 rebuilds it, whatever tokenizer.json stores: BertNormalizer
    (`do_lower_case`, `strip_accents`, `tokenize_chinese_chars`), BertPreTokenizer, WordPiece with the config's
    unknown token, WordPiece decoder, RobertaProcessing (offsets trimmed, no prefix space)."""

    model_input_names = ("input_ids", "attention_mask")
    special_token_defaults = MPNET_SPECIAL_TOKENS
    lstrip_tokens = ("mask_token",)
    bos_token_id: int | None
    eos_token_id: int | None

    @classmethod
    def _backend(cls, directory: Path, config: dict[str, Any], own: dict[str, Any]) -> Tokenizer:
        if (directory / "tokenizer.json").is_file():
            path = directory / "tokenizer.json"
            source = _read_tokenizer_json(path)
            _check_model(source, models.WordPiece, path, cls.__name__)
            vocab = source.get_vocab(with_added_tokens=False)
            file_tokens = _file_tokens(source)
        elif (directory / "vocab.txt").is_file():
            path = directory / "vocab.txt"
            vocab, file_tokens, source = _read_vocab(path), [], None
        else:
            raise FileNotFoundError(f"{directory}: no tokenizer.json or vocab.txt (MPNet's tokenizer needs one)")
        unk = token_text(config.get("unk_token"), cls.special_token_defaults["unk_token"])
        if unk not in vocab:  # WordPiece would fail on the first unknown word instead
            raise ValueError(f"{path}: the unk_token {unk!r} is not in the vocabulary")
        tokenizer = _wordpiece(vocab, unk, config)
        if source is not None:
            _keep_call_settings(tokenizer, source)
        # As RoBERTa: the config's added tokens where it has them (a 4.x config), else tokenizer.json's.
        _add_tokens(tokenizer, _decoder_tokens(own) if "added_tokens_decoder" in own else file_tokens)
        return tokenizer

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        tokenizer.post_processor = _roberta_processing(tokenizer, config, cls.special_token_defaults)


class ModernBertTokenizer(BertTokenizer):
    """ModernBERT's byte-level BPE tokenizer (answerdotai/ModernBERT-base, gte-modernbert-base, modernbert-embed),
    as transformers 5 loads it: its generic TokenizersBackend (the class transformers uses for config.json's
    model_type "modernbert", whatever tokenizer_class says) runs `tokenizer.json` as the file says.

    So the file's whole pipeline is kept (NFC normalizer, ByteLevel pre-tokenizer and decoder, BPE model, the
    `[CLS] $A [SEP] ($B [SEP])` template, added tokens with their flags: `[MASK]` takes the space before it) and
    nothing is rebuilt from tokenizer_config.json, which gives only the call defaults (`model_input_names`, default
    `("input_ids", "attention_mask")`: no token types), the special tokens' names (BERT's texts where it names none),
    and tokens its `added_tokens_decoder` lists that the file lacks or flags otherwise. A folder without
    tokenizer.json is refused. `clean_up_tokenization_spaces: true`, as ModernBERT's config sets it, is ignored in
    decoding, as transformers 5 ignores it for every BPE model."""

    model_input_names = ("input_ids", "attention_mask")
    # transformers has no ModernBertTokenizer: its own generic name, which transformers 4.x reads too (5.x's
    # "TokenizersBackend" it would not).
    saved_tokenizer_class = "PreTrainedTokenizerFast"

    @classmethod
    def _backend(cls, directory: Path, config: dict[str, Any], own: dict[str, Any]) -> Tokenizer:
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{directory}: no tokenizer.json (ModernBERT's tokenizer is read from it; vocab.json + merges.txt "
                f"or other files alone are not enough)"
            )
        tokenizer = _read_tokenizer_json(path)
        _check_model(tokenizer, models.BPE, path, cls.__name__)
        # transformers re-adds each token of the config's list that the file does not hold exactly so, flags and
        # all: the tokenizers library then takes the config's flags for a token it has.
        held = {repr(token) for token in tokenizer.get_added_tokens_decoder().values()}
        for token in _decoder_tokens(own):
            if repr(token) not in held:
                tokenizer.add_tokens([token])  # keeps the token's own `special` flag
        return tokenizer

    @classmethod
    def _post_process(cls, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        # transformers keeps the file's post-processor (it drops the config's add_bos_token / add_eos_token when
        # there is a tokenizer.json); for a file without one it builds the template of neither: no [CLS] / [SEP].
        if tokenizer.post_processor is None:
            tokenizer.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")

    def _vocabulary_files(self) -> dict[str, str]:
        return {}


# transformers' tokenizer classes (its `tokenizer_class`, "Fast" dropped) and model types -> hfbert's class, from the
# family table.
_TOKENIZER_CLASSES: dict[str, type[BertTokenizer]] = {
    name: globals()[row.tokenizer] for row in MEMBERS for name in row.tokenizer_names
}
_MODEL_TYPES: dict[str, type[BertTokenizer]] = {row.model_type: globals()[row.tokenizer] for row in MEMBERS}


class AutoTokenizer:
    """The tokenizer class a checkpoint asks for, as transformers' AutoTokenizer picks it: tokenizer_config.json's
    `tokenizer_class`, else config.json's `model_type`; BertTokenizer when neither names one hfbert has. A generic
    `tokenizer_class` (PreTrainedTokenizerFast, TokenizersBackend) names none; model_type "modernbert" wins over any.

        >>> tokenizer = AutoTokenizer.from_pretrained("path/to/xlm-roberta-base")  # doctest: +SKIP
        >>> type(tokenizer).__name__  # doctest: +SKIP
        'XLMRobertaTokenizer'
    """

    @staticmethod
    def from_pretrained(
        pretrained_model_name_or_path: str | os.PathLike,
        revision: str | None = None,
        subfolder: str = "",
        **options: Any,
    ) -> BertTokenizer:
        """Load from a local folder, or a Hub repo id (downloaded and sha256-verified by `converters.hub`);
        `subfolder`: the tokenizer's folder inside it, as in transformers. `options`: the class's `from_pretrained`
        keyword arguments (`padding_side`, `truncation_side`, ...)."""
        unknown = sorted(set(options) - set(CALL_OPTIONS))
        if unknown:
            accepted = ", ".join(CALL_OPTIONS)
            raise TypeError(f"AutoTokenizer.from_pretrained: unknown arguments {unknown}; it takes {accepted}")
        given = {name: value for name, value in options.items() if value is not None}
        check_call_options(given, "from_pretrained", kind="argument")  # before anything is downloaded
        directory = _local_directory(pretrained_model_name_or_path, revision, subfolder)
        return _tokenizer_class(directory).from_pretrained(directory, **options)


# transformers' generic tokenizer classes: they run whatever tokenizer.json holds, so they say nothing of which
# pipeline a checkpoint needs (ModernBERT's Hub files name "PreTrainedTokenizerFast", transformers 5 writes
# "TokenizersBackend"); config.json's model_type decides, and no family row may claim them.
_GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "PreTrainedTokenizer", "TokenizersBackend")
# The model types whose model_type wins over the file's tokenizer_class (the row's `tokenizer_over_class`).
_MODEL_TYPES_OVER_TOKENIZER_CLASS = frozenset(row.model_type for row in MEMBERS if row.tokenizer_over_class)


def _tokenizer_class(directory: Path) -> type[BertTokenizer]:
    named = read_tokenizer_options(directory / "tokenizer_config.json").get("tokenizer_class")
    model_type = read_json_object(directory / "config.json", missing_ok=True).get("model_type")
    model_type = model_type if isinstance(model_type, str) else None
    if model_type in _MODEL_TYPES_OVER_TOKENIZER_CLASS and model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    if isinstance(named, str) and named not in _GENERIC_TOKENIZER_CLASSES:
        specific = _TOKENIZER_CLASSES.get(named.removesuffix("Fast"))
        if specific is not None:
            return specific
    return _MODEL_TYPES.get(model_type, BertTokenizer) if model_type is not None else BertTokenizer


def _local_directory(path_or_repo_id: str | os.PathLike, revision: str | None, subfolder: str = "") -> Path:
    # converters.hub imports huggingface_hub only when a repo id is resolved
    from converters.hub import checked_source, checked_subfolder, looks_like_local_path, resolve_checkpoint

    checked_source(path_or_repo_id)
    subfolder = checked_subfolder(subfolder)
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir() and revision is None:
        directory = path / subfolder if subfolder else path
        if not directory.is_dir():
            raise FileNotFoundError(f"{directory}: no such tokenizer directory (no folder {subfolder!r} in {path})")
        return directory
    if not path.is_dir() and looks_like_local_path(path_or_repo_id):
        raise FileNotFoundError(f"{os.fspath(path_or_repo_id)}: no such tokenizer directory")
    return Path(
        resolve_checkpoint(
            path_or_repo_id, revision, include_tokenizer=True, include_weights=False, subfolder=subfolder
        )
    )


def _build_from_vocab(vocab_file: Path, config: dict[str, Any]) -> Tokenizer:
    """The pipeline transformers' BertTokenizer(Fast)/BertConverter builds from vocab.txt and its options."""
    vocab = _read_vocab(vocab_file)
    specials = {key: token_text(config.get(key), default) for key, default in SPECIAL_TOKENS.items()}
    for key in ("unk_token", "cls_token", "sep_token"):
        if specials[key] not in vocab:
            raise ValueError(f"{vocab_file}: the {key} {specials[key]!r} is not in the vocabulary")
    tokenizer = _wordpiece(vocab, specials["unk_token"], config)
    _add_tokens(tokenizer, _decoder_tokens(config))
    cls, sep = specials["cls_token"], specials["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    return tokenizer


def _read_vocab(vocab_file: Path) -> dict[str, int]:
    try:
        return read_vocab_txt(vocab_file)
    except UnicodeDecodeError as error:
        raise ValueError(f"{vocab_file}: not valid UTF-8 ({error.reason})") from None


def _wordpiece(vocab: dict[str, int], unk_token: str, config: dict[str, Any]) -> Tokenizer:
    """BERT's pipeline before the special tokens, as transformers builds it from a vocabulary and the config:
    BertNormalizer -> BertPreTokenizer -> WordPiece ("##" pieces; a word over 100 characters is unknown)."""
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=unk_token, max_input_chars_per_word=100))
    tokenizer.normalizer = _bert_normalizer(config)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _roberta_processing(
    tokenizer: Tokenizer,
    config: dict[str, Any],
    defaults: dict[str, str],
    trim_offsets: bool = True,
    add_prefix_space: bool = False,
) -> processors.RobertaProcessing:
    """RoBERTa's framing `<s> A </s></s> B </s>` with the config's cls and sep tokens and their ids."""
    sep, cls = (token_text(config.get(key), defaults[key]) for key in ("sep_token", "cls_token"))
    return processors.RobertaProcessing(
        (sep, tokenizer.token_to_id(sep)),
        (cls, tokenizer.token_to_id(cls)),
        trim_offsets=trim_offsets,
        add_prefix_space=add_prefix_space,
    )


def _keep_call_settings(tokenizer: Tokenizer, source: Tokenizer) -> None:
    """Give a rebuilt pipeline the directions of the truncation and padding tokenizer.json stores: transformers
    takes them for the default sides (the tokenizer's `__init__` reads and clears them). The rest is never used,
    so a stored stride the library would refuse does not matter."""
    if source.truncation:
        tokenizer.enable_truncation(512, direction=source.truncation["direction"])
    if source.padding:
        tokenizer.enable_padding(direction=source.padding["direction"], pad_type_id=source.padding["pad_type_id"])


def _read_tokenizer_json(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the tokenizers library raises a bare Exception for a malformed file
        reason = " ".join(str(error).split())
        raise ValueError(f"{path}: not a valid tokenizer file ({reason})") from None


def _check_model(source: Tokenizer, kind: type[models.Model], path: Path, name: str) -> models.Model:
    """`source`'s model, or ValueError naming the file when it is not the `kind` the tokenizer class `name` runs."""
    if not isinstance(source.model, kind):
        raise ValueError(
            f"{path}: field 'model' is a {type(source.model).__name__} model; {name} takes a {kind.__name__} model "
            f"(is tokenizer_class or config.json's model_type right?)"
        )
    return source.model


def _decoder_tokens(config: dict[str, Any]) -> list[AddedToken]:
    """tokenizer_config.json's `added_tokens_decoder` as AddedTokens, in id order."""
    tokens = []
    for _, spec in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0])):
        options = {key: spec[key] for key in ("single_word", "lstrip", "rstrip", "normalized") if key in spec}
        tokens.append(AddedToken(spec["content"], special=bool(spec.get("special")), **options))
    return tokens


def _file_tokens(source: Tokenizer) -> list[AddedToken]:
    """tokenizer.json's added tokens (flags kept: RoBERTa's `<mask>` strips the space before it), in id order."""
    return [token for _, token in sorted(source.get_added_tokens_decoder().items())]


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


def _offsets(encoding: Any, start: int) -> list[tuple[int, int]]:
    """The encoding's offsets in the whole text when it was made from the text's part from `start` on: the text's
    tokens move by `start`; the tokens the template or padding add (no sequence) keep (0, 0)."""
    if not start:
        return encoding.offsets
    return [
        offset if sequence is None else (offset[0] + start, offset[1] + start)
        for offset, sequence in zip(encoding.offsets, encoding.sequence_ids, strict=True)
    ]


def _as_tensor(key: str, rows: list[list[Any]], return_tensors: str) -> Any:
    """An encoding's rows as one int64 tensor ("pt") or array ("np")."""
    try:
        if return_tensors == "np":
            import numpy

            lengths = {len(row) for row in rows}
            if len(lengths) > 1:  # numpy would make an array of objects, or fail on offset pairs
                raise ValueError("rows of different lengths")
            return numpy.asarray(rows, dtype=numpy.int64)
        import torch

        return torch.tensor(rows, dtype=torch.int64)
    except ValueError as error:
        raise ValueError(f"{key}: sequences of different lengths make no tensor; pass padding=True") from error


def _check_return_tensors(return_tensors: Any) -> None:
    if return_tensors not in (None, "pt", "np"):
        raise ValueError(f"return_tensors={return_tensors!r}: expected 'pt' (torch), 'np' (numpy) or None (lists)")


def _check_multiple(pad_to_multiple_of: Any) -> None:
    if pad_to_multiple_of is not None and not (_is_int(pad_to_multiple_of) and pad_to_multiple_of >= 1):
        raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r}: expected a positive integer, or None")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _padding_inputs(encoded_inputs: Any) -> dict[str, Any]:
    """`pad`'s input as one dict of fields: a list of examples (dicts with the first one's keys) becomes a dict of
    lists, as transformers' `pad` takes a DataLoader's batch. The caller's objects are not changed."""
    if isinstance(encoded_inputs, Mapping):
        return dict(encoded_inputs)
    if isinstance(encoded_inputs, (list, tuple)) and encoded_inputs and isinstance(encoded_inputs[0], Mapping):
        keys = list(encoded_inputs[0].keys())
        for index, example in enumerate(encoded_inputs):
            if not isinstance(example, Mapping):
                raise TypeError(f"encoded_inputs[{index}] is a {type(example).__name__}, not a dict like example 0")
            missing = [key for key in keys if key not in example]
            if missing:
                raise ValueError(f"encoded_inputs[{index}] has no {missing[0]!r}, which example 0 has")
        return {key: [example[key] for example in encoded_inputs] for key in keys}
    if isinstance(encoded_inputs, (list, tuple)) and not encoded_inputs:
        raise ValueError("encoded_inputs is an empty list: nothing to pad")
    raise TypeError(
        f"encoded_inputs is a {type(encoded_inputs).__name__}; expected what the tokenizer returns (a dict of "
        f"lists), or a list of such dicts"
    )


def _first_element(rows: Any) -> Any:
    """The first value of one example, or of the first non-empty row of a batch (a row may be empty)."""
    first = rows[0]
    if isinstance(first, (list, tuple)):
        for row in rows:
            if len(row):
                return row[0]
    return first


def _tensor_kind(value: Any) -> str | None:
    """ "pt" for a torch tensor, "np" for a numpy array, else None; neither library is imported for the question."""
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        return "pt"
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "np"
    return None


def _as_python(value: Any) -> Any:
    """Tensors and arrays (also inside lists and dicts) as Python lists and numbers, as transformers' `to_py_obj`."""
    if _tensor_kind(value) is not None:
        return value.tolist()
    if isinstance(value, Mapping):
        return {key: _as_python(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_python(item) for item in value]
    return value


def _converted(output: dict[str, Any], return_tensors: str | None) -> dict[str, Any]:
    """`pad`'s fields as transformers' BatchEncoding converts them: each field one tensor ("pt", dtype from the
    values: int64 ids, float labels stay float) or array ("np"); lists unchanged for None."""
    if return_tensors is None:
        return output
    import numpy

    converted = {}
    for key, value in output.items():
        if _tensor_kind(value) == return_tensors:
            converted[key] = value
            continue
        try:
            if return_tensors == "pt":
                import torch

                if isinstance(value, list) and value and isinstance(value[0], numpy.ndarray):
                    converted[key] = torch.from_numpy(numpy.array(value))
                else:
                    converted[key] = torch.tensor(value, dtype=torch.int64 if _is_empty(value) else None)
            else:
                ragged = isinstance(value, (list, tuple)) and value and isinstance(value[0], (list, tuple))
                if ragged and len({len(row) for row in value}) > 1:
                    # As transformers: rows of different lengths (labels it does not pad) as an array of objects.
                    rows = numpy.empty(len(value), dtype=object)
                    rows[:] = [numpy.asarray(row) for row in value]
                    converted[key] = rows
                else:
                    converted[key] = numpy.asarray(value, dtype=numpy.int64 if _is_empty(value) else None)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{key!r} makes no tensor ({error}): its rows differ in length or nesting (pad pads only "
                f"input_ids, token_type_ids, attention_mask and special_tokens_mask, the way transformers' pad does, "
                f"and never shortens a row longer than max_length)"
            ) from error
    return converted


def _is_empty(value: Any) -> bool:
    """Whether a (nested) list holds no value at all: transformers makes it an int64 tensor."""
    if not isinstance(value, (list, tuple)):
        return False
    return all(_is_empty(item) for item in value)


def _stacked(masks: list[Any]) -> Any:
    """4-D attention masks (one matrix per row) stacked into one tensor or array, as transformers' `pad`."""
    if _tensor_kind(masks[0]) == "pt":
        import torch

        return torch.stack(masks)
    import numpy

    return numpy.stack(masks) if _tensor_kind(masks[0]) == "np" else numpy.array(masks)


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
