"""What can run on this machine: each component probed without failing if it is absent."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import tempfile
from pathlib import Path
from typing import Any

from .cpu import cpu_int8
from .engine import gpu_status, tensorrt_status
from .fsutil import pid_alive
from .server import find_server_binary, reap_leftover_servers


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe(name: str, fn: Any) -> dict[str, Any]:
    try:
        ok, detail = fn()
    except Exception as exc:  # a broken install is reported, not raised
        ok, detail = False, f"import failed: {type(exc).__name__}: {exc}"
    return {"name": name, "available": bool(ok), "detail": detail}


def _onnxruntime() -> tuple[bool, str]:
    import onnxruntime as ort

    return True, f"{ort.__version__}, providers: {', '.join(ort.get_available_providers())}"


def _cpu() -> tuple[bool, str]:
    info = cpu_int8()
    return info.vnni is not False, info.describe()


def _torch() -> tuple[bool, str]:
    if importlib.util.find_spec("torch") is None:
        return False, "not installed (pip install 'trtrepo[torch]')"
    import torch

    cuda = torch.cuda.is_available()
    gpu = f", CUDA {torch.version.cuda}: {torch.cuda.get_device_name(0)}" if cuda else ", CUDA not available"
    return True, f"{torch.__version__}{gpu}"


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is not None:
        import torch

        return bool(torch.cuda.is_available())
    return False


def _tensorrt() -> tuple[bool, str]:
    status = tensorrt_status()
    return status.available, status.detail


def _gpu() -> tuple[bool, str]:
    status = gpu_status()
    return status.available, status.detail


def _tritonclient() -> tuple[bool, str]:
    v = _version("tritonclient")
    if v is None:
        return False, "not installed (pip install 'tritonclient[all]')"
    import tritonclient.grpc  # noqa: F401
    import tritonclient.http  # noqa: F401

    return True, f"{v} (http, grpc)"


def _tritonserver() -> tuple[bool, str]:
    path = find_server_binary(None)
    return (path is not None), (str(path) if path else "not found on PATH (trtrepo serve prints the container command)")


def diagnose() -> dict[str, Any]:
    components = [
        _probe("onnxruntime", _onnxruntime),
        _probe("cpu-int8", _cpu),
        _probe("torch", _torch),
        _probe("tensorrt", _tensorrt),
        _probe("gpu", _gpu),
        _probe("tritonclient", _tritonclient),
        _probe("tritonserver", _tritonserver),
    ]
    have = {c["name"]: c["available"] for c in components}
    stages = {
        "export": {"available": have["torch"], "detail": "needs torch for PyTorch sources (ONNX files pass through)"},
        "calibrate": {"available": have["onnxruntime"], "detail": "ONNX Runtime on the CPU"},
        "quantize": {"available": have["onnxruntime"], "detail": "pure onnx graph rewrite, checked with ONNX Runtime"},
        "build": {"available": have["tensorrt"] and have["gpu"],
                  "detail": "needs TensorRT, cuda-python and an NVIDIA GPU ('trtrepo build --print-trtexec' works without)"},
        "deploy": {"available": True, "detail": "TensorRT plan when build can run, else the INT8 ONNX model for onnxruntime"},
        "serve": {"available": have["tritonserver"], "detail": "needs a tritonserver binary (or the container)"},
        "validate": {"available": have["tritonclient"], "detail": "needs tritonclient and a running server"},
    }

    # servers of killed trtrepo runs still hold ports and a repository copy: stopped here, not only listed
    removed = [lo.describe() for lo in reap_leftover_servers()]
    return {"components": components, "stages": stages, "servers_removed": removed, "leftovers": leftovers()}


def leftovers() -> list[str]:
    """What killed trtrepo processes left on this machine (the next run of the same kind removes
    it): temporary folders and /dev/shm regions named after a process that is gone."""

    found = []
    for root, pattern, prefix in ((Path(tempfile.gettempdir()), "trtrepo-*-*", None), (Path("/dev/shm"), "trtrepo_*", "_")):
        if not root.is_dir():
            continue
        for p in sorted(root.glob(pattern)):
            if p.suffix == ".log":  # server logs are kept on purpose (their path was printed)
                continue
            parts = p.name.split(prefix or "-")
            pid = next((x for x in parts[1:3] if x.isdigit()), None)
            if pid is not None and not pid_alive(int(pid)):
                found.append(str(p))
    return found
