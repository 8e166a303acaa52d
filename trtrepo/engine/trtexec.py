"""The trtexec command line equivalent to a build, per TensorRT major."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from ..contracts.profile import ShapeRange, dims_str
from ..errors import OptionError
from .options import ROUTE_IMPLICIT, ROUTE_QDQ, SETTINGS, BuildOptions

log = logging.getLogger(__name__)


def trtexec_command(onnx: str | Path, plan: str | Path, profile: Mapping[str, ShapeRange], options: BuildOptions,
                    major: int) -> list[str]:
    """The ``trtexec`` command that builds the same engine (as an argument list; ``shlex.join`` it).

    10.x: ``--stronglyTyped`` for the Q/DQ route, ``--int8 --calib=CACHE`` for the calibrator route
    (trtexec only *reads* a cache; it cannot calibrate from data). 11.x has no ``--int8``, ``--calib``
    or ``--stronglyTyped`` (strong typing is always on).

    ``--fp16``: on the Q/DQ route ``onnx`` must be the model converted to FP16 (trtrepo.fp16) and no
    precision flag is added (a strongly typed network takes its precisions from the graph's types, not
    from flags; 11.x has no ``--fp16``); on
    the calibrator route (10.x) ``--fp16`` is added beside ``--int8``."""
    if options.route == ROUTE_IMPLICIT and major >= 11:
        raise OptionError("", legacy_on_11_message(f"{major}.x"), others=SETTINGS)
    cmd = ["trtexec", f"--onnx={onnx}", f"--saveEngine={plan}"]
    if profile:
        for flag, attr in (("--minShapes", "min"), ("--optShapes", "opt"), ("--maxShapes", "max")):
            cmd.append(flag + "=" + ",".join(f"{name}:{dims_str(getattr(r, attr))}" for name, r in profile.items()))
    if options.route == ROUTE_QDQ:
        if major < 11:
            cmd.append("--stronglyTyped")
    else:
        cmd.append("--int8")
        if options.fp16:
            cmd.append("--fp16")
        if options.calib_cache:
            cmd.append(f"--calib={options.calib_cache}")
    if options.workspace:
        mib = max(1, options.workspace >> 20)
        cmd.append(f"--memPoolSize=workspace:{mib}M")
    cmd.append(f"--builderOptimizationLevel={options.opt_level}")
    if options.timing_cache:
        cmd.append(f"--timingCacheFile={options.timing_cache}")
    return cmd


def legacy_on_11_message(version: str) -> str:
    """The detail of an :class:`~trtrepo.errors.OptionError` (its ``others``: :data:`SETTINGS`)."""
    return (f"{{legacy_calibrator}} needs TensorRT 8.6-10.x: TensorRT {version} removed implicit INT8 calibration "
            "(IInt8*Calibrator, BuilderFlag.INT8). Use the Q/DQ route instead: 'trtrepo quantize' the model and "
            "'trtrepo build MODEL.qdq.onnx' without {legacy_calibrator}")


