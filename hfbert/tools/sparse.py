"""Sparse lexical vectors (SPLADE): `SparseEncoder(MODEL).encode(texts)` returns what sentence-transformers'
`SparseEncoder.encode` returns on the same folder (a sparse COO tensor of (texts, vocabulary) by default), weights
equal within fp32 rounding with the same nonzero set; `hfbert embed MODEL --sparse --out F.jsonl` writes each text's
nonzero `{token: weight}` pairs, in input order.

    >>> from hfbert import SparseEncoder
    >>> encoder = SparseEncoder("naver/splade-v3")  # doctest: +SKIP
    >>> encoder.encode(["The weather is lovely today."]).shape  # doctest: +SKIP
    torch.Size([1, 30522])

The folders it reads (`hfbert.tools.head_checkpoint`): modules.json with `MLMTransformer` (as
`sentence_transformers.sparse_encoder.modules.*`, or the older `sentence_transformers.sparse_encoder.models.*`) or a
`Transformer` of task `fill-mask`, then `SpladePooling` (its config.json: `pooling_strategy` max or sum,
`activation_function` relu or log1p_relu); a folder without modules.json whose config.json names a `...ForMaskedLM`
gets sentence-transformers' default, max pooling of relu. `max_active_dims` (config_sentence_transformers.json or the
argument) keeps each vector's largest weights, and prompts apply as in `encode`. Other modules (SparseStaticEmbedding,
SparseAutoEncoder, Router) are refused by name.

What is computed, per text: w[v] = pool over its tokens t of log1p(relu(logit[t, v])) (log1p twice for
log1p_relu), pool the max or the sum, logit the masked-LM head's output. sentence-transformers multiplies every
position's logits by the attention mask first, so a pad position gives log1p(relu(0)) = 0, which changes neither the
max (every weight is >= 0) nor the sum: pooling over the real tokens only is the same vector. So the encoder runs
padding-free and the vocabulary projection runs on real tokens only, `VOCABULARY_CHUNK` logits at a time
(`VOCABULARY_CHUNK // vocabulary` tokens: 549 for BERT's 30,522 pieces, 67 for XLM-R's 250,002), pooled into the
(batch, vocabulary) result as each chunk is done: batch x length x vocabulary is never held at once. Sums are
accumulated in float64, so the only rounding left is fp32's in each logit.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from converters.json_files import read_json_object
from hfbert.tools.head_checkpoint import FolderSettings, input_length, prompt_of, read_folder_settings
from hfbert.tools.retrieval import LoadOptions, QueryDocumentPrompts, RetrievalEncoder, progress_bar
from hfbert.tools.texts import is_checked

VOCABULARY_CHUNK = 1 << 24  # logits computed at once: 16 Mi floats, 64 MiB in fp32
CHUNK_SIZE = 10_000  # texts read, sorted by length and encoded at once by `sparse_file`
POOLING_STRATEGIES = ("max", "sum")
ACTIVATION_FUNCTIONS = ("relu", "log1p_relu")
_TRANSFORMERS = ("MLMTransformer", "Transformer")
__all__ = ["CHUNK_SIZE", "VOCABULARY_CHUNK", "SparseEncoder", "sparse_file"]


class SparseEncoder(QueryDocumentPrompts, RetrievalEncoder):
    """A SPLADE checkpoint (a local folder or Hub repo id with a masked-LM head) giving sparse vectors over its
    vocabulary as sentence-transformers' `SparseEncoder` does (see the module docstring). `max_active_dims`: keep
    each vector's largest weights (default: the folder's, else all). The load options
    (`hfbert.tools.retrieval.LoadOptions`, as keywords or one `options`): `max_length` tokens per text (default: the
    folder's); `quantize="int8"` the encoder in int8 weights and activations (faster, lossy:
    `hfbert/inference/int8.py`; the vocabulary projection, tied to the word embeddings, too: `SPARSE_BOUNDS`);
    `precision="bf16"` the encoder's products in bf16, on CPUs that compute it natively (`hfbert/inference/bf16.py`;
    the vocabulary projection too); `device`, `dtype`, `revision`, `cache_dir`, `token`, `ignore_auto_map`."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        max_active_dims: int | None = None,
        options: LoadOptions | None = None,
        **load_options: Any,
    ) -> None:
        super().__init__(model_path, LoadOptions.of(options, load_options))
        directory = self.directory
        self.settings = settings = read_folder_settings(directory, "SparseEncoder")
        self.prompts = settings.prompts
        self.pooling_strategy, self.activation_function, self.source = splade_modules(directory, settings)
        self._load_model("masked-lm")
        self._load_tokenizer()
        self._lowercase(settings.do_lower_case)
        limit = self.model.config.max_sequence_length
        self.max_length = input_length(settings, self.tokenizer, limit, self.options.max_length)
        if max_active_dims is None:
            max_active_dims = settings.model_config.get("max_active_dims")
        self.max_active_dims = _checked_max_active_dims(max_active_dims, directory)
        self.dimension: int = self.model.config.vocab_size
        self._tokens: list[str] | None = None

    def describe(self) -> str:
        """One line: where the modules came from, and what they compute."""
        activation = "log1p(log1p(relu))" if self.activation_function == "log1p_relu" else "log1p(relu)"
        active = f", max_active_dims {self.max_active_dims}" if self.max_active_dims else ""
        return (
            f"{self.source}: {type(self.model).__name__}(max_length={self.max_length}) -> "
            f"SpladePooling({self.pooling_strategy} of {activation}){active}"
        )

    @torch.no_grad()
    def encode(
        self,
        inputs: Sequence[str] | str,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        convert_to_tensor: bool = True,
        convert_to_sparse_tensor: bool = True,
        save_to_cpu: bool = False,
        max_active_dims: int | None = None,
    ) -> Tensor | list[Tensor]:
        """Sparse vectors of `inputs` (texts, or one text), as sentence-transformers' `SparseEncoder.encode`: one
        sparse COO float32 tensor of (texts, vocabulary) by default; dense with `convert_to_sparse_tensor=False`; a
        list of one tensor per text with `convert_to_tensor=False`; one text gives one (vocabulary,) vector.
        `save_to_cpu`: on the CPU whatever the model's device; `max_active_dims` None: the encoder's."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        single = isinstance(inputs, str)
        texts = [inputs] if single else list(inputs)
        active = self.max_active_dims if max_active_dims is None else _checked_max_active_dims(max_active_dims)
        prefix = prompt_of(self.settings, self.directory, prompt, prompt_name)
        with progress_bar(show_progress_bar, len(texts), "sparse", "text") as bar:
            rows = self._in_order(
                self._step(active, convert_to_sparse_tensor, save_to_cpu),
                texts,
                prefix=prefix,
                batch_size=batch_size,
                progress=bar,
            )
        result = self._stacked(rows, convert_to_tensor, convert_to_sparse_tensor, save_to_cpu)
        return result[0] if single else result

    @torch.no_grad()
    def encode_ids(
        self,
        sequences: Sequence[Sequence[int]],
        batch_size: int = 32,
        convert_to_tensor: bool = True,
        convert_to_sparse_tensor: bool = True,
        save_to_cpu: bool = False,
        max_active_dims: int | None = None,
    ) -> Tensor | list[Tensor]:
        """`encode` of already tokenized inputs: each sequence of token ids is the model's input as given (no
        prompt, special token or truncation added; what the tokenizer gives for a text computes what the text
        computes). Outputs as `encode`'s. ValueError naming a sequence that is empty, longer than `max_length`, or
        holds an id outside the vocabulary."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        active = self.max_active_dims if max_active_dims is None else _checked_max_active_dims(max_active_dims)
        step = self._step(active, convert_to_sparse_tensor, save_to_cpu)
        rows = self._in_order_ids(step, sequences, batch_size=batch_size)
        return self._stacked(rows, convert_to_tensor, convert_to_sparse_tensor, save_to_cpu)

    def _step(self, active: int | None, sparse: bool, save_to_cpu: bool) -> Any:
        def step(batch: Any) -> Tensor:
            vectors = self._vectors(batch, active)
            if sparse:
                vectors = vectors.to_sparse()
            return vectors.cpu() if save_to_cpu else vectors

        return step

    def _stacked(self, rows: list[Tensor], convert_to_tensor: bool, sparse: bool, save_to_cpu: bool) -> Any:
        if not convert_to_tensor:
            return rows
        if rows:
            return torch.stack(rows)
        result = torch.tensor([], device="cpu" if save_to_cpu else self.device)
        return result.to_sparse() if sparse else result

    @torch.no_grad()
    def token_weights(
        self,
        texts: Sequence[str] | str,
        batch_size: int = 32,
        prompt: str | None = None,
        prompt_name: str | None = None,
        progress: Any = None,
    ) -> list[dict[str, float]] | dict[str, float]:
        """Each text's nonzero weights by token, `{token: weight}` with the vocabulary's token strings (an id the
        tokenizer has no token for is named "[id:N]"), largest first, in the order of `texts`; one text (a str) gives
        its one dict, as `encode` gives one vector. `progress`: anything with `update(n)`."""
        if isinstance(texts, str):  # one text, not a sequence of one-character texts
            return self.token_weights([texts], batch_size, prompt, prompt_name, progress)[0]
        tokens = self.tokens()
        prefix = prompt_of(self.settings, self.directory, prompt, prompt_name)
        texts = texts if is_checked(texts) else list(texts)

        def step(batch: Any) -> list[dict[str, float]]:
            weights = []
            for vector in self._vectors(batch, self.max_active_dims).cpu():
                ids = vector.nonzero().flatten()
                ranked = sorted(
                    zip(ids.tolist(), vector[ids].tolist(), strict=True), key=lambda item: (-item[1], item[0])
                )
                weights.append({tokens[i]: weight for i, weight in ranked})
            return weights

        return self._in_order(step, texts, prefix=prefix, batch_size=batch_size, progress=progress)

    @staticmethod
    def nonzero(vectors: Tensor | Sequence[Tensor]) -> list[tuple[numpy.ndarray, numpy.ndarray]]:
        """Each vector's nonzero weights as arrays: (token ids, int64 ascending; their weights, float32), one pair
        per vector of `encode`'s or `encode_ids`' output (sparse or dense, one (texts, vocabulary) tensor, a list of
        (vocabulary,) tensors, or one vector), on the CPU."""
        if isinstance(vectors, Tensor):
            vectors = [vectors] if vectors.dim() == 1 else [vectors[index] for index in range(len(vectors))]
        arrays = []
        for vector in vectors:
            if vector.is_sparse:
                vector = vector.coalesce()  # sorted indices, duplicates summed
                ids, weights = vector.indices()[0], vector.values()
                kept = weights != 0
                ids, weights = ids[kept], weights[kept]
            else:
                ids = vector.nonzero().flatten()
                weights = vector[ids]
            arrays.append((ids.cpu().numpy().astype(numpy.int64), weights.float().cpu().numpy()))
        return arrays

    def tokens(self) -> list[str]:
        """The token string of every vocabulary id (the model's vocabulary: "[id:N]" where the tokenizer has none)."""
        if self._tokens is None:
            names = [f"[id:{i}]" for i in range(self.dimension)]
            for token, index in self.tokenizer.get_vocab().items():
                if 0 <= index < self.dimension:
                    names[index] = token
            self._tokens = names
        return self._tokens

    def _vectors(self, batch: Any, max_active_dims: int | None) -> Tensor:
        """The inference step: a tokenized batch's (batch, vocabulary) float32 vectors."""
        hidden = self.model.backbone(**batch, return_dict=True).last_hidden_state
        vectors = self._pool(hidden, batch["attention_mask"])
        return vectors if max_active_dims is None else _largest(vectors, max_active_dims)

    def _pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """(batch, vocabulary) SPLADE weights of the real tokens of `hidden` (see the module docstring)."""
        real = attention_mask.bool()
        owner = torch.arange(len(hidden), device=hidden.device).unsqueeze(1).expand_as(real)[real]
        tokens = hidden[real]
        accumulate = torch.float32 if self.pooling_strategy == "max" else torch.float64
        pooled = torch.zeros(len(hidden), self.dimension, dtype=accumulate, device=hidden.device)
        head = self.model.prediction_head
        step = max(1, VOCABULARY_CHUNK // self.dimension)
        for start in range(0, len(tokens), step):
            weights = head(tokens[start : start + step]).float().relu_().log1p_()
            if self.activation_function == "log1p_relu":
                weights = weights.log1p_()
            rows = owner[start : start + step]
            if self.pooling_strategy == "max":  # every weight >= 0: the zeros pooled starts from change nothing
                pooled.scatter_reduce_(0, rows.unsqueeze(1).expand_as(weights), weights, "amax")
            else:
                pooled.index_add_(0, rows, weights.to(accumulate))
        return pooled.float()


def _largest(vectors: Tensor, count: int) -> Tensor:
    """Each row's `count` largest weights by magnitude, the rest zero (sentence-transformers'
    `select_max_active_dims`)."""
    _, top = torch.topk(vectors.abs(), k=min(count, vectors.shape[-1]), dim=-1)
    return torch.zeros_like(vectors).scatter_(-1, top, vectors.gather(-1, top))


def _checked_max_active_dims(value: Any, directory: Path | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        where = f"{directory / 'config_sentence_transformers.json'}: " if directory is not None else ""
        raise ValueError(f"{where}max_active_dims must be a positive integer, got {value!r}")
    return value


def splade_modules(directory: Path, settings: FolderSettings) -> tuple[str, str, str]:
    """(pooling_strategy, activation_function, where they come from) of a SPLADE folder; ValueError naming the file
    for any other sparse model (see the module docstring)."""
    config_file = directory / "config.json"
    if settings.modules is None:
        modules_file = directory / "modules.json"
        if modules_file.is_file():
            kind = read_json_object(directory / "config_sentence_transformers.json", missing_ok=True).get(
                "model_type", "SentenceTransformer"
            )
            raise ValueError(
                f"{modules_file}: the modules of a {kind}, not of a SparseEncoder (config_sentence_transformers.json's "
                f"model_type); hfbert's SparseEncoder runs SPLADE folders (a masked-LM head and SpladePooling)"
            )
        architectures = read_json_object(config_file).get("architectures") or []
        if not any(isinstance(name, str) and name.endswith("ForMaskedLM") for name in architectures):
            raise ValueError(
                f"{config_file}: architectures {architectures!r} name no ...ForMaskedLM: a sparse encoder needs a "
                f"masked-LM head (sentence-transformers would build a CSR model on this one, which hfbert does not run)"
            )
        return "max", "relu", "no SparseEncoder modules.json (masked LM: SpladePooling max, as SparseEncoder does)"
    names = [module.name for module in settings.modules]
    modules_file = directory / "modules.json"
    if len(names) != 2 or names[0] not in _TRANSFORMERS or names[1] != "SpladePooling":
        raise ValueError(
            f"{modules_file}: modules {', '.join(module.type for module in settings.modules)}; hfbert's SparseEncoder "
            f"runs SPLADE: MLMTransformer (or a fill-mask Transformer) then SpladePooling"
        )
    if settings.modules[0].folder != directory:
        raise ValueError(f"{modules_file}: the {names[0]} module must be at the folder's root")
    task = settings.transformer.get("transformer_task", "fill-mask" if names[0] == "MLMTransformer" else None)
    if task != "fill-mask":
        raise ValueError(
            f"{directory / 'sentence_bert_config.json'}: transformer_task {task!r}; SPLADE pools the masked-LM "
            f"logits (fill-mask)"
        )
    pooling_file = settings.modules[1].folder / "config.json"
    if (
        not pooling_file.is_file()
    ):  # sentence-transformers would silently pool the max, whatever the model was trained with
        raise ValueError(
            f"{pooling_file}: missing; modules.json lists a SpladePooling module here, which needs its config"
        )
    pooling = read_json_object(pooling_file)
    strategy = pooling.get("pooling_strategy", "max")
    activation = pooling.get("activation_function", "relu")
    if strategy not in POOLING_STRATEGIES:
        raise ValueError(
            f"{pooling_file}: pooling_strategy {strategy!r}; expected one of {', '.join(POOLING_STRATEGIES)}"
        )
    if activation not in ACTIVATION_FUNCTIONS:
        raise ValueError(
            f"{pooling_file}: activation_function {activation!r}; expected one of {', '.join(ACTIVATION_FUNCTIONS)}"
        )
    return strategy, activation, "sentence-transformers SparseEncoder (modules.json)"


def sparse_file(
    encoder: SparseEncoder,
    texts: Iterable[str],
    out: str | os.PathLike | None,
    *,
    batch_size: int = 32,
    prompt: str | None = None,
    prompt_name: str | None = None,
    total: int | None = None,
    chunk_size: int = CHUNK_SIZE,
    progress: bool = True,
) -> int:
    """Write each text's `{"index": i, "embedding": {token: weight}}` (`SparseEncoder.token_weights`) as one JSON
    line into `out` (None: stdout), in input order, as `hfbert embed` writes (`hfbert.tools.embedding_output`: whole
    or not at all). `texts` is read lazily and once, in chunks of `chunk_size`. Returns how many lines the output
    holds."""
    from hfbert.tools.embedding_output import output_kind, write_in_input_order, write_json_line

    if output_kind(out) != ".jsonl":
        raise ValueError(f"{out}: sparse vectors are written as JSON lines ({{token: weight}} per text): use .jsonl")

    def write(writer: Any, indices: list[int], chunk: list[str], bar: Any) -> None:
        weights = encoder.token_weights(chunk, batch_size, prompt, prompt_name, bar)
        for index, vector in zip(indices, weights, strict=True):
            write_json_line(writer, {"index": index, "embedding": vector})

    return write_in_input_order(
        texts,
        out,
        ".jsonl",
        encoder.dimension,
        write,
        task="sparse",
        chunk_size=chunk_size,
        total=total,
        progress=progress,
    )
