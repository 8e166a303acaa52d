"""Stage 3: TensorRT engine build (adapter). TensorRT and cuda-python are imported lazily, only here.

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

import contextlib
import hashlib
import importlib.util
import logging
import re
import shlex
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from . import cache as cache_codec
from .contracts.plan import (
    GPUInfo,
    IOTensor,
    PlanMetadata,
    check_plan_compatibility,
    plan_metadata_path,
    read_plan_metadata,
)
from .contracts.profile import BatchProfile, ShapeRange, dims_str
from .errors import MissingDependencyError, TrtrepoError, UsageError
from .fsutil import atomic_path, atomic_write_bytes
from .modelio import ModelIO, TensorSpec

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'trtrepo[tensorrt]' (tensorrt, cuda-python) on a machine with an NVIDIA GPU"
TENSORRT_INSTALL = "pip install tensorrt  (or 'trtrepo[tensorrt]'; needs an NVIDIA driver and a GPU)"
CUDA_INSTALL = "pip install cuda-python  (the major version matching your CUDA driver, e.g. cuda-python==12.*)"

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
# What is installed


@dataclass(frozen=True)
class TensorRTStatus:
    available: bool
    version: str | None
    detail: str


def tensorrt_status() -> TensorRTStatus:
    """Whether the TensorRT Python package imports here, and its version. Never raises."""
    if importlib.util.find_spec("tensorrt") is None:
        return TensorRTStatus(False, None, f"not installed ({INSTALL_HINT})")
    try:
        import tensorrt as trt
    except Exception as exc:
        return TensorRTStatus(False, None, f"installed but fails to import: {type(exc).__name__}: {exc}")
    version = getattr(trt, "__version__", "unknown")
    return TensorRTStatus(True, version, f"{version}")


@dataclass(frozen=True)
class GPUStatus:
    available: bool
    gpu: GPUInfo | None
    detail: str


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _import_cudart() -> Any:
    """cuda-python's runtime module: ``cuda.bindings.runtime`` (12.6+/13) or the older ``cuda.cudart``."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # type: ignore[no-redef]
        except ImportError as exc:
            raise MissingDependencyError("cuda-python", "to use the GPU (device buffers, GPU properties)", CUDA_INSTALL) from exc
    return cudart


class CudaRuntime:
    """The few CUDA runtime calls trtrepo needs, over cuda-python's ``cudart`` (every call returns
    ``(err, *values)``). Errors become :class:`TrtrepoError` naming the call."""

    def __init__(self, cudart: Any) -> None:
        self.rt = cudart
        self.allocated: set[int] = set()

    @classmethod
    def load(cls) -> CudaRuntime:
        return cls(_import_cudart())

    def _check(self, result: Any, what: str) -> Any:
        if isinstance(result, tuple):
            err, rest = result[0], result[1:]
        else:
            err, rest = result, ()
        if err != self.rt.cudaError_t.cudaSuccess:
            raise TrtrepoError(f"CUDA {what} failed: {getattr(err, 'name', err)}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def device_count(self) -> int:
        return int(self._check(self.rt.cudaGetDeviceCount(), "cudaGetDeviceCount"))

    def device_info(self, index: int = 0) -> GPUInfo:
        prop = self._check(self.rt.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
        name = prop.name
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        driver = self._check(self.rt.cudaDriverGetVersion(), "cudaDriverGetVersion")
        runtime = self._check(self.rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
        return GPUInfo(
            name=str(name).strip(),
            compute_capability=f"{int(prop.major)}.{int(prop.minor)}",
            driver_version=_cuda_version(int(driver)),
            cuda_runtime_version=_cuda_version(int(runtime)),
            index=index,
        )

    def malloc(self, nbytes: int) -> int:
        ptr = int(self._check(self.rt.cudaMalloc(int(nbytes)), f"cudaMalloc({nbytes})"))
        self.allocated.add(ptr)
        return ptr

    def free(self, ptr: int) -> None:
        self.allocated.discard(int(ptr))
        self._check(self.rt.cudaFree(int(ptr)), "cudaFree")

    def memcpy_htod(self, ptr: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpy(int(ptr), array.ctypes.data, array.nbytes, kind), "cudaMemcpy (host to device)")


def gpu_status(cuda: CudaRuntime | None = None) -> GPUStatus:
    """Whether cuda-python imports and sees a GPU, with its name and compute capability. Never raises."""
    try:
        cuda = cuda or CudaRuntime.load()
    except MissingDependencyError:
        return GPUStatus(False, None, f"cuda-python not installed ({CUDA_INSTALL})")
    except Exception as exc:
        return GPUStatus(False, None, f"cuda-python fails to import: {type(exc).__name__}: {exc}")
    try:
        count = cuda.device_count()
    except Exception as exc:
        return GPUStatus(False, None, f"no usable NVIDIA GPU/driver ({exc})")
    if count < 1:
        return GPUStatus(False, None, "no NVIDIA GPU visible (cudaGetDeviceCount returned 0)")
    try:
        info = cuda.device_info(0)
    except Exception as exc:
        return GPUStatus(False, None, f"cannot read GPU 0's properties ({exc})")
    return GPUStatus(True, info, f"{count} GPU(s); GPU 0: {info.name}, compute capability {info.compute_capability}, "
                                 f"driver CUDA {info.driver_version}, runtime {info.cuda_runtime_version}")


def tensorrt_major(version: str) -> int:
    m = re.match(r"\s*(\d+)", version or "")
    if not m:
        raise UsageError(f"cannot read TensorRT's major version from '{version}'")
    return int(m.group(1))


def nv_tensorrt_version_int(version: str) -> int:
    """``NV_TENSORRT_VERSION`` as in a calibration cache header: 10.3.0 -> 100300, 8.6.1 -> 8601
    (:func:`trtrepo.cache.trt_version_int` on the first three numbers of ``version``)."""
    return cache_codec.trt_version_int(".".join((re.findall(r"\d+", version) + ["0", "0", "0"])[:3]))


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
        raise UsageError(_legacy_on_11_message(f"{major}.x"))
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


def _legacy_on_11_message(version: str) -> str:
    return (f"--legacy-calibrator needs TensorRT 8.6-10.x: TensorRT {version} removed implicit INT8 calibration "
            "(IInt8*Calibrator, BuilderFlag.INT8). Use the Q/DQ route instead: 'trtrepo quantize' the model and "
            "'trtrepo build MODEL.qdq.onnx' without --legacy-calibrator")


# --------------------------------------------------------------------------------------------
# IO read back from the engine

# TensorRT DataType member name -> numpy dtype name.
_TRT_TO_NUMPY = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
}


@dataclass(frozen=True)
class EngineIO:
    """IO tensors and the profile-0 shape ranges of a built engine."""

    tensors: tuple[IOTensor, ...]
    profile: Mapping[str, ShapeRange]
    num_profiles: int = 1

    def to_model_io(self, onnx_io: ModelIO | None = None, source: str = "") -> ModelIO:
        """The :class:`ModelIO` the Triton config renderer takes. Symbolic dim names come from the ONNX
        description where the names match; the batch axis is 0 when every tensor's axis 0 is dynamic."""
        batched = all(t.shape and t.shape[0] == -1 for t in self.tensors)

        def names_for(t: IOTensor) -> tuple[str | None, ...]:
            if onnx_io is None:
                return ()
            for spec in (*onnx_io.inputs, *onnx_io.outputs):
                if spec.name == t.name and spec.rank == len(t.shape) and spec.dim_names:
                    return spec.dim_names
            return ()

        def spec(t: IOTensor) -> TensorSpec:
            return TensorSpec(t.name, t.dtype, t.shape, 0 if batched else None, names_for(t))

        return ModelIO(
            inputs=tuple(spec(t) for t in self.tensors if t.mode == "INPUT"),
            outputs=tuple(spec(t) for t in self.tensors if t.mode == "OUTPUT"),
            source=source,
        )


# --------------------------------------------------------------------------------------------
# Route functions: the only code that touches the tensorrt module. ``trt`` is the module.


def make_logger(trt: Any, min_level: int = logging.WARNING) -> Any:
    """A TensorRT logger that forwards to Python logging and keeps the last errors for messages."""

    base = trt.ILogger
    levels = {"INTERNAL_ERROR": logging.CRITICAL, "ERROR": logging.ERROR, "WARNING": logging.WARNING,
              "INFO": logging.INFO, "VERBOSE": logging.DEBUG}

    class TrtrepoLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            level = levels.get(getattr(severity, "name", str(severity)), logging.INFO)
            if level >= logging.ERROR:
                self.errors.append(str(msg).strip())
            if level >= min_level:
                log.log(level, "TensorRT: %s", msg)

    return TrtrepoLogger()


def create_network(trt: Any, builder: Any, route: str, major: int) -> Any:
    """TensorRT 10: STRONGLY_TYPED for Q/DQ. TensorRT 11: flags 0 (always strongly typed, no EXPLICIT_BATCH).
    Implicit route: 0 on 10.x (explicit batch is implied), EXPLICIT_BATCH on 8.6/9.x."""
    if route == ROUTE_QDQ:
        if major >= 11:
            flags = 0
        else:
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    else:
        flags = 0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    return builder.create_network(flags)


def parse_onnx(trt: Any, network: Any, logger: Any, onnx_path: Path, major: int) -> Any:
    """Parse into ``network``; every parser error goes into one message. Returns the parser (keep it alive
    while the network is used: it owns the weights)."""
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(onnx_path))
    errors = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        where = f"node {err.node()}"
        if major >= 10:
            name, op = err.node_name(), err.node_operator()
            if name or op:
                where += f" ({name or '?'}: {op or '?'})"
        errors.append(f"{where}: {err.desc()} [{err.code().name}]")
    if not ok or errors:
        for e in errors:
            log.error("ONNX parser: %s", e)
        detail = "; ".join(errors) if errors else "no error reported"
        raise TrtrepoError(f"{onnx_path}: TensorRT's ONNX parser failed with {len(errors)} error(s): {detail}")
    return parser


def network_inputs(trt: Any, network: Any) -> dict[str, tuple[int, ...]]:
    result = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        result[tensor.name] = tuple(int(d) for d in tensor.shape)
    return result


def configure(trt: Any, builder: Any, config: Any, profile: Mapping[str, ShapeRange], options: BuildOptions,
              timing_cache: bytes | None) -> Any:
    """Memory pool, optimization level, timing cache and the optimization profile. Returns the profile."""
    if options.workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(options.workspace))
    config.builder_optimization_level = int(options.opt_level)
    cache = config.create_timing_cache(timing_cache or b"")
    if not config.set_timing_cache(cache, False):
        log.warning("timing cache %s does not match this TensorRT/GPU; starting an empty one", options.timing_cache)
        config.set_timing_cache(config.create_timing_cache(b""), False)
    if not profile:
        return None
    opt_profile = builder.create_optimization_profile()
    for name, r in profile.items():
        opt_profile.set_shape(name, r.min, r.opt, r.max)
    if config.add_optimization_profile(opt_profile) < 0:
        raise TrtrepoError("TensorRT rejected the optimization profile: " + "; ".join(f"{n}:{r.describe()}" for n, r in profile.items()))
    return opt_profile


def enable_implicit_int8(trt: Any, config: Any, opt_profile: Any, calibrator: Any) -> None:
    """TensorRT <= 10 only: BuilderFlag.INT8, the calibrator, and the profile whose OPT shapes calibrate."""
    config.set_flag(trt.BuilderFlag.INT8)
    config.int8_calibrator = calibrator
    if opt_profile is not None and not config.set_calibration_profile(opt_profile):
        raise TrtrepoError("TensorRT rejected the calibration profile")


def enable_fp16_flag(trt: Any, config: Any) -> None:
    """--fp16 on the legacy calibrator route (TensorRT <= 10, weakly typed network): let TensorRT pick FP16
    kernels where INT8 does not apply. Never on a strongly typed network (precision comes from its types)."""
    config.set_flag(trt.BuilderFlag.FP16)


def make_calibrator_class(trt: Any, method: str) -> type:
    """The calibrator class (defined here: its TensorRT base class exists only after the import)."""
    base = trt.IInt8EntropyCalibrator2 if method == "entropy" else trt.IInt8MinMaxCalibrator

    class TrtrepoCalibrator(base):  # type: ignore[misc, valid-type]
        """Feeds TensorRT batch by batch from a :class:`CalibrationFeed`; exceptions are kept (TensorRT
        calls these methods from C++) and re-raised after the build."""

        def __init__(self, feed: CalibrationFeed) -> None:
            base.__init__(self)
            self.feed = feed

        def get_batch_size(self) -> int:
            return self.feed.batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            return self.feed.next_pointers(names)

        def read_calibration_cache(self) -> bytes | None:
            return self.feed.read_cache()

        def write_calibration_cache(self, cache: Any) -> None:
            self.feed.write_cache(bytes(cache))

    TrtrepoCalibrator.__name__ = f"Trtrepo{'Entropy' if method == 'entropy' else 'MinMax'}Calibrator"
    return TrtrepoCalibrator


def build_serialized(trt: Any, builder: Any, network: Any, config: Any, logger: Any) -> bytes:
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        errors = getattr(logger, "errors", [])
        raise TrtrepoError("TensorRT failed to build the engine: " + ("; ".join(errors[-5:]) if errors else "no error logged"))
    return bytes(serialized)


def save_timing_cache(trt: Any, config: Any) -> bytes:
    return bytes(config.get_timing_cache().serialize())


def inspect_engine(trt: Any, logger: Any, plan: bytes) -> EngineIO:
    """IO tensors and profile-0 ranges, read back from the deserialized engine."""
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise TrtrepoError("TensorRT could not deserialize the plan it just built")
    tensors = []
    ranges: dict[str, ShapeRange] = {}
    num_profiles = int(engine.num_optimization_profiles)
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = engine.get_tensor_mode(name).name
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        trt_dtype = engine.get_tensor_dtype(name).name
        if trt_dtype not in _TRT_TO_NUMPY:
            raise TrtrepoError(f"engine tensor '{name}' has type {trt_dtype}, which Triton cannot exchange")
        tensors.append(IOTensor(name, _TRT_TO_NUMPY[trt_dtype], shape, mode, trt_dtype))
        if mode == "INPUT" and -1 in shape and num_profiles > 0:
            lo, opt, hi = engine.get_tensor_profile_shape(name, 0)
            ranges[name] = ShapeRange(tuple(lo), tuple(opt), tuple(hi))
    return EngineIO(tuple(tensors), ranges, num_profiles)


# --------------------------------------------------------------------------------------------
# Calibration feed (legacy route): host batches -> device buffers; the calibration cache


class CalibrationFeed:
    """What the calibrator hands TensorRT: batches of exactly the calibration shape copied into device
    buffers (one per input, reused, freed by :meth:`close`), and the cache as bytes.

    ``batches`` may be None when the cache holds everything (a cache from ``trtrepo calibrate``). A cache
    whose header names another TensorRT version but the same algorithm is handed over with the running
    version in its header (trtrepo's scales do not depend on the TensorRT version; TensorRT would
    otherwise ignore it)."""

    def __init__(self, batches: Iterable[Mapping[str, np.ndarray]] | None, batch_size: int, cuda: CudaRuntime,
                 shapes: Mapping[str, tuple[int, ...]], method: str, tensorrt_version: str,
                 cache_path: str | Path | None = None) -> None:
        self._batches: Iterator[Mapping[str, np.ndarray]] | None = iter(batches) if batches is not None else None
        self.batch_size = batch_size
        self.cuda = cuda
        self.shapes = dict(shapes)
        self.method = method
        self.tensorrt_version = tensorrt_version
        self.cache_path = Path(cache_path) if cache_path else None
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, nbytes)
        self.batches_served = 0
        self.error: BaseException | None = None
        self.cache_used = False
        self.cache_written = False

    def next_pointers(self, names: Sequence[str]) -> list[int] | None:
        if self.error is not None or self._batches is None:
            return None
        try:
            batch = next(self._batches, None)
            if batch is None:
                return None
            pointers = []
            for name in names:
                if name not in batch:
                    raise UsageError(f"calibration data has no input '{name}' (has: {', '.join(batch)})")
                array = np.ascontiguousarray(batch[name])
                want = self.shapes.get(name)
                if want is not None and tuple(array.shape) != tuple(want):
                    raise UsageError(f"calibration batch {self.batches_served}: input '{name}' has shape {list(array.shape)}, "
                                     f"TensorRT calibrates with the profile's opt shape {list(want)}")
                ptr, size = self.buffers.get(name, (0, 0))
                if size < array.nbytes:
                    if ptr:
                        self.cuda.free(ptr)
                        del self.buffers[name]
                    ptr, size = self.cuda.malloc(array.nbytes), array.nbytes
                    self.buffers[name] = (ptr, size)
                self.cuda.memcpy_htod(ptr, array)
                pointers.append(int(ptr))
            self.batches_served += 1
            return pointers
        except BaseException as exc:  # TensorRT calls this from C++: keep the error, stop calibration
            self.error = exc
            return None

    def read_cache(self) -> bytes | None:
        if self.cache_path is None or not self.cache_path.is_file() or self.cache_path.stat().st_size == 0:
            return None
        data = self.cache_path.read_bytes()
        header = cache_codec.header_of(data)
        want_algo = CALIBRATORS[self.method]
        if header is None:
            log.warning("%s: not a TensorRT calibration cache (no TRT-<version>-<algorithm> header); ignored", self.cache_path)
            return None
        if header.algorithm != want_algo:
            log.warning("%s: cache was made for %s, not %s; TensorRT will calibrate from data", self.cache_path,
                        header.algorithm, want_algo)
            return None
        running = nv_tensorrt_version_int(self.tensorrt_version)
        if header.version != running:
            log.info("%s: cache header version %d rewritten to the running TensorRT's %d", self.cache_path, header.version,
                     running)
            data = cache_codec.with_header(data, cache_codec.CacheHeader(running, header.algorithm))
        self.cache_used = True
        return data

    def write_cache(self, data: bytes) -> None:
        if self.cache_path is None or self.batches_served == 0:
            return  # nothing new: the cache came from the file, which stays as it is
        try:
            atomic_write_bytes(self.cache_path, data)
            self.cache_written = True
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        for ptr, _ in self.buffers.values():
            self.cuda.free(ptr)
        self.buffers.clear()

    def __enter__(self) -> CalibrationFeed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_calibration_inputs(options: BuildOptions, tensorrt_version: str) -> None:
    """Before any work: the legacy route needs TensorRT <= 10 and either data or a usable cache."""
    if options.legacy_calibrator is None:
        return
    if tensorrt_major(tensorrt_version) >= 11:
        raise UsageError(_legacy_on_11_message(tensorrt_version))
    if options.data is not None:
        return
    if not options.calib_cache:
        raise UsageError("--legacy-calibrator needs --data (calibration samples) or --cache (a calibration cache)")
    path = Path(options.calib_cache)
    if not path.is_file():
        raise UsageError(f"{path}: calibration cache not found, and no --data to calibrate from")
    header = cache_codec.header_of(path.read_bytes())
    if header is None:
        raise UsageError(f"{path}: not a TensorRT calibration cache (first line must be TRT-<version>-<algorithm>)")
    want = CALIBRATORS[options.legacy_calibrator]
    if header.algorithm != want:
        raise UsageError(f"{path}: cache holds {header.algorithm} ranges but --legacy-calibrator {options.legacy_calibrator} "
                         f"needs {want}; TensorRT would ignore it and there is no --data to calibrate from")


# --------------------------------------------------------------------------------------------
# The adapter


class EngineBuilder(Protocol):
    """What :func:`build_engine` needs from TensorRT. :class:`TensorRTEngineBuilder` is the real one."""

    @property
    def tensorrt_version(self) -> str: ...

    def gpu(self) -> GPUInfo: ...

    def build(self, onnx_path: Path, profile: Mapping[str, ShapeRange], options: BuildOptions,
              calibration: CalibrationFeed | None, timing_cache: bytes | None) -> tuple[bytes, bytes | None]:
        """Serialized plan, and the timing cache to save (or None)."""
        ...

    def inspect(self, plan: bytes) -> EngineIO: ...

    def cuda(self) -> CudaRuntime: ...


class TensorRTEngineBuilder:
    """The real adapter: ``tensorrt`` + cuda-python. ``trt``/``cuda`` may be injected (tests)."""

    def __init__(self, trt: Any, cuda: CudaRuntime) -> None:
        self.trt = trt
        self._cuda = cuda
        self.logger = make_logger(trt)

    @classmethod
    def load(cls) -> TensorRTEngineBuilder:
        """Import TensorRT and cuda-python and check for a GPU; a :class:`UsageError` (exit 2) naming what is
        missing and how to install it otherwise."""
        status = tensorrt_status()
        if not status.available:
            if status.version is None and "not installed" in status.detail:
                raise MissingDependencyError("TensorRT (the 'tensorrt' Python package)", "to build an engine", TENSORRT_INSTALL)
            raise UsageError(f"TensorRT is needed to build an engine but {status.detail}")
        import tensorrt as trt

        cuda = CudaRuntime.load()
        gstat = gpu_status(cuda)
        if not gstat.available:
            raise UsageError(f"building a TensorRT engine needs an NVIDIA GPU: {gstat.detail}")
        return cls(trt, cuda)

    @property
    def tensorrt_version(self) -> str:
        return str(self.trt.__version__)

    @property
    def major(self) -> int:
        return tensorrt_major(self.tensorrt_version)

    def gpu(self) -> GPUInfo:
        return self._cuda.device_info(0)

    def cuda(self) -> CudaRuntime:
        return self._cuda

    def build(self, onnx_path: Path, profile: Mapping[str, ShapeRange], options: BuildOptions,
              calibration: CalibrationFeed | None, timing_cache: bytes | None) -> tuple[bytes, bytes | None]:
        trt = self.trt
        builder = trt.Builder(self.logger)
        network = create_network(trt, builder, options.route, self.major)
        parser = parse_onnx(trt, network, self.logger, onnx_path, self.major)
        inputs = network_inputs(trt, network)
        for name, shape in inputs.items():
            if -1 in shape and name not in profile:
                raise UsageError(f"TensorRT sees input '{name}' with dynamic shape {list(shape)} but the profile has no range for it")
        config = builder.create_builder_config()
        opt_profile = configure(trt, builder, config, profile, options, timing_cache)
        calibrator = None
        if options.route == ROUTE_IMPLICIT:
            if calibration is None:
                raise UsageError("--legacy-calibrator needs calibration input")
            calibrator = make_calibrator_class(trt, options.legacy_calibrator or "entropy")(calibration)
            enable_implicit_int8(trt, config, opt_profile, calibrator)
            if options.fp16:
                enable_fp16_flag(trt, config)
        t0 = time.perf_counter()
        plan = build_serialized(trt, builder, network, config, self.logger)
        log.info("TensorRT built the engine in %.1f s", time.perf_counter() - t0)
        if calibration is not None and calibration.error is not None:
            raise calibration.error
        new_cache = save_timing_cache(trt, config) if options.timing_cache else None
        del parser, calibrator
        return plan, new_cache

    def inspect(self, plan: bytes) -> EngineIO:
        return inspect_engine(self.trt, self.logger, plan)


# --------------------------------------------------------------------------------------------
# Metadata beside the plan


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def warn_if_incompatible(plan: str | Path, *, tensorrt_version: str | None = None, gpu: GPUInfo | None = None,
                         probe: bool = True) -> list[str]:
    """Log a warning for each way the running TensorRT/GPU differ from the plan's (the repository writer calls
    this before deploying a plan). With ``probe`` the running versions are detected; what is not installed
    here is not compared. Returns the warnings."""
    meta = read_plan_metadata(plan)
    assert meta is not None  # missing_ok is False: a missing file raises
    if probe and tensorrt_version is None:
        status = tensorrt_status()
        tensorrt_version = status.version if status.available else None
    if probe and gpu is None:
        gstat = gpu_status()
        gpu = gstat.gpu
    problems = check_plan_compatibility(meta, tensorrt_version, gpu)
    for p in problems:
        log.warning("%s: %s", plan, p)
    if tensorrt_version is None and gpu is None:
        log.info("%s: neither TensorRT nor a GPU here, so the plan (TensorRT %s, %s) was not checked against this machine",
                 plan, meta.tensorrt_version, meta.gpu.name if meta.gpu else "unknown GPU")
    return problems


def trtexec_equivalents(model: str | Path, options: BuildOptions, output: str | Path | None = None,
                        for_major: int | None = None) -> tuple[list[tuple[int, list[str]]], list[str]]:
    """``trtrepo build --print-trtexec``: the trtexec command line(s) that build the same plan, per
    TensorRT major (the given one, the installed one, else 10 and 11; the legacy calibrator route
    only before 11), and notes. No TensorRT needed."""
    _, profile = prepare_build(model, options)
    plan = str(output or "model.plan")
    if for_major is not None:
        majors = [for_major]
    else:
        status = tensorrt_status()
        majors = [tensorrt_major(status.version)] if status.available and status.version else [10, 11]
    if options.legacy_calibrator:
        majors = [m for m in majors if m < 11] or majors  # trtexec_command explains 11
    notes = []
    trtexec_model = str(model)
    if options.fp16 and not options.legacy_calibrator:
        trtexec_model = options.fp16_onnx or str(fp16_onnx_default(model))
        notes.append(f"--fp16: trtexec builds the Q/DQ model with its unquantized part in FP16 ({trtexec_model}); "
                     "'trtrepo build --fp16 --fp16-onnx PATH' writes it")
    return [(m, trtexec_command(trtexec_model, plan, profile, options, m)) for m in majors], notes


# --------------------------------------------------------------------------------------------
# The stage


@dataclass(frozen=True)
class BuildResult:
    plan: Path
    metadata_path: Path
    metadata: PlanMetadata
    timing_cache: Path | None = None
    calibration_cache: Path | None = None


def count_qdq_nodes(onnx_path: str | Path) -> int:
    from .modelio import load_onnx

    model = load_onnx(onnx_path, load_weights=False)
    return sum(1 for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear"))


def _onnx_calibration_method(onnx_path: Path) -> str | None:
    from .modelio import load_onnx

    model = load_onnx(onnx_path, load_weights=False)
    props = {p.key: p.value for p in model.metadata_props}
    for key in ("trtrepo.calibration_method", "trtrepo.calibration.method", "calibration_method"):
        if key in props:
            return props[key]
    return None


def prepare_build(onnx_path: str | Path, options: BuildOptions) -> tuple[ModelIO, dict[str, ShapeRange]]:
    """Everything that can be checked without TensorRT: the model, the route fits it, the profile."""
    onnx_path = Path(onnx_path)
    io = ModelIO.from_onnx(onnx_path)
    qdq = count_qdq_nodes(onnx_path)
    if options.route == ROUTE_QDQ and qdq == 0 and not options.allow_fp32:
        raise UsageError(f"{onnx_path}: the model has no QuantizeLinear/DequantizeLinear nodes, so the strongly typed build "
                         "would give an FP32 engine; run 'trtrepo quantize' first, use --legacy-calibrator (TensorRT <= 10), "
                         "or pass --allow-fp32")
    if options.route == ROUTE_IMPLICIT and qdq > 0:
        raise UsageError(f"{onnx_path}: the model already has {qdq} Q/DQ nodes; --legacy-calibrator needs the FP32 model "
                         "(build the Q/DQ model without --legacy-calibrator)")
    return io, profile_shapes(io, options)


def _calibration_batches(options: BuildOptions, io: ModelIO, profile: Mapping[str, ShapeRange]) -> Iterator[dict[str, np.ndarray]]:
    """Batches of exactly the profile's opt batch (TensorRT calibrates with the OPT shapes); a short last
    batch is dropped."""
    from .data import iter_batches

    source = options.data.open(io)
    batch = options.opt_batch
    served = 0
    for b in iter_batches(source, batch, io):
        if b.size < batch:
            if served == 0:
                raise UsageError(f"calibration data has {b.size} sample(s), fewer than one batch of --opt-batch {batch}")
            log.info("dropping the last %d calibration sample(s) (not a full batch of %d)", b.size, batch)
            break
        served += 1
        yield b.inputs


def fp16_onnx_default(onnx_path: str | Path) -> Path:
    """Where the trtexec line says the FP16-converted model is when --fp16-onnx was not given."""
    onnx_path = Path(onnx_path)
    stem = onnx_path.name[: -len(".onnx")] if onnx_path.name.endswith(".onnx") else onnx_path.name
    return onnx_path.with_name(stem + ".fp16.onnx")


def convert_for_fp16(onnx_path: Path, dst: Path, io: ModelIO, options: BuildOptions) -> dict[str, Any]:
    """--fp16 on the Q/DQ route: write ``dst``, the Q/DQ model with its unquantized part in float16 (Q/DQ scales
    float16, opset >= 19, float32 network IO kept), for the strongly typed build. Returns what model.plan.json
    records about it. A model that already has float16 weights and no float32 ones is used as it is."""
    import onnx

    from .fp16 import convert_file
    from .modelio import load_onnx

    model = load_onnx(onnx_path)
    kinds = {i.data_type for i in model.graph.initializer}
    info: dict[str, Any] = {"method": "onnx-conversion", "keep_fp32_ops": list(options.keep_fp32_ops)}
    if onnx.TensorProto.FLOAT16 in kinds and onnx.TensorProto.FLOAT not in kinds:
        log.info("%s: already float16 (no float32 weights); building it as it is", onnx_path)
        dst.write_bytes(onnx_path.read_bytes())
        info["already_fp16"] = True
    else:
        t0 = time.perf_counter()
        convert_file(str(onnx_path), str(dst), keep_fp32_ops=options.keep_fp32_ops)
        log.info("converted the unquantized part of %s to float16 in %.1f s", onnx_path, time.perf_counter() - t0)
    converted = ModelIO.from_onnx(dst)
    changed = [f"{a.name} {a.dtype}->{b.dtype}" for a, b in zip((*io.inputs, *io.outputs), (*converted.inputs, *converted.outputs),
                                                                 strict=False) if a.dtype != b.dtype]
    if changed or len(converted.inputs) != len(io.inputs) or len(converted.outputs) != len(io.outputs):
        raise TrtrepoError(f"{onnx_path}: the FP16 conversion changed the network IO ({', '.join(changed) or 'tensor count'}); "
                           "inputs and outputs must stay as they are")
    m16 = load_onnx(dst, load_weights=False)
    info["opset"] = next((o.version for o in m16.opset_import if o.domain in ("", "ai.onnx")), None)
    info["sha256"] = sha256_file(dst)
    return info


def check_engine_io_types(engine_io: EngineIO, io: ModelIO, where: str) -> None:
    """The engine's IO tensors have the ONNX model's types (--fp16 keeps FP32 network inputs and outputs)."""
    specs = {s.name: s for s in (*io.inputs, *io.outputs)}
    wrong = [f"{t.name} is {t.dtype}, the model's is {specs[t.name].dtype}" for t in engine_io.tensors
             if t.name in specs and t.dtype != specs[t.name].dtype]
    if wrong:
        raise TrtrepoError(f"{where}: the engine's IO types differ from the ONNX model's ({'; '.join(wrong)})")


def build_engine(onnx_path: str | Path, output: str | Path, options: BuildOptions, *,
                 builder: EngineBuilder | None = None, force: bool = True) -> BuildResult:
    """Build ``output`` (model.plan) and ``output.json`` from ``onnx_path``. Nothing is written unless the
    build succeeds; without TensorRT, cuda-python or a GPU a :class:`UsageError` says what is missing."""
    from . import __version__

    onnx_path = Path(onnx_path)
    output = Path(output)
    if not force and output.exists():
        raise UsageError(f"{output}: already exists (use --force to overwrite)")
    io, profile = prepare_build(onnx_path, options)
    if builder is None:
        builder = TensorRTEngineBuilder.load()
    version = builder.tensorrt_version
    major = tensorrt_major(version)
    check_calibration_inputs(options, version)
    gpu = builder.gpu()
    timing_cache = None
    if options.timing_cache and Path(options.timing_cache).is_file():
        timing_cache = Path(options.timing_cache).read_bytes()

    build_onnx = onnx_path
    fp16_bytes: bytes | None = None
    fp16_info: dict[str, Any] | None = None
    if options.fp16 and options.legacy_calibrator:
        fp16_info = {"method": "builder-flag", "flag": "BuilderFlag.FP16"}

    with contextlib.ExitStack() as stack:
        if options.fp16 and options.route == ROUTE_QDQ:
            # converted into a temporary folder; kept (--fp16-onnx) only once the engine is built
            tmpdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trtrepo-fp16-")))
            build_onnx = tmpdir / fp16_onnx_default(onnx_path).name
            fp16_info = convert_for_fp16(onnx_path, build_onnx, io, options)
            fp16_info["saved_to"] = options.fp16_onnx
        feed = None
        if options.route == ROUTE_IMPLICIT:
            batches = _calibration_batches(options, io, profile) if options.data is not None else None
            shapes = {name: r.opt for name, r in profile.items()}
            for spec in io.inputs:
                shapes.setdefault(spec.name, spec.shape)
            feed = stack.enter_context(CalibrationFeed(batches, options.opt_batch, builder.cuda(), shapes,
                                                       options.legacy_calibrator or "entropy", version, options.calib_cache))
        plan, new_timing_cache = builder.build(build_onnx, profile, options, feed, timing_cache)
        if feed is not None and not feed.cache_used and feed.batches_served == 0:
            raise TrtrepoError("TensorRT got no calibration batches and no usable cache; the INT8 ranges would be missing")
        fp16_bytes = build_onnx.read_bytes() if options.fp16_onnx and build_onnx != onnx_path else None
    engine_io = builder.inspect(plan)
    if options.fp16:
        check_engine_io_types(engine_io, io, str(onnx_path))
    model_io = engine_io.to_model_io(io, source=str(output))
    trtexec_onnx = onnx_path
    if options.fp16 and options.route == ROUTE_QDQ:
        trtexec_onnx = Path(options.fp16_onnx) if options.fp16_onnx else fp16_onnx_default(onnx_path)
    trtexec = shlex.join(trtexec_command(trtexec_onnx, output, engine_io.profile or profile, options, major))
    meta = PlanMetadata(
        tensorrt_version=version,
        gpu=gpu,
        precision_route=options.precision_route,
        calibration_method=(options.legacy_calibrator if options.route == ROUTE_IMPLICIT
                            else _onnx_calibration_method(onnx_path) or "from Q/DQ scales in the model"),
        source_onnx=str(onnx_path),
        source_sha256=sha256_file(onnx_path),
        profiles=(dict(engine_io.profile or profile),),
        io_tensors=engine_io.tensors,
        io=model_io,
        trtexec=trtexec,
        build={
            "batch_range": list(options.batch_range),
            "workspace_bytes": options.workspace,
            "builder_optimization_level": options.opt_level,
            "timing_cache": options.timing_cache,
            "calibration_cache": options.calib_cache,
            "num_optimization_profiles": engine_io.num_profiles,
        },
        plan_sha256=hashlib.sha256(plan).hexdigest(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        trtrepo_version=__version__,
        precision={"mode": options.precision, "fp16": fp16_info},
    )
    meta_path = plan_metadata_path(output)
    with atomic_path(output, force=force) as tmp_plan, atomic_path(meta_path) as tmp_meta:
        tmp_plan.write_bytes(plan)
        tmp_meta.write_text(meta.to_json())
    if fp16_bytes is not None and options.fp16_onnx:
        atomic_write_bytes(options.fp16_onnx, fp16_bytes)
    tc_path = None
    if options.timing_cache and new_timing_cache:
        tc_path = atomic_write_bytes(options.timing_cache, new_timing_cache)
    calib_path = Path(options.calib_cache) if options.calib_cache and Path(options.calib_cache).is_file() else None
    return BuildResult(output, meta_path, meta, tc_path, calib_path)
