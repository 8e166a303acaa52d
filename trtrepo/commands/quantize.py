"""``trtrepo quantize``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from ..progress import hide_phases
from ._inputs import io_paths
from ._options import composed_data, data_options, quantize_options
from ._output import json_option, summary_output

if TYPE_CHECKING:
    from ..data import DataOptions
    from ..quantize import QuantizeSettings


@click.command("quantize")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Output Q/DQ ONNX file.")
@data_options(required=False)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime intra-op threads for evaluation.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write quantize.json and quantize.md (methods, sensitivity, fallback steps, accuracy) into DIR.")
@click.option("--force/--no-force", default=True, show_default=True, help="Overwrite an existing output file.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar (on a terminal).")
@json_option
@io_paths({"model": "MODEL", "ranges": "--ranges", "cache": "--cache", "data_spec": "--data", "preprocess": "--preprocess",
           "labels": "--labels", "eval_data": "--eval-data"},
          {"output": "-o", "report_dir": "--report"})
@quantize_options
@composed_data
def command(as_json: bool, model: str, output: str, data: DataOptions, int8: QuantizeSettings,
            threads: int | None, report_dir: str | None, force: bool, progress: bool) -> None:
    """Insert Q/DQ nodes into MODEL (FP32 ONNX) and write the explicit-INT8 model to -o.

    Ranges come from --ranges, --cache or calibration on --data (--method). The tensorrt target
    follows TensorRT's placement (Conv/ConvTranspose/Gemm/MatMul inputs and per-channel weights,
    residual Add input); the onnxruntime target forms full node units that ONNX Runtime runs
    with integer kernels.
    """
    from ..quantize import AccuracyLoss, QuantizeRequest, quantize_request  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    if not progress:
        hide_phases()  # the INT8 step's phase lines are its progress here (the calibration bar gives way to them)
    started = time.perf_counter()
    with summary_output(as_json) as emit:
        try:
            result = quantize_request(QuantizeRequest(
                model, output, data=data if data.spec else None, int8=int8, seed=data.seed or 0,
                batch_size=data.batch_size, threads=threads, report_dir=report_dir, force=force, progress=progress))
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
