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
`value`, `dense` and `LayerNorm` are the same modules, so the state dict is unchanged). Each runs its product by
`packed.WHOLE` (`swapped.Kernel`); attention alone takes another kernel as a value (`int8.INT8` for the int8 model),
as the feed-forward blocks' post-ops are oneDNN's on `packed.WHOLE`'s form:

- `FusedSelfAttention`: query, key and value in one product (hidden -> 3 x hidden) on one packed (or int8) weight;
  MPNet's `attention.attn` the same (`FusedMPNetSelfAttention`: q, k and v in one product, then its own `o` layer,
  the position bias the batch carries added to the scores as in the plain block);
- `FusedIntermediate`: the feed-forward product on a packed weight, GELU (erf) as oneDNN's post-op or after it;
- `FusedResidualOutput`: the output product with the residual added as oneDNN's post-op or after it, then LayerNorm.

Each block's ways of computing it (the plain one first) are timed here at a few row counts (`measured.py`), and a
call runs the fastest for its row count: the plain computation wherever the fused one does not win. Training,
gradients, autocast, torch.compile, tracing, hooks on the projections and projections that are not plain `nn.Linear`
(PEFT's LoRA wrappers) run the plain computation, on the model's own parameters (`swapped.Swapped.kernel_way`); the
packed weights are a cache of them, rebuilt when they change.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hfbert.inference.measured import Candidate
from hfbert.inference.packed import WHOLE, pack_whole, packed_product, packed_product_add
from hfbert.inference.swapped import Kernel, Swapped
from hfbert.modeling.model import BertIntermediate, BertResidualOutput, BertSelfAttention
from hfbert.modeling.mpnet import MPNetSelfAttention


def _random(*shape: int) -> Tensor:
    return torch.randn(*shape) * 0.02


class FusedBlock(Swapped):
    """What the three fused blocks share: their product's kernel, and the linear layers the product replaces
    (`inner_modules`: the gate runs the plain block where they are hooked or wrapped)."""

    kernel = WHOLE

    @classmethod
    def from_block(cls, block: nn.Module, choice: tuple[int, ...]) -> FusedBlock:
        """`swap_in` for a block, with its measured `choice` per row count."""
        return cls.swap_in(block, _choice=choice)

    def form_parameters(self) -> tuple[Tensor | None, ...]:
        return tuple(tensor for layer in self.inner_modules() for tensor in (layer.weight, layer.bias))

    def build_form(self) -> Any:
        return self.kernel.build(*fused_parameters(self.inner_modules()))

    def fingerprinted(self) -> tuple[Tensor | None, ...]:
        # One projection's bias is held itself (`fused_parameters`); several are concatenated, a copy.
        return self.form_parameters() if len(self.inner_modules()) > 1 else (self.inner_modules()[0].weight,)

    @staticmethod
    def linears(block: nn.Module) -> tuple[nn.Module, ...]:
        """The modules of `block` that its fused product computes."""
        return (block.dense,)

    def inner_modules(self) -> tuple[nn.Module, ...]:
        return self.linears(self)


class FusedAttention(FusedBlock):
    """An attention block's three projections in one product (hidden -> 3 x hidden) on one packed (or int8) weight,
    then the batch's attention (its key mask, and MPNet's position bias where the batch carries one). A subclass
    names its plain class's projections (`projections`) and what follows the attention (`project_back`)."""

    projections: tuple[str, str, str]

    @classmethod
    def from_block(cls, block: nn.Module, choice: tuple[int, ...], kernel: Kernel = WHOLE) -> FusedAttention:
        """`swap_in` for attention, with its measured `choice` per row count and its product's `kernel`."""
        return cls.swap_in(block, _choice=choice, kernel=kernel)

    @classmethod
    def linears(cls, block: nn.Module) -> tuple[nn.Module, ...]:
        return tuple(getattr(block, name) for name in cls.projections)

    def project(self, hidden_states: Tensor) -> Tensor:
        """(..., hidden) -> (..., query | key | value), the three products in one, by the block's kernel."""
        return self.kernel.run(hidden_states, self._form)

    def project_back(self, context: Tensor) -> Tensor:
        """The attention's context as the block returns it: as it is (BERT), or through `o` (MPNet)."""
        return context

    def forward(self, hidden_states: Tensor, batch: Any) -> tuple[Tensor, Tensor | None]:
        way = self.kernel_way(hidden_states)
        if not way:
            return super().forward(hidden_states, batch)
        # Way NATIVE_ATTENTION, measured for a kernel of lower precision (bf16): attention computes on its products
        # as they are, where the batch's attention returns no probabilities (sdpa), in bf16 (torch's flash kernel:
        # fp32 sums and softmax); its context comes back in the block's dtype. Way 1 hands attention fp32.
        native = way == NATIVE_ATTENTION and self.kernel.run_native is not None and batch.implementation == "sdpa"
        projected = self.kernel.run_native(hidden_states, self._form) if native else self.project(hidden_states)
        query, key, value = projected.split([layer.out_features for layer in self.inner_modules()], -1)
        context, probabilities = batch.attend(
            query, key, value, num_heads=self.num_heads, scale=self.scale, dropout=0.0
        )
        return self.project_back(context.to(hidden_states.dtype)), probabilities

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

    @staticmethod
    def precision_candidates(heads: int, head_size: int, dtype: torch.dtype) -> list[Candidate]:
        """Attention on a lower-precision product's output (`Kernel.run_native`) computed in fp32 (candidate 0: the
        more accurate way stays unless the other is clearly faster) or in `dtype` as it is. Which is faster depends
        on the CPU: torch's flash kernel runs bf16 on AMX's tiles, but on a CPU without AMX (Zen 4) its bf16 products
        go through a slower path than its fp32 ones."""

        def make(native: bool) -> Candidate:
            def call(rows: int):
                batch, length = max(1, rows // 128), min(rows, 128)
                projected = torch.randn(batch, length, 3, heads, head_size).to(dtype)

                def attend() -> Tensor:
                    query, key, value = (projected if native else projected.float()).transpose(1, 3).unbind(2)
                    return F.scaled_dot_product_attention(query, key, value).float()

                return attend

            return call

        return [make(False), make(True)]


# FusedAttention's way that hands attention the kernel's own lower-precision output (`precision_candidates`).
NATIVE_ATTENTION = 2


class FusedSelfAttention(FusedAttention, BertSelfAttention):
    """BERT's `attention.self`: query, key and value in one product."""

    plain_class = BertSelfAttention
    projections = ("query", "key", "value")


class FusedMPNetSelfAttention(FusedAttention, MPNetSelfAttention):
    """MPNet's `attention.attn`: q, k and v in one product; `o` stays a layer of its own (packed or int8 as any
    other linear layer), called as a module so that its hooks and wrappers run."""

    plain_class = MPNetSelfAttention
    projections = ("q", "k", "v")

    def project_back(self, context: Tensor) -> Tensor:
        return self.o(context)


class FusedIntermediate(FusedBlock, BertIntermediate):
    plain_class = BertIntermediate

    def forward(self, hidden_states: Tensor) -> Tensor:
        way = self.kernel_way(hidden_states)
        if not way:
            return super().forward(hidden_states)
        if way == 1:
            return self.activation(self.kernel.run(hidden_states, self._form))
        # GELU as oneDNN's post-op: only offered for the erf form (`candidates`, `gelu_choice`)
        return self.kernel.run_gelu(hidden_states, self._form)

    @classmethod
    def from_block(cls, block: nn.Module, choice: tuple[int, ...], kernel: Kernel = WHOLE) -> FusedIntermediate:
        """`swap_in` for the feed-forward block, with its `choice` per row count and its product's `kernel`."""
        return cls.swap_in(block, _choice=choice, kernel=kernel)

    @staticmethod
    def gelu_choice(block: nn.Module) -> int:
        """The way to run at every row count for a kernel that always wins (bf16): GELU as its post-op where the
        block's activation is GELU's erf form, else the product and then the block's activation."""
        return 2 if block.activation is F.gelu else 1

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

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        way = self.kernel_way(hidden_states)
        if not way or residual.dtype != torch.float32:
            return super().forward(hidden_states, residual)
        if way == 1:
            return self.LayerNorm(self.kernel.run(hidden_states, self._form) + residual)
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        output = packed_product_add(rows, *self._form, residual.reshape(-1, residual.shape[-1]).contiguous())
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
    MPNetSelfAttention: FusedMPNetSelfAttention,
    BertIntermediate: FusedIntermediate,
    BertResidualOutput: FusedResidualOutput,
}


def block_candidates(block: nn.Module) -> tuple[tuple, list[Candidate]]:
    """A key naming `block`'s shape, and its ways of computing it, for `measured.measured_choice`."""
    projection = attention_projection(block)
    if projection is not None:
        hidden, projected = projection.in_features, projection.out_features
        return ("attention", hidden, projected), FusedAttention.candidates(hidden, projected)
    shape = (block.dense.in_features, block.dense.out_features)
    if isinstance(block, BertIntermediate):
        return ("intermediate", *shape, block.activation), FusedIntermediate.candidates(*shape, block.activation)
    return ("output", *shape), FusedResidualOutput.candidates(*shape)


def attention_projection(block: nn.Module) -> nn.Linear | None:
    """The first of the projections a fused attention block would compute in one product (BERT's `query`, MPNet's
    `q`), or None where `block` is no attention block that can be fused."""
    fused = FUSED_BLOCKS.get(type(block))
    return fused.linears(block)[0] if fused is not None and issubclass(fused, FusedAttention) else None


def fused_parameters(layers: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor]:
    """The weights and biases of layers computed as one product, concatenated along their outputs (zeros for a
    layer without a bias)."""
    if len(layers) == 1:  # no copy of a weight that is packed or quantized at once
        return layers[0].weight.detach(), _bias(layers[0])
    return torch.cat([layer.weight.detach() for layer in layers]), torch.cat([_bias(layer) for layer in layers])


def _bias(layer: nn.Linear) -> Tensor:
    return torch.zeros(layer.out_features) if layer.bias is None else layer.bias.detach()
