"""Calibrate, quantize and evaluate in one loop: ``--method auto`` and ``--accuracy-target``.

The flow of ``trtrepo quantize`` and of deploy's INT8 step; the Q/DQ placement algorithm it calls
is :mod:`trtrepo.qdq` (docs/architecture.md, "Names").

:func:`quantize_request` runs a :class:`QuantizeRequest`, the Python twin of ``trtrepo quantize``
(:func:`run_quantize` is its keyword form):

1. ranges come from a ranges JSON, a TensorRT cache, or one calibration pass over ``data``
   (:class:`trtrepo.calibrate.Calibrator`; its statistics serve every method and carry the
   signed min/max the onnxruntime target needs);
2. with ``method="auto"`` the model is quantized with each of entropy, minmax, percentile and
   mse and each is evaluated against FP32 on a held-out split that calibration never saw (a
   deterministic ``holdout`` fraction of ``data``, or ``eval_data``); the best by accuracy
   (labels, else top-1 agreement), then cosine, wins;
3. with an :class:`~trtrepo.evaluate.AccuracyTarget` the quantized layers are ranked by
   sensitivity (one layer's Q/DQ removed at a time) and the most sensitive are left in float,
   one more per step, until the target holds. A target that FP32 itself misses, or that only
   holds with every layer in float, is an error and nothing is written.
"""

from __future__ import annotations

from .fallback import FallbackResult, FallbackStep, check_reachable, fallback, layer_blocks, layer_roles
from .gate import EXPECTED_DROP_RULE, AccuracyCheck, AccuracyLoss
from .ranges import AUTO_MIN_SAMPLES, CACHE_BYTES, DEFAULT_HOLDOUT, activation_ranges, calibration_tensors, split_holdout
from .report import HeldOutCheck, QuantizeReport, QuantizeRunResult, SmoothQuantReport, report_markdown
from .run import QuantizeRequest, quantize_for_deploy, quantize_request, run_quantize
from .select import (
    AUTO_MIN_GROUPS,
    DEFAULT_ALPHA,
    MAX_TOP1_DROP_POINTS,
    MIN_COSINE,
    SMOOTHED_RANGE_RULE,
    WEIGHT_ROUNDING,
    Candidate,
    Evaluator,
    RoundingChoice,
    SmoothChoice,
    WeightRounding,
    choose_smoothing,
    choose_weight_rounding,
    select_method,
    smoothed_ranges,
)
from .settings import QuantizeSettings

__all__ = [
    "AUTO_MIN_GROUPS",
    "AUTO_MIN_SAMPLES",
    "AccuracyCheck",
    "AccuracyLoss",
    "CACHE_BYTES",
    "Candidate",
    "DEFAULT_ALPHA",
    "DEFAULT_HOLDOUT",
    "EXPECTED_DROP_RULE",
    "Evaluator",
    "FallbackResult",
    "FallbackStep",
    "HeldOutCheck",
    "MAX_TOP1_DROP_POINTS",
    "MIN_COSINE",
    "QuantizeReport",
    "QuantizeRequest",
    "QuantizeRunResult",
    "QuantizeSettings",
    "RoundingChoice",
    "WeightRounding",
    "SMOOTHED_RANGE_RULE",
    "SmoothQuantReport",
    "SmoothChoice",
    "WEIGHT_ROUNDING",
    "smoothed_ranges",
    "activation_ranges",
    "calibration_tensors",
    "check_reachable",
    "choose_smoothing",
    "choose_weight_rounding",
    "fallback",
    "layer_blocks",
    "layer_roles",
    "quantize_for_deploy",
    "quantize_request",
    "report_markdown",
    "run_quantize",
    "select_method",
    "split_holdout",
]
