"""Unit tests of everything around TensorRT in trtrepo/engine/: options, profile shapes, the trtexec command
line, metadata, atomic writes, the calibrator plumbing, plan compatibility and the missing-TensorRT path.

TensorRT itself is replaced by tests/_fake_tensorrt.py (it only exercises trtrepo's own code; what the real
bindings accept is checked in test_build_conformance.py)."""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _build_models import demo_models
from _fake_tensorrt import FakeCudart, make_fake_tensorrt
from click.testing import CliRunner

from trtrepo import engine as B
from trtrepo.cli import cli
from trtrepo.contracts import plan as PM
from trtrepo.contracts import profile as P
from trtrepo.data import DataOptions
from trtrepo.errors import MissingDependencyError, TrtrepoError, UsageError
from trtrepo.evaluate import make_session
from trtrepo.modelio import ModelIO, TensorSpec


def build_opts(min_batch: int = 1, opt_batch: int = 8, max_batch: int = 32, shapes: Any = (), **kw: Any) -> B.BuildOptions:
    """BuildOptions with trtrepo build's batch flags (the profile is a BatchProfile)."""
    return B.BuildOptions(profile=P.BatchProfile.for_build(min_batch, opt_batch, max_batch, shapes), **kw)


V10, V11 = "10.13.3.9", "11.4.0.106"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return demo_models(tmp_path_factory.mktemp("build_models"))


def fake_builder(version: str = V10, cudart: FakeCudart | None = None) -> B.TensorRTEngineBuilder:
    return B.TensorRTEngineBuilder(make_fake_tensorrt(version), B.CudaRuntime(cudart or FakeCudart()))


def bert_io() -> ModelIO:
    ids = TensorSpec("input_ids", "int64", (-1, -1), 0, ("batch", "sequence"))
    mask = TensorSpec("attention_mask", "int64", (-1, -1), 0, ("batch", "sequence"))
    out = TensorSpec("logits", "float32", (-1, 2), 0, ("batch", None))
    return ModelIO((ids, mask), (out,))


# ------------------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(("text", "expected"), [
    ("4GiB", 4 << 30), ("4G", 4 << 30), ("512MiB", 512 << 20), ("1GB", 10**9), ("1024", 1024), ("1.5GiB", 3 << 29),
])
def test_parse_size(text: str, expected: int) -> None:
    assert B.parse_size(text) == expected


@pytest.mark.parametrize("text", ["4 parsecs", "", "-1G", "0", "GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError, match=f"the workspace size '{text}'"):
        B.parse_size(text)


def test_parse_shape_option_trtexec_dims() -> None:
    name, r = P.parse_shape_option("input_ids:1x8,8x64,32x128")
    assert name == "input_ids" and r == B.ShapeRange((1, 8), (8, 64), (32, 128))
    assert r.describe() == "1x8,8x64,32x128"
    name, r = P.parse_shape_option("ns:x:4x16")  # names may contain ':'; one shape fixes min=opt=max
    assert name == "ns:x" and r.min == r.opt == r.max == (4, 16)


@pytest.mark.parametrize(("text", "message"), [
    ("1x8,8x64,32x128", "expected NAME:MIN,OPT,MAX"),
    ("x:1x8,8x64", "three shapes"),
    ("x:1x8,8xa,32x128", "not a shape"),
    ("x:1x8,8x64,4x128", "axis 0 needs min <= opt <= max"),
    ("x:1x8,8x64x1,32x128", "same rank"),
    ("x:0x8,8x64,32x128", "not a shape"),
])
def test_parse_shape_option_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        P.parse_shape_option(text)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_batch": 4, "opt_batch": 2}, "batch range"),
    ({"max_batch": 4}, "batch range"),
    ({"opt_level": 6}, "the optimization level must be 0..5, got 6"),
    ({"legacy_calibrator": "percentile"}, "the legacy calibrator must be one of entropy, minmax, got 'percentile'"),
    ({"calib_cache": "c.cache"}, "and the calibration cache are only used with the legacy calibrator"),
    ({"shapes": (("x", B.ShapeRange((1,), (1,), (1,))),) * 2}, "more than once"),
])
def test_build_options_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_opts(**kwargs)


# ------------------------------------------------------------------------------------------------
# Profile shapes


def test_profile_from_batch_range_on_demo(models: tuple[Path, Path]) -> None:
    io = ModelIO.from_onnx(models[1])
    profile = B.profile_shapes(io, build_opts(min_batch=2, opt_batch=4, max_batch=16))
    assert profile == {"input": B.ShapeRange((2, 1, 32, 32), (4, 1, 32, 32), (16, 1, 32, 32))}


def test_profile_needs_shape_for_other_dynamic_axes() -> None:
    with pytest.raises(UsageError, match=r"input 'input_ids' has dynamic axis 1 \('sequence'\).*the shape range input_ids:"):
        B.profile_shapes(bert_io(), build_opts())


def test_profile_with_shape_overrides() -> None:
    shapes = tuple(P.parse_shape_option(f"{n}:1x8,8x64,32x128") for n in ("input_ids", "attention_mask"))
    profile = B.profile_shapes(bert_io(), build_opts(shapes=shapes))
    assert profile["input_ids"] == profile["attention_mask"] == B.ShapeRange((1, 8), (8, 64), (32, 128))


@pytest.mark.parametrize(("shape", "message"), [
    ("input_ids:2x8,8x64,32x128", "batch axis 2,8,32 differs from the min/opt/max batch 1,8,32"),
    ("input_ids:1x8x1,8x64x1,32x128x1", "rank 3"),
    ("nope:1x8,8x64,32x128", "unknown input"),
])
def test_profile_override_errors(shape: str, message: str) -> None:
    opts = build_opts(shapes=(P.parse_shape_option(shape), P.parse_shape_option("attention_mask:1x8,8x64,32x128")))
    with pytest.raises(UsageError, match=message):
        B.profile_shapes(bert_io(), opts)


def test_profile_override_must_keep_fixed_dims(models: tuple[Path, Path]) -> None:
    io = ModelIO.from_onnx(models[1])
    with pytest.raises(UsageError, match="axis 2 is fixed at 32"):
        B.profile_shapes(io, build_opts(shapes=(P.parse_shape_option("input:1x1x16x32,8x1x16x32,32x1x16x32"),)))


def test_static_inputs_get_no_profile() -> None:
    io = ModelIO((TensorSpec("x", "float32", (1, 3), None),), (TensorSpec("y", "float32", (1, 3), None),))
    assert B.profile_shapes(io, build_opts()) == {}


# ------------------------------------------------------------------------------------------------
# trtexec


def test_trtexec_command_per_version() -> None:
    profile = {"input_ids": B.ShapeRange((1, 8), (8, 64), (32, 128)), "attention_mask": B.ShapeRange((1, 8), (8, 64), (32, 128))}
    opts = build_opts(workspace=4 << 30, opt_level=4, timing_cache="tc.bin")
    ten = B.trtexec_command("m.qdq.onnx", "repo/m/1/model.plan", profile, opts, 10)
    assert ten == ["trtexec", "--onnx=m.qdq.onnx", "--saveEngine=repo/m/1/model.plan",
                   "--minShapes=input_ids:1x8,attention_mask:1x8", "--optShapes=input_ids:8x64,attention_mask:8x64",
                   "--maxShapes=input_ids:32x128,attention_mask:32x128", "--stronglyTyped",
                   "--memPoolSize=workspace:4096M", "--builderOptimizationLevel=4", "--timingCacheFile=tc.bin"]
    eleven = B.trtexec_command("m.qdq.onnx", "repo/m/1/model.plan", profile, opts, 11)
    assert eleven == [a for a in ten if a != "--stronglyTyped"]
    assert not any(a.startswith(("--int8", "--calib", "--fp16", "--best")) for a in eleven)


def test_trtexec_command_legacy() -> None:
    profile = {"input": B.ShapeRange((1, 3), (8, 3), (32, 3))}
    opts = build_opts(legacy_calibrator="entropy", calib_cache="c.cache")
    cmd = B.trtexec_command("m.onnx", "model.plan", profile, opts, 10)
    assert "--int8" in cmd and "--calib=c.cache" in cmd and "--stronglyTyped" not in cmd
    with pytest.raises(UsageError, match="TensorRT 11.x removed implicit INT8"):
        B.trtexec_command("m.onnx", "model.plan", profile, opts, 11)


# ------------------------------------------------------------------------------------------------
# Builds through the fake TensorRT: metadata, IO, atomic writes


@pytest.mark.parametrize("version", [V10, V11])
def test_build_writes_plan_and_metadata(models: tuple[Path, Path], tmp_path: Path, version: str) -> None:
    qdq = models[1]
    out = tmp_path / "repo" / "demo" / "1" / "model.plan"
    builder = fake_builder(version)
    result = B.build_engine(qdq, out, build_opts(workspace=1 << 30), builder=builder)
    assert result.plan == out and out.is_file()
    assert result.metadata_path == tmp_path / "repo" / "demo" / "1" / "model.plan.json"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.plan", "model.plan.json"]  # no temp files left
    plan = builder.trt._state["builds"][-1]
    assert plan["network_flags"] == (0 if version == V11 else 1 << int(builder.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    assert plan["builder_flags"] == [] and plan["pools"] == {"WORKSPACE": 1 << 30} and plan["optimization_level"] == 3

    data = json.loads(result.metadata_path.read_text())
    assert data["format"] == PM.PLAN_METADATA_FORMAT
    assert data["tensorrt_version"] == version
    assert data["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and data["gpu"]["compute_capability"] == "9.0"
    assert data["gpu"]["driver_version"] == "12.8"
    assert data["precision_route"] == "strongly-typed-qdq"
    assert data["calibration_method"] == "from Q/DQ scales in the model"
    assert data["source_onnx"] == {"path": str(qdq), "sha256": hashlib.sha256(qdq.read_bytes()).hexdigest()}
    assert data["plan_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert data["profiles"] == [{"input": {"min": [1, 1, 32, 32], "opt": [8, 1, 32, 32], "max": [32, 1, 32, 32]}}]
    assert data["max_batch_size"] == 32
    assert data["io_tensors"] == [
        {"name": "input", "dtype": "float32", "trt_dtype": "FLOAT", "shape": [-1, 1, 32, 32], "mode": "INPUT"},
        {"name": "logits", "dtype": "float32", "trt_dtype": "FLOAT", "shape": [-1, 10], "mode": "OUTPUT"},
    ]
    assert data["trtexec"].startswith(f"trtexec --onnx={qdq} --saveEngine={out} --minShapes=input:1x1x32x32")
    assert ("--stronglyTyped" in data["trtexec"]) == (version == V10)

    meta = PM.read_plan_metadata(out)
    assert meta.io == ModelIO.from_onnx(qdq)  # the config renderer gets the ONNX IO, read back from the engine
    assert meta.io.inputs[0].dim_names == ModelIO.from_onnx(qdq).inputs[0].dim_names
    assert meta.profile == {"input": B.ShapeRange((1, 1, 32, 32), (8, 1, 32, 32), (32, 1, 32, 32))}
    assert meta.max_batch_size == 32
    assert PM.read_plan_metadata(result.metadata_path) == meta


def test_calibration_method_from_onnx_metadata(models: tuple[Path, Path], tmp_path: Path) -> None:
    import onnx

    model = onnx.load(str(models[1]))
    model.metadata_props.add(key="trtrepo.calibration_method", value="entropy")
    src = tmp_path / "m.qdq.onnx"
    onnx.save(model, str(src))
    result = B.build_engine(src, tmp_path / "model.plan", build_opts(), builder=fake_builder())
    assert result.metadata.calibration_method == "entropy"


def test_failed_build_writes_nothing_and_keeps_old_plan(models: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "model.plan"
    out.write_bytes(b"old plan")
    builder = fake_builder()
    builder.trt._state["fail_build"] = "Could not find any implementation for node /conv1/Conv"
    with pytest.raises(TrtrepoError, match="TensorRT failed to build the engine: Could not find any implementation"):
        B.build_engine(models[1], out, build_opts(), builder=builder)
    assert out.read_bytes() == b"old plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.plan"]


def test_no_force_refuses_existing_plan(models: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "model.plan"
    out.write_bytes(b"old")
    with pytest.raises(UsageError, match="already exists"):
        B.build_engine(models[1], out, build_opts(), builder=fake_builder(), force=False)


def test_parser_errors_are_all_reported(models: tuple[Path, Path], tmp_path: Path) -> None:
    import onnx
    from onnx import helper

    model = onnx.load(str(models[1]))
    model.graph.node.append(helper.make_node("MyOp", ["logits"], ["a"], name="custom_a", domain="com.example"))
    model.graph.node.append(helper.make_node("OtherOp", ["a"], ["b"], name="custom_b", domain="com.example"))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    src = tmp_path / "bad.qdq.onnx"
    onnx.save(model, str(src))
    with pytest.raises(TrtrepoError) as info:
        B.build_engine(src, tmp_path / "out" / "model.plan", build_opts(), builder=fake_builder())
    msg = info.value.message
    assert "2 error(s)" in msg and "custom_a: MyOp" in msg and "custom_b: OtherOp" in msg and "\n" not in msg
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_qdq_route_refuses_fp32_model_unless_allowed(models: tuple[Path, Path], tmp_path: Path) -> None:
    fp32 = models[0]
    with pytest.raises(UsageError, match="no QuantizeLinear/DequantizeLinear nodes"):
        B.build_engine(fp32, tmp_path / "model.plan", build_opts(), builder=fake_builder())
    result = B.build_engine(fp32, tmp_path / "model.plan", build_opts(allow_fp32=True), builder=fake_builder())
    assert result.plan.is_file()


def test_timing_cache_is_loaded_and_saved(models: tuple[Path, Path], tmp_path: Path) -> None:
    tc = tmp_path / "timing.cache"
    opts = build_opts(timing_cache=str(tc))
    B.build_engine(models[1], tmp_path / "a.plan", opts, builder=fake_builder())
    first = tc.read_bytes()
    B.build_engine(models[1], tmp_path / "b.plan", opts, builder=fake_builder())
    assert tc.read_bytes() == first + b"+"  # the fake appends '+' to what it loaded


# ------------------------------------------------------------------------------------------------
# Legacy calibrator route (fake TensorRT 10, fake cudart)


def test_legacy_calibrator_feeds_device_buffers_and_writes_cache(models: tuple[Path, Path], tmp_path: Path) -> None:
    cudart = FakeCudart()
    builder = fake_builder(V10, cudart)
    cache = tmp_path / "calib.cache"
    opts = build_opts(legacy_calibrator="entropy", data=DataOptions("demo:calib", limit=100), calib_cache=str(cache))
    result = B.build_engine(models[0], tmp_path / "model.plan", opts, builder=builder)
    plan = builder.trt._state["builds"][-1]
    assert plan["builder_flags"] == ["INT8"] and plan["network_flags"] == 0
    assert plan["calibration"] == {"batches": 12, "cache_header": "TRT-101303-EntropyCalibration2"}  # 100 // 8 full batches
    assert cudart.copies == 12 and cudart.memory == {}  # one buffer reused, freed at the end
    assert cache.read_text().startswith("TRT-101303-EntropyCalibration2\n")
    assert result.metadata.precision_route == "implicit-int8-calibrator" and result.metadata.calibration_method == "entropy"
    assert "--int8 --calib=" in result.metadata.trtexec


def test_legacy_calibrator_reuses_trtrepo_cache_without_data(models: tuple[Path, Path], tmp_path: Path) -> None:
    cache = tmp_path / "calib.cache"
    content = "TRT-100300-MinMaxCalibration\ninput: 3c010204\n"  # another TensorRT version's header
    cache.write_text(content)
    builder = fake_builder(V10)
    opts = build_opts(legacy_calibrator="minmax", calib_cache=str(cache))
    B.build_engine(models[0], tmp_path / "model.plan", opts, builder=builder)
    # handed to TensorRT with the running version, so TensorRT does not discard it; the file stays as it was
    assert builder.trt._state["builds"][-1]["calibration"] == {"batches": 0, "cache_header": "TRT-101303-MinMaxCalibration"}
    assert cache.read_text() == content


@pytest.mark.parametrize(("cache_text", "opts", "message"), [
    (None, {}, "needs the calibration data .* or the calibration cache"),
    ("TRT-101303-EntropyCalibration2\n", {"legacy_calibrator": "minmax"}, "cache holds EntropyCalibration2 ranges"),
    ("garbage\n", {}, "not a TensorRT calibration cache"),
])
def test_legacy_calibrator_input_errors(models: tuple[Path, Path], tmp_path: Path, cache_text: str | None,
                                        opts: dict[str, Any], message: str) -> None:
    kwargs: dict[str, Any] = {"legacy_calibrator": "entropy", **opts}
    if cache_text is not None:
        (tmp_path / "c.cache").write_text(cache_text)
        kwargs["calib_cache"] = str(tmp_path / "c.cache")
    with pytest.raises(UsageError, match=message):
        B.build_engine(models[0], tmp_path / "out" / "model.plan", build_opts(**kwargs), builder=fake_builder())
    assert not (tmp_path / "out").exists()


def test_legacy_calibrator_on_tensorrt_11_points_to_qdq(models: tuple[Path, Path], tmp_path: Path) -> None:
    opts = build_opts(legacy_calibrator="entropy", data=DataOptions("demo:calib", limit=16))
    with pytest.raises(UsageError, match="TensorRT 11.4.0.106 removed implicit INT8.*'trtrepo quantize'"):
        B.build_engine(models[0], tmp_path / "model.plan", opts, builder=fake_builder(V11))


def test_legacy_calibrator_refuses_qdq_model(models: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="already has 2 Q/DQ nodes"):
        B.build_engine(models[1], tmp_path / "model.plan", build_opts(legacy_calibrator="entropy", calib_cache="x"),
                       builder=fake_builder())


def test_calibration_feed_keeps_errors_and_frees_buffers() -> None:
    cudart = FakeCudart()
    cuda = B.CudaRuntime(cudart)
    good = {"x": np.ones((2, 3), np.float32)}
    bad = {"x": np.ones((2, 4), np.float32)}
    feed = B.CalibrationFeed([good, good, bad, good], 2, cuda, {"x": (2, 3)}, "entropy", V10)
    with feed:
        p1 = feed.next_pointers(["x"])
        p2 = feed.next_pointers(["x"])
        assert p1 == p2 and len(cudart.memory) == 1  # reused
        assert feed.next_pointers(["x"]) is None  # wrong shape: stops calibration, error kept
        assert isinstance(feed.error, UsageError) and "opt shape [2, 3]" in str(feed.error)
        assert feed.next_pointers(["x"]) is None
    assert cudart.memory == {} and cuda.allocated == set()


def test_gpu_status_and_cuda_errors() -> None:
    status = B.gpu_status(B.CudaRuntime(FakeCudart()))
    assert status.available and status.gpu == PM.GPUInfo("NVIDIA H100 80GB HBM3", "9.0", "12.8", "12.6", 0)
    none = B.gpu_status(B.CudaRuntime(FakeCudart(devices=0)))
    assert not none.available and "cudaErrorNoDevice" in none.detail


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-python not installed")
def test_cuda_calls_reach_real_cuda_python() -> None:
    """The real cuda-python (installed here by tritonclient[all]) accepts every call's arguments; with no driver
    each returns an error code, which becomes a one-line TrtrepoError naming the call."""
    cuda = B.CudaRuntime.load()
    calls = [("cudaGetDeviceCount", cuda.device_count, ()), ("cudaMalloc", cuda.malloc, (1024,)),
             ("cudaMemcpy", cuda.memcpy_htod, (1 << 20, np.zeros(4, np.float32))), ("cudaFree", cuda.free, (1 << 20,)),
             ("cudaGetDeviceProperties", cuda.device_info, (0,))]
    for name, fn, args in calls:
        try:
            fn(*args)
        except TrtrepoError as exc:
            assert exc.message.startswith(f"CUDA {name}")
    prop = cuda.rt.cudaDeviceProp()
    assert all(hasattr(prop, a) for a in ("name", "major", "minor"))


def test_nv_tensorrt_version_int() -> None:
    assert B.nv_tensorrt_version_int("10.3.0") == 100300
    assert B.nv_tensorrt_version_int("8.6.1.6") == 8601
    assert B.nv_tensorrt_version_int("11.4.0.106") == 110400


# ------------------------------------------------------------------------------------------------
# Plan compatibility


def _meta(tmp_path: Path, models: tuple[Path, Path]) -> Path:
    return B.build_engine(models[1], tmp_path / "model.plan", build_opts(), builder=fake_builder()).plan


def test_compatibility_warnings(models: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan = _meta(tmp_path, models)
    meta = PM.read_plan_metadata(plan)
    h100 = PM.GPUInfo("NVIDIA H100 80GB HBM3", "9.0")
    assert PM.check_plan_compatibility(meta, V10, h100) == []
    assert "built with TensorRT 10.13.3.9 but TensorRT 11.4.0.106" in PM.check_plan_compatibility(meta, V11, h100)[0]
    assert "compute capability 8.0; it will not load" in PM.check_plan_compatibility(meta, V10, PM.GPUInfo("NVIDIA A100", "8.0"))[0]
    assert "same compute capability" in PM.check_plan_compatibility(meta, V10, PM.GPUInfo("NVIDIA H200", "9.0"))[0]
    with caplog.at_level(logging.WARNING, logger="trtrepo.engine"):
        problems = B.warn_if_incompatible(plan, tensorrt_version=V11, gpu=PM.GPUInfo("NVIDIA A100", "8.0"))
    assert len(problems) == 2 and len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_compatibility_without_tensorrt_here(models: tuple[Path, Path], tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    assert B.warn_if_incompatible(_meta(tmp_path, models)) == []  # nothing to compare against on this machine


def test_read_plan_metadata_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="plan metadata not found"):
        PM.read_plan_metadata(tmp_path / "model.plan")
    (tmp_path / "model.plan.json").write_text('{"format": "other"}')
    with pytest.raises(UsageError, match="unknown format"):
        PM.read_plan_metadata(tmp_path / "model.plan")


# ------------------------------------------------------------------------------------------------
# CLI


def test_cli_without_tensorrt_exits_2_and_writes_nothing(models: tuple[Path, Path], tmp_path: Path) -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    out = tmp_path / "repo" / "demo" / "1" / "model.plan"
    result = CliRunner().invoke(cli, ["build", str(models[1]), "-o", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: TensorRT (the 'tensorrt' Python package) is required to build an engine")
    assert "pip install tensorrt" in lines[0]
    assert not (tmp_path / "repo").exists()


def _install_fake_tensorrt(monkeypatch: pytest.MonkeyPatch, version: str = V10) -> Any:
    fake = make_fake_tensorrt(version)
    fake.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    return fake


def test_cli_without_gpu_exits_2(models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_tensorrt(monkeypatch)
    monkeypatch.setattr(B.CudaRuntime, "load", classmethod(lambda cls: cls(FakeCudart(devices=0))))
    result = CliRunner().invoke(cli, ["build", str(models[1]), "-o", str(tmp_path / "out" / "model.plan")])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: building a TensorRT engine needs an NVIDIA GPU: no usable NVIDIA GPU/driver "
                                     "(CUDA cudaGetDeviceCount failed: cudaErrorNoDevice)")
    assert not (tmp_path / "out").exists()


def test_cli_without_cuda_python_exits_2(models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install_fake_tensorrt(monkeypatch)

    def missing() -> Any:
        raise MissingDependencyError("cuda-python", "to use the GPU (device buffers, GPU properties)", B.CUDA_INSTALL)

    monkeypatch.setattr(B.env, "_import_cudart", missing)  # where CudaRuntime.load looks it up
    result = CliRunner().invoke(cli, ["build", str(models[1]), "-o", str(tmp_path / "model.plan")])
    assert result.exit_code == 2 and "cuda-python is required" in result.output and "pip install cuda-python" in result.output


def test_cli_build_with_fake_tensorrt(models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(B.TensorRTEngineBuilder, "load", classmethod(lambda cls: fake_builder(V11)))
    out = tmp_path / "repo" / "demo" / "1" / "model.plan"
    result = CliRunner().invoke(cli, ["build", str(models[1]), "-o", str(out), "--max-batch", "64", "--workspace", "2GiB"])
    assert result.exit_code == 0, result.output
    assert f"built {out} with TensorRT {V11} on NVIDIA H100 80GB HBM3 (compute capability 9.0)" in result.output
    assert "input  input: float32 [-1, 1, 32, 32]  profile 1x1x32x32,8x1x32x32,64x1x32x32" in result.output
    assert PM.read_plan_metadata(out).max_batch_size == 64


def test_cli_print_trtexec_without_tensorrt(models: tuple[Path, Path]) -> None:
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    r = CliRunner().invoke(cli, ["build", str(models[1]), "--print-trtexec", "-o", "m/1/model.plan"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0] == "# TensorRT 10.x" and "--stronglyTyped" in lines[1]
    assert lines[2] == "# TensorRT 11.x" and "--stronglyTyped" not in lines[3] and lines[3].startswith("trtexec --onnx=")
    r = CliRunner().invoke(cli, ["build", str(models[0]), "--print-trtexec", "--for-tensorrt", "11",
                                 "--legacy-calibrator", "entropy", "--cache", "c.cache"])
    assert r.exit_code == 2 and "removed implicit INT8" in r.output


def test_cli_option_errors(models: tuple[Path, Path]) -> None:
    r = CliRunner().invoke(cli, ["build", str(models[1])])
    assert r.exit_code == 2 and "-o/--output is required" in r.output
    r = CliRunner().invoke(cli, ["build", str(models[1]), "-o", "x.plan", "--shape", "bad"])
    assert r.exit_code == 2 and "Invalid value for '--shape': 'bad': expected NAME:MIN,OPT,MAX" in r.output
    r = CliRunner().invoke(cli, ["build", str(models[0]), "-o", "x.plan", "--legacy-calibrator", "entropy",
                                 "--data", "demo:calib", "--batch-size", "16"])
    assert r.exit_code == 2 and "set --opt-batch instead" in r.output


def test_doctor_reports_gpu() -> None:
    from trtrepo.doctor import diagnose

    report = diagnose()
    gpu = next(c for c in report["components"] if c["name"] == "gpu")
    assert isinstance(gpu["available"], bool) and gpu["detail"]
    assert report["stages"]["build"]["available"] == (gpu["available"] and
                                                      next(c for c in report["components"] if c["name"] == "tensorrt")["available"])


def test_plan_metadata_feeds_the_repository_writer(models: tuple[Path, Path], tmp_path: Path) -> None:
    """The Triton config of a plan comes from the IO and profile read back from the engine (model.plan.json)."""
    from trtrepo.repository import PlanTarget, add_plan_model

    plan = B.build_engine(models[1], tmp_path / "build" / "model.plan", build_opts(max_batch=16),
                          builder=fake_builder()).plan
    result, _ = add_plan_model(tmp_path / "repo", "demo", plan, target=PlanTarget(V11, "8.0"))
    text = result.config_text
    assert 'platform: "tensorrt_plan"' in text or 'backend: "tensorrt"' in text
    assert "max_batch_size: 16" in text and 'name: "input"' in text and 'name: "logits"' in text
    assert len(result.warnings) == 2  # other TensorRT, other compute capability
    assert (result.model_dir / str(result.version) / "model.plan.json").is_file()


# ------------------------------------------------------------------------------------------------
# --fp16 (mixed INT8 + FP16) and several dynamic axes (issue 8)


@pytest.fixture(scope="module")
def text_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from _build_models import demo_text_models

    return demo_text_models(tmp_path_factory.mktemp("text_models"))


TEXT_SHAPES = tuple(P.parse_shape_option(f"{n}:1x8,8x64,32x128") for n in ("input_ids", "attention_mask"))


@pytest.mark.parametrize("version", [V10, V11])
def test_fp16_qdq_builds_the_converted_graph_strongly_typed(text_models: tuple[Path, Path], tmp_path: Path, version: str) -> None:
    import onnx

    qdq = text_models[1]
    builder = fake_builder(version)
    keep = tmp_path / "text.fp16.onnx"
    opts = build_opts(fp16=True, shapes=TEXT_SHAPES, fp16_onnx=str(keep))
    result = B.build_engine(qdq, tmp_path / "model.plan", opts, builder=builder)
    plan = builder.trt._state["builds"][-1]
    assert plan["builder_flags"] == [] and plan["float16_weights"] > 0  # FP16 from the graph's types, no flag
    assert plan["network_flags"] == (0 if version == V11 else 1 << int(builder.trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    data = json.loads(result.metadata_path.read_text())
    assert data["precision_route"] == "strongly-typed-qdq+fp16-onnx"
    fp16 = data["precision"]["fp16"]
    assert data["precision"]["mode"] == "int8+fp16" and fp16["method"] == "onnx-conversion" and fp16["opset"] >= 19
    assert fp16["saved_to"] == str(keep) and fp16["sha256"] == hashlib.sha256(keep.read_bytes()).hexdigest()
    # the kept model: Q/DQ kept (INT8 layers), FP16 weights and scales, FP32 network IO; it runs on the CPU
    model = onnx.load(str(keep))
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) == 8
    assert ModelIO.from_onnx(keep) == ModelIO.from_onnx(qdq)
    assert all(t.dtype == "float32" for t in result.metadata.io.outputs)
    feed = {"input_ids": np.ones((2, 16), np.int64), "attention_mask": np.ones((2, 16), np.int64)}
    out = make_session(keep).run(["logits"], feed)[0]
    assert out.dtype == np.float32 and np.isfinite(out).all()
    # trtexec: the converted model; --stronglyTyped on 10 only; never a precision flag
    cmd = data["trtexec"]
    assert cmd.startswith(f"trtexec --onnx={keep} ") and "--fp16" not in cmd and "--int8" not in cmd
    assert ("--stronglyTyped" in cmd) == (version == V10)


def test_fp16_without_fp16_onnx_writes_only_the_plan(text_models: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "out" / "model.plan"
    result = B.build_engine(text_models[1], out, build_opts(fp16=True, shapes=TEXT_SHAPES), builder=fake_builder(V11))
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.plan", "model.plan.json"]
    assert result.metadata.precision["fp16"]["saved_to"] is None
    assert f"--onnx={text_models[1].with_name('text.qdq.fp16.onnx')}" in result.metadata.trtexec


def test_fp16_failed_build_keeps_no_converted_model(models: tuple[Path, Path], tmp_path: Path) -> None:
    builder = fake_builder(V11)
    builder.trt._state["fail_build"] = "no implementation"
    keep = tmp_path / "m.fp16.onnx"
    with pytest.raises(TrtrepoError, match="no implementation"):
        B.build_engine(models[1], tmp_path / "model.plan", build_opts(fp16=True, fp16_onnx=str(keep)), builder=builder)
    assert not keep.exists() and not (tmp_path / "model.plan").exists()


def test_fp16_keep_fp32_ops_reach_the_conversion(text_models: tuple[Path, Path], tmp_path: Path) -> None:
    import onnx

    keep = tmp_path / "k.onnx"
    opts = build_opts(fp16=True, shapes=TEXT_SHAPES, keep_fp32_ops=("LayerNormalization",), fp16_onnx=str(keep))
    result = B.build_engine(text_models[1], tmp_path / "model.plan", opts, builder=fake_builder(V10))
    assert result.metadata.precision["fp16"]["keep_fp32_ops"] == ["LayerNormalization"]
    model = onnx.load(str(keep))
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert norms and all(types.get(n.output[0]) == onnx.TensorProto.FLOAT for n in norms)


def test_fp16_on_the_legacy_route_sets_the_builder_flag(models: tuple[Path, Path], tmp_path: Path) -> None:
    builder = fake_builder(V10)
    opts = build_opts(legacy_calibrator="entropy", fp16=True, data=DataOptions("demo:calib", limit=16))
    result = B.build_engine(models[0], tmp_path / "model.plan", opts, builder=builder)
    plan = builder.trt._state["builds"][-1]
    assert plan["builder_flags"] == ["FP16", "INT8"] and plan["network_flags"] == 0 and plan["float16_weights"] == 0
    assert result.metadata.precision_route == "implicit-int8-calibrator+fp16-flag"
    assert result.metadata.precision == {"mode": "int8+fp16", "fp16": {"method": "builder-flag", "flag": "BuilderFlag.FP16"}}
    assert "--int8 --fp16" in result.metadata.trtexec


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"keep_fp32_ops": ("Softmax",)}, "only apply with fp16=True"),
    ({"fp16_onnx": "x.onnx"}, "only apply with fp16=True"),
    ({"fp16": True, "legacy_calibrator": "entropy", "fp16_onnx": "x.onnx", "calib_cache": "c"}, "FP16 builder flag instead"),
])
def test_fp16_option_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        build_opts(**kwargs)


def test_trtexec_fp16_per_route_and_version() -> None:
    profile = {"input": B.ShapeRange((1, 3), (8, 3), (32, 3))}
    qdq = build_opts(fp16=True)
    assert "--stronglyTyped" in B.trtexec_command("m.fp16.onnx", "p", profile, qdq, 10)
    assert not any(a in ("--fp16", "--int8") for m in (10, 11) for a in B.trtexec_command("m.fp16.onnx", "p", profile, qdq, m))
    legacy = build_opts(fp16=True, legacy_calibrator="minmax", calib_cache="c.cache")
    cmd = B.trtexec_command("m.onnx", "p", profile, legacy, 10)
    assert cmd[cmd.index("--int8"):cmd.index("--int8") + 3] == ["--int8", "--fp16", "--calib=c.cache"]


def test_cli_fp16_print_trtexec_and_build(text_models: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qdq = str(text_models[1])
    shapes = ["--shape", "input_ids:1x8,8x64,32x128", "--shape", "attention_mask:1x8,8x64,32x128"]
    r = CliRunner().invoke(cli, ["build", qdq, "--fp16", "--print-trtexec", "--for-tensorrt", "11", *shapes])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[0].startswith("# --fp16: trtexec builds the Q/DQ model with its unquantized part in FP16")
    assert lines[1].startswith(f"trtexec --onnx={text_models[1].with_name('text.qdq.fp16.onnx')} ") and "--fp16" not in lines[1]
    monkeypatch.setattr(B.TensorRTEngineBuilder, "load", classmethod(lambda cls: fake_builder(V11)))
    out, keep = tmp_path / "model.plan", tmp_path / "t.fp16.onnx"
    r = CliRunner().invoke(cli, ["build", qdq, "-o", str(out), "--fp16", "--keep-fp32", "LayerNormalization,Softmax",
                                 "--fp16-onnx", str(keep), "--shape", "input_ids:1x8,8x64,32x128"])
    assert r.exit_code == 0, r.output
    assert "route: strongly-typed-qdq+fp16-onnx (int8+fp16)" in r.output and f"FP16-converted ONNX: {keep}" in r.output
    assert "input  attention_mask: int64 [-1, -1]  profile 1x8,8x64,32x128" in r.output  # range shared through 'sequence'
    assert PM.read_plan_metadata(out).precision["fp16"]["keep_fp32_ops"] == ["LayerNormalization", "Softmax"]


# -- several dynamic axes


def test_shared_symbolic_axis_takes_the_range_of_the_other_input() -> None:
    profile = B.profile_shapes(bert_io(), build_opts(shapes=(P.parse_shape_option("input_ids:1x8,8x64,32x128"),)))
    assert profile["attention_mask"] == profile["input_ids"] == B.ShapeRange((1, 8), (8, 64), (32, 128))


def test_shared_symbolic_axis_with_different_ranges_is_an_error() -> None:
    shapes = (P.parse_shape_option("input_ids:1x8,8x64,32x128"), P.parse_shape_option("attention_mask:1x8,8x32,32x128"))
    with pytest.raises(UsageError, match=r"inputs 'input_ids' and 'attention_mask' share the dynamic axis 'sequence' but give "
                                         r"it different ranges \(8,64,128 and 8,32,128\)"):
        B.profile_shapes(bert_io(), build_opts(shapes=shapes))


def test_unnamed_dynamic_axes_are_not_shared() -> None:
    a = TensorSpec("a", "int64", (-1, -1), 0, ("batch", None))
    b = TensorSpec("b", "int64", (-1, -1), 0, ("batch", None))
    io = ModelIO((a, b), (TensorSpec("y", "float32", (-1, 2), 0),))
    with pytest.raises(UsageError, match=r"input 'b' has dynamic axis 1 \(shape NxN\) with no range"):
        B.profile_shapes(io, build_opts(shapes=(P.parse_shape_option("a:1x8,8x64,32x128"),)))
    b_shape = P.parse_shape_option("b:1x4,8x4,32x4")  # unnamed axes may differ
    profile = B.profile_shapes(io, build_opts(shapes=(P.parse_shape_option("a:1x8,8x64,32x128"), b_shape)))
    assert profile["b"].max == (32, 4)


@pytest.mark.parametrize(("argv", "message"), [
    ([], r"input 'input_ids' has dynamic axis 1 \('sequence'\) .* with no range; give it with --shape input_ids:MIN,OPT,MAX"),
    (["--shape", "input_ids:1x8,8x64,32x32"], r"'--shape': 'input_ids:1x8,8x64,32x32': .*axis 1 needs min <= opt <= max \(8, 64, 32\)"),
    (["--shape", "token_ids:1x8,8x64,32x128"], r"--shape names unknown input\(s\) token_ids \(inputs: input_ids, attention_mask\)"),
    (["--shape", "input_ids:1x8,8x64,32x128", "--shape", "attention_mask:1x8,8x64,32x256"],
     r"share the dynamic axis 'sequence' but give it different ranges"),
])
def test_cli_profile_errors_on_demo_text(text_models: tuple[Path, Path], argv: list[str], message: str) -> None:
    import re

    r = CliRunner().invoke(cli, ["build", str(text_models[1]), "--print-trtexec", "--for-tensorrt", "10", *argv])
    assert r.exit_code == 2, r.output
    assert re.search(message, r.output), r.output
    assert len(r.output.strip().splitlines()) == 1


def test_demo_text_end_to_end_profile_metadata_and_triton_dims(text_models: tuple[Path, Path], tmp_path: Path) -> None:
    """demo-text (input_ids, attention_mask: int64 [batch, sequence]) -> profile per axis -> metadata -> engine IO read
    back (fake) -> the repository writer's Triton config: -1 on the sequence axis, max_batch_size from the profile."""
    from trtrepo.repository import add_plan_model

    qdq = text_models[1]
    plan = B.build_engine(qdq, tmp_path / "build" / "model.plan", build_opts(max_batch=32, shapes=TEXT_SHAPES),
                          builder=fake_builder(V11)).plan
    data = json.loads(PM.plan_metadata_path(plan).read_text())
    rng = {"min": [1, 8], "opt": [8, 64], "max": [32, 128]}
    assert data["profiles"] == [{"input_ids": rng, "attention_mask": rng}]
    axes = [{"axis": 0, "name": "batch", "min": 1, "opt": 8, "max": 32}, {"axis": 1, "name": "sequence", "min": 8, "opt": 64, "max": 128}]
    assert data["profile_axes"] == [{"input_ids": axes, "attention_mask": axes}]
    assert data["max_batch_size"] == 32
    assert [t["shape"] for t in data["io_tensors"]] == [[-1, -1], [-1, -1], [-1, 4], [-1, 64]]
    meta = PM.read_plan_metadata(plan)
    assert meta.io == ModelIO.from_onnx(qdq)
    result, cfg = add_plan_model(tmp_path / "repo", "text", plan)
    assert cfg.max_batch_size == 32
    assert {t.name: list(t.dims) for t in cfg.inputs} == {"input_ids": [-1], "attention_mask": [-1]}
    assert {t.name: list(t.dims) for t in cfg.outputs} == {"logits": [4], "embedding": [64]}
    assert 'data_type: TYPE_INT64' in result.config_text and "max_batch_size: 32" in result.config_text
    from trtrepo.tritonconfig import ModelOptions

    with pytest.raises(UsageError, match="engine only supports max-batch 32"):
        add_plan_model(tmp_path / "repo", "text", plan, options=ModelOptions(max_batch_size=64))


def test_plan_metadata_has_one_reader_and_writer(models: tuple[Path, Path], tmp_path: Path) -> None:
    """model.plan.json is read and written only through trtrepo.contracts.plan: what the build
    writes reads back equal, and the repository writer, the server command and the compatibility
    check all take the same PlanMetadata."""
    from trtrepo import repository, server
    from trtrepo.contracts.plan import PlanMetadata, read_plan_metadata

    assert read_plan_metadata(tmp_path / "none.plan", missing_ok=True) is None
    plan = B.build_engine(models[1], tmp_path / "model.plan", build_opts(), builder=fake_builder()).plan
    meta = read_plan_metadata(plan)
    assert meta is not None and meta.to_dict() == json.loads(PM.plan_metadata_path(plan).read_text())
    assert PlanMetadata.from_dict(meta.to_dict()) == meta
    assert {n: r.to_dict() for n, r in meta.profile_named("0").items()} == {
        "input": {"min": [1, 1, 32, 32], "opt": [8, 1, 32, 32], "max": [32, 1, 32, 32]}}
    result, cfg = repository.add_plan_model(tmp_path / "repo", "demo", plan)
    assert cfg.max_batch_size == meta.max_batch_size == 32
    assert server.plan_tensorrt_versions(tmp_path / "repo") == {meta.tensorrt_version}
    # the hardware-compatibility flag lifts the compute capability check, and nothing else
    lifted = PlanMetadata.from_dict({**meta.to_dict(), "hardware_compatibility": True})
    a100 = PM.GPUInfo("NVIDIA A100", "8.0")
    assert PM.check_plan_compatibility(meta, None, a100) and not PM.check_plan_compatibility(lifted, None, a100)
    assert PM.check_plan_compatibility(lifted, V11, a100)[0].startswith("plan was built with TensorRT")

    (tmp_path / "bad.plan.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="must be a JSON object"):
        read_plan_metadata(tmp_path / "bad.plan")
    (tmp_path / "bad.plan.json").write_text("{")
    with pytest.raises(UsageError, match="bad.plan.json: plan metadata is not valid JSON"):
        read_plan_metadata(tmp_path / "bad.plan")
    incomplete = {k: v for k, v in meta.to_dict().items() if k != "io"}
    (tmp_path / "bad.plan.json").write_text(json.dumps(incomplete))
    with pytest.raises(UsageError, match=r"bad.plan.json: incomplete plan metadata \(missing 'io'\)"):
        read_plan_metadata(tmp_path / "bad.plan")
    (tmp_path / "bad.plan").write_bytes(b"engine")
    with pytest.raises(UsageError, match="bad.plan.json: incomplete"):
        repository.add_plan_model(tmp_path / "repo", "bad", tmp_path / "bad.plan", io=meta.io)
