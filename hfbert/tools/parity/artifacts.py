"""A deployed artifact's verdict: each of its outputs judged as hfbert's are, by its RMS error against float64 as a
multiple of transformers' fp32 error on the same batches (`Accuracy`, with `bound`, 1.5 by default), its error by
position, its sentence embeddings, its median time per batch, and a likely cause where the numbers or the graph
show one (`likely_causes`)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hfbert.tools.parity.engines.base import (
    ArtifactEngine,
    batch_error,
    quantized_weights_cause,
    reduced_weights_cause,
)
from hfbert.tools.parity.sentences import CASE, SentenceStats, embed
from hfbert.tools.parity.statistics import ACCURACY_RATIO, Accuracy, Row

OUTPUTS = ("last_hidden_state", "pooler_output")
POSITION_EDGES = (0, 16, 64, 128, 256, 512)  # error by position, in these buckets of token positions
PAIRS = "pairs"
PADDED = ("right padding", "left padding")


@dataclass
class ArtifactCheck:
    """One artifact through the battery: rows per output, error by position, sentence embeddings, time."""

    name: str  # as the user gave it
    engine: ArtifactEngine
    bound: float = ACCURACY_RATIO
    rows: dict[str, Row] = field(default_factory=dict)
    positions: dict[int, list[float]] = field(default_factory=dict)  # bucket -> [ours sq, theirs sq, count]
    sentences: SentenceStats = field(default_factory=SentenceStats)
    seconds: list[float] = field(default_factory=list)
    instruction_set: str = ""
    vnni: bool = False
    # Cases whose batches could not hold what they test (cases.py, `Case.exercised`): case -> why. Not "pass" then.
    untested: dict[str, str] = field(default_factory=dict)
    position_offset: Any = None  # causes.PositionOffset, where shifted positions fit the failing artifact
    # causes.PaddingBlindPositions, where positions counted over columns (pads too) fit its failing left padding
    padding_positions: Any = None
    # causes.AttentionMismatch, where another window or rotary base fits it (ModernBERT's local and global layers)
    attention_mismatch: Any = None
    # The batch the engine could not run (static shapes, a smaller vocabulary), named with the engine's reason: the
    # artifact's verdict is "error", its later batches are not run, and the other artifacts are still judged.
    error: str | None = None

    def update(
        self, case: str, batch: dict[str, Tensor], theirs: dict[str, Tensor], exact: dict[str, Tensor], pipeline: Any
    ) -> None:
        if self.error is not None:
            return
        started = time.perf_counter()
        try:
            outputs = self.engine.run({name: value.cpu() for name, value in batch.items()})
        except Exception as error:  # whatever the engine raises: its message, not its type, says what it expected
            self.error = batch_error(self.name, case, batch, error)
            return
        self.seconds.append(time.perf_counter() - started)
        real = batch["attention_mask"].bool().cpu()
        for index, name in enumerate(OUTPUTS):
            if name not in outputs or name not in exact:
                continue
            if name == "pooler_output" and "position_ids" in batch:
                # Left padding: the reference's pooler reads position 0, a pad token there (as transformers' does);
                # an artifact fed the same tokens right-aligned reads [CLS]. Not the same quantity: not compared.
                continue
            if name not in self.rows:
                self.rows[name] = Row(name, index, lambda: Accuracy(torch.float32, bound=self.bound))
            ours, reference, fp32 = outputs[name], exact[name].cpu(), theirs[name].cpu().float()
            if name == "last_hidden_state":
                self._positions(batch, ours, fp32, reference, real)
                ours, fp32, reference = ours[real], fp32[real], reference[real]
            self.rows[name].update(case, ours, fp32, reference)
        if pipeline is not None and case == CASE:
            mask = batch["attention_mask"].cpu()
            self.sentences.add(
                embed(pipeline, outputs["last_hidden_state"], mask), embed(pipeline, exact["last_hidden_state"], mask)
            )

    def _positions(self, batch: dict[str, Tensor], ours: Tensor, fp32: Tensor, exact: Tensor, real: Tensor) -> None:
        mask = batch["attention_mask"].cpu()
        position = batch.get("position_ids")
        position = position.cpu() if position is not None else torch.arange(mask.shape[1]).expand_as(mask)
        position = position.contiguous()
        bucket = torch.bucketize(position, torch.tensor(POSITION_EDGES[1:]), right=True)
        ours_squares = (ours.double() - exact.double()).square().sum(-1)
        theirs_squares = (fp32.double() - exact.double()).square().sum(-1)
        for index in bucket[real].unique().tolist():
            where = real & (bucket == index)
            record = self.positions.setdefault(index, [0.0, 0.0, 0])
            record[0] += float(ours_squares[where].sum())
            record[1] += float(theirs_squares[where].sum())
            record[2] += int(where.sum())

    # -- the verdict ----------------------------------------------------------------------------------------------

    @property
    def accurate(self) -> bool:
        """Every output within its bound, on the cases that ran."""
        return self.error is None and bool(self.rows) and all(row.passed for row in self.rows.values())

    @property
    def passed(self) -> bool:
        return self.accurate and not self.untested

    @property
    def verdict(self) -> str:
        """pass, fail, or untested: every output within its bound, but a case could not test what it is there for."""
        if self.error is not None:
            return "error"
        return "fail" if not self.accurate else ("untested" if self.untested else "pass")

    @property
    def ratios(self) -> dict[str, float]:
        return {name: row.total.ratio for name, row in self.rows.items()}

    @property
    def worst_ratio(self) -> float:
        values = list(self.ratios.values())
        return max(values, key=lambda value: math.inf if math.isnan(value) else value) if values else math.nan

    @property
    def first_failure(self) -> str | None:
        return next((name for name, row in self.rows.items() if not row.passed), None)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds) if self.seconds else math.nan

    def position_ratios(self) -> list[tuple[str, float, int]]:
        """(positions, ratio of RMS errors, tokens) per position bucket with tokens in it, in order."""
        rows = []
        for index in sorted(self.positions):
            ours, theirs, count = self.positions[index]
            low = POSITION_EDGES[index]
            label = f"{low}-{POSITION_EDGES[index + 1] - 1}" if index + 1 < len(POSITION_EDGES) else f"{low}+"
            rows.append((label, math.sqrt(ours / theirs) if theirs > 0 else math.inf, count))
        return rows

    def likely_causes(self) -> list[str]:
        """Causes shown by a measured pattern or a fact of the graph, only for a failing artifact."""
        if self.accurate or not self.rows or self.error is not None:
            return []
        # Found by re-running float64 with shifted positions or another window or rotary base (reference.py): it
        # explains every case.
        found = (self.position_offset, self.padding_positions, self.attention_mismatch)
        causes = [cause.describe() for cause in found if cause is not None]
        graph = self.engine.graph
        row = self.rows["last_hidden_state"]
        cases = {case: record.ratio for case, record in row.by_case.items()}
        failing = {case for case, record in row.by_case.items() if not record.passed}
        if PAIRS in cases and failing == {PAIRS}:
            if not self.engine.token_types:  # the tokenizer or the model has none: the pairs are all segment 0
                fact = "the pairs carry no token types here, so the separators between the segments look mishandled"
            elif "token_type_ids" not in self.engine.inputs:
                fact = "the graph takes no token_type_ids input, so every token is fed as segment 0"
            else:
                fact = "the second segment's token types look ignored"
            others = max(ratio for case, ratio in cases.items() if case != PAIRS)
            causes.append(
                f"error only on sentence pairs ({cases[PAIRS]:.3g}x there, at most {others:.3g}x in the other cases): "
                f"{fact}"
            )
        unpadded = [ratio for case, ratio in cases.items() if case not in (*PADDED, PAIRS)]
        if not causes and set(PADDED) <= failing <= {*PADDED, PAIRS} and unpadded:
            causes.append(
                f"error only in the cases with padding ({', '.join(f'{case} {cases[case]:.3g}x' for case in failing)}"
                f"; at most {max(unpadded):.3g}x without): the attention mask looks ignored (real tokens attend to "
                f"pads)"
            )
        buckets = [(label, ratio) for label, ratio, count in self.position_ratios() if count >= 8]
        if len(buckets) >= 2 and not causes:
            first, last = buckets[0][1], buckets[-1][1]
            rising = all(b[1] >= a[1] * 0.9 for a, b in zip(buckets, buckets[1:], strict=False))
            if last > self.bound and last > 4 * first and rising:
                causes.append(
                    f"error growing with position ({first:.3g}x at positions {buckets[0][0]}, {last:.3g}x at "
                    f"{buckets[-1][0]}): position embeddings offset, or cut, in the artifact"
                )
        if "approximate_gelu" in graph:
            names = ", ".join(graph["approximate_gelu"])
            causes.append(f"the graph has {names}: GELU's tanh approximation instead of erf")
        if "int8" in graph:
            what = ", ".join(graph["int8"])
            if self.engine.engine == "ONNX Runtime" and not self.vnni:
                causes.append(
                    f"int8 graph ({what}): uint8 activations x int8 weights, on a CPU without VNNI "
                    f"({self.instruction_set}), where the u8 x s8 products saturate in 16 bits (vpmaddubsw), on top "
                    f"of the rounding to 8 bits; judge int8 with --artifact-bound"
                )
            else:
                causes.append(
                    f"int8 ({what}): activations and weights rounded to 8 bits; judge int8 with --artifact-bound"
                )
        reduced = reduced_weights_cause(self.engine)  # fp16 or bf16 weights, whatever precision ran
        if reduced is not None:
            causes.append(reduced)
        quantized = quantized_weights_cause(self.engine)  # int8 weights computed in float: no int8 operator says so
        if quantized is not None and "int8" not in graph:
            causes.append(quantized)
        if not causes:
            cosine = row.total.ours_error.min_cosine
            if cosine < 0.9 and len(failing) == len(cases):
                causes.append(
                    f"error in every case, min cosine of a token vector to float64 {cosine:.3f}: the artifact "
                    f"computes something else (other weights, or another model of the same shape)"
                )
        return causes

    def to_dict(self) -> dict[str, Any]:
        sentence = self.sentences.numbers()
        return {
            "path": self.name,
            "local_path": str(self.engine.path),
            "engine": self.engine.engine,
            "version": self.engine.version,
            "precision": self.engine.precision,
            "weights_precision": self.engine.weights,
            "instruction_set": self.instruction_set,
            "inputs": list(self.engine.inputs),
            "notes": self.engine.notes,
            "graph": {key: value for key, value in self.engine.graph.items() if key != "operators"},
            "ratios": self.ratios,
            "worst_ratio": self.worst_ratio,
            "bound": self.bound,
            **{key: sentence.get(key) for key in ("min_cosine", "mean_cosine", "retrieval_agreement", "retrieval_k")},
            "median_seconds_per_batch": self.median_seconds,
            "verdict": self.verdict,
            "error": self.error,
            "untested": self.untested,
            "first_failing_output": self.first_failure,
            "likely_causes": self.likely_causes(),
            "error_by_position": [
                {"positions": label, "ratio": ratio, "tokens": count} for label, ratio, count in self.position_ratios()
            ],
            "outputs": {name: row.to_dict() for name, row in self.rows.items()},
        }
