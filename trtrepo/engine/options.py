"""``BuildOptions``: what ``trtrepo build`` takes besides the model (the batch profile is a
:class:`~trtrepo.contracts.profile.BatchProfile`), the two INT8 routes, sizes."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from ..contracts.profile import BatchProfile, ShapeRange
from ..errors import UsageError
from ..modelio import ModelIO

log = logging.getLogger(__name__)


ROUTE_QDQ = "strongly-typed-qdq"
ROUTE_IMPLICIT = "implicit-int8-calibrator"
# --fp16 (mixed INT8 + FP16), recorded as the precision route in model.plan.json:
# Q/DQ route: the unquantized part of the ONNX graph is converted to float16 (trtrepo.fp16) before the
# strongly typed build, on TensorRT 10 and 11 alike (11 has no FP16 flag; 10 forbids precision flags on
# strongly typed networks). Legacy calibrator route (TensorRT <= 10, weakly typed): BuilderFlag.FP16.
ROUTE_QDQ_FP16 = ROUTE_QDQ + "+fp16-onnx"
ROUTE_IMPLICIT_FP16 = ROUTE_IMPLICIT + "+fp16-flag"
CALIBRATORS = {"entropy": "EntropyCalibration2", "minmax": "MinMaxCalibration"}



# --------------------------------------------------------------------------------------------
# Options: sizes, shapes, profiles

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000**2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4,
}


def parse_size(text: str | int, what: str = "--workspace") -> int:
    """``4GiB``, ``512MiB``, ``4G`` (binary, as trtexec), ``1GB`` (decimal) or plain bytes."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise UsageError(f"{what} '{text}': expected a size like 4GiB, 512MiB, 4G or a number of bytes")
        value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if value <= 0:
        raise UsageError(f"{what} '{text}': must be positive")
    return value


@dataclass(frozen=True)
class BuildOptions:
    """What ``trtrepo build`` takes besides the model and the output path."""

    profile: BatchProfile = field(default_factory=BatchProfile)  # batch range and --shape ranges
    workspace: int | None = None
    opt_level: int = 3
    timing_cache: str | None = None
    legacy_calibrator: str | None = None
    calib_cache: str | None = None
    data: Any = field(default=None, compare=False)  # trtrepo.data.DataOptions for the legacy calibrator
    allow_fp32: bool = False
    fp16: bool = False  # mixed INT8 + FP16 (quantized layers INT8, the rest FP16, network IO FP32)
    keep_fp32_ops: tuple[str, ...] = ()  # --fp16 on the Q/DQ route: ONNX op types kept in float32
    fp16_onnx: str | None = None  # --fp16 on the Q/DQ route: keep the converted ONNX model here

    def __post_init__(self) -> None:
        if not 0 <= self.opt_level <= 5:
            raise UsageError(f"--opt-level must be 0..5, got {self.opt_level}")
        if self.workspace is not None and self.workspace <= 0:
            raise UsageError("--workspace must be positive")
        if self.legacy_calibrator is not None and self.legacy_calibrator not in CALIBRATORS:
            raise UsageError(f"--legacy-calibrator must be one of {', '.join(CALIBRATORS)}, got '{self.legacy_calibrator}'")
        if self.legacy_calibrator is None and (self.data is not None or self.calib_cache is not None):
            raise UsageError("--data and --cache are only used with --legacy-calibrator (the Q/DQ route needs no data)")
        if not self.fp16 and (self.keep_fp32_ops or self.fp16_onnx):
            raise UsageError("--keep-fp32 and --fp16-onnx only apply with --fp16")
        if self.legacy_calibrator is not None and (self.keep_fp32_ops or self.fp16_onnx):
            raise UsageError("--keep-fp32 and --fp16-onnx belong to the Q/DQ route (the ONNX model is converted to FP16); "
                             "with --legacy-calibrator, --fp16 sets TensorRT's FP16 builder flag instead")

    @property
    def route(self) -> str:
        return ROUTE_IMPLICIT if self.legacy_calibrator else ROUTE_QDQ

    @property
    def precision_route(self) -> str:
        """The route with how FP16 is reached under --fp16 (what model.plan.json records)."""
        if not self.fp16:
            return self.route
        return ROUTE_IMPLICIT_FP16 if self.legacy_calibrator else ROUTE_QDQ_FP16

    @property
    def precision(self) -> str:
        return "int8+fp16" if self.fp16 else "int8"

    # the profile's facts, read-only (BatchProfile owns them)
    @property
    def shapes(self) -> tuple[tuple[str, ShapeRange], ...]:
        return self.profile.shapes

    @property
    def batch_range(self) -> tuple[int, int, int]:
        return self.profile.batch_range

    @property
    def min_batch(self) -> int:
        return self.profile.min_batch

    @property
    def opt_batch(self) -> int:
        return self.profile.opt_batch

    @property
    def max_batch(self) -> int:
        return self.profile.max_batch


def profile_shapes(io: ModelIO, options: BuildOptions) -> dict[str, ShapeRange]:
    """The optimization profile of ``options``' :class:`~trtrepo.contracts.profile.BatchProfile`
    (see :meth:`~trtrepo.contracts.profile.BatchProfile.resolve`)."""
    return options.profile.resolve(io)


