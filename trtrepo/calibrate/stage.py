"""The stage: what ``trtrepo calibrate`` runs (:func:`run_calibrate`)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import rangemath as H
from ..cache import format_cache, format_dynamic_range, trt_version_int
from ..data import DataOptions
from ..errors import OptionError
from ..fsutil import atomic_write_text
from .budget import DEFAULT_MEMORY_BUDGET_MB
from .calibrator import Calibrator, HistogramOptions
from .statistics import Ranges, Statistics


@dataclass(frozen=True)
class CalibrateOptions:
    """What ``trtrepo calibrate`` takes besides the model: the data (:class:`~trtrepo.data.DataOptions`,
    whose ``batch_size`` is the ONNX Runtime batch), the method, and the outputs (None: not written): ``cache``
    (a TensorRT calibration cache; an existing one is reused, no data read, unless
    ``recalibrate``), ``ranges`` (JSON), ``dynamic_range`` (sampleINT8API text)."""

    data: DataOptions | None = None
    method: str = "entropy"
    percentile: float = H.DEFAULT_PERCENTILE
    num_bins: int = H.DEFAULT_NUM_BINS
    cache: str | None = None
    ranges: str | None = None
    dynamic_range: str | None = None
    recalibrate: bool = False
    trt_version: str = "10.13.0"
    cache_algorithm: str | None = None
    memory_budget_mb: float | None = DEFAULT_MEMORY_BUDGET_MB
    progress: bool = False

    def outputs(self) -> dict[str, str]:
        """``{parameter: path}`` of the outputs asked for."""
        return {k: v for k, v in (("cache", self.cache), ("ranges", self.ranges), ("dynamic_range", self.dynamic_range))
                if v is not None}


@dataclass
class CalibrateResult:
    ranges: Ranges
    statistics: Statistics | None  # None when a cache was reused
    reused_cache: str | None
    written: list[str]
    seconds: float


def run_calibrate(model: str | Path, options: CalibrateOptions) -> CalibrateResult:
    """Compute (or reuse) ranges and write the outputs asked for, all rendered before any is written
    so that a failure writes nothing. Refuses outputs that name the same file, a directory, or the
    model or data they are computed from."""
    trt_version_int(options.trt_version)  # validate before any work
    if options.method not in H.METHODS:
        raise OptionError("method", f"'{options.method}': expected one of {', '.join(H.METHODS)}",
                          concept="the calibration method")
    _check_outputs(options.outputs(), inputs={"model": model, "data": options.data.spec if options.data else None})
    reuse = options.cache is not None and Path(options.cache).is_file() and not options.recalibrate
    if not reuse and options.data is None:
        raise OptionError("data_spec", "is required (or {cache_path} naming an existing calibration cache to reuse)",
                          concept="the calibration data", others={"cache_path": "a cache path"})
    started = time.perf_counter()
    cal = Calibrator(model, options.data, batch_size=options.data.batch_size if options.data else 32,
                     histograms=HistogramOptions(num_bins=options.num_bins), progress=options.progress,
                     memory_budget_mb=options.memory_budget_mb)
    stats = None
    if reuse and options.cache is not None:
        ranges = cal.load_cache(options.cache)
    else:
        stats = cal.collect()
        ranges = stats.compute(options.method, percentile=options.percentile)
    seconds = time.perf_counter() - started
    algorithm = options.cache_algorithm or H.METHODS[options.method].cache_algorithm
    texts: list[tuple[str, str]] = []
    if options.cache is not None and not reuse:
        texts.append((options.cache, format_cache(ranges.scales(), options.trt_version, algorithm)))
    if options.ranges is not None:
        texts.append((options.ranges, json.dumps(ranges.to_dict(stats), indent=2) + "\n"))
    if options.dynamic_range is not None:
        texts.append((options.dynamic_range, format_dynamic_range(ranges)))
    for path, text in texts:
        atomic_write_text(path, text)
    return CalibrateResult(ranges, stats, options.cache if reuse else None, [p for p, _ in texts], seconds)


# each output of CalibrateOptions.outputs(): its setting (the calibrate command's parameter) and concept
_OUTPUTS = {"cache": ("cache_path", "the calibration cache"), "ranges": ("ranges_path", "the ranges file"),
            "dynamic_range": ("dynamic_range_path", "the dynamic-range file")}


def _check_outputs(outputs: Mapping[str, str], inputs: Mapping[str, Any]) -> None:
    seen: dict[Path, str] = {}
    sources = {Path(str(v)).resolve(): k for k, v in inputs.items() if isinstance(v, (str, Path)) and Path(str(v)).exists()}
    concepts = dict(_OUTPUTS.values())
    for param, value in outputs.items():
        p = Path(value).resolve()
        setting, concept = _OUTPUTS[param]
        if p.is_dir():
            raise OptionError(setting, f"{value}: is a directory", concept=concept)
        if p in seen:
            raise OptionError(setting, f"and {{{seen[p]}}} name the same file {value}", concept=concept, others=concepts)
        if p in sources:
            raise OptionError(setting, f"{value}: is the {sources[p]} being calibrated; it would be overwritten",
                              concept=concept)
        seen[p] = setting
