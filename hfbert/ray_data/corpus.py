"""`embed_corpus`: what `hfbert embed MODEL --file corpus.parquet|.jsonl --id-column id --out DIR --ray` runs. A
corpus file in, Parquet files of the id column and the output columns in a folder out, by Ray Data, resumable.

The order of work:

1. Before any model loads: the folder's manifest (`_hfbert.json`) matches this job's model, outputs and options (a
   folder of other outputs, or of Parquet files hfbert did not write, is refused); the input has the id and text
   columns, the texts are strings, no id or text is null, and no id comes twice (one pass over those two columns;
   the ids are held on the driver, as Ray Data's own checkpointing holds them). Each is one error naming the
   column, and the first offending id.
2. The ids the folder's finished files hold (`hfbert.ray_data.sink.finished_ids`) are left out of the input: a
   rerun after a killed driver computes only what is missing. They must all be input ids (else the folder holds
   another corpus's output: refused).
3. `hfbert.ray_data.pipeline.embed` over the rest, written block by block by `hfbert.ray_data.sink.ParquetFolder`
   (each file whole or not at all, named by its ids, so a retried write cannot write a row twice).
4. The folder's finished files hold exactly one row per input id, counted from their footers; otherwise an error
   says how many rows there are for how many ids.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hfbert.ray_data.batches import COLUMNS, checked_outputs
from hfbert.ray_data.pipeline import BATCH_SIZE, embed, import_ray

ROWS_PER_BLOCK = 10_000  # rows per input block, and so per output file: what a killed job loses at most per actor
INPUT_SUFFIXES = (".parquet", ".jsonl")
__all__ = ["INPUT_SUFFIXES", "ROWS_PER_BLOCK", "CorpusResult", "embed_corpus"]


@dataclass(frozen=True)
class CorpusResult:
    """What a job did: `rows` in the input, `finished_before` found done in the folder, `computed` by this run."""

    rows: int
    finished_before: int
    computed: int
    columns: tuple[str, ...]


def embed_corpus(
    model: str | os.PathLike,
    file: str,
    out: str,
    *,
    id_column: str,
    text_column: str = "text",
    outputs: str | Sequence[str] = ("dense",),
    prompt_name: str | None = None,
    rows_per_block: int = ROWS_PER_BLOCK,
    batch_size: int = BATCH_SIZE,
    actors: int | None = None,
    threads: int = 1,
    address: str | None = None,
    **load_options: Any,
) -> CorpusResult:
    """Embed the texts of `file` (Parquet or JSON lines, local or a URI Ray reads) into Parquet files in `out` (see
    the module docstring). `actors` of `threads` CPUs each (None: as many as the cluster's CPUs but one allow);
    `address`: the Ray cluster's (None: Ray's default, a new local cluster unless RAY_ADDRESS says otherwise). The
    other arguments are `hfbert.ray_data.embed`'s."""
    ray = import_ray()  # before the sink, which imports Ray: a missing extra is one line saying what to install
    from hfbert.ray_data.sink import PARTIAL, ParquetFolder, file_system, finished_ids, visible_rows

    outputs = checked_outputs(outputs)
    suffix = os.path.splitext(str(file))[1]
    if suffix not in INPUT_SUFFIXES:
        raise ValueError(f"--file {file}: with --ray, the corpus is a .parquet or a .jsonl file")
    if rows_per_block < 1 or threads < 1:
        raise ValueError(f"rows per block and threads must be at least 1, got {rows_per_block} and {threads}")
    columns = tuple(column for output in outputs for column in COLUMNS[output])
    manifest = {
        "model": str(model),
        "outputs": list(outputs),
        "prompt_name": prompt_name,
        "id_column": id_column,
        "text_column": text_column,
        "load_options": {key: str(value) for key, value in sorted(load_options.items()) if value is not None},
    }
    _check_manifest(out, manifest)
    with _ray_session(ray, address):
        dataset = _read(ray, file, rows_per_block)
        ids = _checked_ids(dataset, id_column, text_column, file)
        done = finished_ids(out, id_column)
        finished_before = 0 if done is None else len(done)
        if done is not None:
            _check_done(ids, done, out)
            dataset = _without(ray, dataset, id_column, done)
        _write_manifest(out, manifest)
        system, path = file_system(out)
        system.delete_dir_contents(f"{path}/{PARTIAL}", missing_dir_ok=True)  # a killed run's unfinished files
        if finished_before < len(ids):
            cpus = ray.cluster_resources().get("CPU", 1)
            count = actors or max(1, int(cpus - 1) // threads)
            # Ray Data lists, reads and writes in tasks of 1 CPU, which actors holding every CPU would starve: the
            # actors reserve at most all CPUs but one, and run their `threads` all the same.
            reserve = max(0.1, min(threads, (cpus - 1) / count))
            # Blocks of at most `rows_per_block` rows, in and out (streaming: nothing is shuffled or held whole), so
            # that the actors share the work and each output file is written as soon as its rows are done.
            embedded = embed(
                dataset.repartition(target_num_rows_per_block=rows_per_block),
                model,
                text_column=text_column,
                outputs=outputs,
                prompt_name=prompt_name,
                batch_size=min(batch_size, rows_per_block),
                concurrency=count,
                num_cpus=reserve,
                threads=threads,
                **load_options,
            )
            output = embedded.select_columns([id_column, *columns])
            output.repartition(target_num_rows_per_block=rows_per_block).write_datasink(ParquetFolder(out, id_column))
        written = visible_rows(out)
        if written != len(ids):
            raise ValueError(f"{out}: the finished files hold {written} rows for the input's {len(ids)} ids")
        if _exists(system, f"{path}/{PARTIAL}"):
            system.delete_dir(f"{path}/{PARTIAL}")
        return CorpusResult(len(ids), finished_before, len(ids) - finished_before, columns)


@contextmanager
def _ray_session(ray: Any, address: str | None) -> Iterator[None]:
    """Ray, started (and shut down after) unless this process already joined a cluster; Ray's own deprecation
    notices (its DataContext copying deprecated fields) silenced: nothing a user can act on."""
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.")
            yield
    finally:
        if started:
            ray.shutdown()


def _read(ray: Any, file: str, rows_per_block: int) -> Any:
    """The corpus as a Ray Dataset of about `rows_per_block` rows a block (where the row count is known cheaply: a
    local file's Parquet footer or line count)."""
    rows = _row_count(file)
    blocks = None if rows is None else max(1, math.ceil(rows / rows_per_block))
    if file.endswith(".parquet"):
        return ray.data.read_parquet(file, override_num_blocks=blocks)
    return ray.data.read_json(file, lines=True, override_num_blocks=blocks)


def _row_count(file: str) -> int | None:
    if "://" in file:
        return None
    if file.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(file).metadata.num_rows
    with open(file, "rb") as handle:
        return sum(1 for line in handle if line.strip())


def _checked_ids(dataset: Any, id_column: str, text_column: str, file: str) -> Any:
    """The input's ids (a pyarrow array, in input order), after the checks of the module docstring's step 1."""
    import pyarrow
    import pyarrow.compute as pc

    schema = dataset.schema()
    names = list(schema.names)
    for option, column in (("--id-column", id_column), ("--text-column", text_column)):
        if column not in names:
            raise ValueError(f"--file {file}: no column {column!r} ({option}); its columns: {', '.join(names)}")
    text_type = schema.types[names.index(text_column)]
    if not (pyarrow.types.is_string(text_type) or pyarrow.types.is_large_string(text_type)):
        raise ValueError(f"--file {file}: column {text_column!r} holds {text_type}, not strings (--text-column)")

    def flags(table: Any) -> Any:
        return pyarrow.table({"id": table.column(id_column), "null_text": table.column(text_column).is_null()})

    tables = list(
        dataset.select_columns([id_column, text_column])
        .map_batches(flags, batch_format="pyarrow")
        .iter_batches(batch_format="pyarrow", batch_size=None)
    )
    table = pyarrow.concat_tables(tables) if tables else pyarrow.table({"id": [], "null_text": []})
    ids = table.column("id").combine_chunks()
    if ids.null_count:
        raise ValueError(f"--file {file}: column {id_column!r} (--id-column) has {ids.null_count} null ids")
    null_texts = table.column("null_text").combine_chunks()
    if pc.any(null_texts).as_py():
        first = ids.filter(null_texts)[0].as_py()
        count = pc.sum(null_texts).as_py()
        raise ValueError(
            f"--file {file}: column {text_column!r} has {count} null texts (the first at id {first!r}); give every "
            f"row a text, or drop those rows first"
        )
    counts = ids.value_counts()
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        raise ValueError(
            f"--file {file}: column {id_column!r} (--id-column) has {len(repeated)} ids more than once (the first: "
            f"{repeated.field('values')[0].as_py()!r}); an id names one row"
        )
    return ids


def _check_done(ids: Any, done: Any, out: str) -> None:
    import pyarrow.compute as pc

    foreign = done.filter(pc.invert(pc.is_in(done, value_set=ids)))
    if len(foreign):
        raise ValueError(
            f"--out {out}: its files hold ids that are not in the input (the first: {foreign[0].as_py()!r}): the "
            f"output of another corpus; choose another --out"
        )


def _without(ray: Any, dataset: Any, id_column: str, done: Any) -> Any:
    """`dataset` without the rows whose id is in `done` (passed to the workers once, through the object store)."""
    import pyarrow.compute as pc

    done_ref = ray.put(done)

    def keep(table: Any) -> Any:
        finished = ray.get(done_ref)
        return table.filter(pc.invert(pc.is_in(table.column(id_column), value_set=finished)))

    return dataset.map_batches(keep, batch_format="pyarrow")


def _check_manifest(out: str, manifest: dict[str, Any]) -> None:
    """ValueError when `out` holds another job's outputs, or Parquet files without hfbert's manifest."""
    from hfbert.ray_data.sink import MANIFEST, file_system, finished_files

    system, path = file_system(out)
    finished = finished_files(out)
    try:
        with system.open_input_stream(f"{path}/{MANIFEST}") as stream:
            found = json.loads(stream.read())
    except (FileNotFoundError, OSError):
        found = None
    if found is None and finished:
        raise ValueError(
            f"--out {out}: holds Parquet files without hfbert's {MANIFEST}: not a folder hfbert embed --ray wrote; "
            f"choose another --out"
        )
    if found is not None and found != manifest:
        changed = sorted(key for key in {*found, *manifest} if found.get(key) != manifest.get(key))
        raise ValueError(
            f"--out {out}: its {MANIFEST} was written by a job with other settings ({', '.join(changed)}: "
            f"{ {key: found.get(key) for key in changed} }); resume with the same ones, or choose another --out"
        )


def _write_manifest(out: str, manifest: dict[str, Any]) -> None:
    from hfbert.ray_data.sink import MANIFEST, file_system

    system, path = file_system(out)
    system.create_dir(path, recursive=True)
    temporary = f"{path}/{MANIFEST}.partial"
    with system.open_output_stream(temporary) as stream:
        stream.write(json.dumps(manifest, indent=1).encode())
    system.move(temporary, f"{path}/{MANIFEST}")


def _exists(system: Any, path: str) -> bool:
    import pyarrow.fs

    return system.get_file_info(path).type != pyarrow.fs.FileType.NotFound
