"""The inputs of a parity run: the shipped battery of sentences (or your own), tokenized into five cases."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
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


PADDING = "padding"  # a batch with pad tokens: what "right padding" and "left padding" are there to test
SEGMENTS = "rows whose token types differ"  # two rows of one batch with other segments at the same real positions


def has_padding(batch: dict[str, Tensor]) -> bool:
    return bool((batch["attention_mask"] == 0).any())


def has_distinct_segments(batch: dict[str, Tensor]) -> bool:
    """Two rows whose token types differ at a position real in both: an engine that mixes up the rows' token types
    (gives every row the first one's, say) then changes what a real token computes."""
    types, real = batch["token_type_ids"], batch["attention_mask"].bool()
    return bool(((types[:, None] != types[None]) & real[:, None] & real[None]).any())


HOLDS = {PADDING: has_padding, SEGMENTS: has_distinct_segments}
LEFT_PADDING = "left padding"  # the case whose batches carry position_ids
NO_TOKEN_TYPES = (
    "distinct segments not exercised: this tokenizer gives no token_type_ids, so every pair runs as segment 0, "
    "as it does wherever this tokenizer feeds the model"
)
Made = tuple[dict[str, Tensor], str]  # a batch made to hold what a case requires, and how it was made


@dataclass
class Case:
    name: str
    batches: list[dict[str, Tensor]]  # forward keyword arguments, one dict per batch
    requires: str = ""  # what some batch must hold for the case to test what it is named after (a key of HOLDS)
    note: str = ""  # how the batches were made to hold it, or why they could not
    added: int = 0  # the last `added` batches were made to hold `requires`: not the texts once each

    @property
    def exercised(self) -> bool:
        """Whether some batch holds what the case requires (a case that requires nothing always is)."""
        return not self.requires or any(HOLDS[self.requires](batch) for batch in self.batches)

    def describe(self) -> dict[str, Any]:
        described = {
            "name": self.name,
            "batches": len(self.batches),
            "sequences": sum(len(batch["input_ids"]) for batch in self.batches),
            "real_tokens": sum(int(batch["attention_mask"].sum()) for batch in self.batches),
            "longest": max((batch["input_ids"].shape[1] for batch in self.batches), default=0),
        }
        if self.requires:
            described.update(requires=self.requires, exercised=self.exercised, added_batches=self.added)
        if self.requires or self.note:
            described["note"] = self.note
        return described


def _stack(rows: list[dict[str, Tensor]], pad_id: int, side: str) -> dict[str, Tensor]:
    """One-row encodings as one batch, padded to the longest as the tokenizer pads (pad id, token type 0, mask 0)."""
    width = max(row["input_ids"].shape[1] for row in rows)

    def padded(row: dict[str, Tensor], key: str) -> Tensor:
        value = row[key]
        pad = value.new_full((1, width - value.shape[1]), pad_id if key == "input_ids" else 0)
        return torch.cat([value, pad] if side == "right" else [pad, value], dim=1)

    return {key: torch.cat([padded(row, key) for row in rows]) for key in rows[0]}


def with_left_positions(batch: dict[str, Tensor], first_position: int = 0) -> dict[str, Tensor]:
    """A left-padded batch with the positions its model gives right padding: real tokens from `first_position`
    (0; RoBERTa's pad_token_id + 1), pads at the position before it (RoBERTa's pad_token_id; 0 for BERT)."""
    positions = batch["attention_mask"].cumsum(-1) - 1 + first_position
    return {**batch, "position_ids": positions.clamp(min=max(first_position - 1, 0))}


def build_cases(
    tokenizer: Any, texts: Sequence[str], batch_size: int, max_length: int, segments: int, first_position: int = 0
) -> list[Case]:
    """The battery described in the module docstring, as forward keyword arguments. `segments`: the model's token
    types (with one, pairs run only where the tokenizer gives no token types, as RoBERTa's, whose pairs are told
    apart by separators alone; with none, as MPNet's or DeBERTa's, they run whatever the tokenizer gives, the model
    ignoring any types; they need not hold rows whose token types differ; nor do they with two where the tokenizer
    gives none, as XLM-R's: `Case.note` says so);
    `first_position`: the position of a row's first token (RoBERTa's pad_token_id + 1, MPNet's 2).

    The padded cases hold padding, and "pairs" two rows whose token types differ, whatever the batch size and the
    texts: where no batch of `batch_size` texts holds it (one text per batch, texts of one length), one batch is
    added that does (`Case.added`, `Case.note`): the longest text beside the shortest or, every text of one
    length, beside itself cut by a token; for pairs, the longest text paired with itself at two lengths. Where even
    that cannot hold it (no text has a token between [CLS] and [SEP]), `Case.exercised` is False, and the run's
    verdict cannot be "pass"."""
    if not texts:
        raise ValueError("no texts to run")
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")

    def encode(first: list[str], second: list[str] | None = None, **options: Any) -> dict[str, Tensor]:
        options.setdefault("max_length", max_length)
        if options.get("padding"):  # the case names its side; a tokenizer_config.json may say "left"
            options.setdefault("padding_side", "right")
        return dict(tokenizer(first, second, truncation=True, return_tensors="pt", **options))

    def chunks(items: Sequence[Any]) -> Iterator[list[Any]]:
        for start in range(0, len(items), batch_size):
            yield list(items[start : start + batch_size])

    def completed(name: str, batches: list[dict[str, Tensor]], requires: str, made: Callable[[], Made]) -> Case:
        case = Case(name, batches, requires)
        if case.exercised:
            return case
        held = f"no batch of at most {batch_size} sequence{'s' if batch_size > 1 else ''} held {requires}"
        if length <= 2:  # every text is [CLS] [SEP] alone: nothing to pad beside it, nothing to cut
            case.note = f"not exercised: {held}, and the texts cannot give one (each is [CLS] [SEP] alone)"
            return case
        batch, how = made()
        case.batches, case.added, case.note = [*batches, batch], 1, f"{held}: a batch added, {how}"
        return case

    singles = [encode([text]) for text in texts]
    lengths = [batch["input_ids"].shape[1] for batch in singles]
    index = max(range(len(texts)), key=lengths.__getitem__)
    text, length, shortest = texts[index], lengths[index], min(range(len(texts)), key=lengths.__getitem__)

    def padded(side: str) -> Made:
        if lengths[shortest] < length:
            rows, how = [singles[index], singles[shortest]], "the longest text beside the shortest"
        else:  # every text of one length: the longest cut by a token is a text the tokenizer could give
            rows = [singles[index], encode([text], max_length=length - 1)]
            how = f"the longest text beside itself cut by a token (every text is {length} tokens)"
        batch = _stack(rows, tokenizer.pad_token_id, side)
        return (with_left_positions(batch, first_position) if side == "left" else batch), how

    def pairs_of_two_lengths() -> Made:
        # Cut by two tokens, a pair cut longest first loses one from each segment: the first segments differ.
        whole = min(encode([text], [text], max_length=None)["input_ids"].shape[1], max_length)
        rows = [encode([text], [text], max_length=whole - cut) for cut in (0, 2)]
        return _stack(rows, tokenizer.pad_token_id, "right"), "the longest text paired with itself, at two lengths"

    cases = [Case("single", singles)]
    pairs = list(zip(texts[0::2], texts[1::2], strict=False))  # an odd last text has no partner
    batches = [encode([a for a, _ in chunk], [b for _, b in chunk], padding=True) for chunk in chunks(pairs)]
    gives_types = "token_type_ids" in encode([text], [text])
    if segments >= 2 and gives_types:
        cases.append(completed("pairs", batches, SEGMENTS, pairs_of_two_lengths))
    elif batches and not gives_types:  # RoBERTa's, XLM-R's: segments told apart by separators alone
        # A model with token types (a BERT body under XLM-R's tokenizer, XLM-R's default type_vocab_size 2) is fed
        # type 0 everywhere, as its pipeline feeds it: what it never computes is nothing to test, and not "untested".
        note = NO_TOKEN_TYPES if segments >= 2 else ""
        cases.append(Case("pairs", batches, note=note))
    elif batches and segments == 0:  # DeBERTa's: the tokenizer gives token types the model has none of and ignores
        cases.append(Case("pairs", batches))
    right = [encode(chunk, padding=True) for chunk in chunks(texts)]
    cases.append(completed("right padding", right, PADDING, lambda: padded("right")))
    left = [
        with_left_positions(encode(chunk, padding=True, padding_side="left"), first_position) for chunk in chunks(texts)
    ]
    cases.append(completed(LEFT_PADDING, left, PADDING, lambda: padded("left")))
    # Repeat the texts until they are longer than the model's maximum length, then truncate to exactly it.
    words = len(tokenizer(" ".join(texts))["input_ids"])
    long_text = " ".join(list(texts) * (max_length // max(1, words - 2) + 1))
    longest = encode([long_text])
    if longest["input_ids"].shape[1] == max_length:
        cases.append(Case("max length", [longest]))
    return cases
