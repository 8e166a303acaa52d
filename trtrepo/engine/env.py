"""What is installed: TensorRT, cuda-python and the GPU (probes that never raise), TensorRT versions."""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import cache as cache_codec
from ..contracts.plan import (
    GPUInfo,
)
from ..errors import MissingDependencyError, TrtrepoError, UsageError

log = logging.getLogger(__name__)


INSTALL_HINT = "pip install 'trtrepo[tensorrt]' (tensorrt, cuda-python) on a machine with an NVIDIA GPU"
TENSORRT_INSTALL = "pip install tensorrt  (or 'trtrepo[tensorrt]'; needs an NVIDIA driver and a GPU)"
CUDA_INSTALL = "pip install cuda-python  (the major version matching your CUDA driver, e.g. cuda-python==12.*)"

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


