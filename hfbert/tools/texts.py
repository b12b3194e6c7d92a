"""Input texts, one per line, read lazily, with invalid UTF-8 named by its line and column."""

from __future__ import annotations

import os
from collections.abc import Iterator


def numbered_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its end-of-line) for each line of a UTF-8 text file, read lazily.

    Lines end at "\n" ("\r\n" too). Each line is decoded on its own, so invalid UTF-8 is reported with its line
    number (a text-mode file decodes blocks of 8 KB and could only say "somewhere in this block")."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{number}: not valid UTF-8 (byte {raw[error.start]:#04x} at column {error.start + 1})"
                ) from None
            yield number, line.removesuffix("\n").removesuffix("\r")


def count_lines(path: str | os.PathLike) -> int:
    return sum(1 for _ in numbered_lines(path))
