"""``trtrepo deploy``: export -> INT8 (calibrate + quantize) -> build -> repository, as steps.

Each step is a function that records a :class:`StepResult`; the command prints them as the
summary table. The INT8 and build stages are reached through one call point each
(:func:`_int8_step` calls ``trtrepo.quantize.quantize_for_deploy``, :func:`_build_step` calls
``trtrepo.engine.build_engine`` when TensorRT and a GPU are present); when a stage cannot run
here, the step says why and the deploy continues with what it has (FP32 ONNX without
calibration data, ONNX Runtime backend without TensorRT), so the main job works on any machine.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import quantize
from .contracts import backends, builtin
from .contracts.location import is_remote
from .contracts.profile import BatchProfile
from .cpu import CpuInt8, cpu_int8
from .data import DataOptions, DataSource, Preprocess
from .engine import BuildOptions, build_efficient_nms, build_engine, gpu_status, tensorrt_status
from .errors import OptionError, UsageError
from .evaluate import detection_layout
from .export import export_onnx, resolve_inputs
from .fsutil import temp_dir
from .modelio import ModelIO, load_onnx, qdq_counts
from .modelsource import resolve_source
from .objectstore import checkout, open_store, publish
from .onnxgraph import make_session
from .preprocessing import exporter_preprocess
from .progress import status, task
from .qdq import NothingToQuantize, backend_target, detector_outputs
from .quantize import QuantizeRequest, QuantizeRunResult, QuantizeSettings, quantize_request
from .quantize.front import FrontOptions, QualityFront
from .quantsummary import QuantizeSummary
from .repository import (
    WriteResult,
    add_detector_ensemble,
    add_image_ensemble,
    add_onnx_model,
    add_plan_model,
    check_file_loads,
    type_problem,
)
from .server import local_backends, missing_backend_warning
from .tritonconfig import ModelConfig, ModelOptions, NmsSettings, check_model_name, execution_env_warning
from .warngroups import WarningGroup, collecting

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "int8", "fp32")


@dataclass(frozen=True)
class DeployOptions:
    source: str = "demo"
    repo: str = "model_repository"
    name: str | None = None
    backend: str = "auto"
    python_variant: bool = False
    ensemble: bool = False
    precision: str = "auto"
    data: DataOptions | None = None  # --data and how to open it (spec "": none; the demos' own split then)
    int8: QuantizeSettings = field(default_factory=QuantizeSettings)  # the INT8 request (trtrepo quantize's)
    class_labels: str | None = None  # labels file for the classification output
    model: ModelOptions = field(default_factory=ModelOptions)
    version: int | None = None
    force: bool = False
    template_dir: str | None = None
    workdir: str | None = None
    weights: str | None = None
    shapes: tuple[Any, ...] = ()  # TensorRT profile per input: (name, ShapeRange) or NAME:MIN,OPT,MAX (default: from the data)
    input_shapes: tuple[str, ...] = ()  # --input-shape of a PyTorch source (default: from --data)
    output_names: tuple[str, ...] = ()  # --output-names of a PyTorch source (default: output, output0, ...)
    s3_endpoint: str | None = None  # --s3-endpoint of an s3:// --repo (trtrepo.objectstore)

    def __post_init__(self) -> None:
        if self.backend != "auto" and backends.for_option(self.backend) is None:
            raise OptionError("backend", f"{self.backend!r}: one of {', '.join(('auto', *backends.options()))}")
        if self.precision not in PRECISIONS:
            raise OptionError("precision", f"{self.precision!r}: one of {', '.join(PRECISIONS)}")
        if self.name is not None:
            check_model_name(self.name, "--name")
        if self.int8.cache is not None and not Path(self.int8.cache).is_file():
            raise OptionError("cache", f"{self.int8.cache}: file not found", concept="the calibration cache")


@dataclass
class StepResult:
    step: str
    status: str  # done | skipped | fallback
    detail: str
    seconds: float = 0.0


@dataclass
class DeployedModel:
    name: str
    version: int
    backend: str
    precision: str
    path: Path | str  # the version folder, or its URL in an s3:// repository
    note: str = ""
    replaced: bool = False  # --force replaced an existing version


@dataclass
class DeployReport:
    steps: list[StepResult] = field(default_factory=list)
    models: list[DeployedModel] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # printed on stderr (a backend the local server lacks, ...)
    repo: Path | str = Path("model_repository")  # a local folder, or an s3:// URL
    accuracy: QuantizeSummary | None = None  # what INT8 cost, measured on held-out data (None: not quantized here)
    # the INT8 step's warnings that repeat per layer, by cause (trtrepo.warngroups): one logged line
    # each, the details in --json's warnings
    quantize_warnings: tuple[WarningGroup, ...] = ()
    front: QualityFront | None = None  # INT8 everywhere failed the check: the accuracy/speed front searched


    def warnings_json(self) -> list[dict[str, Any]]:
        """``warnings`` of ``deploy --json``: one object per warning, ``cause`` and ``message``
        always; the grouped ones add their counts, whether their model was shipped and the details."""
        return [*({"cause": "deploy", "message": w} for w in self.warnings),
                *(g.to_dict() for g in self.quantize_warnings)]

    def summary_lines(self) -> list[str]:
        lines = [f"{'step':<11} {'status':<9} {'time':>7}  detail"]
        for s in self.steps:
            lines.append(f"{s.step:<11} {s.status:<9} {s.seconds:>6.1f}s  {s.detail}")
        lines.append("")
        lines.append(f"{'model':<24} {'version':>7}  {'backend':<21} {'precision':<10} path")
        for m in self.models:
            lines.append(f"{m.name:<24} {m.version:>7}  {m.backend:<21} {m.precision:<10} {m.path}")
        if self.accuracy is not None:
            lines.append("")
            lines.append(f"INT8 vs FP32 ({self.accuracy.target} target; shipped {self.accuracy.shipped.upper()}):")
            lines.extend(f"  {line}" for line in self.accuracy.summary_lines())
        if self.front is not None:
            lines.append("")
            lines.extend(self.front.summary_lines())
        lines.extend(f"note: {n}" for n in self.notes)
        return lines


@contextlib.contextmanager
def _timed(report: DeployReport, step: str) -> Iterator[StepResult]:
    result = StepResult(step, "done", "")
    number = f"[{len(report.steps) + 1}/{len(DEPLOY_STEPS)}]"
    status("%s %s ...", number, step)
    t0 = time.perf_counter()
    try:
        yield result
    except BaseException:
        result.status = "failed"
        raise
    finally:
        result.seconds = time.perf_counter() - t0
        report.steps.append(result)
        status("%s %s %s in %.1fs%s", number, step, result.status, result.seconds,
               f": {result.detail}" if result.detail else "")


DEPLOY_STEPS = ("export", "int8", "build", "repository")


def default_name(source: str) -> str:
    if source in builtin.names():
        return source.replace("-", "_")
    base = Path(source).stem if ("/" in source or "." in Path(source).name and ":" not in source) else source.rsplit(":", 1)[-1].split(".")[-1]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", base) or "model"
    if not re.match(r"[A-Za-z0-9_]", name):
        name = "_" + name
    return check_model_name(name[:128], "model name (from the source; give --name)")


def _resolve_backend(opts: DeployOptions, report: DeployReport) -> str:
    if opts.backend != "auto":
        return opts.backend
    trt = tensorrt_status()
    gpu = gpu_status() if trt.available else None
    if trt.available and gpu is not None and gpu.available:
        return "tensorrt"
    why = f"TensorRT {trt.detail}" if not trt.available else f"no GPU ({gpu.detail if gpu else 'unknown'})"

    backends = local_backends()
    if backends is not None and "onnxruntime" not in backends and "python" in backends:
        report.notes.append(f"backend auto -> python: {why}; the tritonserver here has no onnxruntime backend "
                            f"(backends: {', '.join(sorted(backends))}), so the model runs ONNX Runtime inside the Python backend")
        return "python"
    report.notes.append(f"backend auto -> onnxruntime: {why}")
    return "onnxruntime"


def _export_step(opts: DeployOptions, work: Path, report: DeployReport) -> tuple[Path, ModelIO]:
    with _timed(report, "export") as step:
        src = resolve_source(opts.source, opts.weights)
        data = None
        if src.is_torch and not opts.input_shapes and _given(opts.data) and builtin.builtin(src.kind) is None:
            data = opts.data.open()  # type: ignore[union-attr]
        inputs, axes = resolve_inputs(src, opts.input_shapes, data)
        if opts.output_names and (not src.is_torch or builtin.builtin(src.kind) is not None):
            raise OptionError("output_names", f"does not apply to {opts.source} (its outputs are named already)",
                              concept="naming the outputs")
        result = export_onnx(src, work / "model.onnx", inputs=inputs, dynamic_axes=axes or None,
                             output_names=list(opts.output_names) or None)
        checked = f", max abs error vs PyTorch {result.max_abs_error:.2g}" if result.max_abs_error is not None else ""
        step.detail = f"{src.describe()} -> ONNX{checked}"
        report.notes.extend(n for n in result.notes if "--input-shape" in n)
    return result.path, result.io


class CalibrationData:
    """The deploy's calibration data (``--data``, else a built-in model's own split), opened once
    on first use and shared by the INT8 step and the build step's shape ranges."""

    def __init__(self, opts: DeployOptions, io: ModelIO) -> None:
        self.spec = _default_data(opts)
        self._eval, self._io = opts.int8.eval_data, io
        self._how, self._eval_labels = (opts.data or DataOptions(spec="")).labels_beside(self._eval)
        self._source: Any = None

    def source(self) -> Any:
        if self.spec is None:
            return None
        if self._source is None:
            self._source = replace(self._how, spec=self.spec).open(self._io)
        return self._source

    def eval_source(self) -> Any:
        """The evaluation data opened like the data (same preprocessing; box labels go with it,
        :meth:`DataOptions.labels_beside`), or None."""
        if self._eval is None or isinstance(self._eval, DataSource):
            return self._eval
        return DataOptions(spec=self._eval, preprocess=self._how.preprocess, labels=self._eval_labels, seed=None,
                           skip_non_images=self._how.skip_non_images).open(self._io)

    def skipped(self) -> list[str]:
        """Files of an image folder skipped by --skip-non-images (empty when not opened)."""
        return [str(p) for p in getattr(self._source, "skipped", None) or []]


def _int8_step(opts: DeployOptions, onnx_path: Path, io: ModelIO, int8: QuantizeSettings, work: Path,
               report: DeployReport, calibration: CalibrationData | None = None) -> tuple[Path, str]:
    """The single call point of calibration + quantization, for ``int8``: the request with its
    placement resolved for the backend (:func:`int8_for_backend`). Returns (model to deploy, precision)."""

    with _timed(report, "int8") as step:
        qdq = qdq_counts(onnx_path)
        if sum(qdq) > 0:  # already quantized (trtrepo quantize, ModelOpt, NNCF, ...): deployed as given
            if opts.precision == "fp32" or int8.given:
                raise OptionError("", f"{opts.source}: already a Q/DQ INT8 model ({qdq[0]} Q, {qdq[1]} DQ nodes); "
                                  "{precision} fp32, {cache} and {ranges} do not apply",
                                  others={"precision": "precision", "cache": "a calibration cache",
                                          "ranges": "a ranges file"})
            step.status = "done"
            step.detail = f"Q/DQ model given ({qdq[0]} QuantizeLinear, {qdq[1]} DequantizeLinear): deployed as is"
            report.notes.append("INT8 accuracy vs FP32 was NOT measured (a quantized model was given; "
                                "compare with 'trtrepo evaluate FP32.onnx QDQ.onnx')")
            return onnx_path, "int8"
        if opts.precision == "fp32":
            step.status, step.detail = "skipped", "--precision fp32"
            return onnx_path, "fp32"
        calibration = calibration or CalibrationData(opts, io)
        try:
            # one line per warning cause for the whole step (not per candidate the step tries);
            # those of an INT8 model that is not shipped say so
            # one progress task for the step too (trtrepo.progress: the phases of quantize_request)
            with collecting(log, where="deploy --json's warnings") as run, task("int8"):
                path, precision = _quantize(opts, onnx_path, int8, work, report, step, calibration)
                if precision != "int8":
                    run.not_shipped("the FP32 model was deployed")
                report.quantize_warnings = run.groups()
            return path, precision
        except NothingToQuantize as exc:  # a model INT8 cannot speed up: FP32, saying why
            if opts.precision == "int8":
                raise OptionError("precision", f"int8: {exc.message}") from exc
            step.status, step.detail = "fallback", f"{exc.message}: deploying the FP32 ONNX model"
            return onnx_path, "fp32"


def _quantize(opts: DeployOptions, onnx_path: Path, int8: QuantizeSettings, work: Path, report: DeployReport, step: Any,
              calibration: CalibrationData) -> tuple[Path, str]:
    """Quantize with given ranges or by calibrating on the data; FP32 without data."""

    data = calibration.spec
    target = int8.placement.target.name
    if int8.given:  # ranges computed earlier (trtrepo calibrate): no calibration here
        return _int8_from_ranges(opts, onnx_path, int8, work, report, step, calibration)
    if data is None:
        if int8.eval_data is not None:
            raise OptionError("eval_data", f"{int8.eval_data}: evaluates the INT8 model that {{data_spec}} calibrates; "
                              "give it too", others={"data_spec": "the data"})
        if opts.precision == "int8":
            raise OptionError("precision", "int8: no calibration data (give {data_spec})", others={"data_spec": "data"})
        step.status, step.detail = "fallback", "no calibration data (give --data): deploying the FP32 ONNX model"
        return onnx_path, "fp32"
    source = calibration.source()
    # the stage writes a model that fails the check too: deploy decides (_ship_or_fall_back)
    result = quantize.quantize_for_deploy(QuantizeRequest(
        onnx_path, work / "model.int8.onnx", data=source, int8=replace(int8, accept_accuracy_loss=True,
                                                                          eval_data=calibration.eval_source()),
        batch_size=_batch_size(opts), front=front_options(opts, int8)))
    metric = int8.metric_output
    method = f", {result.method}" + (f" chosen on {metric}" if metric else "") if result.method else ""
    alpha = result.report.smooth_quant.alpha
    if alpha is not None:
        method += f", smooth-quant {alpha}"
    step.detail = f"Q/DQ INT8 for {target} on {data} ({len(source)} samples{method})"
    return _ship_or_fall_back(result, opts, onnx_path, step, report, "too few samples to hold some out")


def _batch_size(opts: DeployOptions) -> int:
    return opts.data.batch_size if opts.data is not None else DataOptions(spec="").batch_size


def _given(data: DataOptions | None) -> bool:
    return data is not None and bool(data.spec)


def front_options(opts: DeployOptions, int8: QuantizeSettings) -> FrontOptions | None:
    """The accuracy/speed front searched when INT8 everywhere fails the check (not with
    --accept-accuracy-loss, which ships all-INT8, nor with --accuracy-target, which chooses the
    layers itself): timed on the CPU for a target whose runtime is ONNX Runtime's integer kernels
    (TensorRT's speed is the engine's to measure); ``front.png`` and ``quantize.json`` go to
    --workdir, else to ``deploy-NAME`` beside a local repository (``trtrepo tune``'s
    ``tune-NAME`` convention), else to ``deploy-NAME`` in the current folder."""
    if int8.accept_accuracy_loss or int8.accuracy_target:
        return None
    name = opts.name or default_name(opts.source)
    folder = Path(opts.workdir) if opts.workdir else (
        Path.cwd() if is_remote(opts.repo) else Path(opts.repo).resolve().parent) / f"deploy-{name}"
    return FrontOptions(measure_speed=int8.placement.target.integer_kernels, report_dir=folder)


def _ship_or_fall_back(result: QuantizeRunResult, opts: DeployOptions, onnx_path: Path, step: Any, report: DeployReport,
                       unmeasured: str) -> tuple[Path, str]:
    """The INT8 model, or the FP32 one when the check against FP32 failed (unless
    --accept-accuracy-loss); ``unmeasured`` says why when there was no check. When INT8
    everywhere failed, the front (``result.report.front``) decided: its candidate ships, or FP32
    with its reason."""
    check = result.report.accuracy_check
    front = report.front = result.report.front
    if front is not None:
        where = f"; the front: {front.plot}" if front.plot is not None else ""
        if front.shipped is not None:
            step.detail += (f"; INT8 everywhere FAILED the held-out check vs FP32: {front.reason}{where}")
            report.notes.append(f"INT8 with {front.shipped.k} layer(s) in float: {front.reason}")
        else:
            step.detail += f"; {front.reason}"
            report.notes.append(f"{front.reason}{where}")
    failed = check is not None and check.ok is False
    accept = opts.int8.accept_accuracy_loss
    report.accuracy = result.report.accuracy_summary(shipped="fp32" if failed and not accept else "int8")
    if check is not None and failed:
        failures = "; ".join(check.failures)
        if not accept:
            step.status = "fallback"
            step.detail += f"; INT8 FAILED the held-out check vs FP32 ({failures}): deploying the FP32 model " \
                           "(--accept-accuracy-loss ships the INT8 model anyway)"
            report.notes.append(f"INT8 not shipped: {failures}")
            log.warning("INT8 ACCURACY LOSS: %s; deploying FP32 instead", failures)
            return onnx_path, "fp32"
        report.notes.append(f"INT8 shipped with --accept-accuracy-loss although {failures}")
    elif check is not None and check.ok is True:
        verdict = check.verdict or {}
        figures = f" ({verdict['message']})" if verdict.get("message") else ""
        step.detail += f"; held-out check vs FP32 on '{check.output}' passed{figures}"
    else:
        report.notes.append(f"INT8 accuracy vs FP32 was NOT measured ({unmeasured})")
    if check is not None:  # other outputs: measured and named, not gated
        report.notes.extend(f"INT8 {below} (not gated: the check is on '{check.output}'; --metric-output picks it)"
                            for below in check.ungated_below_floor)
    return result.path, "int8"


def _int8_from_ranges(opts: DeployOptions, onnx_path: Path, int8: QuantizeSettings, work: Path, report: DeployReport,
                      step: Any, calibration: CalibrationData) -> tuple[Path, str]:
    """Given ranges (a ranges file or a calibration cache): quantize with them (no calibration);
    with data the held-out check against FP32 runs on it, else the report says accuracy was NOT
    measured."""

    flag = "--ranges" if int8.ranges is not None else "--cache"
    result = quantize_request(QuantizeRequest(
        onnx_path, work / "model.int8.onnx", data=calibration.source(),
        int8=replace(int8, accept_accuracy_loss=True, eval_data=calibration.eval_source()),
        batch_size=_batch_size(opts), front=front_options(opts, int8)))
    step.detail = f"Q/DQ INT8 for {int8.placement.target.name} from {flag} {int8.given} (no calibration)"
    return _ship_or_fall_back(result, opts, onnx_path, step, report, f"{flag} without --data")


def _default_data(opts: DeployOptions) -> str | None:
    """The calibration data: --data, else the built-in demos' own calibration split."""
    plugin = builtin.builtin(opts.source)
    return opts.data.spec if _given(opts.data) else (plugin.calib_spec if plugin is not None else None)  # type: ignore[union-attr]


def batch_profile(opts: DeployOptions, io: ModelIO | None = None, source: Any = None) -> BatchProfile:
    """The deploy's :class:`~trtrepo.contracts.profile.BatchProfile`: ``--max-batch-size`` and
    ``--shape`` (:meth:`~trtrepo.contracts.profile.BatchProfile.for_deploy`), completed from the
    data's sizes for inputs with dynamic non-batch axes that ``--shape`` leaves out. With ``io``,
    ``--max-batch-size`` N >= 1 is refused on a model without a batch axis."""
    profile = BatchProfile.for_deploy(opts.model.max_batch_size, opts.shapes)
    if io is not None and profile.batched and opts.model.max_batch_size and not io.has_batch_axis:
        raise OptionError("max_batch_size", f"{opts.model.max_batch_size}: the model has no dynamic batch axis 0 on "
                          "every input and output; give {max_batch_size} 0",
                          others={"max_batch_size": "the max batch size"})
    if io is not None and source is not None:
        profile = profile.with_data_shapes(io, source)
    return profile


def build_options(opts: DeployOptions, io: ModelIO, source: Any = None) -> Any:
    """The :class:`trtrepo.engine.BuildOptions` of the deploy build step (:func:`batch_profile`)."""

    return BuildOptions(profile=batch_profile(opts, io, source))


def _check_serving(opts: DeployOptions, spec: backends.BackendSpec, onnx_path: Path, io: ModelIO,
                   report: DeployReport) -> None:
    """Before any work: the model's tensor types fit the backend (and the Python variant's), and
    the runtime that will serve it loads it (the repository step checks again what it writes);
    the message names the source."""
    tensors = [("input", t.name, t.triton_dtype) for t in io.inputs] + [("output", t.name, t.triton_dtype) for t in io.outputs]
    served = [(spec, "")]
    if opts.python_variant and spec is not backends.PYTHON:
        served.append((backends.PYTHON, " (its Python-backend copy, --python-backend)"))
    for s, which in served:
        problem = type_problem(s, tensors)
        if problem:
            raise UsageError(f"{opts.source}{which}: {problem}; nothing deployed")
    gpu = opts.model.instance_kind.upper().removeprefix("KIND_") == "GPU"
    for s, which in served:
        report.warnings.extend(check_file_loads(onnx_path, s, gpu=gpu and s is spec, shown=f"{opts.source}{which}",
                                                what="nothing deployed"))


def _build_step(opts: DeployOptions, onnx_path: Path, backend: str, work: Path, report: DeployReport,
                io: ModelIO | None = None, calibration: CalibrationData | None = None) -> Path | None:
    """The single call point of the TensorRT build. Returns the plan, or None when not built."""
    with _timed(report, "build") as step:
        spec = backends.for_option(backend)
        if spec is None or not spec.engine:
            step.status, step.detail = "skipped", f"backend {backend}: no TensorRT engine needed"
            return None

        trt = tensorrt_status()
        if not trt.available:
            raise OptionError("backend", f"tensorrt: TensorRT {trt.detail}; use {{backend}} onnxruntime or python",
                              others={"backend": "the backend"})
        gpu = gpu_status()
        if not gpu.available:
            raise OptionError("backend", f"tensorrt: no GPU ({gpu.detail}); use {{backend}} onnxruntime or python",
                              others={"backend": "the backend"})
        source = None
        if io is not None and not opts.shapes:
            source = (calibration or CalibrationData(opts, io)).source()
        bopts = build_options(opts, io or ModelIO.from_onnx(_load(onnx_path)), source)
        result = build_engine(onnx_path, work / "model.plan", bopts)
        profile = "; ".join(f"{n} {r.describe()}" for n, r in bopts.shapes)
        step.detail = (f"TensorRT {trt.version} on {gpu.gpu.name if gpu.gpu else 'GPU'} -> model.plan"
                       + (f" (profile {profile})" if profile else ""))
        return Path(result.plan)


def _load(path: Path) -> Any:
    import onnx

    return onnx.load(str(path), load_external_data=False)


def _labels(opts: DeployOptions) -> Any:
    if opts.class_labels:
        return opts.class_labels
    plugin = builtin.builtin(opts.source)
    return list(plugin.class_labels) if plugin is not None and plugin.class_labels else None


def _preprocess_spec(opts: DeployOptions, exported: Preprocess | None) -> Any:
    """The ensemble's preprocessing: the data's spec, a built-in model's, else ``exported``
    (:func:`exporter_preprocess`, read once by :func:`deploy`)."""
    if opts.data is not None and opts.data.preprocess:
        pre = opts.data.preprocess
        return pre if isinstance(pre, Preprocess) else Preprocess.load(pre)
    plugin = builtin.builtin(opts.source)
    if plugin is not None and plugin.preprocess is not None:
        return plugin.preprocess()
    if exported is not None:
        return exported
    raise OptionError("ensemble", "needs the preprocessing spec ({preprocess}, see 'trtrepo preprocess')",
                      concept="the image ensemble", others={"preprocess": "a preprocess spec file"})


def _detector_ensemble(repo: str | Path, primary: ModelConfig, model_path: Path, preprocess: Preprocess,
                       common: dict[str, Any], mopts: ModelOptions, task: str = "auto") -> list[DeployedModel] | None:
    """For a detector (:func:`trtrepo.qdq.detector_outputs`): its preprocessing, NMS
    postprocessing and ensemble (:func:`trtrepo.repository.add_detector_ensemble`); None otherwise.
    The head's layout is read off one FP32 run at the letterbox size (an export's channel axis may
    be symbolic)."""
    model = load_onnx(model_path, load_weights=False)
    detectors = detector_outputs(model, task)
    if not detectors:
        return None
    name, classes = next(iter(detectors.items()))
    h, w = preprocess.letterbox if preprocess.letterbox else (0, 0)
    if not h:
        raise OptionError("preprocess", "of a detector's ensemble must letterbox ({preprocess} with letterbox)",
                          concept="the preprocessing", others={"preprocess": "a preprocess spec"})
    session = make_session(str(model_path))
    feed = {session.get_inputs()[0].name: np.zeros((1, 3, h, w), np.float32)}
    shape = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed), strict=True))[name].shape
    pre, post, ens = add_detector_ensemble(repo, primary, preprocess, detection_layout(shape, classes), NmsSettings(),
                                           options=mopts, **common)
    return [DeployedModel(pre.name, pre.version, "python", "-", pre.version_dir, "image decode + letterbox",
                          replaced=pre.replaced),
            DeployedModel(post.name, post.version, "python", "-", post.version_dir, "decode + class-aware NMS",
                          replaced=post.replaced),
            DeployedModel(ens.name, ens.version, "ensemble", "-", ens.version_dir, replaced=ens.replaced)]


def int8_for_backend(int8: QuantizeSettings, spec: Any, report: DeployReport) -> QuantizeSettings:
    """The INT8 request placed for the backend ``spec``: ``--target auto`` takes the backend's
    target record (``QuantizeOptions`` checks it against the rest of the placement, 7-bit weights
    included, once); a target named for another backend is noted."""
    own = backend_target(spec)
    if int8.target_from_backend:
        return replace(int8, placement=replace(int8.placement, target=own), target_from_backend=False)
    chosen = int8.placement.target
    if chosen is not own:
        report.notes.append(f"--target {chosen.name}: Q/DQ placed by {chosen.name}'s rules for the {spec.name} backend "
                            f"(its own rules are {own.name}'s)")
    return int8


def deploy(opts: DeployOptions) -> DeployReport:
    remote = is_remote(opts.repo)
    report = DeployReport(repo=opts.repo if remote else Path(opts.repo))
    name = opts.name or default_name(opts.source)
    backend = _resolve_backend(opts, report)
    batch_profile(opts)  # --max-batch-size and --shape agree: fail before any work
    exported = exporter_preprocess(opts.source)
    opts = _with_export_letterbox(opts, exported)
    if opts.ensemble:
        preprocess = _preprocess_spec(opts, exported)  # fail early, before any work
    with contextlib.ExitStack() as stack:
        repo, store = _repository_stand_in(stack, opts)
        work = _work_dir(stack, opts)
        onnx_path, io = _export_step(opts, work, report)
        if opts.int8.task == "detect":  # said to be a detector: refused before any work when no output is laid out so
            detector_outputs(load_onnx(onnx_path, load_weights=False), "detect")
        spec = backends.for_option(backend)
        assert spec is not None  # _resolve_backend returns registered names
        _check_serving(opts, spec, onnx_path, io, report)
        _check_shapes_used(opts, spec, backend, io, report)
        int8 = int8_for_backend(opts.int8, spec, report)
        calibration = CalibrationData(opts, io)  # opened once, when a step first needs it
        model_path, precision = _int8_step(opts, onnx_path, io, int8, work, report, calibration)
        plan = _build_step(opts, model_path, backend, work, report, io, calibration)

        with _timed(report, "repository") as step:
            write = _RepositoryWrite(repo, name, opts, report, precision)
            written = write.served(plan, model_path, backend, io)
            if opts.ensemble:
                write.ensembles(written[0][1], model_path, preprocess, plan)
            if store is not None:
                _publish(store, Path(repo), report, allocated=opts.version is None)
            step.detail = f"{len(report.models)} model(s) in {opts.repo}"
            _note_skipped(calibration, report)
            report.warnings.extend(_local_server_warnings(opts, [c for _, c, _ in written]))
    if precision == "fp32":
        report.notes.append("deployed the FP32 ONNX model (no INT8 here: see the int8 step)")
    elif plan is None:
        report.notes.extend(_cpu_int8_notes(backend, int8.placement.reduce_range))
    return report


def _with_export_letterbox(opts: DeployOptions, exported: Preprocess | None) -> DeployOptions:
    """Decision: an image folder without a preprocessing spec for a detector exported with its
    input size is read through the export's own letterbox; other data as given."""
    if exported is not None and opts.data is not None and opts.data.spec and not opts.data.preprocess:
        return replace(opts, data=replace(opts.data, preprocess=exported))
    return opts


def _repository_stand_in(stack: contextlib.ExitStack, opts: DeployOptions) -> tuple[str | Path, Any]:
    """Where the models are written, and the object store when remote. Decision: a remote
    repository is written locally against a stand-in (its checkout, which fails on credentials,
    endpoint or bucket before any work), then uploaded; a local one directly."""
    if not is_remote(opts.repo):
        return opts.repo, None
    store = open_store(opts.repo, opts.s3_endpoint)
    repo = Path(stack.enter_context(temp_dir("s3-repo"))) / "repo"
    checkout(store, repo)
    return repo, store


def _work_dir(stack: contextlib.ExitStack, opts: DeployOptions) -> Path:
    """The intermediate files' folder: ``--workdir`` (kept), else a temporary one."""
    if opts.workdir:
        work = Path(opts.workdir)
        work.mkdir(parents=True, exist_ok=True)
        return work
    return Path(stack.enter_context(temp_dir("deploy")))


def _check_shapes_used(opts: DeployOptions, spec: Any, backend: str, io: ModelIO, report: DeployReport) -> None:
    """A mistyped or misfitting --shape is an error whatever the backend. Decision: shapes for a
    backend that builds no engine are refused when the backend was named, and a warning when
    ``auto`` chose it on this machine."""
    if not opts.shapes:
        return
    batch_profile(opts, io).check_shapes(io)
    if spec.engine:
        return
    unused = f": the {backend} backend builds no TensorRT engine, so the shapes are not used"
    if opts.backend != "auto":
        raise OptionError("shapes", f"{unused}; drop them ({{max_batch_size}} sets Triton's batch range)",
                          concept="the shape ranges", others={"max_batch_size": "the max batch size"})
    report.warnings.append(f"--shape{unused} (backend auto chose {backend} on this machine)")


def _note_skipped(calibration: CalibrationData, report: DeployReport) -> None:
    """The files --skip-non-images left out of the data (the first ten named)."""
    skipped = calibration.skipped()
    if skipped:
        report.notes.append(f"--skip-non-images: skipped {len(skipped)} file(s) of {calibration.spec}: "
                            + ", ".join(Path(p).name for p in skipped[:10]) + (" ..." if len(skipped) > 10 else ""))


@dataclass
class _RepositoryWrite:
    """The repository step: writes the deployment's models into ``repo`` (the local stand-in of a
    remote one) and records each in ``report``."""

    repo: str | Path
    name: str
    opts: DeployOptions
    report: DeployReport
    precision: str

    @property
    def common(self) -> dict[str, Any]:
        return {"version": self.opts.version, "force": self.opts.force, "template_dir": self.opts.template_dir}

    def served(self, plan: Path | None, model_path: Path, backend: str, io: ModelIO) -> list[tuple[WriteResult, ModelConfig, str]]:
        """The served model (the first written, the ensembles' primary) and its Python twin.
        Decision: an engine when one was built, else the ONNX model on ``backend``; with
        ``--python-variant``, the same ONNX model on the Python backend beside it."""
        opts, repo, name, mopts, common = self.opts, self.repo, self.name, self.opts.model, self.common
        labels = _labels(opts)
        written: list[tuple[WriteResult, ModelConfig, str]] = []
        if plan is not None:
            res, cfg = add_plan_model(repo, name, plan, io=io, options=mopts, labels=labels, **common)
            written.append((res, cfg, cfg.spec.display))
            self.report.notes.extend(res.warnings)
        else:
            res, cfg = add_onnx_model(repo, name, model_path, backend=backend, options=mopts, labels=labels, **common)
            written.append((res, cfg, cfg.spec.display))
        if opts.python_variant and backend != "python":
            res, cfg = add_onnx_model(repo, f"{name}_python", model_path, backend="python", options=mopts,
                                      labels=labels, **common)
            written.append((res, cfg, cfg.spec.display))
        for res, _cfg, kind in written:
            self.report.models.append(DeployedModel(res.name, res.version, kind, self.precision, res.version_dir,
                                                    replaced=res.replaced))
        return written

    def ensembles(self, primary: ModelConfig, model_path: Path, preprocess: Preprocess, plan: Path | None) -> None:
        """Decision: a detector gets its preprocessing, NMS postprocessing and ensemble (and, beside
        an engine, TensorRT's usual route: NMS in the plan); any other model an image ensemble."""
        opts, report, mopts, common = self.opts, self.report, self.opts.model, self.common
        detector = _detector_ensemble(self.repo, primary, model_path, preprocess, common, mopts, opts.int8.task)
        if detector is not None:
            report.models.extend(detector)
            if plan is not None:
                self._nms_in_plan(plan, model_path)
            return
        pre, ens = add_image_ensemble(self.repo, primary, preprocess, options=mopts, **common)
        report.models.append(DeployedModel(pre.name, pre.version, "python", "-", pre.version_dir, "image decode + preprocess",
                                           replaced=pre.replaced))
        report.models.append(DeployedModel(ens.name, ens.version, "ensemble", "-", ens.version_dir,
                                           replaced=ens.replaced))

    def _nms_in_plan(self, plan: Path, model_path: Path) -> None:
        """TensorRT's usual route beside the ensemble: NMS in the plan (engine.nms_plugin); an
        extra beside a complete deployment, so a failure is said, not fatal."""
        raw, classes = next(iter(detector_outputs(load_onnx(model_path, load_weights=False), self.opts.int8.task).items()))
        try:
            nms_plan = build_efficient_nms(plan, raw, classes, NmsSettings()).plan
        except UsageError as exc:
            self.report.warnings.append(f"{self.name}_nms (NMS in the plan) not written: {exc}")
            return
        res, cfg = add_plan_model(self.repo, f"{self.name}_nms", nms_plan, options=self.opts.model, **self.common)
        self.report.models.append(DeployedModel(res.name, res.version, cfg.spec.display, self.precision, res.version_dir,
                                                "decode + EfficientNMS_TRT in the plan", replaced=res.replaced))


def _publish(store: Any, local: Path, report: DeployReport, *, allocated: bool) -> None:
    """Upload the models written into the local stand-in of an s3:// repository, in the order they
    were written (an ensemble after its steps), by :mod:`trtrepo.objectstore`'s commit protocol."""

    for m in report.models:
        pub = publish(store, local, m.name, m.version, replaced=m.replaced, allocated=allocated, say=status)
        if pub.version != m.version and m.replaced:
            report.notes.append(f"{m.name}: version {m.version} exists in {store.loc.url} and object storage has no "
                                f"rename: written as version {pub.version}, version {m.version} retired")
        elif pub.version != m.version:
            report.notes.append(f"{m.name}: another writer took version {m.version} meanwhile: written as version "
                                f"{pub.version}")
        m.version, m.path = pub.version, pub.url


def _local_server_warnings(opts: DeployOptions, configs: list[ModelConfig]) -> list[str]:
    """A backend the local tritonserver lacks; an EXECUTION_ENV_PATH that ties the repository to this machine."""

    needed = {c.spec.server_backend for c in configs if c.spec.server_backend} | ({"python"} if opts.ensemble else set())
    warnings = [w for b in sorted(needed) if (w := missing_backend_warning(b))]
    if opts.model.execution_env and (opts.ensemble or any(c.spec.runs_python for c in configs)):
        warnings += [w for w in (execution_env_warning(opts.model.execution_env),) if w]
    return warnings


def _cpu_int8_notes(backend: str, reduce_range: bool, info: CpuInt8 | None = None) -> list[str]:
    """What a Q/DQ INT8 model served by ONNX Runtime on this CPU needs to know (see trtrepo.cpu)."""
    info = cpu_int8() if info is None else info
    if not info.saturates:
        return []
    if backend == "python":
        return ["this CPU has no VNNI: the generated model.py sets session.x64quantprecision=1 here (exact INT8), and "
                "ONNX Runtime's U8U8 kernels it selects can be slower than FP32 (0.56-0.66x FP32 when forced on a VNNI "
                "CPU, docs/benchmarks.md); compare with --precision fp32 before serving INT8 on such CPUs"]
    if not reduce_range:
        return ["this CPU has no VNNI and Triton's onnxruntime backend cannot set session.x64quantprecision: INT8 "
                "Conv/MatMul results can saturate; redeploy with --reduce-range (7-bit weights) or use the python backend"]
    return []
