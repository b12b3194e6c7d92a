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

An `Operation` names what a batch computes: its kind, the request's prompt name (None: the server's prompt) and
whether its inputs are texts or token ids. Texts go through the encoders' public calls (`encode`, `predict`,
`embed_m3`) with the prompt put before each. Token ids are the model's input as given (TEI and OpenAI take them):
no prompt or special token is added, so the ids `/tokenize` gives for a text compute what the text computes. They
run through the encoders' calls for ids (`Embedder.encode_ids`, `Embedder.embed_m3_ids`, `SparseEncoder.encode_ids`).
The per-token vectors of `/embed_all` are the encoder's last hidden state at every real token,
`Embedder.encode(output_value="token_embeddings")` as sentence-transformers has it.
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
# What each task serves, by operation ("tokens": the per-token vectors of /embed_all).
OPERATIONS = {
    "embed": ("embed", "tokens"),
    "rerank": ("rerank", "predict"),
    "sparse": ("sparse",),
    "m3": ("embed", "tokens", "sparse", "multi"),
}
# The operations whose inputs may be token ids (the encoders' texts; a reranker's inputs are pairs of texts).
ID_OPERATIONS = ("embed", "tokens", "sparse", "multi")
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
    # "aot": the encoder's forward compiled ahead of time (`hfbert.optimize_for_inference(..., compile="aot")`)
    compile: str | None = None


@dataclass(frozen=True)
class Operation:
    """What one batch computes: inputs of equal operations only share a batch. `kind`: "embed", "tokens", "rerank",
    "sparse" or "multi"; `prompt_name`: the request's prompt (None: the server's); `outputs`: bge-m3's outputs of
    "multi"; `ids`: the inputs are token id sequences, not texts."""

    kind: str
    prompt_name: str | None = None
    outputs: tuple[str, ...] = ()
    ids: bool = False


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
            self.prompts: dict[str, Any] = self.encoder.prompts
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
            self.prompts = self.encoder.settings.prompts
            self.prompt = self._prompt_of(options.prompt_name)
        else:
            from hfbert.tools.sparse import SparseEncoder

            self.encoder = SparseEncoder(self.directory, options=load)
            self.dimension = self.encoder.dimension
            self.pooling = "splade"
            self.prompts = self.encoder.settings.prompts
            self.prompt = self._prompt_of(options.prompt_name)
        if options.compile:
            from hfbert.inference import optimize_for_inference

            optimize_for_inference(
                self.encoder.model, quantize=load.quantize, precision=load.precision, compile=options.compile
            )
        self.max_input_length: int = self.encoder.max_length
        self.tokenizer = self.encoder.tokenizer
        self.vocabulary_size: int = self.encoder.model.config.vocab_size

    def _prompt_of(self, prompt_name: str | None) -> str:
        from hfbert.tools.head_checkpoint import prompt_of

        return prompt_of(self.encoder.settings, self.directory, None, prompt_name)

    def prompt_text(self, prompt_name: str | None) -> str:
        """The text put before each input for a request's `prompt_name`: the folder's prompt of that name, as
        sentence-transformers' `encode(prompt_name=...)` puts it; None: the server's prompt (`--prompt-name`, else
        the folder's default). ValueError naming the prompts there are for a name the folder does not have."""
        if prompt_name is None:
            return self.prompt
        if prompt_name not in self.prompts:
            names = ", ".join(map(repr, self.prompts)) or "none"
            raise ValueError(f"prompt_name {prompt_name!r} is not one of the model's prompts ({names})")
        from hfbert.tools.sentence_transformers_pipeline import prompt_text

        return prompt_text(self.prompts, prompt_name, self.directory) or ""

    def check_prompt(self, operation: str, prompt_name: str | None) -> str:
        """`prompt_text(prompt_name)`, checked for `operation`: ValueError for a name the folder does not have, and
        for a prompt other than the server's on bge-m3's sparse weights (`embed_m3` takes the server's only)."""
        text = self.prompt_text(prompt_name)
        if self.task == "m3" and operation in ("sparse", "multi") and text != self.prompt:
            raise ValueError(
                f"prompt_name {prompt_name!r}: bge-m3's sparse weights are computed with the server's prompt only "
                "(hfbert serve --prompt-name)"
            )
        return text

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
    def count_tokens(self, inputs: Sequence[str | Sequence[int]], prompt: str | None = None) -> list[int]:
        """Tokens of each input as the model would see it untruncated: a text with `prompt` (None: the server's) and
        the special tokens counted, a sequence of token ids its length."""
        prompt = self.prompt if prompt is None else prompt
        texts = [prompt + text for text in inputs if isinstance(text, str)]
        counts = iter(len(ids) for ids in self.tokenizer(texts, truncation=False)["input_ids"]) if texts else iter(())
        return [next(counts) if isinstance(item, str) else len(item) for item in inputs]

    def check_ids(self, ids: Sequence[int], where: str = "inputs") -> None:
        """ValueError, naming the input `where`, for an empty sequence of token ids or an id outside the model's
        vocabulary."""
        if not ids:
            raise ValueError(f"{where}: an empty list of token ids")
        for token_id in ids:
            if not 0 <= token_id < self.vocabulary_size:
                raise ValueError(
                    f"{where}: {token_id} is not a token id (the model's vocabulary has {self.vocabulary_size})"
                )

    def truncated_left(self, text: str, prompt: str) -> list[int]:
        """The ids of `prompt + text` cut on the left to the model's length, its special tokens kept, as a tokenizer
        truncating on the left cuts them (TEI's `truncation_direction: left`). ValueError where the pooling leaves
        the prompt out: the ids would no longer begin with it."""
        if prompt and not getattr(getattr(self.encoder, "pipeline", None), "include_prompt", True):
            raise ValueError(
                "truncation_direction left: this model's pooling leaves its prompt out, which a text cut on the left "
                "no longer begins with; shorten the input"
            )
        encoded = self.tokenizer(prompt + text, truncation=False, return_special_tokens_mask=True)
        ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
        front = next((index for index, added in enumerate(special) if not added), len(ids))
        back = next((index for index, added in enumerate(reversed(special)) if not added), 0)
        content = ids[front : len(ids) - back]
        kept = max(0, self.max_input_length - front - back)
        return ids[:front] + content[len(content) - kept :] + ids[len(ids) - back :]

    def count_pair_tokens(self, pairs: Sequence[tuple[str, str]]) -> list[int]:
        """Tokens of each (first, second) pair, untruncated."""
        if not pairs:
            return []
        firsts = [self.prompt + first for first, _ in pairs]
        encoded = self.tokenizer(firsts, [second for _, second in pairs], truncation=False)["input_ids"]
        return [len(ids) for ids in encoded]

    def tokenize(
        self, texts: Sequence[str], add_special_tokens: bool = True, prompt: str = ""
    ) -> list[list[dict[str, Any]]]:
        """TEI's `/tokenize` answer: per text, its tokens `{"id", "text", "special", "start", "stop"}`, untruncated;
        `start` / `stop` are UTF-8 byte offsets into the text (TEI's), None for the special tokens the tokenizer
        adds; `add_special_tokens=False` leaves those out. `prompt` goes before each text, as the model sees it (the
        offsets count into the prompted text, as TEI's)."""
        texts = [prompt + text for text in texts]
        encoded = self.tokenizer(texts, truncation=False, return_offsets_mapping=True, return_special_tokens_mask=True)
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
    def run(self, operation: Operation, inputs: list[Any]) -> list[Any]:
        """The model's outputs for one batch, one per input, in order: "embed" a (dimension,) float32 vector (not
        normalized); "tokens" a (tokens, hidden size) float32 tensor; "rerank" the (labels,) raw logits of a (first,
        second) pair; "sparse" a list of (token id, weight) with nonzero weights, by id; "multi" bge-m3's outputs
        (`multi`)."""
        if operation.ids:
            return self._run_ids(operation, inputs)
        prompt = self.prompt_text(operation.prompt_name)
        if operation.kind == "embed":
            return list(self.embed(inputs, prompt))
        if operation.kind == "tokens":
            return self.token_vectors(inputs, prompt)
        if operation.kind == "rerank":
            return list(self.logits(inputs))
        if operation.kind == "sparse":
            return self.sparse(inputs, prompt)
        if operation.kind == "multi":
            return self.multi(inputs, operation.outputs)
        raise ValueError(f"unknown operation {operation.kind!r}; expected embed, tokens, rerank, sparse or multi")

    def embed(self, texts: list[str], prompt: str | None = None) -> Tensor:
        """(texts, dimension) vectors, `prompt` (None: the server's) before each text."""
        batch_size = max(1, len(texts))  # the batcher has sized the batch by tokens already: one model call
        prompt = self.prompt if prompt is None else prompt
        if prompt == self.prompt:  # None: the encoder's own prompt, whose length it has measured once
            if self.task == "m3":
                return self.encoder.embed_m3(texts, outputs=("dense",), batch_size=batch_size)["dense_vecs"]
            return self.encoder.encode(texts, batch_size=batch_size, convert_to_tensor=True)
        return self.encoder.encode(texts, prompt=prompt, batch_size=batch_size, convert_to_tensor=True)

    def token_vectors(self, texts: list[str], prompt: str | None = None) -> list[Tensor]:
        """Each text's (tokens, hidden size) last hidden state, its real tokens only (the prompt's and the special
        tokens included), `prompt` (None: the server's) before it."""
        prompt = self.prompt if prompt is None else prompt
        return self.encoder.encode(texts, prompt=prompt, batch_size=max(1, len(texts)), output_value="token_embeddings")

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
                answer[name] = _sparse_pairs(value) if name == "sparse" else value
        return answers

    def sparse(self, texts: list[str], prompt: str | None = None) -> list[list[tuple[int, float]]]:
        prompt = self.prompt if prompt is None else prompt
        if self.task == "m3":  # the server's prompt (`check_prompt` refuses another)
            return [answer["sparse"] for answer in self.multi(texts, ("sparse",))]
        vectors = self.encoder.encode(
            texts, prompt=prompt, batch_size=max(1, len(texts)), convert_to_sparse_tensor=False
        )
        return _nonzero(vectors)

    # -- token ids -----------------------------------------------------------------------------------------------------
    def _run_ids(self, operation: Operation, sequences: list[Sequence[int]]) -> list[Any]:
        """`run` on token id sequences: the encoders' `*_ids` calls, on exactly those ids (no prompt left out of the
        pooling: the ids carry none of the server's)."""
        batch_size = max(1, len(sequences))  # the batcher has sized the batch by tokens already: one model call
        if operation.kind == "tokens":
            return self.encoder.encode_ids(sequences, batch_size=batch_size, output_value="token_embeddings")
        if operation.kind == "sparse" and self.task == "sparse":
            return _nonzero(self.encoder.encode_ids(sequences, batch_size=batch_size, convert_to_sparse_tensor=False))
        if operation.kind == "embed" and self.task != "m3":
            return list(self.encoder.encode_ids(sequences, batch_size=batch_size, convert_to_tensor=True))
        if operation.kind in ("embed", "sparse", "multi"):
            outputs = {"embed": ("dense",), "sparse": ("sparse",)}.get(operation.kind, operation.outputs)
            result = self.encoder.embed_m3_ids(sequences, outputs, batch_size=batch_size)
            from hfbert.tools.bge_m3 import RESULT_KEYS

            rows = [
                {
                    name: _sparse_pairs(value) if name == "sparse" else value
                    for name, value in zip(outputs, values, strict=True)
                }
                for values in zip(*(result[RESULT_KEYS[name]] for name in outputs), strict=True)
            ]
            return [row[outputs[0]] for row in rows] if operation.kind != "multi" else rows
        raise ValueError(f"{operation.kind} takes texts, not token ids")


def _nonzero(vectors: Tensor) -> list[list[tuple[int, float]]]:
    """Each of a SPLADE encoder's vectors as its nonzero (token id, weight) pairs, by id."""
    from hfbert.tools.sparse import SparseEncoder

    return [list(zip(ids.tolist(), weights.tolist(), strict=True)) for ids, weights in SparseEncoder.nonzero(vectors)]


def _sparse_pairs(weights: dict[str, float]) -> list[tuple[int, float]]:
    """bge-m3's `{str(token id): weight}` as (token id, weight) pairs, by id."""
    return sorted((int(token), float(weight)) for token, weight in weights.items())
