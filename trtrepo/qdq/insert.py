"""Quantization parameters and the insertion of Q/DQ nodes: activation and weight scales, INT32
biases that fit, and the explicitly quantized model."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import TrtrepoError, UsageError
from ..onnxgraph import GraphView
from ..warngroups import Cause, Detail, in_run
from .graph import decompose_inner_softmax, drop_unused_initializers, prepare_model, weights_as_inputs
from .options import (
    CHECK_FULL_BYTES,
    INT8_MAX,
    INT8_REDUCED_MAX,
    WEIGHTED_OPS,
    ActivationRange,
    QdqTarget,
    QuantizeOptions,
    QuantPoint,
    RangeLike,
    as_range,
)
from .plan import NothingToQuantize, QdqPlan, plan_qdq, why_nothing
from .rules import REQUIRED_RULES

log = logging.getLogger(__name__)

# The warnings that repeat per layer and per candidate model (trtrepo.warngroups): a quantize run
# prints one line per cause, the details go to its report.
INT32_BIAS = Cause("int32_bias", "int32 bias: raised {count} weight scale(s) in {subjects} layer(s), near-dead channels "
                   "(tiny weights, large bias)", subject="layer", counted="weight_scales")
UNIT_WITHOUT_RANGE = Cause("unit_without_range", "no range for {subjects} tensor(s) of ONNX Runtime node units: those "
                           "units run in float", subject="tensor")
# --------------------------------------------------------------------------------------------
# Quantization parameters


@dataclass(frozen=True)
class QParams:
    scale: np.ndarray  # float32, scalar or 1-D
    zero_point: np.ndarray  # int8 / uint8 / int32, same shape
    axis: int | None = None


def activation_qparams(rng: ActivationRange, target: QdqTarget, nonneg: bool = False, tensor: str = "") -> QParams:
    """By the target's ``activations`` scheme: ``symmetric`` (TensorRT): int8, ``scale = amax / 127``,
    zp 0; ``asymmetric`` (ONNX Runtime): uint8 over ``[max(lo, -amax), min(hi, amax)]`` widened to
    contain 0 (``[0, amax]`` for a non-negative tensor without measured bounds, else ``[-amax, amax]``)."""
    amax = float(rng.amax)
    if not np.isfinite(amax) or amax < 0:
        raise UsageError(f"tensor '{tensor}': invalid range amax={rng.amax!r}")
    if target.activations == "symmetric":
        scale = amax / INT8_MAX if amax > 0 else 1.0
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


def weight_qparams(w: np.ndarray, axis: int | None, qmax: float = INT8_MAX) -> QParams:
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


def quantize_weight(w: np.ndarray, qp: QParams, qmax: float = INT8_MAX) -> np.ndarray:
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
    warnings: tuple[Detail, ...] = ()  # per layer or tensor (trtrepo.warngroups): int32 biases, units without a range


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


def _raise_scale(qp: QParams, floor: np.ndarray, weight: str, nodes: Sequence[str]) -> tuple[QParams, Detail | None]:
    """``qp`` with its scales raised to ``floor`` where they are below it, and the warning saying
    so (None: nothing raised)."""
    low = qp.scale.astype(np.float64) < floor
    if not np.any(low):
        return qp, None
    scale = np.maximum(qp.scale.astype(np.float64), floor).astype(np.float32).reshape(qp.scale.shape)
    raised = int(np.count_nonzero(low))
    named = ", ".join(f"'{n}'" for n in nodes)
    message = (f"{named}: the int32 bias does not fit at scale s_x * s_w for {raised} of "
               f"{int(low.size)} weight scale(s) of '{weight}' (near-dead channels: tiny weights, large bias); raised "
               "those scales so that it fits (clipped, the bias would lose its value; left float, ONNX Runtime would "
               "quantize it itself and overflow)")
    return replace(qp, scale=scale), Detail(INT32_BIAS, tuple(nodes), raised, message)


def insert_qdq(model: Any, ranges: Mapping[str, RangeLike], options: QuantizeOptions | None = None,
               *, source: str = "ranges", warn: bool = True) -> QuantizedModel:
    """Return a copy of ``model`` with Q/DQ nodes placed by the target's rules.

    ``ranges`` maps activation tensor names to an amax (float) or an :class:`ActivationRange`.
    Every activation the plan quantizes must be covered; otherwise a :class:`UsageError` names
    the first missing tensor. Raises when the model has no quantizable operator.

    The warnings that repeat per layer (int32 biases that needed a larger weight scale, ONNX
    Runtime node units without a range) are the result's ``warnings``; they are logged here one
    per case only outside a run that groups them (:mod:`trtrepo.warngroups`), which reports those
    of the model it ships."""
    import onnx

    options = options or QuantizeOptions()
    work = prepare_model(model)
    view = GraphView(work)
    plan, found = _covered_plan(work, view, ranges, options, source, warn)
    ranges = plan.tie(ranges)
    writer = _QdqWriter(work, view)
    act_q = writer.activations(plan, ranges, options)
    qmax = INT8_REDUCED_MAX if options.reduce_range else INT8_MAX
    biases = _int32_biases(view, plan, act_q, writer.rewires)
    floors = _bias_scale_floors(view, biases, act_q, options.per_channel, qmax)
    weight_dq, raised = writer.weights(plan, floors, options.target, qmax)
    found += raised
    if not in_run():
        for detail in found:
            log.warning("%s", detail.message)
    writer.biases(biases, weight_dq, act_q, qmax)
    writer.rebuild()
    if options.target.integer_kernels:  # a model for ONNX Runtime's kernels; after the plan, which reads the Softmax
        decompose_inner_softmax(work)
    # Weights now only read through Q/DQ (onnxruntime target: as int8) can be dropped when unused.
    drop_unused_initializers(work)
    try:
        # The checker serializes the model: for a large one (a copy of every weight) check the
        # graph without the weights; ONNX Runtime checks the rest when it loads the model.
        onnx.checker.check_model(work if work.ByteSize() < CHECK_FULL_BYTES else weights_as_inputs(work))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrtrepoError(f"the Q/DQ model fails onnx.checker: {first}") from exc
    return QuantizedModel(work, plan, act_q, tuple(found))


def _covered_plan(work: Any, view: GraphView, ranges: Mapping[str, RangeLike], options: QuantizeOptions,
                  source: str, warn: bool) -> tuple[QdqPlan, list[Detail]]:
    """The target's plan for ``work``, its activation points reduced to those ``ranges`` cover,
    and the warning about the dropped ones.

    Inputs of the weighted ops and TensorRT's residual inputs must have ranges; the extra tensors
    of ONNX Runtime node units (Add/Mul/pool inputs, op outputs) are dropped with a warning when
    the ranges lack them (those units then run in float)."""
    if not any(n.op_type in WEIGHTED_OPS for n in view.nodes):
        raise UsageError(f"the model has no quantizable operator ({', '.join(WEIGHTED_OPS)}); nothing to quantize")
    plan = plan_qdq(work, options, view=view, ranges=ranges)
    if warn:
        warn_float(plan)
    if not plan.points:
        raise NothingToQuantize(why_nothing(plan, options))
    required = {p.tensor for p in plan.points if p.kind == "activation" and p.rule in REQUIRED_RULES}
    missing = [t for t in plan.activation_tensors() if t in required and t not in ranges]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"{source} do not cover the model: no range for tensor '{missing[0]}'{more}; "
                         "were they calibrated on another model?")
    tied = plan.tie(ranges)
    optional_missing = [t for t in plan.activation_tensors() if t not in tied]
    found: list[Detail] = []
    if optional_missing:
        found.append(Detail(UNIT_WITHOUT_RANGE, tuple(optional_missing), len(optional_missing),
                            f"{source} have no range for {len(optional_missing)} tensor(s) of ONNX Runtime node units "
                            f"(e.g. '{optional_missing[0]}'); those units run in float"))
        plan.points = [p for p in plan.points if not (p.kind == "activation" and p.tensor in optional_missing)]
    return plan, found


class _QdqWriter:
    """The rewrite of one graph: fresh names, new initializers, the Q/DQ nodes to insert after
    each tensor's producer (key None: before every node) and the consumer inputs to rewire."""

    def __init__(self, work: Any, view: GraphView) -> None:
        self.work, self.view = work, view
        used = {n for node in work.graph.node for n in list(node.input) + list(node.output)}
        self.used_names = used | set(view.initializers) | {i.name for i in work.graph.input}
        self.new_inits: list[Any] = []
        self.inserted_after: dict[str | None, list[Any]] = defaultdict(list)
        self.rewires: dict[tuple[str, int], str] = {}  # (node name, input index) -> new input

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used_names:
            name = f"{base}_{k}"
            k += 1
        self.used_names.add(name)
        return name

    def add_init(self, base: str, array: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(base)
        self.new_inits.append(numpy_helper.from_array(array, name))
        return name

    def anchor(self, tensor: str) -> str | None:
        prod = self.view.producer.get(tensor)
        return prod.name if prod is not None else None

    def node(self, op: str, inputs: list[str], output: str, base: str, **kw: Any) -> Any:
        from onnx import helper

        return helper.make_node(op, inputs, [output], name=self.fresh(f"{base}_{op}"), **kw)

    def activations(self, plan: QdqPlan, ranges: Mapping[str, RangeLike], options: QuantizeOptions) -> dict[str, QParams]:
        """One Q -> DQ pair per activation tensor, shared by the consumers the plan names."""
        act_q: dict[str, QParams] = {}
        act_dq_out: dict[str, str] = {}
        act_q_out: dict[str, str] = {}
        params: dict[str, tuple[str, str]] = {}  # tensor -> its scale and zero-point initializers
        tensors = plan.activation_tensors()
        for tensor in sorted(tensors, key=lambda t: t in plan.tied):  # a tied output after its source
            source = plan.tied.get(tensor, tensor)
            if source in params:  # tied (QdqPlan.tied): the source's very initializers
                act_q[tensor] = act_q[source]
                s, z = params[source]
            else:
                qp = activation_qparams(as_range(ranges[tensor]), options.target,
                                        nonneg=self.view.non_negative(tensor), tensor=tensor)
                act_q[tensor] = qp
                s = self.add_init(f"{tensor}_scale", qp.scale)
                z = self.add_init(f"{tensor}_zero_point", qp.zero_point)
            params[tensor] = (s, z)
            q_out, dq_out = self.fresh(f"{tensor}_quantized"), self.fresh(f"{tensor}_dequantized")
            q_in = tensor
            if tensor in self.view.graph_outputs:  # the naive detector placement: the output keeps its name
                q_in, dq_out = self.fresh(f"{tensor}_float"), tensor
                producer = self.view.producer[tensor]
                producer.output[list(producer.output).index(tensor)] = q_in
            self.inserted_after[self.anchor(tensor)] += [
                self.node("QuantizeLinear", [q_in, s, z], q_out, tensor),
                self.node("DequantizeLinear", [q_out, s, z], dq_out, tensor),
            ]
            act_dq_out[tensor], act_q_out[tensor] = dq_out, q_out
        excluded = set(plan.excluded)
        # A Shape reads only the shape: on ONNX Runtime's kernels it reads the quantized tensor, so no
        # DQ runs just for it (a dynamic YOLO export's anchors read the shapes of three feature maps;
        # their DQs, whose only reader was a Shape, cost 4 ms of 155 at batch 8). TensorRT wants each
        # Q read by DQs only: there the Shape reads the DQ.
        shape_reads_q = options.target.integer_kernels
        for p in plan.points:
            if p.kind != "activation":
                continue
            if p.consumer is not None:
                self.rewires[(p.consumer, p.input_index)] = act_dq_out[p.tensor]  # type: ignore[index]
            else:
                for node, idx in self.view.consumers.get(p.tensor, []):
                    if node.name not in excluded:
                        reads_q = shape_reads_q and node.op_type == "Shape"
                        self.rewires[(node.name, idx)] = (act_q_out if reads_q else act_dq_out)[p.tensor]
        return act_q

    def weights(self, plan: QdqPlan, floors: Mapping[tuple[str, int | None], Any], target: QdqTarget,
                qmax: float) -> tuple[dict[tuple[str, int | None], tuple[str, QParams]], list[Detail]]:
        """Per-channel (or per-tensor) symmetric weights, by the target's ``weights`` form: ``qdq``:
        FP32 behind Q -> DQ (TensorRT quantizes them at build time); ``int8``: int8 initializers
        behind a DQ (ONNX Runtime). Also the warnings of the scales raised for an int32 bias."""
        weight_dq: dict[tuple[str, int | None], tuple[str, QParams]] = {}
        raised: list[Detail] = []
        for p in plan.points:
            if p.kind != "weight":
                continue
            key = (p.tensor, p.axis)
            if key not in weight_dq:
                w = self.view.constant_array(p.tensor).astype(np.float32)
                qp = weight_qparams(w, p.axis, qmax)
                if key in floors:
                    qp, detail = _raise_scale(qp, floors[key][0], p.tensor, floors[key][1])
                    raised += [detail] if detail is not None else []
                s = self.add_init(f"{p.tensor}_scale", qp.scale)
                z = self.add_init(f"{p.tensor}_zero_point", qp.zero_point)
                axis_kw: dict[str, Any] = {"axis": p.axis} if p.axis is not None else {}
                dq_out = self.fresh(f"{p.tensor}_dequantized")
                if target.weights == "qdq":
                    q_out = self.fresh(f"{p.tensor}_quantized")
                    nodes = [self.node("QuantizeLinear", [p.tensor, s, z], q_out, p.tensor, **axis_kw),
                             self.node("DequantizeLinear", [q_out, s, z], dq_out, p.tensor, **axis_kw)]
                else:
                    wq = self.add_init(f"{p.tensor}_quantized", quantize_weight(w, qp, qmax))
                    nodes = [self.node("DequantizeLinear", [wq, s, z], dq_out, p.tensor, **axis_kw)]
                self.inserted_after[self.anchor(p.tensor)] += nodes
                weight_dq[key] = (dq_out, qp)
            self.rewires[(p.consumer, p.input_index)] = weight_dq[key][0]  # type: ignore[index]
        return weight_dq, raised

    def biases(self, biases: Sequence[Any], weight_dq: Mapping[tuple[str, int | None], tuple[str, QParams]],
               act_q: Mapping[str, QParams], qmax: float) -> None:
        """Biases (onnxruntime target): int32 with scale ``s_x * s_w`` once input and weight are
        quantized; the weight scales were raised where a bias would not fit (_bias_scale_floors)."""
        for unit in biases:
            p, node, x_name, w_key, b = unit.point, unit.node, unit.x, unit.weight, unit.bias
            w_qp = weight_dq[w_key][1]
            n_out = int(b.size)
            w_scale = np.broadcast_to(w_qp.scale, (n_out,)) if w_qp.scale.ndim == 0 else w_qp.scale
            if w_scale.shape != (n_out,):
                continue
            b_scale = (act_q[x_name].scale.astype(np.float64) * w_scale.astype(np.float64)).astype(np.float32)
            # In float64: in float32 the bound 2**31 - 1 rounds up to 2**31 and the cast wrapped a
            # saturated positive bias to -2**31. With the raised scales nothing reaches the limit;
            # the clip is a backstop that keeps the sign.
            limit = _bias_limit(unit.reduction, qmax)
            bq = np.clip(np.rint(b.astype(np.float64) / b_scale.astype(np.float64)), -limit, limit).astype(np.int32)
            bq_name = self.add_init(f"{p.tensor}_quantized", bq)
            s = self.add_init(f"{p.tensor}_scale", b_scale)
            z = self.add_init(f"{p.tensor}_zero_point", np.zeros(n_out, np.int32))
            dq_out = self.fresh(f"{p.tensor}_dequantized")
            self.inserted_after[None].append(self.node("DequantizeLinear", [bq_name, s, z], dq_out, p.tensor, axis=0))
            self.rewires[(node.name, 2)] = dq_out

    def rebuild(self) -> None:
        """The node list in topological order: Q/DQ right after their tensor's producer."""
        nodes_out = list(self.inserted_after.get(None, []))
        for node in self.work.graph.node:
            for i in range(len(node.input)):
                new = self.rewires.get((node.name, i))
                if new is not None:
                    node.input[i] = new
            nodes_out.append(node)
            nodes_out.extend(self.inserted_after.get(node.name, []))
        del self.work.graph.node[:]
        self.work.graph.node.extend(nodes_out)
        self.work.graph.initializer.extend(self.new_inits)


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
