"""Text embeddings with hfbert, as the checkpoint's sentence-transformers pipeline computes them, streamed: from a
file of any size (or standard input) to a `.npy` or `.jsonl` file, in input order.

    >>> from hfbert import Embedder
    >>> embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> embedder.pipeline.describe()  # doctest: +SKIP
    'sentence-transformers (modules.json): Transformer(max_seq_length=256) -> Pooling(mean) -> Normalize'
    >>> embedder.encode(["A first text.", "Another one."]).shape  # doctest: +SKIP
    (2, 384)

What is computed: by default `Embedder` gives what `SentenceTransformer(MODEL).encode(texts)` gives, element for
element: the checkpoint's pipeline as `hfbert.tools.sentence_transformers_pipeline` reads it (mean pooling for a
checkpoint without sentence-transformers files). `pooling`, `normalize`, `max_length`, `prompt` / `prompt_name`
override the checkpoint's choices; `Embedder.pipeline.describe()` says what runs (`hfbert embed` prints it).
`encode_query` / `encode_document` prepend the folder's "query" / "document" prompt, a prompt per call, as
sentence-transformers 6 does; `embed` is `encode` returning a tensor. The folder, tokenizer, load options and
length-sorted batching are the retrieval encoders' base (`hfbert.tools.retrieval`). tests/test_embed_pipeline.py
and tests/test_retrieval_encoder.py compare with sentence-transformers' `encode`, `encode_query`, `encode_document`.
`Embedder.embed_m3` gives BAAI/bge-m3's dense, lexical and ColBERT outputs from the same pass, as FlagEmbedding's
`BGEM3FlagModel.encode` (`hfbert.tools.bge_m3`).

How a large input runs (`embed_file`): the texts (`hfbert.tools.texts.read_texts` reads a file or standard input)
are consumed once, front to back, in chunks of `CHUNK_SIZE`, never whole: a pipe works as well as a file. Each
chunk is sorted by length so that batches hold texts of similar length (little padding), embedded batch by batch,
put back in input order and appended to the output (`hfbert.tools.embedding_output`: `.npy` or `.jsonl`, written
whole or not at all). A corpus that outgrows one process runs on Ray Data: `hfbert embed --ray` and
`hfbert.ray_data`, which call this module's `Embedder` on each batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy
import torch
from torch import Tensor

from hfbert.tools.bge_m3 import OUTPUTS as M3_OUTPUTS
from hfbert.tools.bge_m3 import RESULT_KEYS, M3Heads, load_m3_heads, parse_outputs
from hfbert.tools.embedding_output import output_kind, write_in_input_order
from hfbert.tools.retrieval import LoadOptions, QueryDocumentPrompts, RetrievalEncoder, progress_bar
from hfbert.tools.sentence_transformers_modules import POOLINGS, Dense, Normalize, SentenceModules
from hfbert.tools.sentence_transformers_pipeline import checkpoint_prompts, prompt_text, read_pipeline
from hfbert.tools.texts import read_texts

CHUNK_SIZE = 10_000
__all__ = ["CHUNK_SIZE", "Embedder", "embed_file", "output_kind", "read_texts"]


class Embedder(QueryDocumentPrompts, RetrievalEncoder):
    """A checkpoint's encoder, tokenizer and sentence-transformers pipeline, turning lists of texts into
    (texts, dimension) float32 embeddings (`encode`, `encode_query`, `encode_document`, as sentence-transformers').
    `pooling`, `normalize`, `prompt` / `prompt_name` (the default prompt of every call), `max_length`: None keeps
    the checkpoint's choice (see the module docstring). `batch_size`: texts per model call by default. The load
    options (`device`, `dtype`, `quantize`, `precision`, `max_length`, `ignore_auto_map`, `revision`, `cache_dir`,
    `token`) are `hfbert.tools.retrieval.LoadOptions`' fields: given as keywords, or as one `options` value."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | None = None,
        batch_size: int = 32,
        prompt: str | None = None,
        prompt_name: str | None = None,
        options: LoadOptions | None = None,
        **load_options: Any,
    ) -> None:
        modes = None if pooling is None else (pooling,) if isinstance(pooling, str) else tuple(pooling)
        if modes is not None and (not modes or any(mode not in POOLINGS for mode in modes)):
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (or a list of them), not {pooling!r}")
        _check_batch_size(batch_size)
        if prompt is not None and prompt_name is not None:
            raise ValueError("give a prompt or a prompt name, not both")
        super().__init__(model_path, LoadOptions.of(options, load_options))
        self._load_tokenizer()
        self._load_model(None)  # the family's encoder: BertModel, XLMRobertaModel, ...
        config = self.model.config
        limit = config.max_sequence_length  # RoBERTa's: max_position_embeddings - pad_token_id - 1
        self.pipeline = read_pipeline(self.directory, config.hidden_size, limit, self.tokenizer.model_max_length)
        self._lowercase(self.pipeline.do_lower_case)
        self.prompts: dict[str, Any] = (
            self.pipeline.prompts if self.pipeline.prompts is not None else checkpoint_prompts(self.directory)[0]
        )
        self._override(modes, normalize, self.options.max_length, limit, prompt, prompt_name)
        self.batch_size = batch_size
        self.max_length = self.pipeline.max_length
        self.prompt_length = self.pipeline.modules.pooling.prompt_length = self._prompt_length(self.pipeline.prompt)
        self.dimension = self.pipeline.modules.dimension
        self.pipeline.modules.to(self.model.device)
        self._m3_heads: M3Heads | None = None

    def _override(self, modes, normalize, max_length, limit, prompt, prompt_name) -> None:
        pipeline = self.pipeline
        if modes is not None and modes != pipeline.pooling:
            dense = next((module for module in pipeline.modules if isinstance(module, Dense)), None)
            if dense is not None and len(modes) != len(pipeline.pooling):
                raise ValueError(
                    f"pooling {'+'.join(modes)} gives {len(modes)} vectors per text, but the checkpoint's "
                    f"{dense.describe()} takes {dense.linear.in_features} values"
                )
            pipeline.modules.pooling.modes = modes
            pipeline.overrides.append(f"pooling {'+'.join(modes)}")
        if normalize is not None and normalize != pipeline.normalize:
            if normalize:
                pipeline.modules.append(Normalize())
            else:
                pipeline.modules = SentenceModules(*(m for m in pipeline.modules if not isinstance(m, Normalize)))
            pipeline.overrides.append("Normalize" if normalize else "no Normalize")
        if max_length is not None:
            if not 1 <= max_length <= limit:
                raise ValueError(f"max_length must be in [1, {limit}] (the model's longest input), got {max_length}")
            if max_length != pipeline.max_length:
                pipeline.max_length = max_length
                pipeline.overrides.append(f"max_length {max_length}")
        prompt = self._prompt(prompt, prompt_name)
        if prompt is not None and (prompt or None) != pipeline.prompt:
            pipeline.prompt = prompt or None
            pipeline.overrides.append(f"prompt {prompt!r}")

    def _prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """The text `prompt` / `prompt_name` (the folder's prompt of that name) put before every text; None where
        neither is given (the embedder's default prompt applies)."""
        if prompt is not None and prompt_name is not None:
            raise ValueError("give a prompt or a prompt name, not both")
        if prompt_name is None:
            return prompt
        if prompt_name not in self.prompts:
            names = ", ".join(map(repr, self.prompts)) or "none"
            raise ValueError(f"prompt name {prompt_name!r} is not in the checkpoint's prompts ({names})")
        return prompt_text(self.prompts, prompt_name, self.directory) or ""

    def _prompt_length(self, prompt: str | None) -> int:
        """How many leading tokens `prompt` takes (its trailing [SEP] not counted), when pooling leaves it out."""
        if not prompt or self.pipeline.include_prompt:
            return 0
        ids = self.tokenizer(prompt, truncation=True, max_length=self.max_length)["input_ids"]
        special = {self.tokenizer.cls_token_id, self.tokenizer.sep_token_id, self.tokenizer.pad_token_id}
        special |= {self.tokenizer.unk_token_id, self.tokenizer.mask_token_id}
        return len(ids) - (ids[-1] in special)

    def prompt_tokens(self, prompt: str | None = None) -> int:
        """How many leading tokens of an input `prompt` (None: the embedder's default prompt) takes that the pooling
        leaves out: 0 where the folder's pooling keeps the prompt (`include_prompt`), else the prompt's tokens but
        its trailing separator, as sentence-transformers counts them. `encode_ids(..., prompt_length=...)` takes it
        for ids that begin with the prompt's."""
        return self.prompt_length if prompt is None else self._prompt_length(prompt)

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.pipeline.pooling

    @property
    def normalize(self) -> bool:
        return self.pipeline.normalize

    def _embeddings(self, batch: Any) -> Tensor:
        """The inference step: a tokenized batch's embeddings, (batch, dimension) float32 on the CPU."""
        hidden = self.model(**batch, return_dict=True).last_hidden_state
        return self.pipeline.modules(hidden, batch["attention_mask"]).cpu()

    def _token_embeddings(self, batch: Any) -> list[Tensor]:
        """The inference step of `output_value="token_embeddings"`: each row's last hidden state at its real tokens
        (the prompt's and the special tokens included), (tokens, hidden size) float32 on the CPU."""
        hidden = self.model(**batch, return_dict=True).last_hidden_state
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        return [row[:length].float().cpu() for row, length in zip(hidden, lengths, strict=True)]

    def _step(self, output_value: str) -> Any:
        if output_value == "sentence_embedding":
            return self._embeddings
        if output_value == "token_embeddings":
            return self._token_embeddings
        raise ValueError(f"output_value must be 'sentence_embedding' or 'token_embeddings', not {output_value!r}")

    def _stacked(self, rows: list[Tensor], convert_to_numpy: bool, convert_to_tensor: bool) -> Any:
        if convert_to_tensor:
            return torch.stack(rows) if rows else torch.empty(0, self.dimension, dtype=torch.float32)
        if convert_to_numpy:
            return torch.stack(rows).numpy() if rows else numpy.empty((0, self.dimension), dtype=numpy.float32)
        return rows

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str] | str,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int | None = None,
        show_progress_bar: Any = None,
        output_value: str = "sentence_embedding",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> Any:
        """Embeddings of `texts`, in their order, as sentence-transformers' `encode`: a (texts, dimension) float32
        numpy array by default, one tensor with `convert_to_tensor=True`, a list of (dimension,) tensors with
        `convert_to_numpy=False`; one text (a str) gives one vector. `prompt` / `prompt_name` (the folder's prompt
        of that name): the text put before each text in this call (None for both: the embedder's default prompt).
        `batch_size` None: the embedder's. Longest texts are batched together first, as sentence-transformers does.
        `show_progress_bar`: a flag, or a bar (anything with `update(n)`) to advance by each batch's size.
        `output_value="token_embeddings"`: each text's (tokens, hidden size) float32 last hidden state at its real
        tokens (prompt and special tokens included) instead, a list of tensors whatever the `convert_to_*` flags, as
        sentence-transformers gives them."""
        single = isinstance(texts, str)  # one text, not a sequence of one-character texts
        texts = [texts] if single else texts
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        step = self._step(output_value)
        text = self._prompt(prompt, prompt_name)
        prefix = (self.pipeline.prompt if text is None else text) or ""
        pooling = self.pipeline.modules.pooling
        pooling.prompt_length = self.prompt_length if text is None else self._prompt_length(text)
        try:
            with progress_bar(show_progress_bar, len(texts), "embed", "text") as bar:
                rows = self._in_order(step, texts, prefix=prefix, batch_size=batch_size, progress=bar)
        finally:
            pooling.prompt_length = self.prompt_length
        if output_value == "token_embeddings":
            return rows[0] if single else rows
        result = self._stacked(rows, convert_to_numpy, convert_to_tensor)
        return result[0] if single else result

    @torch.no_grad()
    def encode_ids(
        self,
        sequences: Sequence[Sequence[int]],
        prompt_length: int = 0,
        batch_size: int | None = None,
        output_value: str = "sentence_embedding",
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> Any:
        """`encode` of already tokenized inputs: each sequence of token ids is the model's input as given (no prompt,
        special token or truncation added; what the tokenizer gives for a text, `/tokenize`'s ids, computes what the
        text computes). `prompt_length`: how many leading ids are a prompt that the folder's pooling leaves out
        (`include_prompt` false; 0: none; `prompt_tokens` counts them); outputs and `convert_to_*` as `encode`'s.
        ValueError naming a sequence that is empty, longer than `max_length`, or holds an id outside the
        vocabulary."""
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        step = self._step(output_value)
        if isinstance(prompt_length, bool) or not isinstance(prompt_length, int) or prompt_length < 0:
            raise ValueError(f"prompt_length must be a non-negative integer, got {prompt_length!r}")
        pooling = self.pipeline.modules.pooling
        pooling.prompt_length = 0 if self.pipeline.include_prompt else prompt_length
        try:
            rows = self._in_order_ids(step, sequences, batch_size=batch_size)
        finally:
            pooling.prompt_length = self.prompt_length
        return rows if output_value == "token_embeddings" else self._stacked(rows, convert_to_numpy, convert_to_tensor)

    def embed(self, texts: Sequence[str] | str, progress: Any = None) -> Tensor:
        """`encode(texts, convert_to_tensor=True)` with the embedder's prompt: a (texts, dimension) float32 tensor,
        one (dimension,) vector for one text. `progress`: anything with `update(n)` (a tqdm bar) to advance by each
        batch's size."""
        return self.encode(texts, show_progress_bar=progress, convert_to_tensor=True)

    @torch.no_grad()
    def embed_m3(
        self,
        texts: Sequence[str] | str,
        outputs: str | Sequence[str] = M3_OUTPUTS,
        progress: Any = None,
        batch_size: int | None = None,
    ) -> dict[str, Any]:
        """BAAI/bge-m3's outputs of `texts` from one encoder pass, as FlagEmbedding's `BGEM3FlagModel.encode(texts,
        return_dense=..., return_sparse=..., return_colbert_vecs=...)` returns them (`hfbert.tools.bge_m3`), under
        its keys: "dense_vecs" a (texts, dimension) float32 tensor (`embed`'s: the folder's sentence-transformers
        pipeline), "lexical_weights" a `{str(token id): weight}` per text, "colbert_vecs" a (tokens - 1, dimension)
        float32 tensor per text; an output not asked for is None. `outputs`: "dense", "sparse", "colbert", as a
        list or comma-separated. Texts are truncated at `max_length`, the folder's (8,192 for bge-m3), where
        FlagEmbedding truncates at 512 by default: give `Embedder(..., max_length=512)` for its numbers on longer
        texts. One text (a str) gives each output of that text alone (a (dimension,) vector, one dict, one tensor),
        as FlagEmbedding does. The sparse and ColBERT layers are read on first use (`m3_heads`). `batch_size` None:
        the embedder's."""
        if isinstance(texts, str):  # one text, not a sequence of one-character texts
            result = self.embed_m3([texts], outputs, progress, batch_size)
            return {key: None if value is None else value[0] for key, value in result.items()}
        names = parse_outputs(outputs)
        prefix = self.pipeline.prompt or ""
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        rows = self._in_order(self._m3_step(names), texts, prefix=prefix, batch_size=batch_size, progress=progress)
        return self._m3_result(names, rows)

    @torch.no_grad()
    def embed_m3_ids(
        self,
        sequences: Sequence[Sequence[int]],
        outputs: str | Sequence[str] = M3_OUTPUTS,
        batch_size: int | None = None,
    ) -> dict[str, Any]:
        """`embed_m3` of already tokenized inputs: each sequence of token ids is the model's input as given (no
        prompt, special token or truncation added), the dense vector pooled over all of them. ValueError as
        `encode_ids`'."""
        names = parse_outputs(outputs)
        batch_size = self.batch_size if batch_size is None else _check_batch_size(batch_size)
        pooling = self.pipeline.modules.pooling
        pooling.prompt_length = 0
        try:
            rows = self._in_order_ids(self._m3_step(names), sequences, batch_size=batch_size)
        finally:
            pooling.prompt_length = self.prompt_length
        return self._m3_result(names, rows)

    def _m3_step(self, names: tuple[str, ...]) -> Any:
        """bge-m3's inference step: each output of `names`, per text."""
        heads = self.m3_heads if {"sparse", "colbert"} & set(names) else None

        def step(batch: Any) -> list[tuple[Any, ...]]:
            hidden, mask = self.model(**batch, return_dict=True).last_hidden_state, batch["attention_mask"]
            columns = {
                "dense": lambda: self.pipeline.modules(hidden, mask).cpu(),
                "sparse": lambda: heads.lexical_weights(hidden, mask, batch["input_ids"]),
                "colbert": lambda: heads.colbert_vectors(hidden, mask),
            }
            return list(zip(*(columns[name]() for name in names), strict=True))

        return step

    def _m3_result(self, names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        result: dict[str, Any] = dict.fromkeys(RESULT_KEYS.values())
        for column, name in enumerate(names):
            result[RESULT_KEYS[name]] = [row[column] for row in rows]
        if "dense" in names:
            dense = result[RESULT_KEYS["dense"]]
            result[RESULT_KEYS["dense"]] = torch.stack(dense) if dense else torch.empty(0, self.dimension)
        return result

    @property
    def m3_heads(self) -> M3Heads:
        """bge-m3's sparse and ColBERT layers of the folder (`hfbert.tools.bge_m3.load_m3_heads`), read once, on first
        use; CheckpointError naming the file when one is missing or holds anything but a Linear's weight and bias."""
        if self._m3_heads is None:
            self._m3_heads = load_m3_heads(
                self.directory, self.model.config.hidden_size, self.tokenizer, self.model.device
            )
        return self._m3_heads


def _check_batch_size(batch_size: int) -> int:
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    return batch_size


def embed_file(
    embedder: Embedder,
    texts: Iterable[str],
    out: str | os.PathLike | None,
    *,
    total: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
) -> int:
    """Embed `texts` (an iterable, read lazily and once) into `out` in input order. `total`: how many texts there
    are, when known (for the progress display and the .npy space reservation; never trusted for the output).
    Returns how many embeddings the output holds."""

    def write(writer: Any, indices: list[int], chunk: list[str], bar: Any) -> None:
        writer.write(indices, embedder.embed(chunk, progress=bar))

    return write_in_input_order(
        texts,
        out,
        output_kind(out),
        embedder.dimension,
        write,
        task="embed",
        chunk_size=chunk_size,
        total=total,
        progress=progress,
        reserve=True,
    )
