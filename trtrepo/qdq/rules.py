"""Placement rules: which tensors of a node get a Q/DQ pair on each target, and which nodes stay
float (transformer-safe exclusions, additive masks, outlier ranges)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..onnxgraph import ONNX_FLOAT, GraphView
from .graph import weight_axis
from .options import (
    ORT_FUSED_ACTIVATIONS,
    ORT_UNIT_OPS,
    WEIGHTED_OPS,
    QdqTarget,
    QuantizeOptions,
    QuantPoint,
    RangeLike,
    as_range,
    register_target,
)

Rule = Callable[[GraphView, Any, QuantizeOptions], list[QuantPoint]]


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
            if view.elem_type.get(name) != ONNX_FLOAT:
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
    if not options.target.small_conv_float or options.ort_min_reduction <= 0 or node.op_type != "Conv":
        return False
    if len(node.input) < 2 or not view.is_constant(node.input[1]) or int(view.attr(node, "group", 1)) != 1:
        return False
    shape = view.constant_array(node.input[1]).shape
    return int(np.prod(shape[1:])) < options.ort_min_reduction


IMAGE_CHANNELS = 4  # a Conv reading a graph input with at most this many channels reads the image (RGB, RGBA, gray)
IMAGE_STEM_CONVS = 2  # the stem: the image's convolution and at most one strided convolution after it
IMAGE_STEM_REASON = ("the image's first convolution before a SiLU: ONNX Runtime would round its pre-activation to uint8 "
                     "over the widest range of the network, and its float kernel is as fast on 3 channels")
IMAGE_STEM_NEXT_REASON = ("the image stem's strided second convolution before a SiLU, reading only the first one's SiLU: "
                          "ONNX Runtime would round its pre-activation to uint8 over a range as wide as the first one's")


def image_stem_nodes(view: GraphView, options: QuantizeOptions) -> dict[str, str]:
    """onnxruntime target: the image stem's convolutions stay float with their SiLUs (Sigmoid and
    Mul; the last SiLU's output is quantized for the next convolution), node -> reason:

    * the convolution on the image input (a graph input of at most :data:`IMAGE_CHANNELS`
      channels) whose output feeds a SiLU (:func:`conv_silu`);
    * then, up to :data:`IMAGE_STEM_CONVS` in all, the convolution that alone reads that SiLU's
      output when it has a stride above 1 and feeds a SiLU itself (YOLOv5 6.0+, YOLOv8 and YOLO11
      open on two strided 3x3 Conv + SiLU; a block's stride-1 convolution ends the stem).

    Decision, measured on the trained YOLO11n (docs/benchmarks.md, "the image's first convolution"
    and "the stem's second convolution float"): ONNX Runtime has no fused Conv + SiLU, so
    QLinearConv rounds the pre-activation to uint8 first, and the stem's two are the widest of the
    backbone (the first [-6, 64] in a shipped file, a 0.27 step; the second's maximum 95 on 48
    calibration crops, against 2..19 in the backbone and neck after them). The first one's
    rounding alone carried about 44 % of the class-logit error variance of the all-INT8 model, and
    its 3-channel QLinearConv ran slower than the float convolution (12.8 against 9.0 ms at batch
    8). With the second one float too, ``deploy`` on three calibration sets read 0.937-0.946
    mAP50-95 vs FP32 where all-INT8 had shipped at 0.842 and 0.863. A ReLU/Clip stem is fused into
    QLinearConv's output range and stays quantized; ``ort_min_reduction=0`` quantizes these too."""
    if not options.target.small_conv_float or options.ort_min_reduction <= 0:
        return {}
    out: dict[str, str] = {}
    for name in view.graph_inputs:
        for node, _ in view.consumers.get(name, []):
            if not _conv_on(view, node, name) or view.constant_array(node.input[1]).shape[1] > IMAGE_CHANNELS:
                continue
            conv: Any = node
            for depth in range(IMAGE_STEM_CONVS):
                silu = _silu_after(view, conv)
                if silu is None:
                    break
                out.update(dict.fromkeys([n.name for n in silu], IMAGE_STEM_NEXT_REASON if depth else IMAGE_STEM_REASON))
                conv = _strided_next_conv(view, silu[-1].output[0])
                if conv is None:
                    break
    return out


def _silu_after(view: GraphView, conv: Any) -> list[Any] | None:
    """``[conv, its Sigmoid, the Mul]`` when ``conv``'s output feeds a SiLU (:func:`conv_silu`), else None."""
    for mul, _ in view.consumers.get(conv.output[0], []):
        if conv_silu(view, mul):
            sigmoid = [view.producer[x] for x in mul.input if x in view.producer and view.producer[x] is not conv]
            return [conv, *sigmoid, mul]
    return None


def _strided_next_conv(view: GraphView, tensor: str) -> Any | None:
    """The convolution with constant weights and a stride above 1 that is ``tensor``'s only
    consumer, or None."""
    users = view.consumers.get(tensor, [])
    if len(users) != 1 or tensor in view.graph_outputs:
        return None
    conv = users[0][0]
    return conv if _conv_on(view, conv, tensor) and max(view.attr(conv, "strides", [1]), default=1) > 1 else None


def _conv_on(view: GraphView, node: Any, tensor: str) -> bool:
    """``node`` is a Conv with constant weights whose data input is ``tensor``."""
    return bool(node.op_type == "Conv" and node.input[0] == tensor and len(node.input) >= 2 and view.is_constant(node.input[1]))


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
    rs = {name: as_range(v) for name, v in ranges.items()}
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
    if not view.is_constant(name) or view.elem_type.get(name) not in (ONNX_FLOAT, 10, 11):
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

    def keep(node: Any, reason: str) -> None:  # the first reason found for a node stands
        nodes.setdefault(node.name, reason)

    tensors = _mask_path(view, _mask_seeds(view, options, ranges), keep)
    if options.target.transformer_safe and options.transformer_safe:
        _keep_residual_and_gating(view, keep)
    _keep_transformer_ops(view, options, keep)
    return FloatReasons(nodes, tensors)


Keep = Callable[[Any, str], None]


def _mask_seeds(view: GraphView, options: QuantizeOptions, ranges: Mapping[str, RangeLike] | None) -> dict[str, str]:
    """Where the mask path starts: tensors with unquantizable ranges, and outputs computed from a
    mask-like constant (huge or non-finite)."""
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
    return seeds


def _mask_path(view: GraphView, seeds: Mapping[str, str], keep: Keep) -> dict[str, str]:
    """From the seeds forward to the next Softmax: every float tensor on the way is unquantizable
    (returned with why), its producers and consumers are kept float."""
    nodes: set[str] = set()

    def mark(node: Any, reason: str) -> None:
        nodes.add(node.name)
        keep(node, reason)

    stack = list(seeds)
    tensors: dict[str, str] = dict(seeds)
    while stack:
        t = stack.pop()
        prod = view.producer.get(t)
        if prod is not None and t in seeds:
            mark(prod, f"produces '{t}': {seeds[t]}")
        for node, _ in view.consumers.get(t, []):
            if node.name in nodes and node.op_type not in _MASK_STOP:
                continue
            mark(node, f"on the attention-mask path from '{t}' ({tensors[t] if t in seeds else 'downstream of the mask'})")
            if node.op_type in _MASK_STOP:
                continue
            for out in node.output:
                if out and view.is_float_activation(out) and out not in tensors:
                    tensors[out] = f"downstream of the mask tensor '{t}'"
                    stack.append(out)
    return tensors


def _keep_residual_and_gating(view: GraphView, keep: Keep) -> None:
    """onnxruntime's transformer-safe exclusions: residual-stream Adds and the gating products
    inside GELU/SiLU (activation x activation Adds and Muls)."""
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


def _keep_transformer_ops(view: GraphView, options: QuantizeOptions, keep: Keep) -> None:
    """What TensorRT and ModelOpt leave float on both targets: Softmax, LayerNormalization, the
    attention MatMuls of two activations with their score path, and GEMV MatMul/Gemm."""
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
            elif b and view.is_constant(b) and _gemv(view, node, b):
                keep(node, "GEMV (a single output column): stays float as in ModelOpt")


def _gemv(view: GraphView, node: Any, weight: str) -> bool:
    """A MatMul/Gemm whose constant weight has a single output column."""
    shape = view.constant_array(weight).shape
    transb = node.op_type == "Gemm" and view.attr(node, "transB", 0)
    n_out = shape[0] if transb else (shape[-1] if shape else 0)
    return len(shape) >= 2 and n_out == 1


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


def conv_silu(view: GraphView, node: Any) -> bool:
    """``x * sigmoid(x)`` where ``x`` is a convolution's output: a CNN's SiLU (YOLO, EfficientNet),
    which ONNX Runtime runs in integers (QLinearSigmoid, QLinearMul) when both are quantized units
    (:func:`rule_cnn_unit`); unlike a transformer's gating it stays quantized."""
    return conv_silu_input(view, node) is not None


def conv_silu_input(view: GraphView, node: Any) -> str | None:
    """The convolution output ``x`` that ``node`` multiplies by ``sigmoid(x)`` (:func:`conv_silu`),
    or None when ``node`` is no such SiLU."""
    if node.op_type != "Mul" or len(node.input) != 2:
        return None
    a, b = node.input
    for x, s in ((a, b), (b, a)):
        sig = view.producer.get(s)
        conv = view.producer.get(x)
        if sig is not None and sig.op_type == "Sigmoid" and sig.input[0] == x and conv is not None \
                and conv.op_type in ("Conv", "ConvTranspose"):
            return str(x)
    return None


def gating_product(view: GraphView, node: Any) -> bool:
    """A Mul (or Add) of two activations where one input is computed from Erf/Tanh/Sigmoid within a
    few elementwise steps: the inside of GELU (``x * (1 + erf(x / sqrt 2))``), SiLU and the like
    (not a convolution's SiLU: :func:`conv_silu`)."""
    if conv_silu(view, node):
        return False
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
        if bias and view.is_constant(bias) and view.elem_type.get(bias) == ONNX_FLOAT:
            points.append(QuantPoint(bias, node.name, 2, "bias", "node_unit"))
    out = node.output[0]
    if view.is_float_activation(out):
        target = _fused_output(view, out)
        if target not in view.graph_outputs and view.consumers.get(target):
            points.append(QuantPoint(target, None, None, "activation", "node_unit_output"))
    return points


def rule_cnn_unit(view: GraphView, node: Any, options: QuantizeOptions) -> list[QuantPoint]:
    """ONNX Runtime units of a CNN beyond :func:`rule_node_unit`: the Sigmoid of a convolution's
    SiLU (:func:`conv_silu`; QLinearSigmoid) and a Concat of activations (QLinearConcat, the
    feature-pyramid joins of a detector's neck): their activation inputs and output, so that
    ``QLinearConv -> QLinearSigmoid -> QLinearMul -> QLinearConcat -> QLinearConv`` stays in
    integers instead of a DQ/float/Q round trip per activation. Like every unit, one is kept only
    where an input is already another unit's quantized output
    (:func:`trtrepo.qdq.plan._units_on_quantized_inputs`)."""
    if node.op_type == "Sigmoid":
        if not any(conv_silu(view, c) for c, _ in view.consumers.get(node.output[0], [])):
            return []
    elif node.op_type != "Concat" or len(node.input) < 2 or not all(view.is_float_activation(i) for i in node.input):
        return []
    points = [QuantPoint(name, node.name, i, "activation", "cnn_unit")
              for i, name in enumerate(node.input) if view.is_float_activation(name)]
    out = node.output[0]
    if view.is_float_activation(out) and out not in view.graph_outputs and view.consumers.get(out):
        points.append(QuantPoint(out, None, None, "activation", "cnn_unit_output"))
    return points


# Points of these rules need a range; the others (ONNX Runtime unit extras) are optional.
REQUIRED_RULES = ("weighted_op_inputs", "residual_add")

# The two shipped targets (trtrepo.qdq.options.QDQ_TARGETS; a plug-in adds its own).
TENSORRT = register_target(QdqTarget(
    "tensorrt", (rule_weighted_op_inputs, rule_residual_add), activations="symmetric", weights="qdq",
    label="TensorRT", help="TensorRT placement, int8 symmetric"))
ONNXRUNTIME = register_target(QdqTarget(
    "onnxruntime", (rule_weighted_op_inputs, rule_node_unit, rule_cnn_unit), activations="asymmetric", weights="int8",
    integer_kernels=True, small_conv_float=True, transformer_safe=True, reduce_range=True, label="ONNX Runtime",
    help="full node units, uint8 activations (CPU integer kernels)"))
