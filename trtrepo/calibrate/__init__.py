"""Calibration: streamed activation statistics with ONNX Runtime, then INT8 ranges.

Stable API (the CLI ``trtrepo calibrate`` and the quantize/deploy stages use exactly this)::

    from trtrepo.calibrate import Calibrator, HistogramOptions, Statistics, Ranges, select_tensors

    cal = Calibrator("model.onnx", "demo:calib", batch_size=32, histograms=HistogramOptions(num_bins=2048), progress=True,
                     memory_budget_mb=512)        # bound on fetched activations (None: whole batches)
    stats = cal.collect()                         # Statistics: one collection serves every method
    ranges = stats.compute("entropy")             # Ranges: Mapping[tensor name, amax]
    ranges = stats.compute("percentile", percentile=99.99)
    ranges.scales()                               # {name: amax / 127}
    ranges.save_json("ranges.json", stats)        # tensor -> amax, scale, method, histogram summary
    Ranges.load_json("ranges.json")
    ranges.write_cache("model.cache", trt_version="10.13.0")   # TensorRT calibration cache
    Ranges.from_cache("model.cache")              # amax = float32(scale) * 127
    cal.compute("mse")                            # collect() on first use, then compute

``data`` is anything :func:`trtrepo.data.open_data` accepts (a spec string or a
:class:`~trtrepo.data.DataSource`); ``preprocess``/``labels``/``limit``/``seed`` are passed on.

The modules, top to bottom (the layers contract in ``pyproject.toml``):

- ``stage``: :func:`run_calibrate`, what ``trtrepo calibrate`` runs;
- ``calibrator``: :class:`Calibrator`, the sessions and the two streamed passes;
- ``statistics``: :class:`Statistics` and :class:`Ranges`, and their files;
  ``budget``: the memory budget's micro-batches and tensor groups (pure functions);
  ``tensors``: which tensors are calibrated (:func:`select_tensors`);
- ``weights``: the model read and handed to ONNX Runtime without its weights in memory.

``onnx``, ``onnxruntime`` and ``tqdm`` are imported inside the functions that use them: reading or
writing ranges, statistics and caches (``trtrepo quantize --ranges``, ``trtrepo calibrate --cache``
reused) loads none of them.
"""

from __future__ import annotations

from .budget import DEFAULT_MEMORY_BUDGET_MB, Signature
from .calibrator import DEFAULT_HISTOGRAM_SAMPLE, MAX_NUM_BINS, MIN_NUM_BINS, Calibrator, HistogramOptions
from .stage import CalibrateOptions, CalibrateResult, run_calibrate
from .statistics import Ranges, Statistics, TensorStatistics
from .tensors import ACTIVATION_OPS, CALIBRATED_OPS, COMPUTE_OPS, POOL_OPS, inferred_types, select_tensors, tensor_names

__all__ = [
    "ACTIVATION_OPS",
    "CALIBRATED_OPS",
    "COMPUTE_OPS",
    "DEFAULT_HISTOGRAM_SAMPLE",
    "DEFAULT_MEMORY_BUDGET_MB",
    "MAX_NUM_BINS",
    "MIN_NUM_BINS",
    "POOL_OPS",
    "CalibrateOptions",
    "CalibrateResult",
    "Calibrator",
    "HistogramOptions",
    "Ranges",
    "Signature",
    "Statistics",
    "TensorStatistics",
    "inferred_types",
    "run_calibrate",
    "select_tensors",
    "tensor_names",
]
