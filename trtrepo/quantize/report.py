"""The quantize report: what ran, what was chosen and what it cost.

:class:`QuantizeReport` is what :func:`trtrepo.quantize.run_quantize` returns under
``result.report``: :meth:`~QuantizeReport.to_dict` is ``quantize.json`` (the user-facing file;
its keys and values are a contract), :func:`report_markdown` is ``quantize.md``,
:meth:`~QuantizeReport.summary_lines` is what ``trtrepo quantize`` prints, and
:meth:`~QuantizeReport.accuracy_summary` is the :class:`~trtrepo.quantsummary.QuantizeSummary`
that ``quantize`` and ``deploy`` print and put under ``accuracy`` in ``--json``. The commands and
``deploy`` read its attributes; nothing reads the report back by key.

Rows that are JSON already where they are made (the method candidates, the sensitivity list, the
weight-rounding and equalization entries, the speed ratio, the integer-kernel counts) are kept as
the mappings they are written as."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..evaluate import (
    AccuracyTarget,
    OutputMetrics,
    integer_kernels,
    metrics_table,
)
from ..qdq import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    QuantizeResult,
    insert_qdq,
)
from ..quantsummary import OutputFigures, QuantizeSummary
from ..warngroups import WarningGroup, group
from .fallback import FallbackResult, FallbackStep
from .front import QualityFront
from .gate import AccuracyCheck
from .select import SMOOTHED_RANGE_RULE, Candidate, RoundingChoice, SmoothChoice


@dataclass(frozen=True)
class HeldOutCheck:
    """The held-out accuracy check against FP32 the run ended with (``accuracy_check`` in the JSON).
    ``ok``: None when it was not measured (no held-out data)."""

    measured: bool
    ok: bool | None
    failures: tuple[str, ...]
    max_top1_drop_points: float
    min_cosine: float
    output: str  # the gated output
    ungated_below_floor: tuple[str, ...]  # other outputs below the floor: named, not gated
    verdict: Mapping[str, Any] | None  # AccuracyCheck.judge's verdict, with fp16_noise_floor when measured

    @classmethod
    def of(cls, check: AccuracyCheck, output: str, failures: list[str] | None, ungated: Sequence[str],
           verdict: Mapping[str, Any] | None) -> HeldOutCheck:
        """``failures`` None: not measured."""
        return cls(measured=failures is not None, ok=failures == [] if failures is not None else None,
                   failures=tuple(failures or ()), max_top1_drop_points=check.max_top1_drop, min_cosine=check.min_cosine,
                   output=output, ungated_below_floor=tuple(ungated), verdict=verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "ok": self.ok, "failures": list(self.failures),
                "max_top1_drop_points": self.max_top1_drop_points, "min_cosine": self.min_cosine,
                "output": self.output, "ungated_below_floor": list(self.ungated_below_floor), "verdict": self.verdict}


@dataclass(frozen=True)
class SmoothQuantReport:
    """SmoothQuant as requested and as applied (``smooth_quant`` in the JSON); ``alpha`` None: not applied."""

    requested: float | str | None
    alpha: float | None
    groups: tuple[Mapping[str, Any], ...]
    range_rule: str | None
    candidates: tuple[Mapping[str, Any], ...]  # alpha candidates and their metrics (without per-output rows)

    @classmethod
    def of(cls, requested: float | str | None, smooth: SmoothChoice) -> SmoothQuantReport:
        return cls(requested=requested, alpha=smooth.alpha, groups=tuple(smooth.groups),
                   range_rule=None if smooth.alpha is None else SMOOTHED_RANGE_RULE,
                   candidates=tuple({k: v for k, v in r.items() if k != "outputs"} for r in smooth.rows))

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "alpha": self.alpha, "groups": list(self.groups),
                "range_rule": self.range_rule, "candidates": list(self.candidates)}


@dataclass(frozen=True)
class QuantizeReport:
    """One quantize run (module doc). Field order is the key order of ``quantize.json``."""

    model: str
    output: str
    target: str
    method_requested: str
    method: str
    calibration_samples: int | None
    evaluation_data: Mapping[str, Any] | None  # {"name", "samples"} of the held-out data
    methods: tuple[Mapping[str, Any], ...]  # Candidate.row() of each method tried (empty: one method)
    accuracy_target: str | None
    sensitivity: tuple[Mapping[str, Any], ...]
    steps: tuple[FallbackStep, ...]  # the accuracy-target fallback's steps
    layers_in_float: tuple[str, ...]  # left in float by the accuracy-target fallback
    fallback: Mapping[str, Any] | None
    excluded: tuple[str, ...]  # --exclude-node patterns, then --exclude-op types
    metrics: Mapping[str, OutputMetrics] | None  # the shipped model vs FP32 on the held-out data
    seconds: Mapping[str, float]
    metric_output: str
    kept_float: Mapping[str, str]  # node -> reason (transformer-aware rules)
    float_tensors: Mapping[str, str]  # tensor -> reason (unquantizable ranges)
    speed: Mapping[str, Any] | None
    weight_rounding: Mapping[str, Any]  # RoundingChoice.to_dict()
    equalization: Mapping[str, Any]
    quantize_attention: bool
    reduce_range: bool
    smooth_quant: SmoothQuantReport
    accuracy_check: HeldOutCheck | None  # None: the run had no check
    integer_kernels: Mapping[str, Any] | None = None  # onnxruntime target only (absent from the JSON otherwise)
    input_methods: Mapping[str, str] | None = None  # calibrated here only (absent from the JSON otherwise)
    # the shipped model's warnings that repeat per layer, by cause (trtrepo.warngroups), with their details
    warnings: tuple[WarningGroup, ...] = ()
    front: QualityFront | None = None  # all-INT8 failed the check: the front searched (absent from the JSON otherwise)
    range_rule: str | None = None  # a detector's ranges by producer (absent from the JSON otherwise)
    report_dir: Path | None = field(default=None, compare=False)  # where quantize.json/.md went; not in the JSON

    def to_dict(self) -> dict[str, Any]:
        """``quantize.json``'s content."""
        d: dict[str, Any] = {
            "model": self.model, "output": self.output, "target": self.target,
            "method_requested": self.method_requested, "method": self.method,
            "calibration_samples": self.calibration_samples,
            "evaluation_data": None if self.evaluation_data is None else dict(self.evaluation_data),
            "methods": list(self.methods), "accuracy_target": self.accuracy_target,
            "sensitivity": list(self.sensitivity), "steps": [vars(s) for s in self.steps],
            "layers_in_float": list(self.layers_in_float), "fallback": self.fallback, "excluded": list(self.excluded),
            "metrics": None if self.metrics is None else {k: v.to_dict() for k, v in self.metrics.items()},
            "seconds": self.seconds, "metric_output": self.metric_output,
            "kept_float": [{"node": n, "reason": why} for n, why in self.kept_float.items()],
            "float_tensors": [{"tensor": n, "reason": why} for n, why in self.float_tensors.items()],
            "speed": self.speed, "weight_rounding": self.weight_rounding, "equalization": self.equalization,
            "quantize_attention": self.quantize_attention, "reduce_range": self.reduce_range,
            "smooth_quant": self.smooth_quant.to_dict(),
            "accuracy_check": None if self.accuracy_check is None else self.accuracy_check.to_dict(),
        }
        if self.integer_kernels is not None:
            d["integer_kernels"] = self.integer_kernels
        if self.input_methods is not None:
            d["input_methods"] = dict(self.input_methods)
        d["warnings"] = [g.to_dict() for g in self.warnings]
        if self.front is not None:
            d["front"] = self.front.to_dict()
        if self.range_rule is not None:
            d["range_rule"] = self.range_rule
        return d

    def accuracy_summary(self, shipped: str = "int8") -> QuantizeSummary:
        """What this run shipped and what it cost (``shipped``: int8, or fp32 when deploy fell back)."""
        outputs = tuple(OutputFigures(
            output=name, samples=m.samples, cosine_mean=m.cosine_mean, top1_agreement=m.top1_agreement,
            confident_agreement=m.confident_agreement, confident_samples=m.confident_samples,
            fp32_accuracy=m.reference_accuracy, int8_accuracy=m.candidate_accuracy,
            expected_drop_points=m.expected_drop_points)
            for name, m in (self.metrics or {}).items())
        check = self.accuracy_check
        verdict = (check.verdict if check is not None else None) or {}
        gate = None
        if check is not None:
            gate = {"output": check.output, "measured": check.measured, "passed": check.ok, "rule": verdict.get("rule"),
                    "inconclusive": bool(verdict.get("inconclusive")), "message": verdict.get("message"),
                    "failures": list(check.failures)}
        eq = self.equalization
        steps = {"smooth_quant": self.smooth_quant.alpha, "weight_rounding": self.weight_rounding.get("chosen"),
                 "equalization": ({"chains": eq.get("chains"), "channels_scaled": eq.get("channels_scaled")}
                                  if eq.get("applied") else None)}
        kept: list[dict[str, str]] = []
        kept += [{"name": n, "reason": why} for n, why in self.float_tensors.items()]
        kept += [{"name": n, "reason": why} for n, why in self.kept_float.items()]
        kept += [{"name": n, "reason": f"accuracy target {self.accuracy_target}"} for n in self.layers_in_float]
        kept += [{"name": n, "reason": "excluded by the user"} for n in self.excluded]
        row = None if self.front is None else self.front.shipped
        kept += [{"name": n, "reason": "sensitive: INT8 everywhere failed the gate (the accuracy/speed front)"}
                 for n in (row.layers_in_float if row is not None else ())]
        return QuantizeSummary(target=self.target, method=self.method, shipped=shipped, outputs=outputs, gate=gate,
                               fp16_noise_floor=verdict.get("fp16_noise_floor"), steps=steps, kept_float=tuple(kept),
                               speed=self.speed, held_out=self.evaluation_data)

    def summary_lines(self) -> list[str]:
        """What ``trtrepo quantize`` prints after its first line, indented as printed: the tensors
        and nodes kept in float, the methods tried, the accuracy target's result, SmoothQuant, where
        the report went, equalization, the weight steps tried, then :meth:`accuracy_summary`."""
        lines: list[str] = []
        if self.float_tensors:
            lines.append(f"  kept in float: {len(self.float_tensors)} tensor(s) with unquantizable ranges: "
                         + ", ".join(self.float_tensors))
        if self.kept_float:
            head = sum("decode head of a YOLO-style detector" in why for why in self.kept_float.values())
            rules = ("Softmax, LayerNorm, attention MatMuls, mask path" if not head else
                     f"{head} of a detector's decode head: box distribution, anchor arithmetic, sigmoid scores, the "
                     "box/score concat")
            lines.append(f"  kept in float: {len(self.kept_float)} node(s) by the placement rules ({rules}; see --report)")
        for row in self.methods:
            m = _row_output(row, self.metric_output)
            if m:
                acc = f"accuracy {100 * m['candidate_accuracy']:.2f}%, " if m["candidate_accuracy"] is not None else ""
                agree = f"top-1 agreement {100 * m['top1_agreement']:.2f}%, " if m["top1_agreement"] is not None else ""
                mark = "  <- chosen" if row["label"] == self.method else ""
                lines.append(f"  {row['label']:<10} {acc}{agree}cosine {m['cosine_mean']:.6f}{mark}")
        if self.accuracy_target:
            last = self.steps[-1]
            lines.append(f"  accuracy target {self.accuracy_target}: met with {len(last.layers_in_float)} "
                         f"layer(s) left in float (value {last.value:.6g})")
            lines += [f"    float: {name}" for name in self.layers_in_float]
        if self.smooth_quant.alpha is not None:
            lines.append(f"  smooth-quant: alpha {self.smooth_quant.alpha} on {len(self.smooth_quant.groups)} MatMul/Gemm "
                         "input(s) (their ranges: exact min/max of the smoothed tensors, not --method)")
        if self.report_dir is not None:
            lines.append(f"wrote {Path(self.report_dir) / 'quantize.json'} and quantize.md")
        eqr = self.equalization
        if eqr.get("applied"):
            lines.append(f"  equalized {eqr['chains']} Conv -> activation -> depthwise chain(s), {eqr['channels_scaled']} "
                         f"channel(s) (FP32 outputs moved by {eqr['max_relative_change']:.1g} of their range)")
        elif eqr.get("chains"):
            lines.append(f"  equalization not applied: {eqr.get('note', '')}")
        wr = self.weight_rounding
        if wr.get("chosen") and wr.get("requested") != "nearest":
            for row in wr.get("candidates", []):
                mm = row.get("metrics") or {}
                agree = "" if mm.get("top1_agreement") is None else f"top-1 agreement {100 * mm['top1_agreement']:.2f}%, "
                agree += "" if mm.get("map50_95") is None else f"mAP50-95 vs FP32 {mm['map50_95']:.3f}, "
                mark = "  <- chosen" if row["step"] == wr["chosen"] else ""
                took_s = f" ({row['seconds']:.1f}s)" if "seconds" in row else ""
                if row.get("budget_cut"):
                    took_s += f" ({row['budget_cut']} layer(s) left at nearest: the {row['budget_s']:g}s budget was spent)"
                if row.get("budget_short"):
                    took_s += (f" ({row['budget_short']} layer(s) ran fewer steps than the cap: the {row['budget_s']:g}s "
                               "budget; the file depends on this machine's speed and load)")
                why = f" (against {row['against']}: {row['decided_by']} decided)" if row.get("decided_by") else ""
                lines.append(f"  weights {row['step']:<16}{took_s} {agree}cosine {mm.get('cosine_mean', float('nan')):.6f}{why}{mark}")
            if wr.get("note"):
                lines.append(f"  weights: {wr['note']}")
        lines += [f"  {line}" for line in self.accuracy_summary().summary_lines()]
        return lines


def _row_output(row: Mapping[str, Any], metric_output: str | None) -> Mapping[str, Any] | None:
    """A method row's figures on ``metric_output`` (else its first output; None when unmeasured)."""
    outs = row.get("outputs", {})
    return outs.get(metric_output) if metric_output in outs else next(iter(outs.values()), None)


def kernel_report(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions,
                   chosen: QuantizedModel) -> dict[str, Any]:
    """Integer kernels ONNX Runtime runs for the chosen model and, per ``--exclude-op`` /
    ``--exclude-node``, how many kernels that exclusion costs (the count without it, minus now)."""

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


@dataclass(frozen=True)
class Selection:
    """What a run settled on: the SmoothQuant step, the FP32 model the chosen Q/DQ model was made
    from (smoothed, rounded weights), each method's ranges, the best method's candidate among
    ``candidates``, the weight rounding, and the chosen model with its metrics and, with an
    accuracy target, the fallback that chose it."""

    smooth: SmoothChoice
    base_model: Any
    per_method: dict[str, dict[str, ActivationRange]]
    best: Candidate
    candidates: Sequence[Candidate]
    rounding: RoundingChoice
    chosen: QuantizedModel
    metrics: Mapping[str, OutputMetrics] | None
    fb: FallbackResult | None


@dataclass(frozen=True)
class HeldOutFigures:
    """The held-out side of a run: the evaluation data (None: none), the accuracy target, the
    output gated, the chosen model's metrics, the accuracy check's result and the speed against
    FP32."""

    data: Any
    target: AccuracyTarget | None
    metric_output: str
    metrics: Mapping[str, OutputMetrics] | None
    check: HeldOutCheck | None
    speed: Mapping[str, Any] | None


@dataclass(frozen=True)
class CalibrationFacts:
    """How the ranges came about: the method asked for, the calibration data (None: ranges or a
    cache were given), the method per model input (None without statistics), the equalization
    step and SmoothQuant."""

    method_requested: str
    data: Any
    input_methods: Mapping[str, str] | None
    equalization: Mapping[str, Any]
    smooth_quant: SmoothQuantReport
    range_rule: str | None = None  # a detector's ranges (trtrepo.quantize.ranges.detector_ranges)


def build_report(onnx_path: Path, out: Path, options: QuantizeOptions, selection: Selection, held_out: HeldOutFigures,
                 calibration: CalibrationFacts, *, seconds: Mapping[str, float],
                 integer_kernels: Mapping[str, Any] | None = None) -> QuantizeReport:
    """The report of a run that wrote ``selection.chosen`` to ``out``."""
    best, candidates, chosen, fb = selection.best, selection.candidates, selection.chosen, selection.fb
    eval_src, calib_src, target, metrics = held_out.data, calibration.data, held_out.target, held_out.metrics
    return QuantizeReport(
        model=str(onnx_path), output=str(out), target=options.target.name, method_requested=calibration.method_requested,
        method=best.label,
        calibration_samples=None if calib_src is None else len(calib_src),
        evaluation_data=None if eval_src is None else {"name": eval_src.name, "samples": len(eval_src)},
        methods=tuple(c.row() for c in candidates) if len(candidates) > 1 else (),
        accuracy_target=None if target is None else str(target),
        sensitivity=() if fb is None else tuple(fb.sensitivity),
        steps=() if fb is None else tuple(fb.steps),
        layers_in_float=() if fb is None else tuple(fb.chosen.plan.excluded),
        fallback=None if fb is None else {"weighted_layers": fb.weighted_layers, "weighted_in_float": fb.weighted_in_float,
                                          "seconds": fb.seconds, "evaluations": len(fb.steps)},
        excluded=tuple(options.exclude_nodes) + tuple(options.exclude_ops),
        metrics=None if metrics is None else dict(metrics),
        seconds=seconds, metric_output=held_out.metric_output,
        kept_float=dict(chosen.plan.auto_float), float_tensors=dict(chosen.plan.float_tensors),
        speed=held_out.speed, weight_rounding=selection.rounding.to_dict(), equalization=calibration.equalization,
        quantize_attention=options.quantize_attention, reduce_range=options.reduce_range,
        smooth_quant=calibration.smooth_quant, accuracy_check=held_out.check,
        integer_kernels=integer_kernels, input_methods=calibration.input_methods, range_rule=calibration.range_rule,
        warnings=group(chosen.warnings))


@dataclass(kw_only=True)
class QuantizeRunResult(QuantizeResult):
    """:class:`~trtrepo.qdq.QuantizeResult` with the run's :class:`QuantizeReport`."""

    report: QuantizeReport


def report_markdown(report: QuantizeReport) -> str:
    """``quantize.md``: the header, then one section per part of the run that happened."""
    lines = _header_markdown(report)
    lines += _kept_float_markdown(report)
    if report.front is not None:
        lines += ["", "## Accuracy/speed front", "", "```", *report.front.summary_lines(), "```"]
        if report.front.plot is not None:
            lines += ["", f"![front]({Path(report.front.plot).name})"]
    lines += _kernels_and_smoothing_markdown(report)
    lines += _check_markdown(report)
    lines += _methods_markdown(report)
    lines += _target_markdown(report)
    if report.metrics:
        lines += ["", "## Result vs FP32", "", metrics_table(dict(report.metrics))]
    lines += _warnings_markdown(report.warnings)
    return "\n".join(lines) + "\n"


def _header_markdown(report: QuantizeReport) -> list[str]:
    lines = [f"# Quantization report: {Path(report.output).name}", "",
             f"- model: `{report.model}`, target `{report.target}`",
             f"- method: {report.method} (requested {report.method_requested})"
             + (f"; {report.range_rule}" if report.range_rule else "")]
    if report.evaluation_data:
        ev = report.evaluation_data
        lines.append(f"- evaluated on `{ev['name']}` ({ev['samples']} held-out samples; "
                     f"{report.calibration_samples or '-'} calibration samples)")
    if report.metric_output:
        lines.append(f"- measured on output `{report.metric_output}`")
    return lines


def _kept_float_markdown(report: QuantizeReport) -> list[str]:
    """The unquantizable tensors and the nodes the rules kept float, with why."""
    if not (report.float_tensors or report.kept_float):
        return []
    lines = ["", "## Kept in float automatically", ""]
    if report.float_tensors:
        lines += ["Unquantizable ranges:", "", "| tensor | reason |", "|---|---|"]
        lines += [f"| `{n}` | {why} |" for n, why in report.float_tensors.items()]
        lines.append("")
    if report.kept_float:
        lines += ["| node | reason |", "|---|---|"]
        lines += [f"| `{n}` | {why} |" for n, why in report.kept_float.items()]
    return lines


def _kernels_and_smoothing_markdown(report: QuantizeReport) -> list[str]:
    """ONNX Runtime's integer kernels (and what each exclusion costs), SmoothQuant's alpha."""
    lines: list[str] = []
    kr = report.integer_kernels
    if kr:
        ks = kr["kernels"]
        lines += ["", f"- ONNX Runtime integer kernels: {ks['total']} (" +
                  ", ".join(f"{k} {v}" for k, v in ks.items() if k != "total") + ")"]
        for c in kr.get("exclusion_costs", []):
            lines.append(f"- `{c['exclusion']}` costs {c['kernels_lost']} integer kernel(s) ({c['kernels_without_it']} without it)")
    sq = report.smooth_quant
    if sq.alpha is not None:
        lines.append(f"- SmoothQuant alpha {sq.alpha} on {len(sq.groups)} MatMul/Gemm input(s) (requested {sq.requested}); "
                     f"range rule of the smoothed inputs: {sq.range_rule or SMOOTHED_RANGE_RULE}")
    return lines


def _check_markdown(report: QuantizeReport) -> list[str]:
    """The held-out check's verdict and the ungated outputs below the floor."""
    check = report.accuracy_check
    if not check:
        return []
    lines: list[str] = []
    if check.ok is True:
        message = (check.verdict or {}).get("message")
        lines.append(f"- held-out check vs FP32 on `{check.output}`: **passed** (top-1 drop <= "
                     f"{check.max_top1_drop_points:g} points, cosine >= {check.min_cosine:g})"
                     + (f": {message}" if message else ""))
    elif check.ok is False:
        lines.append("- held-out check vs FP32: **FAILED**: " + "; ".join(check.failures))
    else:
        lines.append("- held-out check vs FP32: **not measured** (no held-out data)")
    for below in check.ungated_below_floor:
        lines.append(f"- other output below the floor (measured, not gated; `--metric-output` gates it): {below}")
    return lines


def _methods_markdown(report: QuantizeReport) -> list[str]:
    """One row per calibration method tried, on the metric output."""
    if not report.methods:
        return []
    lines = ["", "## Methods", "", "| method | top-1 agree | accuracy | cosine mean | cosine min | max abs err |",
             "|---|---|---|---|---|---|"]
    for row in report.methods:
        m = _row_output(row, report.metric_output)
        if m is None:
            continue
        acc = "-" if m["candidate_accuracy"] is None else f"{100 * m['candidate_accuracy']:.2f}%"
        agree = "-" if m["top1_agreement"] is None else f"{100 * m['top1_agreement']:.2f}%"
        mark = " (chosen)" if row["label"] == report.method else ""
        lines.append(f"| {row['label']}{mark} | {agree} | {acc} | {m['cosine_mean']:.6f} | {m['cosine_min']:.6f} | "
                     f"{m['max_abs_error']:.4g} |")
    return lines


def _target_markdown(report: QuantizeReport) -> list[str]:
    """The accuracy target's search: sensitivity, steps, the layers left in float."""
    if not report.accuracy_target:
        return []
    lines = ["", f"## Accuracy target {report.accuracy_target}", ""]
    if report.sensitivity:
        lines += ["Sensitivity (value with only that layer in float, most sensitive first):", "",
                  "| layer | value | cosine |", "|---|---|---|"]
        lines += [f"| `{s['layer']}` | {s['value']:.6g} | {s['cosine']:.6f} |" for s in report.sensitivity]
        lines.append("")
    lines += ["| step | left in float | layers in float | value | met | speed vs FP32 |", "|---|---|---|---|---|---|"]
    for i, s in enumerate(report.steps):
        speed = "-" if s.speed is None else f"{s.speed:.2f}x"
        lines.append(f"| {i} | {s.label} | {len(s.layers_in_float)} | {s.value:.6g} | "
                     f"{'yes' if s.met else 'no'} | {speed} |")
    fbr = report.fallback
    if fbr:
        lines += ["", f"{fbr['weighted_in_float']} of {fbr['weighted_layers']} MatMul/Gemm/Conv layers left in float "
                      f"({fbr['evaluations']} evaluations, {fbr['seconds']:.0f} s)"]
        if fbr["weighted_layers"] and fbr["weighted_in_float"] > fbr["weighted_layers"] / 2:
            lines.append("**More than half of the MatMul/Conv layers run in float: expect little speed-up.**")
    lines += ["", "Layers left in float: " + (", ".join(f"`{n}`" for n in report.layers_in_float) or "none")]
    return lines


def _warnings_markdown(groups: Sequence[WarningGroup]) -> list[str]:
    """``## Warnings``: per cause, its console line and one row per layer (or tensor)."""
    lines = ["", "## Warnings"] if groups else []
    for g in groups:
        counted = g.cause.counted.replace("_", " ") if g.cause.counted else None
        head = [g.cause.subject, *([counted] if counted else []), "detail"]
        lines += ["", f"{g.line()}:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for d in g.details:
            cells = [", ".join(f"`{s}`" for s in d.subjects), *([str(d.count)] if counted else []), d.message]
            lines.append("| " + " | ".join(cells) + " |")
    return lines
