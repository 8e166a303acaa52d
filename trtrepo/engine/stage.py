"""The build stage: prepare the profile, build through an :class:`~trtrepo.engine.routes.EngineBuilder`,
write ``model.plan`` and ``model.plan.json`` together; plan compatibility warnings; the trtexec
equivalent of a build."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..contracts.plan import (
    GPUInfo,
    PlanMetadata,
    check_plan_compatibility,
    plan_metadata_path,
    read_plan_metadata,
)
from ..contracts.profile import BUILD_FLAGS, BatchProfile, ShapeRange
from ..errors import OptionError, TrtrepoError, UsageError
from ..evaluate import detection_layout
from ..fp16 import convert_file
from ..fsutil import atomic_path, atomic_write_bytes, temp_dir
from ..modelio import ModelIO, load_onnx, qdq_counts
from ..onnxgraph import make_session
from ..tritonconfig import NmsSettings
from .calib_feed import CalibrationFeed, calibration_batches, check_calibration_inputs
from .env import gpu_status, tensorrt_major, tensorrt_status
from .nms_plugin import write_efficient_nms
from .options import ROUTE_IMPLICIT, ROUTE_QDQ, SETTINGS, BuildOptions, profile_shapes
from .routes import EngineBuilder, EngineIO, TensorRTEngineBuilder
from .trtexec import trtexec_command

log = logging.getLogger(__name__)


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
    return sum(qdq_counts(onnx_path))


def _onnx_calibration_method(onnx_path: Path) -> str | None:
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
        raise OptionError("", f"{onnx_path}: the model has no QuantizeLinear/DequantizeLinear nodes, so the strongly typed "
                          "build would give an FP32 engine; run 'trtrepo quantize' first, use {legacy_calibrator} "
                          "(TensorRT <= 10), or pass {allow_fp32}", others=SETTINGS)
    if options.route == ROUTE_IMPLICIT and qdq > 0:
        raise OptionError("", f"{onnx_path}: the model already has {qdq} Q/DQ nodes; {{legacy_calibrator}} needs the FP32 "
                          "model (build the Q/DQ model without {legacy_calibrator})", others=SETTINGS)
    return io, profile_shapes(io, options)


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

    onnx_path = Path(onnx_path)
    output = Path(output)
    if not force and output.exists():
        raise OptionError("", f"{output}: already exists (use {{force}} to overwrite)", others=SETTINGS)
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

    fp16_info: dict[str, Any] | None = None
    if options.fp16 and options.legacy_calibrator:
        fp16_info = {"method": "builder-flag", "flag": "BuilderFlag.FP16"}
    with contextlib.ExitStack() as stack:
        build_onnx, converted = _fp16_onnx(stack, onnx_path, io, options)
        fp16_info = converted or fp16_info
        feed = _calibration_feed(stack, options, io, profile, builder)
        plan, new_timing_cache = builder.build(build_onnx, profile, options, feed, timing_cache)
        if feed is not None and not feed.cache_used and feed.batches_served == 0:
            raise TrtrepoError("TensorRT got no calibration batches and no usable cache; the INT8 ranges would be missing")
        fp16_bytes = build_onnx.read_bytes() if options.fp16_onnx and build_onnx != onnx_path else None
    engine_io = builder.inspect(plan)
    if options.fp16:
        check_engine_io_types(engine_io, io, str(onnx_path))
    model_io = engine_io.to_model_io(io, source=str(output))
    trtexec = shlex.join(trtexec_command(_trtexec_onnx(onnx_path, options), output, engine_io.profile or profile,
                                         options, major))
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
    meta_path, tc_path, calib_path = _write_build(output, plan, meta, options, (fp16_bytes, new_timing_cache), force)
    return BuildResult(output, meta_path, meta, tc_path, calib_path)


def _fp16_onnx(stack: contextlib.ExitStack, onnx_path: Path, io: ModelIO,
               options: BuildOptions) -> tuple[Path, dict[str, Any] | None]:
    """The ONNX model TensorRT builds and, when converted, how. Decision: ``--fp16`` on the Q/DQ
    route converts the model (:func:`convert_for_fp16`) into a temporary folder, kept
    (--fp16-onnx) only once the engine is built; otherwise the model itself."""
    if not (options.fp16 and options.route == ROUTE_QDQ):
        return onnx_path, None
    tmpdir = Path(stack.enter_context(temp_dir("fp16")))
    build_onnx = tmpdir / fp16_onnx_default(onnx_path).name
    fp16_info = convert_for_fp16(onnx_path, build_onnx, io, options)
    fp16_info["saved_to"] = options.fp16_onnx
    return build_onnx, fp16_info


def _calibration_feed(stack: contextlib.ExitStack, options: BuildOptions, io: ModelIO, profile: Any,
                      builder: EngineBuilder) -> CalibrationFeed | None:
    """Decision: only the implicit (legacy calibrator) route feeds TensorRT calibration batches
    (from the data, or none: the cache alone), at the profile's opt shapes."""
    if options.route != ROUTE_IMPLICIT:
        return None
    batches = calibration_batches(options, io, profile) if options.data is not None else None
    shapes = {name: r.opt for name, r in profile.items()}
    for spec in io.inputs:
        shapes.setdefault(spec.name, spec.shape)
    return stack.enter_context(CalibrationFeed(batches, options.opt_batch, builder.cuda(), shapes,
                                               options.legacy_calibrator or "entropy", builder.tensorrt_version,
                                               options.calib_cache))


def _trtexec_onnx(onnx_path: Path, options: BuildOptions) -> Path:
    """The model the equivalent trtexec command builds: the FP16 conversion where one was made
    (where --fp16-onnx kept it, else its default name), else the model itself."""
    if options.fp16 and options.route == ROUTE_QDQ:
        return Path(options.fp16_onnx) if options.fp16_onnx else fp16_onnx_default(onnx_path)
    return onnx_path


def _write_build(output: Path, plan: bytes, meta: PlanMetadata, options: BuildOptions,
                 extra: tuple[bytes | None, bytes | None], force: bool) -> tuple[Path, Path | None, Path | None]:
    """The plan and its metadata (together, atomically), then the kept FP16 model and the new
    timing cache (``extra``); returns (metadata, timing cache, calibration cache) paths, each
    cache only when written or there."""
    fp16_bytes, new_timing_cache = extra
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
    return meta_path, tc_path, calib_path


# --------------------------------------------------------------------------------------------
# TensorRT's detector route beside a detector's plan: NMS in the plan (nms_plugin)


def _same_profile(meta: PlanMetadata) -> BatchProfile:
    """The batch range and shape ranges ``meta``'s engine was built with (its profile 0)."""
    ranges = dict(meta.profile)
    batched = meta.io.has_batch_axis
    first = next(iter(ranges.values()), None)
    if batched and first is not None:
        return BatchProfile(first.min[0], first.opt[0], first.max[0], tuple(ranges.items()), True, BUILD_FLAGS)
    return BatchProfile(shapes=tuple(ranges.items()), batched=batched)


def build_efficient_nms(plan: str | Path, output: str, num_classes: int | None = None, nms: NmsSettings | None = None, *,
                        builder: EngineBuilder | None = None) -> BuildResult:
    """Beside a detector's ``plan`` (with its ``model.plan.json``), TensorRT's usual route: the same
    ONNX model (``source_onnx`` of the metadata) with NMS as the EfficientNMS plugin
    (:func:`~trtrepo.engine.nms_plugin.write_efficient_nms` on the raw head ``output``, written to
    ``nms/model.onnx`` beside the plan), built with the same profile, workspace and optimization
    level into ``nms/model.plan``; a plan built with ``--fp16`` (the ONNX conversion) has its
    detector part converted the same way first, since the converter checks the graph and knows no
    plugin op. The head's layout is read off one ONNX Runtime run at
    the profile's smallest shapes (an export's channel axis may be symbolic), with ``num_classes``
    when the exporter names them (:func:`trtrepo.evaluate.detection_layout`)."""
    plan = Path(plan)
    meta = read_plan_metadata(plan)
    assert meta is not None  # missing_ok is False: a missing file raises
    src = Path(meta.source_onnx)
    if meta.precision_route.startswith(ROUTE_IMPLICIT):
        raise UsageError(f"{plan}: built by the legacy calibrator route ({meta.precision_route}); rebuilding it with "
                         f"the EfficientNMS plugin would need the calibration again: apply "
                         f"trtrepo.engine.write_efficient_nms to {src.name} and build that with the same calibrator")
    if not src.is_file():
        raise UsageError(f"{plan}: the ONNX model it was built from ({src}) is gone; the EfficientNMS route rebuilds from it")
    session = make_session(str(src))
    feed = {}
    for spec in meta.io.inputs:
        shape = meta.profile[spec.name].min if spec.name in meta.profile else spec.shape
        feed[spec.name] = np.zeros([1 if d < 0 else d for d in shape], np.dtype(spec.dtype))
    names = [o.name for o in session.get_outputs()]
    if output not in names:
        raise UsageError(f"{src}: no output '{output}' (outputs: {', '.join(names)})")
    shape = session.run([output], feed)[0].shape
    layout = detection_layout(shape, num_classes)
    folder = plan.parent / "nms"
    fp16 = (meta.precision or {}).get("fp16")
    if isinstance(fp16, dict) and fp16.get("method") == "onnx-conversion":
        # converted before the plugin node is added (the converter's checker knows no plugin op);
        # the plugin's inputs stay float32 (the transform casts a float16 head output)
        keep = tuple(fp16.get("keep_fp32_ops") or ())
        converted = folder / "detector.fp16.onnx"
        with atomic_path(converted) as tmp:
            convert_for_fp16(src, tmp, ModelIO.from_onnx(src), BuildOptions(fp16=True, keep_fp32_ops=keep))
        src = converted
    nms_onnx = write_efficient_nms(src, folder / "model.onnx", layout, nms, output)
    build = dict(meta.build)
    options = BuildOptions(profile=_same_profile(meta), workspace=build.get("workspace_bytes"),
                           opt_level=int(build.get("builder_optimization_level", 3)), allow_fp32=True)
    return build_engine(nms_onnx, folder / "model.plan", options, builder=builder)
