"""Reading a JSON file that a checkpoint, tokenizer or artifact folder holds: one reader, one set of messages.

A file from a download or another tool can be anything: bad UTF-8, bad JSON, an integer of more than 4300 digits
(Python refuses to convert it, a ValueError), brackets nested deeper than the recursion limit (a RecursionError,
which no `except ValueError` catches), or another value than the object the caller expects. Each becomes one
exception of the caller's type naming the file. An OSError (no such file, no permission) is passed on unchanged,
so a caller can say what a missing file means for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path, *, error: type[ValueError] = ValueError) -> Any:
    """The JSON value in `path`; `error` naming the file when it is not valid UTF-8 JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as problem:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        reason = " ".join(str(problem).split())[:200] if isinstance(problem, ValueError) else "nested too deeply"
        raise error(f"{path}: not valid JSON ({reason})") from None


def read_json_object(path: Path, *, missing_ok: bool = False, error: type[ValueError] = ValueError) -> dict[str, Any]:
    """The JSON object in `path`; `error` naming the file when it holds anything else. With `missing_ok`, {} when
    `path` is not a file (an optional file of the folder)."""
    if missing_ok and not path.is_file():
        return {}
    value = read_json(path, error=error)
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
