"""BAAI/bge-m3's three outputs from one encoder pass: dense vectors, lexical (sparse) weights and ColBERT vectors,
equal to FlagEmbedding's `BGEM3FlagModel.encode(texts, return_dense=True, return_sparse=True,
return_colbert_vecs=True)` on the same folder.

    >>> from hfbert.tools.embedding import Embedder
    >>> embedder = Embedder("BAAI/bge-m3")  # doctest: +SKIP
    >>> out = embedder.embed_m3(["What is BGE M3?"], outputs="dense,sparse,colbert")  # doctest: +SKIP
    >>> out["dense_vecs"].shape, out["lexical_weights"][0], out["colbert_vecs"][0].shape  # doctest: +SKIP
    (torch.Size([1, 1024]), {'4865': 0.08, ...}, torch.Size([7, 1024]))

The folder is bge-m3's: XLM-R weights and tokenizer, its sentence-transformers files, and two linear layers beside
them, `sparse_linear.pt` (hidden -> 1) and `colbert_linear.pt` (hidden -> hidden), each a pickled `state_dict` of
exactly `weight` and `bias`. A `.pt` file is read only through `torch.load(weights_only=True)`
(`converters.checkpoint_files`), then checked to hold those two tensors in the shapes config.json's `hidden_size`
implies; anything else is one error naming the file and what it holds. `hfbert convert` writes them as
`sparse_linear.safetensors` and `colbert_linear.safetensors`, which are read instead when present. A missing file is
refused, naming it: FlagEmbedding would run a randomly initialised layer in its place and return noise.

What is computed, per text, from h = the encoder's last hidden states of its real tokens (FlagEmbedding's
`EncoderOnlyEmbedderM3Model._sparse_embedding` / `_colbert_embedding` and `M3Embedder.encode_single_device`):

- dense: the folder's sentence-transformers pipeline (bge-m3's: CLS pooling, then Normalize), as `Embedder.embed`;
- sparse: w_t = relu(sparse_linear(h_t)) for each token t; the text's `{str(token id): weight}` keeps the weights
  > 0, drops the tokenizer's cls, eos, pad and unk tokens (XLM-R's `<s>`, `</s>`, `<pad>`, `<unk>`), and a token id
  seen several times keeps its largest weight; keys in the order the ids first appear (a text can get `{}`);
- colbert: normalize(colbert_linear(h_t)) for every real token but the first (`<s>`): `</s>` is kept, so a text of
  n tokens gives n - 1 vectors.

The input length is the folder's (sentence-transformers' `max_seq_length`: 8,192 for bge-m3), where FlagEmbedding
truncates at 512 unless given `max_length`: texts longer than 512 tokens get different outputs; pass
`max_length=512` to `Embedder` (`--max-length 512`) for FlagEmbedding's default. The encoder runs padding-free, as
`Embedder.embed` runs it, and the two heads run on the real tokens only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from converters.checkpoint_files import CheckpointTensors, read_weight_file
from converters.dtypes import PARAMETER_DTYPES
from converters.errors import CheckpointError
from converters.loading import non_finite

OUTPUTS = ("dense", "sparse", "colbert")
# FlagEmbedding's names for the three outputs, the keys of `Embedder.embed_m3`'s result.
RESULT_KEYS = {"dense": "dense_vecs", "sparse": "lexical_weights", "colbert": "colbert_vecs"}
SPARSE_LINEAR = "sparse_linear"
COLBERT_LINEAR = "colbert_linear"
CHUNK_SIZE = 10_000  # texts read, sorted by length and encoded at once by `m3_file`
__all__ = [
    "COLBERT_LINEAR",
    "OUTPUTS",
    "RESULT_KEYS",
    "SPARSE_LINEAR",
    "M3Heads",
    "head_file",
    "load_m3_heads",
    "m3_file",
    "parse_outputs",
    "present_heads",
    "read_linear",
]


def parse_outputs(outputs: str | Sequence[str]) -> tuple[str, ...]:
    """The outputs asked for ("dense,sparse", or a list of names), in `OUTPUTS`' order, each once; ValueError for an
    unknown name or none."""
    names = [
        name.strip() if isinstance(name, str) else name
        for name in (outputs.split(",") if isinstance(outputs, str) else outputs)
    ]
    if not names or any(name not in OUTPUTS for name in names):
        raise ValueError(f"outputs must be one or more of {', '.join(OUTPUTS)} (comma-separated), not {outputs!r}")
    return tuple(name for name in OUTPUTS if name in names)


def head_file(directory: Path, stem: str) -> Path:
    """The file a head is read from: `<stem>.safetensors` when present (what `hfbert convert` writes), else
    `<stem>.pt` (bge-m3's own)."""
    converted = directory / f"{stem}.safetensors"
    return converted if converted.is_file() else directory / f"{stem}.pt"


def read_linear(path: Path, out_features: int, in_features: int) -> dict[str, Tensor]:
    """The `weight` (out_features, in_features) and `bias` (out_features,) of a linear layer's file (a `.pt` pickle
    through `torch.load(weights_only=True)`, or safetensors); CheckpointError naming the file for a missing one, or
    one holding anything else (other tensors, other shapes, a dtype the kernels do not run, non-finite values)."""
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing; a bge-m3 folder holds this linear layer beside the encoder's weights (FlagEmbedding "
            f"would use a randomly initialised one in its place)"
        )
    checkpoint = CheckpointTensors()
    read_weight_file(path, checkpoint)
    tensors = checkpoint.tensors
    expected = {"weight": (out_features, in_features), "bias": (out_features,)}
    held = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if held != expected:
        what = ", ".join(f"'{name}' {shape}" for name, shape in held.items()) or "no tensor"
        wanted = " and ".join(f"'{name}' {shape}" for name, shape in expected.items())
        raise CheckpointError(
            f"{path}: holds {what}; expected exactly {wanted} (a Linear({in_features}, {out_features}))"
        )
    for name, tensor in tensors.items():
        if tensor.dtype not in PARAMETER_DTYPES:
            raise CheckpointError(f"{path}: '{name}' has dtype {tensor.dtype}; expected a floating-point dtype")
        if problem := non_finite(tensor):
            raise CheckpointError(f"{path}: '{name}' holds {problem}")
    return tensors


def present_heads(directory: Path, hidden_size: int) -> dict[str, dict[str, Tensor]]:
    """The bge-m3 layers of `directory` (`head_file`), read and checked (`read_linear`), by file stem: {} for a
    folder with neither (any other checkpoint); a folder with one needs the other (CheckpointError naming it)."""
    shapes = {SPARSE_LINEAR: (1, hidden_size), COLBERT_LINEAR: (hidden_size, hidden_size)}
    if not any(head_file(directory, stem).is_file() for stem in shapes):
        return {}
    return {stem: read_linear(head_file(directory, stem), *shape) for stem, shape in shapes.items()}


def _linear(tensors: dict[str, Tensor], device: torch.device) -> nn.Linear:
    out_features, in_features = tensors["weight"].shape
    layer = nn.Linear(in_features, out_features, device=device, dtype=torch.float32)
    with torch.no_grad():
        layer.weight.copy_(tensors["weight"])
        layer.bias.copy_(tensors["bias"])
    return layer.eval().requires_grad_(False)


@dataclass
class M3Heads:
    """bge-m3's sparse and ColBERT layers (float32, whatever the encoder's dtype) and the token ids lexical weights
    leave out. `files`: where each was read from."""

    sparse_linear: nn.Linear
    colbert_linear: nn.Linear
    skipped_ids: frozenset[int]
    files: tuple[Path, Path]

    def describe(self) -> str:
        sparse, colbert = self.sparse_linear, self.colbert_linear
        return (
            f"{self.files[0].name} (Linear {sparse.in_features}->{sparse.out_features}, relu), "
            f"{self.files[1].name} (Linear {colbert.in_features}->{colbert.out_features}, normalized)"
        )

    def lexical_weights(self, hidden: Tensor, attention_mask: Tensor, input_ids: Tensor) -> list[dict[str, float]]:
        """Each text's `{str(token id): weight}` (see the module docstring) from a padded batch's hidden states."""
        real = attention_mask.bool()
        weights = torch.relu(self.sparse_linear(hidden[real].float())).squeeze(-1).cpu()
        ids, lengths = input_ids[real].cpu().tolist(), real.sum(dim=1).cpu().tolist()
        result, start = [], 0
        for length in lengths:
            text: dict[str, float] = {}
            for token, weight in zip(
                ids[start : start + length], weights[start : start + length].tolist(), strict=True
            ):
                key = str(token)
                # A weight of 0 (relu's) is no entry, and a repeated id keeps its largest weight.
                if token not in self.skipped_ids and weight > text.get(key, 0.0):
                    text[key] = weight
            result.append(text)
            start += length
        return result

    def colbert_vectors(self, hidden: Tensor, attention_mask: Tensor) -> list[Tensor]:
        """Each text's (real tokens - 1, dimension) float32 ColBERT vectors, on the CPU."""
        real = attention_mask.bool().clone()
        real[:, 0] = False  # the first token (<s>) gets no vector; </s> does
        vectors = nn.functional.normalize(self.colbert_linear(hidden[real].float()), dim=-1).cpu()
        return list(vectors.split(real.sum(dim=1).cpu().tolist()))


def load_m3_heads(directory: Path, hidden_size: int, tokenizer: Any, device: torch.device | str = "cpu") -> M3Heads:
    """The two layers of a bge-m3 folder (`head_file`, `read_linear`) and the ids `tokenizer` marks cls, eos, pad and
    unk (FlagEmbedding reads the same four from `special_tokens_map`; a tokenizer without one has nothing to skip
    for it)."""
    sparse_file, colbert_file = head_file(directory, SPARSE_LINEAR), head_file(directory, COLBERT_LINEAR)
    sparse = _linear(read_linear(sparse_file, 1, hidden_size), torch.device(device))
    colbert = _linear(read_linear(colbert_file, hidden_size, hidden_size), torch.device(device))
    names = ("cls_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
    skipped = frozenset(index for name in names if (index := getattr(tokenizer, name, None)) is not None)
    return M3Heads(sparse, colbert, skipped, (sparse_file, colbert_file))


def m3_file(
    embedder: Any,
    texts: Iterable[str],
    out: str | os.PathLike | None,
    outputs: str | Sequence[str] = OUTPUTS,
    *,
    total: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
) -> int:
    """Write each text's `{"index": i, "dense": [...], "sparse": {id: weight}, "colbert": [[...], ...]}` (the keys
    of `outputs` only) from `embedder` (an `hfbert.tools.embedding.Embedder`, `embed_m3`) as one JSON line into `out`
    (None: stdout), in input order, as `hfbert embed` writes (`hfbert.tools.embedding_output`: whole or not at
    all). `texts` is read lazily and once, in chunks of `chunk_size`. Returns how many lines the output holds."""
    from hfbert.tools.embedding_output import output_kind, write_in_input_order, write_json_line

    names = parse_outputs(outputs)
    if output_kind(out) != ".jsonl":
        raise ValueError(f"{out}: bge-m3's outputs are written as JSON lines (one object per text): use .jsonl")

    def write(writer: Any, indices: list[int], chunk: list[str], bar: Any) -> None:
        result = embedder.embed_m3(chunk, names, progress=bar)
        for row, index in enumerate(indices):
            line: dict[str, Any] = {"index": index}
            for name in names:
                value = result[RESULT_KEYS[name]][row]
                line[name] = value if name == "sparse" else value.tolist()
            write_json_line(writer, line)

    return write_in_input_order(
        texts,
        out,
        ".jsonl",
        embedder.dimension,
        write,
        task="embed",
        chunk_size=chunk_size,
        total=total,
        progress=progress,
    )
