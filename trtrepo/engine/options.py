"""``BuildOptions``: what ``trtrepo build`` takes besides the model (the batch profile is a
:class:`~trtrepo.contracts.profile.BatchProfile`), the two INT8 routes, sizes."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from ..contracts.profile import BatchProfile, ShapeRange
from ..errors import OptionError
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
# How build's errors name its settings (OptionError placeholders; the command line shows build's flags).
SETTINGS = {"legacy_calibrator": "the legacy calibrator", "calib_cache": "the calibration cache",
            "data_spec": "the calibration data", "keep_fp32": "the op types kept in FP32",
            "fp16_onnx": "the FP16 ONNX copy", "fp16": "fp16=True", "allow_fp32": "allow_fp32=True",
            "opt_batch": "the opt batch", "force": "force=True"}



# --------------------------------------------------------------------------------------------
# Options: sizes, shapes, profiles

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 1000,
    "m": 1 << 20, "mib": 1 << 20, "mb": 1000**2,
    "g": 1 << 30, "gib": 1 << 30, "gb": 1000**3,
    "t": 1 << 40, "tib": 1 << 40, "tb": 1000**4,
}


def parse_size(text: str | int, setting: str = "workspace", concept: str = "the workspace size") -> int:
    """``4GiB``, ``512MiB``, ``4G`` (binary, as trtexec), ``1GB`` (decimal) or plain bytes; errors
    name ``setting`` (:class:`~trtrepo.errors.OptionError`)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise OptionError(setting, f"'{text}': expected a size like 4GiB, 512MiB, 4G or a number of bytes", concept=concept)
        value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if value <= 0:
        raise OptionError(setting, f"'{text}': must be positive", concept=concept)
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
            raise OptionError("opt_level", f"must be 0..5, got {self.opt_level}", concept="the optimization level")
        if self.workspace is not None and self.workspace <= 0:
            raise OptionError("workspace", "must be positive", concept="the workspace size")
        if self.legacy_calibrator is not None and self.legacy_calibrator not in CALIBRATORS:
            raise OptionError("legacy_calibrator", f"must be one of {', '.join(CALIBRATORS)}, got '{self.legacy_calibrator}'",
                              others=SETTINGS)
        if self.legacy_calibrator is None and (self.data is not None or self.calib_cache is not None):
            raise OptionError("data_spec", "and {calib_cache} are only used with {legacy_calibrator} (the Q/DQ route needs "
                              "no data)", others=SETTINGS)
        if not self.fp16 and (self.keep_fp32_ops or self.fp16_onnx):
            raise OptionError("keep_fp32", "and {fp16_onnx} only apply with {fp16}", others=SETTINGS)
        if self.legacy_calibrator is not None and (self.keep_fp32_ops or self.fp16_onnx):
            raise OptionError("keep_fp32", "and {fp16_onnx} belong to the Q/DQ route (the ONNX model is converted to FP16); "
                              "with {legacy_calibrator}, {fp16} sets TensorRT's FP16 builder flag instead", others=SETTINGS)

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


