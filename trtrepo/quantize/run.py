"""The quantize stage end to end: a :class:`QuantizeRequest` run by :func:`quantize_request`,
its keyword form :func:`run_quantize`, and the entry ``deploy`` calls (:func:`quantize_for_deploy`).

:func:`quantize_request` reads as its steps: check the request (:meth:`QuantizeRequest.__post_init__`),
load the model, open the calibration and held-out data (:func:`_open_sources`), collect or read
the ranges (:func:`_ranges`), choose SmoothQuant, the method, the weight rounding and the layers
left in float (:func:`_choose`), run the held-out check (:func:`_held_out_check`), then write the
model and the report."""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import rangemath as H
from ..arrayfile import subset_rows
from ..calibrate import DEFAULT_MEMORY_BUDGET_MB, Calibrator
from ..data import DataOptions, DataSource, open_data
from ..errors import OptionError, UsageError
from ..evaluate import AccuracyTarget, OutputMetrics
from ..fsutil import report_json, write_report
from ..modelio import ModelIO
from ..preprocessing import Preprocess, exporter_preprocess
from ..progress import phase, task
from ..qdq import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    detector_outputs,
    load_model,
    quantize_result,
    ranges_from_cache,
    save_model,
)
from ..smoothquant import smooth_candidates
from ..warngroups import collecting
from .fallback import check_reachable, fallback
from .front import RANK_SAMPLES, FrontOptions, QualityFront, search_front
from .front import write_plot as write_front_plot
from .gate import (
    DETECTION_RULE,
    EXPECTED_DROP_RULE,
    LABELLED_DETECTION_RULE,
    AccuracyCheck,
    AccuracyLoss,
    fp16_floor,
    with_fp16_floor,
)
from .ranges import (
    AUTO_MIN_SAMPLES,
    DETECTOR_RANGE_RULE,
    DETECTOR_TOP_PERCENTILE,
    activation_ranges,
    calibration_tensors,
    detector_ranges,
    split_holdout,
)
from .report import (
    CalibrationFacts,
    HeldOutCheck,
    HeldOutFigures,
    QuantizeRunResult,
    Selection,
    SmoothQuantReport,
    build_report,
    kernel_report,
    report_markdown,
)
from .select import (
    Evaluator,
    WeightRounding,
    choose_smoothing,
    choose_weight_rounding,
    equalize_step,
    select_method,
    smoothed_ranges,
)
from .settings import QuantizeSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantizeRequest:
    """One ``trtrepo quantize`` run (module doc of :mod:`trtrepo.quantize`), checked on construction:
    the model, the output, the data and the INT8 request (:class:`QuantizeSettings`, shared with
    ``deploy``), then how this run is carried out.

    Exactly one of ``int8.ranges``, ``int8.cache`` or ``data`` (calibrate here) gives the ranges;
    with ranges or a cache, ``data`` and ``int8.eval_data`` only serve evaluation. ``data``: a
    :class:`~trtrepo.data.DataOptions` (a spec and how to open it), a bare spec or an open
    :class:`~trtrepo.data.DataSource`. ``batch_size`` is the batch of calibration and evaluation;
    ``seed`` that of the held-out split. ``check``: the held-out accuracy check against FP32 the
    run ends with (result in ``report.accuracy_check``; None skips it); when it fails and
    ``int8.accept_accuracy_loss`` is False, :class:`AccuracyLoss` is raised and nothing is
    written. ``front``: when the check fails on all-INT8 (and no accuracy target chose the
    layers), search the accuracy/speed front (:mod:`trtrepo.quantize.front`): the fastest
    candidate with the most sensitive layers in float that passes becomes the model, else
    ``report.front`` says why nothing did; ``front.png`` and the report go to ``report_dir``,
    else ``front.report_dir``. ``rounding_budget_s``: see :func:`choose_weight_rounding`."""

    model: str | Path
    output: str | Path
    data: DataOptions | DataSource | str | None = None
    int8: QuantizeSettings = field(default_factory=QuantizeSettings)
    seed: int = 0  # of the held-out split
    batch_size: int = 32
    threads: int | None = None
    report_dir: str | Path | None = None
    force: bool = True
    progress: bool = False
    check: AccuracyCheck | None = field(default_factory=AccuracyCheck)
    memory_budget_mb: float | None = None
    rounding_budget_s: float | None = None
    front: FrontOptions | None = None  # all-INT8 fails the check: search the accuracy/speed front (deploy)

    def __post_init__(self) -> None:
        s, given = self.int8, self.int8.given
        data = {"data_spec": "calibration data"}
        if given and s.method is not None:
            raise OptionError("method", f"{s.method} calibrates on {{data_spec}}; it cannot be combined with the ranges "
                              f"given in {given} (they are used as given)", concept="the calibration method",
                              others=data)
        if not given and self.data is None:
            raise OptionError("", "no ranges: give {ranges}, {cache} or {data_spec}",
                              others={"ranges": "a ranges file", "cache": "a calibration cache", **data})
        if self.resolved_method != "auto" and self.resolved_method not in H.METHODS:
            raise OptionError("method", f"'{self.resolved_method}': expected one of "
                              f"{', '.join(H.method_names(auto=True))}", concept="the calibration method")
        if Path(self.model).resolve() == Path(self.output).resolve():
            raise OptionError("output", f"{self.output}: would overwrite the input model", concept="the output")
        if given and s.smooth_quant not in (None, "auto"):
            raise OptionError("smooth_quant", f"{s.smooth_quant}: SmoothQuant needs calibration on {{data_spec}}, not "
                              f"the ranges given in {given}", concept="the SmoothQuant alpha", others=data)

    @classmethod
    def of(cls, model: str | Path, output: str | Path, *, options: QuantizeOptions | None = None,
           **fields_: Any) -> QuantizeRequest:
        """The flat keyword form for scripts and tests: keywords that name a
        :class:`QuantizeSettings` field go to ``int8`` (``options``: its ``placement``), the others
        to the request."""
        names = {f.name for f in fields(QuantizeSettings)}
        int8 = {k: fields_.pop(k) for k in list(fields_) if k in names}
        if options is not None:
            int8["placement"] = options
        return cls(model, output, int8=QuantizeSettings(**int8), **fields_)

    @property
    def resolved_method(self) -> str:
        """The method: as given, else auto when calibrating here; with ranges/a cache it names their source."""
        return self.int8.method or ("auto" if not self.int8.given else "entropy")

    def smooth_request(self) -> float | str | None:
        """The SmoothQuant alpha asked for; "auto" means none with ranges or a cache."""
        return None if self.int8.given else self.int8.smooth_quant


def run_quantize(onnx_path: str | Path, out_path: str | Path, *, data: Any = None,
                 data_args: Mapping[str, Any] | None = None, accept_accuracy_loss: bool = True,
                 **request: Any) -> QuantizeRunResult:
    """The keyword form of :func:`quantize_request`, kept for scripts, benchmarks and tests
    (:meth:`QuantizeRequest.of`: :class:`QuantizeSettings` fields and the request's in one
    flat list); ``data_args`` are :func:`~trtrepo.data.open_data`'s keywords for ``data``
    (preprocess, labels, limit, seed, skip_non_images), made into a
    :class:`~trtrepo.data.DataOptions`. Unlike the commands, a failed check writes the model
    (with a warning) unless ``accept_accuracy_loss=False``."""
    if data_args and data is not None:
        data = DataOptions(spec=data, **{"seed": None, **data_args})
    return quantize_request(QuantizeRequest.of(onnx_path, out_path, data=data,
                                               accept_accuracy_loss=accept_accuracy_loss, **request))


def quantize_request(req: QuantizeRequest) -> QuantizeRunResult:
    """Quantize ``req.model`` into ``req.output`` (see :class:`QuantizeRequest`). Nothing is
    written when anything fails.

    The warnings that repeat per layer and per candidate tried are grouped by cause
    (:mod:`trtrepo.warngroups`): those of the shipped model are ``report.warnings`` and one line
    per cause is logged when the run ends (by the caller's run when it is collecting too: deploy).

    The run is one progress task, ``int8`` (:func:`trtrepo.progress.task`; deploy's INT8 step is
    the same task): each stage below opens a phase, so a long run shows where it is."""
    with collecting(log, where="the quantize report") as run, task("int8"):
        result = _quantize_request(req)
        run.keep(d for g in result.report.warnings for d in g.details)
    return result


def _quantize_request(req: QuantizeRequest) -> QuantizeRunResult:
    options, method, check = req.int8.placement, req.resolved_method, req.check
    onnx_path = Path(req.model)
    model = fp32_model = load_model(onnx_path)
    io = ModelIO.from_onnx(model, source=onnx_path)
    detectors = detector_outputs(model, req.int8.task)  # said to be a detector without a YOLO output: refused here
    outputs = [o.name for o in model.graph.output]
    metric_output = req.int8.metric_output
    _check_outputs(req, onnx_path, outputs)
    accuracy_target = None if req.int8.accuracy_target is None else req.int8.accuracy_target.on_output(metric_output)

    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    sq_request = req.smooth_request()
    need_eval = method == "auto" or accuracy_target is not None or check is not None or sq_request == "auto"
    calib_src, eval_src = _open_sources(req, io, need_eval=need_eval, strict=method == "auto" or accuracy_target is not None)
    if accuracy_target is not None and eval_src is None:
        raise OptionError("accuracy_target", "needs evaluation data ({data_spec} or {eval_data})",
                          others={"data_spec": "data", "eval_data": "evaluation data"})

    # A top-1 target on --metric-output makes that output a classification output too.
    top1_on = metric_output if accuracy_target is not None and accuracy_target.kind != "cosine" else None
    evaluator = None
    if eval_src is not None:
        with phase("FP32 outputs on the held-out data", note=f"{len(eval_src)} samples"):
            evaluator = Evaluator(model, eval_src, batch_size=req.batch_size, threads=req.threads, label_output=top1_on,
                                  detectors=detectors)
    if accuracy_target is not None and evaluator is not None:
        check_reachable(accuracy_target, evaluator)  # before calibrating: fail fast

    # a detector's ranges by producer: on uint8 activations over [lo, hi] (measured there; symmetric int8 halves a SiLU's grid)
    by_producer = bool(detectors) and options.target.activations == "asymmetric"
    model, per_method, stats, equalization = _ranges(req, model, onnx_path, calib_src, evaluator, sq_request, timings,
                                                     by_producer)
    if sq_request is not None and stats is None and sq_request != "auto":
        raise OptionError("smooth_quant", "needs calibration data ({data_spec}): ranges and caches carry no per-channel "
                          "statistics", concept="SmoothQuant", others={"data_spec": "data"})
    c = _choose(req, model, stats, per_method, evaluator, sq_request, accuracy_target, calib_src, timings)
    gated = metric_output or outputs[0]
    metrics, held_out = _held_out_check(req, c.metrics, c.chosen, model, evaluator, gated, eval_src, onnx_path)
    front = None
    if req.front is not None and held_out is not None and held_out.ok is False and evaluator is not None and c.fb is None:
        front, c, metrics, held_out = _front(req, c, (model, fp32_model), (evaluator, calib_src), gated,
                                             (eval_src, onnx_path), held_out)

    speed = None
    if evaluator is not None:
        with phase("speed INT8/FP32", note="ONNX Runtime CPU on the held-out data"):
            speed = evaluator.time_ratio(fp32_model, c.chosen.model)
    with phase("writing the model and the report"):
        path = save_model(c.chosen.model, req.output, force=req.force)
    base = quantize_result(c.chosen, path, options, c.best.label)
    base.layers_in_float = list(c.chosen.plan.excluded)
    timings["total"] = time.perf_counter() - t_start  # calibration (both passes) and total, selection and checks included
    report = build_report(
        onnx_path, path, options, c,
        HeldOutFigures(eval_src, accuracy_target, gated, metrics, held_out, speed),
        CalibrationFacts(method, calib_src,
                         None if stats is None else {t.name: c.best.label for t in io.inputs if t.name in stats},
                         equalization, SmoothQuantReport.of(sq_request, c.smooth),
                         DETECTOR_RANGE_RULE if by_producer and stats is not None else None),
        seconds=timings,
        integer_kernels=(kernel_report(c.base_model, c.per_method[c.best.label], options, c.chosen)
                         if options.target.integer_kernels else None))
    report_dir = req.report_dir if req.report_dir is not None or front is None else req.front.report_dir  # type: ignore[union-attr]
    if front is not None:
        if report_dir is not None:
            front = replace(front, plot=write_front_plot(front, Path(report_dir) / "front.png"))
        report = replace(report, front=front)
    if report_dir is not None:
        write_report(report_dir, "quantize", report_json(report.to_dict()), report_markdown(report))
        report = replace(report, report_dir=Path(report_dir))
    return QuantizeRunResult(**{f.name: getattr(base, f.name) for f in fields(base)}, report=report)


def _open(spec: DataOptions | DataSource | str, io: ModelIO, preprocess: Preprocess | None = None,
          labels: str | None = None) -> DataSource:
    """``spec`` opened for the model; ``preprocess`` reads an image folder given without one (an
    export's own letterbox); ``labels``: the box labels of a spec given as a string (``eval_data``)."""
    if isinstance(spec, DataOptions):
        return spec.open(io) if spec.preprocess is not None or preprocess is None else \
            replace(spec, preprocess=preprocess).open(io)
    if isinstance(spec, str):
        return open_data(spec, io=io, preprocess=preprocess, labels=labels)
    return open_data(spec, io=io)


def _open_sources(req: QuantizeRequest, io: ModelIO, *, need_eval: bool,
                  strict: bool) -> tuple[DataSource | None, DataSource | None]:
    """(calibration data, held-out data). Calibrating here without ``eval_data``, a ``holdout``
    part of ``data`` is held out when anything is evaluated; too few samples for that is an error
    when ``strict`` (auto or an accuracy target), else a warning that accuracy is not checked."""
    eval_data = req.int8.eval_data
    # Decision (as deploy and validate): images given without a preprocessing spec, for a detector
    # exported with its input size (Ultralytics' metadata), are read through that export's letterbox.
    exported = exporter_preprocess(req.model)
    given = req.data.preprocess if isinstance(req.data, DataOptions) else None
    preprocess = exported if given is None else (Preprocess.load(given) if isinstance(given, (str, Path)) else given)
    data, eval_labels = req.data.labels_beside(eval_data) if isinstance(req.data, DataOptions) else (req.data, None)
    if req.int8.given:  # the ranges are given: the data only serves evaluation
        if eval_data is not None:
            return None, _open(eval_data, io, preprocess, eval_labels)
        return None, None if data is None else _open(data, io, exported)
    assert data is not None  # checked by the request
    source = _open(data, io, exported)
    if eval_data is not None:
        return source, _open(eval_data, io, preprocess, eval_labels)
    if not need_eval:
        return source, None
    try:
        calib_src, eval_src = split_holdout(source, req.int8.holdout, req.seed)
    except UsageError:
        if strict:
            raise
        log.warning("%s: %d samples are too few to hold some out; the INT8 model's accuracy is NOT checked "
                    "against FP32 (give more data or --eval-data)", source.name, len(source))
        return source, None
    log.info("holding out %d of %d samples of %s for evaluation", len(eval_src), len(source), source.name)
    return calib_src, eval_src


def _check_outputs(req: QuantizeRequest, onnx_path: Path, outputs: list[str]) -> None:
    """Refuse a metric output the model does not have, and an existing output file without force."""
    metric_output = req.int8.metric_output
    if metric_output is not None and metric_output not in outputs:
        raise OptionError("metric_output", f"'{metric_output}': {onnx_path.name} has no such output (outputs: "
                          f"{', '.join(outputs)})")
    if Path(req.output).exists() and not req.force:
        raise OptionError("", f"{req.output}: already exists (use {{force}} to overwrite)", others={"force": "force=True"})


def _ranges(req: QuantizeRequest, model: Any, onnx_path: Path, calib_src: DataSource | None,
            evaluator: Evaluator | None, sq_request: float | str | None,
            timings: dict[str, float], by_producer: bool = False) -> tuple[Any, dict[str, dict[str, ActivationRange]], Any, dict[str, Any]]:
    """(model, ranges per method, statistics, equalization entry of the report): read from
    ``--ranges`` / ``--cache``, or collected on ``calib_src`` after activation equalization (one
    calibration pass serves every method tried). ``by_producer`` (a detector on a target with
    asymmetric activations): the collected ranges keep each method's range only where a weighted
    op produces the tensor, min/max elsewhere (:func:`~trtrepo.quantize.ranges.detector_ranges`)."""
    if req.int8.ranges is not None:
        return model, {"ranges": dict(req.int8.ranges.ranges)}, None, dict(_NOT_EQUALIZED)
    if req.int8.cache is not None:
        return model, {"cache": activation_ranges(ranges_from_cache(req.int8.cache, model))}, None, dict(_NOT_EQUALIZED)
    # only the input tensor names are used: no prepared (renamed) copy of the weights needed
    channel_tensors = list(smooth_candidates(model)) if sq_request is not None else []
    with phase("equalization"):
        equalization = equalize_step(model, calib_src, evaluator, req.int8.placement, req.int8.equalize, req.threads)
    calib_path = onnx_path
    if equalization.get("applied"):
        model = equalization.pop("model")
        tmp_dir = tempfile.TemporaryDirectory(prefix="trtrepo-equalized-")
        calib_path = Path(tmp_dir.name) / "equalized.onnx"
        save_model(model, calib_path)
    equalization.pop("model", None)
    t_cal = time.perf_counter()
    cal = Calibrator(calib_path, calib_src, batch_size=req.batch_size, progress=req.progress,
                     tensors=calibration_tensors(model, req.int8.placement), channel_tensors=channel_tensors,
                     memory_budget_mb=req.memory_budget_mb or DEFAULT_MEMORY_BUDGET_MB)
    stats = cal.collect()
    timings["calibration"] = time.perf_counter() - t_cal
    if equalization.get("seconds"):
        timings["equalization"] = equalization["seconds"]
    del cal  # its ONNX Runtime session holds the model with every tensor as an output
    gc.collect()
    methods = tuple(H.METHODS) if req.resolved_method == "auto" else (req.resolved_method,)
    per_method = {m: activation_ranges(stats.compute(m), stats) for m in methods}
    if by_producer:
        minmax = per_method.get("minmax") or activation_ranges(stats.compute("minmax"), stats)
        top = stats.compute("percentile", percentile=DETECTOR_TOP_PERCENTILE)
        per_method = {m: detector_ranges(model, r, minmax, top) for m, r in per_method.items()}
    return model, per_method, stats, equalization


_NOT_EQUALIZED = {"applied": False, "note": "ranges or a cache were given (computed on the original model)"}


def _choose(req: QuantizeRequest, model: Any, stats: Any, per_method: dict[str, dict[str, ActivationRange]],
            evaluator: Evaluator | None, sq_request: float | str | None, accuracy_target: AccuracyTarget | None,
            calib_src: DataSource | None, timings: dict[str, float]) -> Selection:
    """SmoothQuant, then the method, then the weight rounding, then (with an accuracy target)
    the layers left in float, each measured on the held-out data."""
    options, metric_output = req.int8.placement, req.int8.metric_output
    metric = "cosine" if (accuracy_target is not None and accuracy_target.kind == "cosine") else None
    smooth = choose_smoothing(model, stats, next(iter(per_method.values())), options, evaluator, sq_request,
                              metric_output=metric_output, metric=metric)
    base_model = smooth.model
    per_method = {k: smoothed_ranges(v, smooth.ranges) for k, v in per_method.items()}
    best, candidates = select_method(base_model, per_method, options, evaluator, metric_output=metric_output, metric=metric)
    assert best.quantized is not None
    rounding = choose_weight_rounding(base_model, per_method[best.label], options, calib_src, evaluator, best,
                                      WeightRounding(req.int8.weight_rounding, req.rounding_budget_s),
                                      metric_output=metric_output, metric=metric, threads=req.threads)
    timings.update(rounding.seconds)
    if rounding.model is not None and rounding.best is not None:
        base_model, best = rounding.model, rounding.best
    assert best.quantized is not None
    chosen, metrics = best.quantized, best.metrics
    fb = None
    if accuracy_target is not None:
        if evaluator is None:  # pragma: no cover - eval_src is required above
            raise OptionError("accuracy_target", "needs evaluation data")
        with phase("accuracy target (layers in float)", note=str(accuracy_target)):
            fb = fallback(base_model, per_method[best.label], options, evaluator, accuracy_target, best)
        chosen, metrics = fb.chosen, fb.metrics
    return Selection(smooth, base_model, per_method, best, candidates, rounding, chosen, metrics, fb)


def _held_out_check(req: QuantizeRequest, metrics: Mapping[str, OutputMetrics] | None, chosen: QuantizedModel,
                    model: Any, evaluator: Evaluator | None, gated: str, eval_src: DataSource | None,
                    onnx_path: Path) -> tuple[Mapping[str, OutputMetrics] | None, HeldOutCheck | None]:
    """(the chosen model's metrics, the check's result): ``req.check`` judges the ``gated``
    output; the other outputs below the floor are named, not gated. A failure is a warning, or
    :class:`AccuracyLoss` without ``accept_accuracy_loss``."""
    check = req.check
    if check is None:
        return metrics, None
    with phase("held-out gate vs FP32", note=f"output '{gated}'") as ph:
        if metrics is None and evaluator is not None:
            metrics = evaluator(chosen.model)
        if metrics is None:
            return metrics, HeldOutCheck.of(check, gated, None, [], None)
        verdict = check.judge(metrics[gated])
        if evaluator is not None and verdict["rule"] in (EXPECTED_DROP_RULE, DETECTION_RULE, LABELLED_DETECTION_RULE):
            ph.set_note(f"output '{gated}', FP16 noise floor")
            verdict = with_fp16_floor(verdict, fp16_floor(model, evaluator, gated))
    failures = [] if verdict["ok"] else [verdict["message"]]  # the gated output's, with the FP16 figures
    # The other outputs are measured too: one below the floor is named (not gated).
    ungated = check.failures({k: v for k, v in metrics.items() if k != gated})
    if ungated:
        log.warning("INT8 accuracy of outputs not gated by the check (the gate is '%s'): %s", gated, "; ".join(ungated))
    if failures:
        log.warning("INT8 ACCURACY LOSS on %d held-out samples: %s", len(eval_src) if eval_src is not None else 0,
                    "; ".join(failures))
        if not req.int8.accept_accuracy_loss:
            raise AccuracyLoss(f"{onnx_path.name}: INT8 fails the held-out check vs FP32: {'; '.join(failures)}; "
                               f"nothing written to {req.output} (accept the loss to write it anyway)")
    return metrics, HeldOutCheck.of(check, gated, failures, ungated, verdict)
def _front(req: QuantizeRequest, c: Selection, models: tuple[Any, Any], data: tuple[Evaluator, DataSource | None],
           gated: str, where: tuple[DataSource | None, Path], failed: HeldOutCheck
           ) -> tuple[QualityFront, Selection, Any, HeldOutCheck | None]:
    """All-INT8 failed the gate: the front (:func:`~trtrepo.quantize.front.search_front`) and,
    when a candidate on it ships, the selection and held-out check of that candidate. ``models``:
    (the model the check's FP16 floor is measured on, the FP32 model the speed is timed against);
    ``data``: (the held-out evaluator that judges, the calibration data the layers are ranked on,
    :data:`~trtrepo.quantize.front.RANK_SAMPLES` of it)."""
    assert req.front is not None and req.check is not None
    evaluator, calib_src = data
    start_metrics = c.metrics if c.metrics is not None else evaluator(c.chosen.model)
    ranker, confirm = _front_evaluators(models[1], calib_src, evaluator, req)
    with phase("accuracy/speed front", note="timing all-INT8"):
        front, qm, m = search_front(c.base_model, c.per_method[c.best.label], req.int8.placement, evaluator, req.check, gated,
                                    (c.chosen, start_metrics), models[1], req.front, (ranker, confirm))
    if qm is None or m is None:  # FP32 ships: the report keeps all-INT8's failed check
        return front, c, start_metrics, failed
    c = replace(c, chosen=qm, metrics=m)
    metrics, held_out = _held_out_check(req, m, qm, models[0], evaluator, gated, *where)
    return front, c, metrics, held_out


def _front_evaluators(fp32_model: Any, calib_src: DataSource | None, evaluator: Evaluator, req: QuantizeRequest
                      ) -> tuple[Evaluator | None, Evaluator | None]:
    """(the ranking evaluator on :data:`~trtrepo.quantize.front.RANK_SAMPLES` calibration
    samples, the confirmation evaluator on the rest); (None, None) without calibration data."""
    if calib_src is None:
        return None, None
    n = len(calib_src)
    picked = subset_rows(n, RANK_SAMPLES, req.seed)
    rank_rows = np.arange(n) if picked is None else picked
    rest = np.setdiff1d(np.arange(n), rank_rows)
    kw: dict[str, Any] = {"batch_size": req.batch_size, "threads": req.threads, "label_output": evaluator.label_output}
    ranker = Evaluator(fp32_model, calib_src.take(rank_rows), **kw)
    return ranker, (Evaluator(fp32_model, calib_src.take(rest), **kw) if len(rest) else None)


def quantize_for_deploy(req: QuantizeRequest) -> QuantizeRunResult:
    """What ``trtrepo deploy`` calls: :func:`quantize_request` on ``req`` (one collection pass on
    ``req.data``, a data spec or :class:`~trtrepo.data.DataSource`), except that ``auto`` without
    ``req.int8.eval_data`` falls back to entropy (ModelOpt's default) below :data:`AUTO_MIN_SAMPLES`
    samples, too few to hold a fifth out. With ``eval_data`` (a separate evaluation set) every
    sample of ``req.data`` calibrates. The run ends with the held-out check against FP32
    (``result.report.accuracy_check``). Returns the path, the method used and the report."""
    if req.resolved_method == "auto" and req.int8.eval_data is None and req.data is not None:
        source = req.data if isinstance(req.data, DataSource) else _open(req.data, ModelIO.from_onnx(load_model(req.model)))
        if len(source) < AUTO_MIN_SAMPLES:
            log.info("%d samples: too few to hold some out; using entropy", len(source))
            req = replace(req, data=source, int8=replace(req.int8, method="entropy"))
        else:
            req = replace(req, data=source)
    return quantize_request(req)
