"""One batch through hfbert, transformers and transformers in float64, every output compared at once."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from hfbert.modeling.family import member
from hfbert.tools.parity.engines.base import TorchEngine
from hfbert.tools.parity.statistics import TOP_K, Row, Stats, allowed_error


@contextmanager
def _eager_attention(*models: Any) -> Iterator[None]:
    """The models' attention implementation switched to eager (the one that returns the probabilities)."""
    saved = [model.config._attn_implementation for model in models]
    for model in models:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        for model, implementation in zip(models, saved, strict=True):
            model.set_attn_implementation(implementation)


def _self_attention(layer: torch.nn.Module, where: str) -> torch.nn.Module:
    """A transformers layer's self-attention, at the member's `reference_attention` (`attention.self`: BERT,
    RoBERTa; MPNet's `attention.attn`)."""
    return layer.get_submodule(where)


def _asker(attention: torch.nn.Module) -> Callable[..., tuple[tuple, dict[str, Any]]]:
    """A forward pre-hook that sets `output_attentions` to True however the caller passes it: by keyword (MPNet's
    layer) or by position (DeBERTa's `self.self(hidden_states, attention_mask, output_attentions, ...)`)."""
    position = list(inspect.signature(attention.forward).parameters).index("output_attentions")

    def ask(_: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        if len(args) > position:
            return (*args[:position], True, *args[position + 1 :]), kwargs
        return args, {**kwargs, "output_attentions": True}

    return ask


@contextmanager
def _each_layer_attention(
    backbone: Any, layers: str, where: str, receive: Callable[[int, Tensor], None]
) -> Iterator[None]:
    """`receive(index, probabilities)` called as each layer's self-attention returns its probabilities (eager:
    its second output, the one transformers' own `output_attentions` records), so that they are compared during
    the forward instead of all layers held at once. `layers`: the layer list's path in the backbone, `where`: the
    self-attention's path in each layer (the member's `layers` and `reference_attention`). A self-attention that
    returns them only when asked (`output_attentions`: MPNet's, DeBERTa's) is asked here, and its output passed on
    with None in their place (the pair DeBERTa's caller unpacks; MPNet's reads past its first output only when it
    asked), so that the encoder does not keep them either."""

    def hook(index: int, asked: bool) -> Callable[..., Any]:
        def received(_: Any, __: Any, output: tuple[Tensor, ...]) -> tuple[Tensor, ...] | None:
            receive(index, output[1])
            return (output[0], None, *output[2:]) if asked else None

        return received

    handles = []
    for index, layer in enumerate(backbone.get_submodule(layers)):
        attention = _self_attention(layer, where)
        asked = "output_attentions" in inspect.signature(attention.forward).parameters
        if asked:
            handles.append(attention.register_forward_pre_hook(_asker(attention), with_kwargs=True))
        handles.append(attention.register_forward_hook(hook(index, asked)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _kept(output: Any) -> tuple[tuple[Tensor, ...], Tensor | None, Tensor]:
    """What is compared of a backbone's output: its hidden states, pooler output and last hidden state."""
    return output.hidden_states, getattr(output, "pooler_output", None), output.last_hidden_state


def _real_rows(x: Tensor, real: Tensor, all_real: bool) -> Tensor:
    """(batch, sequence, ...) -> the vectors at real positions; a view, not a copy, when no position is padding."""
    return x.flatten(0, 1) if all_real else x[real]


def compare_batch(
    case: str,
    batch: dict[str, Tensor],
    runners: tuple[TorchEngine, TorchEngine, TorchEngine],
    rows: dict[str, Row],
    dtype: torch.dtype,
    bound: float,
    attentions: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """`batch` through hfbert, transformers and transformers in float64; every row updated at real positions only.
    hfbert and transformers run with the run's attention and, unless that is eager (`attentions`), once more eager
    on the backbone for the attention probabilities; the float64 model runs once, eager, for every output. Each
    of its layers' attention probabilities is compared as it comes out and let go with the other two models':
    at the maximum length they are the largest outputs (bert-base, 512 tokens: 600 MB for the three models).
    Returns transformers' and the float64 model's last hidden state and pooler output (named as transformers names
    them), against which deployed artifacts are judged on the same batch."""
    real = batch["attention_mask"].bool()
    all_real = bool(real.all())

    def run(runner: TorchEngine, **options: bool) -> Any:
        return runner.backbone(**batch, return_dict=True, **options)

    if attentions:  # an eager run: one call of each model gives every output
        outputs = [run(runner, output_hidden_states=True, output_attentions=True) for runner in runners[:2]]
        probabilities = [list(output.attentions) for output in outputs]
        outputs = [_kept(output) for output in outputs]
    else:  # the eager calls first: their probabilities are compared and let go before the sdpa calls run
        with _eager_attention(runners[0].model, runners[1].model):
            probabilities = [list(run(runner, output_attentions=True).attentions) for runner in runners[:2]]
    compared = []

    def compare(index: int, exact: Tensor) -> None:
        # (batch, heads, query, key) -> the rows of real query tokens, every key: (tokens * heads, key)
        layer = [x.transpose(1, 2)[real].flatten(0, 1) for x in (probabilities[0][index], probabilities[1][index])]
        probabilities[0][index] = probabilities[1][index] = None
        rows[f"attentions layer {index}"].update(case, *layer, exact.transpose(1, 2)[real].flatten(0, 1))
        compared.append(index)

    row = member(runners[0].model.config.model_type)  # the member, by hfbert's config
    with _each_layer_attention(
        runners[2].backbone, row.layers, row.reference_attention, compare
    ):  # the float64 reference: eager, every output
        exact = _kept(run(runners[2], output_hidden_states=True))
    if not attentions:
        outputs = [_kept(run(runner, output_hidden_states=True)) for runner in runners[:2]]
    outputs.append(exact)
    del exact
    counts = {len(hidden_states) for hidden_states, _, _ in outputs} | {len(layers) + 1 for layers in probabilities}
    if len(counts) != 1 or compared != list(range(len(probabilities[0]))):
        raise ValueError(f"{sorted(counts)} hidden states: hfbert and transformers disagree on the layer count")
    for index, states in enumerate(zip(*(hidden_states for hidden_states, _, _ in outputs), strict=True)):
        rows["embeddings" if index == 0 else f"layer {index - 1}"].update(
            case, *(_real_rows(x, real, all_real) for x in states)
        )
    if "pooler" in rows:
        rows["pooler"].update(case, *(pooler for _, pooler, _ in outputs))
    kept = tuple(
        {"last_hidden_state": last} | ({"pooler_output": pooler} if pooler is not None else {})
        for _, pooler, last in outputs[1:]
    )
    if runners[0].head is not None:
        # The logits as each masked-LM model's forward computes them: its head on its backbone's last hidden state.
        last = [last for _, _, last in outputs]
        del outputs
        exact = _real_rows(runners[2].head(last[2]), real, all_real)
        ours, theirs = (
            _real_rows(runner.head(x), real, all_real) for runner, x in zip(runners[:2], last[:2], strict=True)
        )
        _, _, reference_error = rows["mlm logits"].update(case, ours, theirs, exact)
        # A swap in the top-k is a real difference unless the exact logits are tied within the allowed error.
        batch_error = Stats()
        batch_error.add(reference_error)  # max |theirs - exact| and max |exact| over this batch, as measured
        tie = 2 * allowed_error(dtype, batch_error.max_abs, batch_error.reference_max_abs, bound)
        rows[f"mlm top-{TOP_K}"].update(case, ours, exact, tie=tie)
    return kept
