"""Every file and directory hfbert writes appears whole or not at all.

A writer works on a temporary sibling of its destination (`.NAME.partial-PID-RANDOM`, same directory, so the final
`os.replace` / `os.rename` is atomic on one filesystem) and renames it into place only on success; on any error
the temporary is removed and an existing destination is left untouched.

Permissions are those a plain `open()` / `mkdir()` would give, not the private ones of `tempfile`'s temporaries
(0600 / 0700): a new file or directory follows the umask (0644 / 0755 under umask 022), and a file written over
an existing one keeps that file's mode (an 0600 file stays 0600). Used by `hfbert embed` (.npy / .jsonl),
`hfbert convert` and `save_pretrained` (through `converters.writing.atomic_directory`), and the tokenizer files.

A process killed with SIGKILL cannot clean up; its temporaries carry its process id, so the next write to the
same destination removes every sibling temporary whose process is gone (`remove_leftovers`). SIGTERM is turned
into an ordinary exit by `exit_on_sigterm` (the CLI installs it), so it cleans up as Ctrl-C does.

    >>> with atomic_file("embeddings.jsonl") as temporary:  # doctest: +SKIP
    ...     temporary.write_text("...")
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

PARTIAL_MARK = ".partial-"


def _prefix(destination: Path) -> str:
    return f".{destination.name}{PARTIAL_MARK}"


def remove_leftovers(destination: str | os.PathLike) -> list[Path]:
    """Remove temporaries of `destination` left by processes that no longer run (killed mid-write); return them.

    Only names this module creates (`.NAME.partial-PID-...`) are touched, and only when process PID is gone, so a
    concurrent writer on this machine keeps its temporary.
    """
    destination = Path(destination)
    pattern = re.compile(re.escape(_prefix(destination)) + r"(\d+)-")
    removed = []
    try:
        siblings = list(destination.parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        match = pattern.match(sibling.name)
        if match is None or _process_alive(int(match.group(1))):
            continue
        _remove(sibling)
        removed.append(sibling)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OverflowError:  # a pid beyond the OS range: not a name this module wrote, so leave it alone
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def temporary_sibling(destination: str | os.PathLike, *, directory: bool = False) -> Path:
    """Create an empty temporary file (or directory) beside `destination`, after removing stale leftovers.

    A checkpoint directory's parents are created (as `save_pretrained` does); a file's parent must exist, so that
    a mistyped output path fails instead of growing a directory tree."""
    destination = Path(destination)
    if directory:
        destination.parent.mkdir(parents=True, exist_ok=True)
    elif not destination.parent.is_dir():
        raise FileNotFoundError(f"{destination}: the directory {destination.parent} does not exist")
    remove_leftovers(destination)
    prefix = f"{_prefix(destination)}{os.getpid()}-"
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=destination.parent))
    handle, name = tempfile.mkstemp(prefix=prefix, dir=destination.parent)
    os.close(handle)
    return Path(name)


@contextmanager
def atomic_file(destination: str | os.PathLike) -> Iterator[Path]:
    """Yield the path of an empty temporary file beside `destination`; when the block ends without an exception
    it replaces `destination` (created or overwritten in one rename), otherwise it is deleted and `destination`
    keeps its old content.

        >>> with atomic_file("out.npy") as temporary:  # doctest: +SKIP
        ...     numpy.save(temporary, array)  # numpy.save(str) would append .npy: pass an open file instead
    """
    destination = Path(destination)
    temporary = temporary_sibling(destination)
    try:
        yield temporary
        # mkstemp creates the file 0600; give the result the permissions a plain open() would.
        os.chmod(temporary, mode_for(destination))
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)


def mode_for(destination: str | os.PathLike) -> int:
    """The permission bits a write to the file `destination` should leave: those of the file already there (its
    mode is the owner's choice), else what `open()` gives under the umask."""
    try:
        return stat.S_IMODE(os.stat(destination).st_mode)
    except OSError:  # no such file (or unreadable metadata): a new file
        return 0o666 & ~_umask()


def follow_umask(root: str | os.PathLike) -> None:
    """Give the directory `root` and everything in it the permissions `mkdir()` / `open()` give under the umask
    (0755 / 0644 under 022): `mkdtemp` made it 0700, and some writers (safetensors 0.8) create files 0600."""
    mask = _umask()
    directory_mode, file_mode = 0o777 & ~mask, 0o666 & ~mask
    for parent, _, files in os.walk(root):
        os.chmod(parent, directory_mode)
        for name in files:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)


def _umask() -> int:
    """The process umask. Linux says it in /proc without changing it; elsewhere it is set and restored, which
    another thread creating a file at that instant would feel."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_same_file(output: str | os.PathLike | None, inputs: Mapping[str, str | os.PathLike | None]) -> None:
    """Raise ValueError when `output` is the same file as one of `inputs` (same inode: also through symlinks and
    hard links), before anything is read or written. `inputs` maps a description ("--file") to a path."""
    if output is None or not os.path.exists(output):
        return
    for description, path in inputs.items():
        if path is not None and os.path.exists(path) and os.path.samefile(output, path):
            raise ValueError(
                f"{output}: the output is the same file as the input {description} ({path}); refusing "
                f"to overwrite it, choose another output"
            )


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) in the main thread, so `finally` blocks and context
    managers (temporaries above all) clean up as they do for Ctrl-C. Outside the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signal_number: int, frame: object) -> None:
        raise SystemExit(128 + signal_number)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
