"""Stage 3: TensorRT engine build (adapter), a package split by concern: ``env`` (what is installed),
``options``, ``trtexec``, ``routes`` (everything that touches ``tensorrt``), ``calib_feed`` (legacy
route), ``stage`` (``build_engine``), ``nms_plugin`` (a detector's NMS as TensorRT's EfficientNMS
plugin, an ONNX transform). TensorRT and cuda-python are imported lazily, only here.

Two INT8 routes:

* **strongly typed Q/DQ** (TensorRT 10 and 11): the Q/DQ model from ``trtrepo quantize`` is parsed into a
  strongly typed network (TensorRT 10: the ``STRONGLY_TYPED`` creation flag; TensorRT 11: strong typing is
  always on and ``create_network(0)`` is used, ``EXPLICIT_BATCH`` no longer exists). Precision comes from
  the Q/DQ nodes; no precision flags are set.
* **implicit INT8 with a calibrator** (TensorRT 8.6-10.x only, deprecated since 10.1): the FP32 model,
  ``BuilderFlag.INT8`` and an ``IInt8EntropyCalibrator2`` / ``IInt8MinMaxCalibrator`` fed from trtrepo's
  data sources through device buffers (cuda-python), or from a calibration cache written by
  ``trtrepo calibrate`` (then no data is needed). TensorRT 11 removed this route.

Everything that touches the ``tensorrt`` module is in the *route functions* below, which take the module
as their first argument: the API conformance tests run them against the real 10.13 and 11.4 bindings
(through a checking proxy) and the unit tests against a fake. Everything else (options, profile shapes,
metadata, the trtexec command line, plan compatibility) is plain Python and tested directly.
"""

from __future__ import annotations

from ..contracts.plan import read_plan_metadata  # the plan's metadata, owned by contracts.plan
from ..contracts.profile import ShapeRange  # owned by contracts.profile
from .calib_feed import (
    CalibrationFeed,
    calibration_batches,
    check_calibration_inputs,
)
from .env import (
    CUDA_INSTALL,
    INSTALL_HINT,
    TENSORRT_INSTALL,
    CudaRuntime,
    GPUStatus,
    TensorRTStatus,
    gpu_status,
    nv_tensorrt_version_int,
    tensorrt_major,
    tensorrt_status,
)
from .nms_plugin import (
    EFFICIENT_NMS,
    NMS_OUTPUTS,
    PLUGIN_INPUTS,
    PluginRef,
    add_efficient_nms,
    efficient_nms_attributes,
    efficient_nms_inputs,
    nms_model_config,
    plugin_requirements,
    write_efficient_nms,
)
from .options import (
    CALIBRATORS,
    ROUTE_IMPLICIT,
    ROUTE_IMPLICIT_FP16,
    ROUTE_QDQ,
    ROUTE_QDQ_FP16,
    BuildOptions,
    parse_size,
    profile_shapes,
)
from .routes import (
    EngineBuilder,
    EngineIO,
    TensorRTEngineBuilder,
    build_serialized,
    configure,
    create_network,
    enable_fp16_flag,
    enable_implicit_int8,
    inspect_engine,
    make_calibrator_class,
    make_logger,
    network_inputs,
    parse_onnx,
    register_plugins,
    save_timing_cache,
)
from .stage import (
    BuildResult,
    build_efficient_nms,
    build_engine,
    check_engine_io_types,
    convert_for_fp16,
    count_qdq_nodes,
    fp16_onnx_default,
    prepare_build,
    sha256_file,
    trtexec_equivalents,
    warn_if_incompatible,
)
from .trtexec import (
    legacy_on_11_message,
    trtexec_command,
)

__all__ = [
    "EFFICIENT_NMS",
    "NMS_OUTPUTS",
    "PLUGIN_INPUTS",
    "PluginRef",
    "add_efficient_nms",
    "efficient_nms_attributes",
    "efficient_nms_inputs",
    "nms_model_config",
    "plugin_requirements",
    "register_plugins",
    "write_efficient_nms",
    "ShapeRange",
    "read_plan_metadata",
    "BuildOptions",
    "BuildResult",
    "CALIBRATORS",
    "CUDA_INSTALL",
    "CalibrationFeed",
    "CudaRuntime",
    "EngineBuilder",
    "EngineIO",
    "GPUStatus",
    "INSTALL_HINT",
    "ROUTE_IMPLICIT",
    "ROUTE_IMPLICIT_FP16",
    "ROUTE_QDQ",
    "ROUTE_QDQ_FP16",
    "TENSORRT_INSTALL",
    "TensorRTEngineBuilder",
    "TensorRTStatus",
    "calibration_batches",
    "legacy_on_11_message",
    "build_efficient_nms",
    "build_engine",
    "build_serialized",
    "check_calibration_inputs",
    "check_engine_io_types",
    "configure",
    "convert_for_fp16",
    "count_qdq_nodes",
    "create_network",
    "enable_fp16_flag",
    "enable_implicit_int8",
    "fp16_onnx_default",
    "gpu_status",
    "inspect_engine",
    "make_calibrator_class",
    "make_logger",
    "network_inputs",
    "nv_tensorrt_version_int",
    "parse_onnx",
    "parse_size",
    "prepare_build",
    "profile_shapes",
    "save_timing_cache",
    "sha256_file",
    "tensorrt_major",
    "tensorrt_status",
    "trtexec_command",
    "trtexec_equivalents",
    "warn_if_incompatible",
]
