"""Explicit INT8 quantization: insert QuantizeLinear/DequantizeLinear (Q/DQ) nodes into an ONNX model.

Two targets, because their consumers need different graphs:

``tensorrt`` (TensorRT 10/11 explicit quantization, the placement ModelOpt uses)
    * the activation inputs and the weights of Conv, ConvTranspose, Gemm and MatMul get Q/DQ;
    * weights: symmetric int8 per output channel (Conv axis 0, ConvTranspose axis 1, Gemm
      axis 0 with ``transB=1`` else 1, MatMul the last axis), FP32 weights behind Q -> DQ so
      TensorRT quantizes them at build time;
    * activations: symmetric int8 per tensor, zero point 0, scale ``amax / 127``;
    * residual Add: the input coming from the convolution backbone gets no Q/DQ, the other
      (residual) input does, so TensorRT fuses Conv + Add (+ ReLU) with INT8 I/O;
    * outputs of quantized ops get no Q (TensorRT picks output precision itself), network
      outputs are never quantized.

``onnxruntime`` (ONNX Runtime's CPU integer kernels)
    * node units: the activation inputs *and* the output of Conv, ConvTranspose, Gemm, MatMul,
      Add, Mul, AveragePool and GlobalAveragePool are quantized, so ONNX Runtime turns
      ``DQ -> Conv -> Q`` into QLinearConv, ``DQ -> Add -> Q`` into QLinearAdd and so on. An
      output that feeds a single Relu/Clip is quantized after the activation instead (ONNX
      Runtime drops a Relu in front of a Q whose zero point is the type minimum);
    * transformer-safe (``QuantizeOptions.transformer_safe``, default): an Add/Mul/pool unit only
      where one of its inputs is already a quantized unit output; a MatMul/Gemm whose output feeds
      a float op keeps a float output (``DQ -> MatMul`` runs as MatMulIntegerToFloat) instead of
      being requantized; residual-stream Adds and GELU/SiLU gating products stay float (see
      :func:`find_float_nodes`);
    * activations: uint8 asymmetric per tensor over ``[min, max]`` (clipped to the method's
      ``amax``) -- ONNX Runtime's CPU kernels run symmetric int8 activations slower than FP32 and
      u8 asymmetric ones faster (docs/benchmarks.md, "INT8 on the CPU (issue 4)"); without measured min/max a tensor that is provably non-negative (after Relu,
      Softmax, pooling of those, ...) gets ``[0, amax]``, any other ``[-amax, amax]``;
    * weights: int8 per output channel, symmetric, stored as int8 initializers behind a DQ;
      biases of Conv/Gemm as int32 with scale ``s_x * s_w`` (what QLinearConv/QGemm need); a
      channel whose bias does not fit int32 there (a near-dead channel: tiny weights, large bias)
      gets a larger weight scale instead of a clipped or overflowing bias (:func:`_bias_scale_floors`);
    * a dense Conv with a tiny reduction (``Cin * kh * kw < 16``, the first conv of a one-channel
      image model) stays float: ONNX Runtime's float kernel is faster there
      (:func:`keep_float_small_conv`);
    * network outputs are never quantized.

Both targets, transformer-aware (:func:`find_float_nodes`, reported in the plan's ``auto_float``
and ``float_tensors``, with a warning naming the mask tensors): tensors whose range is non-finite
or absurdly large next to the others (an additive attention mask holding ``finfo.min``) and
everything downstream of them up to the Softmax stay float; so do Softmax, LayerNormalization,
GEMV MatMuls and, unless ``quantize_attention``, the activation-activation MatMuls of attention
(Q.K^T, P.V) with the scale/mask ops between Q.K^T and the Softmax.

The placement is a list of named rule functions (:data:`RULES`), each returning
:class:`QuantPoint` s for one node; :func:`plan_qdq` runs them and :func:`insert_qdq` rewrites
the graph in one pass. Nothing here patches ONNX Runtime or imports ModelOpt.

Stable API::

    QuantizeOptions(target="tensorrt", exclude_ops=(), exclude_nodes=(), per_channel=True, quantize_attention=False)
    ActivationRange(amax, lo=None, hi=None)
    plan_qdq(model, options, ranges=None) -> QdqPlan
    find_float_nodes(view, options, ranges=None) -> FloatReasons     # what stays float, and why
    insert_qdq(model, ranges, options) -> QuantizedModel     # in memory; ranges: {tensor: amax | ActivationRange}
    quantize_model(onnx_path, ranges, out_path, options) -> QuantizeResult   # file in, file out (atomic)
    ranges_from_cache(path, model) -> {tensor: amax};  ranges_from_json(path) -> {tensor: ActivationRange}
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TrtrepoError, UsageError
from .modelio import without_weights

log = logging.getLogger(__name__)

TARGETS = ("tensorrt", "onnxruntime")
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ONNX Runtime node units with CPU integer kernels (QLinearConv, QGemm, QLinearMatMul, QLinearAdd, ...).
ORT_UNIT_OPS = WEIGHTED_OPS + ("Add", "Mul", "AveragePool", "GlobalAveragePool")
# Activations ONNX Runtime removes in front of a Q whose zero point is the type minimum.
ORT_FUSED_ACTIVATIONS = ("Relu", "Clip")
MIN_OPSET = 13
_FLOAT = 1  # onnx.TensorProto.FLOAT
_INT8_MAX = 127.0
_INT8_REDUCED_MAX = 64.0  # ONNX Runtime's reduce_range for symmetric int8 weights
CHECK_FULL_BYTES = 64 * 2**20  # insert_qdq: onnx.checker on the whole model below this size


# --------------------------------------------------------------------------------------------
# Options and inputs


@dataclass(frozen=True)
class QuantizeOptions:
    """Where Q/DQ go. ``exclude_nodes`` are node names or regular expressions (full match);
    ``exclude_ops`` op types. Excluded nodes keep float inputs, weights and outputs."""

    target: str = "tensorrt"
    exclude_ops: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    per_channel: bool = True
    # onnxruntime target: a Conv whose reduction (Cin/group * kernel size) is below this stays
    # float (see keep_float_small_conv); 0 disables.
    ort_min_reduction: int = 16
    # Transformer-aware exclusions (see find_float_nodes): quantize the activation-activation
    # MatMuls of attention (Q.K^T, P.V) too; a range larger than ``outlier_ratio`` times the
    # median range (and above OUTLIER_FLOOR) marks a tensor unquantizable (an additive mask).
    quantize_attention: bool = False
    outlier_ratio: float = 1000.0
    # onnxruntime target: 7-bit weights ([-64, 64], ONNX Runtime's ``reduce_range``) so that U8S8
    # kernels cannot saturate on x86 CPUs without VNNI even where the session option that avoids it
    # (trtrepo.cpu.X64_QUANT_PRECISION) cannot be set, e.g. Triton's onnxruntime backend.
    reduce_range: bool = False
    # onnxruntime target, transformer-safe placement (see find_float_nodes): residual-stream Adds
    # (activation + activation Adds in front of a LayerNorm) and gating products inside activation
    # functions (GELU's x * (1 + erf), SiLU's x * sigmoid) stay float, and a MatMul/Gemm whose output
    # feeds no quantized unit keeps a float output (ONNX Runtime's MatMulIntegerToFloat) instead of
    # being requantized. False restores full node units everywhere.
    transformer_safe: bool = True

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UsageError(f"--target '{self.target}' is not one of {', '.join(TARGETS)}")
        object.__setattr__(self, "exclude_ops", tuple(self.exclude_ops))
        object.__setattr__(self, "exclude_nodes", tuple(self.exclude_nodes))
        if self.reduce_range and self.target != "onnxruntime":
            raise UsageError("--reduce-range is for --target onnxruntime (TensorRT quantizes weights to 8 bits)")
        if not self.outlier_ratio > 1.0:
            raise UsageError(f"outlier ratio {self.outlier_ratio}: expected a number above 1")
        for pattern in self.exclude_nodes:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"--exclude-node '{pattern}': not a valid regular expression ({exc})") from exc

    def with_excluded_nodes(self, names: Iterable[str]) -> QuantizeOptions:
        """A copy that also excludes the given exact node names."""
        extra = tuple(re.escape(n) for n in names)
        return replace(self, exclude_nodes=self.exclude_nodes + extra)

    def excludes(self, node_name: str, op_type: str) -> bool:
        if op_type in self.exclude_ops:
            return True
        return any(node_name == p or re.fullmatch(p, node_name) for p in self.exclude_nodes)


@dataclass(frozen=True)
class ActivationRange:
    """Calibrated range of one activation: ``amax`` (the method's |x| threshold) and, when
    measured, the signed ``lo``/``hi`` (min and max seen). The onnxruntime target quantizes
    over ``[max(lo, -amax), min(hi, amax)]``; the tensorrt target uses ``amax`` only."""

    amax: float
    lo: float | None = None
    hi: float | None = None


RangeLike = float | ActivationRange


def _as_range(value: RangeLike | Sequence[float]) -> ActivationRange:
    if isinstance(value, ActivationRange):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
        return ActivationRange(max(abs(lo), abs(hi)), lo, hi)
    return ActivationRange(float(value))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Graph view and placement rules


@dataclass(frozen=True)
class QuantPoint:
    """One tensor to quantize for one consumer.

    ``consumer`` is the node name reading the tensor at ``input_index``; ``None`` (onnxruntime
    output Q) means every consumer that is not excluded. ``kind`` is ``activation``, ``weight``
    or ``bias``; ``axis`` the per-channel axis of a weight; ``node`` the node whose rule placed
    the point (the layer to exclude to undo it)."""

    tensor: str
    consumer: str | None
    input_index: int | None
    kind: str
    rule: str
    axis: int | None = None
    node: str = ""  # the node whose rule placed it (the "layer" excluded to undo it)


class GraphView:
    """Producers, consumers, initializers and float tensors of a graph (read-only helper)."""

    def __init__(self, model: Any) -> None:
        import onnx

        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.constants: dict[str, Any] = {}
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs = {o.name for o in graph.output}
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[tuple[Any, int]]] = defaultdict(list)
        for node in self.nodes:
            for out in node.output:
                if out:
                    self.producer[out] = node
            for i, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, i))
        self.elem_type: dict[str, int] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(without_weights(model))
        except Exception as exc:  # shape inference is a help, not a requirement
            log.debug("shape inference failed: %s", exc)
            inferred = model
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            if vi.type.HasField("tensor_type"):
                self.elem_type[vi.name] = vi.type.tensor_type.elem_type
        for name, t in {**self.initializers, **self.constants}.items():
            self.elem_type[name] = t.data_type
        self.order = {node.name: i for i, node in enumerate(self.nodes)}
        self._nonneg: dict[str, bool] = {}

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self.constants

    def constant_array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        t = self.initializers.get(name) or self.constants[name]
        return numpy_helper.to_array(t)

    def is_float_activation(self, name: str) -> bool:
        """A float32 tensor computed at run time (or a graph input). Unknown types count as
        float when the producer is a float op -- shape inference fills them for normal models."""
        if not name or self.is_constant(name):
            return False
        return self.elem_type.get(name, _FLOAT) == _FLOAT

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        import onnx

        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def non_negative(self, name: str) -> bool:
        """Whether ``name`` is provably >= 0 (Relu output and ops that keep the sign)."""
        if name in self._nonneg:
            return self._nonneg[name]
        self._nonneg[name] = False  # cycles cannot happen in a DAG; guards recursion anyway
        node = self.producer.get(name)
        result = False
        if node is not None:
            op = node.op_type
            if op in ("Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt", "Softplus"):
                result = True
            elif op == "Clip":
                lo = node.input[1] if len(node.input) > 1 else ""
                lo_val = self.constant_array(lo) if lo and self.is_constant(lo) else self.attr(node, "min")
                result = lo_val is not None and float(np.min(lo_val)) >= 0.0
            elif op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten", "Reshape",
                        "Transpose", "Squeeze", "Unsqueeze", "Identity", "Resize", "Slice", "Gather", "Expand"):
                result = self.non_negative(node.input[0])
            elif op in ("Concat", "Max", "Add", "Mul"):
                result = all(self.non_negative(i) for i in node.input if i)
        elif self.is_constant(name):
            result = bool(np.all(self.constant_array(name) >= 0))
        self._nonneg[name] = result
        return result


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


Rule = Callable[[GraphView, Any, QuantizeOptions], list[QuantPoint]]


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


def rule_weighted_op_inputs(view: GraphView, node: Any, options: QuantizeOptions) -> list[QuantPoint]:
    """Conv, ConvTranspose, Gemm, MatMul: every float activation input (per tensor) and every
    constant weight input (per output channel). Biases stay float for TensorRT."""
    if node.op_type not in WEIGHTED_OPS:
        return []
    n_data = 2  # X, W (Conv/ConvTranspose) or A, B (Gemm/MatMul); bias handled separately
    points = []
    for i, name in enumerate(node.input[:n_data]):
        if not name:
            continue
        if view.is_constant(name):
            if view.elem_type.get(name) != _FLOAT:
                continue
            axis = weight_axis(view, node, i) if options.per_channel else None
            points.append(QuantPoint(name, node.name, i, "weight", "weighted_op_inputs", axis))
        elif view.is_float_activation(name):
            points.append(QuantPoint(name, node.name, i, "activation", "weighted_op_inputs"))
    return points


def keep_float_small_conv(view: GraphView, node: Any, options: QuantizeOptions) -> bool:
    """onnxruntime target: leave a dense Conv with a tiny reduction (``Cin * kh * kw`` below
    ``options.ort_min_reduction``, e.g. the first 3x3 conv of a one-channel image model) in float.
    ONNX Runtime's QLinearConv is slower than its float NCHWc kernel there (measured on the demo's
    first conv, 1 -> 16 channels, 3x3)."""
    if options.target != "onnxruntime" or options.ort_min_reduction <= 0 or node.op_type != "Conv":
        return False
    if len(node.input) < 2 or not view.is_constant(node.input[1]) or int(view.attr(node, "group", 1)) != 1:
        return False
    shape = view.constant_array(node.input[1]).shape
    return int(np.prod(shape[1:])) < options.ort_min_reduction


# --------------------------------------------------------------------------------------------
# Transformer-aware exclusions: what stays float whatever the rules say

# Constants of this magnitude (or non-finite) feeding Add/Sub/Mul/Where build additive masks.
MASK_CONSTANT = 1e9
OUTLIER_FLOOR = 1000.0  # a range below this is never an outlier, whatever the ratio
_MASK_OPS = ("Add", "Sub", "Mul", "Where", "Div")
# Ops that end the mask path (their output is bounded again).
_MASK_STOP = ("Softmax", "LogSoftmax", "Sigmoid", "Tanh")
# Ops between Q.K^T and Softmax (scale, mask, reshapes) that make up the attention score path.
_SCORE_OPS = ("Div", "Mul", "Add", "Sub", "Where", "Reshape", "Transpose", "Cast", "Identity", "Dropout", "Clip")


@dataclass(frozen=True)
class FloatReasons:
    """What :func:`find_float_nodes` keeps float: ``nodes`` (name -> reason) and the
    ``tensors`` whose range cannot be quantized (name -> reason)."""

    nodes: dict[str, str]
    tensors: dict[str, str]


def _finite(x: float | None) -> bool:
    return x is None or np.isfinite(x)


def unquantizable_ranges(ranges: Mapping[str, RangeLike], ratio: float = 1000.0) -> dict[str, str]:
    """Tensors whose range is non-finite, or larger than ``ratio`` times the median range of the
    others (and above :data:`OUTLIER_FLOOR`): an 8-bit scale over such a range rounds every
    ordinary value to zero. Typical case: the additive attention mask holding ``finfo.min``."""
    rs = {name: _as_range(v) for name, v in ranges.items()}
    out: dict[str, str] = {}
    finite = []
    for name, r in rs.items():
        if not (np.isfinite(r.amax) and _finite(r.lo) and _finite(r.hi)):
            out[name] = "non-finite range"
        elif r.amax > 0:
            finite.append(r.amax)
    if not finite:
        return out
    median = float(np.median(finite))
    limit = max(ratio * median, OUTLIER_FLOOR)
    for name, r in rs.items():
        if name not in out and r.amax > limit:
            out[name] = f"range {r.amax:.3g} is {r.amax / median:.3g}x the median range {median:.3g}"
    return out


def _mask_constant(view: GraphView, name: str) -> float | None:
    """The largest magnitude of a float constant input when it looks like a mask fill value."""
    if not view.is_constant(name) or view.elem_type.get(name) not in (_FLOAT, 10, 11):
        return None
    a = view.constant_array(name)
    if a.size == 0 or a.size > 4096:
        return None
    big = float(np.max(np.abs(a.astype(np.float64))))
    return big if (not np.isfinite(big) or big >= MASK_CONSTANT) else None


def find_float_nodes(view: GraphView, options: QuantizeOptions,
                     ranges: Mapping[str, RangeLike] | None = None) -> FloatReasons:
    """Nodes to keep in float for transformers, with the reason (both targets):

    * the **mask path**: tensors with an unquantizable range (:func:`unquantizable_ranges`, needs
      ``ranges``) or computed from a huge/non-finite constant (``(1 - mask) * finfo.min``,
      ``Where(mask, 0, -inf)``), and everything downstream of them up to the next Softmax: the
      producers and consumers of those tensors get no Q/DQ;
    * **Softmax** and **LayerNormalization** (what TensorRT and ModelOpt leave in float);
    * onnxruntime target with ``transformer_safe``: **residual-stream Adds** (activation +
      activation Adds in front of a LayerNorm; on trained all-mpnet-base-v2 their outlier channels
      took the embedding cosine to 0.09-0.43 as QLinearAdd units) and the **gating products**
      inside GELU/SiLU (so ONNX Runtime still fuses the activation);
    * the **attention score path** unless ``options.quantize_attention``: MatMuls whose two inputs
      are both activations (Q.K^T and P.V) and the scale/mask ops between Q.K^T and the Softmax;
    * **GEMV** MatMul/Gemm (a constant weight with a single output column), which ModelOpt excludes.
    """
    nodes: dict[str, str] = {}
    tensors: dict[str, str] = {}

    def keep(node: Any, reason: str) -> None:
        nodes.setdefault(node.name, reason)

    # Mask path seeds: unquantizable ranges and outputs computed from mask-like constants.
    seeds: dict[str, str] = {}
    if ranges:
        for name, why in unquantizable_ranges(ranges, options.outlier_ratio).items():
            if name in view.producer or name in view.graph_inputs:
                seeds[name] = why
    for node in view.nodes:
        if node.op_type not in _MASK_OPS or not node.output or not view.is_float_activation(node.output[0]):
            continue
        for i in node.input:
            big = _mask_constant(view, i) if i else None
            if big is not None:
                seeds.setdefault(node.output[0], f"computed from the constant {i!r} of magnitude {big:.3g} (attention mask)")
                break
    # Forward to the next Softmax: every float tensor on the way is unquantizable.
    stack = list(seeds)
    tensors.update(seeds)
    while stack:
        t = stack.pop()
        prod = view.producer.get(t)
        if prod is not None and t in seeds:
            keep(prod, f"produces '{t}': {seeds[t]}")
        for node, _ in view.consumers.get(t, []):
            if node.name in nodes and node.op_type not in _MASK_STOP:
                continue
            keep(node, f"on the attention-mask path from '{t}' ({tensors[t] if t in seeds else 'downstream of the mask'})")
            if node.op_type in _MASK_STOP:
                continue
            for out in node.output:
                if out and view.is_float_activation(out) and out not in tensors:
                    tensors[out] = f"downstream of the mask tensor '{t}'"
                    stack.append(out)

    if options.target == "onnxruntime" and options.transformer_safe:
        for node in view.nodes:
            if node.op_type not in ("Add", "Mul") or len(node.input) != 2:
                continue
            if not all(view.is_float_activation(i) for i in node.input):
                continue
            if node.op_type == "Add" and residual_stream_add(view, node):
                keep(node, "residual-stream Add in front of a LayerNorm: its trained outlier channels do not survive one "
                           "per-tensor 8-bit scale (MatMul/Conv inputs are still quantized)")
            elif gating_product(view, node):
                keep(node, f"{node.op_type} inside an activation function (GELU/SiLU gating): stays float so ONNX Runtime "
                           "fuses the activation")
    for node in view.nodes:
        op = node.op_type
        if op in ("Softmax", "LayerNormalization"):
            keep(node, f"{op} stays float (TensorRT/ModelOpt transformer pattern)")
        elif op in ("MatMul", "Gemm"):
            a, b = (list(node.input) + ["", ""])[:2]
            if a and b and view.is_float_activation(a) and view.is_float_activation(b):
                if not options.quantize_attention:
                    keep(node, "attention MatMul of two activations (Q.K^T or P.V); use --quantize-attention to quantize it")
                    _mark_score_path(view, node, keep)
            elif b and view.is_constant(b):
                shape = view.constant_array(b).shape
                transb = op == "Gemm" and view.attr(node, "transB", 0)
                n_out = shape[0] if transb else (shape[-1] if shape else 0)
                if len(shape) >= 2 and n_out == 1:
                    keep(node, "GEMV (a single output column): stays float as in ModelOpt")
    return FloatReasons(nodes, tensors)


_NORM_OPS = ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization", "ReduceMean",
             "RMSNormalization", "GroupNormalization")
_GATE_OPS = ("Erf", "Tanh", "Sigmoid", "HardSigmoid")
_PASS_OPS = ("Cast", "Identity", "Reshape", "Transpose")


def residual_stream_add(view: GraphView, node: Any, depth: int = 4) -> bool:
    """An activation + activation Add on a transformer's residual stream: its output reaches a
    normalization (LayerNorm, RMSNorm, or a decomposed one starting with ReduceMean) directly or
    through further residual Adds (pre-LN blocks). A CNN's residual Add (followed by Relu or a
    Conv) is not one."""
    if depth <= 0 or not node.output:
        return False
    for consumer, _ in view.consumers.get(node.output[0], []):
        op = consumer.op_type
        if op in _NORM_OPS:
            return True
        if op in _PASS_OPS and residual_stream_add(view, consumer, depth - 1):
            return True
        if op == "Add" and all(view.is_float_activation(i) for i in consumer.input) and \
                residual_stream_add(view, consumer, depth - 1):
            return True
    return False


def gating_product(view: GraphView, node: Any) -> bool:
    """A Mul (or Add) of two activations where one input is computed from Erf/Tanh/Sigmoid within a
    few elementwise steps: the inside of GELU (``x * (1 + erf(x / sqrt 2))``), SiLU and the like."""
    for name in node.input:
        prod, hops = view.producer.get(name), 0
        while prod is not None and hops < 4:
            if prod.op_type in _GATE_OPS:
                return True
            if prod.op_type not in ("Add", "Mul", "Div", "Sub", "Cast"):
                break
            acts = [i for i in prod.input if view.is_float_activation(i)]
            if len(acts) != 1:
                break
            prod, hops = view.producer.get(acts[0]), hops + 1
    return False


def _mark_score_path(view: GraphView, matmul: Any, keep: Callable[[Any, str], None]) -> None:
    """Scale/mask ops from a Q.K^T MatMul to its Softmax (nothing when no Softmax follows)."""
    path: list[Any] = []
    t = matmul.output[0]
    for _ in range(8):
        consumers = view.consumers.get(t, [])
        if len(consumers) != 1:
            return
        node = consumers[0][0]
        if node.op_type == "Softmax":
            for n in path:
                keep(n, f"attention score path between '{matmul.name}' and '{node.name}'")
            return
        if node.op_type not in _SCORE_OPS:
            return
        path.append(node)
        t = node.output[0]


def _backbone_producer(view: GraphView, name: str) -> Any | None:
    """The Conv/ConvTranspose producing ``name`` (through an optional BatchNormalization) when
    that path has no other consumer, i.e. TensorRT can fuse the Add into it."""
    node = view.producer.get(name)
    seen = name
    if node is not None and node.op_type == "BatchNormalization" and len(view.consumers[seen]) == 1:
        seen = node.input[0]
        node = view.producer.get(seen)
        if node is not None and len(view.consumers[seen]) != 1:
            return None
    if node is None or node.op_type not in ("Conv", "ConvTranspose"):
        return None
    if len(view.consumers[name]) != 1:
        return None
    return node


def rule_residual_add(view: GraphView, node: Any, options: QuantizeOptions) -> list[QuantPoint]:
    """TensorRT residual Add (ModelOpt's recipe): of an Add with two activation inputs, the one
    coming straight from a convolution (the backbone) stays float so TensorRT fuses the Add into
    that convolution; the other (residual) input gets Q/DQ. When both come from convolutions the
    later one in graph order is the backbone. No Q/DQ when neither does."""
    if node.op_type != "Add" or len(node.input) != 2:
        return []
    a, b = node.input
    if not (view.is_float_activation(a) and view.is_float_activation(b)):
        return []
    pa, pb = _backbone_producer(view, a), _backbone_producer(view, b)
    if pa is None and pb is None:
        return []
    if pa is not None and pb is not None:
        backbone = 0 if view.order[pa.name] > view.order[pb.name] else 1
    else:
        backbone = 0 if pa is not None else 1
    residual = 1 - backbone
    return [QuantPoint(node.input[residual], node.name, residual, "activation", "residual_add")]


def _fused_output(view: GraphView, name: str) -> str:
    """The tensor to put the output Q on: after a single following Relu/Clip (fused by ONNX Runtime)."""
    consumers = view.consumers.get(name, [])
    if name not in view.graph_outputs and len(consumers) == 1 and consumers[0][0].op_type in ORT_FUSED_ACTIVATIONS:
        return consumers[0][0].output[0]
    return name


def rule_node_unit(view: GraphView, node: Any, options: QuantizeOptions) -> list[QuantPoint]:
    """ONNX Runtime node units: float activation inputs and the (activation-fused) output of
    Conv, ConvTranspose, Gemm, MatMul, Add, Mul, AveragePool, GlobalAveragePool. Weights of the
    weighted ops come from :func:`rule_weighted_op_inputs`, biases are int32. Add/Mul only when
    both inputs are activations."""
    op = node.op_type
    if op not in ORT_UNIT_OPS:
        return []
    if op in ("Add", "Mul") and not all(view.is_float_activation(i) for i in node.input):
        return []
    points = []
    if op not in WEIGHTED_OPS:
        for i, name in enumerate(node.input):
            if view.is_float_activation(name):
                points.append(QuantPoint(name, node.name, i, "activation", "node_unit"))
    else:
        bias = node.input[2] if len(node.input) > 2 else ""
        if bias and view.is_constant(bias) and view.elem_type.get(bias) == _FLOAT:
            points.append(QuantPoint(bias, node.name, 2, "bias", "node_unit"))
    out = node.output[0]
    if view.is_float_activation(out):
        target = _fused_output(view, out)
        if target not in view.graph_outputs and view.consumers.get(target):
            points.append(QuantPoint(target, None, None, "activation", "node_unit_output"))
    return points


# Points of these rules need a range; the others (ONNX Runtime unit extras) are optional.
REQUIRED_RULES = ("weighted_op_inputs", "residual_add")

RULES: dict[str, tuple[Rule, ...]] = {
    "tensorrt": (rule_weighted_op_inputs, rule_residual_add),
    "onnxruntime": (rule_weighted_op_inputs, rule_node_unit),
}


@dataclass
class QdqPlan:
    """The rules' result: the points to quantize, the layers (nodes that placed points, in graph
    order; excluding one by name undoes its points) and the excluded unit/weighted nodes."""

    points: list[QuantPoint]
    layers: list[str]
    excluded: list[str]
    target: str
    kept_float: list[str] = field(default_factory=list)  # left float by a rule (keep_float_small_conv)
    # Transformer-aware exclusions (find_float_nodes): node -> reason, unquantizable tensor -> reason.
    auto_float: dict[str, str] = field(default_factory=dict)
    float_tensors: dict[str, str] = field(default_factory=dict)

    def activation_tensors(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.points:
            if p.kind == "activation":
                seen.setdefault(p.tensor)
        return list(seen)


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


def plan_qdq(model: Any, options: QuantizeOptions | None = None, *, view: GraphView | None = None,
             ranges: Mapping[str, RangeLike] | None = None) -> QdqPlan:
    """Run the target's rules over a prepared model (see :func:`prepare_model`). With
    ``ranges``, tensors with unquantizable ranges (and the mask path behind them) stay float
    too (:func:`find_float_nodes`)."""
    options = options or QuantizeOptions()
    view = view or GraphView(model)
    points: list[QuantPoint] = []
    excluded: list[str] = []
    layers: list[str] = []
    kept_float: list[str] = []
    reasons = find_float_nodes(view, options, ranges)
    auto_float: dict[str, str] = {}
    for node in view.nodes:
        if options.excludes(node.name, node.op_type):
            if node.op_type in ORT_UNIT_OPS or node.op_type in WEIGHTED_OPS:
                excluded.append(node.name)
            continue
        if keep_float_small_conv(view, node, options):
            kept_float.append(node.name)
            continue
        if node.name in reasons.nodes:
            auto_float[node.name] = reasons.nodes[node.name]
            continue
        node_points = [replace(p, node=node.name) for rule in RULES[options.target] for p in rule(view, node, options)]
        points.extend(node_points)
    # No Q/DQ on network outputs (the graph output tensor keeps its name and float value) and
    # nothing produced by an excluded node is quantized on its output.
    excluded_set = set(excluded) | set(kept_float) | set(auto_float)
    kept = []
    for p in points:
        if p.kind == "activation" and p.tensor in reasons.tensors:
            continue  # an unquantizable range: no Q/DQ for any consumer
        if p.consumer is None:
            producer = view.producer.get(p.tensor)
            if p.tensor in view.graph_outputs:
                continue
            if producer is not None and producer.op_type in ORT_FUSED_ACTIVATIONS:
                producer = view.producer.get(producer.input[0])
            if producer is not None and producer.name in excluded_set:
                continue
        kept.append(p)
    if options.target == "onnxruntime" and options.transformer_safe:
        kept = _units_on_quantized_inputs(view, kept)
        kept = _float_matmul_outputs(view, kept)
    for p in kept:
        if p.node not in layers:
            layers.append(p.node)
    return QdqPlan(kept, layers, excluded, options.target, kept_float, auto_float, dict(reasons.tensors))


def _units_on_quantized_inputs(view: GraphView, points: list[QuantPoint]) -> list[QuantPoint]:
    """Keep an elementwise/pooling unit (Add, Mul, AveragePool, GlobalAveragePool) only when one of
    its activation inputs is already the quantized output of another unit (a CNN's residual Add after
    a QLinearConv): then it saves a DQ/Q round trip. A unit none of whose inputs is quantized (a
    LayerNorm output times the attention mask in mean pooling) would only add rounding: it stays float.
    Decided in graph order, so dropping one unit drops the units that relied on its output."""
    by_node: dict[str, list[QuantPoint]] = defaultdict(list)
    for p in points:
        by_node[p.node].append(p)
    outputs: set[str] = set()  # tensors quantized as some unit's output
    dropped: set[str] = set()
    for node in view.nodes:
        pts = by_node.get(node.name)
        if not pts:
            continue
        if node.op_type not in WEIGHTED_OPS:
            inputs = [p.tensor for p in pts if p.consumer is not None and p.kind == "activation"]
            if not any(t in outputs for t in inputs):
                dropped.add(node.name)
                continue
        outputs.update(p.tensor for p in pts if p.consumer is None)
    return [p for p in points if p.node not in dropped]


def _float_matmul_outputs(view: GraphView, points: list[QuantPoint]) -> list[QuantPoint]:
    """Drop the output Q of a MatMul/Gemm unit when some consumer of that output does not quantize
    it (a bias Add, a reshape on the way to attention, a residual Add kept float): requantizing there
    only adds an 8-bit rounding, while ``DQ -> MatMul`` with a float output still runs as
    ONNX Runtime's MatMulIntegerToFloat."""
    quantized_inputs = {(p.consumer, p.tensor) for p in points if p.kind == "activation" and p.consumer is not None}
    out = []
    for p in points:
        if p.consumer is None and p.rule == "node_unit_output":
            producer = view.producer.get(p.tensor)
            if producer is not None and producer.op_type in ORT_FUSED_ACTIVATIONS:
                producer = view.producer.get(producer.input[0])
            if producer is not None and producer.op_type in ("MatMul", "Gemm"):
                consumers = view.consumers.get(p.tensor, [])
                if not consumers or any((c.name, p.tensor) not in quantized_inputs for c, _ in consumers):
                    continue
        out.append(p)
    return out


# --------------------------------------------------------------------------------------------
# Quantization parameters


@dataclass(frozen=True)
class QParams:
    scale: np.ndarray  # float32, scalar or 1-D
    zero_point: np.ndarray  # int8 / uint8 / int32, same shape
    axis: int | None = None


def activation_qparams(rng: ActivationRange, target: str, nonneg: bool = False, tensor: str = "") -> QParams:
    """TensorRT: int8 symmetric, ``scale = amax / 127``, zp 0. ONNX Runtime: uint8 asymmetric over
    ``[max(lo, -amax), min(hi, amax)]`` widened to contain 0 (``[0, amax]`` for a non-negative
    tensor without measured bounds, else ``[-amax, amax]``)."""
    amax = float(rng.amax)
    if not np.isfinite(amax) or amax < 0:
        raise UsageError(f"tensor '{tensor}': invalid range amax={rng.amax!r}")
    if target == "tensorrt":
        scale = amax / _INT8_MAX if amax > 0 else 1.0
        return QParams(np.asarray(scale, np.float32), np.asarray(0, np.int8))
    lo = rng.lo if rng.lo is not None else (0.0 if nonneg else -amax)
    hi = rng.hi if rng.hi is not None else amax
    lo, hi = max(float(lo), -amax), min(float(hi), amax)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi - lo <= 0:
        return QParams(np.asarray(1.0, np.float32), np.asarray(0, np.uint8))
    uscale = np.float32((hi - lo) / 255.0)
    zp = int(np.clip(np.rint(-lo / float(uscale)), 0, 255))
    return QParams(np.asarray(uscale, np.float32), np.asarray(zp, np.uint8))


def weight_qparams(w: np.ndarray, axis: int | None, qmax: float = _INT8_MAX) -> QParams:
    """Symmetric int8 (narrow range [-qmax, qmax], 127 or 64 with reduce_range), per channel
    along ``axis`` or per tensor."""
    w = np.asarray(w, np.float32)
    if axis is None:
        amax = np.asarray(np.max(np.abs(w)) if w.size else 0.0, np.float32)
    else:
        other = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=other) if w.size else np.zeros(w.shape[axis], np.float32)
    scale = np.where(amax > 0, amax / np.float32(qmax), 1.0).astype(np.float32)
    return QParams(scale, np.zeros(scale.shape, np.int8), axis)


def quantize_weight(w: np.ndarray, qp: QParams, qmax: float = _INT8_MAX) -> np.ndarray:
    scale = qp.scale
    if qp.axis is not None:
        shape = [1] * w.ndim
        shape[qp.axis] = -1
        scale = scale.reshape(shape)
    return np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)


# --------------------------------------------------------------------------------------------
# The rewrite


@dataclass
class QuantizedModel:
    model: Any  # onnx.ModelProto
    plan: QdqPlan
    activation_qparams: dict[str, QParams]


class NothingToQuantize(UsageError):
    """Every quantizable operator stays float (named why): ``deploy`` then ships FP32."""


def _why_nothing(plan: QdqPlan, options: QuantizeOptions) -> str:
    """Why no Q/DQ point is left, from the plan's own records (exclusions the user gave, rules)."""
    def some(names: Sequence[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    why = []
    if plan.excluded:
        why.append(f"{len(plan.excluded)} excluded by --exclude-op/--exclude-node ({some(plan.excluded)})")
    if plan.kept_float:
        why.append(f"{len(plan.kept_float)} small convolution(s) kept in float for {options.target} (reduction "
                   f"Cin*kh*kw below {options.ort_min_reduction}: its float kernel is faster; {some(plan.kept_float)})")
    if plan.auto_float:
        first = next(iter(plan.auto_float.items()))
        why.append(f"{len(plan.auto_float)} kept in float by the placement rules (e.g. {first[0]}: {first[1]})")
    if not why:
        why.append("the placement rules place no Q/DQ (the only quantizable inputs are graph outputs or constants)")
    return "nothing to quantize: every quantizable operator stays float: " + "; ".join(why)


@dataclass(frozen=True)
class _Int32Bias:
    """A Conv/Gemm bias the onnxruntime target stores as int32 at scale ``s_x * s_w``."""

    point: QuantPoint
    node: Any
    x: str  # the quantized input
    weight: tuple[str, int | None]  # the weight's key (tensor, axis)
    bias: np.ndarray  # float32, 1-D
    reduction: int  # products summed into one output (an upper bound): weight size / outputs


def _int32_biases(view: GraphView, plan: QdqPlan, act_q: Mapping[str, QParams],
                  rewires: Mapping[tuple[str, int], str]) -> list[_Int32Bias]:
    """The bias points whose node unit has a quantized input and weight (so ONNX Runtime fuses it
    into QLinearConv/QGemm and the bias must be int32 at ``s_x * s_w``)."""
    units = []
    for p in plan.points:
        if p.kind != "bias":
            continue
        node = next(n for n in view.nodes if n.name == p.consumer)
        x_name, w_name = node.input[0], node.input[1]
        w_point = next((q for q in plan.points if q.kind == "weight" and q.consumer == node.name and q.input_index == 1), None)
        if rewires.get((node.name, 0)) is None or w_point is None or x_name not in act_q:
            continue
        if node.op_type == "Gemm" and (view.attr(node, "transA", 0) or float(view.attr(node, "beta", 1.0)) != 1.0
                                        or float(view.attr(node, "alpha", 1.0)) != 1.0):
            continue
        b = view.constant_array(p.tensor).astype(np.float32)
        if b.ndim != 1 or b.size == 0 or not np.all(np.isfinite(b)):
            continue
        w_size = int(view.constant_array(w_name).size)
        units.append(_Int32Bias(p, node, x_name, (w_name, w_point.axis), b, max(1, w_size // int(b.size))))
    return units


def _bias_limit(reduction: int, qmax: float) -> float:
    """The largest int32 bias magnitude a unit can take: ONNX Runtime's integer kernels add the bias
    to an int32 accumulator of up to ``reduction`` products ``(x_q - zp) * w_q``, each at most
    ``255 * qmax``, and that sum wraps too (measured, ONNX Runtime 1.32: QLinearConv with bias
    ``2**31 - 1000`` and 18 products of 255 * 127 read -66000 where the unfused graph read +66600)."""
    return float(max(2**31 - 1 - reduction * 255 * int(qmax), 2**24))


def _bias_scale_floors(view: GraphView, biases: Sequence[_Int32Bias], act_q: Mapping[str, QParams],
                       per_channel: bool, qmax: float) -> dict[tuple[str, int | None], tuple[np.ndarray, list[str]]]:
    """Per weight (tensor, axis): the smallest scale, per channel (or per tensor), at which every
    bias it meets fits int32 at ``s_x * s_w`` within :func:`_bias_limit`, and the nodes of those
    biases. A nearest-rounding scale is too small for a near-dead channel (weights ~1e-6) with a
    large bias: ``b / (s_x * s_w) > 2**31``.

    Decision, measured with ONNX Runtime 1.32 (CPU EP) on a Conv -> Relu -> Q unit whose channel
    has weights ~1e-6 and bias 500: such a bias cannot stay float. From ORT_ENABLE_BASIC on (the
    default is ALL), ONNX Runtime's WeightBiasQuantization transformer quantizes the float bias of a
    ``DQ -> Conv/Gemm [-> Relu/Clip] -> Q`` unit itself, as ``Cast(Round(b / (s_x * s_w)))`` with
    no clipping: the bias became ``-2**31`` and the channel read 0 instead of 500 (QLinearConv),
    the same sign flip. Only ORT_DISABLE_ALL, or a unit without an output Q, kept the float bias
    and the exact result. Clipping keeps the sign but not the value (0.26 instead of 500). So
    the scales of those channels are raised to ``|b| / (s_x * limit)``: their weights, tiny next
    to the bias by definition (all their products together below about ``reduction * 1.5e-5`` of
    ``|b|``), are rounded on that coarser grid, and every other channel keeps its scale and the
    rounding an earlier weight step chose. Per-tensor weights raise the tensor's one scale."""
    floors: dict[tuple[str, int | None], tuple[np.ndarray, list[str]]] = {}
    for unit in biases:
        s_x = float(act_q[unit.x].scale)
        if not s_x > 0:
            continue
        need = np.abs(unit.bias.astype(np.float64)) / (s_x * _bias_limit(unit.reduction, qmax))
        need *= 1.0 + 1e-5  # margin for the float32 roundings of s_w and s_x * s_w
        w_shape = view.constant_array(unit.weight[0]).shape
        axis = unit.weight[1]
        if not per_channel or axis is None or w_shape[axis] != unit.bias.size:
            need = np.asarray(need.max())
        prev, nodes = floors.get(unit.weight, (None, []))
        floors[unit.weight] = (need if prev is None else np.maximum(prev, need), nodes + [unit.node.name])
    return floors


def _raise_scale(qp: QParams, floor: np.ndarray, weight: str, nodes: Sequence[str]) -> QParams:
    """``qp`` with its scales raised to ``floor`` where they are below it, with a warning."""
    low = qp.scale.astype(np.float64) < floor
    if not np.any(low):
        return qp
    scale = np.maximum(qp.scale.astype(np.float64), floor).astype(np.float32).reshape(qp.scale.shape)
    log.warning("%s: the int32 bias does not fit at scale s_x * s_w for %d of %d weight scale(s) of '%s' "
                "(near-dead channels: tiny weights, large bias); raised those scales so that it fits (clipped, the "
                "bias would lose its value; left float, ONNX Runtime would quantize it itself and overflow)",
                ", ".join(f"'{n}'" for n in nodes), int(np.count_nonzero(low)), int(low.size), weight)
    return replace(qp, scale=scale)


def insert_qdq(model: Any, ranges: Mapping[str, RangeLike], options: QuantizeOptions | None = None,
               *, source: str = "ranges", warn: bool = True) -> QuantizedModel:
    """Return a copy of ``model`` with Q/DQ nodes placed by the target's rules.

    ``ranges`` maps activation tensor names to an amax (float) or an :class:`ActivationRange`.
    Every activation the plan quantizes must be covered; otherwise a :class:`UsageError` names
    the first missing tensor. Raises when the model has no quantizable operator."""
    import onnx
    from onnx import helper, numpy_helper

    options = options or QuantizeOptions()
    work = prepare_model(model)
    view = GraphView(work)
    if not any(n.op_type in WEIGHTED_OPS for n in view.nodes):
        raise UsageError(f"the model has no quantizable operator ({', '.join(WEIGHTED_OPS)}); nothing to quantize")
    plan = plan_qdq(work, options, view=view, ranges=ranges)
    if warn:
        warn_float(plan)
    if not plan.points:
        raise NothingToQuantize(_why_nothing(plan, options))

    # Inputs of the weighted ops and TensorRT's residual inputs must have ranges; the extra
    # tensors of ONNX Runtime node units (Add/Mul/pool inputs, op outputs) are dropped with a
    # warning when the ranges lack them (those units then run in float).
    required = {p.tensor for p in plan.points if p.kind == "activation" and p.rule in REQUIRED_RULES}
    missing = [t for t in plan.activation_tensors() if t in required and t not in ranges]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{source} do not cover the model: no range for tensor '{missing[0]}'{more}; "
                         "were they calibrated on another model?")
    optional_missing = [t for t in plan.activation_tensors() if t not in ranges]
    if optional_missing:
        log.warning("%s have no range for %d tensor(s) of ONNX Runtime node units (e.g. '%s'); those units run in float",
                    source, len(optional_missing), optional_missing[0])
        plan.points = [p for p in plan.points if not (p.kind == "activation" and p.tensor in optional_missing)]
    needed = plan.activation_tensors()

    used_names = {n for node in work.graph.node for n in list(node.input) + list(node.output)}
    used_names |= set(view.initializers) | {i.name for i in work.graph.input}

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in used_names:
            name = f"{base}_{k}"
            k += 1
        used_names.add(name)
        return name

    new_inits: list[Any] = []
    # Nodes to insert after the producer of a tensor (None key: before every node).
    inserted_after: dict[str | None, list[Any]] = defaultdict(list)
    rewires: dict[tuple[str, int], str] = {}  # (node name, input index) -> new input
    act_q: dict[str, QParams] = {}
    act_dq_out: dict[str, str] = {}

    def add_init(base: str, array: np.ndarray) -> str:
        name = fresh(base)
        new_inits.append(numpy_helper.from_array(array, name))
        return name

    def anchor(tensor: str) -> str | None:
        prod = view.producer.get(tensor)
        return prod.name if prod is not None else None

    # Activations: one Q -> DQ pair per tensor, shared by the consumers the plan names.
    for tensor in needed:
        rng = _as_range(ranges[tensor])
        qp = activation_qparams(rng, options.target, nonneg=view.non_negative(tensor), tensor=tensor)
        act_q[tensor] = qp
        s = add_init(f"{tensor}_scale", qp.scale)
        z = add_init(f"{tensor}_zero_point", qp.zero_point)
        q_out, dq_out = fresh(f"{tensor}_quantized"), fresh(f"{tensor}_dequantized")
        inserted_after[anchor(tensor)] += [
            helper.make_node("QuantizeLinear", [tensor, s, z], [q_out], name=fresh(f"{tensor}_QuantizeLinear")),
            helper.make_node("DequantizeLinear", [q_out, s, z], [dq_out], name=fresh(f"{tensor}_DequantizeLinear")),
        ]
        act_dq_out[tensor] = dq_out

    excluded = set(plan.excluded)
    for p in plan.points:
        if p.kind == "activation":
            if p.consumer is not None:
                rewires[(p.consumer, p.input_index)] = act_dq_out[p.tensor]  # type: ignore[index]
            else:
                for node, idx in view.consumers.get(p.tensor, []):
                    if node.name not in excluded:
                        rewires[(node.name, idx)] = act_dq_out[p.tensor]

    qmax = _INT8_REDUCED_MAX if options.reduce_range else _INT8_MAX
    biases = _int32_biases(view, plan, act_q, rewires)
    floors = _bias_scale_floors(view, biases, act_q, options.per_channel, qmax)
    weight_dq: dict[tuple[str, int | None], tuple[str, QParams]] = {}
    for p in plan.points:
        if p.kind == "weight":
            key = (p.tensor, p.axis)
            if key not in weight_dq:
                w = view.constant_array(p.tensor).astype(np.float32)
                qp = weight_qparams(w, p.axis, qmax)
                if key in floors:
                    qp = _raise_scale(qp, floors[key][0], p.tensor, floors[key][1])
                s = add_init(f"{p.tensor}_scale", qp.scale)
                z = add_init(f"{p.tensor}_zero_point", qp.zero_point)
                axis_kw: dict[str, Any] = {"axis": p.axis} if p.axis is not None else {}
                dq_out = fresh(f"{p.tensor}_dequantized")
                if options.target == "tensorrt":
                    # FP32 weights behind Q -> DQ: TensorRT quantizes them at build time.
                    q_out = fresh(f"{p.tensor}_quantized")
                    nodes = [
                        helper.make_node("QuantizeLinear", [p.tensor, s, z], [q_out], name=fresh(f"{p.tensor}_QuantizeLinear"), **axis_kw),
                        helper.make_node("DequantizeLinear", [q_out, s, z], [dq_out], name=fresh(f"{p.tensor}_DequantizeLinear"), **axis_kw),
                    ]
                else:
                    wq = add_init(f"{p.tensor}_quantized", quantize_weight(w, qp, qmax))
                    nodes = [helper.make_node("DequantizeLinear", [wq, s, z], [dq_out], name=fresh(f"{p.tensor}_DequantizeLinear"), **axis_kw)]
                inserted_after[anchor(p.tensor)] += nodes
                weight_dq[key] = (dq_out, qp)
            rewires[(p.consumer, p.input_index)] = weight_dq[key][0]  # type: ignore[index]

    # Biases (onnxruntime target): int32 with scale s_x * s_w once input and weight are quantized;
    # the weight scales above were raised where a bias would not fit (_bias_scale_floors).
    for unit in biases:
        p, node, x_name, w_key, b = unit.point, unit.node, unit.x, unit.weight, unit.bias
        w_qp = weight_dq[w_key][1]
        n_out = int(b.size)
        w_scale = np.broadcast_to(w_qp.scale, (n_out,)) if w_qp.scale.ndim == 0 else w_qp.scale
        if w_scale.shape != (n_out,):
            continue
        b_scale = (act_q[x_name].scale.astype(np.float64) * w_scale.astype(np.float64)).astype(np.float32)
        # In float64: in float32 the bound 2**31 - 1 rounds up to 2**31 and the cast wrapped a
        # saturated positive bias to -2**31. With the raised scales nothing reaches the limit; the
        # clip is a backstop that keeps the sign.
        limit = _bias_limit(unit.reduction, qmax)
        bq = np.clip(np.rint(b.astype(np.float64) / b_scale.astype(np.float64)), -limit, limit).astype(np.int32)
        bq_name = add_init(f"{p.tensor}_quantized", bq)
        s = add_init(f"{p.tensor}_scale", b_scale)
        z = add_init(f"{p.tensor}_zero_point", np.zeros(n_out, np.int32))
        dq_out = fresh(f"{p.tensor}_dequantized")
        inserted_after[None].append(helper.make_node("DequantizeLinear", [bq_name, s, z], [dq_out],
                                                     name=fresh(f"{p.tensor}_DequantizeLinear"), axis=0))
        rewires[(node.name, 2)] = dq_out

    # Rebuild the node list in topological order: Q/DQ right after the tensor's producer.
    nodes_out = list(inserted_after.get(None, []))
    for node in work.graph.node:
        for i in range(len(node.input)):
            new = rewires.get((node.name, i))
            if new is not None:
                node.input[i] = new
        nodes_out.append(node)
        nodes_out.extend(inserted_after.get(node.name, []))
    del work.graph.node[:]
    work.graph.node.extend(nodes_out)
    work.graph.initializer.extend(new_inits)
    # Weights now only read through Q/DQ (onnxruntime target: as int8) can be dropped when unused.
    _drop_unused_initializers(work)
    try:
        # The checker serializes the model: for a large one (a copy of every weight) check the
        # graph without the weights; ONNX Runtime checks the rest when it loads the model.
        onnx.checker.check_model(work if work.ByteSize() < CHECK_FULL_BYTES else weights_as_inputs(work))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrtrepoError(f"the Q/DQ model fails onnx.checker: {first}") from exc
    return QuantizedModel(work, plan, act_q)


def warn_float(plan: QdqPlan) -> None:
    """One warning naming the unquantizable tensors, one for the nodes kept float because of them
    (the structural transformer exclusions are logged at info level)."""
    if plan.float_tensors:
        names = list(plan.float_tensors)
        first = names[0]
        log.warning("kept in float: %d tensor(s) with unquantizable ranges: %s (%s)%s", len(names),
                    ", ".join(f"'{n}'" for n in names[:6]), plan.float_tensors[first],
                    f" and {len(names) - 6} more" if len(names) > 6 else "")
    if plan.auto_float:
        mask = [n for n, why in plan.auto_float.items() if "mask" in why or "produces" in why]
        if mask:
            log.warning("kept in float on the attention-mask path: %s", ", ".join(f"'{n}'" for n in mask))
        log.info("kept in float (transformer patterns): %s", ", ".join(f"{n} ({why})" for n, why in plan.auto_float.items()))


def _drop_unused_initializers(model: Any) -> None:
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
        return onnx.load(str(p))
    except Exception as exc:
        raise UsageError(f"{p}: cannot read ONNX model ({type(exc).__name__}: {exc})") from exc


def model_tensor_names(model: Any) -> set[str]:
    names = {i.name for i in model.graph.input}
    for node in model.graph.node:
        names.update(o for o in node.output if o)
    return names


def ranges_from_json(path: str | Path) -> dict[str, ActivationRange]:
    """Ranges per tensor from a ranges JSON (:meth:`trtrepo.calibrate.Ranges.save_json`): amax,
    plus the signed min/max where the file holds them (written with the statistics)."""
    import json

    from .calibrate import Ranges

    ranges = Ranges.load_json(path)
    tensors = json.loads(Path(path).read_text()).get("tensors") or {}
    out = {}
    for name, amax in ranges.items():
        entry = tensors.get(name)
        if isinstance(entry, Mapping) and "min" in entry and "max" in entry:
            out[name] = ActivationRange(float(amax), float(entry["min"]), float(entry["max"]))
        else:
            out[name] = ActivationRange(float(amax))
    return out


def ranges_from_cache(path: str | Path, model: Any | None = None) -> dict[str, float]:
    """Amax per tensor (``scale * 127``) from a TensorRT calibration cache. With ``model``, a
    cache whose names are not tensors of that model is refused (made for another model)."""
    from .cache import read_cache

    _header, scales = read_cache(path)
    if model is not None:
        known = model_tensor_names(model)
        foreign = [n for n in scales if n not in known and not n.startswith("(Unnamed Layer")]
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise UsageError(f"{path}: calibration cache was made for another model: tensor '{foreign[0]}'{more} "
                             "is not in this model")
    return {name: float(np.float32(scale) * np.float32(_INT8_MAX)) for name, scale in scales.items()}


# --------------------------------------------------------------------------------------------
# File-level API


@dataclass
class QuantizeResult:
    """What :func:`quantize_model` / :func:`trtrepo.autoquant.quantize_for_deploy` wrote."""

    path: Path
    target: str
    method: str | None = None
    layers: list[str] = field(default_factory=list)
    layers_in_float: list[str] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)  # node -> reason (transformer-aware exclusions)
    float_tensors: dict[str, str] = field(default_factory=dict)  # unquantizable tensor -> reason
    activations: int = 0
    weights: int = 0
    report: dict[str, Any] | None = None


def save_model(model: Any, out_path: str | Path, *, force: bool = True) -> Path:
    """Write an ONNX model atomically (temporary file in the folder, then rename)."""
    import onnx

    from .fsutil import atomic_path

    out = Path(out_path)
    with atomic_path(out, force=force) as tmp:
        onnx.save(model, str(tmp))
    return out


def quantize_model(onnx_path: str | Path, ranges: Mapping[str, RangeLike], out_path: str | Path,
                   options: QuantizeOptions | None = None, *, method: str | None = None, force: bool = True,
                   source: str = "ranges") -> QuantizeResult:
    """Quantize ``onnx_path`` with ``ranges`` and write the Q/DQ model to ``out_path`` atomically."""
    options = options or QuantizeOptions()
    model = load_model(onnx_path)
    qm = insert_qdq(model, ranges, options, source=source)
    path = save_model(qm.model, out_path, force=force)
    return _result(qm, path, options, method)


def _result(qm: QuantizedModel, path: Path, options: QuantizeOptions, method: str | None) -> QuantizeResult:
    return QuantizeResult(
        path=path,
        target=options.target,
        method=method,
        layers=list(qm.plan.layers),
        layers_in_float=list(qm.plan.excluded),
        kept_float=dict(qm.plan.auto_float),
        float_tensors=dict(qm.plan.float_tensors),
        activations=len(qm.activation_qparams),
        weights=len({(p.tensor, p.axis) for p in qm.plan.points if p.kind == "weight"}),
    )
