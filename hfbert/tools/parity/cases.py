"""The inputs of a parity run: the shipped battery of sentences (or your own), tokenized into five cases."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from torch import Tensor

from hfbert.tools import texts as text_files


def default_texts() -> list[str]:
    """The shipped battery: about 40 varied real English sentences."""
    text = resources.files("hfbert").joinpath("data", "parity_sentences.txt").read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


def read_texts(path: str | os.PathLike) -> list[str]:
    """The texts of a file as `hfbert embed` reads them (`hfbert.tools.texts.read_texts`: one per line, or JSONL;
    `-`: standard input), blank ones left out; ValueError for a file with none."""
    texts = list(text_files.read_texts(path, skip_blank=True))
    if not texts:
        raise ValueError(f"{text_files.display_name(path)}: no text in the file (expected one text per line)")
    return texts


@dataclass
class Case:
    name: str
    batches: list[dict[str, Tensor]]  # forward keyword arguments, one dict per batch

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "batches": len(self.batches),
            "sequences": sum(len(batch["input_ids"]) for batch in self.batches),
            "real_tokens": sum(int(batch["attention_mask"].sum()) for batch in self.batches),
            "longest": max(batch["input_ids"].shape[1] for batch in self.batches),
        }


def build_cases(tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int, segments: int) -> list[Case]:
    """The battery described in the module docstring, as forward keyword arguments."""
    if not texts:
        raise ValueError("no texts to run")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")

    def encode(first: list[str], second: list[str] | None = None, **options: Any) -> dict[str, Tensor]:
        return dict(tokenizer(first, second, truncation=True, max_length=max_length, return_tensors="pt", **options))

    def chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
        for start in range(0, len(items), batch_size):
            yield list(items[start : start + batch_size])

    cases = [Case("single", [encode([text]) for text in texts])]
    if segments >= 2 and len(texts) >= 2:
        pairs = list(zip(texts[0::2], texts[1::2], strict=False))  # an odd last text has no partner
        batches = [encode([a for a, _ in chunk], [b for _, b in chunk], padding=True) for chunk in chunks(pairs)]
        cases.append(Case("pairs", batches))
    cases.append(Case("right padding", [encode(chunk, padding=True) for chunk in chunks(texts)]))
    left = [encode(chunk, padding=True, padding_side="left") for chunk in chunks(texts)]
    for batch in left:
        batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    cases.append(Case("left padding", left))
    # Repeat the texts until they are longer than the model's maximum length, then truncate to exactly it.
    words = len(tokenizer(" ".join(texts))["input_ids"])
    long_text = " ".join(list(texts) * (max_length // max(1, words - 2) + 1))
    longest = encode([long_text])
    if longest["input_ids"].shape[1] == max_length:
        cases.append(Case("max length", [longest]))
    return cases
