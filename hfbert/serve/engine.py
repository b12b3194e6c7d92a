"""The one adapter between the server and the library's encoders: which task a checkpoint serves, how many tokens
a text takes, and the model's raw outputs for a batch.

Everything the server computes goes through `Engine`, so that replacing the encoders (`Embedder`, `CrossEncoder`,
`SparseEncoder`) changes this file only. The task is read from the checkpoint, as the library reads it:

- a folder with bge-m3's `sparse_linear` head: "m3" (dense embeddings and lexical weights, `Embedder.embed_m3`);
- `--pooling splade`, or a folder saved by sentence-transformers' SparseEncoder: "sparse" (`SparseEncoder`);
- a folder saved by sentence-transformers' CrossEncoder, or a `...ForSequenceClassification`: "rerank"
  (`CrossEncoder`, its raw logits: the server applies TEI's sigmoid / softmax itself);
- anything else: "embed" (`Embedder`: the folder's sentence-transformers pipeline, mean pooling without one).

Dense vectors come from the pipeline without its final Normalize: `/embed` normalizes when asked (TEI's
`normalize`, true by default) after `dimensions` truncates, as sentence-transformers' `truncate_dim` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from converters.json_files import read_json_object
from hfbert.tools.retrieval import LoadOptions

TASKS = ("embed", "rerank", "sparse", "m3")
# What each task serves, by operation.
OPERATIONS = {
    "embed": ("embed",),
    "rerank": ("rerank", "predict"),
    "sparse": ("sparse",),
    "m3": ("embed", "sparse", "multi"),
}
# How errors name a task to a client.
TASK_NAMES = {
    "embed": "an embedding model",
    "rerank": "a reranker (sequence classification)",
    "sparse": "a sparse (SPLADE) model",
    "m3": "a bge-m3 model (dense and sparse)",
}


@dataclass
class EngineOptions:
    """How the model is loaded: the library's load options (inference modes, device, input length) and what the
    server adds, the task's pooling and the default prompt, as `hfbert serve` takes them."""

    pooling: str | None = None
    prompt_name: str | None = None
    load: LoadOptions = field(default_factory=LoadOptions)


def detect_task(directory: Path, pooling: str | None = None) -> str:
    """The task of the checkpoint in `directory` (see the module docstring)."""
    from hfbert.tools.bge_m3 import SPARSE_LINEAR, head_file

    if pooling == "splade":
        return "sparse"
    if head_file(directory, SPARSE_LINEAR).is_file():
        return "m3"
    model_type = read_json_object(directory / "config_sentence_transformers.json", missing_ok=True).get("model_type")
    if model_type == "SparseEncoder":
        return "sparse"
    if model_type == "CrossEncoder":
        return "rerank"
    if (directory / "modules.json").is_file():
        return "embed"
    architectures = read_json_object(directory / "config.json", missing_ok=True).get("architectures") or []
    if any(isinstance(name, str) and name.endswith("ForSequenceClassification") for name in architectures):
        return "rerank"
    return "embed"


class Engine:
    """A checkpoint loaded for serving: `task`, `max_input_length` (tokens per input), `dimension` and the calls the
    batcher runs (`run`). Synchronous: the server calls it from its one model thread."""

    def __init__(self, model: str | os.PathLike, options: EngineOptions | None = None) -> None:
        from hfbert.tools.head_checkpoint import resolve_folder

        self.options = options = options or EngineOptions()
        self.model_id = os.fspath(model)
        self.directory = resolve_folder(model, options.load.revision)
        self.task = detect_task(self.directory, options.pooling)
        # fp32 weights whatever the checkpoint stores: the server computes in fp32 (or the mode asked), as /info says.
        load = replace(options.load, dtype="float32")
        self.prompt = ""
        self.labels: list[str] = []
        if self.task in ("embed", "m3"):
            from hfbert.tools.embedding import Embedder

            pooling = None if options.pooling in (None, "splade") else options.pooling.split("+")
            self.encoder: Any = Embedder(
                self.directory,
                pooling=pooling,
                normalize=False,
                prompt_name=options.prompt_name,
                options=load,
            )
            self.prompt = self.encoder.pipeline.prompt or ""
            self.dimension = self.encoder.dimension
            self.pooling = "+".join(self.encoder.pooling)
            if self.task == "m3":
                self.encoder.m3_heads  # noqa: B018 - a missing or malformed head fails at start, not at a request
        elif self.task == "rerank":
            from hfbert.tools.reranking import CrossEncoder

            self.encoder = CrossEncoder(self.directory, options=load)
            self.dimension = self.encoder.num_labels
            config = read_json_object(self.directory / "config.json", missing_ok=True)
            id2label = config.get("id2label") or {}
            self.labels = [str(id2label.get(str(i), f"LABEL_{i}")) for i in range(self.dimension)]
            self.pooling = ""
            self.prompt = self._prompt_of(options.prompt_name)
        else:
            from hfbert.tools.sparse import SparseEncoder

            self.encoder = SparseEncoder(self.directory, options=load)
            self.dimension = self.encoder.dimension
            self.pooling = "splade"
            self.prompt = self._prompt_of(options.prompt_name)
        self.max_input_length: int = self.encoder.max_length
        self.tokenizer = self.encoder.tokenizer

    def _prompt_of(self, prompt_name: str | None) -> str:
        from hfbert.tools.head_checkpoint import prompt_of

        return prompt_of(self.encoder.settings, self.directory, None, prompt_name)

    def serves(self, operation: str) -> bool:
        """Whether this model's task answers `operation` ("embed", "rerank", "predict", "sparse")."""
        return operation in OPERATIONS[self.task]

    @property
    def task_name(self) -> str:
        return TASK_NAMES[self.task]

    def describe(self) -> str:
        """One line: the encoder and what it computes."""
        encoder = self.encoder
        if hasattr(encoder, "pipeline"):
            return encoder.pipeline.describe()
        return encoder.describe()

    # -- tokens ------------------------------------------------------------------------------------------------------
    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text as the model would see it untruncated (the prompt and special tokens counted)."""
        if not texts:
            return []
        encoded = self.tokenizer([self.prompt + text for text in texts], truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def count_pair_tokens(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens of each (first, second) pair, untruncated."""
        if not pairs:
            return []
        firsts = [self.prompt + first for first, _ in pairs]
        encoded = self.tokenizer(firsts, [second for _, second in pairs], truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def tokenize(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[dict[str, Any]]]:
        """TEI's `/tokenize` answer: per text, its tokens `{"id", "text", "special", "start", "stop"}`, untruncated;
        `start` / `stop` are UTF-8 byte offsets into the text (TEI's), None for the special tokens the tokenizer
        adds; `add_special_tokens=False` leaves those out."""
        encoded = self.tokenizer(
            list(texts), truncation=False, return_offsets_mapping=True, return_special_tokens_mask=True
        )
        result = []
        for text, ids, offsets, special in zip(
            texts, encoded["input_ids"], encoded["offset_mapping"], encoded["special_tokens_mask"], strict=True
        ):
            names = self.tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=False)
            tokens = []
            for token_id, (start, stop), added, name in zip(ids, offsets, special, names, strict=True):
                if added:
                    if add_special_tokens:
                        tokens.append({"id": token_id, "text": name, "special": True, "start": None, "stop": None})
                    continue
                begin, end = len(text[:start].encode()), len(text[:stop].encode())
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": begin, "stop": end})
            result.append(tokens)
        return result

    def decode(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each id sequence; ValueError naming an id outside the vocabulary."""
        size = self.tokenizer.vocab_size
        for number, ids in enumerate(sequences):
            for token_id in ids:
                if not 0 <= token_id < size:
                    raise ValueError(f"ids {number}: {token_id} is not a token id (the vocabulary has {size})")
        return [self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens) for ids in sequences]

    # -- the model -----------------------------------------------------------------------------------------------------
    def run(self, operation: str, inputs: list[Any]) -> list[Any]:
        """The model's outputs for one batch, one per input, in order: "embed" a (dimension,) float32 vector (not
        normalized); "rerank" the (labels,) raw logits of a (first, second) pair; "sparse" a list of (token id,
        weight) with nonzero weights, by id; ("multi", outputs) bge-m3's `multi` outputs."""
        if operation == "embed":
            return list(self.embed(inputs))
        if operation == "rerank":
            return list(self.logits(inputs))
        if operation == "sparse":
            return self.sparse(inputs)
        if isinstance(operation, tuple) and operation[0] == "multi":
            return self.multi(inputs, operation[1])
        raise ValueError(f"unknown operation {operation!r}; expected embed, rerank, sparse or (multi, outputs)")

    def embed(self, texts: list[str]) -> Tensor:
        batch_size = max(1, len(texts))  # the batcher has sized the batch by tokens already: one model call
        if self.task == "m3":
            return self.encoder.embed_m3(texts, outputs=("dense",), batch_size=batch_size)["dense_vecs"]
        return self.encoder.encode(texts, batch_size=batch_size, convert_to_tensor=True)

    def logits(self, pairs: list[tuple[str, str]]) -> Tensor:
        scores = self.encoder.predict(
            [list(pair) for pair in pairs],
            prompt=self.prompt,
            activation_fn=torch.nn.Identity(),
            batch_size=max(1, len(pairs)),
            convert_to_tensor=True,
        )
        return scores.float().reshape(len(pairs), -1).cpu()

    def multi(self, texts: list[str], outputs: Sequence[str]) -> list[dict[str, Any]]:
        """bge-m3's `outputs` ("dense", "sparse", "colbert") of each text from ONE encoder pass: "dense" a
        (dimension,) vector (not normalized), "sparse" (token id, weight) pairs by id, "colbert" a (tokens - 1,
        dimension) tensor."""
        from hfbert.tools.bge_m3 import RESULT_KEYS

        result = self.encoder.embed_m3(texts, outputs=tuple(outputs), batch_size=max(1, len(texts)))
        answers: list[dict[str, Any]] = [{} for _ in texts]
        for name in outputs:
            for answer, value in zip(answers, result[RESULT_KEYS[name]], strict=True):
                if name == "sparse":
                    value = sorted((int(token), float(weight)) for token, weight in value.items())
                answer[name] = value
        return answers

    def sparse(self, texts: list[str]) -> list[list[tuple[int, float]]]:
        if self.task == "m3":
            return [answer["sparse"] for answer in self.multi(texts, ("sparse",))]
        vectors = self.encoder.encode(
            texts, prompt=self.prompt, batch_size=max(1, len(texts)), convert_to_sparse_tensor=False
        )
        result = []
        for vector in vectors.cpu():
            ids = vector.nonzero().flatten()
            result.append(list(zip(ids.tolist(), vector[ids].tolist(), strict=True)))
        return result
