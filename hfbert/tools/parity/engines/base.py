"""The one interface every engine of a parity run follows: load, then run a batch to named outputs.

A batch is what the battery builds (`cases.py`): int64 tensors `input_ids`, `attention_mask`, `token_type_ids`
and, for left padding, `position_ids`. The outputs are named as transformers names them: `last_hidden_state`
(batch, sequence, hidden) and, where the engine has one, `pooler_output` (batch, hidden).

A deployment artifact is one `ArtifactEngine`; hfbert and transformers are `TorchEngine`s. Graphs that take no
`position_ids` get a left-padded batch turned right-padded first and their outputs turned back (`left_to_right`),
except RoBERTa-family and MPNet graphs, which count positions from the ids and take left padding as it is.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from hfbert.modeling.family import Member, member
from hfbert.tools.extras import import_optional

BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
INSTALL_DEPLOY = "pip install 'hfbert[deploy]'"


class ArtifactError(ValueError):
    """An artifact that is not a BERT encoder this check can run: the message names the file and what was expected."""


def import_engine(module: str, engine: str) -> Any:
    """The engine's package, or one error (exit 2 from the command line) naming the extra that installs it."""
    return import_optional(module, f"{engine} is not installed (needed for this artifact): {INSTALL_DEPLOY}")


def installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def reason_of(error: BaseException) -> str:
    """An engine's exception as one line: its message's lines joined, at most 240 characters."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def batch_error(name: str, case: str, batch: dict[str, Tensor], error: BaseException) -> str:
    """The one line naming an artifact that loaded but could not run a battery batch, the batch, and why."""
    ids = batch["input_ids"]
    return (
        f"{name}: could not run the {case!r} batch ({ids.shape[0]} x {ids.shape[1]} tokens, largest token id "
        f"{int(ids.max())}): {reason_of(error)}"
    )


def check_shapes(expected: dict[str, list[int | None] | None], batch: dict[str, Any]) -> None:
    """One ArtifactError naming the fed input (a tensor or array by name) that a graph's fixed sizes refuse
    (`expected`: name -> dims, None where free; None for an input of free rank), where one is refused."""
    for name, dims in expected.items():
        if dims is None or name not in batch:
            continue
        got = list(batch[name].shape)
        if len(dims) == len(got) and all(d is None or d == g for d, g in zip(dims, got, strict=True)):
            continue
        shown = ", ".join("?" if d is None else str(d) for d in dims)
        raise ArtifactError(
            f"{name} expects shape [{shown}], got {got} (an export with fixed sizes: export with dynamic batch and "
            f"sequence axes)"
        ) from None


def check_inputs(path: Path, names: list[str]) -> None:
    """A BERT encoder takes input_ids and at most the other three inputs of `BERT_INPUTS`, by these names."""
    unknown = [name for name in names if name not in BERT_INPUTS]
    if unknown or "input_ids" not in names:
        what = f"unknown input(s) {', '.join(unknown)}" if unknown else "no input_ids input"
        raise ArtifactError(
            f"{path}: not a BERT encoder this check can feed ({what}; inputs {', '.join(names) or 'none'}); "
            f"expected input_ids and optionally {', '.join(BERT_INPUTS[1:])}"
        )


def check_hidden_size(path: Path, size: Any, hidden_size: int, where: str = "last_hidden_state") -> None:
    """A static last dimension of the output that is not the model's hidden size: another model."""
    if isinstance(size, int) and size > 0 and size != hidden_size:
        raise ArtifactError(
            f"{path}: {where} has hidden size {size}, but the model's is {hidden_size} (expected an encoder of "
            f"this model)"
        )


def left_to_right(batch: dict[str, Tensor]) -> tuple[dict[str, Tensor], Tensor | None]:
    """A left-padded batch (it carries position_ids) as right padding, and the shift of each row (None when the
    batch is already right-padded). The position_ids are dropped: right-padded, the real tokens sit at 0..n-1,
    the positions the battery gives them."""
    if "position_ids" not in batch:
        return batch, None
    mask = batch["attention_mask"]
    shift = mask.shape[1] - mask.sum(dim=1)
    batch = {name: _roll(value, shift) for name, value in batch.items() if name != "position_ids"}
    return batch, shift


def right_to_left(output: Tensor, shift: Tensor | None) -> Tensor:
    """A token output of `left_to_right`'s batch, back at the positions of the left-padded one."""
    return output if shift is None else _roll(output, -shift)


def _roll(x: Tensor, shift: Tensor) -> Tensor:
    """Row i of (batch, sequence, ...) rolled left by shift[i]."""
    sequence = x.shape[1]
    index = (torch.arange(sequence)[None, :] + shift[:, None]) % sequence
    index = index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class Prepared(NamedTuple):
    """A batch as an engine takes it: `feed` in the engine's own input form, built outside any clock, the batch it
    was built from (the inputs it takes, aligned) and the shift that puts its token outputs back (`left_to_right`)."""

    feed: Any
    batch: dict[str, Tensor]
    shift: Tensor | None


@dataclass
class ArtifactEngine:
    """A loaded artifact: `run` takes a battery batch, returns named float32 outputs; `prepare` and `run_prepared`
    are its two halves, so that a benchmark times the engine's call alone."""

    path: Path
    engine: str  # "ONNX Runtime", "OpenVINO", "CTranslate2"
    version: str
    precision: str  # the precision that ran, as the engine reports it
    inputs: tuple[str, ...]  # the BERT inputs it takes
    hidden_size: int  # the model's: an output of another size is another model
    feed: Callable[[dict[str, Tensor]], Any]  # a batch of the inputs it takes -> the engine's own input form
    call: Callable[[Any], dict[str, Tensor]]  # the engine's own call on a feed
    graph: dict[str, Any] = field(default_factory=dict)  # facts read from the graph (approximate_gelu, int8, ...)
    notes: list[str] = field(default_factory=list)
    weights: str = ""  # the precision the weights are stored in, read from the file ("fp32", "fp16", "int8, fp32")
    weights_remedy: str = ""  # how to store them in fp32 with this engine's tools, for the likely cause
    native: Any = None  # the engine's own loaded object (session, compiled model, encoder), for what it says later
    first_position: int = 0  # the model's first position (RoBERTa's pad_token_id + 1), for a graph taking positions
    # Whether the run feeds token types: not where the model has none (MPNet) or its tokenizer gives none (RoBERTa's,
    # XLM-R's): a graph without the input is then whole.
    token_types: bool = True

    def prepare(self, batch: dict[str, Tensor]) -> Prepared:
        # Right-padded unless it takes position_ids; only the inputs it takes.
        if "token_type_ids" in self.inputs and "token_type_ids" not in batch:  # RoBERTa's tokenizers give none
            batch = {**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])}
        if "position_ids" in self.inputs:
            if "position_ids" not in batch:  # right padding: real tokens at the positions transformers gives them
                positions = torch.arange(batch["input_ids"].shape[1]) + self.first_position
                positions = positions.expand_as(batch["input_ids"])
                batch = {**batch, "position_ids": positions}
            return Prepared(self.feed(batch), batch, None)
        if self.first_position:
            # A RoBERTa-family or MPNet graph counts positions from the ids, past the pads (MPNet's relative-position
            # bias depends on column distances only, the same in either padding): a left-padded batch is its own
            # input, as users feed it (a fused attention that reads the mask as row lengths fails it).
            batch = {name: value for name, value in batch.items() if name != "position_ids"}
            return Prepared(self.feed(batch), batch, None)
        aligned, shift = left_to_right(batch)
        return Prepared(self.feed(aligned), aligned, shift)

    def run_prepared(self, prepared: Prepared) -> dict[str, Tensor]:
        outputs = self.checked(self.call(prepared.feed), prepared.batch)
        if prepared.shift is not None:
            outputs["last_hidden_state"] = right_to_left(outputs["last_hidden_state"], prepared.shift)
        return outputs

    def run(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.run_prepared(self.prepare(batch))

    def checked(self, outputs: dict[str, Tensor], batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The outputs, as float32 tensors of the shapes a BERT encoder gives, or one error saying what was expected
        (the caller names the artifact and the batch: `batch_error`)."""
        rows, sequence = batch["input_ids"].shape
        last = outputs["last_hidden_state"]
        if tuple(last.shape) != (rows, sequence, self.hidden_size):
            raise ArtifactError(
                f"last_hidden_state of shape {tuple(last.shape)} for a batch of {rows} x {sequence} tokens; expected "
                f"({rows}, {sequence}, {self.hidden_size}) from an encoder of this model"
            )
        pooler = outputs.get("pooler_output")
        if pooler is not None and tuple(pooler.shape) != (rows, self.hidden_size):
            outputs.pop("pooler_output")  # another second output (not a pooler): not compared
        return {name: value.float() for name, value in outputs.items()}


# Weight element types by the engines' names, as one vocabulary. Integer types wider than 16 bits and booleans are
# shapes, indices and masks, not weights: not counted.
WEIGHT_TYPES = {
    "float64": "fp64", "f64": "fp64", "float32": "fp32", "f32": "fp32", "float16": "fp16", "f16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16", "int16": "int16", "i16": "int16", "int8": "int8", "i8": "int8",
    "uint8": "uint8", "u8": "uint8", "int4": "int4", "i4": "int4", "uint4": "uint4", "u4": "uint4",
}  # fmt: skip
# Weights stored in fewer significant bits than float32's 24: their rounding alone is 2^13 (fp16) or 2^16 (bf16)
# times float32's.
REDUCED_FLOATS = {"fp16": 11, "bf16": 8}


def weight_precision(counts: dict[str, int]) -> str:
    """The stored weights' precision from the number of values per element type (engine names, `WEIGHT_TYPES`): the
    types holding at least 1% of the values, most first ("fp16", "int8, fp32"); "" when nothing was counted."""
    totals: dict[str, int] = {}
    for kind, count in counts.items():
        if kind in WEIGHT_TYPES:
            totals[WEIGHT_TYPES[kind]] = totals.get(WEIGHT_TYPES[kind], 0) + count
    whole = sum(totals.values())
    kept = [kind for kind, count in sorted(totals.items(), key=lambda item: -item[1]) if count >= 0.01 * whole]
    return ", ".join(kept) if whole else ""


def reduced_weights_cause(engine: ArtifactEngine) -> str | None:
    """The likely cause of a failing artifact whose weights are stored as fp16 or bf16, whatever precision ran."""
    kind = next((kind for kind in engine.weights.split(", ") if kind in REDUCED_FLOATS), None)
    if kind is None:
        return None
    bits = REDUCED_FLOATS[kind]
    mixed = f" (stored: {engine.weights})" if engine.weights != kind else ""
    return (
        f"{kind} weights{mixed}: each weight rounded to {bits} significant bits (relative error up to "
        f"{2.0**-bits:.1e}, float32's 6.0e-08) before the {engine.precision} arithmetic ran; "
        f"{engine.weights_remedy or 'store them in float32'}, or judge it with --artifact-bound"
    )


# Weights stored as integers: each a step of a scale per tensor, channel or block, dequantized to float before use.
QUANTIZED = {"int8": 8, "uint8": 8, "int4": 4, "uint4": 4}


def quantized_weights_cause(engine: ArtifactEngine) -> str | None:
    """The likely cause of a failing artifact whose weights are stored as 8- or 4-bit integers, whatever
    arithmetic ran on them (a weight-only quantized graph computes in float, with no int8 operator to show it)."""
    kind = next((kind for kind in engine.weights.split(", ") if kind in QUANTIZED), None)
    if kind is None:
        return None
    bits = QUANTIZED[kind]
    return (
        f"weights stored as {kind} (stored: {engine.weights}): each weight rounded to one of {2**bits} steps of a "
        f"scale it shares with others, up to half a step off (about 1/{2**bits - 2} of the largest of them; "
        f"float32's rounding is 6.0e-08 of the weight itself) before the {engine.precision} arithmetic ran; store "
        f"them in float32, or judge it with --artifact-bound"
    )


@functools.cache
def with_pooler(masked_lm_class: type, pooler_class: type) -> type:
    """`masked_lm_class` (hfbert's or transformers' masked-LM model of any family) whose backbone has the
    checkpoint's pooler too. Both libraries build their masked-LM models without one (add_pooling_layer=False);
    with it, one masked-LM model gives every row, the pooler computed by its own backbone's forward, as a backbone
    with a pooler computes it."""

    class WithPooler(masked_lm_class):
        def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            getattr(self, self.base_model_prefix).pooler = pooler_class(self.config)

    WithPooler.__name__ = WithPooler.__qualname__ = f"{masked_lm_class.__name__}WithPooler"
    return WithPooler


class ModelSpec(NamedTuple):
    """Which model hfbert and transformers load alike, and how it runs: the masked-LM model when the checkpoint has
    that head (its backbone with the checkpoint's pooler where it has one: `with_pooler`), else the backbone.
    `model_type` is config.json's (its `member` in the family table gives both libraries' classes, and the masked-LM
    head's modules, the same in both libraries: `cls.predictions`, RoBERTa's `lm_head`, ModernBERT's `head` then
    `decoder`)."""

    has_mlm_head: bool
    has_pooler: bool
    dtype: torch.dtype
    device: str
    attn: str
    model_type: str = "bert"

    @property
    def member(self) -> Member:
        """The family member config.json's `model_type` names (hfbert.modeling.family)."""
        return member(self.model_type)

    def model_class(self, masked_lm: type, backbone: type, pooler: type | None) -> tuple[type, dict[str, Any]]:
        """The class to load, of one library's masked-LM model, backbone and pooler (None where the library has no
        pooler for the member: ModernBERT's in transformers), and its loading options."""
        if not self.has_mlm_head:
            # A backbone without a pooler class takes no pooler argument either (transformers' ModernBertModel
            # refuses `add_pooling_layer`); one with a pooler is told whether the checkpoint stores its weights, so
            # that none is made up from random values.
            return backbone, ({"add_pooling_layer": self.has_pooler} if pooler is not None else {})
        return (with_pooler(masked_lm, pooler) if self.has_pooler else masked_lm), {}

    def engine(self, model: Any) -> TorchEngine:
        """`model`, of `model_class`, as the comparison calls it."""
        if self.has_mlm_head:
            parts = [model.get_submodule(name) for name in self.member.masked_lm_modules]
            head = parts[0] if len(parts) == 1 else torch.nn.Sequential(*parts)  # ModernBERT's `head`, `decoder`
            return TorchEngine(model, getattr(model, model.base_model_prefix), head)
        return TorchEngine(model, model, None)


class TorchEngine(NamedTuple):
    """hfbert's or transformers' model in a parity run, as the calls the comparison makes (compare.py)."""

    model: Any  # the whole model: its attention implementation is switched for the eager attention call
    backbone: Any  # its encoder (BertModel, RobertaModel, ...): hidden states, pooler, attention probabilities
    head: Any  # its masked-LM head (logits from the last hidden state, as its forward computes them), or None

    def run(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        output = self.backbone(**batch, return_dict=True)
        named = {"last_hidden_state": output.last_hidden_state}
        pooler_output = getattr(output, "pooler_output", None)  # transformers' ModernBERT output has no such field
        if pooler_output is not None:
            named["pooler_output"] = pooler_output
        return named
