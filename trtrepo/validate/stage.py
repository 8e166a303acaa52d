"""The whole check (:func:`validate`) and its phases run on a prepared target: payloads, speed
against the reference, latency per concurrency."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts import builtin
from ..contracts.payload import Payload, expected_shapes
from ..cpu import available_cores
from ..data import DataOptions, iter_batches
from ..errors import OptionError, UsageError
from ..measure import cpu_sample, machine_usage, machine_warnings
from ..modelio import ModelIO
from ..modelsource import resolve_source
from ..preprocessing import exporter_preprocess
from ..progress import Phase, bar_disabled, phase, status, task
from .accuracy import BoxChecks, make_reference, reference_io, reference_rows, run_accuracy
from .client import TritonTarget
from .contract import (
    ContractError,
    Mismatch,
    booked,
    check_thresholds,
    compare_contract,
    encoded_input,
    endpoint_io,
    stats_diff,
)
from .detection import (
    check_letterbox,
    detection_thresholds,
    detector_endpoint,
    detector_output_classes,
    labels_on_images,
    map_drop_thresholds,
    reference_detections,
    run_detection,
    served_config,
)
from .fleet import added_requests, agreement, measure_together, total_row
from .options import ReferenceSource, Thresholds, ValidateOptions
from .report import ValidationReport, level_overhead
from .shm import cuda_shm
from .speed import (
    SLOW_CALL_S,
    SPEED_FLOOR_S,
    SpeedOptions,
    SpeedRun,
    TimedReference,
    compare_speed,
    reference_estimate_s,
    resolve_reference_device,
    slow_reference_message,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# The whole check


def make_payloads(source: Any, io: ModelIO, batch_size: int) -> tuple[list[Payload], list[np.ndarray | None]]:
    """Batches of the data set as requests (inputs cast to the model's dtypes)."""

    payloads, labels = [], []
    for b in iter_batches(source, batch_size, io):
        payloads.append(Payload({k: np.ascontiguousarray(v) for k, v in b.inputs.items()},
                                expected_shapes(io, b.size), b.indices))
        labels.append(b.labels)
    if not payloads:
        raise UsageError(f"{getattr(source, 'name', 'data')}: no samples")
    return payloads, labels


def encoded_payloads(payloads: Sequence[Payload], files: Sequence[Path], image_input: str) -> list[Payload]:
    """The same batches as requests to an image endpoint: each sample's file bytes, as read from
    disk (the server decodes and preprocesses them), one ``[batch, 1]`` object array."""
    out = []
    for p in payloads:
        idx = p.indices if p.indices is not None else np.arange(p.batch)
        blobs = np.empty((len(idx), 1), dtype=object)
        for row, i in enumerate(idx):
            blobs[row, 0] = Path(files[int(i)]).read_bytes()
        out.append(Payload({image_input: blobs}, dict(p.expected), p.indices))
    return out


def _progress(total: int | None, desc: str, enabled: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", disable=bar_disabled(enabled), leave=False)


def validate(options: ValidateOptions, *, reference: ReferenceSource, data: DataOptions,
             report_dir: str | Path | None = None, thresholds: Thresholds | None = None) -> ValidationReport:
    """Run the deployment check against ``reference`` on the requests of ``data`` (its
    ``batch_size`` and ``extra`` are not used: ``options.batch_size`` sets the request size);
    write the report to ``report_dir`` when given. A PyTorch reference's export is cached
    (``reference.cache`` False: exported afresh, :func:`reference_io`).

    Raises :class:`UsageError` (exit 2) when the server cannot be reached, the model is unknown
    or the options are wrong, and :class:`ContractError` (exit 1, after the report is written)
    when the served IO does not match the reference. Threshold results are in the report
    (``report.passed``); the caller decides what to do with a failure.

    Time (issue 41): ``options.time_budget`` counts from here; the speed phase, the last, gets what
    is left of it and at least :data:`~trtrepo.validate.speed.SPEED_FLOOR_S` or the budget, the shorter (the accuracy and latency
    phases are bounded by their data and ``--max-trials``). Before any phase the reference is
    loaded and one warm call at batch 1 is timed: a slow one is announced with the phase's
    estimate and ``--no-reference-speed``. Each phase writes a status line
    (:func:`trtrepo.progress.status`) with its expected time, and long ones one every few seconds.

    Data without a preprocessing spec against an ONNX detector export that declares its input
    size (Ultralytics' metadata) is read through that export's letterbox
    (:func:`trtrepo.preprocessing.exporter_preprocess`), as ``deploy`` reads it.
    """

    started = time.perf_counter()
    load_start = cpu_sample().load1
    data = _with_export_letterbox(data, reference)
    thresholds = thresholds or Thresholds()
    speed = options.speed if options.latency else None
    speed_device = _speed_device(speed, reference)  # a device that is not there fails before any work
    req = _tensor_requests(reference, data, options.batch_size)
    _check_transport(options)
    with contextlib.ExitStack() as stack:
        stack.enter_context(task("validate"))  # progress lines of the phases below (trtrepo.progress)
        target = stack.enter_context(TritonTarget(options))
        fleet = [stack.enter_context(TritonTarget(options.server(u))) for u in options.urls[1:]]
        info = target.wait_ready()
        metadata, config = target.metadata(), target.config()
        version = target.resolve_version(metadata)
        for other in fleet:
            other.wait_ready()
        _to_image_endpoint(req, target, metadata, config, options)
        mismatches = compare_contract(req.served_io, metadata, config, batch_size=options.batch_size)
        mismatches += _fleet_mismatches(fleet, req.served_io, version, options.batch_size)
        server = _server_record(options, info, version, reference.source, req, str(data.spec), config)
        report = ValidationReport(server, _contract_record(mismatches, server["max_batch_size"], req, metadata))
        if mismatches:
            if report_dir is not None:
                report.write(report_dir)
            raise ContractError(options.model, mismatches)
        target.prepare(req.served_io)
        for other in fleet:
            other.prepare(req.served_io)
        timed, call_s = _timed_reference(req, reference, options, (speed, speed_device), server["max_batch_size"])
        if fleet:
            server["servers"] = list(options.urls)
            report.fleet = {"servers": list(options.urls),
                            "agreement": agreement([target, *fleet], req.payloads, options.max_server_diff)}
        if options.accuracy:
            _accuracy_phase(report, target, req, reference, options, call_s)
        if options.latency:
            with phase("latency", note=_latency_estimate(options)):
                report.latency = run_latency(target, req.payloads, options, version, config, fleet=fleet)
        _speed_phase(report, target, req, options, speed=(speed, speed_device), timed=(timed, call_s),
                     served=(server, config), onnx=reference.onnx, clock=(started, load_start))
        summary = report.to_dict()
        report.thresholds = (check_thresholds(summary, thresholds) + detection_thresholds(summary, thresholds.min_map)
                             + map_drop_thresholds(summary, thresholds.max_map_drop))
    if report_dir is not None:
        report.write(report_dir)
    return report


@dataclass
class _Requests:
    """What validate sends and compares against: the opened data, the reference's IO, the IO the
    served model is asked on (``io`` itself unless an image endpoint), the request batches with
    their labels, and for an image endpoint its input, files and detector endpoint (if one)."""

    source: Any
    io: ModelIO
    served_io: ModelIO
    payloads: list[Payload]
    batch_labels: list[np.ndarray | None]
    image_input: str | None = None
    endpoint: Any = None
    files: list[Path] = field(default_factory=list)


def _with_export_letterbox(data: DataOptions, reference: ReferenceSource) -> DataOptions:
    """Decision: data without a preprocessing spec against a detector exported with its input size
    is read through that export's own letterbox; any other data is used as given."""
    if data.preprocess is not None:
        return data
    exported = exporter_preprocess(reference.onnx if reference.onnx is not None else reference.source)
    return data if exported is None else replace(data, preprocess=exported)


def _speed_device(speed: SpeedOptions | None, reference: ReferenceSource) -> str | None:
    """The device the reference is timed on, resolved now so that a missing one fails before any
    work; None when the speed phase does not run."""
    if speed is None:
        return None
    return resolve_reference_device(speed.device, resolve_source(reference.source, reference.weights).kind)


def _tensor_requests(reference: ReferenceSource, data: DataOptions, batch_size: int) -> _Requests:
    """The reference's IO and the data as tensor requests. Decision: a PyTorch reference without
    an ONNX file or input shapes (and not a built-in) takes its input shapes from the data."""
    onnx, weights = reference.onnx, reference.weights
    raw = None
    src = resolve_source(reference.source, weights)
    if onnx is None and not reference.input_shapes and src.is_torch and builtin.builtin(src.kind) is None:
        raw = data.open()
    io = reference_io(reference.source, onnx=onnx, weights=weights, input_shapes=reference.input_shapes, data=raw,
                      output_names=reference.output_names, cache=reference.cache)
    source = data.open(io)
    payloads, batch_labels = make_payloads(source, io, batch_size)
    return _Requests(source, io, io, payloads, batch_labels)


def _check_transport(options: ValidateOptions) -> None:
    """CUDA shared memory needs a GPU (checked before any traffic); shared memory of any kind
    needs a single server."""
    if options.shared_memory == "cuda":
        cuda_shm()  # fail before any traffic on a machine without a GPU
    if len(options.urls) > 1 and options.shared_memory != "none":
        raise OptionError("shared_memory", f"{options.shared_memory}: one server only ({{url}} names {len(options.urls)})",
                          others={"url": "the server URL"})


def _to_image_endpoint(req: _Requests, target: TritonTarget, metadata: Mapping[str, Any], config: Mapping[str, Any],
                       options: ValidateOptions) -> None:
    """Decision: a served model that takes encoded images gets the image files themselves (the
    data must be an image folder); a detector ensemble among those gets one image per request
    and answers detections. A tensor model's requests stay as they are."""
    image_input = encoded_input(req.io, metadata)
    req.image_input = image_input
    if image_input is None:
        return
    found = req.source.sample_files()
    if found is None:
        raise OptionError("", f"model '{options.model}' takes encoded images (input '{image_input}', BYTES): "
                              f"{{data_spec}} must be an image folder, whose files go to the server as they "
                              f"are and through {{preprocess}} into the reference",
                          others={"data_spec": "the data", "preprocess": "the preprocessing"})
    req.files = found
    endpoint = detector_endpoint(req.io, metadata, config, lambda name: served_config(target, name))
    req.endpoint = endpoint
    if endpoint is not None:  # a detector ensemble: one image per request, detections out
        _check_detector_options(options)
        check_letterbox(getattr(req.source, "preprocess", None))
        req.served_io, req.payloads = endpoint.served_io(req.io), endpoint.payloads(found)
    else:
        req.served_io = endpoint_io(req.io, image_input)
        req.payloads = encoded_payloads(req.payloads, found, image_input)


def _fleet_mismatches(fleet: Sequence[TritonTarget], served_io: ModelIO, version: Any, batch_size: int) -> list[Mismatch]:
    """Every server of a fleet serves the same model: its contract and its version."""
    mismatches: list[Mismatch] = []
    for other in fleet:
        om, oc = other.metadata(), other.config()
        mismatches += [Mismatch(f"{other.url}: {m.field}", m.expected, m.actual)
                       for m in compare_contract(served_io, om, oc, batch_size=batch_size)]
        other_version = other.resolve_version(om)
        if other_version != version:
            mismatches.append(Mismatch(f"{other.url}: version", version, other_version))
    return mismatches


def _server_record(options: ValidateOptions, info: Mapping[str, Any], version: Any, reference: str, req: _Requests,
                   data_spec: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The report's ``server`` entry: what was validated against what."""
    return {"url": options.url, "protocol": options.protocol, "model": options.model, "version": version,
            "server_version": info.get("server_version", ""), "server_ready": info.get("server_ready"),
            "extensions": info.get("extensions", []), "reference": reference,
            "data": getattr(req.source, "name", data_spec),
            "max_batch_size": int(config.get("max_batch_size", 0) or 0),
            "dynamic_batching": "dynamic_batching" in config,
            "endpoint": "encoded images" if req.image_input else "tensors", "image_input": req.image_input}


def _contract_record(mismatches: Sequence[Mismatch], max_batch_size: int, req: _Requests,
                     metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The report's ``contract`` entry."""
    return {"ok": not mismatches, "max_batch_size": max_batch_size,
            "mismatches": [m.to_dict() for m in mismatches],
            "reference_io": req.io.to_dict(), "request_io": req.served_io.to_dict(),
            "served": {"inputs": metadata.get("inputs", []), "outputs": metadata.get("outputs", [])}}


def _timed_reference(req: _Requests, reference: ReferenceSource, options: ValidateOptions,
                     speed: tuple[SpeedOptions | None, str | None],
                     max_batch_size: int) -> tuple[TimedReference | None, float | None]:
    """Decision: the reference is loaded and warmed up front only when its speed will be timed:
    a speed phase with a device, tensor requests, and a batch axis on both sides."""
    opts, device = speed
    if opts is None or device is None or req.image_input is not None or max_batch_size <= 0 or not req.io.has_batch_axis:
        return None, None
    return _warm_reference(reference.source, req.io, opts, device, reference.weights, req.payloads, options.time_budget)


def _accuracy_phase(report: ValidationReport, target: TritonTarget, req: _Requests, reference: ReferenceSource,
                    options: ValidateOptions, call_s: float | None) -> None:
    """The reference's outputs on every sample, then the served model's on the same requests:
    detections for a detector endpoint, output agreement otherwise."""
    source = req.source
    ref = make_reference(reference.source, req.io, weights=reference.weights)
    guess = "" if call_s is None else f"at most about {call_s * len(source):.0f} s at {call_s:.2f} s a sample"
    bar = _progress(len(source), "reference", options.progress)
    try:
        with phase("accuracy reference", len(source), "samples", note=guess) as ph:
            rows = reference_rows(ref, source, req.io, progress=_counting(ph, bar.update))
    finally:
        bar.close()
    bar = _progress(len(req.payloads), "accuracy", options.progress)
    try:
        with phase("accuracy served", len(req.payloads), "requests") as ph:
            truth = source.box_labels()
            if req.endpoint is not None:
                preprocess = getattr(source, "preprocess", None)
                refs = reference_detections(rows, req.files, preprocess, req.endpoint)
                report.detection = run_detection(target, req.endpoint, req.payloads, refs,
                                                 source.sample_names() or [Path(f).name for f in req.files],
                                                 concurrency=max(options.concurrency), worst=options.worst,
                                                 progress=_counting(ph, bar.update),
                                                 truth=None if truth is None else labels_on_images(truth, req.files,
                                                                                                   preprocess))
            else:
                report.accuracy = run_accuracy(target, req.payloads, rows, req.batch_labels,
                                               concurrency=max(options.concurrency), worst=options.worst,
                                               label_output=options.label_output,
                                               progress=_counting(ph, bar.update), names=source.sample_names(),
                                               detectors=BoxChecks(detector_output_classes(req.io), truth))
    finally:
        bar.close()
    if report.accuracy is not None:
        report.accuracy["batch_size"] = options.batch_size


def _speed_phase(report: ValidationReport, target: TritonTarget, req: _Requests, options: ValidateOptions, *,
                 speed: tuple[SpeedOptions | None, str | None], timed: tuple[TimedReference | None, float | None],
                 served: tuple[Mapping[str, Any], Mapping[str, Any]], onnx: str | Path | None,
                 clock: tuple[float, float | None]) -> None:
    """Decision: the speed phase is skipped (with a warning) for an image endpoint, whose decoding
    the reference lacks; otherwise it runs until the deadline (what is left of the time budget
    counted from ``clock``'s start, at least :data:`SPEED_FLOOR_S` or the budget) and keeps the
    first warm call's time."""
    opts, device = speed
    (timed_ref, call_s), (server, config), (started, load_start) = timed, served, clock
    if opts is not None and req.image_input is not None:
        log.warning("speed against the reference skipped: model '%s' takes encoded images (its decoding is not in "
                    "the reference); validate the model behind the ensemble for that", options.model)
        return
    if opts is None or device is None:
        return
    deadline = max(started + options.time_budget, time.perf_counter() + min(SPEED_FLOOR_S, options.time_budget)) \
        if options.time_budget is not None else math.inf
    report.speed_vs_reference = run_speed(target, req.payloads, req.io, opts, timed=timed_ref,
                                          server={**server, "backend": _backend(config)},
                                          accuracy=report.accuracy, progress=options.progress,
                                          fp32=(onnx, "onnx") if onnx is not None else (req.io.source, "export"),
                                          run=SpeedRun(deadline, options.time_budget, load_start))
    if report.speed_vs_reference is not None and call_s is not None:
        report.speed_vs_reference["first_call"] = {"batch_size": 1, "seconds": call_s, "slow": call_s >= SLOW_CALL_S}


def _check_detector_options(options: ValidateOptions) -> None:
    """A detector ensemble takes one image per request (``max_batch_size`` 0: the box count
    differs per image), and its outputs' sizes are not known before the response (no
    shared-memory regions to size)."""
    if options.batch_size != 1:
        raise OptionError("batch_size", f"{options.batch_size}: model '{options.model}' is a detector ensemble, which "
                                        f"takes one image per request; give 1", concept="the request batch size")
    if options.shared_memory != "none":
        raise OptionError("shared_memory", f"{options.shared_memory}: model '{options.model}' is a detector ensemble, "
                                           f"whose box count differs per response; give none",
                          concept="the shared memory")


def run_speed(target: TritonTarget, payloads: Sequence[Payload], io: ModelIO, speed: SpeedOptions, *,
              timed: TimedReference | None, server: Mapping[str, Any], accuracy: Mapping[str, Any] | None = None,
              progress: bool | None = None, fp32: tuple[str | Path | None, str] | None = None,
              run: SpeedRun | None = None) -> dict[str, Any] | None:
    """The reference's own latency beside the served model's at concurrency 1, per batch size
    (:func:`trtrepo.validate.speed.compare_speed`) until ``run.deadline``; ``None`` (with a warning) for a
    model without a batch axis (``timed`` is None then: :func:`validate` loads and warms the
    reference up front only for a model with one). ``fp32``: (path, ``"onnx"`` for the deployed
    model given or ``"export"`` for the reference's cached export), timed beside them on ONNX
    Runtime when the file is there and the reference is not an ONNX model itself (which is timed
    on ONNX Runtime already)."""

    mbs = int(server.get("max_batch_size", 0) or 0)
    if timed is None or mbs <= 0 or not io.has_batch_axis:
        log.warning("speed against the reference skipped: model '%s' has no batch axis (max_batch_size 0)", server.get("model"))
        return None
    run = run or SpeedRun()
    onnx = None
    path, origin = fp32 or (None, "")
    if path and timed.engine == "torch" and str(path).endswith(".onnx") and Path(path).is_file():
        onnx = TimedReference.for_onnx(path, io, threads=speed.threads, origin=origin)
    bar = _progress(len(speed.batch_sizes), "speed vs reference", progress)
    left = f"{run.deadline - time.perf_counter():.0f} s of the time budget left" if math.isfinite(run.deadline) else \
        "no time budget (--thorough)"
    try:
        with phase("reference speed", len(speed.batch_sizes), "batch sizes", note=left) as ph:
            return compare_speed(target, timed, [p.inputs for p in payloads], io, speed, max_batch_size=mbs,
                                 accuracy=accuracy, server=server, onnx=onnx,
                                 run=replace(run, progress=_counting(ph, bar.update),
                                             note=lambda text: ph.advance(0, note=text)))
    finally:
        bar.close()


def _warm_reference(reference: str, io: ModelIO, speed: SpeedOptions, device: str, weights: str | None,
                    payloads: Sequence[Payload], budget_s: float | None) -> tuple[TimedReference, float]:
    """The timed reference, loaded, and one warm call at batch 1 (seconds): before any phase, so a
    slow reference is announced while the run can still be stopped."""
    with phase("reference warm-up", note="loading it, then two calls at batch 1"):
        timed = TimedReference(reference, io, device=device, threads=speed.threads, weights=weights)
        feed = {k: np.ascontiguousarray(v[:1]) for k, v in payloads[0].inputs.items()}
        call_s = timed.warm([feed], 2)
    estimate = reference_estimate_s(call_s, speed.batch_sizes, speed.iterations, speed.warmup)
    if call_s >= SLOW_CALL_S:
        log.warning("%s", slow_reference_message(timed.label, device, call_s, speed.batch_sizes, estimate, budget_s))
    else:
        status("reference: %s takes %.3f s a call at batch 1 on the %s; its speed phase takes about %.0f s",
               timed.label, call_s, device, estimate if budget_s is None else min(estimate, budget_s))
    return timed, call_s


def _backend(config: Mapping[str, Any]) -> str | None:
    """The served model's backend (``python``, ``onnxruntime``, ``tensorrt``...) from its config."""
    return str(config.get("backend") or config.get("platform") or "") or None


def _latency_estimate(options: ValidateOptions) -> str:
    """What the latency levels will take: three windows per level at least, ``--max-trials`` at most."""
    levels = options.request_rates or options.concurrency
    what = ", ".join(f"{lv:g}" for lv in levels)
    kind = "request rate(s)" if options.request_rates else "concurrency level(s)"
    st = options.stability
    if st.requests is not None:
        return f"{kind} {what}: {3 * st.requests} to {st.max_trials * st.requests} request(s) each after the warm-up"
    return (f"{kind} {what}: about {3 * st.interval_s * len(levels):.0f} s, at most {st.max_trials * st.interval_s * len(levels):.0f} s "
            f"(windows of {st.interval_s:g} s until three agree)")


def _counting(ph: Phase, inner: Callable[[int], Any] | None = None) -> Callable[[int], None]:
    """A progress callback (``update(n)``): passes ``n`` on (a tqdm bar) and counts it in the
    phase, whose note becomes the expected time left (elapsed per unit so far, times the units left)."""

    def update(n: int = 1) -> None:
        if inner is not None:
            inner(n)
        done = ph.done + n
        left = None
        if ph.total and 0 < done < ph.total:
            left = f"about {(time.monotonic() - ph.start) / done * (ph.total - done):.0f} s left"
        ph.advance(n, note=left)

    return update


def run_latency(target: TritonTarget, payloads: Sequence[Payload], options: ValidateOptions, version: str,
                config: Mapping[str, Any] | None = None, fleet: Sequence[TritonTarget] = ()) -> dict[str, Any]:
    """Warm-up, then each concurrency level (or request rate) measured in windows until stable
    (:meth:`TritonTarget.measure`), with the server's statistics for the same requests as the
    reported client figures (the windows end where the server's count stands,
    :mod:`~trtrepo.validate.load`; ``client_requests`` and ``server_requests`` say so, and the
    overhead is computed only where they are equal, :func:`~trtrepo.validate.report.level_overhead`)
    and what the machine did meanwhile; with shared memory, the lowest level again without it, to say when
    shared memory made it slower.

    With ``fleet`` (more servers of the same repository) every level runs on all servers at once,
    each with the level's concurrency (or rate) of its own: the level's row holds the totals
    (throughputs added, every server's latencies together; ``server`` statistics and windows of
    the first server) and ``servers`` one row per server."""

    use_shm = options.shared_memory != "none"
    stab = options.stability
    run = _LatencyRun(target, tuple(fleet), payloads, options, version)
    if use_shm:
        target.setup_shared_memory(options.shared_memory, run.slots(), payloads)
    levels = []
    warnings: list[str] = []
    try:
        for lvl in run.levels_in:
            level, level_warnings = run.level(lvl)
            levels.append(level)
            warnings += level_warnings
    finally:
        if use_shm:
            target.release_shared_memory()
    comparison = None
    if use_shm and levels:
        shm_warnings, comparison = _shm_comparison(target, payloads, options, levels[0], config or {})
        warnings += shm_warnings
    open_loop = run.open_loop
    return {"shared_memory_comparison": comparison, "measurement": stab.to_dict(), "mode": "request_rate" if open_loop else "concurrency",
            "distribution": options.distribution if open_loop else None, "warmup": options.warmup,
            "batch_size": options.batch_size, "shared_memory": options.shared_memory, "levels": levels,
            "warnings": warnings,
            # kept for readers of schema /2
            "requests_per_level": options.requests, "duration_s": None if options.requests else stab.interval_s}


class _LatencyRun:
    """The latency phase's levels on one server or a fleet: closed loop (a concurrency per level)
    or open loop (a request rate per level, ``options.request_rates`` given)."""

    def __init__(self, target: TritonTarget, fleet: tuple[TritonTarget, ...], payloads: Sequence[Payload],
                 options: ValidateOptions, version: str) -> None:
        self.target, self.fleet, self.payloads, self.options, self.version = target, fleet, payloads, options, version
        self.use_shm = options.shared_memory != "none"
        self.open_loop = bool(options.request_rates)
        self.levels_in = list(options.request_rates) if self.open_loop else list(options.concurrency)
        self.cores = available_cores()
        self.local = _local(options.url)

    def slots(self) -> int:
        """Decision: shared-memory slots are the highest concurrency, or for an open loop the
        highest rate clamped to [8, 256] requests in flight."""
        opts = self.options
        return max(opts.concurrency) if not self.open_loop else min(256, max(8, int(max(opts.request_rates))))

    def level(self, lvl: float) -> tuple[dict[str, Any], list[str]]:
        """One level measured: its row (client figures, the server's for the same requests,
        overhead, machine usage) and the run's warnings about it."""
        target, fleet, options, version = self.target, self.fleet, self.options, self.version
        c = None if self.open_loop else int(lvl)
        if options.warmup:
            for t in (target, *fleet):
                t.load(self.payloads, c or 1, requests=max(options.warmup, c or 1), use_shm=self.use_shm)
        befores = [t.settled_statistics(version) for t in fleet]
        before = target.settled_statistics(version)
        cpu0 = cpu_sample()
        ms = self._measure(lvl, c, before, befores)
        m = ms[0]
        usage = machine_usage(cpu0, cpu_sample(), self.cores)
        server = stats_diff(*self._readings(target, m, before), options.model, version)
        row = m.summary()
        together = server  # the servers' figures of the row's requests (a fleet: every server's added)
        if fleet:
            row, together = self._fleet_row(row, server, ms, befores)
        client = row["client_ms"]
        overhead, overhead_note = level_overhead(client["mean"], row["requests"], together)
        label = f"request rate {lvl:g}/s" if self.open_loop else f"concurrency {lvl}"
        level_warnings = self._level_warnings(lvl, row, usage)
        warnings = [] if row["stable"] else [
            f"{label}: not stable after {len(m.windows)} windows: throughput spread "
            f"{row['spread_pct']['throughput_pct']:.1f}%, latency spread "
            f"{row['spread_pct']['latency_pct']:.1f}% (limit {options.stability.pct:g}%)"]
        warnings += [f"{label}: {w}" for w in level_warnings]
        log.info("%s: %.1f infer/s, p99 %.2f ms%s", label, row["throughput"], client.get("p99", client["max"]),
                 "" if row["stable"] else " (not stable)")
        return ({"concurrency": c, **row, "server": server, "client_requests": row["requests"],
                 "server_requests": together["request_count"], "overhead_ms": overhead,
                 "overhead_note": overhead_note, "machine": usage, "warnings": level_warnings}, warnings)

    def _measure(self, lvl: float, c: int | None, before: Any, befores: list[Any]) -> list[Any]:
        """Decision: a fleet is measured on all servers at once (each with the level's load of its
        own, books of every server); a single server with its shared memory and a progress bar."""
        target, fleet, options, version = self.target, self.fleet, self.options, self.version
        bar = _progress(None, f"rate={lvl:g}/s" if self.open_loop else f"c={lvl}", options.progress)
        try:
            if fleet:
                return list(measure_together([target, *fleet], self.payloads, options.stability, concurrency=c,
                                             rate=None if c else float(lvl), distribution=options.distribution,
                                             books=[t.server_books(version, b)
                                                    for t, b in zip((target, *fleet), (before, *befores), strict=True)]))
            return [target.measure(self.payloads, options.stability, concurrency=c, rate=None if c else float(lvl),
                                   distribution=options.distribution, use_shm=self.use_shm, progress=bar.update,
                                   books=target.server_books(version, before))]
        finally:
            bar.close()

    def _readings(self, t: TritonTarget, m: Any, before: Any) -> tuple[Any, Any]:
        """Decision: the server's figures of the reported windows' requests when the windows have
        them; otherwise (a fleet, or the server booked requests of another client) the whole level."""
        span = m.reported_readings()
        if span is None:
            span = before, t.settled_statistics(self.version, at_least=booked(before, self.options.model, self.version)
                                                + m.completed)
        return span

    def _fleet_row(self, row: dict[str, Any], server: dict[str, Any], ms: list[Any],
                   befores: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """A fleet level's row: the totals, one row per server; and every server's figures added."""
        per_server = [{"url": self.target.url, **row, "server": server}]
        for t, b, mt in zip(self.fleet, befores, ms[1:], strict=True):
            per_server.append({"url": t.url, **mt.summary(),
                               "server": stats_diff(*self._readings(t, mt, b), self.options.model, self.version)})
        row = {**row, **total_row(ms, self.options.stability.percentiles), "servers": per_server}
        return row, added_requests([p["server"] for p in per_server])

    def _level_warnings(self, lvl: float, row: Mapping[str, Any], usage: Mapping[str, Any]) -> list[str]:
        """The level's own warnings (report.level_verdict): the machine's, and for an open loop a
        client that sent more than DELAYED_SHARE of the requests over 1 ms late."""
        level_warnings = machine_warnings(usage, server_local=self.local)
        if self.open_loop and row.get("late_share", 0) > DELAYED_SHARE:
            level_warnings.append(f"{100 * row['late_share']:.0f}% of the requests left more than 1 ms late: the "
                                  f"client could not hold {lvl:g} requests/s")
        return level_warnings


DELAYED_SHARE = 0.10


def _local(url: str) -> bool:
    host = url.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _shm_comparison(target: TritonTarget, payloads: Sequence[Payload], options: ValidateOptions,
                    first: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The first level again without shared memory: a warning when shared memory was slower, and
    when CUDA shared memory feeds a model whose instances run on the CPU."""
    out = []
    kinds = {str(g.get("kind", "")) for g in config.get("instance_group", []) or []}
    if options.shared_memory == "cuda" and kinds and kinds <= {"KIND_CPU"}:
        out.append("CUDA shared memory feeds a model whose instances run on the CPU (instance_group KIND_CPU): every "
                   "tensor is copied from the GPU and back; use --shared-memory system or none for this model")
    c = first.get("concurrency")
    rate = first.get("request_rate")
    m = target.measure(payloads, options.stability, concurrency=c, rate=rate, distribution=options.distribution)
    plain = m.throughput
    with_shm = float(first["throughput"])
    first_label = f"request rate {rate:g}/s" if rate else f"concurrency {c}"
    if plain > with_shm * (1 + options.stability.pct / 100):
        out.append(f"{options.shared_memory} shared memory made it slower: {with_shm:.1f} infer/s at {first_label} "
                   f"against {plain:.1f} without shared memory (measured right after)")
    log.info("%s without shared memory: %.1f infer/s (with: %.1f)", first_label, plain, with_shm)
    return out, {"level": first_label, "with_shared_memory": with_shm, "without": plain, "stable": m.stable}
