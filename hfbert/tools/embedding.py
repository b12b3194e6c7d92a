"""Text embeddings with hfbert, as the checkpoint's sentence-transformers pipeline computes them, streamed: from a
file of any size (or standard input) to a `.npy` or `.jsonl` file, in input order.

    >>> from hfbert.tools.embedding import Embedder
    >>> embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> embedder.pipeline.describe()  # doctest: +SKIP
    'sentence-transformers (modules.json): Transformer(max_seq_length=256) -> Pooling(mean) -> Normalize'
    >>> embedder.embed(["A first text.", "Another one."]).shape  # doctest: +SKIP
    torch.Size([2, 384])

What is computed: by default `Embedder` gives what `SentenceTransformer(MODEL).encode(texts)` gives, element for
element: the checkpoint's modules.json pipeline (pooling mode, Dense, Normalize, max_seq_length, default prompt),
read in both on-disk formats by `hfbert.tools.sentence_transformers_pipeline` (see there); a checkpoint without
sentence-transformers files gets mean pooling, as SentenceTransformer builds for it. `pooling`, `normalize`,
`max_length`, `prompt` / `prompt_name` override the checkpoint's choices; `Embedder.pipeline.describe()` says what
runs (`hfbert embed` prints it). tests/test_embed_pipeline.py compares with sentence-transformers' `encode` by max
abs difference, per pooling mode, with and without Normalize and Dense, in both formats.

How a large input runs (`embed_file`): the input (a text file, one text per line, or JSONL with a "text" field per
line; `-` is standard input) is read once, front to back, in chunks of `CHUNK_SIZE` lines, never whole: a pipe
works as well as a file. Each chunk is sorted by length so that batches hold texts of similar length (little
padding), embedded batch by batch, put back in input order and appended to the output: a `.npy` file (float32,
shape (texts, dimension); rows are written as they come, not memory-mapped, and the header with the count last)
or a `.jsonl` file (one {"index", "embedding"} per line); with no output file, JSON lines on stdout. An output file
is written beside its destination and renamed into place when complete (`converters.atomic_write`): a failed run
leaves an existing output untouched and no partial file. When the number of texts is known beforehand (texts
given as arguments, or a regular file), the `.npy` file's space is reserved first (`posix_fallocate`), so a disk
too small fails before any work; in every case a full disk ends in one error naming the disk, never in a crash.

Under `torchrun` (RANK and WORLD_SIZE set, WORLD_SIZE > 1) each process reads the whole input (a regular file) and
embeds the lines i with i % WORLD_SIZE == RANK into a part file `.OUT.partial-rank{RANK}-of-{WORLD_SIZE}` beside
OUT (hfbert's own temporary names, so a user's file is never overwritten or deleted as a part); after a barrier
(gloo process group) rank 0 merges the parts in input order into OUT and deletes them. The result is the same file
as a single-process run.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from converters.atomic_write import PARTIAL_MARK, atomic_file
from converters.dtypes import DTYPES
from hfbert.tools.extras import import_numpy
from hfbert.tools.sentence_transformers_pipeline import (
    POOLINGS,
    Dense,
    checkpoint_prompts,
    pool,
    prompt_text,
    read_pipeline,
)
from hfbert.tools.texts import check_unicode, read_texts

CHUNK_SIZE = 10_000
__all__ = ["CHUNK_SIZE", "Embedder", "embed_file", "output_kind", "read_texts"]


# -- the embedder -------------------------------------------------------------------------------------------


class Embedder:
    """A checkpoint's encoder, tokenizer and sentence-transformers pipeline, turning lists of texts into
    (texts, dimension) float32 embeddings. `pooling`, `normalize`, `max_length`, `prompt` / `prompt_name`: None
    keeps the checkpoint's choice (see the module docstring). `revision`, `cache_dir`, `token`: for a Hub repo id.
    `quantize="int8"`: int8 weights and activations (faster, lossy: `hfbert/inference/int8.py`).
    `ignore_auto_map=True`: load a checkpoint whose config.json points to custom code as plain BERT (you know its
    weights are)."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
        device: str = "cpu",
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
        prompt: str | None = None,
        prompt_name: str | None = None,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        ignore_auto_map: bool = False,
    ) -> None:
        from converters.hub import resolve_checkpoint
        from hfbert.inference import optimize_for_inference
        from hfbert.modeling.model import BertModel
        from hfbert.modeling.tokenizer import BertTokenizer

        modes = None if pooling is None else (pooling,) if isinstance(pooling, str) else tuple(pooling)
        if modes is not None and (not modes or any(mode not in POOLINGS for mode in modes)):
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (or a list of them), not {pooling!r}")
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        if prompt is not None and prompt_name is not None:
            raise ValueError("give a prompt or a prompt name, not both")
        directory = Path(
            resolve_checkpoint(
                model_path,
                revision,
                include_tokenizer=True,
                include_sentence_transformers=True,
                cache_dir=cache_dir,
                token=token,
            )
        )
        self.directory = directory
        self.tokenizer = BertTokenizer.from_pretrained(directory)
        self.model = BertModel.from_pretrained(
            directory,
            device=device,
            dtype=DTYPES[dtype] if isinstance(dtype, str) else dtype,
            add_pooling_layer=False,
            ignore_auto_map=ignore_auto_map,
        )
        # Inference only, so the weights are packed (fp32: the same numbers as unpacked, within hfbert's contract;
        # a no-op off x86 CPUs) or, when asked, quantized to int8.
        optimize_for_inference(self.model, quantize=quantize)
        config = self.model.config
        limit = config.max_position_embeddings
        self.pipeline = read_pipeline(directory, config.hidden_size, limit, self.tokenizer.model_max_length)
        if self.pipeline.do_lower_case:  # inside the tokenizer, after special tokens, as sentence-transformers 6
            self.tokenizer.lowercase_first()
        self._override(modes, normalize, max_length, limit, prompt, prompt_name, directory)
        self.batch_size = batch_size
        self.max_length = self.pipeline.max_length
        self.prompt_length = self._prompt_length()
        self.dimension = self._dimension(config.hidden_size)
        for step in self.pipeline.steps:
            if isinstance(step, Dense):
                step.linear.to(self.model.device)
                step.activation.to(self.model.device)  # PReLU's slope
                if isinstance(step.residual, nn.Linear):
                    step.residual.to(self.model.device)

    def _override(self, modes, normalize, max_length, limit, prompt, prompt_name, directory) -> None:
        pipeline = self.pipeline
        if modes is not None and modes != pipeline.pooling:
            dense = next((step for step in pipeline.steps if isinstance(step, Dense)), None)
            if dense is not None and len(modes) != len(pipeline.pooling):
                raise ValueError(
                    f"pooling {'+'.join(modes)} gives {len(modes)} vectors per text, but the checkpoint's "
                    f"{dense.describe()} takes {dense.linear.in_features} values"
                )
            pipeline.pooling = modes
            pipeline.overrides.append(f"pooling {'+'.join(modes)}")
        if normalize is not None and normalize != pipeline.normalize:
            if normalize:
                pipeline.steps.append("Normalize")
            else:
                pipeline.steps = [step for step in pipeline.steps if step != "Normalize"]
            pipeline.overrides.append("Normalize" if normalize else "no Normalize")
        if max_length is not None:
            if not 1 <= max_length <= limit:
                raise ValueError(f"max_length must be in [1, {limit}] (max_position_embeddings), got {max_length}")
            if max_length != pipeline.max_length:
                pipeline.max_length = max_length
                pipeline.overrides.append(f"max_length {max_length}")
        if prompt_name is not None:
            prompts, _ = checkpoint_prompts(directory)
            if prompt_name not in prompts:
                names = ", ".join(map(repr, prompts)) or "none"
                raise ValueError(f"prompt name {prompt_name!r} is not in the checkpoint's prompts ({names})")
            prompt = prompt_text(prompts, prompt_name, directory) or ""
        if prompt is not None and (prompt or None) != pipeline.prompt:
            pipeline.prompt = prompt or None
            pipeline.overrides.append(f"prompt {prompt!r}")

    def _prompt_length(self) -> int:
        """How many leading tokens the prompt takes (its trailing [SEP] not counted), when pooling leaves it out."""
        if not self.pipeline.prompt or self.pipeline.include_prompt:
            return 0
        ids = self.tokenizer(self.pipeline.prompt, truncation=True, max_length=self.max_length)["input_ids"]
        special = {self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id}
        special |= {self.tokenizer.unk_token_id, self.tokenizer.mask_token_id}
        return len(ids) - (ids[-1] in special)

    def _dimension(self, hidden_size: int) -> int:
        dimension = hidden_size * len(self.pipeline.pooling)
        for step in self.pipeline.steps:
            if isinstance(step, Dense):
                dimension = step.linear.out_features
        return dimension

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.pipeline.pooling

    @property
    def normalize(self) -> bool:
        return self.pipeline.normalize

    def _prepared(self, text: str) -> str:
        return (self.pipeline.prompt or "") + text

    @torch.no_grad()
    def embed(self, texts: Sequence[str], progress: Any = None) -> Tensor:
        """Embeddings of `texts`, in their order; longest texts are batched together first, as sentence-transformers
        does. `progress`: anything with `update(n)` (a tqdm bar) to advance by each batch's size."""
        for index, text in enumerate(texts):  # named by its place in `texts`, not in a length-sorted batch
            if not isinstance(text, str):
                raise TypeError(f"text {index} is a {type(text).__name__}, not a str")
            check_unicode(text, f"text {index}")
        order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
        result = torch.empty(len(texts), self.dimension, dtype=torch.float32)
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [self._prepared(texts[index]) for index in indices],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.model.device)
            hidden = self.model(**batch, return_dict=True).last_hidden_state
            vectors = pool(hidden, batch["attention_mask"], self.pipeline.pooling, self.prompt_length).float()
            for step in self.pipeline.steps:
                vectors = F.normalize(vectors, p=2, dim=-1) if step == "Normalize" else step(vectors)
            result[indices] = vectors.cpu()
            if progress is not None:
                progress.update(len(indices))
        return result


# -- input ----------------------------------------------------------------------------------------------------


def chunks(items: Iterable[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    chunk: list[tuple[int, str]] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


# -- output ---------------------------------------------------------------------------------------------------

NPY_HEADER_BYTES = 128  # numpy's own header length for any 2-D float32 shape below 10**40 rows


def npy_header(rows: int, dimension: int) -> bytes:
    """The .npy (format 1.0) header numpy.save writes for a (rows, dimension) float32 C-order array."""
    import io

    numpy = import_numpy()
    buffer = io.BytesIO()
    header = {
        "descr": numpy.lib.format.dtype_to_descr(numpy.dtype("<f4")),
        "fortran_order": False,
        "shape": (rows, dimension),
    }
    numpy.lib.format.write_array_header_1_0(buffer, header)
    if len(buffer.getvalue()) != NPY_HEADER_BYTES:
        raise ValueError(f"{rows} x {dimension}: too large for a .npy header of {NPY_HEADER_BYTES} bytes")
    return buffer.getvalue()


class NpyWriter:
    """Rows appended in order to a float32 .npy file, written (not memory-mapped) as they come; the header, with
    the final row count, is written by `close`. `reserve_rows`: the expected count, whose space is allocated first
    (a disk too small fails at once, with ENOSPC)."""

    def __init__(self, path: str | os.PathLike, dimension: int, reserve_rows: int | None = None) -> None:
        self.path, self.dimension, self.row = Path(path), dimension, 0
        self.handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        try:
            if reserve_rows:
                _reserve(self.handle, NPY_HEADER_BYTES + 4 * dimension * reserve_rows)
            self.handle.write(npy_header(0, dimension))
        except BaseException:
            self.handle.close()
            raise

    def write(self, indices: list[int], embeddings: Tensor) -> None:
        self.handle.write(embeddings.to(torch.float32).contiguous().numpy().tobytes())
        self.row += len(indices)

    def close(self, complete: bool = True) -> None:
        if self.handle.closed:
            return
        if complete:
            try:
                self.handle.flush()
                self.handle.seek(0)
                self.handle.write(npy_header(self.row, self.dimension))
                self.handle.truncate(NPY_HEADER_BYTES + 4 * self.dimension * self.row)  # space reserved beyond
            except BaseException:
                _finish(self.handle, complete=False)
                raise
        _finish(self.handle, complete)


def _finish(handle: Any, complete: bool) -> None:
    """Flush and fsync a complete output (a full disk shows here at the latest, not after the rename), then close;
    an incomplete one is only closed, its own error never hiding the one that stopped the run."""
    try:
        if complete:
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        try:
            handle.close()
        except OSError:
            if complete:
                raise


def _reserve(handle, size: int) -> None:
    """Allocate `size` bytes for an open file; filesystems without fallocate simply skip it."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:
        return
    try:
        allocate(handle.fileno(), 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
    except ValueError:
        pass


class JsonlWriter:
    """One {"index", "embedding"} JSON object per line, to a file or stdout."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.row = 0
        # The writer owns the handle; close() closes it.
        self.handle: TextIO = open(path, "w", encoding="utf-8") if path is not None else sys.stdout  # noqa: SIM115

    def write(self, indices: list[int], embeddings: Tensor) -> None:
        for index, vector in zip(indices, embeddings.tolist(), strict=True):
            self.handle.write(json.dumps({"index": index, "embedding": vector}) + "\n")
        self.row += len(indices)

    def close(self, complete: bool = True) -> None:
        if self.handle is sys.stdout:
            self.handle.flush()
            return
        if self.handle.closed:
            return
        _finish(self.handle, complete)


def open_writer(
    path: str | os.PathLike | None, dimension: int, kind: str | None = None, reserve_rows: int | None = None
) -> Any:
    kind = kind or output_kind(path)
    return NpyWriter(path, dimension, reserve_rows) if kind == ".npy" else JsonlWriter(path)


def output_kind(path: str | os.PathLike | None) -> str:
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
    device = _mounted_device(mount)
    try:
        usage = os.statvfs(destination.parent)
        available, size = usage.f_bavail * usage.f_frsize / 2**20, usage.f_blocks * usage.f_frsize / 2**20
        free = f"{available:.1f} MiB free of {size:.1f} MiB"
    except OSError:
        free = "free space unknown"
    what = "no space left" if error.errno == errno.ENOSPC else "disk quota exceeded"
    full = OSError(
        f"{destination}: {what} on the disk holding {destination.parent} ({device} mounted on {mount}, {free}) "
        f"after {rows} embeddings; nothing was written, free some space or choose another --out"
    )
    full.errno = error.errno
    return full


def _mounted_device(mount: Path) -> str:
    """ "/dev/vda1 (ext4)" for a mount point, from /proc/self/mounts (Linux); "the filesystem" elsewhere."""
    import re

    device = "the filesystem"
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return device
    for line in lines:
        fields = line.split()
        point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[1]) if len(fields) > 2 else ""
        if point == str(mount):
            device = f"{fields[0]} ({fields[2]})"  # the last mount on a point is the visible one
    return device


# -- the whole job --------------------------------------------------------------------------------------------


def embed_file(
    embedder: Embedder,
    texts: Iterable[str],
    out: str | os.PathLike | None,
    *,
    total: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
) -> int:
    """Embed `texts` (an iterable, read lazily and once) into `out` in input order; under torchrun, this process's
    share, then rank 0 merges. `total`: how many texts there are, when known (for the progress display and the
    .npy space reservation; never trusted for the output). Returns how many embeddings the output holds (under
    torchrun: the merged file on rank 0, this process's part elsewhere)."""
    from hfbert.tools.progress import Progress

    if chunk_size < 1:
        raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    kind = output_kind(out)
    if world > 1 and out is None:
        raise ValueError("under torchrun, pass --out: each process writes a part file that rank 0 merges")
    target = part_file(out, rank, world) if world > 1 else out
    share = len(range(rank, total, world)) if total is not None else None
    bar = Progress(share, "embed", "text", enabled=progress and rank == 0)
    # Into a temporary file that replaces `target` only once every row is written: a failure on line 21 leaves
    # an existing output as it was, never overwritten with 20 rows.
    with ExitStack() as stack:
        temporary = stack.enter_context(atomic_file(target)) if target is not None else None
        writer = None
        try:
            writer = open_writer(temporary, embedder.dimension, kind, reserve_rows=share)
            mine = ((index, text) for index, text in enumerate(texts) if index % world == rank)
            mine = ((index, _checked(text, index)) for index, text in mine)
            for chunk in chunks(mine, chunk_size):
                embeddings = embedder.embed([text for _, text in chunk], progress=bar)
                writer.write([index for index, _ in chunk], embeddings)
            writer.close()
        except OSError as error:
            if writer is not None:
                writer.close(complete=False)
            if target is not None and error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise disk_full(target, error, writer.row if writer else 0) from None
            raise
        except BaseException:
            if writer is not None:
                writer.close(complete=False)
            raise
        finally:
            bar.close()
    if world > 1:
        return merge_under_torchrun(out, kind, rank, world, embedder.dimension) or writer.row
    return writer.row


def _checked(text: str, index: int) -> str:
    # A file's texts are checked by read_texts (file and line); texts given as a list are named by their place.
    check_unicode(text, f"text {index}")
    return text


def part_file(out: str | os.PathLike, rank: int, world: int) -> str:
    """The part file rank `rank` of `world` writes under torchrun: a hidden name beside `out` in the namespace of
    hfbert's temporaries (`converters.atomic_write`), never a file a user could have (`OUT.rank0` could be one)."""
    out = Path(out)
    return str(out.with_name(f".{out.name}{PARTIAL_MARK}rank{rank}-of-{world}"))


def merge_under_torchrun(out: str | os.PathLike, kind: str, rank: int, world: int, dimension: int) -> int | None:
    """Wait for every rank's part; rank 0 interleaves them back into input order (line i is in part i % world)
    and returns the number of rows merged."""
    import torch.distributed as dist

    initialised_here = not dist.is_initialized()
    if initialised_here:
        dist.init_process_group("gloo")  # MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE come from torchrun
    merged = None
    try:
        dist.barrier()  # every part is complete
        if rank == 0:
            parts = [part_file(out, r, world) for r in range(world)]
            try:
                merged = merge_parts(out, kind, parts, dimension)
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise disk_full(out, error, 0) from None
                raise
            for part in parts:
                os.remove(part)
        dist.barrier()  # no rank exits before the merged file exists
    finally:
        if initialised_here:
            dist.destroy_process_group()
    return merged


def merge_parts(out: str | os.PathLike, kind: str, parts: list[str], dimension: int) -> int:
    """Interleave the parts (part r holds lines r, r + world, ...) into `out`, atomically; the number of rows."""
    world = len(parts)
    with atomic_file(out) as temporary:
        if kind == ".jsonl":
            with ExitStack() as stack:
                handles = [stack.enter_context(open(part, encoding="utf-8")) for part in parts]
                writer = stack.enter_context(open(temporary, "w", encoding="utf-8"))
                total = 0
                while line := handles[total % world].readline():
                    writer.write(line)
                    total += 1
                if any(handle.readline() for handle in handles):
                    raise ValueError(f"{out}: the part files of the ranks do not fit together")
            return total
        numpy = import_numpy()
        arrays = [numpy.load(part, mmap_mode="r") for part in parts]
        total = sum(len(array) for array in arrays)
        if [len(array) for array in arrays] != [len(range(r, total, world)) for r in range(world)]:
            raise ValueError(f"{out}: the part files of the ranks do not fit together")
        writer = NpyWriter(temporary, dimension, reserve_rows=total)
        try:
            for start in range(0, total, CHUNK_SIZE):
                stop = min(total, start + CHUNK_SIZE)
                block = numpy.empty((stop - start, dimension), dtype=numpy.float32)
                for r, array in enumerate(arrays):
                    offset = (r - start) % world  # the first row of [start, stop) that part r holds
                    first = (start + offset) // world
                    rows = block[offset::world]
                    rows[:] = array[first : first + len(rows)]
                writer.handle.write(block.tobytes())
                writer.row += len(block)
            writer.close()
        except BaseException:
            writer.close(complete=False)
            raise
        return total
