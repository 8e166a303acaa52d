"""Deployment check against a running Triton server (``trtrepo validate``).

Four phases, each usable on its own through :class:`TritonTarget`:

1. **Readiness and contract** -- :meth:`TritonTarget.wait_ready` polls server liveness and
   model readiness with exponential backoff under one deadline (a model that is not in the
   repository index or failed to load is reported at once, with the server's reason);
   :func:`compare_contract` checks the served model's metadata and config against the
   reference's :class:`~trtrepo.modelio.ModelIO` field by field (names, data types, shapes,
   max batch size) before any inference request is sent.
2. **Accuracy** -- :func:`run_accuracy` sends the data set through Triton and through the
   reference (PyTorch, or ONNX Runtime for an ``.onnx`` reference) batch by batch, checks every
   response's shape and compares the outputs with the metric functions of
   :mod:`trtrepo.evaluate`; the worst samples (lowest cosine similarity) are listed.
3. **Latency and throughput** -- :meth:`TritonTarget.load` keeps ``concurrency`` requests in
   flight with tritonclient's asyncio clients (``tritonclient.grpc.aio`` / ``tritonclient.http.aio``)
   for a number of requests or a duration, after a warm-up; client percentiles come next to the
   server's own statistics for the same window (:func:`stats_diff` of
   ``get_inference_statistics`` before and after), so the client's overhead is visible.
   Tensors can travel through system shared memory (or CUDA shared memory on a GPU machine).
4. **Speed against the reference** (issue 8) -- :func:`trtrepo.speed.compare_speed` times the
   PyTorch reference (CUDA when available, else CPU) and the served model at concurrency 1 on
   the same batches of one input shape, per batch size; ``speed_vs_reference`` in the report.
5. **Report** -- :class:`ValidationReport` writes ``validate.json`` (stable keys),
   ``validate.md`` and ``latency.png`` atomically; :func:`check_thresholds` decides the exit code.

Every wait is bounded: readiness by ``ready_timeout``, each request by ``timeout`` (the gRPC
deadline and an asyncio timeout around every call). :func:`validate` runs the whole check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .contracts.payload import Payload, check_shape, expected_shapes
from .errors import TrtrepoError, UsageError
from .modelio import ModelIO
from .speed import SpeedOptions

log = logging.getLogger(__name__)

REPORT_SCHEMA = "trtrepo.validate/2"  # /2: speed_vs_reference added
PROTOCOLS = ("grpc", "http")
SHARED_MEMORY = ("none", "system", "cuda")
DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
PERCENTILES = (50, 90, 95, 99)


# --------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class ValidateOptions:
    """How to reach the model and how much traffic to send."""

    model: str
    url: str = ""
    protocol: str = "grpc"
    version: str = ""
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    requests: int | None = 200
    duration: float | None = None
    warmup: int = 20
    batch_size: int = 1
    shared_memory: str = "none"
    timeout: float = 10.0
    ready_timeout: float = 30.0
    worst: int = 5
    label_output: str | None = None
    accuracy: bool = True
    latency: bool = True
    progress: bool | None = None
    # Speed against the reference (runs with the latency phase); None skips it.
    speed: SpeedOptions | None = field(default_factory=SpeedOptions)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise UsageError(f"--protocol {self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if self.shared_memory not in SHARED_MEMORY:
            raise UsageError(f"--shared-memory {self.shared_memory!r}: one of {', '.join(SHARED_MEMORY)}")
        if not self.model:
            raise UsageError("--model: give the name of the model on the server")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError(f"--concurrency {list(self.concurrency)}: levels must be integers >= 1")
        if self.requests is not None and self.duration is not None:
            raise UsageError("--requests and --duration exclude each other")
        if self.requests is None and self.duration is None:
            raise UsageError("give --requests N or --duration S")
        if self.requests is not None and self.requests < 1:
            raise UsageError(f"--requests {self.requests}: must be >= 1")
        if self.duration is not None and not (self.duration > 0 and math.isfinite(self.duration)):
            raise UsageError(f"--duration {self.duration}: must be a positive number of seconds")
        if self.warmup < 0:
            raise UsageError(f"--warmup {self.warmup}: must be >= 0")
        if self.batch_size < 1:
            raise UsageError(f"--batch-size {self.batch_size}: must be >= 1")
        for what, v in (("--timeout", self.timeout), ("--ready-timeout", self.ready_timeout)):
            if not (v > 0 and math.isfinite(v)):
                raise UsageError(f"{what} {v}: must be a positive number of seconds")
        if self.version and not str(self.version).isdigit():
            raise UsageError(f"--version {self.version!r}: a model version is a positive integer")
        object.__setattr__(self, "url", parse_url(self.url, self.protocol))


@dataclass(frozen=True)
class Thresholds:
    """Deployment-gate limits; ``None`` disables one."""

    max_top1_drop: float | None = None  # percentage points (accuracy drop vs labels, else disagreement)
    max_p99_ms: float | None = None  # at every concurrency level
    min_cosine: float | None = None  # mean cosine similarity, every output

    def __post_init__(self) -> None:
        if self.max_top1_drop is not None and not (0 <= self.max_top1_drop <= 100):
            raise UsageError(f"--max-top1-drop {self.max_top1_drop}: points between 0 and 100")
        if self.max_p99_ms is not None and not self.max_p99_ms > 0:
            raise UsageError(f"--max-p99-ms {self.max_p99_ms}: must be > 0")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise UsageError(f"--min-cosine {self.min_cosine}: between -1 and 1")


def parse_url(url: str, protocol: str) -> str:
    """``HOST:PORT`` (a scheme is dropped; an empty URL is the local default port)."""
    url = (url or "").strip()
    for scheme in ("http://", "https://", "grpc://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    url = url.rstrip("/")
    if not url:
        return f"127.0.0.1:{DEFAULT_PORTS[protocol]}"
    if "/" in url:
        raise UsageError(f"--url {url!r}: expected HOST:PORT")
    host, sep, port = url.rpartition(":")
    if not sep:
        return f"{url}:{DEFAULT_PORTS[protocol]}"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--url {url!r}: expected HOST:PORT with a port between 1 and 65535")
    return url


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4) (sorted, duplicates dropped)."""
    try:
        levels = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise UsageError(f"--concurrency {text!r}: expected comma-separated integers, e.g. 1,2,4,8") from None
    if not levels or levels[0] < 1:
        raise UsageError(f"--concurrency {text!r}: levels must be integers >= 1")
    return tuple(levels)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return first or type(exc).__name__


# --------------------------------------------------------------------------------------------
# Pure parts: percentiles, statistics windows, contract comparison, thresholds


def latency_summary(latencies_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Client latency percentiles in milliseconds: p50/p90/p95/p99 (linear interpolation),
    mean, min, max."""
    x = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if x.size == 0:
        raise UsageError("no latencies to summarise")
    out = {f"p{p}": float(np.percentile(x, p)) for p in PERCENTILES}
    out.update(mean=float(x.mean()), min=float(x.min()), max=float(x.max()))
    return out


_STAT_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _model_stats(stats: Mapping[str, Any], model: str, version: str) -> dict[str, Any]:
    rows = stats.get("model_stats", [])
    for row in rows:
        if row.get("name") == model and (not version or str(row.get("version")) == str(version)):
            return dict(row)
    if len(rows) == 1:
        return dict(rows[0])
    raise TrtrepoError(f"the server's statistics have no entry for model '{model}' version {version or '(latest)'}")


def _booked(stats: Mapping[str, Any], model: str, version: str) -> int:
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


def _as_int_list(values: Iterable[Any]) -> list[int]:
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
            shape = _as_int_list(t.get("shape", []))
            if not _shape_matches(spec.shape, shape):
                issues.append(Mismatch(f"{kind} '{spec.name}' shape", str(list(spec.shape)), str(shape)))
        known = {s.name for s in specs}
        for name in served:
            if name not in known:
                issues.append(Mismatch(f"{kind} '{name}'", "absent", "present on the server only"))
    return issues


@dataclass
class ThresholdResult:
    name: str
    limit: float
    value: float | None
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "limit": self.limit, "value": self.value, "passed": self.passed, "detail": self.detail}


def check_thresholds(report: Mapping[str, Any], thresholds: Thresholds) -> list[ThresholdResult]:
    """Evaluate the limits on a report dict (``ValidationReport.to_dict()``); one result per
    checked value, named ``top1_drop[OUTPUT]`` (the label output only: the first ``[N, C]``
    output unless ``--label-output``), ``cosine[OUTPUT]`` (every output), ``p99_ms[c=N]``."""
    results: list[ThresholdResult] = []
    acc = report.get("accuracy") or {}
    outputs = acc.get("outputs") or {}
    if thresholds.max_top1_drop is not None:
        if not acc:
            raise UsageError("--max-top1-drop needs the accuracy phase (drop --no-accuracy)")
        primary = acc.get("label_output")
        checked = [(n, m) for n, m in outputs.items() if n == primary and m.get("top1_drop_points") is not None]
        if not checked:
            raise UsageError("--max-top1-drop: no classification output ([N, C] logits); use --min-cosine")
        for name, m in checked:
            v = float(m["top1_drop_points"])
            what = "accuracy drop vs labels" if m.get("accuracy_drop_points") is not None else "top-1 disagreement"
            results.append(ThresholdResult(f"top1_drop[{name}]", thresholds.max_top1_drop, v,
                                           v <= thresholds.max_top1_drop + 1e-9, f"{what}, points"))
    if thresholds.min_cosine is not None:
        if not acc:
            raise UsageError("--min-cosine needs the accuracy phase (drop --no-accuracy)")
        for name, m in outputs.items():
            v = float(m["cosine_mean"])
            results.append(ThresholdResult(f"cosine[{name}]", thresholds.min_cosine, v,
                                           v >= thresholds.min_cosine - 1e-9, "mean cosine similarity"))
    if thresholds.max_p99_ms is not None:
        lat = report.get("latency") or {}
        if not lat:
            raise UsageError("--max-p99-ms needs the latency phase (drop --no-latency)")
        for level in lat.get("levels", []):
            v = float(level["client_ms"]["p99"])
            results.append(ThresholdResult(f"p99_ms[c={level['concurrency']}]", thresholds.max_p99_ms, v,
                                           v <= thresholds.max_p99_ms, "client p99 latency, ms"))
    return results


# --------------------------------------------------------------------------------------------
# Requests


class _Slot:
    """Shared-memory regions of one in-flight request slot (inputs and outputs)."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, Any, int]] = {}  # name -> (region, handle, size)
        self.outputs: dict[str, tuple[str, Any, int]] = {}


class TritonTarget:
    """A model on a Triton server, reached with tritonclient's asyncio client on a private
    event loop. Synchronous methods; every call bounded by ``timeout``. A context manager."""

    def __init__(self, options: ValidateOptions) -> None:
        self.options = options
        self.url = options.url
        self.protocol = options.protocol
        self.model = options.model
        self.version = str(options.version or "")
        self.timeout = options.timeout
        # Server calls other than inference (readiness, metadata, statistics) get at least 10 s,
        # so a tight --timeout for requests does not fail the set-up.
        self.admin_timeout = max(options.timeout, 10.0)
        if self.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module  # type: ignore[no-redef]
            import tritonclient.http.aio as aio  # type: ignore[no-redef]
        self._mod = module
        self._aio = aio
        self._loop = asyncio.new_event_loop()
        self._client: Any = None
        self._slots: list[_Slot] = []
        self._shm_kind = "none"
        self._io: ModelIO | None = None
        self._run(self._connect(), self.admin_timeout)

    # --- plumbing ---------------------------------------------------------------------------
    async def _connect(self) -> None:
        if self.protocol == "grpc":
            self._client = self._aio.InferenceServerClient(self.url)
        else:
            self._client = self._aio.InferenceServerClient(self.url, conn_timeout=self.admin_timeout,
                                                           conn_limit=max(100, *self.options.concurrency))

    def _run(self, coro: Any, timeout: float | None) -> Any:
        async def bounded() -> Any:
            return await asyncio.wait_for(coro, timeout) if timeout else await coro

        return self._loop.run_until_complete(bounded())

    async def _call(self, name: str, *args: Any, bound: float | None = None, **kw: Any) -> Any:
        fn = getattr(self._client, name)
        bound = self.admin_timeout if bound is None else max(0.05, min(bound, self.admin_timeout))
        if self.protocol == "grpc":
            kw.setdefault("client_timeout", bound)
            if name.startswith("get_"):
                kw.setdefault("as_json", True)
        return await asyncio.wait_for(fn(*args, **kw), bound)

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        """One administrative call (``get_model_metadata``...) as JSON, bounded by the timeout."""
        try:
            return self._run(self._call(name, *args, **kw), None)
        except (asyncio.TimeoutError, TimeoutError):
            raise TrtrepoError(f"{self._where()}: {name} got no answer within {self.admin_timeout:g}s") from None

    def _where(self) -> str:
        return f"Triton at {self.url} ({self.protocol})"

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.release_shared_memory()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._run(self._client.close(), 5.0)
        with contextlib.suppress(Exception):
            pending = asyncio.all_tasks(self._loop)
            for t in pending:
                t.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.wait(pending, timeout=5.0))
        self._loop.close()

    def __enter__(self) -> TritonTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- readiness --------------------------------------------------------------------------
    def repository_index(self) -> list[dict[str, Any]]:
        idx = self.call("get_model_repository_index")
        if isinstance(idx, dict):
            idx = idx.get("models", [])
        return [dict(m) for m in idx]

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait (backoff 50 ms doubling to 1 s, at most ``timeout``) until the server answers and
        the model is ready. Unreachable server or unknown model: :class:`UsageError` (exit 2);
        a model that failed to load or stays unready: :class:`TrtrepoError` (exit 1)."""
        timeout = self.options.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.05
        last_error = ""
        live = False
        info: dict[str, Any] = {}
        while True:
            state = None
            try:
                left = deadline - time.monotonic()
                live = bool(self._run(self._call("is_server_live", bound=left), None))
                if live:
                    info["server_ready"] = bool(self._run(self._call("is_server_ready", bound=left), None))
                    if self._run(self._call("is_model_ready", self.model, self.version, bound=left), None):
                        break
                    state = self._model_state()
            except (asyncio.TimeoutError, TimeoutError):
                last_error = f"no answer within {self.admin_timeout:g}s"
            except UsageError:
                raise
            except TrtrepoError:
                raise
            except Exception as exc:
                last_error = _one_line(exc)
            if state is not None:
                last_error = state
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not live:
                    raise UsageError(f"cannot reach {self._where()} within {timeout:g}s: {last_error}")
                raise TrtrepoError(f"model '{self.model}'{self._vtext()} on {self._where()} is not ready after "
                                   f"{timeout:g}s: {last_error}")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)
        meta = self.call("get_server_metadata")
        info.update(server_live=True, server_version=str(meta.get("version", "")),
                    extensions=list(meta.get("extensions", [])))
        return info

    def _vtext(self) -> str:
        return f" version {self.version}" if self.version else ""

    def _model_state(self) -> str:
        """Why the model is not ready; raises at once when it can never become ready."""
        index = self.repository_index()
        rows = [m for m in index if m.get("name") == self.model]
        if not rows:
            names = ", ".join(sorted({str(m.get("name")) for m in index})) or "none"
            raise UsageError(f"model '{self.model}' is not in the repository of {self._where()} (models: {names})")
        if self.version:
            vrows = [m for m in rows if str(m.get("version", "")) == self.version]
            if not vrows:
                have = ", ".join(sorted(str(m.get("version", "?")) for m in rows))
                raise UsageError(f"model '{self.model}' has no version {self.version} on {self._where()} (versions: {have})")
            rows = vrows
        # The reason can hold a Python traceback from the backend: keep its first line.
        states = [(str(m.get("version", "")), str(m.get("state", "")), _one_line(Exception(str(m.get("reason", ""))))[:300])
                  for m in rows]
        states = [(v, st, "" if r == "Exception" else r) for v, st, r in states]
        text = "; ".join(f"version {v or '?'} {s or 'UNKNOWN'}{': ' + r if r else ''}" for v, s, r in states)
        if all(s == "UNAVAILABLE" and r and r != "unloaded" for _, s, r in states):
            raise TrtrepoError(f"model '{self.model}' failed to load on {self._where()}: {text}")
        return text

    # --- contract ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return dict(self.call("get_model_metadata", self.model, self.version))

    def config(self) -> dict[str, Any]:
        cfg = dict(self.call("get_model_config", self.model, self.version))
        return dict(cfg.get("config", cfg))

    def resolve_version(self, metadata: Mapping[str, Any]) -> str:
        """The version the statistics are read for: ``--version`` or the one ready version."""
        if self.version:
            return self.version
        versions = [str(v) for v in metadata.get("versions", [])]
        return max(versions, key=int) if versions else ""

    def statistics(self, version: str) -> dict[str, Any]:
        return dict(self.call("get_inference_statistics", self.model, version))

    def settled_statistics(self, version: str, at_least: int | None = None, wait: float = 2.0) -> dict[str, Any]:
        """Statistics once the server has booked every finished request: Triton updates them
        when it releases a request, which can be just after the client got the response. Polls
        (bounded by ``wait``) until the request count reaches ``at_least`` and stops moving."""
        deadline = time.monotonic() + wait
        prev = self.statistics(version)
        while time.monotonic() < deadline:
            time.sleep(0.02)
            cur = self.statistics(version)
            n_prev, n_cur = _booked(prev, self.model, version), _booked(cur, self.model, version)
            if n_cur == n_prev and (at_least is None or n_cur >= at_least):
                return cur
            prev = cur
        return prev

    # --- shared memory ------------------------------------------------------------------------
    def setup_shared_memory(self, kind: str, slots: int, payloads: Sequence[Payload]) -> None:
        """Create and register regions for ``slots`` concurrent requests, sized for the largest
        input and output of ``payloads``."""
        self.release_shared_memory()
        if kind == "none":
            return
        if any(-1 in shape for p in payloads for shape in p.expected.values()):
            raise UsageError("--shared-memory needs the output shapes in advance (run the accuracy phase too)")
        in_sizes: dict[str, int] = {}
        out_sizes: dict[str, int] = {}
        for p in payloads:
            for n, a in p.inputs.items():
                in_sizes[n] = max(in_sizes.get(n, 0), a.nbytes)
            for n, shape in p.expected.items():
                out_sizes[n] = max(out_sizes.get(n, 0), int(np.prod(shape)) * self._out_itemsize(n))
        if kind == "cuda":
            cudashm = _cuda_shm()
        else:
            import tritonclient.utils.shared_memory as sysshm
        self._shm_kind = kind
        tag = f"trtrepo_{os.getpid()}_{id(self) & 0xFFFFFF:x}"
        try:
            for s in range(slots):
                slot = _Slot()
                self._slots.append(slot)
                for group, sizes, target in (("in", in_sizes, slot.inputs), ("out", out_sizes, slot.outputs)):
                    for i, (name, size) in enumerate(sizes.items()):
                        region = f"{tag}_{s}_{group}{i}"
                        size = max(size, 1)
                        if kind == "system":
                            handle = sysshm.create_shared_memory_region(region, "/" + region, size)
                            target[name] = (region, handle, size)
                            self._run(self._call("register_system_shared_memory", region, "/" + region, size), None)
                        else:
                            handle = cudashm.create_shared_memory_region(region, size, 0)
                            target[name] = (region, handle, size)
                            self._run(self._call("register_cuda_shared_memory", region,
                                                 cudashm.get_raw_handle(handle), 0, size), None)
        except Exception as exc:
            self.release_shared_memory()
            if isinstance(exc, TrtrepoError):
                raise
            raise TrtrepoError(f"{self._where()}: cannot set up {kind} shared memory: {_one_line(exc)}") from exc

    def _out_itemsize(self, name: str) -> int:
        assert self._io is not None  # set by prepare() before shared memory is set up
        return int(np.dtype(self._io.output(name).dtype).itemsize)

    def release_shared_memory(self) -> None:
        if not self._slots:
            return
        mod = _shm_module(self._shm_kind)
        unregister = f"unregister_{self._shm_kind}_shared_memory"
        for slot in self._slots:
            for region, handle, _ in (*slot.inputs.values(), *slot.outputs.values()):
                with contextlib.suppress(Exception):
                    self._run(self._call(unregister, region), None)
                with contextlib.suppress(Exception):
                    mod.destroy_shared_memory_region(handle)
        self._slots = []
        self._shm_kind = "none"

    # --- inference ----------------------------------------------------------------------------
    def prepare(self, io: ModelIO) -> None:
        """The served IO (names and Triton data types) used to build requests."""
        self._io = io

    def _request(self, payload: Payload, slot: int | None) -> tuple[list[Any], list[Any]]:
        assert self._io is not None
        mod = self._mod
        inputs = []
        shm = self._slots[slot] if slot is not None and self._slots else None
        for spec in self._io.inputs:
            arr = payload.inputs[spec.name]
            t = mod.InferInput(spec.name, list(arr.shape), spec.triton_dtype_short)
            if shm is not None:
                region, handle, _ = shm.inputs[spec.name]
                _shm_module(self._shm_kind).set_shared_memory_region(handle, [arr])
                t.set_shared_memory(region, arr.nbytes)
            elif self.protocol == "http":
                t.set_data_from_numpy(arr, binary_data=True)
            else:
                t.set_data_from_numpy(arr)
            inputs.append(t)
        outputs = []
        for spec in self._io.outputs:
            o = mod.InferRequestedOutput(spec.name, binary_data=True) if self.protocol == "http" else mod.InferRequestedOutput(spec.name)
            if shm is not None:
                region, _, size = shm.outputs[spec.name]
                o.set_shared_memory(region, size)
            outputs.append(o)
        return inputs, outputs

    async def _infer(self, payload: Payload, slot: int | None, prebuilt: Any = None) -> dict[str, np.ndarray] | None:
        inputs, outputs = prebuilt if prebuilt is not None else self._request(payload, slot)
        kw: dict[str, Any] = {"model_version": self.version, "outputs": outputs}
        if self.protocol == "grpc":
            kw["client_timeout"] = self.timeout
        try:
            result = await asyncio.wait_for(self._client.infer(self.model, inputs, **kw), self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise TrtrepoError(f"inference request to model '{self.model}' timed out after {self.timeout:g}s (--timeout)") from None
        except Exception as exc:
            msg = _one_line(exc)
            if "deadline" in msg.lower():
                raise TrtrepoError(f"inference request to model '{self.model}' timed out after {self.timeout:g}s "
                                   f"(--timeout): {msg}") from None
            raise TrtrepoError(f"inference request to model '{self.model}' failed: {msg}") from exc
        where = f"model '{self.model}' response"
        assert self._io is not None
        if slot is not None and self._slots:
            out: dict[str, np.ndarray] = {}
            shm = self._slots[slot]
            mod = _shm_module(self._shm_kind)
            for spec in self._io.outputs:
                o = result.get_output(spec.name)
                if o is None:
                    raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
                shape = _as_int_list(o["shape"] if isinstance(o, dict) else o.shape)
                check_shape(spec.name, shape, payload.expected[spec.name], where)
                out[spec.name] = mod.get_contents_as_numpy(shm.outputs[spec.name][1], np.dtype(spec.dtype), shape)
            return out
        out = {}
        for spec in self._io.outputs:
            try:
                arr = result.as_numpy(spec.name)
            except Exception as exc:  # the client fails to reshape an empty body
                raise TrtrepoError(f"{where}: output '{spec.name}' cannot be read ({_one_line(exc)}); "
                                   f"check the Python backend environment (numpy<2)") from exc
            if arr is None:
                raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
            check_shape(spec.name, arr.shape, payload.expected[spec.name], where)
            out[spec.name] = arr
        return out

    def infer(self, payload: Payload) -> dict[str, np.ndarray]:
        """One request, outputs as numpy (shapes checked)."""
        out = self._run(self._infer(payload, None), None)
        assert out is not None
        return out

    def load(self, payloads: Sequence[Payload], concurrency: int, *, requests: int | None = None,
             duration: float | None = None, keep: bool = False, use_shm: bool = False,
             progress: Callable[[int], None] | None = None) -> LoadResult:
        """Keep ``concurrency`` requests in flight, cycling through ``payloads``, until
        ``requests`` were sent or ``duration`` seconds passed. Each response's shape is checked;
        the first failure stops the run and raises. ``keep``: return the outputs too (in
        payload order, for the accuracy phase)."""
        return self._run(self._load(payloads, concurrency, requests, duration, keep, use_shm, progress), None)

    async def _load(self, payloads: Sequence[Payload], concurrency: int, requests: int | None, duration: float | None,
                    keep: bool, use_shm: bool, progress: Callable[[int], None] | None) -> LoadResult:
        if not payloads:
            raise UsageError("no data to send")
        latencies: list[float] = []
        outputs: dict[int, dict[str, np.ndarray]] = {}
        inferences = 0
        counter = 0
        prebuilt = None if use_shm else [self._request(p, None) for p in payloads]
        start = time.perf_counter()
        end = start + duration if duration is not None else math.inf

        async def worker(slot: int) -> None:
            nonlocal counter, inferences
            while True:
                if requests is not None and counter >= requests:
                    return
                if time.perf_counter() >= end:
                    return
                i = counter
                counter += 1
                p = payloads[i % len(payloads)]
                t0 = time.perf_counter()
                out = await self._infer(p, slot if use_shm else None,
                                        None if prebuilt is None else prebuilt[i % len(payloads)])
                latencies.append(time.perf_counter() - t0)
                inferences += p.batch
                if keep and out is not None:
                    outputs[i] = out
                if progress is not None:
                    progress(1)

        tasks = [asyncio.ensure_future(worker(s)) for s in range(concurrency)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=self.timeout + 1.0)
            raise
        wall = time.perf_counter() - start
        return LoadResult(concurrency, len(latencies), inferences, wall, np.asarray(latencies), outputs)


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    inferences: int
    wall_s: float
    latencies_s: np.ndarray
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.inferences / self.wall_s if self.wall_s > 0 else float("nan")


def _shm_module(kind: str) -> Any:
    if kind == "cuda":
        return _cuda_shm()
    import tritonclient.utils.shared_memory as sysshm

    return sysshm


def _cuda_shm() -> Any:
    """``tritonclient.utils.cuda_shared_memory`` when a CUDA GPU is usable, else a UsageError."""
    try:
        import cuda.bindings.runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        raise UsageError("--shared-memory cuda needs an NVIDIA GPU and cuda-python (cuda.bindings), which this machine "
                         "does not have; use --shared-memory system or none") from None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or not count:
        why = getattr(err, "name", str(err))
        raise UsageError(f"--shared-memory cuda: no CUDA GPU is visible on this machine ({why}); "
                         f"use --shared-memory system or none")
    import tritonclient.utils.cuda_shared_memory as cudashm

    return cudashm


# --------------------------------------------------------------------------------------------
# Reference side


def reference_io(reference: str, *, onnx: str | Path | None = None, weights: str | None = None,
                 workdir: str | Path | None = None) -> ModelIO:
    """The reference's IO: from ``onnx`` (the model that was deployed) when given, from the
    reference itself when it is an ONNX file, else by exporting the PyTorch source to ONNX."""
    from .export import resolve_source

    if onnx is not None:
        return ModelIO.from_onnx(onnx)
    src = resolve_source(reference, weights)
    if src.kind == "onnx":
        return ModelIO.from_onnx(src.location)
    import tempfile

    from .export import export_onnx

    with tempfile.TemporaryDirectory(prefix="trtrepo-validate-", dir=workdir) as tmp:
        try:
            result = export_onnx(src, Path(tmp) / "reference.onnx")
        except UsageError as exc:
            raise UsageError(f"--reference {reference}: cannot derive its IO by exporting it ({exc.message}); "
                             f"give the deployed ONNX model with --onnx") from exc
        return result.io


def make_reference(reference: str, io: ModelIO, *, weights: str | None = None, device: str = "cpu"
                   ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A callable ``feed -> outputs``: the PyTorch model (:class:`~trtrepo.reference.Reference`)
    or, for an ``.onnx`` reference, ONNX Runtime."""
    from .export import resolve_source

    src = resolve_source(reference, weights)
    if src.kind == "onnx":
        from .evaluate import make_session

        sess = make_session(src.location)
        names = io.output_names
        in_names = {i.name for i in sess.get_inputs()}

        def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, {k: v for k, v in feed.items() if k in in_names}), strict=True))

        return run
    from .reference import Reference

    return Reference.for_io(src, io, device=device)


# --------------------------------------------------------------------------------------------
# Accuracy


def _merge_metrics(name: str, refs: list[np.ndarray], served: list[np.ndarray], labels: np.ndarray | None,
                   classification: bool = False) -> Any:
    """Metrics of one output with :mod:`trtrepo.evaluate` (top-k only when ``classification``);
    batches whose trailing shapes differ (sequence outputs) are compared batch by batch and merged
    (no top-k then)."""
    from .evaluate import OutputMetrics, compare_output, cosine_similarity

    if len({r.shape[1:] for r in refs}) <= 1:
        return compare_output(name, np.concatenate(refs), np.concatenate(served), labels, classification=classification), \
            cosine_similarity(np.concatenate(refs), np.concatenate(served))
    cos = np.concatenate([cosine_similarity(r, s) for r, s in zip(refs, served, strict=True)])
    diffs = [np.abs(r.astype(np.float64) - s.astype(np.float64)) for r, s in zip(refs, served, strict=True)]
    total = sum(d.size for d in diffs)
    m = OutputMetrics(name=name, samples=len(cos), max_abs_error=float(max((d.max() for d in diffs if d.size), default=0.0)),
                      mean_abs_error=float(sum(d.sum() for d in diffs) / total) if total else 0.0,
                      cosine_mean=float(cos.mean()) if len(cos) else float("nan"),
                      cosine_min=float(cos.min()) if len(cos) else float("nan"))
    return m, cos


def reference_rows(reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], source: Any, io: ModelIO, *,
                   batch_size: int = 64, progress: Callable[[int], None] | None = None) -> list[dict[str, np.ndarray]]:
    """The reference's outputs per sample (by position in ``source``), computed in batches of
    ``batch_size`` whatever the request batch size (the reference is much faster batched)."""
    from .data import iter_batches

    rows: list[dict[str, np.ndarray]] = []
    for b in iter_batches(source, batch_size, io):
        out = reference(b.inputs)
        rows.extend({k: np.asarray(v[j]) for k, v in out.items()} for j in range(b.size))
        if progress is not None:
            progress(b.size)
    return rows


def run_accuracy(target: TritonTarget, payloads: Sequence[Payload],
                 reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | Sequence[dict[str, np.ndarray]],
                 labels: Sequence[np.ndarray | None], *, concurrency: int = 4, worst: int = 5,
                 label_output: str | None = None, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Send every payload once and compare its outputs with the reference's (a callable run on
    the same batches, or :func:`reference_rows`), per output. Each payload's ``expected``
    shapes are set to the reference's (the latency phase checks responses against them)."""
    ref_parts: list[dict[str, np.ndarray]] = []
    for p in payloads:
        if isinstance(reference, Sequence):  # per-sample rows (see reference_rows)
            idx = p.indices if p.indices is not None else np.arange(p.batch)
            out = {k: np.stack([reference[int(i)][k] for i in idx]) for k in reference[int(idx[0])]}
        else:
            out = reference(p.inputs)
        ref_parts.append(out)
        p.expected = {k: tuple(v.shape) for k, v in out.items()}
    res = target.load(payloads, min(concurrency, len(payloads)), requests=len(payloads), keep=True, progress=progress)
    served_parts = [res.outputs[i] for i in range(len(payloads))]
    has_labels = all(lb is not None for lb in labels)
    y = np.concatenate([np.asarray(lb) for lb in labels]) if has_labels and labels else None
    index = np.concatenate([p.indices if p.indices is not None else np.arange(p.batch) for p in payloads])
    names = list(ref_parts[0])
    if label_output is not None and label_output not in names:
        raise UsageError(f"--label-output {label_output!r}: the model has no such output (outputs: {', '.join(names)})")
    classifiers = [n for n in names if all(r[n].ndim == 2 and r[n].shape[1] >= 2 for r in ref_parts)]
    primary = label_output or (classifiers[0] if classifiers else None)
    metrics: dict[str, Any] = {}
    worst_rows: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        refs = [r[name] for r in ref_parts]
        served = [s[name].astype(np.float32, copy=False) for s in served_parts]
        is_label = name == primary and name in classifiers  # top-1/top-5 only on the label output
        m, cos = _merge_metrics(name, refs, served, y if is_label else None, classification=is_label)
        d = m.to_dict()
        d["top1_drop_points"] = m.top1_drop_points
        metrics[name] = d
        worst_rows[name] = _worst(cos, refs, served, index, y, worst)
    return {"samples": int(len(index)), "requests": len(payloads), "label_output": primary, "outputs": metrics,
            "worst_samples": worst_rows}


def _worst(cos: np.ndarray, refs: list[np.ndarray], served: list[np.ndarray], index: np.ndarray,
           labels: np.ndarray | None, k: int) -> list[dict[str, Any]]:
    if k <= 0 or len(cos) == 0:
        return []
    rows_ref = [row for r in refs for row in r]
    rows_srv = [row for s in served for row in s]
    err = np.asarray([float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0 for a, b in zip(rows_ref, rows_srv, strict=True)])
    order = np.lexsort((-err, cos))[:k]
    out = []
    for j in order:
        row: dict[str, Any] = {"sample": int(index[j]), "cosine": float(cos[j]), "max_abs_error": float(err[j])}
        if rows_ref[j].ndim == 1 and rows_ref[j].size >= 2:
            row["reference_top1"] = int(np.argmax(rows_ref[j]))
            row["served_top1"] = int(np.argmax(rows_srv[j]))
        if labels is not None:
            row["label"] = int(labels[j])
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class ValidationReport:
    """Everything one run found. ``to_dict`` has stable keys (``schema`` names the layout)."""

    server: dict[str, Any]
    contract: dict[str, Any]
    accuracy: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    thresholds: list[ThresholdResult] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    speed_vs_reference: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return bool(self.contract.get("ok")) and all(t.passed for t in self.thresholds)

    @property
    def failures(self) -> list[str]:
        names = [] if self.contract.get("ok") else ["contract"]
        return names + [t.name for t in self.thresholds if not t.passed]

    def to_dict(self) -> dict[str, Any]:
        from . import __version__

        return {
            "schema": REPORT_SCHEMA,
            "trtrepo_version": __version__,
            "passed": self.passed,
            "failures": self.failures,
            "server": self.server,
            "contract": self.contract,
            "accuracy": self.accuracy,
            "latency": self.latency,
            "speed_vs_reference": self.speed_vs_reference,
            "thresholds": [t.to_dict() for t in self.thresholds],
            "files": self.files,
        }

    def to_json(self) -> str:
        from .fsutil import report_json

        return report_json(self.to_dict(), allow_nan=False)

    def to_markdown(self) -> str:
        s = self.server
        lines = [f"# Triton validation: model `{s.get('model')}` version {s.get('version') or '-'}",
                 "", f"Server {s.get('url')} ({s.get('protocol')}), Triton {s.get('server_version') or '?'}; "
                 f"reference `{s.get('reference')}`, data `{s.get('data')}`.", "",
                 f"**Result: {'PASSED' if self.passed else 'FAILED (' + ', '.join(self.failures) + ')'}**", "",
                 "## Contract", ""]
        if self.contract.get("ok"):
            lines.append(f"Names, data types, shapes and max batch size ({self.contract.get('max_batch_size')}) "
                         f"match the reference.")
        else:
            lines += ["| field | reference | server |", "|---|---|---|"]
            lines += [f"| {m['field']} | {m['expected']} | {m['actual']} |" for m in self.contract.get("mismatches", [])]
        if self.accuracy:
            a = self.accuracy
            lines += ["", f"## Accuracy ({a['samples']} samples, {a['requests']} requests of up to {a['batch_size']})", "",
                      "| output | top-1 agree | top-5 agree | reference acc | served acc | top-1 drop (pts) | max abs err | "
                      "mean abs err | cosine mean | cosine min |", "|---|---|---|---|---|---|---|---|---|---|"]
            for name, m in a["outputs"].items():
                drop = m.get("top1_drop_points")
                lines.append(f"| {name} | {_pct(m.get('top1_agreement'))} | {_pct(m.get('top5_agreement'))} | "
                             f"{_pct(m.get('reference_accuracy'))} | {_pct(m.get('candidate_accuracy'))} | "
                             f"{'-' if drop is None else f'{drop:.2f}'} | {m['max_abs_error']:.4g} | {m['mean_abs_error']:.4g} | "
                             f"{m['cosine_mean']:.6f} | {m['cosine_min']:.6f} |")
            for name, rows in a.get("worst_samples", {}).items():
                if not rows:
                    continue
                lines += ["", f"Worst samples of `{name}` (lowest cosine):", "",
                          "| sample | cosine | max abs err | reference top-1 | served top-1 | label |", "|---|---|---|---|---|---|"]
                for r in rows:
                    lines.append(f"| {r['sample']} | {r['cosine']:.6f} | {r['max_abs_error']:.4g} | {r.get('reference_top1', '-')} | "
                                 f"{r.get('served_top1', '-')} | {r.get('label', '-')} |")
        if self.latency:
            lat = self.latency
            budget = f"{lat['requests_per_level']} requests" if lat.get("requests_per_level") else f"{lat['duration_s']:g} s"
            lines += ["", f"## Latency and throughput ({budget} per level after {lat['warmup']} warm-up requests, "
                      f"batch {lat['batch_size']}, shared memory {lat['shared_memory']})", "",
                      "Client latency in ms; server columns are Triton's statistics for the same window (mean ms per "
                      "request); overhead = client mean - server request time.", "",
                      "| concurrency | requests | infer/s | p50 | p90 | p95 | p99 | mean | server request | queue | "
                      "compute input | compute infer | compute output | avg batch | overhead |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for lv in lat["levels"]:
                c, sv = lv["client_ms"], lv["server"]
                avg = "-" if sv["avg_batch"] is None else f"{sv['avg_batch']:.2f}"
                lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['throughput']:.1f} | {c['p50']:.2f} | {c['p90']:.2f} | "
                             f"{c['p95']:.2f} | {c['p99']:.2f} | {c['mean']:.2f} | {_ms(sv['request_ms'])} | {_ms(sv['queue_ms'])} | "
                             f"{_ms(sv['compute_input_ms'])} | {_ms(sv['compute_infer_ms'])} | {_ms(sv['compute_output_ms'])} | "
                             f"{avg} | {_ms(lv['overhead_ms'])} |")
        if self.speed_vs_reference:
            from .speed import speed_markdown

            lines += speed_markdown(self.speed_vs_reference)
        if self.files.get("plot"):
            lines += ["", f"![latency]({Path(self.files['plot']).name})"]
        if self.thresholds:
            lines += ["", "## Thresholds", "", "| threshold | limit | value | result |", "|---|---|---|---|"]
            for t in self.thresholds:
                v = "-" if t.value is None else f"{t.value:.4g}"
                lines.append(f"| {t.name} | {t.limit:g} | {v} | {'pass' if t.passed else '**FAIL**'} |")
        return "\n".join(lines) + "\n"

    def write(self, folder: str | Path) -> dict[str, Path]:
        """``validate.json``, ``validate.md`` and (with latency) ``latency.png``, each atomically."""
        from .fsutil import write_report

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"json": folder / "validate.json", "markdown": folder / "validate.md"}
        if (self.latency and self.latency.get("levels")) or (self.speed_vs_reference and self.speed_vs_reference.get("rows")):
            paths["plot"] = folder / "latency.png"
        self.files = {k: str(v) for k, v in paths.items()}
        if "plot" in paths:
            write_plot(self, paths["plot"])
        write_report(folder, "validate", self.to_json(), self.to_markdown())
        return paths


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def write_plot(report: ValidationReport, path: str | Path) -> Path:
    """PNG (Agg), one panel per measurement that ran: client p50/p99 latency against throughput,
    one point per concurrency level; and, with ``speed_vs_reference``, latency per batch size of
    the reference beside the served model (:func:`trtrepo.speed.plot_speed`). The PNG's
    ``Description`` text chunk names the panels."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from .fsutil import atomic_path

    levels = (report.latency or {}).get("levels", [])
    speed = report.speed_vs_reference if (report.speed_vs_reference or {}).get("rows") else None
    panels = (["latency vs throughput"] if levels else []) + (["latency per batch size: reference vs served"] if speed else [])
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(7 * max(1, len(panels)), 4.5), dpi=100, squeeze=False)
    try:
        s = report.server
        ax_iter = iter(axes[0])
        if levels:
            ax = next(ax_iter)
            thr = [lv["throughput"] for lv in levels]
            for key, style in (("p50", "o-"), ("p99", "s--")):
                ax.plot(thr, [lv["client_ms"][key] for lv in levels], style, label=f"client {key}")
            srv = [lv["server"]["request_ms"] for lv in levels]
            if all(v is not None for v in srv):
                ax.plot(thr, srv, "^:", label="server request (mean)")
            for lv in levels:
                ax.annotate(f"c={lv['concurrency']}", (lv["throughput"], lv["client_ms"]["p99"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=8)
            ax.set_title(f"{s.get('model')} v{s.get('version') or '-'} over {s.get('protocol')}: latency vs throughput")
            ax.set_xlabel("throughput (inferences/s)")
            ax.set_ylabel("latency (ms)")
            ax.grid(True, alpha=0.3)
            ax.legend()
        if speed:
            from .speed import plot_speed

            plot_speed(next(ax_iter), speed)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", metadata={"Title": f"trtrepo validate: {s.get('model')}",
                                                     "Description": "panels: " + "; ".join(panels)})
    finally:
        plt.close(fig)
    return Path(path)


# --------------------------------------------------------------------------------------------
# The whole check


def make_payloads(source: Any, io: ModelIO, batch_size: int) -> tuple[list[Payload], list[np.ndarray | None]]:
    """Batches of the data set as requests (inputs cast to the model's dtypes)."""
    from .data import iter_batches

    payloads, labels = [], []
    for b in iter_batches(source, batch_size, io):
        payloads.append(Payload({k: np.ascontiguousarray(v) for k, v in b.inputs.items()},
                                expected_shapes(io, b.size), b.indices))
        labels.append(b.labels)
    if not payloads:
        raise UsageError(f"{getattr(source, 'name', 'data')}: no samples")
    return payloads, labels


def _progress(total: int | None, desc: str, enabled: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="req", disable=True if enabled is False else None, leave=False)


def validate(options: ValidateOptions, *, reference: str, data: Any, report_dir: str | Path | None = None,
             labels: str | Path | None = None, preprocess: str | Path | None = None, onnx: str | Path | None = None,
             weights: str | None = None, limit: int | None = None, seed: int | None = 0,
             thresholds: Thresholds | None = None) -> ValidationReport:
    """Run the deployment check; write the report to ``report_dir`` when given.

    Raises :class:`UsageError` (exit 2) when the server cannot be reached, the model is unknown
    or the options are wrong, and :class:`ContractError` (exit 1, after the report is written)
    when the served IO does not match the reference. Threshold results are in the report
    (``report.passed``); the caller decides what to do with a failure.
    """
    from .data import open_data

    thresholds = thresholds or Thresholds()
    speed = options.speed if options.latency else None
    speed_device = None
    if speed is not None:  # a device that is not there fails before any work
        from .export import resolve_source
        from .speed import resolve_reference_device

        speed_device = resolve_reference_device(speed.device, resolve_source(reference, weights).kind)
    io = reference_io(reference, onnx=onnx, weights=weights)
    source = open_data(data, io=io, preprocess=preprocess, labels=labels, limit=limit, seed=seed)
    payloads, batch_labels = make_payloads(source, io, options.batch_size)
    if options.shared_memory == "cuda":
        _cuda_shm()  # fail before any traffic on a machine without a GPU
    with TritonTarget(options) as target:
        info = target.wait_ready()
        metadata, config = target.metadata(), target.config()
        version = target.resolve_version(metadata)
        mismatches = compare_contract(io, metadata, config, batch_size=options.batch_size)
        server = {"url": options.url, "protocol": options.protocol, "model": options.model, "version": version,
                  "server_version": info.get("server_version", ""), "server_ready": info.get("server_ready"),
                  "extensions": info.get("extensions", []), "reference": reference, "data": getattr(source, "name", str(data)),
                  "max_batch_size": int(config.get("max_batch_size", 0) or 0),
                  "dynamic_batching": "dynamic_batching" in config}
        contract = {"ok": not mismatches, "max_batch_size": server["max_batch_size"],
                    "mismatches": [m.to_dict() for m in mismatches],
                    "reference_io": io.to_dict(), "served": {"inputs": metadata.get("inputs", []),
                                                             "outputs": metadata.get("outputs", [])}}
        report = ValidationReport(server, contract)
        if mismatches:
            if report_dir is not None:
                report.write(report_dir)
            raise ContractError(options.model, mismatches)
        target.prepare(io)
        if options.accuracy:
            ref = make_reference(reference, io, weights=weights)
            bar = _progress(len(source), "reference", options.progress)
            try:
                rows = reference_rows(ref, source, io, progress=bar.update)
            finally:
                bar.close()
            bar = _progress(len(payloads), "accuracy", options.progress)
            try:
                report.accuracy = run_accuracy(target, payloads, rows, batch_labels, concurrency=max(options.concurrency),
                                               worst=options.worst, label_output=options.label_output,
                                               progress=bar.update)
            finally:
                bar.close()
            report.accuracy["batch_size"] = options.batch_size
        if options.latency:
            report.latency = run_latency(target, payloads, options, version)
        if speed is not None and speed_device is not None:
            report.speed_vs_reference = run_speed(target, payloads, io, speed, reference=reference, weights=weights,
                                                  device=speed_device, server=server, accuracy=report.accuracy,
                                                  progress=options.progress)
        report.thresholds = check_thresholds(report.to_dict(), thresholds)
    if report_dir is not None:
        report.write(report_dir)
    return report


def run_speed(target: TritonTarget, payloads: Sequence[Payload], io: ModelIO, speed: SpeedOptions, *, reference: str,
              weights: str | None, device: str, server: Mapping[str, Any], accuracy: Mapping[str, Any] | None = None,
              progress: bool | None = None) -> dict[str, Any] | None:
    """The reference's own latency beside the served model's at concurrency 1, per batch size
    (:func:`trtrepo.speed.compare_speed`); ``None`` (with a warning) for a model without a
    batch axis."""
    from .speed import TimedReference, compare_speed

    mbs = int(server.get("max_batch_size", 0) or 0)
    if mbs <= 0 or not io.has_batch_axis:
        log.warning("speed against the reference skipped: model '%s' has no batch axis (max_batch_size 0)", server.get("model"))
        return None
    timed = TimedReference(reference, io, device=device, threads=speed.threads, weights=weights)
    bar = _progress(len(speed.batch_sizes), "speed vs reference", progress)
    try:
        return compare_speed(target, timed, [p.inputs for p in payloads], io, speed, max_batch_size=mbs,
                             accuracy=accuracy, server=server, progress=bar.update)
    finally:
        bar.close()


def run_latency(target: TritonTarget, payloads: Sequence[Payload], options: ValidateOptions, version: str) -> dict[str, Any]:
    """Warm-up, then one measured window per concurrency level, with the server's statistics
    for the same window."""
    use_shm = options.shared_memory != "none"
    if use_shm:
        target.setup_shared_memory(options.shared_memory, max(options.concurrency), payloads)
    levels = []
    try:
        for c in options.concurrency:
            if options.warmup:
                target.load(payloads, c, requests=max(options.warmup, c), use_shm=use_shm)
            before = target.settled_statistics(version)
            bar = _progress(options.requests, f"c={c}", options.progress)
            try:
                res = target.load(payloads, c, requests=options.requests, duration=options.duration, use_shm=use_shm,
                                  progress=bar.update)
            finally:
                bar.close()
            after = target.settled_statistics(version, at_least=_booked(before, options.model, version) + res.requests)
            server = stats_diff(before, after, options.model, version)
            client = latency_summary(res.latencies_s)
            overhead = client["mean"] - server["request_ms"] if server["request_ms"] is not None else None
            levels.append({"concurrency": c, "requests": res.requests, "inferences": res.inferences,
                           "wall_s": res.wall_s, "throughput": res.throughput, "client_ms": client,
                           "server": server, "overhead_ms": overhead})
            log.info("concurrency %d: %.1f infer/s, p99 %.2f ms", c, res.throughput, client["p99"])
    finally:
        if use_shm:
            target.release_shared_memory()
    return {"requests_per_level": options.requests, "duration_s": options.duration, "warmup": options.warmup,
            "batch_size": options.batch_size, "shared_memory": options.shared_memory, "levels": levels}


class ContractError(TrtrepoError):
    """The served model's IO differs from the reference (exit 1); the message lists every field."""

    def __init__(self, model: str, mismatches: Sequence[Mismatch]) -> None:
        super().__init__(f"contract: model '{model}' on the server does not match the reference "
                         f"({len(mismatches)} mismatch{'es' if len(mismatches) != 1 else ''}): "
                         + "; ".join(str(m) for m in mismatches))
        self.mismatches = list(mismatches)
