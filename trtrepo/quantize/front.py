"""When INT8 everywhere fails the gate: the accuracy/speed front over INT8 with the ``k`` most
sensitive weighted layers kept in higher precision, and the fastest candidate on it that passes.

:func:`search_front` ranks the quantized weighted layers (Conv, MatMul, Gemm): one measure per
layer, the gated output's mean cosine to FP32 with that layer alone left in float (the
calibration is reused, only the Q/DQ placement changes, as in
:func:`~trtrepo.quantize.fallback.fallback`). On the tensorrt target the highest cosine comes
first (an FP16 layer is nearly free there); on the onnxruntime target the most cosine gained per
unit of float cost (:func:`_float_costs`: a float layer's price follows the activations it
converts), so that the candidates that pass are also the ones that stay faster than FP32. The ranking runs on calibration samples
(``ranker``, :data:`RANK_SAMPLES` of them), never on the held-out samples that judge the
candidates: ranked and judged on the same 51 crops, the trained MobileNetV2's damaged
configuration kept in float the layers that repaired those crops, and 4 of 10 shipped candidates
lost over 1 point on 500 other crops while passing their hold-out by wide margins (measured
figures: docs/benchmarks.md, issue 40). Without calibration data (ranges from a file) it ranks on
the held-out data and the report says so.

A candidate that passes on the held-out samples is confirmed on the calibration samples the
ranking did not see (``confirm``): it is vetoed (verdict ``fail (calib)``) when its estimate
there is over the limit (the gate's *fail*). Ranking on calibration data removed the ranking's
bias but not the hold-out's size: on 51 crops a candidate whose drop on 500 other crops was 1.29
points passed with a bound of 0.38 (its few costly flips not drawn). The confirmation set saw the
calibration (the ranges were collected on it), so it can only veto, never pass a candidate. The ranking stops at its time budget
(the layers not reached keep their graph order after the measured ones). Then a short series of
candidates, ``k`` in :data:`CANDIDATE_KS` (fewer than the weighted layers), each judged by the
same :class:`~trtrepo.quantize.gate.AccuracyCheck` verdict as all-INT8.

Speed: on the onnxruntime target every row (all-INT8 and each candidate) is timed against FP32
on the held-out batches with stable windows (:meth:`~trtrepo.quantize.select.Evaluator.stable_ratio`,
:data:`FRONT_STABILITY`). More layers in float are not
faster, so the first ``k`` that passes ends the search: it ships when it is faster than FP32
beyond the measurement's noise; when it is not, no candidate can be, and FP32 ships. When the
windows never agree (a busy machine) the choice is made on accuracy and the report says the
speed could not be told, unless the windows' side-by-side ratios say slower beyond their noise
(:func:`clearly_slower`): then FP32 ships. On the tensorrt target a CPU time says nothing about the engine: the
fewest layers in float that pass wins, and the speed is TensorRT's to measure (the float layers
are left in the model's float type; the engine builder picks their precision).

FP32 is on the front too (every layer in float, no drop, speed 1.0x). :class:`QualityFront` is
the report: ``to_dict`` for ``quantize.json``, ``summary_lines`` for the console (at most
:data:`MAX_ROWS` rows), :func:`write_plot` for ``front.png``."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..evaluate import OutputMetrics
from ..measure import Stability
from ..modelio import without_weights
from ..pngplot import png_figure
from ..progress import phase, update
from ..qdq import ActivationRange, QuantizedModel, QuantizeOptions, insert_qdq, prepare_model
from .fallback import layer_roles
from .gate import DETECTION_RULE, AccuracyCheck
from .select import Evaluator

log = logging.getLogger(__name__)

CANDIDATE_KS = (1, 2, 4, 8, 16, 24)  # layers in higher precision tried, fewest first
MAX_ROWS = 5  # rows the console prints (FP32 included)
SENSITIVITY_BUDGET_S = 90.0  # the per-layer ranking stops here (the candidates still run)
RANK_SAMPLES = 64  # calibration samples the ranking runs on (a cosine over every class: few suffice)
# each row's timing: windows of >= 0.3 s per model, three within 10 %, at most 6 (~4 s a row on MobileNetV2)
FRONT_STABILITY = Stability(interval_s=0.3, pct=10.0, max_trials=6)
WEIGHTED_ROLES = ("conv", "attention", "mlp_up", "mlp_down", "first_last")


@dataclass(frozen=True)
class FrontOptions:
    """How the front is searched: ``ks`` the candidates' layer counts, ``budget_s`` the
    sensitivity ranking's time, ``measure_speed`` False on the tensorrt target (a CPU time says
    nothing about the engine), ``report_dir`` where ``front.png`` and the quantize report go."""

    ks: tuple[int, ...] = CANDIDATE_KS
    budget_s: float = SENSITIVITY_BUDGET_S
    measure_speed: bool = True
    report_dir: Path | None = None


@dataclass(frozen=True)
class FrontRow:
    """One point of the front: the layers in higher precision, the gate's verdict on it and its
    speed against FP32 (None: not measured)."""

    layers_in_float: tuple[str, ...]
    verdict: str  # pass | fail | cannot decide | fail (calib): passed the hold-out, vetoed by the confirmation set
    rule: str
    drop: float | None  # the expected top-1 drop (points) of a classifier, else the gate's value (the mean cosine)
    upper: float | None  # the 95 % upper bound of the expected drop (points), when the rule has one
    speed: float | None = None  # FP32 time / this candidate's time
    speed_stable: bool | None = None  # None: not timed; False: the windows never agreed (a busy machine)
    speed_noise_pct: float | None = None
    faster: bool | None = None  # beyond the noise (stable windows only)
    label: str = ""
    confirm_drop: float | None = None  # the estimate on the confirmation samples (module doc), when measured

    @property
    def k(self) -> int:
        return len(self.layers_in_float)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "layers_in_float": list(self.layers_in_float), "k": self.k,
                "verdict": self.verdict, "rule": self.rule, "drop": self.drop, "upper": self.upper,
                "confirm_drop": self.confirm_drop, "speed_vs_fp32": self.speed, "speed_stable": self.speed_stable,
                "speed_noise_pct": None if self.speed_noise_pct is None or not math.isfinite(self.speed_noise_pct)
                else self.speed_noise_pct, "faster_than_fp32": self.faster}

    def speed_text(self, measured: bool) -> str:
        if self.label == "FP32":
            return "1.00x"
        if not measured:
            return "TensorRT's to measure"
        if self.speed is None:
            return "-"
        if not self.speed_stable:
            return f"{self.speed:.2f}x (not stable: busy machine)"
        return f"{self.speed:.2f}x +-{self.speed_noise_pct:.0f}%"

    def drop_text(self) -> str:
        if self.drop is None:
            return "-"
        if self.rule == "mean cosine":
            return f"cosine {self.drop:.4f}"
        bound = f" (<= {self.upper:.2f})" if self.upper is not None else ""
        return f"{self.drop:.2f}{bound}"


@dataclass(frozen=True)
class QualityFront:
    """The front searched when all-INT8 failed the gate (module doc): ``rows`` all-INT8 first,
    then each candidate measured, FP32 last; ``chosen`` the index of the row shipped (None:
    FP32 ships, ``reason`` says why)."""

    rows: tuple[FrontRow, ...]
    chosen: int | None
    reason: str
    speed_measured: bool
    sensitivity: tuple[Mapping[str, Any], ...] = ()
    seconds: float = 0.0
    limit: float = 1.0  # the gate's limit (points of drop, or the minimum cosine)
    ranked_on: str = "calibration"  # the data the layers were ranked on: calibration | held-out
    ranked_samples: int = 0
    plot: Path | None = field(default=None, compare=False)

    @property
    def shipped(self) -> FrontRow | None:
        return None if self.chosen is None else self.rows[self.chosen]

    def shown(self) -> list[int]:
        """The indices printed: at most :data:`MAX_ROWS`, FP32 and the chosen row always, then
        all-INT8 and the rows nearest the chosen one."""
        last = len(self.rows) - 1
        keep = {last, 0} | ({self.chosen} if self.chosen is not None else set())
        centre = self.chosen if self.chosen is not None else last
        for i in sorted(range(1, last), key=lambda i: (abs(i - centre), -i)):
            if len(keep) >= MAX_ROWS:
                break
            keep.add(i)
        return sorted(keep)[:MAX_ROWS]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "chosen": self.chosen,
                "shipped": "int8" if self.chosen is not None else "fp32",
                "shipped_layers_in_float": [] if self.shipped is None else list(self.shipped.layers_in_float),
                "reason": self.reason, "speed_measured": self.speed_measured,
                "sensitivity": [dict(s) for s in self.sensitivity], "ranked_on": self.ranked_on,
                "ranked_samples": self.ranked_samples,
                "seconds": self.seconds,
                "plot": None if self.plot is None else str(self.plot)}

    def summary_lines(self) -> list[str]:
        """The front as printed: one line per shown row (layers in higher precision, expected
        drop with its 95 % bound, verdict, speed vs FP32), then the choice."""
        rule = next((r.rule for r in self.rows if r.rule), "")
        head = "expected drop (95% bound)" if "drop" in rule else rule or "value"
        head = head if self.rows[0].upper is not None or "drop" not in rule else f"{rule} (points)"
        lines = [f"accuracy/speed front (INT8 everywhere failed the gate; {len(self.rows) - 2} candidate(s) measured):",
                 f"  {'in float':>9}  {head:<26} {'verdict':<14} speed vs FP32"]
        for i in self.shown():
            r = self.rows[i]
            n = "all" if r.label == "FP32" else str(r.k)
            mark = "  <- shipped" if i == self.chosen or (self.chosen is None and r.label == "FP32") else ""
            lines.append(f"  {n:>9}  {r.drop_text():<26} {r.verdict:<14} {r.speed_text(self.speed_measured)}{mark}")
        lines.append(f"  {self.reason}")
        if self.ranked_on != "calibration":
            lines.append("  (layers ranked on the held-out data that judged them: no calibration data, the ranges were given)")
        if self.plot is not None:
            lines.append(f"  the front: {self.plot}")
        return lines


def _row(check: AccuracyCheck, metrics: Mapping[str, OutputMetrics], gated: str, in_float: Sequence[str],
         label: str) -> FrontRow:
    """The gate's verdict on one candidate; its drop is the expected top-1 drop with its 95 % upper
    bound whenever the output is a classifier (with labels the verdict is the label drop's)."""
    v = check.judge(metrics[gated])
    verdict = "pass" if v["ok"] else ("cannot decide" if v.get("inconclusive") else "fail")
    ed = v.get("expected_drop")
    drop, upper = (ed["estimate"], ed["upper"]) if ed else (v.get("value"), None)
    return FrontRow(tuple(in_float), verdict, v.get("rule", ""), drop, upper, label=label)


def _sensitivity_key(row: FrontRow, cosine: float) -> tuple[float, float]:
    """Smaller first: the gated output's mean cosine to FP32 with this layer alone in float (the
    layer whose float copy removes most of the error), then the drop left. The cosine is measured
    on every sample and class; the expected drop on a 51-sample hold-out rests on a few flips
    and ranked the trained MobileNetV2's layers worse (k = 4 dropped more than k = 2)."""
    higher_better = row.rule in ("mean cosine", DETECTION_RULE)  # the other rules' values are drops
    value = row.drop if row.drop is not None else (-math.inf if higher_better else math.inf)
    return (-cosine, -value if higher_better else value)


@dataclass
class _Ctx:
    model: Any
    ranges: Mapping[str, ActivationRange]
    options: QuantizeOptions
    evaluator: Evaluator
    check: AccuracyCheck
    gated: str

    def quantize(self, in_float: Sequence[str]) -> QuantizedModel | None:
        try:
            return insert_qdq(self.model, self.ranges, self.options.with_excluded_nodes(sorted(in_float)), warn=False)
        except UsageError:  # nothing left to quantize
            return None


def search_front(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions, evaluator: Evaluator,
                 check: AccuracyCheck, gated: str, start: tuple[QuantizedModel, Mapping[str, OutputMetrics]],
                 fp32_model: Any, front: FrontOptions,
                 calibration: tuple[Evaluator | None, Evaluator | None] = (None, None)
                 ) -> tuple[QualityFront, QuantizedModel | None, Mapping[str, OutputMetrics] | None]:
    """(the front, the chosen model, its metrics); the model is None when FP32 ships. ``model``
    and ``ranges``: what the all-INT8 model ``start`` was made from; ``calibration``: (the ranker,
    FP32 on calibration samples, which the layers are ranked on (None: the held-out
    ``evaluator``); the confirmation, FP32 on the other calibration samples, which can veto a
    passing candidate (None: no confirmation); module doc)."""
    ranker, confirm = calibration
    t0 = time.perf_counter()
    ctx = _Ctx(model, ranges, options, evaluator, check, gated)
    qm0, m0 = start
    rows = [_row(check, m0, gated, (), "all INT8")]
    timed0 = evaluator.stable_ratio(fp32_model, qm0.model, FRONT_STABILITY) if front.measure_speed else None
    if timed0 is not None:
        rows[0] = _with_speed(rows[0], timed0["ratio"], timed0["stable"], timed0["noise_pct"], timed0["faster"])
    layers = list(qm0.plan.layers)
    roles = layer_roles(prepare_model(model), layers)
    weighted = [n for n in layers if roles.get(n) in WEIGHTED_ROLES]
    costs = _float_costs(model, weighted) if front.measure_speed else None
    ranked, sensitivity = _rank(ctx, ranker or evaluator, (qm0, weighted), t0 + front.budget_s, costs)
    chosen: tuple[int, QuantizedModel, Mapping[str, OutputMetrics]] | None = None
    reason = ""
    for k in sorted({k for k in front.ks if 0 < k < len(weighted)}):
        update(f"candidate with the {k} most sensitive layer(s) in float")
        in_float = ranked[:k]
        qm = ctx.quantize(in_float)
        if qm is None:
            break
        m = evaluator(qm.model)
        row = _row(check, m, gated, in_float, f"{k} most sensitive")
        if row.verdict == "pass" and confirm is not None:
            row = _confirmed(row, check.judge(confirm(qm.model)[gated]))
        timed = evaluator.stable_ratio(fp32_model, qm.model, FRONT_STABILITY) if front.measure_speed else None
        if timed is not None:
            row = _with_speed(row, timed["ratio"], timed["stable"], timed["noise_pct"], timed["faster"])
        log.info("front: %d layer(s) in float: %s, %s, %s", k, row.verdict, row.drop_text(),
                 row.speed_text(front.measure_speed))
        rows.append(row)
        if row.verdict != "pass":
            continue
        if not front.measure_speed:
            chosen, reason = (len(rows) - 1, qm, m), (f"shipped INT8 with the {k} most sensitive layer(s) in float: "
                                                      "the fewest that pass (speed: TensorRT's to measure)")
            break
        if timed is None:
            chosen, reason = (len(rows) - 1, qm, m), (f"shipped INT8 with the {k} most sensitive layer(s) in float: "
                                                      "the fewest that pass (speed not measured: held-out data not in memory)")
        elif not timed["stable"] and not clearly_slower(timed):
            chosen, reason = (len(rows) - 1, qm, m), (
                f"shipped INT8 with the {k} most sensitive layer(s) in float: the fewest that pass; its speed vs FP32 "
                f"could not be told (the timing windows never agreed within {FRONT_STABILITY.pct:g}%: the machine is busy), decided on accuracy")
        elif timed["faster"]:
            chosen, reason = (len(rows) - 1, qm, m), (f"shipped INT8 with the {k} most sensitive layer(s) in float: "
                                                      f"the fewest that pass, {timed['ratio']:.2f}x FP32's speed")
        else:
            busy = "" if timed["stable"] else " in every timing window (a busy machine, FP32 timed beside it in each)"
            reason = (f"FP32 shipped: the fewest layers in float that pass ({k}) run at {timed['ratio']:.2f}x FP32 "
                      f"(+-{timed['noise_pct']:.0f}%){busy}, not faster; more layers in float would not be faster")
        break
    else:
        fails = rows[1:] or rows
        if len(rows) == 1:
            reason = (f"no candidate passed: {len(weighted)} weighted layer(s), too few to keep some in float beside "
                      f"INT8 (all INT8: {rows[0].rule} {rows[0].drop_text()}): FP32 shipped")
        best = min(fails, key=lambda r: (r.drop if r.drop is not None else math.inf)
                   if r.rule != "mean cosine" else -(r.drop or 0.0))
        reason = reason or (f"no candidate passed; best: {best.k} layer(s) in float, {best.rule} {best.drop_text()} "
                  f"({best.verdict}): FP32 shipped")
    if chosen is None and not reason:
        reason = "no candidate passed (nothing left to quantize with those layers in float): FP32 shipped"
    rows.append(FrontRow(tuple(weighted), "pass", rows[0].rule, 0.0 if rows[0].rule != "mean cosine" else 1.0, 0.0,
                         speed=1.0, speed_stable=True, faster=False, label="FP32"))
    result = QualityFront(tuple(rows), None if chosen is None else chosen[0], reason, front.measure_speed,
                          tuple(sensitivity), time.perf_counter() - t0,
                          check.max_top1_drop if rows[0].rule != "mean cosine" else check.min_cosine,
                          ranked_on="held-out" if ranker is None else "calibration",
                          ranked_samples=len((ranker or evaluator).source))
    log.info("front: %s", reason)
    return (result, None, None) if chosen is None else (result, chosen[1], chosen[2])


def clearly_slower(timed: Mapping[str, Any]) -> bool:
    """A timing (:meth:`~trtrepo.quantize.select.Evaluator.stable_ratio`) that says slower than FP32
    beyond its noise: the ratio under ``1 - noise``. Decision: on a busy machine the windows' own
    throughputs never agree, but each window times FP32 and the candidate side by side, so their
    ratios still agree when the candidate is much slower (measured 0.53-0.80x under two CPU burners
    for a model with two fragile convolutions kept float, tests/test_byom.py): such a candidate is
    not shipped on accuracy alone."""
    return timed["ratio"] < 1.0 - timed["noise_pct"] / 100.0


def _with_speed(row: FrontRow, speed: float | None, stable: bool | None, noise: float | None,
                faster: bool | None) -> FrontRow:
    return replace(row, speed=speed, speed_stable=stable, speed_noise_pct=noise, faster=faster)


def _confirmed(row: FrontRow, verdict: Mapping[str, Any]) -> FrontRow:
    """``row`` (passed on the held-out samples) after the confirmation samples' verdict: vetoed
    when that verdict is the gate's *fail* (the estimate itself over the limit)."""
    ed = verdict.get("expected_drop")
    value = ed["estimate"] if ed else verdict.get("value")
    vetoed = not verdict["ok"] and not verdict.get("inconclusive")
    return replace(row, verdict="fail (calib)" if vetoed else row.verdict, confirm_drop=value)


def _rank(ctx: _Ctx, ranker: Evaluator, layers: tuple[QuantizedModel, Sequence[str]], deadline: float,
          costs: Mapping[str, float] | None) -> tuple[list[str], list[dict[str, Any]]]:
    """The weighted layers, first to keep in float first, measured by ``ranker`` (module doc),
    and each one's measure. ``layers``: (the all-INT8 model, the weighted layers). With
    ``costs`` (the onnxruntime target) the order is the cosine gained per unit of float cost:
    gain = the layer's cosine minus all-INT8's on the same samples, cost = :func:`_float_costs`.
    Without (the tensorrt target, where an FP16 layer is nearly free) the highest cosine first."""
    qm0, weighted = layers
    base = ranker(qm0.model)[ctx.gated].cosine_mean
    scored: list[tuple[tuple[float, float], str, FrontRow, float]] = []
    with phase("front (layer sensitivity)", len(weighted), "layers") as ph:
        for layer in weighted:
            if time.perf_counter() > deadline:
                log.info("front: sensitivity budget spent after %d of %d layers", len(scored), len(weighted))
                break
            qm = ctx.quantize([layer])
            if qm is None:
                continue
            m = ranker(qm.model)
            row = _row(ctx.check, m, ctx.gated, [layer], f"only {layer}")
            cosine = m[ctx.gated].cosine_mean
            key = _sensitivity_key(row, cosine)
            if costs is not None:
                key = (-max(cosine - base, 0.0) / costs.get(layer, 1.0), key[0])
            scored.append((key, layer, row, cosine))
            ph.advance()
    scored.sort(key=lambda item: item[0])
    measured = [layer for _, layer, _, _ in scored]
    ranked = measured + [n for n in weighted if n not in set(measured)]
    return ranked, [{"layer": layer, "drop": row.drop, "verdict": row.verdict, "cosine": cosine,
                     "cosine_gain": cosine - base, "float_cost": None if costs is None else costs.get(layer)}
                    for _, layer, row, cosine in scored]


def _float_costs(model: Any, layers: Sequence[str]) -> dict[str, float]:
    """Each layer's cost of staying in float on the onnxruntime target, relative to the cheapest:
    the activation elements per sample it reads and writes (shape inference; a symbolic dimension
    counts 1). A float layer between INT8 ones runs in float and moves its input and output
    through dequantization, quantization and layout changes, so the cost follows the activations,
    not the multiply-adds: on the trained MobileNetV2 one high-resolution layer in float took
    INT8's speed to under half, a late one cost nothing (docs/benchmarks.md, issue 40). All 1.0
    when shapes are unknown (the order is then the cosine gain alone)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(without_weights(model))
    except Exception as exc:  # shape inference is a help here
        log.debug("front: shape inference failed (%s); float costs not used", exc)
        return {n: 1.0 for n in layers}
    size: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        size[vi.name] = int(math.prod(max(d.dim_value, 1) for d in list(dims)[1:])) if dims else 0
    wanted = set(layers)
    raw = {}
    for node in inferred.graph.node:
        if node.name in wanted:
            data_in = node.input[0] if node.input else ""
            raw[node.name] = float(size.get(data_in, 0) + sum(size.get(o, 0) for o in node.output))
    known = [v for v in raw.values() if v > 0]
    floor = min(known) if known else 1.0
    return {n: max(raw.get(n, 0.0), floor) / floor for n in layers}


def write_plot(front: QualityFront, path: str | Path) -> Path:
    """The front: expected drop (with its 95 % bound) against layers in higher precision, the
    gate's limit, each point's speed vs FP32, the shipped point marked."""
    with png_figure(path, figsize=(7.5, 5), dpi=100) as (_fig, ax, _meta):
        xs = [r.k for r in front.rows]
        ys = [r.drop if r.drop is not None else float("nan") for r in front.rows]
        ups = [max((r.upper if r.upper is not None else y) - y, 0.0) if r.drop is not None else 0.0
               for r, y in zip(front.rows, ys, strict=True)]
        colors = ["g" if r.verdict == "pass" else ("orange" if r.verdict == "cannot decide" else "r") for r in front.rows]
        ax.errorbar(xs, ys, yerr=[[0.0] * len(ups), ups], fmt="none", ecolor="0.5", capsize=3)
        ax.scatter(xs, ys, c=colors, s=30, zorder=3)
        for r, x, y in zip(front.rows, xs, ys, strict=True):
            if not front.speed_measured and r.label != "FP32":
                continue
            text = r.speed_text(front.speed_measured).split(" (")[0] + ("?" if r.speed_stable is False else "")
            ax.annotate(text, (x, y), textcoords="offset points",
                        xytext=(4, 6), fontsize=7)
        shipped = front.shipped or front.rows[-1]
        ax.plot([shipped.k], [shipped.drop if shipped.drop is not None else 0.0], "b*", markersize=14,
                label=f"shipped: {'FP32' if front.shipped is None else f'{shipped.k} layer(s) in float'}")
        if "drop" in front.rows[0].rule:
            ax.axhline(front.limit, color="r", ls=":", label="gate limit")
        ax.set_xscale("symlog")
        ax.set_xlim(left=-0.3)
        ax.set_xlabel("layers in higher precision (most sensitive first; the last point is FP32)")
        ax.set_ylabel("expected top-1 drop (points; bar: 95% bound)" if front.rows[0].upper is not None
                      else front.rows[0].rule or "drop")
        speed = "labels: speed vs FP32, ? not stable" if front.speed_measured else "speed: TensorRT's to measure"
        ax.set_title(f"trtrepo: INT8 accuracy/speed front ({speed})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    return Path(path)
