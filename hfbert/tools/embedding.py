"""Text embeddings with hfbert, as the checkpoint's sentence-transformers pipeline computes them, streamed: from a
file of any size (or standard input) to a `.npy` or `.jsonl` file, in input order.

    >>> from hfbert.tools.embedding import Embedder
    >>> embedder = Embedder("sentence-transformers/all-MiniLM-L6-v2")  # doctest: +SKIP
    >>> embedder.pipeline.describe()  # doctest: +SKIP
    'sentence-transformers (modules.json): Transformer(max_seq_length=256) -> Pooling(mean) -> Normalize'
    >>> embedder.embed(["A first text.", "Another one."]).shape  # doctest: +SKIP
    torch.Size([2, 384])

What is computed: by default `Embedder` gives what `SentenceTransformer(MODEL).encode(texts)` gives, element for
element: the checkpoint's pipeline as `hfbert.tools.sentence_transformers_pipeline` reads it (mean pooling for a
checkpoint without sentence-transformers files). `pooling`, `normalize`, `max_length`, `prompt` / `prompt_name`
override the checkpoint's choices; `Embedder.pipeline.describe()` says what runs (`hfbert embed` prints it).
tests/test_embed_pipeline.py compares with sentence-transformers' `encode`.
`Embedder.embed_m3` gives BAAI/bge-m3's dense, lexical and ColBERT outputs from the same pass, as FlagEmbedding's
`BGEM3FlagModel.encode` (`hfbert.tools.bge_m3`).

How a large input runs (`embed_file`): the texts (`hfbert.tools.texts.read_texts` reads a file or standard input)
are consumed once, front to back, in chunks of `CHUNK_SIZE`, never whole: a pipe works as well as a file. Each
chunk is sorted by length so that batches hold texts of similar length (little padding), embedded batch by batch,
put back in input order and appended to the output (`hfbert.tools.embedding_output`: `.npy` or `.jsonl`, written
whole or not at all). Under `torchrun` (WORLD_SIZE > 1) each process reads the whole input (a regular file) and
embeds the lines i with i % WORLD_SIZE == RANK into a part file; rank 0 merges the parts in input order into the
same file a single process writes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from converters.dtypes import DTYPES
from hfbert.tools.bge_m3 import OUTPUTS as M3_OUTPUTS
from hfbert.tools.bge_m3 import RESULT_KEYS, M3Heads, load_m3_heads, parse_outputs
from hfbert.tools.embedding_output import output_kind, write_in_input_order
from hfbert.tools.head_checkpoint import resolve_folder
from hfbert.tools.sentence_transformers_modules import POOLINGS, Dense, Normalize, SentenceModules
from hfbert.tools.sentence_transformers_pipeline import checkpoint_prompts, prompt_text, read_pipeline
from hfbert.tools.texts import check_texts, read_texts

CHUNK_SIZE = 10_000
__all__ = ["CHUNK_SIZE", "Embedder", "embed_file", "output_kind", "read_texts"]


class Embedder:
    """A checkpoint's encoder, tokenizer and sentence-transformers pipeline, turning lists of texts into
    (texts, dimension) float32 embeddings. `pooling`, `normalize`, `max_length`, `prompt` / `prompt_name`: None
    keeps the checkpoint's choice (see the module docstring). `revision`, `cache_dir`, `token`: for a Hub repo id.
    `quantize="int8"`: int8 weights and activations (faster, lossy: `hfbert/inference/int8.py`).
    `precision="bf16"`: the encoder's products in bf16, the rest in fp32, on CPUs that compute bf16 natively (faster,
    lossy: `hfbert/inference/bf16.py`); "high": the fast fp32 mode (`hfbert/inference/fused.py`).
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
        precision: str = "highest",
        prompt: str | None = None,
        prompt_name: str | None = None,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        ignore_auto_map: bool = False,
    ) -> None:
        from hfbert.inference import optimize_for_inference
        from hfbert.modeling.auto import AutoModel
        from hfbert.modeling.tokenizer import AutoTokenizer

        modes = None if pooling is None else (pooling,) if isinstance(pooling, str) else tuple(pooling)
        if modes is not None and (not modes or any(mode not in POOLINGS for mode in modes)):
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)} (or a list of them), not {pooling!r}")
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        if prompt is not None and prompt_name is not None:
            raise ValueError("give a prompt or a prompt name, not both")
        self.directory = directory = resolve_folder(model_path, revision, cache_dir, token)
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModel.from_pretrained(  # the family's encoder: BertModel, XLMRobertaModel, ...
            directory,
            device=device,
            dtype=DTYPES[dtype] if isinstance(dtype, str) else dtype,
            add_pooling_layer=False,
            ignore_auto_map=ignore_auto_map,
        )
        # Inference only, so the weights are packed (fp32: the same numbers as unpacked, within hfbert's contract;
        # a no-op off x86 CPUs) or, when asked, quantized to int8 or run in bf16.
        optimize_for_inference(self.model, quantize=quantize, precision=precision)
        config = self.model.config
        limit = config.max_sequence_length  # RoBERTa's: max_position_embeddings - pad_token_id - 1
        self.pipeline = read_pipeline(directory, config.hidden_size, limit, self.tokenizer.model_max_length)
        if self.pipeline.do_lower_case:  # inside the tokenizer, after special tokens, as sentence-transformers 6
            self.tokenizer.lowercase_first()
        self._override(modes, normalize, max_length, limit, prompt, prompt_name, directory)
        self.batch_size = batch_size
        self.max_length = self.pipeline.max_length
        self.prompt_length = self.pipeline.modules.pooling.prompt_length = self._prompt_length()
        self.dimension = self.pipeline.modules.dimension
        self.pipeline.modules.to(self.model.device)
        self._m3_heads: M3Heads | None = None

    def _override(self, modes, normalize, max_length, limit, prompt, prompt_name, directory) -> None:
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
        if prompt_name is not None:
            prompts = pipeline.prompts if pipeline.prompts is not None else checkpoint_prompts(directory)[0]
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

    @property
    def pooling(self) -> tuple[str, ...]:
        return self.pipeline.pooling

    @property
    def normalize(self) -> bool:
        return self.pipeline.normalize

    @torch.no_grad()
    def embed(self, texts: Sequence[str] | str, progress: Any = None) -> Tensor:
        """Embeddings of `texts`, in their order: a (texts, dimension) float32 tensor; one text (a str) gives one
        (dimension,) vector, as sentence-transformers' `encode`. Longest texts are batched together first, as
        sentence-transformers does. `progress`: anything with `update(n)` (a tqdm bar) to advance by each batch's
        size."""
        if isinstance(texts, str):  # one text, not a sequence of one-character texts
            return self.embed([texts], progress)[0]
        result = torch.empty(len(texts), self.dimension, dtype=torch.float32)
        for indices, batch, hidden in self._encoded(texts, progress):
            result[indices] = self.pipeline.modules(hidden, batch["attention_mask"]).cpu()
        return result

    @torch.no_grad()
    def embed_m3(
        self, texts: Sequence[str] | str, outputs: str | Sequence[str] = M3_OUTPUTS, progress: Any = None
    ) -> dict[str, Any]:
        """BAAI/bge-m3's outputs of `texts` from one encoder pass, as FlagEmbedding's `BGEM3FlagModel.encode(texts,
        return_dense=..., return_sparse=..., return_colbert_vecs=...)` returns them (`hfbert.tools.bge_m3`), under
        its keys: "dense_vecs" a (texts, dimension) float32 tensor (`embed`'s: the folder's sentence-transformers
        pipeline), "lexical_weights" a `{str(token id): weight}` per text, "colbert_vecs" a (tokens - 1, dimension)
        float32 tensor per text; an output not asked for is None. `outputs`: "dense", "sparse", "colbert", as a
        list or comma-separated. Texts are truncated at `max_length`, the folder's (8,192 for bge-m3), where
        FlagEmbedding truncates at 512 by default: give `Embedder(..., max_length=512)` for its numbers on longer
        texts. One text (a str) gives each output of that text alone (a (dimension,) vector, one dict, one tensor),
        as FlagEmbedding does. The sparse and ColBERT layers are read on first use (`m3_heads`)."""
        if isinstance(texts, str):  # one text, not a sequence of one-character texts
            result = self.embed_m3([texts], outputs, progress)
            return {key: None if value is None else value[0] for key, value in result.items()}
        names = parse_outputs(outputs)
        heads = self.m3_heads if {"sparse", "colbert"} & set(names) else None
        result: dict[str, Any] = dict.fromkeys(RESULT_KEYS.values())
        dense = torch.empty(len(texts), self.dimension, dtype=torch.float32) if "dense" in names else None
        sparse: list[Any] = [None] * len(texts)
        colbert: list[Any] = [None] * len(texts)
        for indices, batch, hidden in self._encoded(texts, progress):
            mask = batch["attention_mask"]
            if dense is not None:
                dense[indices] = self.pipeline.modules(hidden, mask).cpu()
            if "sparse" in names:
                for index, weights in zip(
                    indices, heads.lexical_weights(hidden, mask, batch["input_ids"]), strict=True
                ):
                    sparse[index] = weights
            if "colbert" in names:
                for index, vectors in zip(indices, heads.colbert_vectors(hidden, mask), strict=True):
                    colbert[index] = vectors
        result[RESULT_KEYS["dense"]] = dense
        if "sparse" in names:
            result[RESULT_KEYS["sparse"]] = sparse
        if "colbert" in names:
            result[RESULT_KEYS["colbert"]] = colbert
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

    def _encoded(self, texts: Sequence[str], progress: Any) -> Iterator[tuple[list[int], Any, Tensor]]:
        """(indices into `texts`, their tokenized batch, the encoder's last hidden states), batch by batch, longest
        texts first."""
        check_texts(texts)  # each named by its place in `texts`, not in a length-sorted batch (once: `CheckedTexts`)
        order = sorted(range(len(texts)), key=lambda index: -len(texts[index]))
        prompt = self.pipeline.prompt or ""
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            batch = self.tokenizer(
                [prompt + texts[index] for index in indices],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_attention_mask=True,  # pooling needs it, even where model_input_names leaves it out
                return_tensors="pt",
            ).to(self.model.device)
            yield indices, batch, self.model(**batch, return_dict=True).last_hidden_state
            if progress is not None:
                progress.update(len(indices))


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
