"""Which tensors are calibrated (:func:`select_tensors`).

The float network inputs and the float inputs and outputs of Conv, ConvTranspose, Gemm, MatMul,
Add, pooling and activation ops, minus initializers and outputs of Constant nodes. These are the
tensors a TensorRT calibration cache needs for the layers that run in INT8.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..modelio import without_weights
from .weights import LARGE_TENSOR_BYTES

log = logging.getLogger(__name__)

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"})
ACTIVATION_OPS = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "Tanh", "Gelu", "Elu", "Selu", "Celu", "Clip",
    "HardSwish", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Softmax", "LogSoftmax",
})
CALIBRATED_OPS = COMPUTE_OPS | POOL_OPS | ACTIVATION_OPS
# Data inputs per op (others are weights, bias, shapes or attributes-as-inputs).
_DATA_INPUTS: dict[str, tuple[int, ...]] = {"Conv": (0,), "ConvTranspose": (0,), "Gemm": (0, 1), "MatMul": (0, 1),
                                            "Add": (0, 1), "PRelu": (0,), "Clip": (0,)}
_FLOAT_TYPES = {1: np.float32, 10: np.float16, 11: np.float64}  # ONNX elem types numpy can carry


def inferred_types(model: Any) -> dict[str, int]:
    """ONNX elem type of every named value, from the graph and from shape inference."""
    import onnx

    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weights(model, LARGE_TENSOR_BYTES), strict_mode=False)
    except Exception as exc:  # inference is best effort; declared types still count
        log.warning("ONNX shape inference failed (%s); using declared types only", exc)
        inferred = model
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def select_tensors(model: Any, op_types: Sequence[str] | None = None) -> list[str]:
    """Names of the tensors to calibrate in ``model`` (an ONNX ModelProto), in graph order."""
    graph = model.graph
    ops = frozenset(op_types) if op_types is not None else CALIBRATED_OPS
    constant = {init.name for init in graph.initializer}
    constant |= {out for node in graph.node if node.op_type in ("Constant", "ConstantOfShape") for out in node.output}
    types = inferred_types(model)
    chosen: dict[str, None] = {}

    def add(name: str) -> None:
        if not name or name in constant or name in chosen:
            return
        if types.get(name) in _FLOAT_TYPES:
            chosen[name] = None
        elif name not in types:
            log.info("tensor '%s' has no known type; not calibrated", name)

    for vi in graph.input:
        add(vi.name)
    for node in graph.node:
        if node.op_type not in ops:
            continue
        for i in _DATA_INPUTS.get(node.op_type, (0,)):
            if i < len(node.input):
                add(node.input[i])
        for out in node.output[:1]:
            add(out)
    return list(chosen)


def tensor_names(model: Any) -> set[str]:
    """Every named value of the graph (inputs, initializers, node outputs)."""
    graph = model.graph
    names = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    names |= {out for node in graph.node for out in node.output}
    return names
