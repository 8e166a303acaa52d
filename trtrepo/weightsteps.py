"""Weight steps of ``quantize``: bias correction and AdaRound on an ONNX model (the adapter
around the numpy algorithms of :mod:`trtrepo.weightmath`).

A weight step returns a new FP32 model whose quantized layers carry weights that already lie on
their INT8 grid (``q * scale``) and corrected biases. The Q/DQ writer (:func:`trtrepo.qdq.insert_qdq`)
derives the same per-channel scales from them and reproduces the chosen integers, so the result
is plain INT8 weights in the Q/DQ model: ONNX Runtime and TensorRT run it unchanged. (The one
exception is the writer's own: a near-dead channel whose bias does not fit int32 at
``s_x * s_w`` gets a larger weight scale there, and so a different rounding.)

Decisions:

* The layers are the Conv (2-D, any ``group``, depthwise included) and Gemm layers whose weights
  the Q/DQ plan quantizes. MatMul layers (transformer encoders) keep nearest rounding.
* Local inputs (:func:`collect_moments`, :func:`round_weights`): one pass of the FP32 model over
  the calibration data; a layer's quantized input is its FP32 input through the Q/DQ parameters
  the writer gives it. Each layer keeps only the moments of a bounded random sample of input
  patches (:data:`ROWS_PER_LAYER`): memory is ``K x K`` per group and layer however many samples.
* Sequential inputs (:func:`round_weights_sequential`, AdaRound for the tensorrt target, see
  :func:`sequential_inputs`): each layer's quantized input comes from the Q/DQ network with the
  weights rounded so far, so a layer also absorbs its predecessors' error; the Q/DQ network runs
  piece by piece over :data:`SEQUENTIAL_BATCHES` batches (each node once per batch), the FP32 one
  once per group of layers whose input patches fit :data:`FP32_PATCH_BYTES`. Bias correction stays local for both
  targets: its sequential form over-corrects (measured in docs/benchmarks.md, "Issue 26").
* AdaRound's iterations fit a **wall-time** budget (:class:`AdaRoundBudget`), not an iteration
  count: before each layer the budget's seconds not yet spent are shared over the remaining
  layers by their cost, at the speed measured on the layers done so far; at most
  :data:`ADAROUND_ITERATIONS` a layer, and a layer whose share is under :data:`MIN_ITERATIONS`
  keeps nearest rounding (plus the bias correction). So the iterations end near their budget on a
  busy machine too, where an iteration count had taken 16x its quiet time (issue 40). The gradients are exact (full batch, from the
  moments), so a few hundred Adam steps suffice, and the cap keeps a small model from spending most
  of its quantize time here (the demo CNN: 1000 iterations cost 6.7 of its 14 s quantize step and
  changed none of its held-out figures).
* AdaRound's numpy runs with one BLAS thread (:func:`_one_blas_thread`): its matrices are small
  (a layer's ``K x K`` Gram matrix), and OpenBLAS's second thread waits by spinning, which on a
  machine shared with other work made each iteration about 3x slower than one thread
  (docs/benchmarks.md, "Issue 40: AdaRound on a busy machine").
* A layer whose patch sample is smaller than twice its input width (a classifier on few images)
  keeps nearest rounding: its moments cannot pin ``K`` roundings down.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from . import weightmath as W
from .data import iter_batches
from .modelio import with_outputs, without_weights
from .onnxgraph import GraphView, consumer_map, make_session, producer_map
from .progress import phase
from .qdq import (
    QdqTarget,
    QParams,
    QuantizeOptions,
    activation_qparams,
    as_range,
    insert_qdq,
    plan_qdq,
    weight_qparams,
)

log = logging.getLogger(__name__)

STEPS = W.ROUNDING_STEPS
STEP_LABELS = {"nearest": "nearest", "bias_correction": "bias correction", "adaround": "AdaRound"}  # progress lines
ROWS_PER_LAYER = 4096  # input patches sampled per layer
ADAROUND_ITERATIONS = 300
MIN_ITERATIONS = 50  # a layer whose share of the budget is fewer Adam steps keeps nearest rounding
DEFAULT_BUDGET_S = 30.0  # wall time of AdaRound's iterations over the whole model
BATCH_SIZE = 16  # samples per collection batch
MAX_SAMPLES = 512  # calibration samples the statistics pass reads
ITERATION_RATE = 3e10  # cost units (multiply-adds) a second assumed before the first layer is measured
ITERATION_OVERHEAD = 5e6  # ... and an iteration's fixed cost in those units (~0.15 ms of numpy calls)
SEQUENTIAL_BATCHES = 4  # batches (of BATCH_SIZE) a sequential step passes through the network per layer
FP32_PATCH_BYTES = 256 << 20  # FP32 input patches a sequential step holds ahead of the layers that use them


def sequential_inputs(target: QdqTarget) -> bool:
    """Whether AdaRound takes each layer's quantized input from the Q/DQ network with the weights
    rounded so far (:func:`round_weights_sequential`) rather than the FP32 input fake-quantized
    locally (:func:`round_weights`). Sequential for a target whose Q/DQ graph run in float is what
    its runtime computes (tensorrt); local for a target with ``integer_kernels`` (onnxruntime: its
    QLinearConv, QLinearAdd, ... differ from that float simulation by about as much as the
    quantization error itself, so corrections fitted to the simulation miss; docs/benchmarks.md,
    "Issue 26: weight steps on the trained MobileNetV2")."""
    return not target.integer_kernels


@dataclass
class Layer:
    """One quantized layer in grouped-matrix form (see :mod:`trtrepo.weightmath`)."""

    node: str
    op: str
    input: str
    weight: str
    bias: str | None
    groups: int
    weight_shape: tuple[int, ...]
    transposed: bool = False  # Gemm transB=0: the weight is [K, O]
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    axis: int | None = 0  # the writer's per-channel axis (None: per tensor)

    @property
    def k(self) -> int:
        if self.op == "Conv":
            return int(np.prod(self.weight_shape[1:]))
        return self.weight_shape[0] if self.transposed else self.weight_shape[1]

    @property
    def outputs(self) -> int:
        if self.op == "Conv":
            return self.weight_shape[0]
        return self.weight_shape[1] if self.transposed else self.weight_shape[0]

    def grouped(self, w: np.ndarray) -> np.ndarray:
        """``[G, Og, K]`` view of the ONNX weight."""
        if self.op == "Conv":
            return w.reshape(self.groups, self.outputs // self.groups, -1)
        return (w.T if self.transposed else w)[None]

    def ungrouped(self, g: np.ndarray) -> np.ndarray:
        if self.op == "Conv":
            return g.reshape(self.weight_shape)
        return np.ascontiguousarray(g[0].T if self.transposed else g[0])

    def patches(self, x: np.ndarray, rows: int, rng: np.random.Generator) -> np.ndarray:
        """A random sample of about ``rows`` input patches of batch ``x``, ``[n, G, K]``."""
        if self.op != "Conv":
            flat = x.reshape(-1, x.shape[-1])
            take = rng.choice(len(flat), size=min(rows, len(flat)), replace=False)
            return flat[np.sort(take)][:, None, :]
        b, c, h, w_ = x.shape
        kh, kw = self.weight_shape[2], self.weight_shape[3]
        pt, pl, pb, pr = self.pads
        (sh, sw), (dh, dw) = self.strides, self.dilations
        ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        wo = (w_ + pl + pr - dw * (kw - 1) - 1) // sw + 1
        per_image = max(1, min(ho * wo, -(-rows // b)))
        pos = rng.choice(ho * wo, size=per_image, replace=False)
        oy, ox = pos // wo, pos % wo
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if any(self.pads) else x
        r = oy[:, None] * sh + np.arange(kh) * dh  # [P, kh]
        q = ox[:, None] * sw + np.arange(kw) * dw  # [P, kw]
        p = xp[:, :, r[:, :, None], q[:, None, :]]  # [B, C, P, kh, kw]
        p = p.transpose(0, 2, 1, 3, 4).reshape(b * per_image, self.groups, -1)
        return p


def find_layers(model: Any, options: QuantizeOptions, ranges: Mapping[str, Any]) -> list[Layer]:
    """The Conv/Gemm layers whose constant weight the Q/DQ plan quantizes per output channel."""
    view = GraphView(model)
    plan = plan_qdq(model, options, view=view, ranges=ranges)
    weighted = {p.consumer: p.axis for p in plan.points if p.kind == "weight" and p.input_index == 1}
    layers = []
    for node in view.nodes:
        if node.name not in weighted or node.op_type not in ("Conv", "Gemm"):
            continue
        if not view.is_constant(node.input[1]) or not view.is_float_activation(node.input[0]):
            continue
        if len(view.consumers[node.input[1]]) != 1:
            continue  # a weight shared with another node: rounding it for this layer would change the other
        shape = tuple(view.constant_array(node.input[1]).shape)
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias is not None and (not view.is_constant(bias) or len(view.consumers[bias]) != 1):
            continue
        if node.op_type == "Conv":
            if len(shape) != 4 or view.attr(node, "auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                continue
            pads = tuple(view.attr(node, "pads", [0, 0, 0, 0]))
            layers.append(Layer(node.name, "Conv", node.input[0], node.input[1], bias, int(view.attr(node, "group", 1)), shape,
                                pads=(pads[0], pads[1], pads[2], pads[3]),
                                strides=tuple(view.attr(node, "strides", [1, 1])),  # type: ignore[arg-type]
                                dilations=tuple(view.attr(node, "dilations", [1, 1])),  # type: ignore[arg-type]
                                axis=weighted[node.name]))
        else:
            if (view.attr(node, "transA", 0) or float(view.attr(node, "alpha", 1.0)) != 1.0
                    or float(view.attr(node, "beta", 1.0)) != 1.0 or len(shape) != 2):
                continue
            if bias is not None and view.constant_array(bias).size != shape[0 if view.attr(node, "transB", 0) else 1]:
                continue
            layers.append(Layer(node.name, "Gemm", node.input[0], node.input[1], bias, 1, shape,
                                transposed=not view.attr(node, "transB", 0), axis=weighted[node.name]))
    return layers


def fake_quantize(x: np.ndarray, qp: QParams) -> np.ndarray:
    """What a Q -> DQ pair of ``qp`` does to ``x`` (round half to even, as ONNX)."""
    s = float(qp.scale)
    zp = int(qp.zero_point)
    lo, hi = (0, 255) if qp.zero_point.dtype == np.uint8 else (-128, 127)
    return ((np.clip(np.rint(x / s) + zp, lo, hi) - zp) * s).astype(np.float32)


def cached_batches(source: Any, io: Any, batch_size: int = BATCH_SIZE, max_samples: int = MAX_SAMPLES) -> list[Any]:
    """Up to ``max_samples`` calibration samples in batches, held in memory for the passes of a
    weight step."""

    out, n = [], 0
    for batch in iter_batches(source, batch_size, io):
        out.append(batch)
        n += len(next(iter(batch.inputs.values())))
        if n >= max_samples:
            break
    return out


def collect_moments(model: Any, layers: Sequence[Layer], batches: Sequence[Any], act_qparams: Mapping[str, QParams], *,
                    rows_per_layer: int = ROWS_PER_LAYER, threads: int | None = None,
                    seed: int = 0) -> dict[str, W.InputMoments]:
    """One pass of the FP32 ``model`` over ``batches``: each layer's input patches, FP32 and
    fake-quantized with the Q/DQ parameters its input gets (``act_qparams``; absent: float),
    reduced to :class:`~trtrepo.weightmath.InputMoments`."""

    names = list(dict.fromkeys(la.input for la in layers))
    session = make_session(with_outputs(model, names), threads=threads, arena=False, spin=False)
    n_images = max(sum(_count(b) for b in batches), 1)
    moments = {la.node: W.InputMoments(la.groups, la.k) for la in layers}
    with phase("weight rounding (layer input statistics)", len(batches), "batches") as ph:
        for i, batch in enumerate(batches):
            got = dict(zip(names, session.run(names, batch.inputs), strict=True))
            for j, la in enumerate(layers):
                x = got[la.input]
                p = la.patches(x, _rows(la, x, rows_per_layer, _count(batch), n_images), np.random.default_rng((seed, i, j)))
                p = p.astype(np.float32, copy=False)
                qp = act_qparams.get(la.input)
                with _one_blas_thread():
                    moments[la.node].add(p, fake_quantize(p, qp) if qp is not None else p)
            del got
            ph.advance()
    return moments


def _count(batch: Any) -> int:
    return len(next(iter(batch.inputs.values())))


def _rows(layer: Layer, x: np.ndarray, rows: int, n: int, n_images: int) -> int:
    r = max(1, int(round(rows * n / n_images)))
    if layer.op != "Conv":
        r = max(r, min(int(np.prod(x.shape[:-1], dtype=np.int64)), rows))
    return r


@dataclass
class LayerReport:
    node: str
    op: str
    k: int
    groups: int
    patches: int
    adaround: str  # "learned", "nearest kept (no gain)", "nearest (too few patches)", "-"
    iterations: int = 0
    loss_nearest: float = 0.0  # mean squared output error with nearest rounding (calibration inputs)
    loss_after: float = 0.0  # the same after the step (mean error corrected)
    bias_shift: float = 0.0  # max |bias correction| / max |bias|


@dataclass(frozen=True)
class SequentialWork:
    """How much work :func:`round_weights_sequential` does: AdaRound's time for the whole model and
    its iteration cap per layer, the input patches sampled per layer and the seed of that sample."""

    budget_s: float = DEFAULT_BUDGET_S
    iterations: int = ADAROUND_ITERATIONS
    rows_per_layer: int = ROWS_PER_LAYER
    seed: int = 0


@dataclass
class WeightStepResult:
    step: str
    model: Any
    layers: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0
    budget_cut: int = 0  # layers that kept nearest rounding because AdaRound's time budget was spent
    budget_short: int = 0  # layers whose AdaRound ran fewer than its cap of steps for lack of time


def _cost(layer: Layer) -> float:
    """One AdaRound iteration's cost: its multiply-adds plus the fixed cost of its ~20 numpy calls."""
    og = layer.outputs // layer.groups
    return float(layer.groups * og * layer.k * (layer.k + 8)) + ITERATION_OVERHEAD


def _round_layer(layer: Layer, w: np.ndarray, m: W.InputMoments, step: str, qmax: float,
                 budget: AdaRoundBudget | None) -> tuple[np.ndarray, np.ndarray, LayerReport]:
    """One layer: its rounded weights (ONNX layout), the bias shift to subtract and its report."""
    g = layer.grouped(w)
    qp = weight_qparams(w, layer.axis, qmax)  # the writer's own scales
    scale = np.broadcast_to(qp.scale, (layer.outputs,)).reshape(layer.groups, -1).astype(np.float32)
    rep = LayerReport(layer.node, layer.op, layer.k, layer.groups, m.count, "-")
    q = W.round_nearest(g, scale, qmax)
    rep.loss_nearest = float(W.reconstruction_loss(g, q * scale[..., None], m).sum())
    if step == "adaround" and budget is not None:
        n_iter = budget.iterations(layer) if m.count >= 2 * layer.k else 0
        if m.count < 2 * layer.k:
            rep.adaround = "nearest (too few patches)"
            budget.done(layer, 0, 0.0)
        elif n_iter == 0:
            rep.adaround = "nearest (time budget spent)"
            budget.done(layer, 0, 0.0)
        else:
            t0 = time.perf_counter()
            with _one_blas_thread():
                res = W.adaround(g, scale, m, qmax=qmax, iterations=n_iter)
            budget.done(layer, n_iter, time.perf_counter() - t0)
            rep.iterations = res.iterations
            rep.adaround = "nearest kept (no gain)" if res.kept_nearest else "learned"
            q = res.q
    ws = (q * scale[..., None]).astype(np.float32)
    shift = W.bias_shift(g, ws, m).reshape(-1)
    # the layer's own error after the step: the mean output error is corrected away
    rep.loss_after = float(max(W.reconstruction_loss(g, ws, m).sum() - np.sum(shift ** 2), 0.0))
    return layer.ungrouped(ws).astype(np.float32), shift, rep


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """numpy's BLAS limited to one thread inside the block (threadpoolctl)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


class AdaRoundBudget:
    """AdaRound's wall-time budget over one weight step's layers (see the module docstring).

    ``iterations(layer)`` before a layer's AdaRound, ``done(layer, iterations, seconds)`` after it:
    the budget's seconds not yet spent in AdaRound's iterations are shared over the remaining
    layers' cost at the speed measured so far (cost units a second over the layers done,
    :data:`ITERATION_RATE` before the first). The budget counts AdaRound's own iterations, the
    part that grows with it; the sequential form's probe runs and the moments are the same work
    whatever the budget (``other(seconds)`` records them for the report). ``cut`` counts the
    layers that kept nearest rounding for lack of time, ``short`` those that learned with fewer
    steps than the cap: either makes the file depend on the machine's speed and load, so both are
    reported (the trained YOLO11n needs 25-26 s of the 30 s at the cap; one of two quiet runs of
    one command wrote another file, about 0.01 of mAP apart; docs/benchmarks.md, "Issue 43:
    AdaRound's iterations")."""

    def __init__(self, layers: Sequence[Layer], budget_s: float, cap: int = ADAROUND_ITERATIONS) -> None:
        self.start = time.perf_counter()
        self.deadline = self.start + budget_s
        self.cap = cap
        self.remaining = {la.node: _cost(la) for la in layers}
        self.work_done = 0.0  # cost x iterations of the layers done ...
        self.work_seconds = 0.0  # ... and the seconds they took
        self.other_seconds = 0.0
        self.other_layers = 0
        self.cut = 0
        self.short = 0

    @property
    def rate(self) -> float:
        return self.work_done / self.work_seconds if self.work_seconds > 0 else ITERATION_RATE

    def iterations(self, layer: Layer) -> int:
        left = self.deadline - self.start - self.work_seconds
        total = sum(self.remaining.values()) or 1.0
        n = min(self.cap, int(max(left, 0.0) * self.rate / total))
        if self.work_seconds == 0.0 and left > 0:  # the first layer runs at least the floor: it measures the speed
            n = max(n, MIN_ITERATIONS)
        if n < MIN_ITERATIONS:
            self.cut += 1
            return 0
        self.short += n < self.cap
        return n

    def done(self, layer: Layer, iterations: int, seconds: float) -> None:
        cost = self.remaining.pop(layer.node, _cost(layer))
        if iterations:
            self.work_done += cost * iterations
            self.work_seconds += seconds

    def other(self, seconds: float) -> None:
        self.other_seconds += seconds
        self.other_layers += 1

    def note(self) -> str:
        cut = f"; {self.cut} layer(s) kept nearest rounding for lack of time" if self.cut else ""
        cut += f"; {self.short} layer(s) ran fewer than {self.cap} steps for lack of time" if self.short else ""
        other = f" (besides {self.other_seconds:.1f}s for the layers' inputs)" if self.other_layers else ""
        return f"AdaRound iterations {self.work_seconds:.1f}s of their {self.deadline - self.start:.0f}s budget{other}{cut}"


def _result(step: str, model: Any, reports: list[LayerReport], t0: float, budget: AdaRoundBudget) -> WeightStepResult:
    """A weight step's result, with what AdaRound's budget cut or shortened (logged too)."""
    if step != "adaround":
        return WeightStepResult(step, model, reports, time.perf_counter() - t0)
    log.info("%s", budget.note())
    return WeightStepResult(step, model, reports, time.perf_counter() - t0, budget.cut, budget.short)


def _write(model: Any, layers: Sequence[Layer], weights: Mapping[str, np.ndarray], shifts: Mapping[str, np.ndarray],
           reports: Sequence[LayerReport]) -> Any:
    """A copy of ``model`` with the new weights and the biases minus their shifts."""
    import onnx
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    nodes = {n.name: n for n in out.graph.node}
    for layer, rep in zip(layers, reports, strict=True):
        shift = shifts[layer.node]
        inits[layer.weight].CopyFrom(numpy_helper.from_array(weights[layer.node], layer.weight))
        if layer.bias is not None:
            b = numpy_helper.to_array(inits[layer.bias]).astype(np.float32)
            inits[layer.bias].CopyFrom(numpy_helper.from_array((b - shift).astype(np.float32), layer.bias))
            rep.bias_shift = float(np.max(np.abs(shift)) / max(float(np.max(np.abs(b))), 1e-12))
        elif np.any(shift):
            name = f"{layer.weight}_corrected_bias"
            out.graph.initializer.append(numpy_helper.from_array((-shift).astype(np.float32), name))
            node = nodes[layer.node]
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = name
    return out


def round_weights(model: Any, layers: Sequence[Layer], moments: Mapping[str, W.InputMoments], step: str,
                  options: QuantizeOptions, *, budget_s: float = DEFAULT_BUDGET_S,
                  iterations: int = ADAROUND_ITERATIONS) -> WeightStepResult:
    """A copy of ``model`` with the layers' weights rounded by ``step``: ``bias_correction``
    (nearest rounding, bias corrected for the expected output error) or ``adaround`` (learned
    rounding, then the same correction), each layer from its own input moments."""
    from onnx import numpy_helper

    if step not in STEPS[1:]:
        raise ValueError(f"unknown weight step {step!r}")
    t0 = time.perf_counter()
    qmax = 64.0 if options.reduce_range else 127.0
    inits = {t.name: t for t in model.graph.initializer}
    budget = AdaRoundBudget([la for la in layers if moments[la.node].count >= 2 * la.k], budget_s, iterations)
    weights, shifts, reports = {}, {}, []
    with phase(f"weight rounding ({STEP_LABELS[step]})", len(layers), "layers") as ph:
        for layer in layers:
            w = numpy_helper.to_array(inits[layer.weight]).astype(np.float32)
            weights[layer.node], shifts[layer.node], rep = _round_layer(layer, w, moments[layer.node], step, qmax, budget)
            reports.append(rep)
            ph.advance()
    return _result(step, _write(model, layers, weights, shifts, reports), reports, t0, budget)


def _drop_dead(model: Any) -> None:
    """Remove nodes whose outputs nothing reads, then unused initializers."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        used = {i for n in graph.node for i in n.input} | outputs
        keep = [n for n in graph.node if any(o in used for o in n.output)]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    used = {i for n in graph.node for i in n.input}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)


class QuantizedProbe:
    """The target's Q/DQ model with each layer's weight and bias turned into graph inputs, run in
    float by ONNX Runtime piece by piece: :meth:`run` computes a layer's input from the tensors
    the previous pieces left (the frontier), so every node runs once per batch however many layers
    the network has (one full-network pass per layer would cost depth x network). Valid for
    layers visited in graph order with each layer's weights final before a later layer asks: a
    piece holds only ancestors of the asked layer's input, and a layer's own weights change only
    after its input was computed."""

    def __init__(self, model: Any, layers: Sequence[Layer], ranges: Mapping[str, Any], options: QuantizeOptions,
                 threads: int | None = None) -> None:
        import onnx

        q = insert_qdq(model, ranges, options, warn=False).model
        by_name = {n.name: n for n in q.graph.node}
        self.inputs: dict[str, str] = {}
        self.w_name: dict[str, str] = {}
        self.b_name: dict[str, str] = {}
        for j, la in enumerate(layers):
            node = by_name[la.node]
            self.inputs[la.node] = node.input[0]
            w, b = f"__trtrepo_w{j}", f"__trtrepo_b{j}"
            node.input[1] = w
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = b
            self.w_name[la.node], self.b_name[la.node] = w, b
            q.graph.input.append(onnx.helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, list(la.weight_shape)))
            q.graph.input.append(onnx.helper.make_tensor_value_info(b, onnx.TensorProto.FLOAT, [la.outputs]))
        _drop_dead(q)
        self.model = q
        self.threads = threads
        inferred = onnx.shape_inference.infer_shapes(without_weights(q))
        self.types = {v.name: v.type.tensor_type.elem_type
                      for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
        self.nodes = list(q.graph.node)
        # onnxgraph's maps, by node index: tensor -> its producer, tensor -> the nodes reading it (once each)
        index = {id(n): k for k, n in enumerate(self.nodes)}
        self.producer = {o: index[id(n)] for o, n in producer_map(self.nodes).items()}
        self.consumers = {x: list(dict.fromkeys(index[id(n)] for n, _ in uses)) for x, uses in consumer_map(self.nodes).items()}
        self.inits = {t.name: t for t in q.graph.initializer}
        self.graph_outputs = {o.name for o in q.graph.output}
        self._weight_of = {w: node for node, w in self.w_name.items()}
        self._bias_of = {b: node for node, b in self.b_name.items()}
        self.done: set[int] = set()
        self.values: dict[int, dict[str, np.ndarray]] = {}  # per batch: the frontier
        self._piece: tuple[Any, list[str], list[str], list[int]] | None = None
        self._piece_for: str | None = None

    def _build(self, target: str) -> tuple[Any, list[str], list[str], list[int]]:
        """The session of the nodes not run yet that ``target`` needs; its inputs and outputs."""
        import onnx

        need: set[int] = set()
        stack = [target]
        while stack:
            k = self.producer.get(stack.pop())
            if k is None or k in self.done or k in need:
                continue
            need.add(k)
            stack.extend(x for x in self.nodes[k].input if x)
        order = sorted(need)
        produced = {o for k in order for o in self.nodes[k].output if o}
        ins = list(dict.fromkeys(x for k in order for x in self.nodes[k].input
                                 if x and x not in produced and x not in self.inits))
        outs = [o for k in order for o in self.nodes[k].output if o and (
            o == target or o in self.graph_outputs
            or any(c not in need and c not in self.done for c in self.consumers.get(o, ())))]
        graph = onnx.helper.make_graph(
            [self.nodes[k] for k in order], "piece",
            [onnx.helper.make_tensor_value_info(x, self.types.get(x) or onnx.TensorProto.FLOAT, None) for x in ins],
            [onnx.helper.make_tensor_value_info(o, self.types.get(o) or onnx.TensorProto.FLOAT, None) for o in outs],
            [self.inits[x] for x in dict.fromkeys(x for k in order for x in self.nodes[k].input) if x in self.inits])
        piece = onnx.helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        session = make_session(piece, threads=self.threads, arena=False, spin=False) if order else None
        return session, ins, outs, order

    def run(self, layer: Layer, batch: int, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
            biases: Mapping[str, np.ndarray]) -> np.ndarray:
        """``layer``'s input on batch number ``batch`` (``feeds``: its network inputs) as the Q/DQ
        network computes it with ``weights``/``biases`` (the layers rounded so far)."""
        target = self.inputs[layer.node]
        if self._piece_for != target:
            self.finish()
            self._piece, self._piece_for = self._build(target), target
        assert self._piece is not None
        session, ins, outs, _ = self._piece
        values = self.values.setdefault(batch, dict(feeds))
        if session is not None:
            full = {}
            for x in ins:
                if x in values:
                    full[x] = values[x]
                elif x in feeds:
                    full[x] = feeds[x]
                elif x in self._weight_of:
                    full[x] = weights[self._weight_of[x]]
                else:
                    full[x] = biases[self._bias_of[x]]
            for name, value in zip(outs, session.run(outs, full), strict=True):
                values[name] = value
        return values[target]

    def finish(self) -> None:
        """Mark the current piece's nodes as run and drop the tensors no later node reads."""
        if self._piece is None:
            return
        self.done.update(self._piece[3])
        for values in self.values.values():
            for name in [n for n in values if self.consumers.get(n)
                         and all(c in self.done for c in self.consumers[n])]:
                del values[name]
        self._piece = self._piece_for = None


def round_weights_sequential(model: Any, layers: Sequence[Layer], batches: Sequence[Any], ranges: Mapping[str, Any],
                             step: str, options: QuantizeOptions, *, work: SequentialWork = SequentialWork(),
                             threads: int | None = None) -> WeightStepResult:
    """Like :func:`round_weights`, one layer at a time in graph order, each layer's quantized
    input taken from the Q/DQ network (run in float) with the weights rounded so far, so that a
    layer also absorbs the error its quantized predecessors pass on (AdaRound's and empirical
    bias correction's sequential form). The Q/DQ side runs piece by piece
    (:class:`QuantizedProbe`: each node once per batch); the FP32 side comes from
    :func:`_fp32_patches`, one pass per group of layers."""
    from onnx import numpy_helper

    budget_s, iterations, rows_per_layer, seed = work.budget_s, work.iterations, work.rows_per_layer, work.seed
    if step not in STEPS[1:]:
        raise ValueError(f"unknown weight step {step!r}")
    t0 = time.perf_counter()
    qmax = 64.0 if options.reduce_range else 127.0
    inits = {t.name: t for t in model.graph.initializer}
    probe = QuantizedProbe(model, layers, ranges, options, threads=threads)
    fp_names = list(dict.fromkeys(la.input for la in layers))
    fp_sess = make_session(with_outputs(model, fp_names), threads=threads, arena=False, spin=False)
    weights = {la.node: numpy_helper.to_array(inits[la.weight]).astype(np.float32) for la in layers}
    biases = {la.node: (numpy_helper.to_array(inits[la.bias]).astype(np.float32) if la.bias is not None
                        else np.zeros(la.outputs, np.float32)) for la in layers}
    n_images = max(sum(_count(b) for b in batches), 1)
    budget = AdaRoundBudget(layers, budget_s, iterations)
    new_w, shifts, reports = {}, {}, []
    fp_patches: dict[tuple[int, int], np.ndarray] = {}
    with phase(f"weight rounding ({STEP_LABELS[step]}, sequential)", len(layers), "layers") as ph:
        for j, layer in enumerate(layers):
            t_layer = time.perf_counter()
            if (j, 0) not in fp_patches:
                fp_patches = _fp32_patches(fp_sess, layers, j, batches, rows_per_layer, n_images, seed)
            m = W.InputMoments(layer.groups, layer.k)
            for i, batch in enumerate(batches):
                p = fp_patches.pop((j, i))
                xq = probe.run(layer, i, batch.inputs, weights, biases)
                rows = _rows(layer, xq, rows_per_layer, _count(batch), n_images)
                pq = layer.patches(xq, rows, np.random.default_rng((seed, i, j))).astype(np.float32)
                with _one_blas_thread():
                    m.add(p, pq)
            budget.other(time.perf_counter() - t_layer)  # this layer's inputs: what each layer costs besides AdaRound
            ws, shift, rep = _round_layer(layer, weights[layer.node], m, step, qmax, budget)
            new_w[layer.node], shifts[layer.node] = ws, shift
            weights[layer.node] = ws
            biases[layer.node] = (biases[layer.node] - shift).astype(np.float32)
            reports.append(rep)
            ph.advance()
    return _result(step, _write(model, layers, new_w, shifts, reports), reports, t0, budget)


def _fp32_patches(fp_sess: Any, layers: Sequence[Layer], start: int, batches: Sequence[Any], rows_per_layer: int,
                  n_images: int, seed: int) -> dict[tuple[int, int], np.ndarray]:
    """FP32 input patches of ``layers[start:]`` up to about :data:`FP32_PATCH_BYTES`, keyed by
    (layer, batch): one FP32 pass per batch serves a group of layers instead of one pass per
    layer. The sample of positions is the one the quantized side draws (same seed, same shape)."""
    out: dict[tuple[int, int], np.ndarray] = {}
    group: list[int] = []
    size = 0
    for j in range(start, len(layers)):
        la = layers[j]
        rows = max(1, int(round(rows_per_layer * max(_count(b) for b in batches) / n_images)))
        cost = rows * la.groups * la.k * 4 * len(batches)
        if group and size + cost > FP32_PATCH_BYTES:
            break
        group.append(j)
        size += cost
    names = list(dict.fromkeys(layers[j].input for j in group))
    for i, batch in enumerate(batches):
        xs = dict(zip(names, fp_sess.run(names, batch.inputs), strict=True))
        for j in group:
            x = xs[layers[j].input]
            rows = _rows(layers[j], x, rows_per_layer, _count(batch), n_images)
            out[(j, i)] = layers[j].patches(x, rows, np.random.default_rng((seed, i, j))).astype(np.float32)
        del xs
    return out


def activation_qparams_for(model: Any, layers: Sequence[Layer], ranges: Mapping[str, Any],
                           options: QuantizeOptions) -> dict[str, QParams]:
    """The Q/DQ parameters the writer gives each layer input (absent: the input stays float)."""

    view = GraphView(model)
    ranges = plan_qdq(model, options, view=view, ranges=ranges).tie(ranges)  # the writer's parameters
    out = {}
    for layer in layers:
        if layer.input in ranges:
            out[layer.input] = activation_qparams(as_range(ranges[layer.input]), options.target,
                                                  nonneg=view.non_negative(layer.input), tensor=layer.input)
    return out


