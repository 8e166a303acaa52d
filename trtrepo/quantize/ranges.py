"""Calibration ranges for quantize: the held-out split, the activation ranges of a method, and
the tensors calibration must observe for a placement."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..calibrate import select_tensors
from ..errors import OptionError
from ..onnxgraph import producer_map
from ..qdq import (
    WEIGHTED_OPS,
    ActivationRange,
    GraphView,
    QuantizeOptions,
    conv_silu_input,
    plan_qdq,
    prepare_model,
)

log = logging.getLogger(__name__)

DEFAULT_HOLDOUT = 0.2
AUTO_MIN_SAMPLES = 100  # quantize_for_deploy: below this, no held-out split (entropy)
CACHE_BYTES = 512 * 2**20  # held-out batches kept in memory up to this size


# --------------------------------------------------------------------------------------------
# Data splits and ranges


def split_holdout(source: Any, fraction: float = DEFAULT_HOLDOUT, seed: int = 0) -> tuple[Any, Any]:
    """Deterministic split into (calibration, held-out) parts; no sample is in both."""
    if not 0.0 < fraction < 1.0:
        raise OptionError("holdout", f"{fraction}: expected a fraction between 0 and 1", concept="the held-out fraction")
    n = len(source)
    k = int(round(n * fraction))
    if n < 2 or k < 1 or k >= n:
        raise OptionError("", f"{source.name}: {n} samples are too few to hold out {fraction:.0%} for evaluation; "
                          "give more data or {eval_data}", others={"eval_data": "evaluation data"})
    held = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    calib = np.setdiff1d(np.arange(n), held)
    return source.take(calib), source.take(held)


def activation_ranges(amax: Mapping[str, float], statistics: Any = None) -> dict[str, ActivationRange]:
    """``{tensor: ActivationRange}`` from amax plus the signed min/max of the calibration
    statistics (:class:`trtrepo.calibrate.Statistics`) where known."""
    out = {}
    for name, a in amax.items():
        lo = hi = None
        if statistics is not None and name in statistics:
            lo, hi = float(statistics[name].min), float(statistics[name].max)
        out[name] = ActivationRange(float(a), lo, hi)
    # Tensors with infinite values have no amax: pass them on as non-finite ranges so that
    # quantization keeps them (and the mask path behind them) in float.
    for name in getattr(statistics, "unbounded", ()):
        if name not in out:
            t = statistics[name]
            out[name] = ActivationRange(math.inf, float(t.min), float(t.max))
    return out


DETECTOR_RANGE_RULE = ("a detector: the method's range where a Conv, MatMul or Gemm produces the activation, "
                       "except a SiLU's input: [max(min, -6), top]; [min, top] elsewhere (SiLU, Concat, Add, pooling "
                       "outputs and the image), top = min(max, the 99.999th percentile of |x|)")
SILU_FLAT = -6.0  # SiLU(-6) = -0.015 and flat below: a SiLU input's range need not reach further down
DETECTOR_TOP_PERCENTILE = 99.999  # a detector's min/max ranges end here: see detector_ranges


def silu_inputs(model: Any) -> set[str]:
    """The convolution outputs read as ``x * Sigmoid(x)`` (how PyTorch exports SiLU), as the Q/DQ
    placement recognises them (:func:`trtrepo.qdq.conv_silu_input`)."""
    view = GraphView(model)
    return {x for x in (conv_silu_input(view, n) for n in model.graph.node) if x is not None}


def detector_ranges(model: Any, ranges: Mapping[str, ActivationRange], minmax: Mapping[str, ActivationRange],
                    top: Mapping[str, float] | None = None) -> dict[str, ActivationRange]:
    """A detector's activation ranges: a tensor that a weighted op (Conv, ConvTranspose, MatMul,
    Gemm) produces keeps the method's range; every other quantized activation (SiLU and other
    activation outputs, Concat, Add, pooling and resize outputs, the image) takes its min/max range.

    Decision (issue 43, measured on the trained YOLO11n, figures in docs/benchmarks.md): the
    methods that clip (percentile, MSE, entropy) cut the tails of the SiLU and Concat outputs, and
    in a detector the strongest responses are the objects. On 640 held-out crops (paired bootstrap
    over the crops) mAP50-95 against FP32 over the classes with at least 10 FP32 boxes rose by
    0.040 (95 % 0.020-0.061) on the onnxruntime target at the same speed, level with NNCF's
    published ignored-scope recipe (+0.006, -0.014..+0.031) at 2.8x its speed; over every class the
    figure is dominated by classes of 1-3 boxes (+0.014, -0.047..+0.092). The convolutions' own
    outputs keep the clipped range, except a SiLU's input (a convolution's pre-activation, in YOLO
    nearly every one): ``[max(min, SILU_FLAT), max]`` of the calibration data. The SiLU is flat below
    -6 and the identity above, so the grid is spent where the output changes and the objects' largest
    pre-activations are not clipped (entropy's symmetric clip cut model.0's [-51, 64] to [-37, 37]).
    On ONNX Runtime this input is a real rounding (QLinearConv emits uint8 before the SiLU; TensorRT
    fuses the two), and it is most of the INT8 model's loss: without it mAP50-95 read 0.930 against
    0.767. Measured re-quantized (docs/benchmarks.md, "Issue 43: the SiLU input's range"), on 1280
    held-out crops paired: the classes with >= 10 boxes +0.022 (95 % -0.001..+0.051), every class
    +0.029 (-0.027..+0.099), with FP32's borderline boxes ignored +0.030 (-0.012..+0.081), at the
    same speed; positive on both crop sets on the last two figures.
    Only where activations are uint8 over ``[lo, hi]`` (the onnxruntime target): with symmetric
    int8 (tensorrt) a SiLU output's range wastes the negative half of the grid, and there the same
    rule read +0.016 (-0.011..+0.041) on those classes and -0.043 (-0.139..+0.060) over every class.
    Classifiers and encoders keep the method's ranges everywhere: this was measured on detectors only.

    ``top`` (``{tensor: amax}``, the :data:`DETECTOR_TOP_PERCENTILE` percentile of ``|x|``): where
    given, these min/max ranges end at ``min(max, top)`` above (and ``max(min, -top)`` below). The
    maximum of a tensor grows with every further calibration image, a percentile settles: calibrated
    on 27 photographs instead of 12 (400 crops each time), the plain min/max ranges' file lost 0.05
    mAP50-95 against FP32 on the same held-out crops and its class-logit error rose from 0.84 to
    0.98 (RMS, logits); with the top at the 99.999th percentile (the top 1e-5 of values clipped;
    99.99 clipped object responses and lost) the two calibrations read 0.81 and 0.80 and the every-class figure
    rose on three calibration sets (docs/benchmarks.md, "Issue 43: a detector's ranges end at a
    percentile")."""
    producers = producer_map(model.graph.node)
    silu = silu_inputs(model)
    out = dict(ranges)
    minmax = {name: _topped(r, (top or {}).get(name)) for name, r in minmax.items()}
    for name in ranges:
        node = producers.get(name)
        seen = minmax.get(name)
        if (node is None or node.op_type not in WEIGHTED_OPS) and seen is not None:
            out[name] = seen
        elif name in silu and seen is not None and seen.lo is not None and seen.hi is not None \
                and math.isfinite(seen.lo) and math.isfinite(seen.hi):
            lo, hi = max(seen.lo, SILU_FLAT), seen.hi
            out[name] = ActivationRange(max(abs(lo), abs(hi)), lo, hi)
    return out


def _topped(seen: ActivationRange, top: float | None) -> ActivationRange:
    """``seen`` (a min/max range) ended at ``[-top, top]`` where ``top`` is finite and positive."""
    if top is None or not (math.isfinite(top) and top > 0) or seen.lo is None or seen.hi is None \
            or not (math.isfinite(seen.lo) and math.isfinite(seen.hi)):
        return seen
    lo, hi = max(seen.lo, -top), min(seen.hi, top)
    return ActivationRange(max(abs(lo), abs(hi)), lo, hi)


def calibration_tensors(model: Any, options: QuantizeOptions) -> list[str]:
    """What to calibrate: the float network inputs and every activation the target's placement
    quantizes (without exclusions, so the fallback never runs short). Not the other tensors of
    :func:`trtrepo.calibrate.select_tensors` (activation and pooling outputs that no Q/DQ reads):
    on MobileNetV2 that halves the tensors fetched and binned. ``trtrepo calibrate`` (a TensorRT
    cache for implicit INT8) still calibrates the full selection."""

    selected = select_tensors(model)
    graph_inputs = {i.name for i in model.graph.input}
    names = [t for t in selected if t in graph_inputs]
    no_excl = replace(options, exclude_ops=(), exclude_nodes=())  # every placement rule, no user exclusions
    for t in plan_qdq(prepare_model(model), no_excl).activation_tensors():
        if t not in names:
            names.append(t)
    return names
