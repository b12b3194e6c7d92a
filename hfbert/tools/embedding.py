"""Text embeddings with hfbert, streamed: from a file of any size to a `.npy` or `.jsonl` file, in input order.

    >>> from hfbert.tools.embedding import Embedder
    >>> embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2", pooling="mean", normalize=True)  # doctest: +SKIP
    >>> embedder.embed(["A first text.", "Another one."]).shape  # doctest: +SKIP
    torch.Size([2, 384])

How a large input runs (`embed_file`): the input (a text file, one text per line, or JSONL with a "text" field per
line) is read in chunks of `CHUNK_SIZE` lines, never whole. Each chunk is sorted by length so that batches hold
texts of similar length (little padding), embedded batch by batch, put back in input order and appended to the
output: a `.npy` file (a memory map of shape (lines, hidden_size), float32, sized after counting the lines) or
a `.jsonl` file (one {"index", "embedding"} per line); with no output file, JSON lines on stdout. An output file
is written beside its destination and renamed into place when complete (`converters.atomic_write`): a failed run
leaves an existing output untouched.

Under `torchrun` (RANK and WORLD_SIZE set, WORLD_SIZE > 1) each process embeds the lines i with
i % WORLD_SIZE == RANK into a part file `OUT.rank{RANK}`; after a barrier (gloo process group) rank 0 merges the
parts in input order into OUT and deletes them. The result is the same file as a single-process run.

Pooling: "cls" takes the first token's last hidden state; "mean" averages the last hidden states of the real
tokens (attention mask), as sentence-transformers does. `normalize` scales each embedding to unit L2 norm.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import Tensor

from converters.atomic_write import atomic_file
from converters.dtypes import DTYPES
from hfbert.tools.extras import import_numpy
from hfbert.tools.texts import numbered_lines

CHUNK_SIZE = 10_000
POOLINGS = ("cls", "mean")


def pool(last_hidden_state: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """(batch, sequence, hidden) -> (batch, hidden)."""
    if pooling == "cls":
        return last_hidden_state[:, 0]
    if pooling == "mean":  # sentence-transformers' formula: sum over real tokens / their count
        mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
        return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")


class Embedder:
    """A checkpoint's encoder and tokenizer, turning lists of texts into (texts, hidden_size) float32 embeddings.
    `quantize="int8"`: int8 weights and activations (faster, lossy: `hfbert/inference/int8.py`)."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        pooling: str = "mean",
        normalize: bool = False,
        batch_size: int = 32,
        max_length: int | None = None,
        device: str = "cpu",
        dtype: str | torch.dtype | None = None,
        quantize: str | None = None,
    ) -> None:
        from converters.hub import resolve_checkpoint
        from hfbert.inference import optimize_for_inference
        from hfbert.modeling.model import BertModel
        from hfbert.modeling.tokenizer import BertTokenizer

        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        directory = Path(resolve_checkpoint(model_path, include_tokenizer=True))
        self.tokenizer = BertTokenizer.from_pretrained(directory)
        self.model = BertModel.from_pretrained(
            directory, device=device, dtype=DTYPES[dtype] if isinstance(dtype, str) else dtype, add_pooling_layer=False
        )
        # Inference only, so the weights are packed (fp32: the same numbers as unpacked, within hfbert's contract;
        # a no-op off x86 CPUs) or, when asked, quantized to int8.
        optimize_for_inference(self.model, quantize=quantize)
        self.pooling, self.normalize, self.batch_size = pooling, normalize, batch_size
        limit = self.model.config.max_position_embeddings
        if max_length is not None and not 1 <= max_length <= limit:
            raise ValueError(f"max_length must be in [1, {limit}] (max_position_embeddings), got {max_length}")
        self.max_length = max_length or default_max_length(directory, limit)
        self.dimension = self.model.config.hidden_size

    @torch.no_grad()
    def embed(self, texts: Sequence[str], progress: Any = None) -> Tensor:
        """Embeddings of `texts`, in their order; longest texts are batched together first, as sentence-transformers
        does. `progress`: a tqdm bar to advance by each batch's size."""
        order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
        result = torch.empty(len(texts), self.dimension, dtype=torch.float32)
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [texts[index] for index in indices],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.model.device)
            hidden = self.model(**batch).last_hidden_state
            vectors = pool(hidden, batch["attention_mask"], self.pooling)
            if self.normalize:
                vectors = F.normalize(vectors.float(), p=2, dim=-1)
            result[indices] = vectors.float().cpu()
            if progress is not None:
                progress.update(len(indices))
        return result


def default_max_length(directory: Path, max_position_embeddings: int) -> int:
    """sentence-transformers' `max_seq_length` when the checkpoint has a sentence_bert_config.json, else the
    model's maximum."""
    from hfbert.modeling.tokenizer import read_json_object

    value = read_json_object(directory / "sentence_bert_config.json").get("max_seq_length")
    if isinstance(value, int) and value > 0:
        return min(value, max_position_embeddings)
    return max_position_embeddings


# -- input ----------------------------------------------------------------------------------------------------


def read_texts(path: str | os.PathLike) -> Iterator[str]:
    """The texts of a file, lazily: one per line; a `.jsonl` file holds one JSON object with a "text" per line.
    Every line counts (an empty line of a text file is an empty text), so index i is line i."""
    jsonl = Path(path).suffix == ".jsonl"
    for number, line in numbered_lines(path):
        if not jsonl:
            yield line
            continue
        try:
            record = json.loads(line)
        # ValueError: bad JSON, and integers of more than 4300 digits; RecursionError: arrays nested 100,000 deep.
        except (ValueError, RecursionError) as error:
            reason = error.msg if isinstance(error, json.JSONDecodeError) else type(error).__name__
            raise ValueError(f"{path}:{number}: not a JSON object ({reason})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f'{path}:{number}: expected a JSON object with a string "text" field')
        yield record["text"]


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


class NpyWriter:
    """Rows appended in order into a float32 .npy memory map of a known size."""

    def __init__(self, path: str | os.PathLike, rows: int, dimension: int) -> None:
        numpy = import_numpy()
        self.path, self.row = path, 0
        if rows == 0:  # numpy cannot memory-map an empty array: write the (0, dimension) file directly
            with open(path, "wb") as handle:  # a handle: numpy.save(path) would append ".npy" to a temporary name
                numpy.save(handle, numpy.empty((0, dimension), dtype=numpy.float32))
            self.array = None
        else:
            self.array = numpy.lib.format.open_memmap(path, mode="w+", dtype=numpy.float32, shape=(rows, dimension))

    def write(self, indices: list[int], embeddings: Tensor) -> None:
        self.array[self.row : self.row + len(indices)] = embeddings.numpy()
        self.row += len(indices)

    def close(self) -> None:
        if self.array is not None:
            self.array.flush()
            self.array = None


class JsonlWriter:
    """One {"index", "embedding"} JSON object per line, to a file or stdout."""

    def __init__(self, path: str | os.PathLike | None) -> None:
        # The writer owns the handle; close() closes it.
        self.handle: TextIO = open(path, "w", encoding="utf-8") if path is not None else sys.stdout  # noqa: SIM115

    def write(self, indices: list[int], embeddings: Tensor) -> None:
        for index, vector in zip(indices, embeddings.tolist(), strict=True):
            self.handle.write(json.dumps({"index": index, "embedding": vector}) + "\n")

    def close(self) -> None:
        if self.handle is sys.stdout:
            self.handle.flush()
        else:
            self.handle.close()


def open_writer(path: str | os.PathLike | None, rows: int, dimension: int, kind: str | None = None) -> Any:
    kind = kind or output_kind(path)
    return NpyWriter(path, rows, dimension) if kind == ".npy" else JsonlWriter(path)


def output_kind(path: str | os.PathLike | None) -> str:
    if path is None:
        return ".jsonl"
    suffix = Path(path).suffix
    if suffix not in (".npy", ".jsonl"):
        raise ValueError(f"{path}: the output must be a .npy or a .jsonl file")
    return suffix


# -- the whole job --------------------------------------------------------------------------------------------


def embed_file(
    embedder: Embedder,
    texts: Iterable[str],
    total: int,
    out: str | os.PathLike | None,
    *,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
) -> int:
    """Embed `total` texts (an iterable, read lazily) into `out` in input order; under torchrun, this process's
    share, then rank 0 merges. Returns how many texts this process embedded."""
    from tqdm.auto import tqdm

    if chunk_size < 1:
        raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    kind = output_kind(out)
    if world > 1 and out is None:
        raise ValueError("under torchrun, pass --out: each process writes a part file that rank 0 merges")
    target = f"{out}.rank{rank}" if world > 1 else out
    share = len(range(rank, total, world))
    bar = tqdm(total=share, desc="embed", unit="text", disable=None if progress and rank == 0 else True)
    # Into a temporary file that replaces `target` only once every row is written: a failure on line 21 leaves
    # an existing output as it was, never overwritten with 20 rows.
    with ExitStack() as stack:
        temporary = stack.enter_context(atomic_file(target)) if target is not None else None
        writer = open_writer(temporary, share, embedder.dimension, kind)
        try:
            mine = ((index, text) for index, text in enumerate(texts) if index % world == rank)
            for chunk in chunks(mine, chunk_size):
                embeddings = embedder.embed([text for _, text in chunk], progress=bar)
                writer.write([index for index, _ in chunk], embeddings)
        finally:
            writer.close()
            bar.close()
        if isinstance(writer, NpyWriter) and writer.row != share:
            raise ValueError(f"counted {share} texts but read {writer.row}: did the input change while it was read?")
    if world > 1:
        merge_under_torchrun(out, kind, rank, world, total, embedder.dimension)
    return share


def merge_under_torchrun(out: str | os.PathLike, kind: str, rank: int, world: int, total: int, dimension: int) -> None:
    """Wait for every rank's part; rank 0 interleaves them back into input order (line i is in part i % world)."""
    import torch.distributed as dist

    initialised_here = not dist.is_initialized()
    if initialised_here:
        dist.init_process_group("gloo")  # MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE come from torchrun
    try:
        dist.barrier()  # every part is complete
        if rank == 0:
            parts = [f"{out}.rank{r}" for r in range(world)]
            merge_parts(out, kind, parts, total, dimension)
            for part in parts:
                os.remove(part)
        dist.barrier()  # no rank exits before the merged file exists
    finally:
        if initialised_here:
            dist.destroy_process_group()


def merge_parts(out: str | os.PathLike, kind: str, parts: list[str], total: int, dimension: int) -> None:
    world = len(parts)
    with atomic_file(out) as temporary:
        if kind == ".jsonl":
            with ExitStack() as stack:
                handles = [stack.enter_context(open(part, encoding="utf-8")) for part in parts]
                merged = stack.enter_context(open(temporary, "w", encoding="utf-8"))
                for index in range(total):
                    merged.write(handles[index % world].readline())
            return
        numpy = import_numpy()
        writer = NpyWriter(temporary, total, dimension)
        for rank, part in enumerate(parts):
            if len(range(rank, total, world)) == 0:
                continue
            rows = numpy.load(part, mmap_mode="r")
            mine = writer.array[rank::world]  # a strided view: writing to it writes rows rank, rank + world, ...
            for start in range(0, len(rows), CHUNK_SIZE):
                mine[start : start + CHUNK_SIZE] = rows[start : start + CHUNK_SIZE]
        writer.close()
