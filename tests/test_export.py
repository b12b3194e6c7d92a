"""torch.compile, torch.export, torch.jit.trace and ONNX on the padded path, each checked against transformers.

Slow (compilation takes a while on 2 cores): marked `slow`; CI runs them.
"""

from __future__ import annotations

import pytest
import torch

import hfbert

from support.helpers import max_difference, minilm_directory

pytestmark = pytest.mark.slow

IDS = torch.tensor([[101, 7592, 1010, 2088, 999, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 6251, 1012, 102]])
MASK = (IDS != 0).long()
LONGER_IDS = torch.tensor([[101, 2307, 2154, 102, 0, 0, 0, 0, 0, 0, 0], [101] + [2000 + i for i in range(9)] + [102]])
LONGER_MASK = (LONGER_IDS != 0).long()


@pytest.fixture(scope="module")
def reference():
    import transformers

    model = transformers.BertModel.from_pretrained(minilm_directory()).eval()

    def run(input_ids, attention_mask=None):
        with torch.no_grad():
            return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return run


@pytest.fixture(scope="module")
def model():
    return hfbert.BertModel.from_pretrained(minilm_directory())


class Encoder(torch.nn.Module):
    """Tensors in, the last hidden state out: what tracers and exporters want."""

    def __init__(self, bert: hfbert.BertModel) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def close(ours, theirs, mask, tolerance=1e-5) -> bool:
    real = mask.bool() if mask is not None else None
    return max_difference(ours, theirs, real) <= tolerance


def test_compile_fullgraph_dynamic(model, reference):
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)  # fullgraph: any graph break is an error
    with torch.no_grad():
        for ids, mask in ((IDS, MASK), (LONGER_IDS, LONGER_MASK), (IDS, None)):
            output = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            assert close(output, reference(ids, mask), mask)


def test_torch_export(model, reference):
    batch = torch.export.Dim("batch", min=1, max=64)
    sequence = torch.export.Dim("sequence", min=2, max=512)
    exported = torch.export.export(
        model,
        args=(),
        kwargs={"input_ids": IDS, "attention_mask": MASK, "return_dict": False},
        dynamic_shapes={
            "input_ids": {0: batch, 1: sequence},
            "attention_mask": {0: batch, 1: sequence},
            "return_dict": None,
        },
    )
    for ids, mask in ((IDS, MASK), (LONGER_IDS, LONGER_MASK)):
        with torch.no_grad():
            output = exported.module()(input_ids=ids, attention_mask=mask, return_dict=False)[0]
        assert close(output, reference(ids, mask), mask)


@pytest.mark.parametrize("with_mask", [True, False])
def test_jit_trace(with_mask, model, reference):
    with torch.no_grad():
        if with_mask:
            traced = torch.jit.trace(Encoder(model).eval(), (IDS, MASK))
            outputs = [(traced(ids, mask), ids, mask) for ids, mask in ((IDS, MASK), (LONGER_IDS, LONGER_MASK))]
        else:
            traced = torch.jit.trace(Encoder(model).eval(), (IDS,))
            outputs = [(traced(ids), ids, None) for ids in (IDS, LONGER_IDS)]
    for output, ids, mask in outputs:
        assert close(output, reference(ids, mask), mask)


def test_onnx_matches_in_onnxruntime(model, reference, tmp_path):
    onnxruntime = pytest.importorskip(
        "onnxruntime", reason="ONNX export needs the onnx extra: pip install 'hfbert[onnx]'"
    )
    pytest.importorskip("onnxscript", reason="ONNX export needs the onnx extra: pip install 'hfbert[onnx]'")
    path = tmp_path / "minilm.onnx"
    batch = torch.export.Dim("batch", min=1, max=64)
    sequence = torch.export.Dim("sequence", min=2, max=512)
    torch.onnx.export(
        Encoder(model).eval(),
        (IDS, MASK),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}},
        dynamo=True,
    )
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for ids, mask in ((IDS, MASK), (LONGER_IDS, LONGER_MASK)):
        (output,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        assert close(torch.from_numpy(output), reference(ids, mask), mask, tolerance=1e-4)
