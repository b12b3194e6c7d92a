"""The one base of the retrieval encoders: `Embedder` (`hfbert.tools.embedding`, with bge-m3's outputs),
`CrossEncoder` (`hfbert.tools.reranking`) and `SparseEncoder` (`hfbert.tools.sparse`).

What every one of them does the same way lives here, once: the folder resolved (a local folder or a Hub repo id),
its tokenizer (lower-casing first where the folder says so), the model loaded with one `LoadOptions` value and
packed for inference, and the batching: texts (or text pairs) sorted by length, longest first, so that a batch holds
texts of similar length (little padding, as sentence-transformers batches), each batch tokenized and handed to the
encoder's inference step, and the outputs put back in input order. What differs is the inference step alone, one
method of each class: a tokenized batch in, one output row per text out (embeddings, scores, sparse weights).

A caller that already holds one batch (the server's batcher, a Ray Data `map_batches` function) calls the public
method (`Embedder.encode`, `CrossEncoder.predict`, `SparseEncoder.encode`) with `batch_size=len(texts)`: one model
call, outputs as arrays in the batch's order. A caller that has tokenized already (the server counts each input's
tokens before it batches, and takes token ids from clients) gives the ids instead (`Embedder.encode_ids`,
`Embedder.embed_m3_ids`, `SparseEncoder.encode_ids`): the model's input as given, no prompt or special token added.
`Embedder.encode(..., output_value="token_embeddings")` gives per-token vectors, `SparseEncoder.nonzero` sparse
vectors as arrays of token ids and weights.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from hfbert.tools.head_checkpoint import load_head_model, resolve_folder
from hfbert.tools.texts import check_texts

__all__ = ["LoadOptions", "RetrievalEncoder"]


@dataclass(frozen=True)
class LoadOptions:
    """How a retrieval encoder loads its checkpoint. `device`, `dtype` (None: the checkpoint's); `quantize="int8"`:
    int8 weights and activations (faster, lossy: `hfbert/inference/int8.py`); `precision="bf16"`: the encoder's
    products in bf16 on CPUs that compute bf16 natively (lossy: `hfbert/inference/bf16.py`), "high": the fast fp32
    mode (`hfbert/inference/fused.py`); `max_length`: tokens per input (None: the folder's); `ignore_auto_map=True`:
    load a checkpoint whose config.json points to custom code as plain BERT (you know its weights are); `revision`,
    `cache_dir`, `token`: for a Hub repo id."""

    device: str = "cpu"
    dtype: str | torch.dtype | None = None
    quantize: str | None = None
    precision: str = "highest"
    max_length: int | None = None
    ignore_auto_map: bool = False
    revision: str | None = None
    cache_dir: str | os.PathLike | None = None
    token: str | bool | None = None

    @classmethod
    def of(cls, options: LoadOptions | None, given: dict[str, Any]) -> LoadOptions:
        """`options` (None: the defaults) with the keywords of `given` in place of its fields; TypeError naming a
        keyword that is no load option."""
        names = [option.name for option in fields(cls)]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the load options are {', '.join(names)}")
        return replace(options or cls(), **given)


class RetrievalEncoder:
    """A checkpoint folder, its tokenizer and model, and the length-sorted batching every retrieval encoder runs
    (see the module docstring). A subclass loads its model (`_load_model`) and tokenizer (`_load_tokenizer`), sets
    `max_length`, and gives its inference step to `_in_order` / `_batches`."""

    model: Any
    tokenizer: Any
    max_length: int

    def __init__(self, model_path: str | os.PathLike, options: LoadOptions) -> None:
        self.options = options
        self.directory = resolve_folder(model_path, options.revision, options.cache_dir, options.token)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def _load_tokenizer(self) -> None:
        from hfbert.modeling.tokenizer import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.directory)

    def _lowercase(self, do_lower_case: bool) -> None:
        if do_lower_case:  # inside the tokenizer, after special tokens, as sentence-transformers 6
            self.tokenizer.lowercase_first()

    def _load_model(self, task: str | None) -> None:
        """The family's model for `task` ("sequence-classification", "masked-lm": `load_head_model`, refused without
        its head) or, for None, its encoder alone (BertModel, XLMRobertaModel, ...), packed for inference."""
        options = self.options
        modes = dict(quantize=options.quantize, precision=options.precision, ignore_auto_map=options.ignore_auto_map)
        if task is not None:
            self.model = load_head_model(self.directory, task, device=options.device, dtype=options.dtype, **modes)
            return
        from converters.dtypes import DTYPES
        from hfbert.inference import optimize_for_inference
        from hfbert.modeling.auto import AutoModel

        dtype = DTYPES[options.dtype] if isinstance(options.dtype, str) else options.dtype
        self.model = AutoModel.from_pretrained(
            self.directory,
            device=options.device,
            dtype=dtype,
            add_pooling_layer=False,
            ignore_auto_map=options.ignore_auto_map,
        )
        # Inference only, so the weights are packed (fp32: the same numbers as unpacked, within hfbert's contract;
        # a no-op off x86 CPUs) or, when asked, quantized to int8 or run in bf16.
        optimize_for_inference(self.model, quantize=options.quantize, precision=options.precision)

    def _batches(
        self,
        step: Callable[[Any], Any],
        texts: Sequence[str],
        seconds: Sequence[str] | None = None,
        *,
        prefix: str = "",
        batch_size: int,
        progress: Any = None,
    ) -> Iterator[tuple[list[int], Any]]:
        """(indices into `texts`, `step`'s outputs for them) batch by batch, the longest texts (or pairs, with
        `seconds`: the second texts) first. `step` takes the tokenized batch (`prefix` before each first text) and
        returns one output row per text. `progress`: anything with `update(n)`, advanced by each batch's size."""
        if seconds is None:  # each named by its place in `texts`, not in a sorted batch (once: `CheckedTexts`)
            check_texts(texts)
        order = sorted(range(len(texts)), key=lambda i: -(len(texts[i]) + (len(seconds[i]) if seconds else 0)))
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = self.tokenizer(
                [prefix + texts[index] for index in indices],
                None if seconds is None else [seconds[index] for index in indices],
                padding=True,
                truncation=True if seconds is None else "longest_first",
                max_length=self.max_length,
                return_attention_mask=True,  # pooling needs it, even where model_input_names leaves it out
                return_tensors="pt",
            ).to(self.device)
            outputs = step(batch)
            if progress is not None:
                progress.update(len(indices))
            yield indices, outputs

    def _id_batches(
        self, step: Callable[[Any], Any], sequences: Sequence[Sequence[int]], *, batch_size: int, progress: Any = None
    ) -> Iterator[tuple[list[int], Any]]:
        """`_batches` for token id sequences taken as the model's input, as given: no prompt, special token or
        truncation added, each batch padded (the tokenizer's pad id, right) with its attention mask. ValueError
        naming the sequence for one that is empty, longer than `max_length`, or holds an id outside the vocabulary."""
        sequences = [list(ids) for ids in sequences]
        vocabulary = self.model.config.vocab_size
        for number, ids in enumerate(sequences):
            if not ids:
                raise ValueError(f"token ids {number}: an empty sequence")
            if len(ids) > self.max_length:
                raise ValueError(f"token ids {number}: {len(ids)} ids, over the model's max_length {self.max_length}")
            wrong = next(
                (i for i in ids if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocabulary), None
            )
            if wrong is not None:
                raise ValueError(f"token ids {number}: {wrong!r} is not a token id (the vocabulary has {vocabulary})")
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = self.tokenizer.pad(
                {"input_ids": [sequences[index] for index in indices]},
                padding=True,
                return_attention_mask=True,
                return_tensors="pt",
            ).to(self.device)
            outputs = step(batch)
            if progress is not None:
                progress.update(len(indices))
            yield indices, outputs

    def _in_order(self, step: Callable[[Any], Any], texts: Sequence[str], *args: Any, **batching: Any) -> list[Any]:
        """`step`'s output rows of every text, in input order (`_batches` runs them)."""
        rows: list[Any] = [None] * len(texts)
        for indices, outputs in self._batches(step, texts, *args, **batching):
            for index, row in zip(indices, outputs, strict=True):
                rows[index] = row
        return rows

    def _in_order_ids(
        self, step: Callable[[Any], Any], sequences: Sequence[Sequence[int]], **batching: Any
    ) -> list[Any]:
        """`step`'s output rows of every token id sequence, in input order (`_id_batches` runs them)."""
        rows: list[Any] = [None] * len(sequences)
        for indices, outputs in self._id_batches(step, sequences, **batching):
            for index, row in zip(indices, outputs, strict=True):
                rows[index] = row
        return rows


@contextmanager
def progress_bar(show: Any, total: int, task: str, unit: str) -> Iterator[Any]:
    """`show` itself when it is a bar (anything with `update`: a caller's bar over several calls), else a bar of
    `total` items shown when `show` is true, closed at the end."""
    if hasattr(show, "update"):
        yield show
        return
    from hfbert.tools.progress import Progress

    with closing(Progress(total, task, unit, enabled=bool(show))) as bar:
        yield bar


class QueryDocumentPrompts:
    """`encode_query` / `encode_document` as sentence-transformers 6 has them: `encode` with the folder's "query"
    (or "document") prompt when the call gives none. sentence-transformers 6 gives every SentenceTransformer and
    SparseEncoder a "query" and a "document" prompt, empty unless the folder has one, so neither call falls back to
    the folder's default prompt (nor to "passage" or "corpus", which its `encode_document` would look for after
    "document"). The class gives `encode` and `prompts` (the folder's, name -> text)."""

    prompts: dict[str, Any]
    encode: Callable[..., Any]

    def encode_query(self, inputs: Sequence[str] | str, **options: Any) -> Any:
        """`encode(inputs, **options)` with the folder's "query" prompt (none without one) unless `options` give a
        prompt."""
        return self.encode(inputs, **self._prompt_named("query", options))

    def encode_document(self, inputs: Sequence[str] | str, **options: Any) -> Any:
        """`encode(inputs, **options)` with the folder's "document" prompt (none without one) unless `options` give
        a prompt."""
        return self.encode(inputs, **self._prompt_named("document", options))

    def _prompt_named(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        if options.get("prompt") is not None or options.get("prompt_name") is not None:
            return options
        return {**options, "prompt_name": name} if name in self.prompts else {**options, "prompt": ""}
