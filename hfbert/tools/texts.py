"""Input texts, one per line, read lazily and once, with invalid UTF-8 named by its line and column.

`-` means standard input (the Unix convention). Every input is read exactly once, front to back, so a pipe,
`/dev/stdin` or a FIFO works as well as a file: nothing is counted in a first pass and then read again.
`read_texts` is the one reader of text files (`hfbert embed --file`, `hfbert parity --texts`): plain lines, or
JSONL with a "text" field per line; every problem is named by file and line.

Each text's Unicode is checked once (`check_unicode`), where it can be named best: by file and line as it is read,
else by its place in the input as it is written (`hfbert.tools.embedding_output`); what has been checked travels
as `CheckedLines` / `CheckedTexts`, which the writers and encoders take without checking again.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path

STDIN = "-"


def display_name(path: str | os.PathLike) -> str:
    """How messages name an input: `<stdin>` for `-`, else the path as given."""
    return "<stdin>" if os.fspath(path) == STDIN else os.fspath(path)


def numbered_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its end-of-line) for each line of a UTF-8 text file, read lazily.

    `path` "-" reads standard input. Lines end at "\\n" ("\\r\\n" too). Each line is decoded on its own, so
    invalid UTF-8 is reported with its line number (a text-mode file decodes blocks of 8 KB and could only say
    "somewhere in this block")."""
    name = display_name(path)
    with nullcontext(sys.stdin.buffer) if os.fspath(path) == STDIN else open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{name}:{number}: not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})"
                ) from None
            yield number, line.removesuffix("\n").removesuffix("\r")


class CheckedLines(Iterator[str]):
    """`read_texts`' texts, read lazily: each one valid Unicode (a line decoded from UTF-8, a JSONL text checked),
    so that the writers and encoders take them without checking them again."""

    def __init__(self, lines: Iterator[str]) -> None:
        self._lines = lines

    def __next__(self) -> str:
        return next(self._lines)


class CheckedTexts(list):
    """A list of texts (or of text pairs) whose Unicode has been checked, each under the name of its place in the
    input (`hfbert.tools.embedding_output.write_in_input_order`, `hfbert.tools.reranking.rank_file`): the encoders
    take it without checking it again."""


def is_checked(texts: object) -> bool:
    """Whether `texts` were checked already (`CheckedLines`, `CheckedTexts`)."""
    return isinstance(texts, (CheckedLines, CheckedTexts))


def check_texts(texts: Sequence[object]) -> None:
    """TypeError naming the first item of `texts` that is no str, ValueError the first that is not valid Unicode,
    each as "text {index}" (its place in `texts`); nothing to do for texts checked already (`is_checked`)."""
    if is_checked(texts):
        return
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {index} is a {type(text).__name__}, not a str")
        check_unicode(text, f"text {index}")


def read_texts(path: str | os.PathLike, *, skip_blank: bool = False) -> Iterator[str]:
    """The texts of a file (`-`: standard input), lazily and once: one per line; a `.jsonl` file holds one JSON
    object with a "text" per line. Every line counts (an empty line of a text file is an empty text), so index i
    is line i; `skip_blank=True` leaves out lines that are empty or only whitespace instead. ValueError naming the
    file and line for invalid UTF-8, bad JSON, a line without a string "text", or a text that is not valid Unicode
    (a lone surrogate such as "\\ud800" in JSON). The texts come as `CheckedLines`: nothing checks them again."""
    return CheckedLines(_texts(path, skip_blank))


def _texts(path: str | os.PathLike, skip_blank: bool) -> Iterator[str]:
    jsonl = Path(path).suffix == ".jsonl"
    name = display_name(path)
    for number, line in numbered_lines(path):
        if jsonl:
            line = _jsonl_text(line, f"{name}:{number}")
        if skip_blank and not line.strip():
            continue
        yield line


def _jsonl_text(line: str, where: str) -> str:
    try:
        record = json.loads(line)
    # ValueError: bad JSON, and integers of more than 4300 digits; RecursionError: arrays nested 100,000 deep.
    except (ValueError, RecursionError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else type(error).__name__
        raise ValueError(f"{where}: not a JSON object ({reason})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise ValueError(f'{where}: expected a JSON object with a string "text" field')
    text = record["text"]
    check_unicode(text, f"{where}: the text")
    return text


def check_unicode(text: str, what: str) -> None:
    """ValueError "WHAT is not valid Unicode: ..." when `text` cannot be encoded as UTF-8: a lone surrogate
    ("\\ud800" in JSON, or command-line bytes that were not UTF-8), which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{what} is not valid Unicode: {text[error.start]!r} at position {error.start} (a lone surrogate; was it "
            f"decoded from bytes that are not UTF-8?)"
        ) from None


def is_regular_file(path: str | os.PathLike | None) -> bool:
    """True for a plain file on disk (which can be read twice), False for `-`, a pipe, a FIFO, a device."""
    if path is None or os.fspath(path) == STDIN:
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def count_lines(path: str | os.PathLike) -> int | None:
    """The number of lines of a regular file (a last line without its end-of-line counts), read as bytes;
    None for anything that cannot be read twice (`-`, a pipe), which must not be consumed here."""
    if not is_regular_file(path):
        return None
    lines, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def refuse_output_over_stdin(outputs: Mapping[str, str | os.PathLike | None], source: str | os.PathLike | None) -> None:
    """ValueError, before anything runs, when `source` is `-` and an output (option -> path) is the very file
    standard input reads (same device and inode: `--file - --out texts.jsonl < texts.jsonl`), which writing would
    replace while it is read."""
    if source is None or os.fspath(source) != STDIN:
        return
    try:
        reading = os.fstat(sys.stdin.fileno() if sys.stdin is not None else 0)
    except (OSError, ValueError, AttributeError):  # no standard input, or one replaced by an object without a file
        return
    for option, output in outputs.items():
        if output is None or os.fspath(output) == STDIN:
            continue
        try:
            written = os.stat(output)
        except OSError:
            continue
        if (written.st_dev, written.st_ino) == (reading.st_dev, reading.st_ino):
            raise ValueError(
                f"{option} {os.fspath(output)}: the output is the file standard input reads (--file -); refusing "
                f"to overwrite it, choose another output"
            )


def check_input_file(path: str | os.PathLike, option: str, *, read: bool = True) -> int | None:
    """An input file checked before any model loads (a load takes seconds; a typo should not): ValueError naming
    `option` and `path` when there is no such file, it is a folder or it cannot be read; for a regular file, read
    once here (unless `read` is False: the quick checks only), every problem `read_texts` would find later (invalid
    UTF-8, and in a .jsonl file a line that is not a JSON object with a string "text"), named by file and line as it
    names them. Returns the line count of a regular file (`count_lines`'), None for `-`, a pipe or a FIFO (those
    are read once, later, and checked then) and where `read` is False."""
    if os.fspath(path) == STDIN:
        return None
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{option} {os.fspath(path)}: no such file") from None
    except OSError as error:
        raise ValueError(f"{option} {os.fspath(path)}: cannot be read ({error.strerror})") from None
    if stat.S_ISDIR(status.st_mode):
        raise ValueError(f"{option} {os.fspath(path)}: is a folder; give a file of texts, one per line")
    if not stat.S_ISREG(status.st_mode):
        return None
    if not os.access(path, os.R_OK):
        raise ValueError(f"{option} {os.fspath(path)}: cannot be read (permission denied)")
    if not read:
        return None
    try:
        if Path(path).suffix == ".jsonl":  # each line parsed, as `read_texts` will parse it
            return sum(1 for _ in _texts(path, skip_blank=False))
        return _checked_line_count(path)
    except OSError as error:
        raise ValueError(f"{option} {os.fspath(path)}: cannot be read ({error.strerror})") from None


def _checked_line_count(path: str | os.PathLike) -> int:
    """`count_lines(path)`, the file decoded as UTF-8 on the way, in blocks (fast): where it is not, the line and
    column are found by `numbered_lines`, which raises naming them."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    lines, last = 0, b"\n"
    try:
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                decoder.decode(block)
                lines += block.count(b"\n")
                last = block[-1:]
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        for _ in numbered_lines(path):
            pass
        raise ValueError(f"{path}: not valid UTF-8") from None  # not reached: a line of it is not valid UTF-8
    return lines + (last != b"\n")


def check_output_folders(outputs: Mapping[str, str | os.PathLike | None]) -> None:
    """ValueError, before anything runs, naming the option of an output (option -> path; None and `-`, standard
    output, are skipped) whose folder does not exist, or which is a folder itself."""
    for option, output in outputs.items():
        if output is None or os.fspath(output) == STDIN:
            continue
        target = Path(output)
        if target.is_dir():
            raise ValueError(f"{option} {os.fspath(output)}: is a folder; give a file name")
        if not target.resolve().parent.is_dir():
            raise ValueError(f"{option} {os.fspath(output)}: the directory {target.resolve().parent} does not exist")
