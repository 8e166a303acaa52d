"""The quantize stage end to end (:func:`run_quantize`) and the entry ``deploy`` calls."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from .. import histogram as H
from ..errors import UsageError
from ..evaluate import (
    AccuracyTarget,
)
from ..quantize import (
    QuantizeOptions,
    _result,
    load_model,
    ranges_from_cache,
    ranges_from_json,
    save_model,
)
from .fallback import check_reachable, fallback
from .gate import AccuracyCheck, AccuracyLoss, _fp16_floor
from .ranges import AUTO_MIN_SAMPLES, DEFAULT_HOLDOUT, activation_ranges, calibration_tensors, split_holdout
from .report import HeldOutCheck, QuantizeRunResult, SmoothQuantReport, _kernel_report, build_report, report_markdown
from .select import (
    Evaluator,
    _equalize,
    _smoothed_ranges,
    choose_smoothing,
    choose_weight_rounding,
    select_method,
)

log = logging.getLogger(__name__)
# --------------------------------------------------------------------------------------------
# The quantize command's engine


def run_quantize(
    onnx_path: str | Path,
    out_path: str | Path,
    *,
    ranges: str | Path | None = None,
    cache: str | Path | None = None,
    data: Any = None,
    method: str | None = None,
    options: QuantizeOptions | None = None,
    accuracy_target: AccuracyTarget | str | None = None,
    eval_data: Any = None,
    holdout: float = DEFAULT_HOLDOUT,
    metric_output: str | None = None,
    seed: int = 0,
    batch_size: int = 32,
    threads: int | None = None,
    data_args: Mapping[str, Any] | None = None,
    report_dir: str | Path | None = None,
    force: bool = True,
    progress: bool = False,
    smooth_quant: float | str | None = "auto",
    check: AccuracyCheck | None = AccuracyCheck(),
    memory_budget_mb: float | None = None,
    weight_rounding: str = "auto",
    rounding_budget_s: float | None = None,
    accept_accuracy_loss: bool = True,
    equalize: bool = True,
) -> QuantizeRunResult:
    """Quantize ``onnx_path`` into ``out_path`` (see the module doc). Exactly one of ``ranges``
    (JSON), ``cache`` (TensorRT cache) or ``data`` (calibrate here) gives the ranges; with
    ranges or a cache, ``data``/``eval_data`` only serve evaluation. Nothing is written when
    anything fails. ``metric_output`` names the output that ``auto`` and ``accuracy_target``
    are measured on (default: the first output; an embedding output wants ``cosine=``).
    ``method``: a registered method or "auto"; None: auto when calibrating here.
    ``smooth_quant``: SmoothQuant alpha, "auto" (chosen on the held-out data; nothing with ranges
    or a cache, which were computed without it) or None.
    ``check``: the held-out accuracy check against FP32 the run ends with (result in
    ``report.accuracy_check``, a warning when it fails; None skips it); when it fails and
    ``accept_accuracy_loss`` is False, :class:`AccuracyLoss` is raised and nothing is written.
    ``weight_rounding``: see :func:`choose_weight_rounding`."""
    from ..data import open_data
    from ..modelio import ModelIO
    from ..smoothquant import parse_alpha

    options = options or QuantizeOptions()
    if isinstance(accuracy_target, str):
        accuracy_target = AccuracyTarget.parse(accuracy_target)
    given = [n for n, v in (("--ranges", ranges), ("--cache", cache)) if v is not None]
    if len(given) > 1:
        raise UsageError("give only one of --ranges, --cache")
    if given and method is not None:
        raise UsageError(f"--method {method} calibrates on --data; it cannot be combined with {given[0]} "
                         "(ranges are used as given)")
    if not given and data is None:
        raise UsageError("no ranges: give --ranges R.json, --cache C.cache or --data SPEC")
    # the method: as given, else auto when calibrating here; with ranges/a cache it names their source
    method = method or ("auto" if not given else "entropy")
    if method != "auto" and method not in H.METHODS:
        raise UsageError(f"--method '{method}': expected one of {', '.join(H.method_names(auto=True))}")
    if Path(onnx_path).resolve() == Path(out_path).resolve():
        raise UsageError(f"-o {out_path}: would overwrite the input model")
    if given and parse_alpha(smooth_quant) == "auto":
        smooth_quant = None
    elif given and parse_alpha(smooth_quant) is not None:
        raise UsageError(f"--smooth-quant {smooth_quant}: SmoothQuant needs calibration on --data, not {given[0]}")
    onnx_path = Path(onnx_path)
    model = fp32_model = load_model(onnx_path)
    io = ModelIO.from_onnx(model, source=onnx_path)
    outputs = [o.name for o in model.graph.output]
    if metric_output is not None and metric_output not in outputs:
        raise UsageError(f"--metric-output '{metric_output}': {onnx_path.name} has no such output (outputs: {', '.join(outputs)})")
    if accuracy_target is not None:
        accuracy_target = accuracy_target.on_output(metric_output)
    data_args = dict(data_args or {})
    if Path(out_path).exists() and not force:
        raise UsageError(f"{out_path}: already exists (use --force to overwrite)")

    def open_(spec: Any, with_args: bool = True) -> Any:
        return open_data(spec, io=io, **(data_args if with_args else {}))

    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    sq_request = parse_alpha(smooth_quant)
    need_eval = method == "auto" or accuracy_target is not None or check is not None or sq_request == "auto"
    calib_src = eval_src = None
    if given:
        if eval_data is not None:
            eval_src = open_(eval_data, with_args=False)
        elif data is not None:
            eval_src = open_(data)
    else:
        source = open_(data)
        if eval_data is not None:
            calib_src, eval_src = source, open_(eval_data, with_args=False)
        elif need_eval:
            try:
                calib_src, eval_src = split_holdout(source, holdout, seed)
                log.info("holding out %d of %d samples of %s for evaluation", len(eval_src), len(source), source.name)
            except UsageError:
                if method == "auto" or accuracy_target is not None:
                    raise
                log.warning("%s: %d samples are too few to hold some out; the INT8 model's accuracy is NOT checked "
                            "against FP32 (give more data or --eval-data)", source.name, len(source))
                calib_src = source
        else:
            calib_src = source
    if accuracy_target is not None and eval_src is None:
        raise UsageError("--accuracy-target needs evaluation data (--data or --eval-data)")

    # A top-1 target on --metric-output makes that output a classification output too.
    top1_on = metric_output if accuracy_target is not None and accuracy_target.kind != "cosine" else None
    evaluator = Evaluator(model, eval_src, batch_size=batch_size, threads=threads,
                          label_output=top1_on) if eval_src is not None else None
    if accuracy_target is not None and evaluator is not None:
        check_reachable(accuracy_target, evaluator)  # before calibrating: fail fast

    stats = None
    equalization: dict[str, Any] = {"applied": False, "note": "ranges or a cache were given (computed on the original model)"}
    if ranges is not None:
        per_method = {"ranges": ranges_from_json(ranges)}
    elif cache is not None:
        per_method = {"cache": activation_ranges(ranges_from_cache(cache, model))}
    else:
        from ..calibrate import Calibrator
        from ..smoothquant import smooth_candidates

        # only the input tensor names are used: no prepared (renamed) copy of the weights needed
        channel_tensors = list(smooth_candidates(model)) if sq_request is not None else []
        from ..calibrate import DEFAULT_MEMORY_BUDGET_MB

        equalization = _equalize(model, calib_src, evaluator, options, equalize, threads)
        calib_path = onnx_path
        if equalization.get("applied"):
            import tempfile

            model = equalization.pop("model")
            tmp_dir = tempfile.TemporaryDirectory(prefix="trtrepo-equalized-")
            calib_path = Path(tmp_dir.name) / "equalized.onnx"
            save_model(model, calib_path)
        equalization.pop("model", None)
        t_cal = time.perf_counter()
        cal = Calibrator(calib_path, calib_src, batch_size=batch_size, progress=progress,
                         tensors=calibration_tensors(model, options), channel_tensors=channel_tensors,
                         memory_budget_mb=memory_budget_mb or DEFAULT_MEMORY_BUDGET_MB)
        stats = cal.collect()
        timings["calibration"] = time.perf_counter() - t_cal
        if equalization.get("seconds"):
            timings["equalization"] = equalization["seconds"]
        del cal  # its ONNX Runtime session holds the model with every tensor as an output
        import gc

        gc.collect()
        methods = tuple(H.METHODS) if method == "auto" else (method,)
        per_method = {m: activation_ranges(stats.compute(m), stats) for m in methods}
    if sq_request is not None and stats is None and sq_request != "auto":
        raise UsageError("--smooth-quant needs calibration data (--data): ranges and caches carry no per-channel statistics")
    metric = "cosine" if (accuracy_target is not None and accuracy_target.kind == "cosine") else None
    smooth = choose_smoothing(model, stats, next(iter(per_method.values())), options, evaluator, sq_request,
                              metric_output=metric_output, metric=metric)
    base_model = smooth.model
    per_method = {k: _smoothed_ranges(v, smooth.ranges) for k, v in per_method.items()}
    best, candidates = select_method(base_model, per_method, options, evaluator, metric_output=metric_output, metric=metric)
    assert best.quantized is not None
    rounding = choose_weight_rounding(base_model, per_method[best.label], options, calib_src, evaluator, best,
                                      weight_rounding, metric_output=metric_output, metric=metric,
                                      budget_s=rounding_budget_s, threads=threads)
    timings.update(rounding.seconds)
    if rounding.model is not None and rounding.best is not None:
        base_model, best = rounding.model, rounding.best
    assert best.quantized is not None
    chosen, metrics = best.quantized, best.metrics
    fb = None
    if accuracy_target is not None:
        if evaluator is None:  # pragma: no cover - eval_src is required above
            raise UsageError("--accuracy-target needs evaluation data (--data or --eval-data)")
        fb = fallback(base_model, per_method[best.label], options, evaluator, accuracy_target, best)
        chosen, metrics = fb.chosen, fb.metrics
    if metrics is None and evaluator is not None and check is not None:
        metrics = evaluator(chosen.model)
    check_failures: list[str] | None = None
    ungated: list[str] = []
    verdict: dict[str, Any] | None = None
    noise_floor: dict[str, Any] | None = None
    if check is not None and metrics is not None:
        verdict = check.judge(metrics[metric_output or outputs[0]])
        if evaluator is not None and verdict["rule"] == "confident top-1 agreement":
            noise_floor = _fp16_floor(model, evaluator, metric_output or outputs[0])
            verdict["fp16_noise_floor"] = noise_floor
        check_failures = check.failures(metrics, metric_output or outputs[0])
        # The other outputs are measured too: one below the floor is named (not gated).
        ungated = [f for f in check.failures(metrics) if f not in check_failures]
        if ungated:
            log.warning("INT8 accuracy of outputs not gated by the check (the gate is '%s'): %s",
                        metric_output or outputs[0], "; ".join(ungated))
        if check_failures:
            log.warning("INT8 ACCURACY LOSS on %d held-out samples: %s", len(eval_src) if eval_src is not None else 0,
                        "; ".join(check_failures))
            if not accept_accuracy_loss:
                raise AccuracyLoss(f"{onnx_path.name}: INT8 fails the held-out check vs FP32: {'; '.join(check_failures)}; "
                                   f"nothing written to {out_path} (accept the loss to write it anyway)")

    speed = evaluator.time_ratio(fp32_model, chosen.model) if evaluator is not None else None
    path = save_model(chosen.model, out_path, force=force)
    base = _result(chosen, path, options, best.label)
    base.layers_in_float = list(chosen.plan.excluded)
    timings["total"] = time.perf_counter() - t_start  # calibration (both passes) and total, selection and checks included
    gated = metric_output or outputs[0]
    report = build_report(
        onnx_path, path, options, method, best, candidates, metrics, accuracy_target, fb, eval_src, calib_src,
        chosen=chosen, seconds=timings, metric_output=gated, speed=speed, rounding=rounding, equalization=equalization,
        smooth_quant=SmoothQuantReport.of(sq_request, smooth),
        accuracy_check=None if check is None else HeldOutCheck.of(check, gated, check_failures, ungated, verdict),
        integer_kernels=(_kernel_report(base_model, per_method[best.label], options, chosen)
                         if options.target == "onnxruntime" else None),
        input_methods=None if stats is None else {t.name: best.label for t in io.inputs if t.name in stats})
    if report_dir is not None:
        from ..fsutil import report_json, write_report

        write_report(report_dir, "quantize", report_json(report.to_dict()), report_markdown(report))
        report = replace(report, report_dir=Path(report_dir))
    result = QuantizeRunResult(**{f.name: getattr(base, f.name) for f in fields(base)}, report=report)
    return result


def quantize_for_deploy(onnx_path: str | Path, data_source: Any, out_path: str | Path,
                        target: str = "onnxruntime", *, method: str = "auto", batch_size: int = 32,
                        force: bool = True, progress: bool = False, metric_output: str | None = None,
                        reduce_range: bool = False, smooth_quant: float | str | None = "auto",
                        exclude_ops: Sequence[str] = (), exclude_nodes: Sequence[str] = (),
                        accuracy_target: AccuracyTarget | str | None = None,
                        weight_rounding: str = "auto") -> QuantizeRunResult:
    """What ``trtrepo deploy`` calls (``exclude_ops``/``exclude_nodes``/``accuracy_target`` as in
    ``trtrepo quantize``): calibrate ``onnx_path`` on ``data_source`` (a data spec
    or :class:`~trtrepo.data.DataSource`; one collection pass), pick the method and write the
    Q/DQ model for ``target``. ``auto`` picks the best of the registered methods on a held-out fifth
    of the data, and falls back to entropy (ModelOpt's default) below
    :data:`AUTO_MIN_SAMPLES` samples. ``metric_output`` is the output ``auto`` compares the methods
    on (default: the first output; give the embedding of a model whose first output is not a
    classifier). ``reduce_range``: 7-bit weights (onnxruntime target, see :mod:`trtrepo.cpu`).
    ``smooth_quant``: see :func:`run_quantize`. The run ends with the held-out
    check against FP32 (``result.report.accuracy_check``). Returns the path, the method used
    and the report."""
    from ..data import DataSource, open_data
    from ..modelio import ModelIO

    if method == "auto":
        source = data_source
        if not isinstance(source, DataSource):
            source = open_data(data_source, io=ModelIO.from_onnx(load_model(onnx_path)))
        if len(source) < AUTO_MIN_SAMPLES:
            log.info("%d samples: too few to hold some out; using entropy", len(source))
            method = "entropy"
        data_source = source
    return run_quantize(onnx_path, out_path, data=data_source, method=method,
                        options=QuantizeOptions(target=target, reduce_range=reduce_range, exclude_ops=tuple(exclude_ops),
                                                exclude_nodes=tuple(exclude_nodes)),
                        batch_size=batch_size, force=force, progress=progress, metric_output=metric_output,
                        smooth_quant=smooth_quant, accuracy_target=accuracy_target, weight_rounding=weight_rounding)
