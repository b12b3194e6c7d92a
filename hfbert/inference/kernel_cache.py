"""The measured kernel choices kept on disk, so that a process reuses what an earlier one measured on this machine.

`measured.py` times each candidate kernel for each block shape once per process: several seconds per model before
its first text (all-MiniLM-L6-v2's `optimize_for_inference` spends most of its time there). Each choice depends
only on the machine, not on the model's weights, so it is kept in a JSON file that later processes read instead of
measuring again (an HTTP server's workers and Ray actors start many processes on one machine):

- where: `$HFBERT_CACHE/kernels/`, else the platform's cache folder (`$XDG_CACHE_HOME/hfbert/kernels/`, by default
  `~/.cache/hfbert/kernels/`); `HFBERT_KERNEL_CACHE=off` measures in every process and reads and writes nothing;
- keyed by everything a choice depends on (`machine()`): the CPU (vendor, family, model, name and its
  instruction-set flags), torch's version, hfbert's version and the source of the kernels it times, every
  environment cap in every spelling (`hfbert.platform.cpu.ENVIRONMENT_CAPS`), MKL's branch and the thread count.
  One file per key (its name a hash of the key, the key itself inside it), one entry per block shape and row counts:
  a machine, torch or cap that changed finds no file of its own and measures again;
- written whole to a temporary file in the same folder and renamed over the old one (`os.replace`): a reader sees
  the old file or the new one, never half of one; processes measuring at once each merge what the file holds, and
  the last rename wins (an entry lost that way is measured again). Files get the umask's permissions;
- read as JSON only, never executed; a file that is not this format, holds another key or choices out of range is
  ignored with one warning, and its entries measured again (and written over it). A folder that cannot be written
  warns once; the choices are still measured, and used in this process.

The first measurement in a process that found nothing cached says so once, on the `hfbert` logger (a warning, so
that it shows without logging set up), naming the file it fills.

    >>> from hfbert.inference.kernel_cache import cache_file
    >>> cache_file()  # doctest: +SKIP
    PosixPath('/home/me/.cache/hfbert/kernels/3f9c0e2a51b7d4e8.json')
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import secrets
import warnings
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch

from hfbert.platform import mkl
from hfbert.platform.cpu import cpu_identity, environment_caps

LOCATION = "HFBERT_CACHE"  # the folder of hfbert's caches (the kernel choices go in its `kernels/`)
SWITCH = "HFBERT_KERNEL_CACHE"  # "off" (or 0, false, no): measure in every process, read and write nothing
FORMAT = "hfbert kernel choices 1"
MAX_BYTES = 1 << 20  # far more than every shape of every model: a larger file is not one of these

log = logging.getLogger("hfbert")


class _Said:
    """What this process has said already: the first-measurement note, and each warning once per file."""

    measuring = False
    warned: set[str] = set()


def enabled() -> bool:
    """Whether the choices are read from and written to disk (`HFBERT_KERNEL_CACHE` is not off)."""
    return os.environ.get(SWITCH, "").strip().lower() not in ("off", "0", "false", "no")


def cache_dir() -> Path:
    """The folder the choices go in: `$HFBERT_CACHE/kernels`, else `$XDG_CACHE_HOME/hfbert/kernels`, else
    `~/.cache/hfbert/kernels`. RuntimeError where none is set and the home folder cannot be found."""
    if os.environ.get(LOCATION):
        root = Path(os.environ[LOCATION]).expanduser()
    elif os.environ.get("XDG_CACHE_HOME"):
        root = Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "hfbert"
    else:
        root = Path.home() / ".cache" / "hfbert"
    return root / "kernels"


def _usable() -> bool:
    """Whether the cache is on and has a folder: without a home folder (a service user without one, and none of
    the variables set) the choices are measured in each process, as with the cache off."""
    if not enabled():
        return False
    try:
        cache_dir()
    except RuntimeError:
        return False
    return True


def machine(threads: int) -> dict[str, Any]:
    """Everything a measured choice depends on besides the block's shape, as JSON holds it: a different value is
    another file (a stale choice is never used)."""
    return {
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "hfbert": _hfbert_version(),
        "kernels": _kernels_source(),
        "caps": environment_caps(),
        "mkl": mkl.STATE.reason,
        "threads": threads,
    }


@functools.cache
def _hfbert_version() -> str:
    """The installed distribution's version, read from its metadata: importing the package from this floor would
    be an import upward (the package root stands on the tools floor)."""
    try:
        return importlib.metadata.version("hfbert")
    except importlib.metadata.PackageNotFoundError:  # a checkout run without installing it
        return "not installed"


@functools.cache
def _kernels_source() -> str:
    """A hash of this floor's source: the candidates a choice indexes are defined here, and a choice made by other
    code (an edited checkout with the same version number) could name another kernel."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_file(threads: int | None = None) -> Path:
    """The file holding this machine's choices (for `threads`, by default torch's thread count now)."""
    return _file(machine(torch.get_num_threads() if threads is None else threads))


def _file(key: dict[str, Any]) -> Path:
    return cache_dir() / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.json"


def entry_name(key: Hashable, row_counts: Sequence[int]) -> str | None:
    """The name of a block's choices in the file: its key and row counts as JSON; None where the key holds
    something with no name that is the same in every process (a lambda, a module): that choice is not cached."""
    try:
        return json.dumps([_plain(key), list(row_counts)])
    except _NoStableNameError:
        return None


class _NoStableNameError(Exception):
    pass


def _plain(part: object) -> object:
    if part is None or isinstance(part, (bool, int, float, str)):
        return part
    if isinstance(part, torch.dtype):
        return str(part)
    if isinstance(part, tuple):
        return [_plain(item) for item in part]
    qualname, module = getattr(part, "__qualname__", None), getattr(part, "__module__", None)
    if callable(part) and isinstance(qualname, str) and "<" not in qualname and isinstance(module, str):
        return f"{module}.{qualname}"  # a function by name (the feed-forward activation: F.gelu, gelu_new)
    raise _NoStableNameError


def load(name: str, rows: int, candidates: int, threads: int) -> tuple[int, ...] | None:
    """The cached choice named `name` for this machine: one index below `candidates` for each of `rows` row counts;
    None where there is none (or the cache is off, or its file is not usable: warned once)."""
    if not _usable():
        return None
    key = machine(threads)
    path = _file(key)
    choices = _read(path, key)
    if choices is None or name not in choices:
        return None
    choice = choices[name]
    valid = (
        isinstance(choice, list)
        and len(choice) == rows
        and all(type(index) is int and 0 <= index < candidates for index in choice)
    )
    if not valid:
        _warn(path, f"its entry {name} is not {rows} choices among {candidates} kernels")
        return None
    return tuple(choice)


def store(name: str, choice: Sequence[int], threads: int) -> None:
    """Add a measured choice to this machine's file, atomically; where it cannot be written, warn once."""
    if not _usable():
        return
    key = machine(threads)
    path = _file(key)
    choices = _read(path, key, warn=False) or {}
    choices[name] = list(choice)
    text = json.dumps({"format": FORMAT, "machine": key, "choices": choices}, indent=1, sort_keys=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # os.open with 0o666, not tempfile (0o600): the file gets the umask's permissions, as any other file.
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())  # the data on disk before the rename makes it the file: never an empty one
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        _warn(path, f"it cannot be written ({error.strerror or error}); kernels are measured again in each process")


def note_measuring(threads: int) -> None:
    """Say once per process, before the first measurement that found nothing cached, what is happening."""
    if _Said.measuring or not _usable():
        return
    _Said.measuring = True
    log.warning(
        "hfbert: measuring which CPU kernels run fastest here (a few seconds, once per block shape); "
        "the choices are cached in %s for later processes (HFBERT_KERNEL_CACHE=off: do not cache)",
        cache_file(threads),
    )


def _read(path: Path, key: dict[str, Any], warn: bool = True) -> dict[str, Any] | None:
    """The choices in `path` where it is this format and holds `key`; None where it does not exist, or (warned
    once) is anything else."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):  # nothing cached yet (`store` says why it cannot write)
        return None
    except OSError as error:
        return _ignored(path, f"it cannot be read ({error.strerror or error})", warn)
    if len(data) > MAX_BYTES:
        return _ignored(path, f"it is larger than {MAX_BYTES} bytes", warn)
    try:
        content = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # RecursionError: nested past Python's limit
        return _ignored(path, f"it is not JSON ({error})", warn)
    if not isinstance(content, dict) or content.get("format") != FORMAT or not isinstance(content.get("choices"), dict):
        return _ignored(path, f"it is not a file of {FORMAT!r}", warn)
    if content.get("machine") != json.loads(json.dumps(key)):
        return _ignored(path, "it holds the choices of another machine, torch or environment", warn)
    return content["choices"]


def _ignored(path: Path, why: str, warn: bool) -> None:
    if warn:
        _warn(path, why)
    return None


def _warn(path: Path, why: str) -> None:
    """One line, once per file and process: the cache is never a reason to fail, only to measure again."""
    if str(path) in _Said.warned:
        return
    _Said.warned.add(str(path))
    warnings.warn(f"hfbert's kernel cache {path} is ignored: {why}", RuntimeWarning, stacklevel=2)
