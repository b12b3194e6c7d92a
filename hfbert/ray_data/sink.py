"""Where a corpus job's rows go: `ParquetFolder`, a Ray Data `Datasink` that writes each write task's blocks as one
Parquet file into a folder (a local path or any URI pyarrow's file systems open: s3://, gs://, ...), whole or not
at all, and under a name its rows decide.

- Whole or not at all: the file is written under `_partial/` in the folder (a name Parquet readers skip: `_` and
  `.` prefixes are hidden) and moved into place once complete, so a visible `*.parquet` is always a finished file,
  whatever kills the job (on object storage an upload appears whole anyway).
- Named by its rows: `part-<sha256 of its ids>.parquet`. A write task that Ray retries (its worker died after the
  move) writes the same rows under the same name, replacing the first copy: a row is never there twice.

The finished files are the job's record of what is done (`finished_ids`): a rerun reads their id column and computes
only the rest. The manifest `_hfbert.json` (model, outputs, options) lets a rerun refuse to mix other outputs in.
Importing this module imports Ray (`hfbert.ray_data`'s other modules do not).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import Iterable
from typing import Any

from ray.data import Datasink

from hfbert.tools.extras import import_optional

PARTIAL = "_partial"
MANIFEST = "_hfbert.json"
__all__ = ["MANIFEST", "PARTIAL", "ParquetFolder", "file_system", "finished_files", "finished_ids", "visible_rows"]


def file_system(folder: str) -> tuple[Any, str]:
    """pyarrow's file system for `folder` (a local path, relative or not, or a URI) and the path in it."""
    import os

    fs = import_optional("pyarrow.fs", "hfbert.ray_data needs pyarrow: pip install 'hfbert[ray]'")
    return fs.FileSystem.from_uri(folder if "://" in folder else os.path.abspath(folder))


def finished_files(folder: str) -> list[str]:
    """The folder's visible Parquet files (none where it does not exist): the finished output, sorted."""
    fs = import_optional("pyarrow.fs", "hfbert.ray_data needs pyarrow: pip install 'hfbert[ray]'")
    system, path = file_system(folder)
    if system.get_file_info(path).type == fs.FileType.NotFound:
        return []
    entries = system.get_file_info(fs.FileSelector(path, recursive=False))
    return sorted(
        entry.path
        for entry in entries
        if entry.type == fs.FileType.File and entry.base_name.endswith(".parquet") and entry.base_name[0] not in "._"
    )


def finished_ids(folder: str, id_column: str) -> Any:
    """The ids the folder's finished files hold, as one pyarrow array (empty: none)."""
    import pyarrow
    import pyarrow.parquet as pq

    system, _ = file_system(folder)
    arrays = [
        pq.read_table(path, columns=[id_column], filesystem=system).column(id_column) for path in finished_files(folder)
    ]
    return (
        pyarrow.chunked_array([chunk for array in arrays for chunk in array.chunks]).combine_chunks()
        if arrays
        else None
    )


def visible_rows(folder: str) -> int:
    """How many rows the folder's finished files hold (from their footers: nothing else is read)."""
    import pyarrow.parquet as pq

    system, _ = file_system(folder)
    return sum(pq.ParquetFile(path, filesystem=system).metadata.num_rows for path in finished_files(folder))


class ParquetFolder(Datasink):
    """The `Datasink` of the module docstring: each write task's rows as one Parquet file in `folder`, named by the
    values of `id_column`. `write` returns how many rows it wrote."""

    def __init__(self, folder: str, id_column: str) -> None:
        self.folder, self.id_column = folder, id_column

    def write(self, blocks: Iterable[Any], ctx: Any) -> int:
        import pyarrow
        import pyarrow.parquet as pq
        from ray.data.block import BlockAccessor

        tables = [BlockAccessor.for_block(block).to_arrow() for block in blocks]
        tables = [table for table in tables if table.num_rows]
        if not tables:
            return 0
        table = pyarrow.concat_tables(tables).combine_chunks()
        ids = json.dumps(table.column(self.id_column).to_pylist(), default=str).encode()
        name = f"part-{hashlib.sha256(ids).hexdigest()[:32]}.parquet"
        system, path = file_system(self.folder)
        system.create_dir(f"{path}/{PARTIAL}", recursive=True)
        partial = f"{path}/{PARTIAL}/{name}.{uuid.uuid4().hex}"
        try:
            pq.write_table(table, partial, filesystem=system)
            system.move(partial, f"{path}/{name}")
        except BaseException:
            _remove(system, partial)
            raise
        return table.num_rows


def _remove(system: Any, path: str) -> None:
    with contextlib.suppress(OSError):  # never written: nothing to remove
        system.delete_file(path)
