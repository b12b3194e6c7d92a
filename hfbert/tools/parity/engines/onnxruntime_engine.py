"""ONNX Runtime: a `.onnx` file on the CPU provider, inputs matched by name, `last_hidden_state` (by name, else the
first output) and `pooler_output` where the graph has one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from hfbert.tools.parity.engines.base import (
    ArtifactEngine,
    ArtifactError,
    check_hidden_size,
    check_inputs,
    import_engine,
    installed_version,
    reason_of,
)

NAME = "ONNX Runtime"
# Operators that compute GELU's tanh approximation instead of erf (ORT's optimizer writes FastGelu with
# enable_gelu_approximation; opset 20's Gelu takes approximate="tanh").
APPROXIMATE_GELU = ("FastGelu", "BiasFastGelu", "QuickGelu")
# Dynamic int8: activations quantized to uint8 at run time, weights int8 (quantize_dynamic's default, QUInt8 x QInt8).
INT8_OPERATORS = ("DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "QGemm")


def accepts(path: Path) -> bool:
    return path.suffix == ".onnx"


def graph_facts(path: Path) -> dict[str, Any]:
    """What the graph computes, where it shows in its operators: an approximate GELU, int8 products."""
    try:
        import onnx
    except ImportError:
        return {}
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return {}
    nodes = list(model.graph.node)
    for function in model.functions:
        nodes += list(function.node)
    operators = {node.op_type for node in nodes}
    approximate = sorted(operators & set(APPROXIMATE_GELU))
    for node in nodes:
        if node.op_type == "Gelu" and any(a.name == "approximate" and a.s == b"tanh" for a in node.attribute):
            approximate.append("Gelu(approximate='tanh')")
    int8 = sorted(operators & set(INT8_OPERATORS))
    float16 = any(tensor.data_type == onnx.TensorProto.FLOAT16 for tensor in model.graph.initializer)
    facts: dict[str, Any] = {"operators": sorted(operators)}
    if approximate:
        facts["approximate_gelu"] = approximate
    if int8:
        facts["int8"] = int8
    if float16:
        facts["float16"] = True
    return facts


def load(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> ArtifactEngine:
    onnxruntime = import_engine("onnxruntime", NAME)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3  # no warnings about unused initializers on stderr
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        reason = reason_of(error)
        raise ArtifactError(
            f"{path}: ONNX Runtime cannot load it as a model ({reason}); expected a BERT encoder graph"
        ) from None
    inputs = [node.name for node in session.get_inputs()]
    check_inputs(path, inputs)
    outputs = session.get_outputs()
    names = [node.name for node in outputs]
    last = "last_hidden_state" if "last_hidden_state" in names else names[0]
    shape = next(node.shape for node in outputs if node.name == last)
    if len(shape) != 3:
        raise ArtifactError(
            f"{path}: output {last!r} has {len(shape)} dimensions; expected last_hidden_state (batch, sequence, hidden)"
        )
    check_hidden_size(path, shape[-1], hidden_size, last)
    kinds = {"tensor(int64)": numpy.int64, "tensor(int32)": numpy.int32}
    types = {}
    for node in session.get_inputs():
        if node.type not in kinds:
            raise ArtifactError(f"{path}: input {node.name} is {node.type}; expected integer token ids (int64, int32)")
        types[node.name] = kinds[node.type]
    facts = graph_facts(path)
    precision_ran = "int8 (dynamic, u8 x s8)" if "int8" in facts else ("fp16" if facts.get("float16") else "fp32")
    wanted = [last] + (["pooler_output"] if "pooler_output" in names and last != "pooler_output" else [])

    def forward(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        feed = {name: batch[name].numpy().astype(types[name]) for name in inputs}
        values = session.run(wanted, feed)
        named = ("last_hidden_state", "pooler_output")
        return {name: torch.from_numpy(numpy.asarray(value)) for name, value in zip(named, values, strict=False)}

    return ArtifactEngine(
        path=path,
        engine=NAME,
        version=installed_version("onnxruntime"),
        precision=precision_ran,
        inputs=tuple(inputs),
        hidden_size=hidden_size,
        graph=facts,
        forward=forward,
        notes=[f"CPUExecutionProvider, graph optimizations {options.graph_optimization_level.name}"],
    )
