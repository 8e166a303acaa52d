"""A fake ``tensorrt`` module and a fake cuda-python ``cudart``, ONLY to test trtrepo's own code around
TensorRT (options, metadata, calibrator plumbing, error paths) on machines without TensorRT.

Nothing here says anything about real TensorRT. Class, enum and method names follow the real bindings so
that the conformance tests (tests/test_build_conformance.py) can run the same route functions through a
proxy that checks every access against the real 10.13 / 11.4 bindings and takes its values from here.

The "plan" this fake builds is JSON describing the network and config, so that ``Runtime`` can read
it back.
"""

from __future__ import annotations

import ctypes
import enum
import json
import types
from typing import Any

import onnx


class _Enum(enum.Enum):
    def __int__(self) -> int:
        return int(self.value)


def make_fake_tensorrt(version: str = "10.13.3.9") -> types.ModuleType:
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    state: dict[str, Any] = {"builds": []}
    trt._state = state  # type: ignore[attr-defined]

    class Severity(_Enum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    class ILogger:
        def __init__(self) -> None:
            pass

        def log(self, severity: Any, msg: str) -> None:  # pragma: no cover - overridden
            pass

    ILogger.Severity = Severity  # type: ignore[attr-defined]

    class Logger(ILogger):
        def __init__(self, min_severity: Any = Severity.WARNING) -> None:
            super().__init__()
            self.min_severity = min_severity

    for m in Severity:
        setattr(Logger, m.name, m)

    flags = {"STRONGLY_TYPED": 1, "PREFER_AOT_PYTHON_PLUGINS": 2, "PREFER_JIT_PYTHON_PLUGINS": 3}
    if major < 11:
        flags = {"EXPLICIT_BATCH": 0, **flags}
    NetworkDefinitionCreationFlag = _Enum("NetworkDefinitionCreationFlag", flags)
    bflags = ["DEBUG", "GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "TF32"]
    if major < 11:
        bflags = ["FP16", "BF16", "INT8"] + bflags
    BuilderFlag = _Enum("BuilderFlag", {n: i for i, n in enumerate(bflags)})
    MemoryPoolType = _Enum("MemoryPoolType", {"WORKSPACE": 0, "DLA_MANAGED_SRAM": 1, "TACTIC_DRAM": 4})
    TensorIOMode = _Enum("TensorIOMode", {"NONE": 0, "INPUT": 1, "OUTPUT": 2})
    DataType = _Enum("DataType", {"FLOAT": 0, "HALF": 1, "INT8": 2, "INT32": 3, "BOOL": 4, "UINT8": 5, "FP8": 6,
                                  "BF16": 7, "INT64": 8, "INT4": 9})
    ErrorCode = _Enum("ErrorCode", {"SUCCESS": 0, "INTERNAL_ERROR": 1, "UNSUPPORTED_NODE": 8})
    onnx_to_trt = {1: DataType.FLOAT, 10: DataType.HALF, 3: DataType.INT8, 6: DataType.INT32, 7: DataType.INT64,
                   9: DataType.BOOL, 2: DataType.UINT8, 16: DataType.BF16}

    class ITensor:
        def __init__(self, name: str, shape: tuple[int, ...], dtype: Any) -> None:
            self.name, self.shape, self.dtype = name, tuple(shape), dtype

    class INetworkDefinition:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self._inputs: list[ITensor] = []
            self._outputs: list[ITensor] = []
            self._float16_weights = 0

        @property
        def num_inputs(self) -> int:
            return len(self._inputs)

        @property
        def num_outputs(self) -> int:
            return len(self._outputs)

        def get_input(self, index: int) -> ITensor:
            return self._inputs[index]

        def get_output(self, index: int) -> ITensor:
            return self._outputs[index]

    class ParserError:
        def __init__(self, node: int, name: str, op: str, desc: str) -> None:
            self._node, self._name, self._op, self._desc = node, name, op, desc

        def node(self) -> int:
            return self._node

        def node_name(self) -> str:
            return self._name

        def node_operator(self) -> str:
            return self._op

        def desc(self) -> str:
            return self._desc

        def code(self) -> Any:
            return ErrorCode.UNSUPPORTED_NODE

    class OnnxParser:
        """Reads the ONNX graph's IO; every node outside the default/ai.onnx domain is an error."""

        def __init__(self, network: INetworkDefinition, logger: Any) -> None:
            self.network, self.logger = network, logger
            self._errors: list[ParserError] = []

        def parse_from_file(self, model: str) -> bool:
            m = onnx.load(model, load_external_data=False)
            for i, node in enumerate(m.graph.node):
                if node.domain not in ("", "ai.onnx"):
                    self._errors.append(ParserError(i, node.name, node.op_type, f"No importer registered for op: {node.op_type}"))
            if self._errors:
                return False
            inits = {t.name for t in m.graph.initializer}

            def tensors(values: Any) -> list[ITensor]:
                out = []
                for vi in values:
                    if vi.name in inits:
                        continue
                    tt = vi.type.tensor_type
                    shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tt.shape.dim)
                    out.append(ITensor(vi.name, shape, onnx_to_trt[tt.elem_type]))
                return out

            self.network._inputs = tensors(m.graph.input)
            self.network._outputs = tensors(m.graph.output)
            self.network._float16_weights = sum(1 for t in m.graph.initializer if t.data_type == 10)
            return True

        @property
        def num_errors(self) -> int:
            return len(self._errors)

        def get_error(self, index: int) -> ParserError:
            return self._errors[index]

    class IOptimizationProfile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

        def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:  # noqa: A002
            self.shapes[input] = (tuple(min), tuple(opt), tuple(max))

    class IHostMemory(bytes):
        pass

    class ITimingCache:
        def __init__(self, blob: bytes) -> None:
            self.blob = bytes(blob) or b"fake-timing-cache"

        def serialize(self) -> IHostMemory:
            return IHostMemory(self.blob + b"+")

    class IBuilderConfig:
        def __init__(self) -> None:
            self.pools: dict[Any, int] = {}
            self.builder_optimization_level = 3
            self.flags_set: set[Any] = set()
            self.profiles: list[IOptimizationProfile] = []
            self._timing_cache: ITimingCache | None = None
            if major < 11:
                self.int8_calibrator = None
                self.calibration_profile = None

        def set_memory_pool_limit(self, pool: Any, pool_size: int) -> None:
            self.pools[pool] = pool_size

        def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:
            return ITimingCache(serialized_timing_cache)

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
            self._timing_cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache:
            assert self._timing_cache is not None
            return self._timing_cache

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def set_flag(self, flag: Any) -> None:
            self.flags_set.add(flag)

        if major < 11:

            def set_calibration_profile(self, profile: IOptimizationProfile) -> bool:
                self.calibration_profile = profile
                return True

    class Builder:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            return INetworkDefinition(flags)

        def create_builder_config(self) -> IBuilderConfig:
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            return IOptimizationProfile()

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
            profile = config.profiles[0].shapes if config.profiles else {}
            for t in network._inputs:
                if -1 in t.shape and t.name not in profile:
                    self.logger.log(Severity.ERROR, f"input {t.name} is dynamic but has no profile")
                    return None
            strongly_typed = major >= 11 or bool(network.flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
            precision_flags = sorted(f.name for f in config.flags_set if f.name in ("FP16", "BF16", "INT8"))
            if strongly_typed and precision_flags:  # as documented: a strongly typed network takes no precision flags
                self.logger.log(Severity.ERROR, f"precision flags {precision_flags} set on a strongly typed network")
                return None
            calibrated = None
            if major < 11 and BuilderFlag.INT8 in config.flags_set:
                cal = config.int8_calibrator
                if cal is None:
                    self.logger.log(Severity.WARNING, "INT8 without calibrator")
                else:
                    calibrated = _run_calibrator(cal, network, config)
            if state.get("fail_build"):
                self.logger.log(Severity.ERROR, state["fail_build"])
                return None
            plan = {
                "fake_tensorrt_plan": version,
                "inputs": [[t.name, list(t.shape), t.dtype.name] for t in network._inputs],
                "outputs": [[t.name, list(t.shape), t.dtype.name] for t in network._outputs],
                "profile": {k: [list(s) for s in v] for k, v in profile.items()},
                "network_flags": network.flags,
                "builder_flags": sorted(f.name for f in config.flags_set),
                "optimization_level": config.builder_optimization_level,
                "pools": {p.name: v for p, v in config.pools.items()},
                "calibration": calibrated,
                "float16_weights": network._float16_weights,
            }
            state["builds"].append(plan)
            return IHostMemory(json.dumps(plan).encode())

    def _run_calibrator(cal: Any, network: INetworkDefinition, config: IBuilderConfig) -> dict[str, Any]:
        names = [t.name for t in network._inputs]
        cache = cal.read_calibration_cache()
        batches = 0
        if not cache:
            cal.get_batch_size()
            while True:
                ptrs = cal.get_batch(names)
                if not ptrs:
                    break
                assert len(ptrs) == len(names) and all(isinstance(p, int) for p in ptrs)
                batches += 1
            algo = type(cal).__mro__[1].__name__
            tag = "EntropyCalibration2" if "Entropy" in algo else "MinMaxCalibration"
            v = [int(x) for x in version.split(".")[:3]]
            cache = f"TRT-{v[0] * 10000 + v[1] * 100 + v[2]}-{tag}\n{names[0]}: 3c010204\n".encode()
            if batches:
                cal.write_calibration_cache(cache)
        return {"batches": batches, "cache_header": bytes(cache).split(b"\n")[0].decode()}

    class ICudaEngine:
        def __init__(self, plan: dict[str, Any]) -> None:
            self.plan = plan
            self._io = [(n, tuple(s), d, TensorIOMode.INPUT) for n, s, d in plan["inputs"]]
            self._io += [(n, tuple(s), d, TensorIOMode.OUTPUT) for n, s, d in plan["outputs"]]

        @property
        def num_io_tensors(self) -> int:
            return len(self._io)

        @property
        def num_optimization_profiles(self) -> int:
            return 1

        def _find(self, name: str) -> Any:
            return next(t for t in self._io if t[0] == name)

        def get_tensor_name(self, index: int) -> str:
            return self._io[index][0]

        def get_tensor_mode(self, name: str) -> Any:
            return self._find(name)[3]

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self._find(name)[1]

        def get_tensor_dtype(self, name: str) -> Any:
            return DataType[self._find(name)[2]]

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
            return [tuple(s) for s in self.plan["profile"][name]]

    class Runtime:
        def __init__(self, logger: Any) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
            try:
                plan = json.loads(bytes(serialized_engine))
            except ValueError:
                return None
            return ICudaEngine(plan)

    names = dict(locals())
    for name in ("ILogger", "Logger", "NetworkDefinitionCreationFlag", "BuilderFlag", "MemoryPoolType", "TensorIOMode",
                 "DataType", "ErrorCode", "ITensor", "INetworkDefinition", "ParserError", "OnnxParser",
                 "IOptimizationProfile", "IHostMemory", "ITimingCache", "IBuilderConfig", "Builder", "ICudaEngine", "Runtime"):
        setattr(trt, name, names[name])

    if major < 11:

        class IInt8Calibrator:
            def __init__(self) -> None:
                self._base_initialised = True

        class IInt8EntropyCalibrator2(IInt8Calibrator):
            pass

        class IInt8MinMaxCalibrator(IInt8Calibrator):
            pass

        trt.IInt8Calibrator = IInt8Calibrator  # type: ignore[attr-defined]
        trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2  # type: ignore[attr-defined]
        trt.IInt8MinMaxCalibrator = IInt8MinMaxCalibrator  # type: ignore[attr-defined]
    return trt


# --------------------------------------------------------------------------------------------
# cuda-python's cudart, faked: host memory stands in for device memory


class _CudaError(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorMemoryAllocation = 2
    cudaErrorNoDevice = 100


class _MemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2


class FakeCudart(types.SimpleNamespace):
    """``cudaMalloc``/``cudaMemcpy``/``cudaFree`` over host buffers; counts live allocations."""

    cudaError_t = _CudaError
    cudaMemcpyKind = _MemcpyKind

    def __init__(self, devices: int = 1, name: bytes = b"NVIDIA H100 80GB HBM3", cc: tuple[int, int] = (9, 0)) -> None:
        super().__init__()
        self.devices, self.name, self.cc = devices, name, cc
        self.memory: dict[int, ctypes.Array[Any]] = {}
        self.copies = 0
        self.next_ptr = 0x7F0000000000

    def cudaGetDeviceCount(self) -> tuple[Any, int]:
        if self.devices == 0:
            return _CudaError.cudaErrorNoDevice, 0
        return _CudaError.cudaSuccess, self.devices

    def cudaGetDeviceProperties(self, device: int) -> tuple[Any, Any]:
        prop = types.SimpleNamespace(name=self.name + b"\0" * 8, major=self.cc[0], minor=self.cc[1])
        return _CudaError.cudaSuccess, prop

    def cudaDriverGetVersion(self) -> tuple[Any, int]:
        return _CudaError.cudaSuccess, 12080

    def cudaRuntimeGetVersion(self) -> tuple[Any, int]:
        return _CudaError.cudaSuccess, 12060

    def cudaMalloc(self, size: int) -> tuple[Any, int]:
        buf = (ctypes.c_char * size)()
        ptr = ctypes.addressof(buf)
        self.memory[ptr] = buf
        return _CudaError.cudaSuccess, ptr

    def cudaFree(self, ptr: int) -> tuple[Any]:
        if ptr not in self.memory:
            return (_CudaError.cudaErrorMemoryAllocation,)
        del self.memory[ptr]
        return (_CudaError.cudaSuccess,)

    def cudaMemcpy(self, dst: int, src: int, count: int, kind: Any) -> tuple[Any]:
        assert kind == _MemcpyKind.cudaMemcpyHostToDevice
        buf = self.memory[dst]
        assert count <= len(buf)
        ctypes.memmove(dst, src, count)
        self.copies += 1
        return (_CudaError.cudaSuccess,)
