"""Route functions: the only code that touches the ``tensorrt`` module (passed in as ``trt``, so the
conformance tests run them against the real 10.13 and 11.4 bindings and the unit tests against a
fake); the IO read back from the engine; the :class:`EngineBuilder` adapter."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..contracts.plan import (
    GPUInfo,
    IOTensor,
)
from ..contracts.profile import ShapeRange
from ..errors import MissingDependencyError, OptionError, TrtrepoError, UsageError
from ..modelio import ModelIO, TensorSpec
from .env import TENSORRT_INSTALL, CudaRuntime, gpu_status, tensorrt_major, tensorrt_status
from .nms_plugin import PluginRef, plugin_requirements
from .options import ROUTE_IMPLICIT, ROUTE_QDQ, SETTINGS, BuildOptions

if TYPE_CHECKING:
    from .calib_feed import CalibrationFeed

log = logging.getLogger(__name__)


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


def register_plugins(trt: Any, logger: Any, plugins: tuple[PluginRef, ...], onnx_path: Path) -> None:
    """Before parsing a graph with plugin nodes (:func:`~trtrepo.engine.nms_plugin.plugin_requirements`):
    register TensorRT's standard plugins (libnvinfer_plugin, namespace "") as NVIDIA's samples do
    (``trt.init_libnvinfer_plugins(logger, "")``), then look each node's plugin up in the registry
    the parser searches, so that a missing one is named here rather than as a parser error."""
    if not trt.init_libnvinfer_plugins(logger, ""):
        raise TrtrepoError(f"{onnx_path}: TensorRT could not register its standard plugins (init_libnvinfer_plugins), "
                           f"needed by node '{plugins[0].node}' ({plugins[0].name})")
    registry = trt.get_plugin_registry()
    for p in plugins:
        if registry.get_creator(p.name, p.version, p.namespace) is None:
            where = f" in namespace '{p.namespace}'" if p.namespace else ""
            raise UsageError(f"{onnx_path}: node '{p.node}' needs the TensorRT plugin {p.name} version {p.version}{where}, "
                             f"which TensorRT {trt.__version__} does not register (libnvinfer_plugin or a plugin library "
                             f"loaded before the build provides it)")


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
        plugins = plugin_requirements(onnx_path)
        if plugins:
            register_plugins(trt, self.logger, plugins, onnx_path)
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
                raise OptionError("legacy_calibrator", "needs calibration input", others=SETTINGS)
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


