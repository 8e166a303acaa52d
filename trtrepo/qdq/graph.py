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


def softmax_on_last_axis(model: Any) -> int:
    """Rewrite, in place, each Softmax (opset >= 13) over an inner axis of a tensor of known rank as
    ``Transpose -> Softmax(axis=-1) -> Transpose`` back; the number rewritten. When the axis has a
    static size ``C`` the Softmax runs on a ``[-1, C]`` view (``Reshape`` before, and back to the
    transposed shape after).

    Decision: the same sums over the same values, and ONNX Runtime's CPU Softmax is fast on the
    last axis only (YOLO's DFL softmax, ``[N, 16, 4, anchors]`` over axis 1, is a large share of a
    quantized YOLO's time; figures in docs/benchmarks.md). The 2-D view keeps ONNX Runtime's
    transpose optimizer from pushing the Transposes back through the Softmax (it would, and the
    Softmax would run on an inner axis again). Applied to the models the quantize stage writes for
    a target that runs ONNX Runtime kernels; the FP32 reference is left as exported."""
    from onnx import helper, numpy_helper

    if not any(n.op_type == "Softmax" and any(a.name == "axis" and a.i != -1 for a in n.attribute)
               for n in model.graph.node):
        return 0  # every Softmax on the last axis already (-1, the default): no shape inference needed
    view = GraphView(model)  # a prepared model (prepare_model): opset >= 13, the axis semantics above
    nodes, done = [], 0
    for node in model.graph.node:
        shape = view.shape.get(node.input[0]) if node.op_type == "Softmax" and node.input else None
        rank = len(shape) if shape else 0
        axis = view.attr(node, "axis", -1) if rank else None
        if not rank or axis is None or axis % rank == rank - 1:
            nodes.append(node)
            continue
        assert shape is not None
        k = axis % rank
        perm = [i for i in range(rank) if i != k] + [k]
        back = [perm.index(i) for i in range(rank)]
        out = node.output[0]
        moved, result = f"{out}_last_axis", f"{out}_softmax_last_axis"
        nodes.append(helper.make_node("Transpose", [node.input[0]], [moved], perm=perm, name=f"{node.name}_to_last_axis"))
        if shape[k]:
            flat_shape = f"{out}_rows_shape"
            model.graph.initializer.append(numpy_helper.from_array(np.array([-1, shape[k]], np.int64), flat_shape))
            nodes += [helper.make_node("Shape", [moved], [f"{moved}_shape"], name=f"{node.name}_shape"),
                      helper.make_node("Reshape", [moved, flat_shape], [f"{moved}_rows"], name=f"{node.name}_rows"),
                      helper.make_node("Softmax", [f"{moved}_rows"], [f"{result}_rows"], axis=-1, name=node.name),
                      helper.make_node("Reshape", [f"{result}_rows", f"{moved}_shape"], [result],
                                       name=f"{node.name}_unrows")]
        else:
            nodes.append(helper.make_node("Softmax", [moved], [result], axis=-1, name=node.name))
        nodes.append(helper.make_node("Transpose", [result], [out], perm=back, name=f"{node.name}_from_last_axis"))
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
