"""Reranking with a cross-encoder: `CrossEncoder(MODEL).predict(pairs)` and `.rank(query, documents)` return what
sentence-transformers' `CrossEncoder` returns on the same folder (types, shapes, order, keys), scores equal within
fp32 rounding; `hfbert rerank` prints `rank`'s order as JSON lines.

    >>> from hfbert import CrossEncoder
    >>> reranker = CrossEncoder("cross-encoder/ms-marco-MiniLM-L6-v2")  # doctest: +SKIP
    >>> ranked = reranker.rank("Who wrote Dune?", ["Paris is in France.", "Herbert wrote Dune."])  # doctest: +SKIP
    >>> [result["corpus_id"] for result in ranked]  # doctest: +SKIP
    [1, 0]

What runs: the family's `...ForSequenceClassification` on `tokenizer(first_texts, second_texts)` (truncation
`longest_first` at the folder's length, `hfbert.tools.head_checkpoint`), pairs sorted by length so that a batch holds
pairs of similar length, scores put back in input order. Then, as sentence-transformers' `predict`: the activation
(applied to the (batch, labels) logits), the squeeze of a single label to one score per pair, and `apply_softmax`
(several labels only).

The default activation, in sentence-transformers' order: `config_sentence_transformers.json`'s `activation_fn` (a
folder saved by sentence-transformers 6 with modules.json), then config.json's `sentence_transformers.activation_fn`
(4.x and 5.x), then config.json's `sbert_ce_default_activation_function` (before 4.0), then Sigmoid for one label and
Identity for several. A path is looked up in a fixed table of torch.nn's activation modules, never imported; one
outside `torch.*` is ignored with a warning (sentence-transformers runs it only with `trust_remote_code`, and hfbert
never runs a checkpoint's code); one under `torch.*` that is no activation module is refused, naming the file.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from converters.json_files import read_json_object
from hfbert.tools.head_checkpoint import input_length, prompt_of, read_folder_settings
from hfbert.tools.retrieval import LoadOptions, RetrievalEncoder, progress_bar
from hfbert.tools.sentence_transformers_pipeline import ACTIVATIONS, PROMPTS_FILE
from hfbert.tools.texts import CheckedTexts, check_unicode, is_checked

CHUNK_SIZE = 10_000  # documents read and scored at once by `rank_file`
__all__ = ["CHUNK_SIZE", "CrossEncoder", "default_activation", "rank_file"]


class CrossEncoder(RetrievalEncoder):
    """A cross-encoder checkpoint (a local folder or Hub repo id with a classification head) scoring text pairs as
    sentence-transformers' `CrossEncoder` does (see the module docstring). `activation_fn`: replaces the folder's
    default activation. The load options (`hfbert.tools.retrieval.LoadOptions`, as keywords or one `options`):
    `max_length` tokens per pair (default: the folder's); `quantize="int8"` the encoder in int8 weights and
    activations (faster, lossy: `hfbert/inference/int8.py`; the logits' own product stays fp32); `precision="bf16"`
    the encoder's products in bf16, on CPUs that compute it natively (`hfbert/inference/bf16.py`); `device`,
    `dtype`, `revision`, `cache_dir`, `token`, `ignore_auto_map`."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
        options: LoadOptions | None = None,
        **load_options: Any,
    ) -> None:
        super().__init__(model_path, LoadOptions.of(options, load_options))
        directory = self.directory
        self.settings = settings = read_folder_settings(directory, "CrossEncoder")
        if settings.modules is not None:
            names = [module.name for module in settings.modules]
            if names != ["Transformer"] or settings.modules[0].folder != directory:
                raise ValueError(
                    f"{directory / 'modules.json'}: modules {', '.join(names)}; hfbert's CrossEncoder runs one "
                    f"Transformer (sequence classification) at the folder's root"
                )
            task = settings.transformer.get("transformer_task", "sequence-classification")
            if task != "sequence-classification":
                raise ValueError(
                    f"{directory / 'sentence_bert_config.json'}: transformer_task {task!r}; a cross-encoder "
                    f"scores pairs with a sequence-classification head"
                )
        self._load_model("sequence-classification")
        self._load_tokenizer()
        self._lowercase(settings.do_lower_case)
        self.num_labels: int = self.model.config.num_labels
        limit = self.model.config.max_sequence_length
        self.max_length = input_length(settings, self.tokenizer, limit, self.options.max_length)
        if activation_fn is None:
            activation_fn, self.activation_source = default_activation(
                directory, settings.model_config, self.num_labels
            )
        else:
            self.activation_source = "given"
        self.activation_fn = activation_fn

    def describe(self) -> str:
        """One line: the model, its labels, length and activation, and where the activation came from."""
        activation = getattr(self.activation_fn, "__name__", None) or type(self.activation_fn).__name__
        labels = "1 label" if self.num_labels == 1 else f"{self.num_labels} labels"
        return (
            f"{type(self.model).__name__} ({labels}), max_length {self.max_length}, activation {activation} "
            f"({self.activation_source})"
        )

    @torch.no_grad()
    def predict(
        self,
        inputs: Sequence[Sequence[str]] | Sequence[str],
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> Any:
        """Scores of `inputs`, a list of (first, second) text pairs or one pair, as sentence-transformers'
        `CrossEncoder.predict`: a float32 numpy array by default ((pairs,) for one label, (pairs, labels) for
        several), one tensor with `convert_to_tensor=True`, a list of tensors with `convert_to_numpy=False`; one
        pair gives one score (or one row). `activation_fn` None: the model's (`activation_fn`, see the module
        docstring). `apply_softmax`: softmax over several labels (nothing for one)."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        single = _is_single_pair(inputs)
        pairs = [list(inputs)] if single else list(inputs)
        firsts, seconds = _checked_pairs(pairs, unicode=not is_checked(inputs))
        prefix = prompt_of(self.settings, self.directory, prompt, prompt_name)
        activation = self.activation_fn if activation_fn is None else activation_fn
        scores = self._scores(firsts, seconds, prefix, batch_size, activation, apply_softmax, show_progress_bar)
        if convert_to_tensor:
            result: Any = torch.stack(scores) if scores else torch.tensor([], device=self.device)
        elif convert_to_numpy:
            import numpy

            result = torch.stack(scores).float().cpu().numpy() if scores else numpy.array([])
        else:
            result = scores
        return result[0] if single else result

    def _scores(
        self,
        firsts: list[str],
        seconds: list[str],
        prefix: str,
        batch_size: int,
        activation: Callable[[Tensor], Tensor] | None,
        apply_softmax: bool | None,
        show_progress_bar: bool | None,
    ) -> list[Tensor]:
        """One score tensor per pair, in input order; the longest pairs are batched first. `show_progress_bar`: a
        flag (a bar of these pairs), or a bar to advance by each batch (`rank_file`'s, over all its chunks)."""

        def step(batch: Any) -> Tensor:  # the inference step: a tokenized batch of pairs -> their scores
            logits = self.model(**batch, return_dict=True).logits
            if logits.is_floating_point() and torch.finfo(logits.dtype).bits < 32:
                logits = logits.float()  # as sentence-transformers: bf16 ties broken in float32
            if activation is not None:
                logits = activation(logits)
            if self.num_labels == 1 and logits.ndim > 1:
                logits = logits.squeeze(-1)
            if apply_softmax and logits.ndim > 1:
                logits = torch.nn.functional.softmax(logits, dim=1)
            return logits

        with progress_bar(show_progress_bar, len(firsts), "rerank", "pair") as bar:
            return self._in_order(step, firsts, seconds, prefix=prefix, batch_size=batch_size, progress=bar)

    def require_one_label(self) -> None:
        """ValueError (sentence-transformers' own) unless the model gives one score per pair, which ranking needs."""
        if self.num_labels != 1:
            raise ValueError(
                "CrossEncoder.rank() only works for models with num_labels=1. "
                "Consider using CrossEncoder.predict() with input pairs instead."
            )

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[[Tensor], Tensor] | None = None,
    ) -> list[dict[str, Any]]:
        """`documents` by their score against `query`, best first, as sentence-transformers' `CrossEncoder.rank`:
        `[{"corpus_id": i, "score": s}, ...]` (with `"text"` when `return_documents`), equal scores in input order,
        the first `top_k` (all for None). Only for a model with one label (ValueError otherwise); TypeError for a
        `query` that is no str or `documents` that is one (which sentence-transformers would rank character by
        character)."""
        self.require_one_label()
        _check_query_and_documents(query, documents)
        scores = self.predict(
            [[query, document] for document in documents],
            prompt_name=prompt_name,
            prompt=prompt,
            batch_size=batch_size,
            show_progress_bar=show_progress_bar,
            activation_fn=activation_fn,
            convert_to_tensor=True,
        ).tolist()
        results = []
        for index, score in enumerate(scores):
            results.append({"corpus_id": index, "score": score})
            if return_documents:
                results[-1]["text"] = documents[index]
        return sorted(results, key=lambda result: result["score"], reverse=True)[:top_k]


def _check_query_and_documents(query: Any, documents: Any) -> None:
    if not isinstance(query, str):
        raise TypeError(f"query is a {type(query).__name__}; expected one text (a str)")
    if isinstance(documents, str):  # iterating it would give one document per character
        raise TypeError("documents is a str: give a list of texts ([text] for one)")


def _is_single_pair(inputs: Any) -> bool:
    """sentence-transformers' rule: a list or tuple whose first element is no list or tuple is one pair, and so is a
    1-D numpy array (of two strings)."""
    if isinstance(inputs, (list, tuple)):
        return len(inputs) > 0 and not isinstance(inputs[0], (list, tuple))
    if isinstance(inputs, str):
        raise TypeError("inputs must be a list of (first, second) text pairs, or one pair, not a str")
    return getattr(inputs, "ndim", 2) < 2 and len(inputs) > 0


def _checked_pairs(pairs: list[Any], unicode: bool = True) -> tuple[list[str], list[str]]:
    """The first and the second texts of `pairs`; TypeError / ValueError naming the pair that is not two texts, or
    (`unicode`: unless the caller checked them) a text that is not valid Unicode."""
    firsts, seconds = [], []
    for index, pair in enumerate(pairs):
        if isinstance(pair, str) or not isinstance(pair, Sequence) and getattr(pair, "ndim", None) != 1:
            raise ValueError(f"pair {index} is a {type(pair).__name__}; expected two texts (first, second)")
        if len(pair) != 2:
            raise ValueError(f"pair {index} has {len(pair)} items; expected two texts (first, second)")
        for position, text in enumerate(pair):
            if not isinstance(text, str):
                raise TypeError(f"pair {index}, text {position} is a {type(text).__name__}, not a str")
            if unicode:
                check_unicode(text, f"pair {index}, text {position}")
        firsts.append(str(pair[0]))
        seconds.append(str(pair[1]))
    return firsts, seconds


def default_activation(
    directory: Path, model_config: dict[str, Any], num_labels: int
) -> tuple[Callable[[Tensor], Tensor], str]:
    """The activation sentence-transformers' `CrossEncoder` applies to the folder's logits by default, and where it
    comes from (see the module docstring). `model_config`: config_sentence_transformers.json as read for a
    CrossEncoder folder with modules.json (empty otherwise)."""
    config_file = directory / "config.json"
    candidates = []
    if model_config.get("activation_fn") is not None:
        candidates.append((model_config["activation_fn"], f"{directory / PROMPTS_FILE} activation_fn"))
    config = read_json_object(config_file)
    nested = config.get("sentence_transformers")
    if nested is not None and not isinstance(nested, dict):
        raise ValueError(f"{config_file}: sentence_transformers is {type(nested).__name__}; expected an object")
    if nested is not None and "activation_fn" in nested:
        if nested["activation_fn"] is not None:
            candidates.append((nested["activation_fn"], f"{config_file} sentence_transformers.activation_fn"))
    elif config.get("sbert_ce_default_activation_function") is not None:
        legacy = config["sbert_ce_default_activation_function"]
        candidates.append((legacy, f"{config_file} sbert_ce_default_activation_function"))
    for path, where in candidates:
        activation = _activation(path, where)
        if activation is not None:
            return activation, where
    if num_labels == 1:
        return nn.Sigmoid(), "Sigmoid: the default for one label"
    return nn.Identity(), "Identity: the default for several labels"


def _activation(path: Any, where: str) -> nn.Module | None:
    """The activation module a saved path names; None (and a warning) for a path outside torch, which
    sentence-transformers ignores too without trust_remote_code."""
    if not isinstance(path, str):
        raise ValueError(f"{where} is {path!r}; expected the dotted path of an activation (torch.nn.Sigmoid)")
    if not path.startswith("torch."):
        warnings.warn(
            f"{where} {path!r} is not under torch.*; hfbert never runs a checkpoint's own code, so it is ignored "
            f"(as sentence-transformers does without trust_remote_code) and the next default applies",
            stacklevel=4,
        )
        return None
    activation = ACTIVATIONS.get(path)
    if activation is None:
        raise ValueError(
            f"{where} {path!r} is not one hfbert runs (torch.nn's activation modules, e.g. "
            f"'torch.nn.modules.activation.Sigmoid', and Identity)"
        )
    return activation().eval()


def rank_file(
    reranker: CrossEncoder,
    query: str,
    documents: Iterable[str],
    out: str | os.PathLike | None,
    *,
    top_k: int | None = None,
    batch_size: int = 32,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
    total: int | None = None,
) -> int:
    """`reranker.rank(query, documents, top_k)` written as JSON lines `{"index": i, "score": s}`, best first, into
    `out` (None: stdout) as `hfbert embed` writes (`hfbert.tools.embedding_output`: whole or not at all, a full
    disk named). `documents` is read lazily and once, scored `chunk_size` at a time: only the scores are kept, so a
    file of any size ranks in memory proportional to its line count. Progress counts documents as each batch is
    scored (of `total`, when known: a file's line count). Returns how many lines were written."""
    from hfbert.tools.embedding_output import output_kind, output_writer
    from hfbert.tools.progress import Progress

    if chunk_size < 1:
        raise ValueError(f"chunk size must be at least 1, got {chunk_size}")
    if output_kind(out) != ".jsonl":
        raise ValueError(f"{out}: rankings are written as JSON lines: use .jsonl")
    reranker.require_one_label()
    _check_query_and_documents(query, documents)
    scores: list[float] = []
    bar = Progress(total, "rerank", "document", enabled=progress)
    checked = is_checked(documents)  # a file's, by read_texts: named by file and line
    with closing(bar):
        iterator = iter(documents)
        while chunk := list(islice(iterator, chunk_size)):
            for offset, document in enumerate(chunk) if not checked else ():  # named by their place in the input
                check_unicode(document, f"document {len(scores) + offset}")
            if not scores:  # the query once, named as the first pair's first text
                check_unicode(query, "pair 0, text 0")
            pairs = CheckedTexts([query, document] for document in chunk)  # not checked again by `predict`
            # The bar advances by each batch: once per chunk, it stayed at 0 until 10,000 documents were scored.
            scored = reranker.predict(pairs, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=bar)
            scores += scored.tolist()
    ranked = sorted(enumerate(scores), key=lambda item: item[1], reverse=True)[:top_k]
    with output_writer(out, 1, ".jsonl") as writer:
        for index, score in ranked:
            writer.handle.write(json.dumps({"index": index, "score": score}) + "\n")
            writer.row += 1
    return writer.row
