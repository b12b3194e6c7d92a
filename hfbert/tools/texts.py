"""Input texts, one per line, read lazily and once, with invalid UTF-8 named by its line and column.

`-` means standard input (the Unix convention). Every input is read exactly once, front to back, so a pipe,
`/dev/stdin` or a FIFO works as well as a file: nothing is counted in a first pass and then read again.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator, Mapping

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
    if os.fspath(path) == STDIN:
        yield from _numbered(sys.stdin.buffer, name)
        return
    with open(path, "rb") as handle:
        yield from _numbered(handle, name)


def _numbered(handle, name: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(handle, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"{name}:{number}: not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})"
            ) from None
        yield number, line.removesuffix("\n").removesuffix("\r")


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
