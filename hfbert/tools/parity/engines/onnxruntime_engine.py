"""ONNX Runtime: a `.onnx` file on the CPU provider, inputs matched by name, `last_hidden_state` (by name, else the
first output) and `pooler_output` where the graph has one."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from hfbert.tools.parity.engines import base
from hfbert.tools.parity.engines.base import ArtifactError

NAME = "ONNX Runtime"
# Operators that compute GELU's tanh approximation instead of erf (ORT's optimizer writes FastGelu with
# enable_gelu_approximation; opset 20's Gelu takes approximate="tanh").
APPROXIMATE_GELU = ("FastGelu", "BiasFastGelu", "QuickGelu")
# Dynamic int8: activations quantized to uint8 at run time, weights int8 (quantize_dynamic's default, QUInt8 x QInt8).
INT8_OPERATORS = ("DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "QGemm")

NODE_FAILURE = re.compile(r"running (?P<op>\w+) node\. Name:'(?P<name>[^']*)' Status Message: (?P<message>.*)", re.S)


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
    facts: dict[str, Any] = {
        "operators": sorted(operators),
        "weights": base.weight_precision(_stored_values(onnx, model)),
    }
    if approximate:
        facts["approximate_gelu"] = approximate
    if int8:
        facts["int8"] = int8
    if float16:
        facts["float16"] = True
    return facts


def _stored_values(onnx: Any, model: Any) -> dict[str, int]:
    """The number of values per element type of the graph's initializers and Constant nodes (external data is not
    read: the dims are in the graph)."""
    names = {
        onnx.TensorProto.DOUBLE: "float64",
        onnx.TensorProto.FLOAT: "float32",
        onnx.TensorProto.FLOAT16: "float16",
        onnx.TensorProto.BFLOAT16: "bfloat16",
        onnx.TensorProto.INT16: "int16",
        onnx.TensorProto.INT8: "int8",
        onnx.TensorProto.UINT8: "uint8",
    }
    tensors = list(model.graph.initializer)
    constants = [node for node in model.graph.node if node.op_type == "Constant"]
    tensors += [attribute.t for node in constants for attribute in node.attribute if attribute.name == "value"]
    counts: dict[str, int] = {}
    for tensor in tensors:
        if tensor.data_type in names:
            kind = names[tensor.data_type]
            counts[kind] = counts.get(kind, 0) + int(numpy.prod(list(tensor.dims)))
    return counts


def load(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> base.ArtifactEngine:
    onnxruntime = base.import_engine("onnxruntime", NAME)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    # No warnings about unused initializers on stderr, nor error lines: every error reaches the report as an exception.
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        reason = base.reason_of(error)
        raise ArtifactError(
            f"{path}: ONNX Runtime cannot load it as a model ({reason}); expected a BERT encoder graph"
        ) from None
    inputs = [node.name for node in session.get_inputs()]
    base.check_inputs(path, inputs)
    outputs = session.get_outputs()
    names = [node.name for node in outputs]
    last = "last_hidden_state" if "last_hidden_state" in names else names[0]
    shape = next(node.shape for node in outputs if node.name == last)
    if len(shape) != 3:
        raise ArtifactError(
            f"{path}: output {last!r} has {len(shape)} dimensions; expected last_hidden_state (batch, sequence, hidden)"
        )
    base.check_hidden_size(path, shape[-1], hidden_size, last)
    kinds = {"tensor(int64)": numpy.int64, "tensor(int32)": numpy.int32}
    types = {}
    for node in session.get_inputs():
        if node.type not in kinds:
            raise ArtifactError(f"{path}: input {node.name} is {node.type}; expected integer token ids (int64, int32)")
        types[node.name] = kinds[node.type]
    facts = graph_facts(path)
    weights = facts.pop("weights", "")
    precision_ran = "int8 (dynamic, u8 x s8)" if "int8" in facts else ("fp16" if facts.get("float16") else "fp32")
    wanted = [last] + (["pooler_output"] if "pooler_output" in names and last != "pooler_output" else [])

    fixed = {node.name: [d if isinstance(d, int) else None for d in node.shape] for node in session.get_inputs()}

    def feed(batch: dict[str, Tensor]) -> dict[str, numpy.ndarray]:
        return {name: batch[name].numpy().astype(types[name]) for name in inputs}

    def call(arrays: dict[str, numpy.ndarray]) -> dict[str, Tensor]:
        try:
            values = session.run(wanted, arrays)
        except Exception as error:
            base.check_shapes(fixed, arrays)
            # "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while running Gather node.
            # Name:'...' Status Message: ...": the node and its message, which the prefix would push past a line.
            failed = NODE_FAILURE.search(str(error))
            if failed is None:
                raise
            raise ArtifactError(f"{failed['op']} node {failed['name']}: {failed['message']}") from None
        named = ("last_hidden_state", "pooler_output")
        return {name: torch.from_numpy(numpy.asarray(value)) for name, value in zip(named, values, strict=False)}

    return base.ArtifactEngine(
        path=path,
        engine=NAME,
        version=base.installed_version("onnxruntime"),
        precision=precision_ran,
        inputs=tuple(inputs),
        hidden_size=hidden_size,
        graph=facts,
        feed=feed,
        call=call,
        notes=[f"CPUExecutionProvider, graph optimizations {options.graph_optimization_level.name}"],
        weights=weights,
        weights_remedy="export the graph with float32 weights (no float16 conversion)",
        native=session,
    )
