"""The quantize report: what ran, what was chosen and what it cost, as JSON and Markdown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..evaluate import (
    AccuracyTarget,
    OutputMetrics,
    metrics_table,
)
from ..quantize import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    insert_qdq,
)
from .fallback import FallbackResult
from .select import SMOOTHED_RANGE_RULE, Candidate


def _kernel_report(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions,
                   chosen: QuantizedModel) -> dict[str, Any]:
    """Integer kernels ONNX Runtime runs for the chosen model and, per ``--exclude-op`` /
    ``--exclude-node``, how many kernels that exclusion costs (the count without it, minus now)."""
    from dataclasses import replace

    from ..evaluate import integer_kernels

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
        from ..evaluate import OutputMetrics

        outs = {k: OutputMetrics(**{f: v.get(f) for f in OutputMetrics.__dataclass_fields__}) for k, v in report["metrics"].items()}
        lines += ["", "## Result vs FP32", "", metrics_table(outs)]
    return "\n".join(lines) + "\n"
