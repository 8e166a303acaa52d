"""``trtrepo calibrate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .. import rangemath as H
from ._inputs import io_paths
from ._options import data_options
from ._output import json_option, summary_output

if TYPE_CHECKING:
    from ..calibrate import Ranges

METHODS = H.method_names()
CACHE_ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")


@click.command("calibrate")
@click.argument("model", type=click.Path(dir_okay=False))
@data_options(required=False)
@click.option("--method", type=click.Choice(METHODS), default="entropy", show_default=True,
              help="Range calibrator: " + "; ".join(f"{m.name} = {m.help}" for m in H.METHODS.values()) + ".")
@click.option("--percentile", type=click.FloatRange(0, 100, min_open=True), default=99.99, show_default=True,
              help="Percentile of |x| for --method percentile.")
@click.option("--num-bins", type=click.IntRange(min=128, max=65536), default=2048, show_default=True,
              help="Histogram bins of |x| per tensor (at least 128: entropy quantizes into 128 levels).")
@click.option("--cache", "cache_path", type=click.Path(dir_okay=False), default=None,
              help="TensorRT calibration cache: written, or reused without data when it exists (see --recalibrate).")
@click.option("--ranges", "ranges_path", type=click.Path(dir_okay=False), default=None,
              help="Write a JSON ranges file (tensor -> amax, scale, method, histogram summary).")
@click.option("--dynamic-range", "dynamic_range_path", type=click.Path(dir_okay=False), default=None,
              help="Write 'name:amax' lines (TensorRT sampleINT8API per-tensor dynamic ranges).")
@click.option("--recalibrate", is_flag=True, help="Calibrate from the data even when --cache exists (and overwrite it).")
@click.option("--trt-version", default="10.13.0", show_default=True, help="TensorRT version named in the cache header.")
@click.option("--cache-algorithm", type=click.Choice(CACHE_ALGORITHMS), default=None,
              help="Algorithm named in the cache header [default: MinMaxCalibration for minmax, else EntropyCalibration2, "
                   "which trtexec --calib reads].")
@click.option("--memory-budget-mb", type=click.FloatRange(min=0, min_open=True), default=512, show_default=True,
              help="Bound on the activations fetched per ONNX Runtime run: batches are cut into micro-batches "
                   "(and tensors into groups) to fit; the ranges do not change.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Show a progress bar (on a terminal).")
@json_option
@io_paths({"model": "MODEL", "data_spec": "--data", "preprocess": "--preprocess", "labels": "--labels"},
          {"cache_path": "--cache", "ranges_path": "--ranges", "dynamic_range_path": "--dynamic-range"})
def command(as_json: bool, model: str, data_spec: str | None, preprocess: str | None, labels: str | None, limit: int | None, seed: int,
            batch_size: int, skip_non_images: bool, method: str, percentile: float, num_bins: int, cache_path: str | None, ranges_path: str | None,
            dynamic_range_path: str | None, recalibrate: bool, trt_version: str, cache_algorithm: str | None,
            memory_budget_mb: float, progress: bool) -> None:
    """Compute INT8 ranges of MODEL (ONNX) from calibration data.

    Two streamed passes with ONNX Runtime (exact max |x|, then fixed-range histograms) make the
    result independent of batch size and sample order. Writes a TensorRT calibration cache
    (--cache), a JSON ranges file (--ranges) and/or sampleINT8API dynamic ranges
    (--dynamic-range); with none of them, prints the ranges.
    """
    from ..calibrate import CalibrateOptions, run_calibrate  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs
    from ..data import DataOptions  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

    data = DataOptions(data_spec, preprocess, labels, limit, seed, batch_size,
                       skip_non_images=skip_non_images) if data_spec is not None else None
    options = CalibrateOptions(
        data=data, method=method, percentile=percentile, num_bins=num_bins, cache=cache_path, ranges=ranges_path,
        dynamic_range=dynamic_range_path, recalibrate=recalibrate, trt_version=trt_version,
        cache_algorithm=cache_algorithm, memory_budget_mb=memory_budget_mb, progress=progress)
    with summary_output(as_json) as emit:
        result = run_calibrate(model, options)
        ranges = result.ranges
        if result.reused_cache is not None:
            click.echo(f"reused calibration cache {result.reused_cache} ({ranges.options['header']}, {len(ranges)} tensors); "
                       "no data read (--recalibrate to rebuild it)")
        elif result.statistics is not None:
            extra = f" {percentile:g}" if "percentile" in H.METHODS[method].options else ""
            click.echo(f"calibrated {len(ranges)} tensors of {model} on {result.statistics.num_samples} samples with "
                       f"{method}{extra} ({num_bins} bins) in {result.seconds:.1f}s")
        for path in result.written:
            click.echo(f"wrote {path}")
        if not options.outputs() and not as_json:
            _print_ranges(ranges)
        emit({"command": "calibrate", "model": model, "method": ranges.method, "tensors": len(ranges),
              "samples": result.statistics.num_samples if result.statistics is not None else None,
              "reused_cache": result.reused_cache, "written": [str(p) for p in result.written],
              "seconds": result.seconds, "amax": dict(ranges)})


def _print_ranges(ranges: Ranges) -> None:
    width = max((len(n) for n in ranges), default=4)
    click.echo(f"{'tensor':<{width}}  {'amax':>12}  {'scale':>12}")
    scales = ranges.scales()
    for name, amax in ranges.items():
        click.echo(f"{name:<{width}}  {amax:12.6g}  {scales[name]:12.6g}")
