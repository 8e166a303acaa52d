"""``trtrepo calibrate``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .. import histogram as H
from ..errors import UsageError
from ._options import data_options

if TYPE_CHECKING:
    from ..calibrate import Ranges

METHODS = H.method_names()
CACHE_ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")


def _check_outputs(**paths: str | None) -> None:
    seen: dict[Path, str] = {}
    for option, value in paths.items():
        if value is None:
            continue
        p = Path(value).resolve()
        flag = "--" + option.replace("_", "-")
        if p.is_dir():
            raise UsageError(f"{flag} {value}: is a directory")
        if p in seen:
            raise UsageError(f"{flag} and {seen[p]} name the same file {value}")
        seen[p] = flag


@click.command("calibrate")
@click.argument("model", type=click.Path(dir_okay=False))
@data_options(required=False)
@click.option("--method", type=click.Choice(METHODS), default="entropy", show_default=True,
              help="Range calibrator: " + "; ".join(f"{m.name} = {m.help}" for m in H.METHODS.values()) + ".")
@click.option("--percentile", type=click.FloatRange(0, 100, min_open=True), default=99.99, show_default=True,
              help="Percentile of |x| for --method percentile.")
@click.option("--num-bins", type=click.IntRange(min=1), default=2048, show_default=True, help="Histogram bins of |x| per tensor.")
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
def command(model: str, data_spec: str | None, preprocess: str | None, labels: str | None, limit: int | None, seed: int,
            batch_size: int, method: str, percentile: float, num_bins: int, cache_path: str | None, ranges_path: str | None,
            dynamic_range_path: str | None, recalibrate: bool, trt_version: str, cache_algorithm: str | None,
            memory_budget_mb: float, progress: bool) -> None:
    """Compute INT8 ranges of MODEL (ONNX) from calibration data.

    Two streamed passes with ONNX Runtime (exact max |x|, then fixed-range histograms) make the
    result independent of batch size and sample order. Writes a TensorRT calibration cache
    (--cache), a JSON ranges file (--ranges) and/or sampleINT8API dynamic ranges
    (--dynamic-range); with none of them, prints the ranges.
    """
    from ..cache import trt_version_int
    from ..calibrate import Calibrator

    trt_version_int(trt_version)  # validate before any work
    _check_outputs(cache=cache_path, ranges=ranges_path, dynamic_range=dynamic_range_path)
    reuse = cache_path is not None and Path(cache_path).is_file() and not recalibrate
    if not reuse and data_spec is None:
        raise UsageError("--data is required (or --cache naming an existing calibration cache to reuse)")

    started = time.perf_counter()
    cal = Calibrator(model, data_spec, batch_size=batch_size, num_bins=num_bins, progress=progress,
                     preprocess=preprocess, labels=labels, limit=limit, seed=seed, memory_budget_mb=memory_budget_mb)
    stats = None
    if reuse and cache_path is not None:
        ranges = cal.load_cache(cache_path)
        click.echo(f"reused calibration cache {cache_path} ({ranges.options['header']}, {len(ranges)} tensors); "
                   "no data read (--recalibrate to rebuild it)")
    else:
        stats = cal.collect()
        ranges = stats.compute(method, percentile=percentile)
        took = time.perf_counter() - started
        click.echo(f"calibrated {len(ranges)} tensors of {model} on {stats.num_samples} samples with {method}"
                   f"{f' {percentile:g}' if 'percentile' in H.METHODS[method].options else ''} ({num_bins} bins) in {took:.1f}s")

    # Render everything first so that a failure writes nothing.
    from ..cache import format_cache, format_dynamic_range

    algorithm = cache_algorithm or H.METHODS[method].cache_algorithm
    outputs: list[tuple[str, str]] = []
    if cache_path is not None and not reuse:
        outputs.append((cache_path, format_cache(ranges.scales(), trt_version, algorithm)))
    if ranges_path is not None:
        import json

        outputs.append((ranges_path, json.dumps(ranges.to_dict(stats), indent=2) + "\n"))
    if dynamic_range_path is not None:
        outputs.append((dynamic_range_path, format_dynamic_range(ranges)))

    from ..fsutil import atomic_write_text

    for path, text in outputs:
        atomic_write_text(path, text)
        click.echo(f"wrote {path}")
    if not outputs:
        _print_ranges(ranges)


def _print_ranges(ranges: Ranges) -> None:
    width = max((len(n) for n in ranges), default=4)
    click.echo(f"{'tensor':<{width}}  {'amax':>12}  {'scale':>12}")
    scales = ranges.scales()
    for name, amax in ranges.items():
        click.echo(f"{name:<{width}}  {amax:12.6g}  {scales[name]:12.6g}")
