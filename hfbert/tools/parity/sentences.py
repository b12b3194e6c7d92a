"""Sentence embeddings of a parity run: the checkpoint's sentence-transformers pipeline (modules.json: pooling,
Dense, Normalize; hfbert.tools.sentence_transformers_pipeline) applied to each engine's token outputs, compared
with the same pipeline on the float64 model's, as users decide on them: the min and mean cosine of each text's
embedding to float64's, and retrieval agreement (the overlap of each text's top-k neighbours among the texts with
float64's, averaged over the texts)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from hfbert.tools.sentence_transformers_pipeline import Pipeline

RETRIEVAL_K = 5
CASE = "right padding"  # every text once, in order, batched as an embedding service batches them


def read_sentence_pipeline(directory: Path, config: Any, tokenizer_max_length: int) -> Pipeline | None:
    """The checkpoint's sentence-transformers pipeline, or None when it has no modules.json, or one that
    config_sentence_transformers.json says another class wrote (a CrossEncoder's classifier, a SparseEncoder's
    masked LM): then there are no sentence embeddings to judge."""
    from converters.json_files import read_json_object
    from hfbert.tools.sentence_transformers_pipeline import PROMPTS_FILE, read_pipeline

    if not (Path(directory) / "modules.json").is_file():
        return None
    # As sentence-transformers: a folder without a model_type was written by SentenceTransformer.
    settings = read_json_object(Path(directory) / PROMPTS_FILE, missing_ok=True)
    if settings.get("model_type", "SentenceTransformer") != "SentenceTransformer":
        return None

    return read_pipeline(Path(directory), config.hidden_size, config.max_position_embeddings, tokenizer_max_length)


def embed(pipeline: Pipeline, tokens: Tensor, mask: Tensor) -> Tensor:
    """`pipeline`'s modules after the encoder on (batch, sequence, hidden) token outputs, in their dtype (float64
    stays float64: a copy of the modules is cast to it)."""
    modules = pipeline.modules
    if modules.dtype != tokens.dtype:
        modules = copy.deepcopy(modules).to(tokens.dtype)
    return modules(tokens, mask)


@dataclass
class SentenceStats:
    """One engine's sentence embeddings of the texts against float64's."""

    ours: list[Tensor] = field(default_factory=list)
    exact: list[Tensor] = field(default_factory=list)

    def add(self, ours: Tensor, exact: Tensor) -> None:
        self.ours.append(ours.double().cpu())
        self.exact.append(exact.double().cpu())

    def numbers(self, k: int = RETRIEVAL_K) -> dict[str, float]:
        if not self.ours:
            return {}
        ours, exact = torch.cat(self.ours), torch.cat(self.exact)
        cosines = F.cosine_similarity(ours, exact, dim=1, eps=1e-300)
        numbers = {"min_cosine": float(cosines.min()), "mean_cosine": float(cosines.mean()), "texts": len(ours)}
        k = min(k, len(ours) - 1)
        if k >= 1:
            numbers["retrieval_k"] = k
            numbers["retrieval_agreement"] = _agreement(ours, exact, k)
        return numbers


def _agreement(ours: Tensor, exact: Tensor, k: int) -> float:
    """Mean over texts of |top-k neighbours by ours ∩ top-k by exact| / k (cosine similarity, the text itself left
    out)."""

    def neighbours(vectors: Tensor) -> Tensor:
        unit = F.normalize(vectors, dim=1)
        similarity = unit @ unit.T
        similarity.fill_diagonal_(-torch.inf)
        return similarity.topk(k, dim=1).indices

    a, b = neighbours(ours), neighbours(exact)
    overlap = [len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b, strict=True)]
    return sum(overlap) / (k * len(overlap))
