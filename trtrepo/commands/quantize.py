"""``trtrepo quantize``."""

from __future__ import annotations

import time

import click

from .. import histogram as H
from ..progress import hide_phases
from ..quantize import QDQ_TARGETS, QuantizeOptions, target_names
from ..weightopt import ROUNDING_STEPS
from ._inputs import io_paths
from ._options import data_options, not_empty
from ._output import json_option, summary_output

METHODS = H.method_names(auto=True)


@click.command("quantize")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Output Q/DQ ONNX file.")
@click.option("--ranges", "ranges_path", type=click.Path(dir_okay=False), default=None,
              help="Ranges JSON from 'trtrepo calibrate --ranges' (amax, and min/max for the onnxruntime target).")
@click.option("--cache", "cache_path", type=click.Path(dir_okay=False), default=None,
              help="TensorRT calibration cache (scales) instead of ranges; refused when made for another model.")
@data_options(required=False)
@click.option("--method", type=click.Choice(METHODS), default=None,
              help="With --data: range calibrator [default: auto: quantizes with every registered method and keeps the best "
                   "on held-out data].")
@click.option("--smooth-quant", "smooth_quant", default="auto", show_default=True, metavar="off|auto|ALPHA",
              help="SmoothQuant on MatMul/Gemm inputs: migrate activation outliers into the weights with ALPHA in (0, 1]; "
                   "auto compares 0.5/0.65/0.8/0.95 and none on held-out data. A smoothed input's range is the exact "
                   "min/max of the smoothed statistics whatever --method says (--method sets the other tensors).")

@click.option("--target", type=click.Choice(target_names()), default="tensorrt", show_default=True,
              help="; ".join(f"{t.name}: {t.help}" for t in QDQ_TARGETS.values()) + ".")
@click.option("--exclude-op", "exclude_ops", multiple=True, metavar="OP", help="Leave every node of this op type in float (repeatable).")
@click.option("--exclude-node", "exclude_nodes", multiple=True, metavar="PATTERN",
              help="Leave nodes whose name matches (exact or full-match regex) in float (repeatable).")
@click.option("--accuracy-target", default=None, metavar="KIND=VALUE",
              help="top1-drop=POINTS, top1=PERCENT or cosine=MIN: leave the most sensitive layers in float until it holds.")
@click.option("--eval-data", default=None, metavar="SPEC", callback=not_empty,
              help="Held-out evaluation data (default: a --holdout part of --data that calibration does not use).")
@click.option("--holdout", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.2, show_default=True,
              help="Fraction of --data held out for --method auto / --accuracy-target when --eval-data is not given.")
@click.option("--metric-output", default=None, metavar="OUTPUT",
              help="Output that --method auto and --accuracy-target are measured on (default: the first; e.g. an "
                   "embedding output with --accuracy-target cosine=0.99).")
@click.option("--quantize-attention", is_flag=True,
              help="Also quantize the attention MatMuls of two activations (Q.K^T, P.V), left in float by default "
                   "as TensorRT/ModelOpt do; the additive-mask path stays float regardless.")
@click.option("--reduce-range", is_flag=True,
              help="onnxruntime target: 7-bit weights, so that the model stays exact on x86 CPUs without VNNI in "
                   "runtimes that do not set session.x64quantprecision (e.g. Triton's onnxruntime backend).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime intra-op threads for evaluation.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write quantize.json and quantize.md (methods, sensitivity, fallback steps, accuracy) into DIR.")
@click.option("--weight-rounding", type=click.Choice(("auto",) + ROUNDING_STEPS), default="auto",
              show_default=True,
              help="How Conv/Gemm weights are rounded to INT8: auto measures bias correction and AdaRound against nearest "
                   "rounding on the held-out data and keeps the best.")
@click.option("--equalize/--no-equalize", default=True, show_default=True,
              help="Activation equalization of Conv -> ReLU/ReLU6 -> depthwise Conv chains before calibration (kept only "
                   "when the FP32 outputs stay within 1e-4 of their range).")
@click.option("--accept-accuracy-loss", is_flag=True,
              help="Write the model even when the held-out check against FP32 fails or cannot decide (exit 0); "
                   "without it such a run writes nothing and exits 1.")
@click.option("--force/--no-force", default=True, show_default=True, help="Overwrite an existing output file.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar (on a terminal).")
@json_option
@io_paths({"model": "MODEL", "ranges_path": "--ranges", "cache_path": "--cache", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels", "eval_data": "--eval-data"},
          {"output": "-o", "report_dir": "--report"})
def command(as_json: bool, model: str, output: str, ranges_path: str | None, cache_path: str | None, data_spec: str | None,
            preprocess: str | None, labels: str | None, limit: int | None, seed: int, batch_size: int,
            skip_non_images: bool, method: str | None,
            target: str, exclude_ops: tuple[str, ...], exclude_nodes: tuple[str, ...], accuracy_target: str | None,
            eval_data: str | None, holdout: float, metric_output: str | None, quantize_attention: bool,
            reduce_range: bool, threads: int | None, report_dir: str | None, force: bool, progress: bool,
            smooth_quant: str, weight_rounding: str, equalize: bool, accept_accuracy_loss: bool) -> None:
    """Insert Q/DQ nodes into MODEL (FP32 ONNX) and write the explicit-INT8 model to -o.

    Ranges come from --ranges, --cache or calibration on --data (--method). The tensorrt target
    follows TensorRT's placement (Conv/ConvTranspose/Gemm/MatMul inputs and per-channel weights,
    residual Add input); the onnxruntime target forms full node units that ONNX Runtime runs
    with integer kernels.
    """
    from ..autoquant import AccuracyLoss, QuantizeRequest, quantize_request  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..evaluate import AccuracyTarget  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    target_obj = AccuracyTarget.parse(accuracy_target) if accuracy_target else None
    options = QuantizeOptions(target=target, exclude_ops=exclude_ops, exclude_nodes=exclude_nodes,
                              quantize_attention=quantize_attention, reduce_range=reduce_range)
    data = None if data_spec is None else DataOptions(spec=data_spec, preprocess=preprocess, labels=labels, limit=limit,
                                                       seed=seed, batch_size=batch_size, skip_non_images=skip_non_images)
    if not progress:
        hide_phases()  # the INT8 step's phase lines are its progress here (the calibration bar gives way to them)
    started = time.perf_counter()
    with summary_output(as_json) as emit:
        try:
            result = quantize_request(QuantizeRequest(
                model, output, ranges=ranges_path, cache=cache_path, data=data, method=method, options=options,
                accuracy_target=target_obj, eval_data=eval_data, holdout=holdout, metric_output=metric_output, seed=seed,
                batch_size=batch_size, threads=threads, report_dir=report_dir, force=force, progress=progress,
                smooth_quant=smooth_quant, weight_rounding=weight_rounding, accept_accuracy_loss=accept_accuracy_loss,
                equalize=equalize))
        except AccuracyLoss as exc:  # the library names the concept; the command names its flags
            raise AccuracyLoss(f"{exc}; --accept-accuracy-loss writes it, --eval-data gives the check more samples") from exc
        report = result.report
        took = time.perf_counter() - started
        click.echo(f"quantized {model} for {result.target} ({result.method}): {len(result.layers)} layers, "
                   f"{result.activations} activations, {result.weights} weights -> {result.path} in {took:.1f}s")
        for line in report.summary_lines():
            click.echo(line)
        check = report.accuracy_check
        if check is not None and (not check.measured or check.ok is None):
            click.echo("  WARNING: accuracy vs FP32 NOT measured (no held-out data)", err=True)
        elif check is not None and check.ok is False:
            click.echo("WARNING: INT8 ACCURACY LOSS vs FP32 on held-out data: " + "; ".join(check.failures)
                       + " (written because of --accept-accuracy-loss; try --accuracy-target, --smooth-quant or --exclude-node)",
                       err=True)
        emit({"command": "quantize", "model": model, "output": str(result.path), "target": result.target,
              "method": result.method, "layers": len(result.layers), "activations": result.activations,
              "weights": result.weights, "kept_float": list(result.kept_float),
              "float_tensors": list(result.float_tensors), "smooth_quant": report.smooth_quant.alpha,
              "accuracy_check": None if check is None else check.to_dict(),
              "accuracy": report.accuracy_summary().to_dict(), "methods": list(report.methods),
              "warnings": [g.to_dict() for g in report.warnings], "seconds": took})
