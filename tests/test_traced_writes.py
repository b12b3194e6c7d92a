"""Every way users trace a model records the computation the eager model runs: each member exported with both ONNX
exporters (run in ONNX Runtime) and `torch.export`, and compiled with `torch.compile`, under `torch.no_grad()` and
with gradients enabled, compared element-wise with transformers' model on the same checkpoint.

The class of defect: a write into a view or a slice of a buffer (`out=`, `x[...] = `, `copy_`, in-place ops on a
slice). Eager PyTorch runs it; the TorchScript ONNX exporter can drop it from the graph (the artifact then computes
with the buffer's uninitialised or zero contents, silently), and AOTAutograd can refuse it. ModernBERT's rotary
embeddings wrote their two halves with `out=` into slices of an empty buffer whenever no gradient was recorded:
under `torch.no_grad()` the ONNX graph rotated nothing and `torch.compile` raised an IndexError, while with
gradients (another code path) both were right.

The family's forward paths have no such write left (`rotary.rotate` computes both halves in one new tensor); these tests
keep it so. Each tracer sees a right-padded batch (its pads zero in hfbert's outputs, as documented) and an unpadded
one of the same shape.

Exports and compilations take seconds each on 2 cores: the matrix is `slow`. The fast twins in the default run are
the two tracers that failed: ModernBERT through the TorchScript ONNX exporter under no_grad, and `rotate` through
`torch.compile` (the `aot_eager` backend: no C++ compiler needed) under no_grad.

Two more defects of the same kind of check, not writes: MPNet's ONNX export (dynamo) with gradients enabled failed
in the exporter's decomposition of sdpa (`attention.multi_head_attention` copies explicitly while exporting), and
ModernBERT exported with a dynamic sequence took its band (a per-length choice) into the graph (the last test).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import pytest
import torch

import hfbert
from hfbert.modeling.rotary import rotary_tables, rotate

from support.helpers import max_difference
from support.members import MODEL_TYPES, reference_checkpoint

TRACERS = ("onnx-dynamo", "onnx-torchscript", "torch.export", "torch.compile")
GRAD_MODES = ("no_grad", "grad")
SEQUENCE = 12  # wider than ModernBERT's tiny window (2 columns each side): its local layer differs from a global one
TOLERANCE = 1e-5  # from transformers' float32 outputs, at real tokens (every member and tracer stays under 1e-6)


class Encoder(torch.nn.Module):
    """Tensors in, the last hidden state out: what exporters and tracers take."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def batches() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """A right-padded batch (one full row, one with 7 real tokens) and an unpadded one, both (2, SEQUENCE)."""
    input_ids = torch.randint(3, 99, (2, SEQUENCE), generator=torch.Generator().manual_seed(1))
    right_padded = torch.ones(2, SEQUENCE, dtype=torch.long)
    right_padded[1, 7:] = 0
    return {"right-padded": (input_ids, right_padded), "unpadded": (input_ids, torch.ones_like(right_padded))}


def grad_mode(mode: str) -> contextlib.AbstractContextManager:
    return torch.no_grad() if mode == "no_grad" else torch.enable_grad()


def pair(directory: Path, model_type: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """hfbert's and transformers' base models of `model_type` on one checkpoint written by transformers."""
    import transformers

    transformers.logging.set_verbosity_error()
    if not (directory / "config.json").exists():
        reference_checkpoint(directory, model_type)
    return hfbert.AutoModel.from_pretrained(directory).eval(), transformers.AutoModel.from_pretrained(directory).eval()


def run_onnx(path: Path, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    return torch.from_numpy(output)


def traced_outputs(tracer: str, model: torch.nn.Module, mode: str, directory: Path) -> dict[str, torch.Tensor]:
    """`model` traced by `tracer` on the right-padded batch under `mode` ("no_grad" or "grad"), then run in that
    mode (ONNX: in ONNX Runtime) on each of `batches()`; the outputs by batch name."""
    encoder, inputs = Encoder(model).eval(), batches()
    example = inputs["right-padded"]
    with grad_mode(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings and the TorchScript exporter's deprecation
        if tracer.startswith("onnx"):
            path = directory / f"{tracer}-{mode}.onnx"
            names = dict(input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"])
            if tracer == "onnx-dynamo":
                torch.onnx.export(encoder, example, path, dynamo=True, **names)
            else:
                torch.onnx.export(encoder, example, path, dynamo=False, opset_version=17, **names)
            return {name: run_onnx(path, *batch) for name, batch in inputs.items()}
        if tracer == "torch.export":
            traced = torch.export.export(encoder, example).module()
        else:
            torch._dynamo.reset()
            traced = torch.compile(encoder)
        return {name: traced(*batch).detach() for name, batch in inputs.items()}


def differences(tracer: str, model_type: str, mode: str, directory: Path) -> dict[str, tuple[float, float]]:
    """Per batch: the traced model's max abs difference from transformers at real tokens, and its largest pad value."""
    ours, theirs = pair(directory, model_type)
    outputs = traced_outputs(tracer, ours, mode, directory)
    found = {}
    for name, (input_ids, attention_mask) in batches().items():
        with torch.no_grad():
            reference = theirs(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        real = attention_mask.bool()
        pads = float(outputs[name][~real].abs().max()) if (~real).any() else 0.0
        found[name] = (max_difference(outputs[name], reference, real), pads)
    return found


def check(tracer: str, model_type: str, mode: str, directory: Path) -> None:
    for name, (difference, pads) in differences(tracer, model_type, mode, directory).items():
        assert difference <= TOLERANCE, f"{model_type} {tracer} {mode} {name}: {difference:.3g} from transformers"
        assert pads == 0.0, f"{model_type} {tracer} {mode} {name}: pad positions are not zero ({pads:.3g})"


def needs_onnx(tracer: str) -> None:
    if tracer.startswith("onnx"):
        for package in ("onnx", "onnxruntime", "onnxscript"):
            pytest.importorskip(package, reason="ONNX export needs the onnx extra: pip install 'hfbert[onnx]'")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("traced-writes")


# -- the fast twins: the two tracers that failed, on ModernBERT ---------------------------------------------------


def test_modernbert_through_the_torchscript_onnx_exporter_under_no_grad_matches_transformers(checkpoints):
    needs_onnx("onnx-torchscript")
    check("onnx-torchscript", "modernbert", "no_grad", checkpoints / "modernbert")


def test_rotate_through_aot_autograd_under_no_grad_matches_transformers():
    """`torch.compile` refused the rotation's `out=` writes into slices (dynamo under `fullgraph`, AOTAutograd with
    an IndexError in a whole model)."""
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, 2, 5, 3, 8, generator=generator).unbind(0)  # (batch, sequence, heads, head_size)
    cos, sin = rotary_tables(torch.arange(5)[None], head_size=8, theta=10_000.0, dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: rotate(x, cos, sin), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        ours = compiled(query), compiled(key)
        theirs = apply_rotary_pos_emb(query, key, cos, sin, unsqueeze_dim=2)  # the tables broadcast over heads
    for mine, reference in zip(ours, theirs, strict=True):
        assert max_difference(mine, reference) <= 1e-6


# -- the matrix: every member under every tracer, in both grad modes ----------------------------------------------


@pytest.mark.slow  # an export or a compilation per case, seconds to tens of seconds on 2 cores
@pytest.mark.parametrize("mode", GRAD_MODES)
@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_traced_model_matches_transformers(model_type, tracer, mode, checkpoints):
    needs_onnx(tracer)
    check(tracer, model_type, mode, checkpoints / model_type)


# -- one graph for every length: ModernBERT's band --------------------------------------------------------------


@pytest.mark.slow  # three exports per case
@pytest.mark.parametrize("example_length", [12, 30])  # below and past the band threshold (24 columns, tiny config)
@pytest.mark.parametrize("tracer", ["onnx-torchscript", "onnx-dynamo", "torch.export"])
def test_modernbert_exported_with_a_dynamic_sequence_serves_every_length(tracer, example_length, checkpoints):
    """An exported graph serves every length of its dynamic axis, so the choice between dense and banded local
    attention, made per call in eager, cannot be baked into it: the graph takes the dense computation, right at
    every length. (The band refused torch.export's dynamic sequence at any example, failed the TorchScript exporter
    on `unfold`, and gave an ONNX graph that failed at other lengths.)"""
    needs_onnx(tracer)
    ours, theirs = pair(checkpoints / "modernbert", "modernbert")
    encoder = Encoder(ours).eval()

    def batch(length: int, real: int) -> tuple[torch.Tensor, torch.Tensor]:
        input_ids = torch.randint(3, 99, (2, length), generator=torch.Generator().manual_seed(length))
        attention_mask = torch.ones_like(input_ids)
        attention_mask[1, real:] = 0
        return input_ids, attention_mask

    example, lengths = batch(example_length, example_length - 5), {12: batch(12, 7), 30: batch(30, 18)}
    sequence = torch.export.Dim("sequence", min=2, max=38)
    shapes = ({1: sequence}, {1: sequence})
    path = checkpoints / f"dynamic-{tracer}-{example_length}.onnx"
    names = dict(input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if tracer == "torch.export":
            run = torch.export.export(encoder, example, dynamic_shapes=shapes).module()
        else:
            if tracer == "onnx-dynamo":
                torch.onnx.export(encoder, example, path, dynamo=True, dynamic_shapes=shapes, **names)
            else:
                axes = {name: {0: "batch", 1: "sequence"} for name in names["input_names"]}
                torch.onnx.export(encoder, example, path, dynamo=False, opset_version=17, dynamic_axes=axes, **names)

            def run(input_ids, attention_mask):
                return run_onnx(path, input_ids, attention_mask)

        for length, (input_ids, attention_mask) in lengths.items():
            reference = theirs(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            difference = max_difference(run(input_ids, attention_mask), reference, attention_mask.bool())
            assert difference <= TOLERANCE, f"{tracer}, exported at {example_length}, run at {length}: {difference:.3g}"
