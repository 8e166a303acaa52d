"""Choices made on held-out data: the calibration method, SmoothQuant's alpha, the weight
rounding step, and activation equalization (kept only where FP32 outputs stay put)."""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import equalize as EQ
from .. import weightsteps as WS
from ..data import iter_batches
from ..errors import UsageError
from ..evaluate import (
    OutputMetrics,
    RunOutputs,
    better,
    classification_outputs,
    compare_outputs,
    detectors_for,
    pick_output,
    preference,
    run_onnx,
)
from ..measure import STABLE_WINDOWS, Stability, deviation, is_stable
from ..modelio import ModelIO
from ..onnxgraph import make_session
from ..progress import phase
from ..qdq import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    insert_qdq,
    plan_qdq,
    prepare_model,
)
from ..smoothquant import AUTO_ALPHAS, apply_smoothquant, smooth_candidates
from ..weightmath import ROUNDING_STEPS
from ..weightsteps import cached_batches
from .ranges import CACHE_BYTES

log = logging.getLogger(__name__)
# how a candidate is timed against FP32 (Evaluator.stable_ratio): windows of >= 0.5 s per model, within 10 %
SPEED_STABILITY = Stability(interval_s=0.5, pct=10.0, max_trials=10)
# --------------------------------------------------------------------------------------------
# Evaluation of candidates


def _row_metrics(metrics: Mapping[str, OutputMetrics], output: str | None) -> dict[str, Any]:
    m = pick_output(metrics, output)
    return {"top1_agreement": m.top1_agreement, "accuracy": m.candidate_accuracy, "cosine_mean": m.cosine_mean,
            "map50_95": None if m.detection is None else m.detection.map50_95}


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
                 cache_bytes: int = CACHE_BYTES, label_output: str | None = None,
                 detectors: Mapping[str, int | None] | None = None) -> None:
        self.source = source
        self.label_output = label_output
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
        # a detector's outputs (name -> class count, trtrepo.qdq.detector_outputs) are judged in boxes
        self.detection = detectors_for(self.reference.outputs, detectors, source)
        self.count = 0

    def _run(self, model: Any) -> RunOutputs:
        """Run ``model`` on the held-out data; the inference time (without building the session)
        goes to ``last_seconds``."""

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

    def stable_ratio(self, fp32_model: Any, model: Any, stability: Stability = SPEED_STABILITY) -> dict[str, Any] | None:
        """FP32 time over ``model``'s time on the held-out batches, measured in windows by
        :mod:`trtrepo.measure`'s stability rule: each window runs FP32 then ``model`` over the
        batches (repeated to at least ``stability.interval_s``), until the last
        :data:`~trtrepo.measure.STABLE_WINDOWS` windows agree within ``stability.pct`` percent
        on both models' throughput, or ``stability.max_trials`` windows (``stable`` False: the
        machine is too busy to tell). ``ratio`` is the last windows' median ratio, ``noise_pct``
        the largest deviation of their ratios (percent); ``faster`` means ratio > 1 + noise.
        None when the held-out data is not kept in memory."""

        if not self.batches:
            return None
        sessions = [make_session(m, threads=self.threads) for m in (fp32_model, model)]
        samples = sum(len(next(iter(b.inputs.values()))) for b in self.batches)

        def one_pass(sess: Any) -> float:
            t0 = time.perf_counter()
            run_onnx(None, None, batches=self.batches, session=sess, io=False)
            return time.perf_counter() - t0

        for sess in sessions:  # warm-up
            one_pass(sess)
        windows: list[list[dict[str, Any]]] = [[], []]
        ratios: list[float] = []
        for _ in range(stability.max_trials):
            took = []
            for side, sess in enumerate(sessions):
                passes, spent = 0, 0.0
                while spent < stability.interval_s or passes == 0:
                    spent += one_pass(sess)
                    passes += 1
                took.append(spent / passes)
                windows[side].append({"throughput": samples / (spent / passes), "latency_ms": {"mean": 1000 * spent / passes}})
            ratios.append(took[0] / max(took[1], 1e-9))
            if all(is_stable(w, stability.pct) for w in windows):
                break
        last = ratios[-STABLE_WINDOWS:]
        ratio = float(np.median(last))
        noise = deviation(last) if len(last) > 1 else math.inf
        stable = all(is_stable(w, stability.pct) for w in windows)
        return {"ratio": ratio, "noise_pct": noise, "stable": stable, "windows": len(ratios),
                "faster": stable and ratio > 1.0 + noise / 100.0, "engine": "ONNX Runtime CPU",
                "batch_size": self.batch_size, "stability_pct": stability.pct}

    def __call__(self, model: Any) -> dict[str, OutputMetrics]:
        self.count += 1
        cand = self._run(model)
        return compare_outputs(self.reference.outputs, cand.outputs, self.reference.labels, classification=self.classification,
                               detection=self.detection)

    def fp32_metrics(self) -> dict[str, OutputMetrics]:
        return compare_outputs(self.reference.outputs, self.reference.outputs, self.reference.labels,
                               classification=self.classification, detection=self.detection)


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

    best: Candidate | None = None
    rows: list[Candidate] = []
    seen: dict[tuple[Any, ...], dict[str, OutputMetrics]] = {}
    planned: list[str] | None = None  # the activations the first candidate quantizes
    with phase("method choice", len(ranges_per_method), "methods") as ph:
        for k, (method, ranges) in enumerate(ranges_per_method.items()):
            ph.set_note(method)
            key = None if planned is None else tuple((t, repr(ranges.get(t))) for t in planned)
            if key is not None and key in seen:
                cand = Candidate(method, None, seen[key])
            else:
                qm = insert_qdq(model, ranges, options, warn=k == 0,  # a ranges file or cache: "the given ranges"
                               source=f"{method} ranges" if method not in ("ranges", "cache") else "the given ranges")
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
            if best is None:
                best = cand
            else:
                wins, why = preference(cand.metrics, best.metrics, metric_output, metric)  # type: ignore[arg-type]
                log.info("method %s against %s: %s (%s decided)", method, best.label, "better" if wins else "not better", why)
                if wins:
                    best = cand
            for c in rows:
                if c is not best:
                    c.quantized = None
            gc.collect()
            ph.advance()
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


# --------------------------------------------------------------------------------------------
# SmoothQuant and the held-out accuracy check

DEFAULT_ALPHA = 0.8  # --smooth-quant auto without evaluation data
AUTO_MIN_GROUPS = 2  # --smooth-quant auto tries alphas only on models with this many smoothable MatMul/Gemm inputs
MAX_TOP1_DROP_POINTS = 1.0  # the default check: top-1 agreement may drop by at most this
MIN_COSINE = 0.99  # ... and an output without classes needs at least this mean cosine


SMOOTHED_RANGE_RULE = ("min/max: a smoothed tensor's range is the exact min/max of its smoothed per-channel statistics, "
                       "whatever the method; the method sets the ranges of the other tensors")


def smoothed_ranges(base: Mapping[str, ActivationRange], smoothed: Mapping[str, tuple[float, float]]) -> dict[str, ActivationRange]:
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

    prepared = prepare_model(model)
    none = SmoothChoice(None, model, {}, [], [])
    channels = getattr(stats, "channels", None) or {}
    if request is None or not channels:
        return none
    plan = plan_qdq(prepared, options, ranges=first_ranges)
    skip = set(plan.excluded) | set(plan.auto_float) | set(plan.kept_float)
    if request == "auto":

        if len([x for x, nodes in smooth_candidates(prepared).items() if set(nodes) - skip]) < AUTO_MIN_GROUPS:
            return none  # a CNN with one classifier Gemm: nothing worth five evaluations
        alphas: tuple[float | None, ...] = (None, *AUTO_ALPHAS) if evaluator is not None else (DEFAULT_ALPHA,)
    else:
        alphas = (float(request),)

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
    with phase("SmoothQuant alpha", len(alphas), "candidates") as ph:
        for alpha in alphas:
            ph.set_note(f"alpha {alpha}")
            # one candidate model alive at a time (each is a full copy of the weights): build,
            # measure, drop; the winner is rebuilt at the end (smoothing is deterministic)
            choice = build(alpha)
            if alpha is not None and not choice.groups:
                return none  # nothing to smooth: no candidates to compare
            row: dict[str, Any] = {"alpha": alpha, "groups": len(choice.groups)}
            qm = insert_qdq(choice.model, smoothed_ranges(first_ranges, choice.ranges), options, warn=False)
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
            ph.advance()
    assert best is not None
    chosen = build(best[1])
    chosen.rows = rows
    return chosen


@dataclass(frozen=True)
class WeightRounding:
    """The weight step asked for (``auto`` or one of :data:`WEIGHT_ROUNDING`) and AdaRound's time
    for the whole model (None: :data:`trtrepo.weightsteps.DEFAULT_BUDGET_S`)."""

    step: str = "auto"
    budget_s: float | None = None


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
                           evaluator: Evaluator | None, nearest: Candidate, rounding: WeightRounding, *,
                           metric_output: str | None = None, metric: str | None = None,
                           threads: int | None = None) -> RoundingChoice:
    """The weight step (:mod:`trtrepo.weightsteps`): ``auto`` measures bias correction and
    AdaRound (each with the chosen method's ranges) against nearest rounding on the held-out data
    and keeps the best by :func:`trtrepo.evaluate.better`; without held-out data it takes AdaRound
    (whose per-layer guard never keeps a rounding worse than nearest on the calibration inputs).
    A named step is applied as asked (and measured when there is held-out data)."""
    requested, budget_s = rounding.step, rounding.budget_s
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
                                              work=WS.SequentialWork(budget_s=budget), threads=threads)
        else:
            res = WS.round_weights(model, layers, moments, step, options, budget_s=budget)
        choice.seconds[step] = res.seconds
        t0 = time.perf_counter()
        with phase(f"weight rounding ({WS.STEP_LABELS[step]}, held-out evaluation)"):
            qm = insert_qdq(res.model, ranges, options, source=f"{nearest.label} ranges", warn=False)
            cand = Candidate(nearest.label, qm, None if evaluator is None else evaluator(qm.model))
        choice.seconds[f"{step}_evaluation"] = time.perf_counter() - t0
        row: dict[str, Any] = {"step": step, "seconds": round(res.seconds, 3),
                               "adaround_learned": sum(1 for r in res.layers if r.adaround == "learned"),
                               "layers": len(res.layers), "budget_s": budget, "budget_cut": res.budget_cut,
                               "budget_short": res.budget_short}
        if cand.metrics is not None:
            row["metrics"] = _row_metrics(cand.metrics, metric_output)
            log.info("weight rounding %s: %s", step, _brief(cand.metrics, metric_output))
        wins = cand.metrics is None if best.metrics is None else False
        if best.metrics is not None and cand.metrics is not None:
            wins, row["decided_by"] = preference(cand.metrics, best.metrics, metric_output, metric)
            row["against"] = choice.chosen
        choice.rows.append(row)
        if requested != "auto" or wins or (evaluator is None and step == "adaround"):
            best_model, best = res.model, cand
            choice.chosen = step
            choice.layers = [vars(r) for r in res.layers]
    del batches
    if best_model is not None:
        choice.model, choice.best = best_model, best
    return choice


def equalize_step(model: Any, calib_src: Any, evaluator: Evaluator | None, options: QuantizeOptions, enabled: bool,
              threads: int | None) -> dict[str, Any]:
    """Activation equalization (:mod:`trtrepo.equalize`) of ``model`` on the calibration data,
    kept only when the equalized FP32 model's outputs stay within
    :data:`trtrepo.equalize.MAX_RELATIVE_CHANGE` of the original's (on the held-out data, else on
    the calibration data). Returns the report entry, with the model under ``"model"`` when applied."""

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
