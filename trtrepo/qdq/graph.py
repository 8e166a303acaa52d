"""The model-level helpers of the quantize stage around the ONNX graph (loading, opset, unique
node names, weights as inputs); the graph itself is read through :class:`trtrepo.onnxgraph.GraphView`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..modelio import normalize_weights
from ..onnxgraph import GraphView
from .options import MIN_OPSET

log = logging.getLogger(__name__)
def weights_as_inputs(model: Any) -> Any:
    """A copy of ``model`` whose initializers are graph inputs (name, type, shape) without data:
    what ``onnx.checker`` can check of a large model without serializing its weights (the
    checker refuses data-less initializers, which :func:`trtrepo.modelio.without_weights` makes
    for shape inference)."""
    import onnx
    from onnx import helper

    light = onnx.ModelProto()
    light.CopyFrom(onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import,
                                   producer_name=model.producer_name))
    light.functions.extend(model.functions)
    graph = light.graph
    graph.name = model.graph.name
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    declared = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        if t.name not in declared:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light


def weight_axis(view: GraphView, node: Any, weight_index: int) -> int | None:
    """The output-channel axis of a weight input, or None for per-tensor.

    Conv: 0 (``[Cout, Cin/g, k...]``); ConvTranspose: 1 (``[Cin, Cout/g, k...]``); Gemm: 0 with
    ``transB=1`` (``[N, K]``), else 1 (``[K, N]``); MatMul: the last axis of B (``[..., K, N]``).
    A weight in the A position of Gemm/MatMul is quantized per tensor."""
    op = node.op_type
    shape = view.constant_array(node.input[weight_index]).shape
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1 if len(shape) > 1 else None
    if op == "Gemm":
        if weight_index != 1:
            return None
        return 0 if view.attr(node, "transB", 0) else 1
    if op == "MatMul":
        if weight_index != 1 or len(shape) < 2:
            return None
        return len(shape) - 1
    return None


def _unique_node_names(model: Any) -> None:
    """Give every node a unique name (rules and exclusions refer to nodes by name)."""
    used: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        base, k = name, 1
        while name in used:
            name = f"{base}_{k}"
            k += 1
        node.name = name
        used.add(name)


def _ensure_opset(model: Any) -> Any:
    import onnx

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise UsageError("the model imports no default ONNX opset")
    if opset >= MIN_OPSET:
        return model
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, MIN_OPSET)
    except Exception as exc:
        raise UsageError(f"the model has opset {opset}; converting it to opset {MIN_OPSET} (needed for per-channel "
                         f"Q/DQ) failed: {exc}") from exc
    log.info("converted the model from opset %d to %d", opset, MIN_OPSET)
    return onnx.ModelProto.FromString(converted.SerializeToString())


def prepare_model(model: Any) -> Any:
    """A copy of ``model`` with opset >= 13 and unique node names (what the rules work on)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy = _ensure_opset(copy)
    _unique_node_names(copy)
    return copy


def decompose_inner_softmax(model: Any) -> int:
    """Rewrite, in place, each Softmax (opset >= 13) over an inner axis of a tensor of known rank as
    ``Exp(x - ReduceMax(x)) / ReduceSum(...)`` over that axis; the number rewritten.

    Decision: the same sums over the same values (the maximum subtracted, as Softmax does), and
    ONNX Runtime's CPU Softmax is fast on the last axis only, while its reductions over an inner
    axis and its elementwise ops run vectorized over the contiguous inner dimensions. YOLO's DFL
    softmax (``[N, 16, 4, anchors]`` over axis 1) took a quarter of a quantized YOLO11n's time as
    exported, about 12 ms of 155 ms at batch 8 as ``Transpose -> Softmax(last axis) -> Transpose``
    (the rewrite before this one), about 4 ms decomposed (figures in docs/benchmarks.md). Applied to
    the models the quantize stage writes for a target that runs ONNX Runtime kernels; the FP32
    reference is left as exported."""
    from onnx import helper, numpy_helper

    if not any(n.op_type == "Softmax" and any(a.name == "axis" and a.i != -1 for a in n.attribute)
               for n in model.graph.node):
        return 0  # every Softmax on the last axis already (-1, the default): no shape inference needed
    view = GraphView(model)  # a prepared model (prepare_model): opset >= 13, the axis semantics above
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    nodes, done = [], 0
    for node in model.graph.node:
        shape = view.shape.get(node.input[0]) if node.op_type == "Softmax" and node.input else None
        rank = len(shape) if shape else 0
        axis = view.attr(node, "axis", -1) if rank else None
        if not rank or axis is None or axis % rank == rank - 1:
            nodes.append(node)
            continue
        x, out, base = node.input[0], node.output[0], node.name
        axes = f"{out}_softmax_axes"
        model.graph.initializer.append(numpy_helper.from_array(np.array([axis % rank], np.int64), axes))
        # ReduceMax takes its axes as an input from opset 18 on, as an attribute before
        reduce_max = (helper.make_node("ReduceMax", [x, axes], [f"{out}_max"], keepdims=1, name=f"{base}_max")
                      if opset >= 18 else
                      helper.make_node("ReduceMax", [x], [f"{out}_max"], axes=[axis % rank], keepdims=1,
                                       name=f"{base}_max"))
        nodes += [reduce_max,
                  helper.make_node("Sub", [x, f"{out}_max"], [f"{out}_shifted"], name=f"{base}_shift"),
                  helper.make_node("Exp", [f"{out}_shifted"], [f"{out}_exp"], name=f"{base}_exp"),
                  helper.make_node("ReduceSum", [f"{out}_exp", axes], [f"{out}_sum"], keepdims=1, name=f"{base}_sum"),
                  helper.make_node("Div", [f"{out}_exp", f"{out}_sum"], [out], name=base)]
        done += 1
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return done


def drop_unused_initializers(model: Any) -> None:
    used = {n for node in model.graph.node for n in node.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
        graph_input_keep = [i for i in model.graph.input if i.name in used or i.name not in {t.name for t in keep}]
        del model.graph.input[:]
        model.graph.input.extend(graph_input_keep)


# --------------------------------------------------------------------------------------------
# Ranges from files


def load_model(path: str | Path) -> Any:
    import onnx

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: model file not found")
    try:
        model = onnx.load(str(p))
    except Exception as exc:
        raise UsageError(f"{p}: cannot read ONNX model ({type(exc).__name__}: {exc})") from exc
    for note in normalize_weights(model):  # other exporters' weight layouts (trtrepo.modelio)
        log.info("%s: %s", p.name, note)
    return model


def model_tensor_names(model: Any) -> set[str]:
    names = {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(o for o in node.output if o)
    return names
