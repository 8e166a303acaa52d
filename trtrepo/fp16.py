"""Mixed INT8 + FP16: convert the unquantized part of an ONNX graph to float16.

TensorRT 11 has no FP16 builder flag: a strongly typed network runs each layer in the type the
graph gives it, so "INT8 where quantized, FP16 elsewhere" must be written into the ONNX model.
:func:`convert_to_fp16` does that:

* every float32 initializer and ``Constant``/``ConstantOfShape`` value becomes float16, clamped
  to the float16 range (an additive attention mask's ``finfo(float32).min`` becomes -65504
  instead of -inf, which would turn ``0 * mask`` into NaN);
* Q/DQ scales become float16 too, so DequantizeLinear outputs float16 and the INT8 layers feed
  FP16 ones directly (needs opset 19; older models are converted with ``onnx.version_converter``);
* ``Cast(to=FLOAT)`` inside the graph casts to FLOAT16;
* a Resize's ``scales`` stay float32 (the operator allows no other type): a Cast back follows the
  converted constant;
* float32 network inputs and outputs keep their type: a Cast to float16 follows each input and a
  Cast to float32 precedes each output, so clients and Triton configs are unchanged.

Ops listed in ``keep_fp32_ops`` (and nodes named in ``keep_fp32_nodes``) keep float32 with
Casts around them. ONNX Runtime 1.31 runs the result on the CPU, which is how its accuracy is
measured here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import UsageError
from .fsutil import atomic_path
from .modelio import load_onnx

log = logging.getLogger(__name__)

FP16_MAX = float(np.finfo(np.float16).max)
MIN_QDQ_FP16_OPSET = 19
# Ops whose float inputs stay float32 by default: reductions of many values and normalisation
# statistics overflow or lose precision in float16 (TensorRT keeps LayerNorm in FP32 as well
# unless told otherwise).
DEFAULT_KEEP_FP32_OPS: tuple[str, ...] = ()


def _fp16_array(arr: np.ndarray) -> np.ndarray:
    out = np.clip(arr.astype(np.float64), -FP16_MAX, FP16_MAX).astype(np.float16)
    return out


def convert_to_fp16(
    model: Any,
    *,
    keep_fp32_ops: Iterable[str] = DEFAULT_KEEP_FP32_OPS,
    keep_fp32_nodes: Iterable[str] = (),
) -> Any:
    """Return a float16 copy of ``model`` (an ``onnx.ModelProto``) with float32 IO kept."""
    import onnx

    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    model = _with_fp16_qdq_opset(model_copy)
    types = _elem_types(model)
    graph = model.graph
    keep_ops = set(keep_fp32_ops)
    keep_nodes = set(keep_fp32_nodes)

    fp32_inits = _initializers_to_fp16(graph)
    _constants_and_casts_to_fp16(graph)
    cast = _CastMaker()
    new_nodes, rename = _cast_inputs_down(graph, fp32_inits, cast)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        new_nodes.extend(_resize_scales_up(node, cast))
        if node.op_type in keep_ops or node.name in keep_nodes:
            new_nodes.extend(_kept_fp32(node, types, cast))
        else:
            new_nodes.append(node)
    _cast_outputs_up(graph, new_nodes)

    del graph.node[:]
    graph.node.extend(new_nodes)
    # value_info types are stale now; shape inference recomputes them
    del graph.value_info[:]
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # pragma: no cover - inference is best effort
        log.warning("shape inference after float16 conversion failed: %s", exc)
    return model


def _with_fp16_qdq_opset(model: Any) -> Any:
    """Decision: a model with Q/DQ below opset 19 is converted to opset 19 (float16 scales need
    it; IR version at least 9); any other model is returned as is. A model without a
    default-domain opset is refused."""
    import onnx

    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if default_opset is None:
        raise UsageError("model has no default-domain opset import")
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    if not has_qdq or default_opset >= MIN_QDQ_FP16_OPSET:
        return model
    ir = model.ir_version
    try:
        model = onnx.version_converter.convert_version(model, MIN_QDQ_FP16_OPSET)
    except Exception as exc:
        raise UsageError(f"cannot convert the model to opset {MIN_QDQ_FP16_OPSET} for float16 Q/DQ scales: {exc}") from exc
    model.ir_version = max(ir, 9)
    return model


def _initializers_to_fp16(graph: Any) -> set[str]:
    """Every float32 initializer becomes float16 (clamped); returns their names."""
    from onnx import TensorProto, numpy_helper

    fp32_inits = set()
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(_fp16_array(arr), init.name))
            fp32_inits.add(init.name)
    return fp32_inits


def _constants_and_casts_to_fp16(graph: Any) -> None:
    """Float32 ``Constant``/``ConstantOfShape`` tensors become float16 (clamped) and
    ``Cast(to=FLOAT)`` casts to FLOAT16; a Constant given as ``value_float(s)`` is refused."""
    import onnx
    from onnx import TensorProto, numpy_helper

    for node in graph.node:
        if node.op_type in ("Constant", "ConstantOfShape"):
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                    attr.t.CopyFrom(numpy_helper.from_array(_fp16_array(numpy_helper.to_array(attr.t)), attr.t.name))
                elif attr.name in ("value_float", "value_floats"):
                    raise UsageError(f"node '{node.name}': Constant with {attr.name} is not supported by the float16 conversion")
        elif node.op_type == "Cast":
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16


class _CastMaker:
    """Cast nodes with numbered, unique output and node names."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, src: str, to: int, hint: str) -> tuple[str, Any]:
        from onnx import TensorProto, helper

        self.count += 1
        dst = f"{src}__{'fp16' if to == TensorProto.FLOAT16 else 'fp32'}_{self.count}"
        return dst, helper.make_node("Cast", [src], [dst], to=to, name=f"{hint}_cast_{self.count}")


def _cast_inputs_down(graph: Any, fp32_inits: set[str], cast: _CastMaker) -> tuple[list[Any], dict[str, str]]:
    """A Cast to float16 right after each float32 graph input (clients keep sending float32);
    returns the Casts and input name -> float16 name."""
    from onnx import TensorProto

    new_nodes: list[Any] = []
    rename: dict[str, str] = {}
    for vi in graph.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT and vi.name not in fp32_inits:
            dst, node = cast(vi.name, TensorProto.FLOAT16, "input")
            new_nodes.append(node)
            rename[vi.name] = dst
    return new_nodes, rename


def _resize_scales_up(node: Any, cast: _CastMaker) -> list[Any]:
    """Decision: a Resize's ``scales`` are float32 by the operator's type constraint (a YOLO
    neck's upsample), so a Cast back to float32 feeds them; other nodes get nothing."""
    from onnx import TensorProto

    if not (node.op_type == "Resize" and len(node.input) > 2 and node.input[2]):
        return []
    dst, c = cast(node.input[2], TensorProto.FLOAT, f"{node.name}_scales")
    node.input[2] = dst
    return [c]


def _kept_fp32(node: Any, types: dict[str, int], cast: _CastMaker) -> list[Any]:
    """A node kept in float32: its originally-float32 inputs cast up, the node, and its float32
    outputs cast back down to float16 under their original names."""
    from onnx import TensorProto, helper

    out: list[Any] = []
    for i, name in enumerate(node.input):
        original = name.split("__fp16_")[0]
        if name and types.get(original) == TensorProto.FLOAT:
            dst, c = cast(name, TensorProto.FLOAT, f"{node.name}_in{i}")
            out.append(c)
            node.input[i] = dst
    out.append(node)
    for i, name in enumerate(node.output):
        if types.get(name) != TensorProto.FLOAT:
            continue
        tmp = f"{name}__fp32out"
        node.output[i] = tmp
        out.append(helper.make_node("Cast", [tmp], [name], to=TensorProto.FLOAT16, name=f"{node.name}_out{i}_cast"))
    return out


def _cast_outputs_up(graph: Any, new_nodes: list[Any]) -> None:
    """Each float32 graph output is produced in float16 under an internal name and cast back to
    float32 under its own name (clients and Triton configs unchanged)."""
    from onnx import TensorProto, helper

    produced = {o for n in new_nodes for o in n.output}
    for vi in graph.output:
        if vi.type.tensor_type.elem_type != TensorProto.FLOAT or vi.name not in produced:
            continue
        internal = f"{vi.name}__fp16"
        for n in new_nodes:
            for i, o in enumerate(n.output):
                if o == vi.name:
                    n.output[i] = internal
            for i, inp in enumerate(n.input):
                if inp == vi.name:
                    n.input[i] = internal
        new_nodes.append(helper.make_node("Cast", [internal], [vi.name], to=TensorProto.FLOAT, name=f"output_{vi.name}_cast"))


def _elem_types(model: Any) -> dict[str, int]:
    """Element type of every tensor of the float32 model (from shape inference)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *g.value_info)}
    types.update({init.name: init.data_type for init in g.initializer})
    return types


def convert_file(src: str, dst: str, *, force: bool = True, **kw: Any) -> Any:
    """Convert an ONNX file; the result is checked with ``onnx.checker`` and written atomically."""
    import onnx

    model = convert_to_fp16(load_onnx(src), **kw)
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise UsageError(f"{src}: the float16 model fails onnx.checker: {str(exc).splitlines()[0]}") from exc
    with atomic_path(dst, force=force) as tmp:
        onnx.save(model, str(tmp))
    return model
