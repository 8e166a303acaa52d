"""Pure parts: server statistics windows, the served-vs-reference contract comparison, thresholds;
:class:`ContractError`. Client latency percentiles are :func:`trtrepo.measure.latency_ms`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, TrtrepoError
from ..evaluate import ExpectedDrop
from ..modelio import ModelIO, TensorSpec
from .options import Thresholds

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Pure parts: statistics windows, contract comparison, thresholds


_STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _model_stats(stats: Mapping[str, Any], model: str, version: str) -> dict[str, Any]:
    rows = stats.get("model_stats", [])
    for row in rows:
        if row.get("name") == model and (not version or str(row.get("version")) == str(version)):
            return dict(row)
    if len(rows) == 1:
        return dict(rows[0])
    raise TrtrepoError(f"the server's statistics have no entry for model '{model}' version {version or '(latest)'}")


def booked(stats: Mapping[str, Any], model: str, version: str) -> int:
    row = _model_stats(stats, model, version)
    return _count_ns(row, "success")[0] + _count_ns(row, "fail")[0]


def _count_ns(row: Mapping[str, Any], key: str) -> tuple[int, int]:
    d = row.get("inference_stats", {}).get(key) or {}
    return int(d.get("count", 0) or 0), int(d.get("ns", 0) or 0)


def stats_diff(before: Mapping[str, Any], after: Mapping[str, Any], model: str, version: str = "") -> dict[str, Any]:
    """The server's own figures for the window between two ``get_inference_statistics`` answers
    (JSON of either protocol: gRPC gives int64 as strings). Times are mean milliseconds per
    request; ``request_ms`` is the server's whole request time (success count/ns)."""
    b, a = _model_stats(before, model, version), _model_stats(after, model, version)
    out: dict[str, Any] = {}
    counts = {}
    for key in _STAT_KEYS:
        (cb, nb), (ca, na) = _count_ns(b, key), _count_ns(a, key)
        counts[key] = (ca - cb, na - nb)
    requests = counts["success"][0]
    out["request_count"] = requests
    out["failed_count"] = counts["fail"][0]
    out["inference_count"] = int(a.get("inference_count", 0) or 0) - int(b.get("inference_count", 0) or 0)
    out["execution_count"] = int(a.get("execution_count", 0) or 0) - int(b.get("execution_count", 0) or 0)
    out["avg_batch"] = out["inference_count"] / out["execution_count"] if out["execution_count"] else None
    names = {"success": "request_ms", "queue": "queue_ms", "compute_input": "compute_input_ms",
             "compute_infer": "compute_infer_ms", "compute_output": "compute_output_ms"}
    for key, name in names.items():
        c, ns = counts[key]
        out[name] = ns / c / 1e6 if c else None
    return out


@dataclass(frozen=True)
class Mismatch:
    """One field where the served model differs from the reference."""

    field: str
    expected: str
    actual: str

    def __str__(self) -> str:
        return f"{self.field}: reference {self.expected}, server {self.actual}"

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "expected": self.expected, "actual": self.actual}


def _shape_matches(ref: Sequence[int], served: Sequence[int]) -> bool:
    """Axis by axis: a fixed reference axis accepts the same size or a dynamic server axis; a
    dynamic reference axis needs a dynamic server axis (requests will vary it)."""
    if len(ref) != len(served):
        return False
    return all((r == -1 and s == -1) or (r != -1 and s in (r, -1)) for r, s in zip(ref, served, strict=True))


def as_int_list(values: Iterable[Any]) -> list[int]:
    return [int(v) for v in values]


def compare_contract(io: ModelIO, metadata: Mapping[str, Any], config: Mapping[str, Any], *,
                     batch_size: int = 1) -> list[Mismatch]:
    """Field-by-field differences between the reference IO and the server's model metadata
    (``/v2/models/NAME``) and config (``max_batch_size``); JSON of either protocol."""
    issues: list[Mismatch] = []
    cfg = config.get("config", config)
    mbs = int(cfg.get("max_batch_size", 0) or 0)
    batched_ref = io.has_batch_axis
    if batched_ref and mbs == 0:
        issues.append(Mismatch("max_batch_size", "> 0 (the reference has a dynamic batch axis)", "0"))
    elif not batched_ref and mbs > 0:
        issues.append(Mismatch("max_batch_size", "0 (the reference has no batch axis)", str(mbs)))
    if mbs > 0 and batch_size > mbs:
        issues.append(Mismatch("max_batch_size", f">= {batch_size} (--batch-size)", str(mbs)))
    for kind, specs, served_list in (("input", io.inputs, metadata.get("inputs", [])),
                                     ("output", io.outputs, metadata.get("outputs", []))):
        served = {t["name"]: t for t in served_list}
        for spec in specs:
            t = served.get(spec.name)
            if t is None:
                others = ", ".join(served) or "none"
                issues.append(Mismatch(f"{kind} '{spec.name}'", "present", f"missing (server {kind}s: {others})"))
                continue
            dtype = str(t.get("datatype", ""))
            if dtype != spec.triton_dtype_short:
                issues.append(Mismatch(f"{kind} '{spec.name}' datatype", spec.triton_dtype_short, dtype))
            shape = as_int_list(t.get("shape", []))
            if not _shape_matches(spec.shape, shape):
                issues.append(Mismatch(f"{kind} '{spec.name}' shape", str(list(spec.shape)), str(shape)))
        known = {s.name for s in specs}
        for name in served:
            if name not in known:
                issues.append(Mismatch(f"{kind} '{name}'", "absent", "present on the server only"))
    return issues


def encoded_input(io: ModelIO, metadata: Mapping[str, Any]) -> str | None:
    """The served model's input name when it takes encoded bytes where the reference takes one
    tensor (an image ensemble: one ``BYTES`` input, decoded and preprocessed on the server);
    ``None`` otherwise."""
    served = list(metadata.get("inputs", []))
    if len(served) == 1 and served[0].get("datatype") == "BYTES" and len(io.inputs) == 1 \
            and io.inputs[0].dtype != "object":
        return str(served[0]["name"])
    return None


def endpoint_io(io: ModelIO, image_input: str) -> ModelIO:
    """The IO clients see at an image endpoint: one ``BYTES`` input of one encoded file per
    sample (``[-1, 1]`` with a batch axis, ``[1]`` without), the reference's outputs."""

    batched = io.has_batch_axis
    spec = TensorSpec(image_input, "object", (-1, 1) if batched else (1,), 0 if batched else None)
    return ModelIO((spec,), io.outputs, source=io.source)


@dataclass
class ThresholdResult:
    name: str
    limit: float
    value: float | None
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "limit": self.limit, "value": self.value, "passed": self.passed, "detail": self.detail}


def _top1_drop_result(name: str, m: Mapping[str, Any], limit: float) -> ThresholdResult:
    """quantize's rule (:class:`trtrepo.quantize.AccuracyCheck`): with labels the accuracy drop;
    without, the expected top-1 drop under the reference's softmax
    (:meth:`trtrepo.evaluate.ExpectedDrop.verdict`): the value is the upper end of its 95 %
    interval, which passes under the limit; an estimate under the limit whose interval reaches
    it cannot decide on these samples and fails, naming the samples that would decide. Metrics
    without the expected drop: the top-1 disagreement."""
    if m.get("accuracy_drop_points") is None and m.get("expected_drop"):
        ed = ExpectedDrop.from_dict(m["expected_drop"])
        verdict = ed.verdict(limit)
        detail = f"{ed.describe()} under the reference's softmax on {ed.samples} samples; the upper end is judged"
        if verdict == "fail":
            detail += ": the estimate itself is over the limit"
        elif verdict == "undecided":
            need = ed.samples_to_decide(limit)
            detail += (f": cannot decide on {ed.samples} samples, about {need} would decide" if need is not None
                       else f": cannot decide on {ed.samples} samples, the estimate is at the limit")
        return ThresholdResult(f"top1_drop[{name}]", limit, 100.0 * ed.upper, verdict == "pass", detail + ", points")
    v = float(m["top1_drop_points"])
    what = "accuracy drop vs labels" if m.get("accuracy_drop_points") is not None else "top-1 disagreement"
    return ThresholdResult(f"top1_drop[{name}]", limit, v, v <= limit + 1e-9, f"{what}, points")


def check_thresholds(report: Mapping[str, Any], thresholds: Thresholds) -> list[ThresholdResult]:
    """Evaluate the limits on a report dict (``ValidationReport.to_dict()``); one result per
    checked value, named ``top1_drop[OUTPUT]`` (the label output only: the first ``[N, C]``
    output unless ``--label-output``), ``cosine[OUTPUT]`` (every output), ``p99_ms[c=N]``."""
    acc = report.get("accuracy") or {}
    results = _top1_drop_results(acc, thresholds.max_top1_drop)
    results += _cosine_results(acc, thresholds)
    results += _p99_results(report.get("latency") or {}, thresholds.max_p99_ms)
    agree = (report.get("fleet") or {}).get("agreement") or {}
    for row in agree.get("outputs", []):  # several servers (--url A,B): their outputs for the same requests
        v = float(row["max_abs_diff"])
        results.append(ThresholdResult(f"server_diff[{row['server']}:{row['output']}]", float(agree["limit"]), v,
                                       bool(row["within_limit"]),
                                       f"largest |difference| from {agree['reference_server']}'s output"))
    return results


def _top1_drop_results(acc: Mapping[str, Any], limit: float | None) -> list[ThresholdResult]:
    """The top-1 drop of the label output. Decision: the limit needs the accuracy phase and a
    classification output; without either it is an error, not a pass."""
    if limit is None:
        return []
    if not acc:
        raise OptionError("max_top1_drop", "needs the accuracy phase (turned off; give {accuracy})",
                          concept="the top-1 drop limit", others={"accuracy": "accuracy=True"})
    primary = acc.get("label_output")
    checked = [(n, m) for n, m in (acc.get("outputs") or {}).items() if n == primary and m.get("top1_drop_points") is not None]
    if not checked:
        raise OptionError("max_top1_drop", ": no classification output ([N, C] logits); use {min_cosine}",
                          concept="the top-1 drop limit", others={"min_cosine": "the cosine floor"})
    return [_top1_drop_result(name, m, limit) for name, m in checked]


def _cosine_results(acc: Mapping[str, Any], thresholds: Thresholds) -> list[ThresholdResult]:
    """The mean cosine of every output (``min_cosine``, which needs the accuracy phase), and of
    every output without classes (``min_embedding_cosine``, the default gate, when accuracy ran).
    Decision: a classifier output is judged by top-1 and ``min_cosine``, not the embedding gate."""
    outputs = acc.get("outputs") or {}
    results: list[ThresholdResult] = []
    if thresholds.min_cosine is not None:
        if not acc:
            raise OptionError("min_cosine", "needs the accuracy phase (turned off; give {accuracy})",
                              concept="the cosine floor", others={"accuracy": "accuracy=True"})
        for name, m in outputs.items():
            v = float(m["cosine_mean"])
            results.append(ThresholdResult(f"cosine[{name}]", thresholds.min_cosine, v,
                                           v >= thresholds.min_cosine - 1e-9, "mean cosine similarity"))
    if thresholds.min_embedding_cosine is not None and acc:
        for name, m in outputs.items():
            if name == acc.get("label_output") or m.get("top1_agreement") is not None:
                continue  # a classifier output: top-1 and --min-cosine judge it
            v = float(m["cosine_mean"])
            results.append(ThresholdResult(f"embedding_cosine[{name}]", thresholds.min_embedding_cosine, v,
                                           v >= thresholds.min_embedding_cosine - 1e-9,
                                           "mean cosine similarity of an output without classes (default gate)"))
    return results


def _p99_results(lat: Mapping[str, Any], limit: float | None) -> list[ThresholdResult]:
    """The client p99 latency of every level (needs the latency phase)."""
    if limit is None:
        return []
    if not lat:
        raise OptionError("max_p99_ms", "needs the latency phase (turned off; give {latency})",
                          concept="the p99 latency limit", others={"latency": "latency=True"})
    results = []
    for level in lat.get("levels", []):
        v = float(level["client_ms"]["p99"])
        where = (f"rate={level['request_rate']:g}/s" if level.get("request_rate") is not None
                 else f"c={level['concurrency']}")
        results.append(ThresholdResult(f"p99_ms[{where}]", limit, v, v <= limit, "client p99 latency, ms"))
    return results




class ContractError(TrtrepoError):
    """The served model's IO differs from the reference (exit 1); the message lists every field."""

    def __init__(self, model: str, mismatches: Sequence[Mismatch]) -> None:
        super().__init__(f"contract: model '{model}' on the server does not match the reference "
                         f"({len(mismatches)} mismatch{'es' if len(mismatches) != 1 else ''}): "
                         + "; ".join(str(m) for m in mismatches))
        self.mismatches = list(mismatches)
