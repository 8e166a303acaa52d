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
    from onnx import TensorProto, helper, numpy_helper

    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    model = model_copy
    default_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if default_opset is None:
        raise UsageError("model has no default-domain opset import")
    has_qdq = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    if has_qdq and default_opset < MIN_QDQ_FP16_OPSET:
        ir = model.ir_version
        try:
            model = onnx.version_converter.convert_version(model, MIN_QDQ_FP16_OPSET)
        except Exception as exc:
            raise UsageError(f"cannot convert the model to opset {MIN_QDQ_FP16_OPSET} for float16 Q/DQ scales: {exc}") from exc
        model.ir_version = max(ir, 9)
    types = _elem_types(model)
    graph = model.graph
    keep_ops = set(keep_fp32_ops)
    keep_nodes = set(keep_fp32_nodes)

    # 1. initializers
    fp32_inits = set()
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            arr = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(_fp16_array(arr), init.name))
            fp32_inits.add(init.name)

    # 2. constants and casts
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

    new_nodes: list[Any] = []
    counter = [0]

    def cast(src: str, to: int, hint: str) -> tuple[str, Any]:
        counter[0] += 1
        dst = f"{src}__{'fp16' if to == TensorProto.FLOAT16 else 'fp32'}_{counter[0]}"
        return dst, helper.make_node("Cast", [src], [dst], to=to, name=f"{hint}_cast_{counter[0]}")

    # 3. float32 graph inputs: cast to float16 right after the input
    rename: dict[str, str] = {}
    for vi in graph.input:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT and vi.name not in fp32_inits:
            dst, node = cast(vi.name, TensorProto.FLOAT16, "input")
            new_nodes.append(node)
            rename[vi.name] = dst

    # 4. nodes kept in float32: cast float16 inputs up and outputs down
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        if node.op_type == "Resize" and len(node.input) > 2 and node.input[2]:
            # Resize's scales are float32 by the operator's type constraint (a YOLO neck's upsample)
            dst, c = cast(node.input[2], TensorProto.FLOAT, f"{node.name}_scales")
            new_nodes.append(c)
            node.input[2] = dst
        if node.op_type in keep_ops or node.name in keep_nodes:
            for i, name in enumerate(node.input):
                original = name.split("__fp16_")[0]
                if name and types.get(original) == TensorProto.FLOAT:
                    dst, c = cast(name, TensorProto.FLOAT, f"{node.name}_in{i}")
                    new_nodes.append(c)
                    node.input[i] = dst
            new_nodes.append(node)
            for i, name in enumerate(node.output):
                if types.get(name) != TensorProto.FLOAT:
                    continue
                tmp = f"{name}__fp32out"
                node.output[i] = tmp
                new_nodes.append(helper.make_node("Cast", [tmp], [name], to=TensorProto.FLOAT16, name=f"{node.name}_out{i}_cast"))
        else:
            new_nodes.append(node)

    # 5. float32 graph outputs: produce float16 internally, cast back to float32
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

    del graph.node[:]
    graph.node.extend(new_nodes)
    # value_info types are stale now; shape inference recomputes them
    del graph.value_info[:]
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # pragma: no cover - inference is best effort
        log.warning("shape inference after float16 conversion failed: %s", exc)
    return model


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
