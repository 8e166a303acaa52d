"""The Q/DQ plan: every placement rule applied to the graph, with the nodes left float and why."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import UsageError
from ..onnxgraph import GraphView
from .detector import decode_head_nodes, find_decode_heads
from .options import ORT_FUSED_ACTIVATIONS, ORT_UNIT_OPS, WEIGHTED_OPS, QuantizeOptions, QuantPoint, RangeLike
from .rules import FloatReasons, find_float_nodes, image_stem_nodes, keep_float_small_conv


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
    # Outputs of data-movement ops quantized with their input's parameters (:func:`_tied_outputs`).
    tied: dict[str, str] = field(default_factory=dict)

    def tie(self, ranges: Mapping[str, RangeLike]) -> dict[str, RangeLike]:
        """``ranges`` with every tied output given its source's range (where the source has one):
        the parameters the writer and the weight steps use."""
        out = dict(ranges)
        for tensor, source in self.tied.items():
            if source in ranges:
                out[tensor] = ranges[source]
        return out

    def activation_tensors(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.points:
            if p.kind == "activation":
                seen.setdefault(p.tensor)
        return list(seen)


def plan_qdq(model: Any, options: QuantizeOptions | None = None, *, view: GraphView | None = None,
             ranges: Mapping[str, RangeLike] | None = None) -> QdqPlan:
    """Run the target's rules over a prepared model (see :func:`prepare_model`). With
    ``ranges``, tensors with unquantizable ranges (and the mask path behind them) stay float
    too (:func:`find_float_nodes`)."""
    options = options or QuantizeOptions()
    target = options.target
    view = view or GraphView(model)
    points: list[QuantPoint] = []
    excluded: list[str] = []
    layers: list[str] = []
    kept_float: list[str] = []
    reasons = find_float_nodes(view, options, ranges)
    reasons = FloatReasons({**image_stem_nodes(view, options), **reasons.nodes}, reasons.tensors)
    if not options.quantize_detector_head:
        reasons = FloatReasons({**decode_head_nodes(view), **reasons.nodes}, reasons.tensors)
        head_outputs: list[QuantPoint] = []
    else:  # the naive placement quantizes the box/score concat too, although it is a graph output
        head_outputs = [QuantPoint(h.output, None, None, "activation", NAIVE_HEAD_OUTPUT, node=h.concat)
                        for h in find_decode_heads(view)]
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
        node_points = [replace(p, node=node.name) for rule in target.rules for p in rule(view, node, options)]
        points.extend(node_points)
    # No Q/DQ on network outputs (the graph output tensor keeps its name and float value; the naive
    # detector placement's output excepted) and nothing produced by an excluded node is quantized on
    # its output.
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
    if target.transformer_safe and options.transformer_safe:
        kept = _units_on_quantized_inputs(view, kept)
        kept = _float_matmul_outputs(view, kept)
    tied: dict[str, str] = {}
    if target.integer_kernels:
        kept, tied = _tie_outputs(view, kept)
    kept += [p for p in head_outputs if not options.excludes(p.node, "Concat")]
    for p in kept:
        if p.node not in layers:
            layers.append(p.node)
    return QdqPlan(kept, layers, excluded, target.name, kept_float, auto_float, dict(reasons.tensors), tied)


# The naive detector placement (QuantizeOptions.quantize_detector_head): Q/DQ on the decode head's
# output, the box/score concat, as a generic quantizer places it (ONNX Runtime's quantize_static).
NAIVE_HEAD_OUTPUT = "detector_output_naive"

# Ops that only move or select values (nearest Resize included): ONNX Runtime runs ``DQ -> op -> Q``
# on the integers when Q has the DQ's scale and zero point (its QDQ "drop" and Split rules).
DATA_MOVEMENT_OPS = ("MaxPool", "Split", "Resize", "Slice", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def _tie_outputs(view: GraphView, points: list[QuantPoint]) -> tuple[list[QuantPoint], dict[str, str]]:
    """The points with the quantized outputs of data-movement ops tied: output -> the tensor whose
    parameters it takes (followed through chains, e.g. the SPPF's MaxPools), quantized for every
    consumer (one Q -> DQ that all read).

    Decision: such an output keeps its input's scale and zero point instead of its own calibrated
    range. Its values are already on the input's grid, so the tie loses nothing (requantizing to a
    narrower range of its own adds a rounding), every consumer may read the exact DQ, and ONNX
    Runtime runs the op on uint8 instead of a DQ/float/Q round trip (YOLO's C3k2 Split, the SPPF
    MaxPools, the neck's upsampling Resize). A Resize other than nearest interpolates new values and
    keeps its own range; an output nobody quantizes stays float."""
    for_all = {p.tensor for p in points if p.kind == "activation" and p.consumer is None}
    for_node = {(p.consumer, p.tensor) for p in points if p.kind == "activation" and p.consumer is not None}
    quantized = {p.tensor for p in points if p.kind == "activation"}
    tied: dict[str, str] = {}
    for node in view.nodes:  # graph order: a chain resolves to its first quantized tensor
        if node.op_type not in DATA_MOVEMENT_OPS or not node.input or not node.input[0]:
            continue
        if node.op_type == "Resize" and view.attr(node, "mode", b"nearest") not in (b"nearest", "nearest"):
            continue
        source = node.input[0]
        if source not in for_all and (node.name, source) not in for_node:
            continue
        for out in node.output:
            if out in quantized:
                tied[out] = tied.get(source, source)
                for_all.add(out)
    if not tied:
        return points, tied
    kept = [p for p in points if not (p.kind == "activation" and p.tensor in tied and p.consumer is not None)]
    have = {p.tensor for p in kept if p.kind == "activation" and p.consumer is None}
    kept += [QuantPoint(t, None, None, "activation", "tied_output", node=view.producer[t].name)
             for t in tied if t not in have]
    return kept, tied


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


class NothingToQuantize(UsageError):
    """Every quantizable operator stays float (named why): ``deploy`` then ships FP32."""


def why_nothing(plan: QdqPlan, options: QuantizeOptions) -> str:
    """Why no Q/DQ point is left, from the plan's own records (exclusions the user gave, rules)."""
    def some(names: Sequence[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    why = []
    if plan.excluded:
        why.append(f"{len(plan.excluded)} excluded by --exclude-op/--exclude-node ({some(plan.excluded)})")
    if plan.kept_float:
        why.append(f"{len(plan.kept_float)} small convolution(s) kept in float for {options.target.name} (reduction "
                   f"Cin*kh*kw below {options.ort_min_reduction}: its float kernel is faster; {some(plan.kept_float)})")
    if plan.auto_float:
        first = next(iter(plan.auto_float.items()))
        why.append(f"{len(plan.auto_float)} kept in float by the placement rules (e.g. {first[0]}: {first[1]})")
    if not why:
        why.append("the placement rules place no Q/DQ (the only quantizable inputs are graph outputs or constants)")
    return "nothing to quantize: every quantizable operator stays float: " + "; ".join(why)
