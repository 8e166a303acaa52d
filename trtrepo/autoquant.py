"""Calibrate, quantize and evaluate in one loop: ``--method auto`` and ``--accuracy-target``.

:func:`run_quantize` is the Python twin of ``trtrepo quantize``:

1. ranges come from a ranges JSON, a TensorRT cache, or one calibration pass over ``data``
   (:class:`trtrepo.calibrate.Calibrator`; its statistics serve every method and carry the
   signed min/max the onnxruntime target needs);
2. with ``method="auto"`` the model is quantized with each of entropy, minmax, percentile and
   mse and each is evaluated against FP32 on a held-out split that calibration never saw (a
   deterministic ``holdout`` fraction of ``data``, or ``eval_data``); the best by accuracy
   (labels, else top-1 agreement), then cosine, wins;
3. with an :class:`~trtrepo.evaluate.AccuracyTarget` the quantized layers are ranked by
   sensitivity (one layer's Q/DQ removed at a time) and the most sensitive are left in float,
   one more per step, until the target holds. A target that FP32 itself misses, or that only
   holds with every layer in float, is an error and nothing is written.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import histogram as H
from .errors import TrtrepoError, UsageError
from .evaluate import (
    AccuracyTarget,
    OutputMetrics,
    RunOutputs,
    better,
    classification_outputs,
    compare_outputs,
    metrics_table,
    pick_output,
    run_onnx,
)
from .quantize import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    QuantizeResult,
    _result,
    insert_qdq,
    load_model,
    plan_qdq,
    prepare_model,
    ranges_from_cache,
    ranges_from_json,
    save_model,
)
from .weightopt import ROUNDING_STEPS

log = logging.getLogger(__name__)

DEFAULT_HOLDOUT = 0.2
AUTO_MIN_SAMPLES = 100  # quantize_for_deploy: below this, no held-out split (entropy)
CACHE_BYTES = 512 * 2**20  # held-out batches kept in memory up to this size


# --------------------------------------------------------------------------------------------
# Data splits and ranges


def split_holdout(source: Any, fraction: float = DEFAULT_HOLDOUT, seed: int = 0) -> tuple[Any, Any]:
    """Deterministic split into (calibration, held-out) parts; no sample is in both."""
    if not 0.0 < fraction < 1.0:
        raise UsageError(f"--holdout {fraction}: expected a fraction between 0 and 1")
    n = len(source)
    k = int(round(n * fraction))
    if n < 2 or k < 1 or k >= n:
        raise UsageError(f"{source.name}: {n} samples are too few to hold out {fraction:.0%} for evaluation; "
                         "give more data or --eval-data")
    held = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    calib = np.setdiff1d(np.arange(n), held)
    return source.take(calib), source.take(held)


def activation_ranges(amax: Mapping[str, float], statistics: Any = None) -> dict[str, ActivationRange]:
    """``{tensor: ActivationRange}`` from amax plus the signed min/max of the calibration
    statistics (:class:`trtrepo.calibrate.Statistics`) where known."""
    out = {}
    for name, a in amax.items():
        lo = hi = None
        if statistics is not None and name in statistics:
            lo, hi = float(statistics[name].min), float(statistics[name].max)
        out[name] = ActivationRange(float(a), lo, hi)
    # Tensors with infinite values have no amax: pass them on as non-finite ranges so that
    # quantization keeps them (and the mask path behind them) in float.
    for name in getattr(statistics, "unbounded", ()):
        if name not in out:
            t = statistics[name]
            out[name] = ActivationRange(math.inf, float(t.min), float(t.max))
    return out


def calibration_tensors(model: Any, options: QuantizeOptions) -> list[str]:
    """What to calibrate: the float network inputs and every activation the target's placement
    quantizes (without exclusions, so the fallback never runs short). Not the other tensors of
    :func:`trtrepo.calibrate.select_tensors` (activation and pooling outputs that no Q/DQ reads):
    on MobileNetV2 that halves the tensors fetched and binned. ``trtrepo calibrate`` (a TensorRT
    cache for implicit INT8) still calibrates the full selection."""
    from .calibrate import select_tensors

    selected = select_tensors(model)
    graph_inputs = {i.name for i in model.graph.input}
    names = [t for t in selected if t in graph_inputs]
    no_excl = QuantizeOptions(target=options.target, per_channel=options.per_channel,
                              transformer_safe=options.transformer_safe, quantize_attention=options.quantize_attention)
    for t in plan_qdq(prepare_model(model), no_excl).activation_tensors():
        if t not in names:
            names.append(t)
    return names


# --------------------------------------------------------------------------------------------
# Evaluation of candidates


@dataclass
class Candidate:
    label: str
    quantized: QuantizedModel | None  # None for a losing candidate once it has been measured
    metrics: dict[str, OutputMetrics] | None = None

    def row(self) -> dict[str, Any]:
        d: dict[str, Any] = {"label": self.label}
        if self.metrics:
            d["outputs"] = {k: v.to_dict() for k, v in self.metrics.items()}
        return d


class Evaluator:
    """FP32 outputs on the held-out data once; candidates compared against them. Top-1/top-5 are
    reported for the label output (the first ``[N, C]`` output) and for ``label_output`` when given."""

    def __init__(self, fp32_model: Any, source: Any, *, batch_size: int = 32, threads: int | None = None,
                 cache_bytes: int = CACHE_BYTES, label_output: str | None = None) -> None:
        from .data import iter_batches
        from .modelio import ModelIO

        self.source = source
        self.batch_size = batch_size
        self.threads = threads
        # Held-out data is evaluated many times: keep its batches in memory when they are small.
        self.batches: list[Any] | None = []
        size = 0
        io = ModelIO.from_onnx(fp32_model) if hasattr(fp32_model, "graph") else None
        for batch in iter_batches(source, batch_size, io):
            size += sum(a.nbytes for a in batch.inputs.values())
            if size > cache_bytes:
                self.batches = None
                break
            self.batches.append(batch)  # type: ignore[union-attr]
        self.last_seconds: float | None = None
        self.reference: RunOutputs = self._run(fp32_model)
        self.reference_seconds = self.last_seconds
        self.classification = tuple(dict.fromkeys(classification_outputs(self.reference.outputs) +
                                                  classification_outputs(self.reference.outputs, label_output or ())))
        self.count = 0

    def _run(self, model: Any) -> RunOutputs:
        """Run ``model`` on the held-out data; the inference time (without building the session)
        goes to ``last_seconds``."""
        from .evaluate import make_session

        session = make_session(model, threads=self.threads)
        t0 = time.perf_counter()
        out = run_onnx(model, self.source, batch_size=self.batch_size, threads=self.threads, batches=self.batches,
                       session=session)
        self.last_seconds = time.perf_counter() - t0
        return out

    def speed(self) -> float | None:
        """FP32 time over the last candidate's time on the held-out data (ONNX Runtime CPU)."""
        if not self.reference_seconds or not self.last_seconds:
            return None
        return self.reference_seconds / self.last_seconds

    def time_ratio(self, fp32_model: Any, int8_model: Any, rounds: int = 3) -> dict[str, Any] | None:
        """FP32 time over INT8 time on the held-out batches (ONNX Runtime CPU, this process's
        threads): one warm-up pass each, then ``rounds`` alternated passes, the median of the
        per-round ratios. None when the held-out data is not kept in memory."""
        from .evaluate import make_session

        if not self.batches:
            return None
        sessions = [make_session(m, threads=self.threads) for m in (fp32_model, int8_model)]
        ratios = []
        for r in range(rounds + 1):
            took = []
            for sess in sessions:
                t0 = time.perf_counter()
                run_onnx(None, None, batches=self.batches, session=sess, io=False)
                took.append(time.perf_counter() - t0)
            if r:
                ratios.append(took[0] / max(took[1], 1e-9))
        return {"int8_vs_fp32": float(np.median(ratios)), "batch_size": self.batch_size,
                "engine": "ONNX Runtime CPU", "rounds": rounds}

    def __call__(self, model: Any) -> dict[str, OutputMetrics]:
        self.count += 1
        cand = self._run(model)
        return compare_outputs(self.reference.outputs, cand.outputs, self.reference.labels, classification=self.classification)

    def fp32_metrics(self) -> dict[str, OutputMetrics]:
        return compare_outputs(self.reference.outputs, self.reference.outputs, self.reference.labels,
                               classification=self.classification)


def select_method(model: Any, ranges_per_method: Mapping[str, Mapping[str, ActivationRange]], options: QuantizeOptions,
                  evaluator: Evaluator | None, *, metric_output: str | None = None,
                  metric: str | None = None) -> tuple[Candidate, list[Candidate]]:
    """Quantize with each method's ranges; the best by :func:`trtrepo.evaluate.better` on
    ``metric_output`` (default the first output) wins; ``metric="cosine"`` ranks by mean cosine
    first (the first method on ties; without an evaluator the first method, the others are not
    built). One candidate model is held at a time besides the best (a 110 M parameter encoder is
    ~0.5 GB per Q/DQ copy): the losers keep their label and metrics only. Methods that give every
    quantized tensor the same range (all inputs smoothed, say) build the same model: measured
    once, not rebuilt."""
    import gc

    best: Candidate | None = None
    rows: list[Candidate] = []
    seen: dict[tuple[Any, ...], dict[str, OutputMetrics]] = {}
    planned: list[str] | None = None  # the activations the first candidate quantizes
    for k, (method, ranges) in enumerate(ranges_per_method.items()):
        key = None if planned is None else tuple((t, repr(ranges.get(t))) for t in planned)
        if key is not None and key in seen:
            cand = Candidate(method, None, seen[key])
        else:
            qm = insert_qdq(model, ranges, options, source=f"{method} ranges", warn=k == 0)
            if planned is None:
                planned = sorted(qm.activation_qparams)
                key = tuple((t, repr(ranges.get(t))) for t in planned)
            cand = Candidate(method, qm, None if evaluator is None else evaluator(qm.model))
            if cand.metrics is not None:
                seen[key] = cand.metrics  # type: ignore[index]
        rows.append(cand)
        if evaluator is None:
            best = cand
            break
        log.info("method %s: %s", method, _brief(cand.metrics, metric_output))  # type: ignore[arg-type]
        if best is None or better(cand.metrics, best.metrics, metric_output, metric):  # type: ignore[arg-type]
            best = cand
        for c in rows:
            if c is not best:
                c.quantized = None
        gc.collect()
    assert best is not None and best.quantized is not None
    return best, rows


def _brief(metrics: Mapping[str, OutputMetrics], output: str | None = None) -> str:
    m = pick_output(metrics, output)
    parts = []
    if m.candidate_accuracy is not None:
        parts.append(f"accuracy {100 * m.candidate_accuracy:.2f}% (FP32 {100 * (m.reference_accuracy or 0):.2f}%)")
    if m.top1_agreement is not None:
        parts.append(f"top-1 agreement {100 * m.top1_agreement:.2f}%")
    parts.append(f"cosine {m.cosine_mean:.6f}")
    return ", ".join(parts)


@dataclass
class FallbackStep:
    layers_in_float: list[str]
    value: float
    met: bool
    cosine: float
    label: str = ""  # what this step left in float (a role group, a block, a bisection half)
    speed: float | None = None  # FP32 time / this candidate's time on the held-out data (same process)


@dataclass
class FallbackResult:
    chosen: QuantizedModel
    metrics: dict[str, OutputMetrics]
    sensitivity: list[dict[str, Any]]
    steps: list[FallbackStep]
    weighted_layers: int = 0  # MatMul/Gemm/Conv layers quantized before the fallback
    weighted_in_float: int = 0  # ... of which the chosen model leaves in float
    seconds: float = 0.0


def _goodness(target: AccuracyTarget, metrics: Mapping[str, OutputMetrics]) -> tuple[float, float]:
    v = target.measure(metrics)
    return (-v if target.kind == "top1-drop" else v, pick_output(metrics, target.output).cosine_mean)


def check_reachable(target: AccuracyTarget, evaluator: Evaluator) -> None:
    """Refuse a target that the FP32 model (every layer in float) misses on the evaluation data."""
    fp32 = evaluator.fp32_metrics()
    if not target.met(fp32):
        raise UsageError(f"--accuracy-target {target} cannot be met even with every layer in float "
                         f"(the FP32 model itself gives {target.measure(fp32):.6g} on {evaluator.source.name})")


# Layer roles (what the fallback leaves in float as a group before single layers).
_ACT_OPS = ("Relu", "Gelu", "Erf", "Tanh", "Sigmoid", "FastGelu", "BiasGelu", "Clip", "HardSigmoid", "HardSwish", "Softplus",
            "LeakyRelu", "Elu", "Mish")
_LAYOUT_OPS = ("Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten")


def layer_roles(model: Any, layers: Sequence[str]) -> dict[str, str]:
    """Role of each quantized layer (node name) of a prepared model: ``attention`` (Q/K/V and
    output projections: a MatMul/Gemm whose output reaches, or whose input comes from, a MatMul of
    two activations), ``mlp_down`` (input from an activation function), ``mlp_up`` (other
    MatMul/Gemm), ``conv``, ``residual_add`` (Add/Mul units), ``pool``; the first and the last
    weighted layer are ``first_last``."""
    from .quantize import GraphView

    view = GraphView(model)
    by_name = {n.name: n for n in view.nodes}

    def act_matmul(node: Any) -> bool:
        return node.op_type in ("MatMul", "Gemm") and all(view.is_float_activation(i) for i in node.input[:2] if i)

    def transparent(node: Any) -> bool:
        """Reshapes, casts, and elementwise ops with one activation input (a bias Add, a scale,
        SmoothQuant's Mul, GELU's * 0.5): they do not change what a tensor is."""
        if node.op_type in _LAYOUT_OPS:
            return True
        return node.op_type in ("Add", "Sub", "Mul", "Div") and sum(view.is_float_activation(i) for i in node.input) == 1

    def source(tensor: str, depth: int = 8) -> Any:
        p = view.producer.get(tensor)
        while p is not None and depth > 0 and transparent(p):
            act = next((i for i in p.input if view.is_float_activation(i)), None)
            p, depth = (view.producer.get(act) if act else None), depth - 1
        return p

    def reaches_attention(tensor: str, depth: int = 8) -> bool:
        for c, _ in view.consumers.get(tensor, []):
            if act_matmul(c) or (depth > 0 and transparent(c) and reaches_attention(c.output[0], depth - 1)):
                return True
        return False

    def after_activation(p: Any) -> bool:
        from .quantize import gating_product

        return p is not None and (p.op_type in _ACT_OPS or (p.op_type == "Mul" and gating_product(view, p)))

    roles: dict[str, str] = {}
    weighted = []
    for name in layers:
        node = by_name.get(name)
        if node is None:
            continue
        op = node.op_type
        if op in ("Conv", "ConvTranspose"):
            roles[name] = "conv"
        elif op in ("MatMul", "Gemm"):
            src = source(node.input[0])
            if reaches_attention(node.output[0]) or (src is not None and act_matmul(src)):
                roles[name] = "attention"
            else:
                roles[name] = "mlp_down" if after_activation(src) else "mlp_up"
        elif op in ("Add", "Mul"):
            roles[name] = "residual_add"
        else:
            roles[name] = "pool"
        if op in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            weighted.append(name)
    if len(weighted) > 2:
        roles[weighted[0]] = roles[weighted[-1]] = "first_last"
    return roles


def layer_blocks(layers: Sequence[str], max_blocks: int = 8) -> dict[str, str]:
    """Block of each layer: the first ``layer.N``/``block.N``/``blocks.N``/``layers.N``-style
    index in its name, else consecutive runs of the graph order cut into ``max_blocks``."""
    import re

    pattern = re.compile(r"(?:layers?|blocks?|stages?|h|encoder)[._/](\d+)")
    found = {name: m.group(0) for name in layers if (m := pattern.search(name))}
    if len(set(found.values())) >= 2 and len(found) >= len(layers) // 2:
        return {name: found.get(name, "other") for name in layers}
    size = max(1, math.ceil(len(layers) / max_blocks))
    return {name: f"part {i // size + 1}" for i, name in enumerate(layers)}


def fallback(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions, evaluator: Evaluator,
             target: AccuracyTarget, start: Candidate, *, budget_s: float = 900.0) -> FallbackResult:
    """Leave as few layers in float as needed for ``target``, keeping INT8 where it is harmless.

    The calibration is reused (only Q/DQ placement changes). Search, each step measured on the
    held-out data with its speed against FP32:

    1. **groups first**: each role group (:func:`layer_roles`: first/last layers, attention,
       MLP up/down projections, residual Adds, convs) alone in float, then each block
       (:func:`layer_blocks`); the group that helps most is kept in float, more groups are added
       (best first) until the target holds;
    2. **bisection** inside the groups that are float: halves are put back to INT8 while the target
       still holds, so a group shrinks to the layers that matter;
    3. only when no set of groups meets the target: single layers by sensitivity, as before.

    Bounded by ``budget_s`` (the best model meeting the target so far is returned when it runs
    out; an error when none does)."""
    t0 = time.perf_counter()
    check_reachable(target, evaluator)
    if start.quantized is None:
        raise ValueError("fallback starts from the chosen candidate, whose model is kept")
    metrics = start.metrics if start.metrics is not None else evaluator(start.quantized.model)
    steps = [FallbackStep([], target.measure(metrics), target.met(metrics), pick_output(metrics, target.output).cosine_mean,
                          "all INT8", evaluator.speed())]
    layers = list(start.quantized.plan.layers)
    roles = layer_roles(prepare_model(model), layers)
    weighted = [n for n in layers if roles.get(n) in ("conv", "attention", "mlp_up", "mlp_down", "first_last")]
    if steps[0].met:
        return FallbackResult(start.quantized, metrics, [], steps, len(weighted), 0, time.perf_counter() - t0)

    cache: dict[frozenset[str], tuple[QuantizedModel | None, dict[str, OutputMetrics] | None, FallbackStep | None]] = {}

    def measure(in_float: Sequence[str], label: str) -> FallbackStep | None:
        key = frozenset(in_float)
        if key in cache:
            return cache[key][2]
        try:
            qm = insert_qdq(model, ranges, options.with_excluded_nodes(sorted(key)), warn=False)
        except UsageError:
            cache[key] = (None, None, None)  # nothing left to quantize
            return None
        m = evaluator(qm.model)
        step = FallbackStep(sorted(key), target.measure(m), target.met(m), pick_output(m, target.output).cosine_mean,
                            label, evaluator.speed())
        steps.append(step)
        cache[key] = (qm, m, step)
        log.info("fallback %s: %d layer(s) in float: %s=%.6g%s (speed %.2fx)", label, len(key), target.kind, step.value,
                 " (met)" if step.met else "", step.speed or 0.0)
        return step

    def out_of_time() -> bool:
        return time.perf_counter() - t0 > budget_s

    def better(a: FallbackStep, b: FallbackStep | None) -> bool:
        return b is None or (-a.value if target.kind == "top1-drop" else a.value) > (-b.value if target.kind == "top1-drop" else b.value)

    # 1. groups: roles, then blocks
    groups: dict[str, list[str]] = {}
    for name, role in roles.items():
        groups.setdefault(f"role {role}", []).append(name)
    for name, block in layer_blocks(layers).items():
        groups.setdefault(f"block {block}", []).append(name)
    groups = {k: v for k, v in groups.items() if 0 < len(v) < len(layers)}
    scored: list[tuple[FallbackStep, str]] = []
    for label, members in groups.items():
        if out_of_time():
            break
        step = measure(members, label)
        if step is not None:
            scored.append((step, label))
    scored.sort(key=lambda item: (-item[0].value if target.kind == "top1-drop" else item[0].value, -len(item[0].layers_in_float)),
                reverse=True)
    chosen: set[str] | None = None
    current: set[str] = set()
    for _step, label in scored:
        if out_of_time():
            break
        current |= set(groups[label])
        s = measure(sorted(current), " + ".join(x for x in (steps[-1].label if current != set(groups[label]) else "", label) if x))
        if s is not None and s.met:
            chosen = set(current)
            break
    # 2. bisection inside the chosen float set: put halves back to INT8 while the target holds
    if chosen is not None:
        pending = [sorted(chosen)]
        while pending and not out_of_time():
            part = pending.pop()
            if len(part) < 2:
                continue
            half = len(part) // 2
            for back in (part[:half], part[half:]):
                trial = chosen - set(back)
                s = measure(sorted(trial), f"bisect: {len(back)} back to INT8") if trial else None
                if s is not None and s.met:
                    chosen = trial
                    break
            else:
                pending += [part[:half], part[half:]]
    # 3. single layers by sensitivity when no group set holds
    sensitivity: list[dict[str, Any]] = []
    if chosen is None:
        singles: list[tuple[FallbackStep, str]] = []
        for layer in layers:
            if out_of_time():
                break
            s = measure([layer], f"only {layer}")
            if s is not None:
                singles.append((s, layer))
                sensitivity.append({"layer": layer, "value": s.value, "cosine": s.cosine})
        singles.sort(key=lambda item: -item[0].value if target.kind == "top1-drop" else item[0].value, reverse=True)
        ranked = [layer for _, layer in singles]
        for k in range(1, len(ranked)):
            if out_of_time():
                break
            s = measure(ranked[:k], f"{k} most sensitive")
            if s is not None and s.met:
                chosen = set(ranked[:k])
                break
    if chosen is None:
        best = max((s.value for s in steps), key=lambda v: -v if target.kind == "top1-drop" else v)
        raise UsageError(f"--accuracy-target {target} is only met with every layer in float (best with INT8 left: "
                         f"{best:.6g}{'; time budget ran out' if out_of_time() else ''}); nothing written")
    # the smallest float set that met the target (bisection may have found several)
    met = [s for s in steps if s.met]
    final = min(met, key=lambda s: (len(s.layers_in_float), -(s.speed or 0.0)))
    qm, m, _ = cache[frozenset(final.layers_in_float)]
    assert qm is not None and m is not None
    in_float_weighted = sum(1 for n in final.layers_in_float if n in weighted)
    if weighted and in_float_weighted > len(weighted) / 2:
        log.warning("--accuracy-target %s needs %d of %d MatMul/Conv layers in float: most of the model runs in "
                    "FP32 (expect little speed-up)", target, in_float_weighted, len(weighted))
    return FallbackResult(qm, m, sensitivity, steps, len(weighted), in_float_weighted, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# SmoothQuant and the held-out accuracy check

DEFAULT_ALPHA = 0.8  # --smooth-quant auto without evaluation data
AUTO_MIN_GROUPS = 2  # --smooth-quant auto tries alphas only on models with this many smoothable MatMul/Gemm inputs
MAX_TOP1_DROP_POINTS = 1.0  # the default check: top-1 agreement may drop by at most this
MIN_COSINE = 0.99  # ... and an output without classes needs at least this mean cosine


SMOOTHED_RANGE_RULE = ("min/max: a smoothed tensor's range is the exact min/max of its smoothed per-channel statistics, "
                       "whatever the method; the method sets the ranges of the other tensors")


def _smoothed_ranges(base: Mapping[str, ActivationRange], smoothed: Mapping[str, tuple[float, float]]) -> dict[str, ActivationRange]:
    out = dict(base)
    for name, (lo, hi) in smoothed.items():
        out[name] = ActivationRange(max(abs(lo), abs(hi)), lo, hi)
    return out


@dataclass
class SmoothChoice:
    alpha: float | None  # None: no smoothing
    model: Any  # the (smoothed) FP32 model the Q/DQ model is built from
    ranges: dict[str, tuple[float, float]]  # smoothed tensor -> exact (min, max)
    groups: list[dict[str, Any]]
    rows: list[dict[str, Any]]  # alpha candidates and their metrics


def choose_smoothing(model: Any, stats: Any, first_ranges: Mapping[str, ActivationRange], options: QuantizeOptions,
                     evaluator: Evaluator | None, request: float | str | None, *, metric_output: str | None = None,
                     metric: str | None = None) -> SmoothChoice:
    """SmoothQuant on the MatMul/Gemm inputs (:mod:`trtrepo.smoothquant`). ``request``: None (off),
    an alpha, or "auto": each alpha of :data:`~trtrepo.smoothquant.AUTO_ALPHAS` and no smoothing
    are quantized with ``first_ranges`` and compared on the held-out data; the best wins. "auto"
    leaves models with fewer than :data:`AUTO_MIN_GROUPS` smoothable inputs alone (a CNN whose
    only MatMul/Gemm is the classifier)."""
    from .smoothquant import AUTO_ALPHAS, apply_smoothquant

    prepared = prepare_model(model)
    none = SmoothChoice(None, model, {}, [], [])
    channels = getattr(stats, "channels", None) or {}
    if request is None or not channels:
        return none
    plan = plan_qdq(prepared, options, ranges=first_ranges)
    skip = set(plan.excluded) | set(plan.auto_float) | set(plan.kept_float)
    if request == "auto":
        from .smoothquant import smooth_candidates

        if len([x for x, nodes in smooth_candidates(prepared).items() if set(nodes) - skip]) < AUTO_MIN_GROUPS:
            return none  # a CNN with one classifier Gemm: nothing worth five evaluations
        alphas: tuple[float | None, ...] = (None, *AUTO_ALPHAS) if evaluator is not None else (DEFAULT_ALPHA,)
    else:
        alphas = (float(request),)
    import gc

    def build(alpha: float | None) -> SmoothChoice:
        if alpha is None:
            return SmoothChoice(None, model, {}, [], [])
        sm = apply_smoothquant(prepared, channels, alpha, skip=skip)
        return SmoothChoice(alpha, sm.model, sm.ranges, sm.groups, [])

    best: tuple[dict[str, OutputMetrics], float | None] | None = None
    rows: list[dict[str, Any]] = []
    if len(alphas) == 1:
        chosen = build(alphas[0])
        if not chosen.groups:
            return none
        chosen.rows = [{"alpha": alphas[0], "groups": len(chosen.groups)}]
        return chosen
    assert evaluator is not None
    for alpha in alphas:
        # one candidate model alive at a time (each is a full copy of the weights): build,
        # measure, drop; the winner is rebuilt at the end (smoothing is deterministic)
        choice = build(alpha)
        if alpha is not None and not choice.groups:
            return none  # nothing to smooth: no candidates to compare
        row: dict[str, Any] = {"alpha": alpha, "groups": len(choice.groups)}
        qm = insert_qdq(choice.model, _smoothed_ranges(first_ranges, choice.ranges), options, warn=False)
        del choice
        metrics = evaluator(qm.model)
        del qm
        gc.collect()
        row["outputs"] = {k: v.to_dict() for k, v in metrics.items()}
        row["brief"] = _brief(metrics, metric_output)
        log.info("smooth-quant alpha %s: %s", alpha, row["brief"])
        if best is None or better(metrics, best[0], metric_output, metric):
            best = (metrics, alpha)
        rows.append(row)
    assert best is not None
    chosen = build(best[1])
    chosen.rows = rows
    return chosen


MIN_CONFIDENT_AGREEMENT = 0.99  # without labels: top-1 agreement on the confident samples


@dataclass(frozen=True)
class AccuracyCheck:
    """The check every quantize/deploy run ends with, on ``output`` (default: every output).

    One rule per kind of output, the first that applies:

    * **labels** (the held-out data has labels): the label accuracy may drop by at most
      ``max_top1_drop`` points (the user's metric, measured directly);
    * **classifier without labels**: top-1 agreement with FP32 on the *confident* samples
      (FP32's top-1/top-2 probability margin >= :data:`trtrepo.evaluate.CONFIDENT_MARGIN`) at
      least ``min_confident_agreement``. Overall agreement is reported beside it, not gated: on
      near-ties (a fifth of natural-image crops for an ImageNet model) any change of the
      arithmetic, FP16 included, flips the top-1, so "agreement >= 99 %" over all samples would
      refuse every INT8 model however good;
    * **no classes** (an embedding): mean cosine at least ``min_cosine``.

    Each verdict carries its sample count and a 95 % Wilson interval; a failure that the
    interval cannot separate from the limit (too few samples) is marked ``inconclusive`` and
    still fails (no silent loss), with the number of samples that would decide it."""

    max_top1_drop: float = MAX_TOP1_DROP_POINTS
    min_confident_agreement: float = MIN_CONFIDENT_AGREEMENT
    min_cosine: float = MIN_COSINE

    def judge(self, m: OutputMetrics) -> dict[str, Any]:
        """The verdict on one output: rule, value, limit, ok, samples, interval, message."""
        from .evaluate import wilson_interval

        v: dict[str, Any] = {"output": m.name, "samples": m.samples, "overall_top1_agreement": m.top1_agreement,
                             "inconclusive": False}
        if m.accuracy_drop_points is not None:
            drop = m.accuracy_drop_points
            per_sample = 100.0 / max(m.samples, 1)
            v.update(rule="label accuracy drop", value=drop, limit=self.max_top1_drop, ok=drop <= self.max_top1_drop + 1e-9,
                     reference_accuracy=m.reference_accuracy, candidate_accuracy=m.candidate_accuracy,
                     points_per_sample=per_sample)
            v["message"] = (f"output '{m.name}': label accuracy {100 * m.candidate_accuracy:.2f}% vs FP32 "  # type: ignore[operator]
                            f"{100 * m.reference_accuracy:.2f}% (drop {drop:.2f} points, limit {self.max_top1_drop:g}; "  # type: ignore[operator]
                            f"{m.samples} samples)")
            if not v["ok"] and drop <= 2 * per_sample + 1e-9:
                v["inconclusive"] = True
                need = int(math.ceil(200.0 / max(self.max_top1_drop, 1e-9)))
                v["message"] += (f"; one sample is {per_sample:.2f} points: too few samples to decide, give an "
                                 f"evaluation set of >= {need} labelled samples")
            return v
        if m.confident_agreement is not None and m.confident_samples:
            n = m.confident_samples
            flips = int(round((1.0 - m.confident_agreement) * n))
            lo, hi = wilson_interval(n - flips, n)
            v.update(rule="confident top-1 agreement", value=m.confident_agreement, limit=self.min_confident_agreement,
                     ok=m.confident_agreement >= self.min_confident_agreement - 1e-12, confident_samples=n,
                     interval=[lo, hi])
            overall = "" if m.top1_agreement is None else f"; all {m.samples}: {100 * m.top1_agreement:.1f}%"
            v["message"] = (f"output '{m.name}': top-1 agreement {100 * m.confident_agreement:.1f}% on the {n} confident "
                            f"samples (limit {100 * self.min_confident_agreement:g}%, 95% interval "
                            f"{100 * lo:.1f}-{100 * hi:.1f}%){overall}")
            if not v["ok"] and hi >= self.min_confident_agreement:
                v["inconclusive"] = True
                v["message"] += f"; {flips} flip(s) in {n}: too few confident samples to decide, give more evaluation data"
            elif v["ok"] and lo < self.min_confident_agreement:
                # passed on its point estimate; the sample cannot exclude a model below the limit
                v["inconclusive"] = True
                v["message"] += (f"; passed on {n} samples, whose interval reaches below the limit: about "
                                 f"{_samples_to_settle(self.min_confident_agreement)} confident samples settle it "
                                 "(give more evaluation data)")
            return v
        if m.top1_agreement is not None:  # a classifier with no confident sample: nothing decides top-1
            v["note"] = "no held-out sample has a confident FP32 top-1: judged on cosine"
        v.update(rule="mean cosine", value=m.cosine_mean, limit=self.min_cosine, ok=m.cosine_mean >= self.min_cosine)
        v["message"] = f"output '{m.name}': mean cosine vs FP32 {m.cosine_mean:.4f} (limit {self.min_cosine:g}; {m.samples} samples)"
        return v

    def failures(self, metrics: Mapping[str, OutputMetrics], output: str | None = None) -> list[str]:
        names = [output] if output else list(metrics)
        return [v["message"] for v in (self.judge(metrics[n]) for n in names) if not v["ok"]]


def _samples_to_settle(limit: float) -> int:
    """The fewest samples whose 95 % Wilson interval with no flip lies above ``limit``."""
    from .evaluate import wilson_interval

    n = 1
    while wilson_interval(n, n)[0] < limit and n < 10**6:
        n = int(n * 1.1) + 1
    return n


class AccuracyLoss(TrtrepoError):
    """The held-out check against FP32 failed and the loss was not accepted (exit code 1)."""


# --------------------------------------------------------------------------------------------
# The quantize command's engine


def run_quantize(
    onnx_path: str | Path,
    out_path: str | Path,
    *,
    ranges: str | Path | None = None,
    cache: str | Path | None = None,
    data: Any = None,
    method: str | None = None,
    options: QuantizeOptions | None = None,
    accuracy_target: AccuracyTarget | str | None = None,
    eval_data: Any = None,
    holdout: float = DEFAULT_HOLDOUT,
    metric_output: str | None = None,
    seed: int = 0,
    batch_size: int = 32,
    threads: int | None = None,
    data_args: Mapping[str, Any] | None = None,
    report_dir: str | Path | None = None,
    force: bool = True,
    progress: bool = False,
    smooth_quant: float | str | None = "auto",
    check: AccuracyCheck | None = AccuracyCheck(),
    memory_budget_mb: float | None = None,
    weight_rounding: str = "auto",
    rounding_budget_s: float | None = None,
    accept_accuracy_loss: bool = True,
    equalize: bool = True,
) -> QuantizeResult:
    """Quantize ``onnx_path`` into ``out_path`` (see the module doc). Exactly one of ``ranges``
    (JSON), ``cache`` (TensorRT cache) or ``data`` (calibrate here) gives the ranges; with
    ranges or a cache, ``data``/``eval_data`` only serve evaluation. Nothing is written when
    anything fails. ``metric_output`` names the output that ``auto`` and ``accuracy_target``
    are measured on (default: the first output; an embedding output wants ``cosine=``).
    ``method``: a registered method or "auto"; None: auto when calibrating here.
    ``smooth_quant``: SmoothQuant alpha, "auto" (chosen on the held-out data; nothing with ranges
    or a cache, which were computed without it) or None.
    ``check``: the held-out accuracy check against FP32 the run ends with (result in
    ``report["accuracy_check"]``, a warning when it fails; None skips it); when it fails and
    ``accept_accuracy_loss`` is False, :class:`AccuracyLoss` is raised and nothing is written.
    ``weight_rounding``: see :func:`choose_weight_rounding`."""
    from .data import open_data
    from .modelio import ModelIO
    from .smoothquant import parse_alpha

    options = options or QuantizeOptions()
    if isinstance(accuracy_target, str):
        accuracy_target = AccuracyTarget.parse(accuracy_target)
    given = [n for n, v in (("--ranges", ranges), ("--cache", cache)) if v is not None]
    if len(given) > 1:
        raise UsageError("give only one of --ranges, --cache")
    if given and method is not None:
        raise UsageError(f"--method {method} calibrates on --data; it cannot be combined with {given[0]} "
                         "(ranges are used as given)")
    if not given and data is None:
        raise UsageError("no ranges: give --ranges R.json, --cache C.cache or --data SPEC")
    # the method: as given, else auto when calibrating here; with ranges/a cache it names their source
    method = method or ("auto" if not given else "entropy")
    if method != "auto" and method not in H.METHODS:
        raise UsageError(f"--method '{method}': expected one of {', '.join(H.method_names(auto=True))}")
    if Path(onnx_path).resolve() == Path(out_path).resolve():
        raise UsageError(f"-o {out_path}: would overwrite the input model")
    if given and parse_alpha(smooth_quant) == "auto":
        smooth_quant = None
    elif given and parse_alpha(smooth_quant) is not None:
        raise UsageError(f"--smooth-quant {smooth_quant}: SmoothQuant needs calibration on --data, not {given[0]}")
    onnx_path = Path(onnx_path)
    model = fp32_model = load_model(onnx_path)
    io = ModelIO.from_onnx(model, source=onnx_path)
    outputs = [o.name for o in model.graph.output]
    if metric_output is not None and metric_output not in outputs:
        raise UsageError(f"--metric-output '{metric_output}': {onnx_path.name} has no such output (outputs: {', '.join(outputs)})")
    if accuracy_target is not None:
        accuracy_target = accuracy_target.on_output(metric_output)
    data_args = dict(data_args or {})
    if Path(out_path).exists() and not force:
        raise UsageError(f"{out_path}: already exists (use --force to overwrite)")

    def open_(spec: Any, with_args: bool = True) -> Any:
        return open_data(spec, io=io, **(data_args if with_args else {}))

    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    sq_request = parse_alpha(smooth_quant)
    need_eval = method == "auto" or accuracy_target is not None or check is not None or sq_request == "auto"
    calib_src = eval_src = None
    if given:
        if eval_data is not None:
            eval_src = open_(eval_data, with_args=False)
        elif data is not None:
            eval_src = open_(data)
    else:
        source = open_(data)
        if eval_data is not None:
            calib_src, eval_src = source, open_(eval_data, with_args=False)
        elif need_eval:
            try:
                calib_src, eval_src = split_holdout(source, holdout, seed)
                log.info("holding out %d of %d samples of %s for evaluation", len(eval_src), len(source), source.name)
            except UsageError:
                if method == "auto" or accuracy_target is not None:
                    raise
                log.warning("%s: %d samples are too few to hold some out; the INT8 model's accuracy is NOT checked "
                            "against FP32 (give more data or --eval-data)", source.name, len(source))
                calib_src = source
        else:
            calib_src = source
    if accuracy_target is not None and eval_src is None:
        raise UsageError("--accuracy-target needs evaluation data (--data or --eval-data)")

    # A top-1 target on --metric-output makes that output a classification output too.
    top1_on = metric_output if accuracy_target is not None and accuracy_target.kind != "cosine" else None
    evaluator = Evaluator(model, eval_src, batch_size=batch_size, threads=threads,
                          label_output=top1_on) if eval_src is not None else None
    if accuracy_target is not None and evaluator is not None:
        check_reachable(accuracy_target, evaluator)  # before calibrating: fail fast

    stats = None
    equalization: dict[str, Any] = {"applied": False, "note": "ranges or a cache were given (computed on the original model)"}
    if ranges is not None:
        per_method = {"ranges": ranges_from_json(ranges)}
    elif cache is not None:
        per_method = {"cache": activation_ranges(ranges_from_cache(cache, model))}
    else:
        from .calibrate import Calibrator
        from .smoothquant import smooth_candidates

        # only the input tensor names are used: no prepared (renamed) copy of the weights needed
        channel_tensors = list(smooth_candidates(model)) if sq_request is not None else []
        from .calibrate import DEFAULT_MEMORY_BUDGET_MB

        equalization = _equalize(model, calib_src, evaluator, options, equalize, threads)
        calib_path = onnx_path
        if equalization.get("applied"):
            import tempfile

            model = equalization.pop("model")
            tmp_dir = tempfile.TemporaryDirectory(prefix="trtrepo-equalized-")
            calib_path = Path(tmp_dir.name) / "equalized.onnx"
            save_model(model, calib_path)
        equalization.pop("model", None)
        t_cal = time.perf_counter()
        cal = Calibrator(calib_path, calib_src, batch_size=batch_size, progress=progress,
                         tensors=calibration_tensors(model, options), channel_tensors=channel_tensors,
                         memory_budget_mb=memory_budget_mb or DEFAULT_MEMORY_BUDGET_MB)
        stats = cal.collect()
        timings["calibration"] = time.perf_counter() - t_cal
        if equalization.get("seconds"):
            timings["equalization"] = equalization["seconds"]
        del cal  # its ONNX Runtime session holds the model with every tensor as an output
        import gc

        gc.collect()
        methods = tuple(H.METHODS) if method == "auto" else (method,)
        per_method = {m: activation_ranges(stats.compute(m), stats) for m in methods}
    if sq_request is not None and stats is None and sq_request != "auto":
        raise UsageError("--smooth-quant needs calibration data (--data): ranges and caches carry no per-channel statistics")
    metric = "cosine" if (accuracy_target is not None and accuracy_target.kind == "cosine") else None
    smooth = choose_smoothing(model, stats, next(iter(per_method.values())), options, evaluator, sq_request,
                              metric_output=metric_output, metric=metric)
    base_model = smooth.model
    per_method = {k: _smoothed_ranges(v, smooth.ranges) for k, v in per_method.items()}
    best, candidates = select_method(base_model, per_method, options, evaluator, metric_output=metric_output, metric=metric)
    assert best.quantized is not None
    rounding = choose_weight_rounding(base_model, per_method[best.label], options, calib_src, evaluator, best,
                                      weight_rounding, metric_output=metric_output, metric=metric,
                                      budget_s=rounding_budget_s, threads=threads)
    timings.update(rounding.seconds)
    if rounding.model is not None and rounding.best is not None:
        base_model, best = rounding.model, rounding.best
    assert best.quantized is not None
    chosen, metrics = best.quantized, best.metrics
    fb = None
    if accuracy_target is not None:
        if evaluator is None:  # pragma: no cover - eval_src is required above
            raise UsageError("--accuracy-target needs evaluation data (--data or --eval-data)")
        fb = fallback(base_model, per_method[best.label], options, evaluator, accuracy_target, best)
        chosen, metrics = fb.chosen, fb.metrics
    if metrics is None and evaluator is not None and check is not None:
        metrics = evaluator(chosen.model)
    check_failures: list[str] | None = None
    ungated: list[str] = []
    verdict: dict[str, Any] | None = None
    noise_floor: dict[str, Any] | None = None
    if check is not None and metrics is not None:
        verdict = check.judge(metrics[metric_output or outputs[0]])
        if evaluator is not None and verdict["rule"] == "confident top-1 agreement":
            noise_floor = _fp16_floor(model, evaluator, metric_output or outputs[0])
            verdict["fp16_noise_floor"] = noise_floor
        check_failures = check.failures(metrics, metric_output or outputs[0])
        # The other outputs are measured too: one below the floor is named (not gated).
        ungated = [f for f in check.failures(metrics) if f not in check_failures]
        if ungated:
            log.warning("INT8 accuracy of outputs not gated by the check (the gate is '%s'): %s",
                        metric_output or outputs[0], "; ".join(ungated))
        if check_failures:
            log.warning("INT8 ACCURACY LOSS on %d held-out samples: %s", len(eval_src) if eval_src is not None else 0,
                        "; ".join(check_failures))
            if not accept_accuracy_loss:
                raise AccuracyLoss(f"{onnx_path.name}: INT8 fails the held-out check vs FP32: {'; '.join(check_failures)}; "
                                   f"nothing written to {out_path} (accept the loss to write it anyway)")

    speed = evaluator.time_ratio(fp32_model, chosen.model) if evaluator is not None else None
    path = save_model(chosen.model, out_path, force=force)
    result = _result(chosen, path, options, best.label)
    result.layers_in_float = list(chosen.plan.excluded)
    report = _report(onnx_path, path, options, method, best, candidates, metrics, accuracy_target, fb, eval_src,
                     calib_src, stats)
    timings["total"] = time.perf_counter() - t_start
    report["seconds"] = timings  # calibration (both passes) and total, selection and checks included
    report["metric_output"] = metric_output or outputs[0]
    report["kept_float"] = [{"node": n, "reason": why} for n, why in chosen.plan.auto_float.items()]
    report["float_tensors"] = [{"tensor": n, "reason": why} for n, why in chosen.plan.float_tensors.items()]
    report["speed"] = speed
    report["weight_rounding"] = rounding.to_dict()
    report["equalization"] = equalization
    report["quantize_attention"] = options.quantize_attention
    report["reduce_range"] = options.reduce_range
    report["smooth_quant"] = {"requested": sq_request, "alpha": smooth.alpha, "groups": smooth.groups,
                              "range_rule": None if smooth.alpha is None else SMOOTHED_RANGE_RULE,
                              "candidates": [{k: v for k, v in r.items() if k != "outputs"} for r in smooth.rows]}
    report["accuracy_check"] = None if check is None else {
        "measured": check_failures is not None, "ok": check_failures == [] if check_failures is not None else None,
        "failures": check_failures or [], "max_top1_drop_points": check.max_top1_drop, "min_cosine": check.min_cosine,
        "min_confident_agreement": check.min_confident_agreement,
        "output": metric_output or outputs[0], "ungated_below_floor": ungated, "verdict": verdict}
    if options.target == "onnxruntime":
        report["integer_kernels"] = _kernel_report(base_model, per_method[best.label], options, chosen)
    if stats is not None:
        report["input_methods"] = {t.name: best.label for t in io.inputs if t.name in stats}
    result.report = report
    if report_dir is not None:
        from .fsutil import report_json, write_report

        write_report(report_dir, "quantize", report_json(report), report_markdown(report))
    return result


@dataclass
class RoundingChoice:
    """The weight step ``quantize`` chose (None: nearest rounding of the original weights)."""

    requested: str
    chosen: str
    model: Any = None  # the FP32 model with rounded weights, when a step was chosen
    best: Candidate | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "chosen": self.chosen, "candidates": self.rows, "note": self.note,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "layers": self.layers}


WEIGHT_ROUNDING = ("auto",) + ROUNDING_STEPS


def choose_weight_rounding(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions, calib_src: Any,
                           evaluator: Evaluator | None, nearest: Candidate, requested: str, *,
                           metric_output: str | None = None, metric: str | None = None, budget_s: float | None = None,
                           threads: int | None = None) -> RoundingChoice:
    """The weight step (:mod:`trtrepo.weightsteps`): ``auto`` measures bias correction and
    AdaRound (each with the chosen method's ranges) against nearest rounding on the held-out data
    and keeps the best by :func:`trtrepo.evaluate.better`; without held-out data it takes AdaRound
    (whose per-layer guard never keeps a rounding worse than nearest on the calibration inputs).
    A named step is applied as asked (and measured when there is held-out data)."""
    from . import weightsteps as WS

    if requested not in WEIGHT_ROUNDING:
        raise UsageError(f"weight rounding '{requested}': expected one of {', '.join(WEIGHT_ROUNDING)}")
    choice = RoundingChoice(requested, "nearest")
    if requested == "nearest":
        return choice
    if calib_src is None:
        choice.note = "no calibration data here (ranges or a cache were given): nearest rounding"
        return choice
    layers = WS.find_layers(model, options, ranges)
    if not layers:
        choice.note = "no Conv/Gemm layer with quantized weights: nearest rounding"
        return choice
    steps = ("bias_correction", "adaround") if requested == "auto" else (requested,)
    from .modelio import ModelIO

    t0 = time.perf_counter()
    batches = WS.cached_batches(calib_src, ModelIO.from_onnx(model))
    moments = WS.collect_moments(model, layers, batches, WS.activation_qparams_for(model, layers, ranges, options),
                                 threads=threads)
    choice.seconds["weight_statistics"] = time.perf_counter() - t0
    if nearest.metrics is not None:
        choice.rows.append({"step": "nearest", "metrics": _row_metrics(nearest.metrics, metric_output)})
    best_model, best = None, nearest
    budget = WS.DEFAULT_BUDGET_S if budget_s is None else budget_s
    for step in steps:
        if step == "adaround" and WS.sequential_inputs(options.target):
            res = WS.round_weights_sequential(model, layers, batches[:WS.SEQUENTIAL_BATCHES], ranges, step, options,
                                              budget_s=budget, threads=threads)
        else:
            res = WS.round_weights(model, layers, moments, step, options, budget_s=budget)
        choice.seconds[step] = res.seconds
        t0 = time.perf_counter()
        qm = insert_qdq(res.model, ranges, options, source=f"{nearest.label} ranges", warn=False)
        cand = Candidate(nearest.label, qm, None if evaluator is None else evaluator(qm.model))
        choice.seconds[f"{step}_evaluation"] = time.perf_counter() - t0
        row: dict[str, Any] = {"step": step, "seconds": round(res.seconds, 3),
                               "adaround_learned": sum(1 for r in res.layers if r.adaround == "learned"),
                               "layers": len(res.layers)}
        if cand.metrics is not None:
            row["metrics"] = _row_metrics(cand.metrics, metric_output)
            log.info("weight rounding %s: %s", step, _brief(cand.metrics, metric_output))
        choice.rows.append(row)
        wins = cand.metrics is None if best.metrics is None else (
            cand.metrics is not None and better(cand.metrics, best.metrics, metric_output, metric))
        if requested != "auto" or wins or (evaluator is None and step == "adaround"):
            best_model, best = res.model, cand
            choice.chosen = step
            choice.layers = [vars(r) for r in res.layers]
    del batches
    if best_model is not None:
        choice.model, choice.best = best_model, best
    return choice


def _equalize(model: Any, calib_src: Any, evaluator: Evaluator | None, options: QuantizeOptions, enabled: bool,
              threads: int | None) -> dict[str, Any]:
    """Activation equalization (:mod:`trtrepo.equalize`) of ``model`` on the calibration data,
    kept only when the equalized FP32 model's outputs stay within
    :data:`trtrepo.equalize.MAX_RELATIVE_CHANGE` of the original's (on the held-out data, else on
    the calibration data). Returns the report entry, with the model under ``"model"`` when applied."""
    from . import equalize as EQ
    from .modelio import ModelIO
    from .weightsteps import cached_batches

    if not enabled:
        return {"applied": False, "note": "off"}
    if calib_src is None or not EQ.find_chains(model):
        return {"applied": False, "note": "no Conv -> ReLU/ReLU6 -> depthwise Conv chain"}
    excluded = [n.name for n in model.graph.node if options.excludes(n.name, n.op_type)]
    batches = cached_batches(calib_src, ModelIO.from_onnx(model))
    eq = EQ.equalize(model, batches, excluded=excluded, threads=threads)
    entry: dict[str, Any] = eq.to_dict()
    if evaluator is not None:
        ref, got = evaluator.reference.outputs, evaluator._run(eq.model).outputs
    else:
        from .evaluate import run_onnx

        ref = run_onnx(model, None, batches=batches[:2], threads=threads).outputs
        got = run_onnx(eq.model, None, batches=batches[:2], threads=threads).outputs
    change = max(float(np.max(np.abs(got[k] - ref[k]))) / max(float(np.max(np.abs(ref[k]))), 1e-12) for k in ref)
    entry["max_relative_change"] = change
    entry["applied"] = change <= EQ.MAX_RELATIVE_CHANGE and eq.channels_scaled > 0
    if entry["applied"]:
        entry["model"] = eq.model
    else:
        entry["note"] = ("no channel to scale" if eq.channels_scaled == 0 else
                         f"the equalized FP32 model moved the outputs by {change:.2g} of their range: not applied")
    log.info("equalization: %d chain(s), %d channel(s) scaled, FP32 outputs moved by %.2g of their range%s",
             len(eq.chains), eq.channels_scaled, change, "" if entry["applied"] else " (not applied)")
    return entry


def _fp16_floor(model: Any, evaluator: Evaluator, output: str) -> dict[str, Any] | None:
    """The FP32 model cast to FP16 on the same held-out samples: the agreement that a change of
    arithmetic alone costs (the noise floor beside INT8's figures)."""
    from .fp16 import convert_to_fp16

    try:
        m = evaluator(convert_to_fp16(model))[output]
    except Exception as exc:  # the floor is information, not a requirement
        log.info("FP16 noise floor not measured: %s", exc)
        return None
    return {"top1_agreement": m.top1_agreement, "confident_agreement": m.confident_agreement,
            "confident_samples": m.confident_samples, "cosine_mean": m.cosine_mean}


def _row_metrics(metrics: Mapping[str, OutputMetrics], output: str | None) -> dict[str, Any]:
    m = pick_output(metrics, output)
    return {"top1_agreement": m.top1_agreement, "accuracy": m.candidate_accuracy, "cosine_mean": m.cosine_mean}


def _kernel_report(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions,
                   chosen: QuantizedModel) -> dict[str, Any]:
    """Integer kernels ONNX Runtime runs for the chosen model and, per ``--exclude-op`` /
    ``--exclude-node``, how many kernels that exclusion costs (the count without it, minus now)."""
    from dataclasses import replace

    from .evaluate import integer_kernels

    now = integer_kernels(chosen.model)
    costs: list[dict[str, Any]] = []
    for kind, values in (("op", options.exclude_ops), ("node", options.exclude_nodes)):
        for value in values:
            rest = tuple(v for v in values if v != value)
            opts = replace(options, exclude_ops=rest) if kind == "op" else replace(options, exclude_nodes=rest)
            try:
                without = insert_qdq(model, ranges, opts, warn=False)
            except UsageError:
                continue
            total = integer_kernels(without.model)["total"]
            costs.append({"exclusion": f"--exclude-{kind} {value}", "kernels_without_it": total,
                          "kernels_lost": total - now["total"]})
    return {"kernels": now, "exclusion_costs": costs}


def _report(onnx_path: Path, out: Path, options: QuantizeOptions, method: str, best: Candidate,
            candidates: Sequence[Candidate], metrics: Mapping[str, OutputMetrics] | None,
            target: AccuracyTarget | None, fb: FallbackResult | None, eval_src: Any, calib_src: Any,
            stats: Any) -> dict[str, Any]:
    return {
        "model": str(onnx_path),
        "output": str(out),
        "target": options.target,
        "method_requested": method,
        "method": best.label,
        "calibration_samples": None if calib_src is None else len(calib_src),
        "evaluation_data": None if eval_src is None else {"name": eval_src.name, "samples": len(eval_src)},
        "methods": [c.row() for c in candidates] if len(candidates) > 1 else [],
        "accuracy_target": None if target is None else str(target),
        "sensitivity": [] if fb is None else fb.sensitivity,
        "steps": [] if fb is None else [vars(s) for s in fb.steps],
        "layers_in_float": [] if fb is None else list(fb.chosen.plan.excluded),
        "fallback": None if fb is None else {"weighted_layers": fb.weighted_layers, "weighted_in_float": fb.weighted_in_float,
                                             "seconds": fb.seconds, "evaluations": len(fb.steps)},
        "excluded": list(options.exclude_nodes) + list(options.exclude_ops),
        "metrics": None if metrics is None else {k: v.to_dict() for k, v in metrics.items()},
    }


def report_markdown(report: Mapping[str, Any]) -> str:
    lines = [f"# Quantization report: {Path(report['output']).name}", "",
             f"- model: `{report['model']}`, target `{report['target']}`",
             f"- method: {report['method']} (requested {report['method_requested']})"]
    if report.get("evaluation_data"):
        ev = report["evaluation_data"]
        lines.append(f"- evaluated on `{ev['name']}` ({ev['samples']} held-out samples; "
                     f"{report.get('calibration_samples') or '-'} calibration samples)")
    metric_output = report.get("metric_output")
    if metric_output:
        lines.append(f"- measured on output `{metric_output}`")
    if report.get("float_tensors") or report.get("kept_float"):
        lines += ["", "## Kept in float automatically", ""]
        if report.get("float_tensors"):
            lines += ["Unquantizable ranges:", "", "| tensor | reason |", "|---|---|"]
            lines += [f"| `{t['tensor']}` | {t['reason']} |" for t in report["float_tensors"]]
            lines.append("")
        if report.get("kept_float"):
            lines += ["| node | reason |", "|---|---|"]
            lines += [f"| `{t['node']}` | {t['reason']} |" for t in report["kept_float"]]
    kr = report.get("integer_kernels")
    if kr:
        ks = kr["kernels"]
        lines += ["", f"- ONNX Runtime integer kernels: {ks['total']} (" +
                  ", ".join(f"{k} {v}" for k, v in ks.items() if k != "total") + ")"]
        for c in kr.get("exclusion_costs", []):
            lines.append(f"- `{c['exclusion']}` costs {c['kernels_lost']} integer kernel(s) ({c['kernels_without_it']} without it)")
    sq = report.get("smooth_quant")
    if sq and sq.get("alpha") is not None:
        lines.append(f"- SmoothQuant alpha {sq['alpha']} on {len(sq['groups'])} MatMul/Gemm input(s) (requested {sq['requested']}); "
                     f"range rule of the smoothed inputs: {sq.get('range_rule') or SMOOTHED_RANGE_RULE}")
    check = report.get("accuracy_check")
    if check:
        if check.get("ok") is True:
            lines.append(f"- held-out check vs FP32 on `{check['output']}`: **passed** (top-1 drop <= "
                         f"{check['max_top1_drop_points']:g} points, cosine >= {check['min_cosine']:g})")
        elif check.get("ok") is False:
            lines.append("- held-out check vs FP32: **FAILED**: " + "; ".join(check["failures"]))
        else:
            lines.append("- held-out check vs FP32: **not measured** (no held-out data)")
        for below in check.get("ungated_below_floor") or []:
            lines.append(f"- other output below the floor (measured, not gated; `--metric-output` gates it): {below}")
    if report["methods"]:
        lines += ["", "## Methods", "", "| method | top-1 agree | accuracy | cosine mean | cosine min | max abs err |",
                  "|---|---|---|---|---|---|"]
        for row in report["methods"]:
            outs = row.get("outputs", {})
            m = outs.get(metric_output) if metric_output in outs else next(iter(outs.values()), None)
            if m is None:
                continue
            acc = "-" if m["candidate_accuracy"] is None else f"{100 * m['candidate_accuracy']:.2f}%"
            agree = "-" if m["top1_agreement"] is None else f"{100 * m['top1_agreement']:.2f}%"
            mark = " (chosen)" if row["label"] == report["method"] else ""
            lines.append(f"| {row['label']}{mark} | {agree} | {acc} | {m['cosine_mean']:.6f} | {m['cosine_min']:.6f} | "
                         f"{m['max_abs_error']:.4g} |")
    if report["accuracy_target"]:
        lines += ["", f"## Accuracy target {report['accuracy_target']}", ""]
        if report["sensitivity"]:
            lines += ["Sensitivity (value with only that layer in float, most sensitive first):", "",
                      "| layer | value | cosine |", "|---|---|---|"]
            lines += [f"| `{s['layer']}` | {s['value']:.6g} | {s['cosine']:.6f} |" for s in report["sensitivity"]]
            lines.append("")
        lines += ["| step | left in float | layers in float | value | met | speed vs FP32 |", "|---|---|---|---|---|---|"]
        for i, s in enumerate(report["steps"]):
            speed = "-" if s.get("speed") is None else f"{s['speed']:.2f}x"
            lines.append(f"| {i} | {s.get('label', '')} | {len(s['layers_in_float'])} | {s['value']:.6g} | "
                         f"{'yes' if s['met'] else 'no'} | {speed} |")
        fbr = report.get("fallback")
        if fbr:
            lines += ["", f"{fbr['weighted_in_float']} of {fbr['weighted_layers']} MatMul/Gemm/Conv layers left in float "
                          f"({fbr['evaluations']} evaluations, {fbr['seconds']:.0f} s)"]
            if fbr["weighted_layers"] and fbr["weighted_in_float"] > fbr["weighted_layers"] / 2:
                lines.append("**More than half of the MatMul/Conv layers run in float: expect little speed-up.**")
        lines += ["", "Layers left in float: " + (", ".join(f"`{n}`" for n in report["layers_in_float"]) or "none")]
    if report["metrics"]:
        from .evaluate import OutputMetrics

        outs = {k: OutputMetrics(**{f: v.get(f) for f in OutputMetrics.__dataclass_fields__}) for k, v in report["metrics"].items()}
        lines += ["", "## Result vs FP32", "", metrics_table(outs)]
    return "\n".join(lines) + "\n"


def quantize_for_deploy(onnx_path: str | Path, data_source: Any, out_path: str | Path,
                        target: str = "onnxruntime", *, method: str = "auto", batch_size: int = 32,
                        force: bool = True, progress: bool = False, metric_output: str | None = None,
                        reduce_range: bool = False, smooth_quant: float | str | None = "auto",
                        exclude_ops: Sequence[str] = (), exclude_nodes: Sequence[str] = (),
                        accuracy_target: AccuracyTarget | str | None = None,
                        weight_rounding: str = "auto") -> QuantizeResult:
    """What ``trtrepo deploy`` calls (``exclude_ops``/``exclude_nodes``/``accuracy_target`` as in
    ``trtrepo quantize``): calibrate ``onnx_path`` on ``data_source`` (a data spec
    or :class:`~trtrepo.data.DataSource`; one collection pass), pick the method and write the
    Q/DQ model for ``target``. ``auto`` picks the best of the registered methods on a held-out fifth
    of the data, and falls back to entropy (ModelOpt's default) below
    :data:`AUTO_MIN_SAMPLES` samples. ``metric_output`` is the output ``auto`` compares the methods
    on (default: the first output; give the embedding of a model whose first output is not a
    classifier). ``reduce_range``: 7-bit weights (onnxruntime target, see :mod:`trtrepo.cpu`).
    ``smooth_quant``: see :func:`run_quantize`. The run ends with the held-out
    check against FP32 (``result.report["accuracy_check"]``). Returns the path, the method used
    and the report."""
    from .data import DataSource, open_data
    from .modelio import ModelIO

    if method == "auto":
        source = data_source
        if not isinstance(source, DataSource):
            source = open_data(data_source, io=ModelIO.from_onnx(load_model(onnx_path)))
        if len(source) < AUTO_MIN_SAMPLES:
            log.info("%d samples: too few to hold some out; using entropy", len(source))
            method = "entropy"
        data_source = source
    return run_quantize(onnx_path, out_path, data=data_source, method=method,
                        options=QuantizeOptions(target=target, reduce_range=reduce_range, exclude_ops=tuple(exclude_ops),
                                                exclude_nodes=tuple(exclude_nodes)),
                        batch_size=batch_size, force=force, progress=progress, metric_output=metric_output,
                        smooth_quant=smooth_quant, accuracy_target=accuracy_target, weight_rounding=weight_rounding)
