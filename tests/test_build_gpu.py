"""GPU smoke test of the TensorRT build (scripts/gpu_smoke.sh): needs real TensorRT, cuda-python and an NVIDIA
GPU, so it is skipped on trtrepo's CI and development machines. It has NOT run in this project: no machine
here has TensorRT.

Builds the demo engine from the Q/DQ model (``trtrepo quantize``), runs it with TensorRT's runtime on
``demo:val`` and compares with ONNX Runtime's FP32 and INT8 (Q/DQ) outputs; on TensorRT 10 also the legacy
calibrator route."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from trtrepo import engine as B
from trtrepo.contracts.profile import BatchProfile


def _why_not() -> str | None:
    status = B.tensorrt_status()
    if not status.available:
        return f"needs real TensorRT: {status.detail}"
    gpu = B.gpu_status()
    if not gpu.available:
        return f"needs an NVIDIA GPU: {gpu.detail}"
    return None


_REASON = _why_not()
pytestmark = [pytest.mark.tensorrt, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


def run_plan(plan: Path, inputs: np.ndarray, batch: int = 32) -> np.ndarray:
    """Run ``plan`` on ``inputs`` (N,1,32,32) with TensorRT's runtime, ``batch`` samples at a time."""
    import tensorrt as trt

    cuda = B.CudaRuntime.load()
    rt = cuda.rt
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    context = engine.create_execution_context()
    err, stream = rt.cudaStreamCreate()
    assert err == rt.cudaError_t.cudaSuccess
    outputs = []
    for start in range(0, len(inputs), batch):
        x = np.ascontiguousarray(inputs[start:start + batch], dtype=np.float32)
        y = np.empty((len(x), 10), np.float32)
        context.set_input_shape("input", x.shape)
        d_in, d_out = cuda.malloc(x.nbytes), cuda.malloc(y.nbytes)
        try:
            cuda.memcpy_htod(d_in, x)
            context.set_tensor_address("input", d_in)
            context.set_tensor_address("logits", d_out)
            assert context.execute_async_v3(stream)
            assert rt.cudaStreamSynchronize(stream)[0] == rt.cudaError_t.cudaSuccess
            kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
            assert rt.cudaMemcpy(y.ctypes.data, d_out, y.nbytes, kind)[0] == rt.cudaError_t.cudaSuccess
        finally:
            cuda.free(d_in)
            cuda.free(d_out)
        outputs.append(y)
    rt.cudaStreamDestroy(stream)
    return np.concatenate(outputs)


def ort_run(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"input": x[i:i + 64]})[0] for i in range(0, len(x), 64)])


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from trtrepo.cli import cli
    from trtrepo.data import collect, open_data
    from trtrepo.export import export_onnx
    from trtrepo.modelio import ModelIO

    folder = tmp_path_factory.mktemp("gpu_smoke")
    fp32 = folder / "demo.onnx"
    export_onnx("demo", fp32)
    qdq = folder / "demo.qdq.onnx"
    r = CliRunner().invoke(cli, ["quantize", str(fp32), "-o", str(qdq), "--data", "demo:calib", "--target", "tensorrt",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    io = ModelIO.from_onnx(fp32)
    source = open_data("demo:val", io=io)
    x = collect(source, 64, io)["input"]
    labels = source.labels()
    return {"folder": folder, "fp32": fp32, "qdq": qdq, "x": x, "labels": labels,
            "ref_fp32": ort_run(fp32, x), "ref_int8": ort_run(qdq, x)}


def _report(name: str, y: np.ndarray, w: dict[str, Any]) -> dict[str, float]:
    acc = float((y.argmax(1) == w["labels"]).mean())
    stats = {
        "top1": acc,
        "top1_ort_fp32": float((w["ref_fp32"].argmax(1) == w["labels"]).mean()),
        "top1_ort_int8": float((w["ref_int8"].argmax(1) == w["labels"]).mean()),
        "agree_ort_int8": float((y.argmax(1) == w["ref_int8"].argmax(1)).mean()),
        "max_abs_vs_ort_int8": float(np.abs(y - w["ref_int8"]).max()),
        "max_abs_vs_ort_fp32": float(np.abs(y - w["ref_fp32"]).max()),
    }
    print(f"{name}: " + ", ".join(f"{k}={v:.4f}" for k, v in stats.items()))
    return stats


def test_qdq_engine_matches_onnxruntime(work: dict[str, Any]) -> None:
    plan = work["folder"] / "repo" / "demo" / "1" / "model.plan"
    result = B.build_engine(work["qdq"], plan, B.BuildOptions(profile=BatchProfile.for_build(1, 32, 64)))
    meta = B.read_plan_metadata(plan)
    assert meta.precision_route == B.ROUTE_QDQ and meta.gpu is not None
    assert [t.name for t in result.metadata.io_tensors] == ["input", "logits"]
    assert meta.profile["input"].max == (64, 1, 32, 32)
    assert B.warn_if_incompatible(plan) == []
    stats = _report("tensorrt qdq", run_plan(plan, work["x"]), work)
    assert stats["agree_ort_int8"] >= 0.97
    assert stats["top1"] >= stats["top1_ort_fp32"] - 0.02


def test_legacy_calibrator_engine(work: dict[str, Any]) -> None:
    if B.tensorrt_major(B.tensorrt_status().version or "0") >= 11:
        pytest.skip("TensorRT 11 has no implicit INT8 calibration")
    from trtrepo.data import DataOptions

    plan = work["folder"] / "legacy" / "model.plan"
    cache = work["folder"] / "legacy.cache"
    B.build_engine(work["fp32"], plan, B.BuildOptions(profile=BatchProfile.for_build(1, 32, 64), legacy_calibrator="entropy",
                                                      data=DataOptions("demo:calib", limit=512), calib_cache=str(cache)))
    assert cache.read_bytes().startswith(b"TRT-")
    stats = _report("tensorrt legacy entropy", run_plan(plan, work["x"]), work)
    assert stats["top1"] >= stats["top1_ort_fp32"] - 0.02
    # the cache alone (no data) builds again
    plan2 = work["folder"] / "legacy2" / "model.plan"
    B.build_engine(work["fp32"], plan2, B.BuildOptions(profile=BatchProfile.for_build(1, 32, 64), legacy_calibrator="entropy",
                                                       calib_cache=str(cache)))
    assert plan2.is_file()
