"""What a folder's tokenizer files say about its ids, read without the tokenizers library: the vocabulary, and the
id of every token.

`save_pretrained` asks whether the tokenizer a save leaves in a folder goes with the model (`converters/saving.py`).
It only warns, so these readers are lenient: what cannot be read is skipped, and loading the tokenizer names it.
`read_vocab_txt`, `read_vocab_json` and `read_merges_txt` are also the tokenizer's own readings of WordPiece's
vocab.txt and byte-level BPE's vocab.json + merges.txt (`hfbert/modeling/tokenizer.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converters.json_files import read_json_object


def read_vocab_txt(path: Path) -> dict[str, int]:
    """vocab.txt's token -> id (its line number), as transformers' load_vocab reads it: text mode (universal
    newlines), only "\\n" stripped (str.splitlines would also split on \\x0b, \\x1c, \\u2028, ..., which real
    vocabularies contain), and a repeated token keeps its last line. UnicodeDecodeError for a file not in UTF-8."""
    with open(path, encoding="utf-8") as handle:
        return {line.rstrip("\n"): index for index, line in enumerate(handle)}


def read_vocab_json(path: Path) -> dict[str, int]:
    """vocab.json's token -> id (a byte-level BPE vocabulary, RoBERTa's); ValueError naming the file for anything
    but a JSON object of strings to non-negative integers."""
    vocab = read_json_object(path)
    bad = next((token for token, index in vocab.items() if not _is_id(index)), None)
    if bad is not None:
        raise ValueError(f"{path}: token {bad!r} has id {vocab[bad]!r}; expected a non-negative integer")
    return vocab


def read_merges_txt(path: Path) -> list[tuple[str, str]]:
    """merges.txt's merges in rank order, as the tokenizers library reads the file: lines starting with "#version"
    skipped, every other line two parts separated by one space. ValueError naming the file and line otherwise."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not valid UTF-8 ({error.reason})") from None
    # Split on "\n" alone and drop one "\r" before it, as Rust's `lines()`; text mode would also split at a lone "\r".
    lines = text.split("\n")
    if not lines[-1]:  # the end of the last line, or an empty file
        lines.pop()
    merges = []
    for number, line in enumerate(lines, 1):
        line = line.removesuffix("\r")
        if line.startswith("#version"):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise ValueError(f"{path}: line {number} is {line[:80]!r}; expected two tokens separated by one space")
        merges.append((parts[0], parts[1]))
    return merges


def vocabulary(directory: Path, tokenizer_json: Any = None) -> dict[str, Any] | bytes | None:
    """The token -> id table the tokenizer in `directory` is built on, before added tokens: tokenizer.json's model
    vocabulary where there is one (transformers' fast tokenizers and hfbert read it first), else vocab.txt's lines,
    else vocab.json's object (byte-level BPE).
    A file that cannot be read so is compared by its bytes; None without any of them. `tokenizer_json`: the file's
    JSON when the caller has read it."""
    path = directory / "tokenizer.json"
    if path.is_file():
        model = (tokenizer_json if tokenizer_json is not None else _json_file(path)).get("model")
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, list):  # Unigram: [token, score] pairs, the id is the position
            return {str(entry[0]): index for index, entry in enumerate(vocab) if isinstance(entry, list) and entry}
        return vocab if isinstance(vocab, dict) else path.read_bytes()
    path = directory / "vocab.txt"
    if path.is_file():
        try:
            return read_vocab_txt(path)
        except UnicodeDecodeError:
            return path.read_bytes()
    path = directory / "vocab.json"
    if not path.is_file():
        return None
    return _json_file(path) or path.read_bytes()


def token_ids(directory: Path) -> dict[str, int]:
    """Every token the tokenizer files in `directory` give an id, with that id: the vocabulary and the added tokens
    (tokenizer.json's `added_tokens`, tokenizer_config.json's `added_tokens_decoder`, legacy added_tokens.json).
    Entries that are not a token and an integer id are skipped: loading the tokenizer names those."""
    tokenizer_json = _json_file(directory / "tokenizer.json")
    table = vocabulary(directory, tokenizer_json)
    ids = {token: index for token, index in table.items() if _is_id(index)} if isinstance(table, dict) else {}
    added = tokenizer_json.get("added_tokens")
    for entry in added if isinstance(added, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and _is_id(entry.get("id")):
            ids[entry["content"]] = entry["id"]
    decoder = _json_file(directory / "tokenizer_config.json").get("added_tokens_decoder")
    for key, entry in decoder.items() if isinstance(decoder, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("content"), str) and key.isascii() and key.isdigit():
            ids[entry["content"]] = int(key)
    legacy = _json_file(directory / "added_tokens.json")
    ids.update({token: index for token, index in legacy.items() if _is_id(index)})
    return ids


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _json_file(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when there is none or it cannot be read (the tokenizer's loader names that)."""
    try:
        return read_json_object(path, missing_ok=True)
    except (OSError, ValueError):
        return {}
