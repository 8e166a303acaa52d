"""Stage 3: TensorRT engine build (adapter). TensorRT is imported lazily, only here."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorRTStatus:
    available: bool
    version: str | None
    detail: str


INSTALL_HINT = "pip install 'trtrepo[tensorrt]' (tensorrt, cuda-python) on a machine with an NVIDIA GPU"


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
