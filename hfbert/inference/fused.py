"""The fast fp32 mode, `optimize_for_inference(model, precision="high")`: a layer's blocks swapped for fused ones.

    >>> import torch, hfbert
    >>> model = hfbert.BertModel(hfbert.BertConfig(num_hidden_layers=1))
    >>> model = hfbert.optimize_for_inference(model, precision="high")  # doctest: +SKIP

The name is torch's for the same choice (`torch.set_float32_matmul_precision("high")`): fp32 inputs and outputs,
products summed in whatever order is fastest. Its contract, measured by `python -m benchmarks.numerical_contract`
on every instruction set: RMS error against float64 at most 3x transformers' own (ACCURACY_BOUNDS in optimize.py),
where the default is held to 1.5x. The error comes from oneDNN's products, which sum each output's whole inner
dimension in one chain (about 2x sgemm's error per product; `packed.py` says why the default cuts it in blocks).

Three blocks of each layer are swapped, the module tree and parameters staying what they were (`query`, `key`,
`value`, `dense` and `LayerNorm` are the same modules, so the state dict is unchanged):

- `FusedSelfAttention`: query, key and value in one product (hidden -> 3 x hidden) on one packed weight;
- `FusedIntermediate`: the feed-forward product on a packed weight, GELU (erf) as oneDNN's post-op or after it;
- `FusedResidualOutput`: the output product with the residual added as oneDNN's post-op or after it, then LayerNorm.

Each block's ways of computing it (the plain one first) are timed here at a few row counts (`measured.py`), and a
call runs the fastest for its row count: the plain computation wherever the fused one does not win. Training,
gradients, autocast, torch.compile and tracing always run the plain computation, on the model's own parameters; the
packed weights are a cache of them (`swapped.CachedForm`), rebuilt when they change.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.inference.measured import Candidate, bucket
from hfbert.inference.packed import _ops, can_pack
from hfbert.inference.swapped import CachedForm, plain_inference_call
from hfbert.modeling.model import BertIntermediate, BertResidualOutput, BertSelfAttention


def pack_whole(weight: Tensor) -> Tensor:
    """`weight` (out x in) in oneDNN's blocked layout, the whole inner dimension at once."""
    return _ops()[1](weight.detach().contiguous())


def packed_product(rows: Tensor, packed: Tensor, bias: Tensor | None, post_op: str = "none") -> Tensor:
    """(rows, in) x packed (out x in) + bias, with oneDNN's `post_op` ("none", or "gelu": GELU's erf form)."""
    return _ops()[0](rows, packed, bias, post_op, [], "none" if post_op == "gelu" else "")


def packed_product_add(rows: Tensor, packed: Tensor, bias: Tensor | None, other: Tensor) -> Tensor:
    """(rows, in) x packed + bias + other, the addition as oneDNN's binary post-op."""
    return _ops()[0].binary(rows, other, packed, bias, "add")


def _random(*shape: int) -> Tensor:
    return torch.randn(*shape) * 0.02


class FusedBlock(CachedForm):
    """What the three fused blocks share: the swap in and out, the choice of computation per row count, and when
    the fused one may run at all."""

    plain_class: type[nn.Module]
    _choice: tuple[int, ...] = (1, 1, 1)  # per `measured.ROW_BUCKETS`: 0 runs the plain block, others a fused way

    @classmethod
    def from_block(cls, block: nn.Module, choice: tuple[int, ...]) -> FusedBlock:
        fused = cls.__new__(cls)
        fused.__dict__.update(_block_state(block))
        fused._choice = choice
        fused._keep_pages = 0 in choice
        if any(choice):
            fused.rebuild()
        return fused

    def to_block(self) -> nn.Module:
        """The model's own block again, with the same modules and parameters."""
        block = self.plain_class.__new__(self.plain_class)
        block.__dict__.update(_block_state(self))
        return block

    def can_build(self) -> bool:
        """fp32 weights oneDNN can pack here, fp32 biases (or none)."""
        parameters = [parameter for parameter in self.form_parameters() if parameter is not None]
        return all(
            parameter.dtype == torch.float32 and parameter.device.type == "cpu" for parameter in parameters
        ) and all(can_pack(parameter) for parameter in parameters if parameter.dim() == 2)

    def _way(self, input: Tensor, in_features: int) -> int:
        """Which computation this call runs: 0 (the plain block) unless a fused one was measured faster for its row
        count and may run here."""
        if self.training or input.dtype != torch.float32 or not plain_inference_call(input, self.form_parameters()):
            return 0
        if _hooked(module for module in self.children() if isinstance(module, nn.Linear)):
            # A hook on a linear layer inside must see that layer's own call, which only the plain block makes.
            return 0
        way = self._choice[bucket(input.numel() // in_features)]
        if way == 0 or not self._ready():
            return 0
        return way


class FusedSelfAttention(FusedBlock, BertSelfAttention):
    plain_class = BertSelfAttention

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return tuple(tensor for layer in self.projections() for tensor in (layer.weight, layer.bias))

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return self.query, self.key, self.value

    def build_form(self) -> tuple[Tensor, Tensor]:
        weight, bias = fused_parameters(self.projections())
        return pack_whole(weight), bias

    def project(self, rows: Tensor) -> Tensor:
        """(rows, hidden) -> (rows, query | key | value), the three products in one."""
        return packed_product(rows, *self._form)

    def forward(self, hidden_states: Tensor, batch: Any) -> tuple[Tensor, Tensor | None]:
        if not self._way(hidden_states, self.query.in_features):
            return super().forward(hidden_states, batch)
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        projected = self.project(rows).view(*hidden_states.shape[:-1], -1)
        query, key, value = projected.split(
            [self.query.out_features, self.key.out_features, self.value.out_features], -1
        )
        return batch.attend(query, key, value, num_heads=self.num_heads, scale=self.scale, dropout=0.0)

    @staticmethod
    def candidates(hidden: int, projected: int) -> list[Candidate]:
        def plain(rows: int):
            input, weights = torch.randn(rows, hidden), [_random(projected, hidden) for _ in range(3)]
            bias = torch.zeros(projected)
            return lambda: [F.linear(input, weight, bias) for weight in weights]

        def fused(rows: int):
            input, packed, bias = (
                torch.randn(rows, hidden),
                pack_whole(_random(3 * projected, hidden)),
                torch.zeros(3 * projected),
            )
            return lambda: packed_product(input, packed, bias).split(projected, -1)

        return [plain, fused]


class FusedIntermediate(FusedBlock, BertIntermediate):
    plain_class = BertIntermediate

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return (self.dense.weight, self.dense.bias)

    def build_form(self) -> tuple[Tensor, Tensor | None]:
        return pack_whole(self.dense.weight), _bias(self.dense)

    def forward(self, hidden_states: Tensor) -> Tensor:
        way = self._way(hidden_states, self.dense.in_features)
        if not way:
            return super().forward(hidden_states)
        packed, bias = self._form
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        if way == 2:  # GELU as oneDNN's post-op: only offered for the erf form (`candidates`)
            output = packed_product(rows, packed, bias, "gelu")
        else:
            output = self.activation(packed_product(rows, packed, bias))
        return output.view(*hidden_states.shape[:-1], -1)

    @staticmethod
    def candidates(hidden: int, intermediate: int, activation: Any) -> list[Candidate]:
        def plain(rows: int):
            input, weight, bias = torch.randn(rows, hidden), _random(intermediate, hidden), torch.zeros(intermediate)
            return lambda: activation(F.linear(input, weight, bias))

        def fused(post_op: str):
            def make(rows: int):
                input, packed = torch.randn(rows, hidden), pack_whole(_random(intermediate, hidden))
                bias = torch.zeros(intermediate)
                if post_op == "gelu":
                    return lambda: packed_product(input, packed, bias, "gelu")
                return lambda: activation(packed_product(input, packed, bias))

            return make

        # oneDNN's "gelu" post-op is the erf form: offered only where the model's activation is exactly that.
        return [plain, fused("none")] + ([fused("gelu")] if activation is F.gelu else [])


class FusedResidualOutput(FusedBlock, BertResidualOutput):
    plain_class = BertResidualOutput

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return (self.dense.weight, self.dense.bias)

    def build_form(self) -> tuple[Tensor, Tensor | None]:
        return pack_whole(self.dense.weight), _bias(self.dense)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        way = self._way(hidden_states, self.dense.in_features)
        if not way or residual.dtype != torch.float32:
            return super().forward(hidden_states, residual)
        packed, bias = self._form
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        residual_rows = residual.reshape(-1, residual.shape[-1]).contiguous()
        if way == 2:
            output = packed_product_add(rows, packed, bias, residual_rows)
        else:
            output = packed_product(rows, packed, bias) + residual_rows
        return self.LayerNorm(output.view(residual.shape))

    @staticmethod
    def candidates(input_size: int, hidden: int) -> list[Candidate]:
        def make(way: int):
            def build(rows: int):
                input, residual = torch.randn(rows, input_size), torch.randn(rows, hidden)
                weight, bias = _random(hidden, input_size), torch.zeros(hidden)
                if way == 0:
                    return lambda: F.linear(input, weight, bias) + residual
                packed = pack_whole(weight)
                if way == 1:
                    return lambda: packed_product(input, packed, bias) + residual
                return lambda: packed_product_add(input, packed, bias, residual)

            return build

        return [make(0), make(1), make(2)]


FUSED_BLOCKS: dict[type[nn.Module], type[FusedBlock]] = {
    BertSelfAttention: FusedSelfAttention,
    BertIntermediate: FusedIntermediate,
    BertResidualOutput: FusedResidualOutput,
}


def block_candidates(block: nn.Module) -> tuple[tuple, list[Candidate]]:
    """A key naming `block`'s shape, and its ways of computing it, for `measured.measured_choice`."""
    if isinstance(block, BertSelfAttention):
        hidden, projected = block.query.in_features, block.query.out_features
        return ("attention", hidden, projected), FusedSelfAttention.candidates(hidden, projected)
    if isinstance(block, BertIntermediate):
        shape = (block.dense.in_features, block.dense.out_features)
        return ("intermediate", *shape, block.activation), FusedIntermediate.candidates(*shape, block.activation)
    shape = (block.dense.in_features, block.dense.out_features)
    return ("output", *shape), FusedResidualOutput.candidates(*shape)


def _hooked(modules) -> bool:
    return bool(nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks) or any(
        module._forward_hooks or module._forward_pre_hooks for module in modules
    )


def fused_parameters(layers: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor]:
    """The weights and biases of layers computed as one product, concatenated along their outputs (zeros for a
    layer without a bias)."""
    return torch.cat([layer.weight.detach() for layer in layers]), torch.cat([_bias(layer) for layer in layers])


def _bias(layer: nn.Linear) -> Tensor:
    return torch.zeros(layer.out_features) if layer.bias is None else layer.bias.detach()


def _block_state(block: nn.Module) -> dict[str, Any]:
    """A block's state for an instance of its fused or plain class: the same modules, parameters and hooks (in new
    dicts), no cached form."""
    return {
        key: value.copy() if isinstance(value, dict) else value
        for key, value in block.__dict__.items()
        if key not in ("_form", "_form_from", "_choice", "_keep_pages")
    }
