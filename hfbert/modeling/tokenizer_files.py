"""A tokenizer folder's files, read and checked as transformers reads them: tokenizer_config.json and
special_tokens_map.json (every option hfbert uses: `model_max_length`, and the other defaults of a call,
`padding_side`, `truncation_side`, `model_input_names`, `split_special_tokens`, `clean_up_tokenization_spaces`, which
`from_pretrained` also takes as arguments, checked the same way), the tokens added on top of the
vocabulary (`added_tokens_decoder`, the legacy added_tokens.json, the special-token lists), and whether a
vocab.txt folder's `tokenizer_class` is BERT's WordPiece at all. A bad option is a `ConfigError` naming the file,
the field and the values it accepts; a file that is not a JSON object, a legacy added_tokens.json that is not
token -> id, or another tokenizer class is a ValueError naming the file. `hfbert/modeling/tokenizer.py` builds and
runs the tokenizer from what these return.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

from converters.json_files import read_json_object
from hfbert.modeling.config import ConfigError
from hfbert.modeling.family import WORDPIECE_TOKENIZERS

SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
# RoBERTa's and XLM-R's defaults, in transformers' order (SPECIAL_TOKENS_ATTRIBUTES), the order they are added in.
ROBERTA_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "cls_token": "<s>",
    "mask_token": "<mask>",
}
# MPNet's: RoBERTa's, but BERT's unknown token (its vocabulary is BERT's, with RoBERTa's special tokens added).
MPNET_SPECIAL_TOKENS = {**ROBERTA_SPECIAL_TOKENS, "unk_token": "[UNK]"}
# transformers' "no limit" (VERY_LARGE_INTEGER) when a config has no model_max_length; above LARGE_INTEGER a
# limit counts as none, so truncation/padding "to the model's length" is then skipped.
NO_MAX_LENGTH = int(1e30)
LARGE_INTEGER = int(1e20)
# The largest real limit: the tokenizers library takes lengths up to 2**64 - 1 (OverflowError beyond), so a value
# between this and LARGE_INTEGER would be a limit no call could use.
_MAX_REAL_LENGTH = 10**19
_MAX_LENGTH_VALUES = (
    "a positive integer up to 10**19, or a number above 1e20 for no limit (transformers writes int(1e30)), or null"
)
# The lists of extra special tokens a tokenizer config or special_tokens_map.json may hold.
_TOKEN_LISTS = ("extra_special_tokens", "additional_special_tokens")
# The pipeline's flags: the tokenizers library takes only true / false.
_BOOLEAN_OPTIONS = ("do_lower_case", "tokenize_chinese_chars", "add_prefix_space", "trim_offsets")
# transformers reads the clean-up flags by truthiness (`if clean_up_tokenization_spaces:`), so 1 / 0 / null, as
# older configs write flags, are taken for them too.
_TRUTHY_OPTIONS = (
    "clean_up_tokenization_spaces",
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
)
# The defaults of a call that tokenizer_config.json sets, as transformers 5 reads them; `from_pretrained` takes the
# same names as arguments, which win over the file.
CALL_OPTIONS = (
    "padding_side",
    "truncation_side",
    "model_input_names",
    "split_special_tokens",
    "clean_up_tokenization_spaces",
    "model_max_length",
)
SIDES = ("right", "left")
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def token_text(token: str | dict[str, Any] | None, default: str) -> str:
    """A special token's text as a config gives it (a string, an AddedToken object, or null for `default`)."""
    if token is None:  # not set (null): the BERT default
        return default
    return token["content"] if isinstance(token, dict) else str(token)  # older configs store AddedToken dicts


def read_tokenizer_options(path: Path) -> dict[str, Any]:
    """tokenizer_config.json (or special_tokens_map.json) as a dict, every option hfbert reads checked:
    `ConfigError` naming the file, the field and the values it accepts. `model_max_length` comes back an int."""
    values = check_call_options(read_json_object(path, missing_ok=True), path)
    for name in _BOOLEAN_OPTIONS:
        if name in values and not isinstance(values[name], bool):
            raise _option_error(path, name, values[name], "true or false")
    if values.get("strip_accents") is not None and not isinstance(values["strip_accents"], bool):
        expected = "true, false or null (follow do_lower_case)"
        raise _option_error(path, "strip_accents", values["strip_accents"], expected)
    for name in {**SPECIAL_TOKENS, **ROBERTA_SPECIAL_TOKENS}:
        if name in values and not (values[name] is None or _is_token(values[name])):
            expected = 'a non-empty string, or an object with a "content" string (an AddedToken), or null'
            raise _option_error(path, name, values[name], expected)
    for name in _TOKEN_LISTS:
        value = values.get(name)
        if value and not (isinstance(value, list) and all(_is_token(token) and _flags_valid(token) for token in value)):
            expected = 'a list of tokens (strings, or objects with a "content" string and true / false flags)'
            raise _option_error(path, name, value, expected)
    if "added_tokens_decoder" in values:
        _check_added_tokens(values["added_tokens_decoder"], path)
    return values


def check_call_options(values: dict[str, Any], source: str | os.PathLike, kind: str = "field") -> dict[str, Any]:
    """`values` with the call defaults of `CALL_OPTIONS` checked as transformers 5 checks them, and taken as it
    takes them (a clean-up flag by truthiness, `model_max_length` as an int, `model_input_names` as a list):
    `ConfigError` naming `source`, the `kind` ("field" of a file, "argument" of a call) and the values it accepts.
    Other keys come back as they are."""
    values = dict(values)
    for name in _TRUTHY_OPTIONS:
        if name in values and values[name] in (0, 1, None):  # True and False among them
            values[name] = bool(values[name])
    # The tokenizers library takes only true / false for split_special_tokens.
    for name in (*_TRUTHY_OPTIONS, "split_special_tokens"):
        if name in values and not isinstance(values[name], bool):
            raise _option_error(source, name, values[name], "true or false", kind=kind)
    for name in ("padding_side", "truncation_side"):
        if name in values and values[name] not in SIDES:
            raise _option_error(source, name, values[name], "'right' or 'left'", kind=kind)
    if "model_input_names" in values:
        names = values["model_input_names"]
        # A string would be read letter by letter (transformers takes list("input_ids")), so no field is ever named.
        if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) and name for name in names):
            expected = 'a list of input names, e.g. ["input_ids", "attention_mask"]'
            raise _option_error(source, "model_input_names", names, expected, kind=kind)
        values["model_input_names"] = list(names)
    if "model_max_length" in values:
        values["model_max_length"] = model_max_length(values["model_max_length"], source, kind)
    return values


def model_max_length(value: Any, source: str | os.PathLike, kind: str = "field") -> int:
    """tokenizer_config.json's `model_max_length` as transformers takes it: null means no limit (NO_MAX_LENGTH);
    above 1e20 is no limit too (kept, as transformers keeps it); else a positive integer the tokenizers library can
    truncate to. `ConfigError` naming `source` otherwise."""
    if value is None:
        return NO_MAX_LENGTH
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if number is None or not math.isfinite(number) or number != int(number):
        raise _option_error(source, "model_max_length", value, _MAX_LENGTH_VALUES, kind=kind)
    if number > LARGE_INTEGER or 1 <= number <= _MAX_REAL_LENGTH:
        return int(number)
    raise _option_error(source, "model_max_length", value, _MAX_LENGTH_VALUES, kind=kind)


def _check_added_tokens(decoder: Any, path: Path) -> None:
    expected = 'an object of token id -> {"content": "<token>", "special": true, ...} (flags true or false)'
    if not isinstance(decoder, dict):
        raise _option_error(path, "added_tokens_decoder", decoder, expected)
    for key, spec in decoder.items():
        valid = key.isdigit() and isinstance(spec, dict) and _is_token(spec)
        valid = valid and _flags_valid(spec)
        if not valid:
            raise _option_error(path, "added_tokens_decoder", spec, expected, entry=key)


def _flags_valid(token: Any) -> bool:
    """Whether an AddedToken object's flags (lstrip, special, ...) are true or false, as the tokenizers library
    takes them; a plain string has none."""
    return not isinstance(token, dict) or all(
        isinstance(token[flag], bool) for flag in _ADDED_TOKEN_FLAGS if flag in token
    )


def _is_token(value: Any) -> bool:
    text = value.get("content") if isinstance(value, dict) else value
    return isinstance(text, str) and text != ""


def _option_error(
    source: str | os.PathLike, name: str, value: Any, expected: str, entry: str | None = None, kind: str = "field"
) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    where = f"{kind} '{name}'" + (f" entry '{entry}'" if entry is not None else "")
    return ConfigError(f"{os.fspath(source)}: {where} is {shown}; expected {expected}")


def added_tokens(
    config: dict[str, Any],
    own: dict[str, Any],
    special_map: dict[str, Any],
    directory: Path,
    defaults: dict[str, str] = SPECIAL_TOKENS,
) -> list[AddedToken]:
    """The tokens transformers' tokenizers add on top of the vocabulary (or tokenizer.json), in their order; the
    caller adds each unless the tokenizer has it already. A config from before transformers 4.34 (no
    `added_tokens_decoder`) brings the legacy `added_tokens.json` (normalised, unless it is a special token); then
    the named special tokens (`defaults` names them and their texts; a config's AddedToken object keeps its flags,
    e.g. RoBERTa's `<mask>` with lstrip), matched on the raw text, so "[MASK]" in a text stays one token; then the
    extra special tokens (`additional_special_tokens` / `extra_special_tokens` of tokenizer_config.json, else of
    special_tokens_map.json). `config`: both files merged; `own`: tokenizer_config.json alone."""
    extras = _token_list(own, "extra_special_tokens") or _token_list(own, "additional_special_tokens")
    extras += _token_list(special_map, "extra_special_tokens")
    named = [_special_token(config.get(key), default) for key, default in defaults.items()]
    specials = [token.content for token in named]
    tokens: list[AddedToken] = []
    if "added_tokens_decoder" not in own:
        # As transformers: the legacy map's additional_special_tokens are merged after the set of special tokens
        # added_tokens.json is judged by is taken, so they do not make its tokens special.
        special = set(specials) | {token.content for token in extras}
        for text in _legacy_added_tokens(directory / "added_tokens.json"):
            tokens.append(
                AddedToken(text, lstrip=False, rstrip=False, normalized=text not in special, special=text in special)
            )
    tokens += named
    has_extras = any(key in own for key in ("extra_special_tokens", "additional_special_tokens"))
    tokens += extras if has_extras else extras + _token_list(special_map, "additional_special_tokens")
    return tokens


def _token_list(values: dict[str, Any], name: str) -> list[AddedToken]:
    """A list of special tokens (strings, or AddedToken objects as dicts) from a tokenizer config, as AddedTokens."""
    return [_special_token(token, "") for token in values.get(name) or []]  # checked by read_tokenizer_options


def _special_token(token: str | dict[str, Any] | None, default: str) -> AddedToken:
    """A special token as a config gives it: a string (matched on the raw text), an AddedToken object as a dict
    (its flags kept), or null for `default`."""
    if isinstance(token, dict):
        flags = {key: token[key] for key in ("single_word", "lstrip", "rstrip", "normalized") if key in token}
        return AddedToken(token["content"], special=True, **flags)
    return AddedToken(token_text(token, default), normalized=False, special=True)


def check_wordpiece_class(tokenizer_class: Any, path: Path) -> None:
    """ValueError naming the file when its `tokenizer_class` tokenizes a vocab.txt otherwise than BERT's WordPiece
    (BertJapaneseTokenizer splits words with MeCab first; a custom class runs its own code): hfbert builds BERT's
    pipeline only, and would give other ids silently."""
    if tokenizer_class is None or str(tokenizer_class).removesuffix("Fast") in WORDPIECE_TOKENIZERS:
        return
    raise ValueError(
        f"{path}: tokenizer_class {tokenizer_class!r} is not BERT's WordPiece tokenizer, the one hfbert builds from "
        f"vocab.txt (it would give other ids); tokenize with transformers' tokenizer for this checkpoint"
    )


def _legacy_added_tokens(path: Path) -> list[str]:
    """The tokens of a legacy added_tokens.json ({"token": id}), in id order; [] without the file."""
    added = read_json_object(path, missing_ok=True)
    if not all(isinstance(index, int) and not isinstance(index, bool) for index in added.values()):
        raise ValueError(f"{path}: expected an object of token -> id (an integer)")
    by_index = {index: token for token, index in added.items() if token}  # a repeated id keeps the last token
    return [by_index[index] for index in sorted(by_index)]
