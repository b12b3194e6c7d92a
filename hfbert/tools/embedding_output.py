"""Where `hfbert embed`'s embeddings go (`hfbert.tools.embedding.embed_file` computes them): a `.npy` file (float32,
shape (texts, dimension); rows are written as they come, not memory-mapped, and the header with the count last) or
a `.jsonl` file (one {"index", "embedding"} per line); with no output file, JSON lines on stdout.

An output file is written beside its destination and renamed into place when complete (`converters.atomic_write`):
a failed run leaves an existing output untouched and no partial file. When the number of texts is known
beforehand, the `.npy` file's space is reserved first (`posix_fallocate`), so a disk too small fails before any
work; in every case a full disk ends in one error naming the disk (`disk_full`), never in a crash.

Corpus-scale jobs, on several processes or machines, run on Ray Data instead (`hfbert embed --ray`,
`hfbert.ray_data`), which writes Parquet files.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager, nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from converters.atomic_write import atomic_file
from hfbert.tools.extras import import_numpy

NPY_HEADER_BYTES = 128  # numpy's own header length for any 2-D float32 shape below 10**40 rows
FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # no space left, disk quota exceeded
__all__ = ["disk_full", "open_writer", "output_kind", "output_writer"]


def npy_header(rows: int, dimension: int) -> bytes:
    """The .npy (format 1.0) header numpy.save writes for a (rows, dimension) float32 C-order array."""
    buffer = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, dimension)}
    import_numpy().lib.format.write_array_header_1_0(buffer, header)
    if len(buffer.getvalue()) != NPY_HEADER_BYTES:
        raise ValueError(f"{rows} x {dimension}: too large for a .npy header of {NPY_HEADER_BYTES} bytes")
    return buffer.getvalue()


class _Writer:
    """An output's handle and the rows written to it. `close()` flushes and fsyncs a complete output (a full disk
    shows here at the latest, not after the rename), then closes it; `close(complete=False)`, after a failure, only
    closes, its own error never hiding the one that stopped the run. Standard output is only flushed."""

    def __init__(self, handle: Any) -> None:
        self.handle, self.row = handle, 0

    def _complete(self) -> None:
        """What a complete output still needs before it is flushed."""

    def close(self, complete: bool = True) -> None:
        if self.handle is sys.stdout:
            self.handle.flush()
            return
        if self.handle.closed:
            return
        finished = False
        try:
            if complete:
                self._complete()
                self.handle.flush()
                os.fsync(self.handle.fileno())
                finished = True
        finally:
            try:
                self.handle.close()
            except OSError:
                if finished:
                    raise


class NpyWriter(_Writer):
    """Rows appended to a float32 .npy file as they come, the header with the final count written by `close`.
    `reserve_rows`: the expected count, whose space is allocated first (a disk too small fails at once, ENOSPC)."""

    def __init__(self, path: str | os.PathLike, dimension: int, reserve_rows: int | None = None) -> None:
        super().__init__(open(path, "wb"))  # noqa: SIM115 - closed by close()
        self.dimension = dimension
        try:
            if reserve_rows:
                _reserve(self.handle, NPY_HEADER_BYTES + 4 * dimension * reserve_rows)
            self.handle.write(npy_header(0, dimension))
        except BaseException:
            self.handle.close()
            raise

    def write(self, indices: Sequence[int], embeddings: Tensor) -> None:
        self.handle.write(embeddings.to(torch.float32).contiguous().numpy().tobytes())
        self.row += len(indices)

    def _complete(self) -> None:
        self.handle.seek(0)
        self.handle.write(npy_header(self.row, self.dimension))
        self.handle.truncate(NPY_HEADER_BYTES + 4 * self.dimension * self.row)  # space reserved beyond


def _reserve(handle: Any, size: int) -> None:
    """Allocate `size` bytes for an open file; filesystems without fallocate (and macOS, Windows) simply skip it."""
    try:
        os.posix_fallocate(handle.fileno(), 0, size)
    except (AttributeError, OSError, ValueError) as error:
        if getattr(error, "errno", None) in (*FULL_DISK, errno.EFBIG):
            raise


class JsonlWriter(_Writer):
    """One {"index", "embedding"} JSON object per line, to a file or stdout."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        super().__init__(open(path, "w", encoding="utf-8") if path is not None else sys.stdout)  # noqa: SIM115

    def write(self, indices: Sequence[int], embeddings: Tensor) -> None:
        for index, vector in zip(indices, embeddings.tolist(), strict=True):
            self.handle.write(json.dumps({"index": index, "embedding": vector}) + "\n")
        self.row += len(indices)


def open_writer(
    path: str | os.PathLike | None, dimension: int, kind: str, reserve_rows: int | None = None
) -> NpyWriter | JsonlWriter:
    """The writer of `kind` (`output_kind`) into `path` (None: stdout)."""
    return NpyWriter(path, dimension, reserve_rows) if kind == ".npy" else JsonlWriter(path)


def output_kind(path: str | os.PathLike | None) -> str:
    """The kind of output `path` is, by its suffix: ".npy" or ".jsonl" (None, standard output, is ".jsonl")."""
    if path is None:
        return ".jsonl"
    suffix = Path(path).suffix
    if suffix not in (".npy", ".jsonl"):
        raise ValueError(f"{path}: the output must be a .npy or a .jsonl file")
    return suffix


def disk_full(destination: str | os.PathLike, error: OSError, rows: int) -> OSError:
    """One line for a write that found the disk full (ENOSPC) or the quota spent (EDQUOT), naming the disk."""
    destination = Path(destination).absolute()
    mount = destination.parent
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        usage = os.statvfs(destination.parent)
        available, size = usage.f_bavail * usage.f_frsize / 2**20, usage.f_blocks * usage.f_frsize / 2**20
        free = f"{available:.1f} MiB free of {size:.1f} MiB"
    except OSError:
        free = "free space unknown"
    what = "no space left" if error.errno == errno.ENOSPC else "disk quota exceeded"
    full = OSError(
        f"{destination}: {what} on the disk holding {destination.parent} ({_mounted_device(mount)} mounted on "
        f"{mount}, {free}) after {rows} embeddings; nothing was written, free some space or choose another --out"
    )
    full.errno = error.errno
    return full


def _mounted_device(mount: Path) -> str:
    """ "/dev/vda1 (ext4)" for a mount point, from /proc/self/mounts (Linux); "the filesystem" elsewhere."""
    device = "the filesystem"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return device
    for fields in map(str.split, lines):
        # A mount point's spaces are written as octal escapes ("\040"); the last mount on a point is the visible one.
        if len(fields) > 2 and re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]) == str(mount):
            device = f"{fields[0]} ({fields[2]})"
    return device


@contextmanager
def output_writer(
    target: str | os.PathLike | None, dimension: int, kind: str, reserve_rows: int | None = None
) -> Iterator[NpyWriter | JsonlWriter]:
    """A writer (`open_writer`) whose rows appear in `target` only once the block it opens ends without error: into
    a temporary file that then replaces `target`, so a failure on line 21 leaves an existing output as it was, never
    overwritten with 20 rows. A full disk or spent quota ends in `disk_full`'s one line."""
    with atomic_file(target) if target is not None else nullcontext() as temporary:
        writer = None
        try:
            writer = open_writer(temporary, dimension, kind, reserve_rows)
            yield writer
            writer.close()
        except BaseException as error:
            if writer is not None:
                writer.close(complete=False)
            if target is not None and isinstance(error, OSError) and error.errno in FULL_DISK:
                raise disk_full(target, error, writer.row if writer else 0) from None
            raise


def write_in_input_order(
    texts: Iterable[str],
    out: str | os.PathLike | None,
    kind: str,
    dimension: int,
    write_chunk: Callable[[NpyWriter | JsonlWriter, list[int], list[str], Any], None],
    *,
    task: str,
    chunk_size: int,
    total: int | None = None,
    progress: bool = True,
    reserve: bool = False,
) -> int:
    """The loop every `hfbert embed` output shares: `texts` read lazily and once, `chunk_size` at a time, each text's
    unicode checked by its place in the input (unless `read_texts` checked it, naming file and line), and
    `write_chunk(writer, indices, texts, progress_bar)` writing that chunk's rows (`CheckedTexts`: not checked again)
    in input order into `out` (`output_writer`: whole or not at all; None: stdout). `total`: how many texts there
    are, when known (progress, and the .npy space reserved where `reserve`). Returns how many rows the output
    holds."""
    from hfbert.tools.progress import Progress
    from hfbert.tools.texts import CheckedTexts, check_unicode, is_checked

    if isinstance(texts, str):  # iterating it would give one text per character
        raise TypeError("texts is a str: give a list of texts ([text] for one), or read_texts(path) for a file")
    if chunk_size < 1:
        raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
    bar = Progress(total, task, "text", enabled=progress)
    with closing(bar), output_writer(out, dimension, kind, total if reserve else None) as writer:
        numbered = enumerate(texts)
        checked = is_checked(texts)  # a file's, by read_texts: named by file and line
        while chunk := list(islice(numbered, chunk_size)):
            for index, text in chunk if not checked else ():  # named by their place in the input
                check_unicode(text, f"text {index}")
            # Checked: the encoders the chunk goes to do not check it again.
            write_chunk(writer, [index for index, _ in chunk], CheckedTexts(text for _, text in chunk), bar)
    return writer.row


def write_json_line(writer: NpyWriter | JsonlWriter, line: dict[str, Any]) -> None:
    """One row of a JSON-lines output whose rows are not dense vectors (sparse weights, bge-m3's outputs)."""
    writer.handle.write(json.dumps(line) + "\n")
    writer.row += 1
