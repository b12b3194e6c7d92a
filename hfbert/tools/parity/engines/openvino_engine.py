"""OpenVINO: an IR `.xml` (its weights in the `.bin` beside it) on the CPU, at the f32 precision hint, or
(`precision="default"`) at the CPU's default precision, as a user who sets no hint gets it (bf16 on CPUs with
native bf16). The precision that ran is what the compiled model reports."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import Tensor

from hfbert.tools.parity.engines import base
from hfbert.tools.parity.engines.base import ArtifactError

NAME = "OpenVINO"


def accepts(path: Path) -> bool:
    return path.suffix == ".xml"


def graph_facts(model: Any) -> dict[str, Any]:
    """An approximate GELU (Gelu with approximation_mode TANH, or a FastGelu-like pattern converted from ONNX),
    int8 (FakeQuantize, or int8/uint8 weights) and the weights' precision (its Constants' element types, by number of
    values: "fp16" for an IR saved with save_model's default compress_to_fp16=True), from the IR's operations."""
    facts: dict[str, Any] = {}
    types: Counter = Counter()
    constants: Counter = Counter()  # values per element type
    for operation in model.get_ordered_ops():
        kind = operation.get_type_name()
        types[kind] += 1
        if kind == "Constant":
            element = operation.get_element_type().get_type_name()
            constants[element] += int(numpy.prod(list(operation.get_output_shape(0))))
            if element in ("i8", "u8", "i4", "u4"):
                facts["int8"] = ["int8 weights"]
        if kind == "Gelu" and str(operation.get_attributes().get("approximation_mode", "")).upper() == "TANH":
            facts.setdefault("approximate_gelu", []).append("Gelu(approximation_mode=TANH)")
        if kind == "FakeQuantize":
            facts["int8"] = ["FakeQuantize"]
    facts["operators"] = sorted(types)
    facts["weights"] = base.weight_precision(constants)
    if "approximate_gelu" in facts:
        facts["approximate_gelu"] = sorted(set(facts["approximate_gelu"]))
    return facts


def _numpy_type(port: Any) -> Any:
    """The integer type an input takes (an IR may take i32 token ids); int64 where it does not say."""
    try:
        kind = numpy.dtype(port.get_element_type().to_dtype())
    except Exception:
        return numpy.int64
    return kind if kind.kind in "iu" else numpy.int64


def _dims(shape: Any) -> list[int | None] | None:
    """An input's dims, None where free; None for an input of free rank."""
    if shape.rank.is_dynamic:
        return None
    return [dim.get_length() if dim.is_static else None for dim in shape]


def load(path: Path, hidden_size: int, threads: int, precision: str = "f32") -> base.ArtifactEngine:
    openvino = base.import_engine("openvino", NAME)
    core = openvino.Core()
    try:
        model = core.read_model(str(path))
    except Exception as error:
        reason = base.reason_of(error)
        raise ArtifactError(f"{path}: OpenVINO cannot read it as an IR ({reason}); expected a BERT encoder") from None
    try:
        inputs = [port.get_any_name() for port in model.inputs]
    except RuntimeError:
        raise ArtifactError(f"{path}: an input without a name; expected named BERT inputs") from None
    base.check_inputs(path, inputs)
    output_names = [sorted(port.get_names()) for port in model.outputs]
    index = next((i for i, names in enumerate(output_names) if "last_hidden_state" in names), 0)
    shape = model.outputs[index].get_partial_shape()
    if shape.rank.is_static and shape.rank.get_length() != 3:
        raise ArtifactError(f"{path}: its first output has rank {shape.rank}; expected (batch, sequence, hidden)")
    if shape.rank.is_static and shape[2].is_static:
        base.check_hidden_size(path, shape[2].get_length(), hidden_size)
    pooler = next((i for i, names in enumerate(output_names) if "pooler_output" in names), None)
    properties: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision != "default":
        properties["INFERENCE_PRECISION_HINT"] = precision
    facts = graph_facts(model)
    try:
        compiled = core.compile_model(model, "CPU", properties)
    except Exception as error:
        raise ArtifactError(f"{path}: OpenVINO cannot compile it for the CPU ({base.reason_of(error)})") from None
    ran = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    request = compiled.create_infer_request()
    ports = {port.get_any_name(): port for port in compiled.inputs}
    kinds = {name: _numpy_type(port) for name, port in ports.items()}

    fixed = {name: _dims(port.get_partial_shape()) for name, port in ports.items()}

    def feed(batch: dict[str, Tensor]) -> dict[str, numpy.ndarray]:
        return {name: batch[name].numpy().astype(kinds[name], copy=False) for name in inputs}

    def call(arrays: dict[str, numpy.ndarray]) -> dict[str, Tensor]:
        try:
            results = request.infer({ports[name]: array for name, array in arrays.items()})
        except Exception:
            base.check_shapes(fixed, arrays)
            raise
        named = {"last_hidden_state": torch.from_numpy(numpy.array(results[compiled.outputs[index]]))}
        if pooler is not None:
            named["pooler_output"] = torch.from_numpy(numpy.array(results[compiled.outputs[pooler]]))
        return named

    hint = f"precision hint {precision}" if precision != "default" else "no precision hint (the CPU's default)"
    int8 = " (int8 weights)" if "int8" in facts else ""
    weights = facts.pop("weights")
    return base.ArtifactEngine(
        path=path,
        engine=NAME,
        version=base.installed_version("openvino"),
        precision=f"{ran}{int8}",
        inputs=tuple(inputs),
        hidden_size=hidden_size,
        feed=feed,
        call=call,
        graph=facts,
        notes=[f"CPU, {hint}: inference precision {ran}"],
        weights=weights,
        weights_remedy="save the IR with openvino.save_model(..., compress_to_fp16=False) (True is its default)",
        native=compiled,
    )


def runtime_kernels(compiled: Any) -> str:
    """The kernels OpenVINO picked for its matrix multiplies and fused subgraphs (they name the instruction set). With
    dynamic shapes it picks them at the first call of each shape: ask after the runs."""
    kernels: Counter = Counter()
    for operation in compiled.get_runtime_model().get_ordered_ops():
        info = operation.get_rt_info()
        layer = info["layerType"].astype(str)
        if layer in ("FullyConnected", "MatMul", "Subgraph", "ScaledDotProductAttention"):
            kernels[f"{layer} {info['primitiveType'].astype(str)}"] += 1
    return ", ".join(f"{name} x{count}" for name, count in sorted(kernels.items()))
