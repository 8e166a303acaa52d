"""Speed against the reference (``trtrepo validate``, issue 8): the PyTorch FP32 model's own
latency beside the served model's, per batch size, with the accuracy kept.

What is compared, for each batch size ``B`` of :attr:`SpeedOptions.batch_sizes`:

* **served model** -- client-side latency per request at concurrency 1: tritonclient's asyncio
  client from sending a request of ``B`` samples to the decoded numpy response (serialisation,
  transport, the server's queue and compute), after a warm-up; :meth:`TritonTarget.load`.
* **reference** -- one forward call of the PyTorch model on the same ``B`` samples, numpy in and
  numpy out (host-to-device and device-to-host copies included), under ``torch.inference_mode``,
  with ``torch.cuda.synchronize()`` before the clock stops on CUDA, after a warm-up. An ``.onnx``
  reference runs on ONNX Runtime's CPU provider instead.
* throughput on both sides is inferences/s = samples sent / wall time of the measured loop.

Both sides get the same batches, cycled: at most :attr:`SpeedOptions.max_batches` distinct
batches per size, built from samples of **one** input shape (the most common shape in the data,
so variable-length models are compared at one sequence length; :func:`fixed_shape_pool`).
Per batch size the served model is measured first, then the reference: no Triton request is in
flight while PyTorch is timed (they share the CPU cores on a small machine).

Pure parts (:func:`timing_summary`, :func:`speedup`, :func:`speed_row`, :func:`fixed_shape_pool`,
:func:`speed_batches`, :func:`accuracy_kept`, :func:`speed_markdown`) have no I/O.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .contracts.payload import Payload, expected_shapes
from .errors import UsageError
from .evaluate import make_session
from .export import _import_torch, resolve_source
from .measure import Stability, is_stable, merged, spread, window_summary
from .reference import Reference

log = logging.getLogger(__name__)

REFERENCE_DEVICES = ("auto", "cpu", "cuda")
DEFAULT_BATCH_SIZES = (1, 8, 32)
COMPARED = ("served: client-side latency per request at concurrency 1 (request sent -> numpy response decoded); "
            "reference: one forward call on the same batch (numpy in -> numpy out, device copies included); "
            "inferences/s = samples / wall time of the measured loop; speedup = reference / served (> 1: served is faster)")


@dataclass(frozen=True)
class SpeedOptions:
    """How the reference and the served model are timed against each other."""

    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    iterations: int = 20  # timed calls per window, per batch size and side
    warmup: int = 5  # unmeasured calls before them
    device: str = "auto"  # reference device: auto (CUDA when available), cpu, cuda
    threads: int | None = None  # torch.set_num_threads (ONNX Runtime intra-op threads); None: the library's default
    max_batches: int = 8  # distinct batches cycled per batch size
    # both sides are timed in windows of ``iterations`` calls until three agree (trtrepo.measure)
    stability_pct: float = 10.0
    max_trials: int = 10

    @property
    def stability(self) -> Any:
        return Stability(requests=self.iterations, pct=self.stability_pct, max_trials=self.max_trials)

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise UsageError(f"--speed-batch-sizes {list(self.batch_sizes)}: batch sizes must be integers >= 1")
        object.__setattr__(self, "batch_sizes", tuple(sorted({int(b) for b in self.batch_sizes})))
        if self.iterations < 2:
            raise UsageError(f"--speed-iterations {self.iterations}: must be >= 2 (a median and a p99)")
        if self.warmup < 0:
            raise UsageError(f"--speed-warmup {self.warmup}: must be >= 0")
        if self.device not in REFERENCE_DEVICES:
            raise UsageError(f"--reference-device {self.device!r}: one of {', '.join(REFERENCE_DEVICES)}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--reference-threads {self.threads}: must be >= 1")
        if self.max_batches < 1:
            raise UsageError(f"max_batches {self.max_batches}: must be >= 1")


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``1,8,32`` -> (1, 8, 32) (sorted, duplicates dropped)."""
    try:
        sizes = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise UsageError(f"--speed-batch-sizes {text!r}: expected comma-separated integers, e.g. 1,8,32") from None
    if not sizes or sizes[0] < 1:
        raise UsageError(f"--speed-batch-sizes {text!r}: batch sizes must be integers >= 1")
    return tuple(sizes)


# --------------------------------------------------------------------------------------------
# Pure parts


def timing_summary(latencies_s: Sequence[float] | np.ndarray, batch_size: int, wall_s: float | None = None) -> dict[str, Any]:
    """Per-call latencies (seconds) -> milliseconds: median, p99 (linear interpolation), mean,
    min, max; ``throughput`` = ``batch_size`` x calls / ``wall_s`` (default: the sum of the
    latencies) in inferences/s."""
    x = np.asarray(latencies_s, dtype=np.float64)
    if x.size == 0:
        raise UsageError("no latencies to summarise")
    wall = float(x.sum()) if wall_s is None else float(wall_s)
    ms = x * 1e3
    return {"iterations": int(x.size), "median_ms": float(np.median(ms)), "p99_ms": float(np.percentile(ms, 99)),
            "mean_ms": float(ms.mean()), "min_ms": float(ms.min()), "max_ms": float(ms.max()),
            "throughput": batch_size * x.size / wall if wall > 0 else None}


def speedup(reference_ms: float | None, served_ms: float | None) -> float | None:
    """``reference / served`` (> 1: the served model is faster); ``None`` when either is missing
    or not positive."""
    if reference_ms is None or served_ms is None:
        return None
    if not (reference_ms > 0 and served_ms > 0) or not (math.isfinite(reference_ms) and math.isfinite(served_ms)):
        return None
    return float(reference_ms) / float(served_ms)


def speed_row(batch_size: int, reference: Mapping[str, Any], served: Mapping[str, Any]) -> dict[str, Any]:
    """One table row: both summaries (:func:`timing_summary`) and the ratios. ``speedup_median``
    and ``speedup_p99`` divide the reference latency by the served one; ``throughput_ratio``
    divides the served inferences/s by the reference's."""
    r_thr, s_thr = reference.get("throughput"), served.get("throughput")
    return {"batch_size": int(batch_size), "reference": dict(reference), "served": dict(served),
            "speedup_median": speedup(reference.get("median_ms"), served.get("median_ms")),
            "speedup_p99": speedup(reference.get("p99_ms"), served.get("p99_ms")),
            "throughput_ratio": speedup(s_thr, r_thr)}


def _sample_key(inputs: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((name, tuple(np.shape(a))) for name, a in inputs.items()))


def fixed_shape_pool(batches: Sequence[Mapping[str, np.ndarray]], limit: int | None = None
                     ) -> tuple[dict[str, list[int]], list[dict[str, np.ndarray]], int, int]:
    """Split request batches (``{name: [B, ...]}``) into samples and keep those of one input shape:
    the most common one (ties: the larger one, e.g. the longer sequence). Returns (shape of each
    input without the batch axis, up to ``limit`` samples in data order, samples of that shape,
    samples in all)."""
    counts: dict[tuple, int] = {}
    total = 0
    for b in batches:
        n = len(next(iter(b.values())))
        key = _sample_key({k: v[0] for k, v in b.items()})
        counts[key] = counts.get(key, 0) + n
        total += n
    if not counts:
        raise UsageError("no samples to time")
    best = max(counts, key=lambda k: (counts[k], sum(int(np.prod(s)) for _, s in k)))
    pool: list[dict[str, np.ndarray]] = []
    for b in batches:
        if _sample_key({k: v[0] for k, v in b.items()}) != best:
            continue
        n = len(next(iter(b.values())))
        for j in range(n):
            if limit is not None and len(pool) >= limit:
                break
            pool.append({k: v[j] for k, v in b.items()})
    return {name: list(shape) for name, shape in best}, pool, counts[best], total


def speed_batches(pool: Sequence[Mapping[str, np.ndarray]], batch_size: int, count: int) -> list[dict[str, np.ndarray]]:
    """``count`` batches of ``batch_size`` samples taken from ``pool`` in order, wrapping around
    (a pool smaller than the batch repeats samples); at least one batch, and no more than are
    needed to cover the pool once."""
    if not pool:
        raise UsageError("no samples to time")
    count = max(1, min(count, math.ceil(len(pool) / batch_size)))
    out = []
    for k in range(count):
        rows = [pool[(k * batch_size + j) % len(pool)] for j in range(batch_size)]
        out.append({name: np.ascontiguousarray(np.stack([r[name] for r in rows])) for name in rows[0]})
    return out


def accuracy_kept(accuracy: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Per output, from the accuracy phase: top-1 agreement, cosine mean/min, and accuracy
    against labels for the reference and the served model (``None`` where not measured)."""
    if not accuracy:
        return None
    out: dict[str, Any] = {}
    for name, m in (accuracy.get("outputs") or {}).items():
        out[name] = {k: m.get(k) for k in ("top1_agreement", "cosine_mean", "cosine_min", "reference_accuracy",
                                           "candidate_accuracy")}
    return {"label_output": accuracy.get("label_output"), "samples": accuracy.get("samples"), "outputs": out}


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def speed_console_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per batch size. A side whose timing did not meet the stability rule is marked
    ``*`` with its spread, and its speedup is not printed as a number: an unstable timing is not a
    figure. The last line counts the stable batch sizes."""
    def side(label: str, t: Mapping[str, Any]) -> str:
        st = t.get("stability") or {}
        mark = "" if st.get("stable", True) else \
            f"; * NOT STABLE ±{_worst(st.get('spread_pct')):.0f}% over {st.get('windows', '?')} windows"
        return f"{label} median {t['median_ms']:.2f} ms (p99 {t['p99_ms']:.2f}{mark})"

    lines = []
    stable_rows = 0
    for row in rows:
        r, s = row["reference"], row["served"]
        unstable = [name for name, t in (("reference", r), ("served", s))
                    if not (t.get("stability") or {}).get("stable", True)]
        if unstable:
            x = "not computed (" + " and ".join(unstable) + " timing not stable)"
        else:
            stable_rows += 1
            x = "-" if row["speedup_median"] is None else f"{row['speedup_median']:.2f}x"
        lines.append(f"batch {row['batch_size']}{'*' if unstable else ''}: {side('reference', r)}, "
                     f"{side('served', s)}, speedup {x}")
    lines.append(f"{stable_rows} of {len(rows)} batch size(s) stable on both sides"
                 + ("" if stable_rows == len(rows) else "; * rows are not figures to quote"))
    return lines


def speed_markdown(speed: Mapping[str, Any]) -> list[str]:
    """The report section: what was compared, the table, the accuracy kept."""
    ref, srv = speed["reference"], speed["served"]
    ref_name = ref["label"]
    shapes = ", ".join(f"`{n}` {s}" for n, s in speed["input_shapes"].items())
    threads = ref.get("threads")
    lines = ["", f"## Speed: {ref_name} | served model", "",
             f"Concurrency 1, per batch size: the served model's client-side latency per request ({srv['protocol']}, "
             f"request sent -> numpy response decoded) beside {ref_name}'s latency per forward call on the same batch "
             f"(numpy in -> numpy out, device copies included{', `torch.cuda.synchronize()`' if ref['device'].startswith('cuda') else ''}); "
             f"inferences/s = samples / wall time. Speedup = {ref_name} / served (> 1: the served model is faster). "
             f"Windows of {speed['iterations']} timed calls after {speed['warmup']} warm-up calls per batch size and "
             f"side, until three windows agree within {(speed.get('measurement') or {}).get('stability_percentage', '?')}% "
             f"(the last three merged; rows marked * did not settle); "
             f"reference on {ref['device']}, {ref['engine']} threads {threads if threads is not None else '-'}; "
             f"the reference runs while no Triton request is in flight.",
             "",
             f"Inputs of one shape: {shapes} ({speed['samples_of_shape']} of {speed['samples_total']} samples have it"
             f"{'; the data has several shapes, the most common one is used' if speed['samples_of_shape'] < speed['samples_total'] else ''}).",
             "",
             f"| batch | {ref_name} median ms | {ref_name} p99 ms | {ref_name} infer/s | served median ms | served p99 ms | "
             "served infer/s | speedup (median) | speedup (p99) | throughput ratio |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in speed["rows"]:
        r, s = row["reference"], row["served"]
        unsettled = not all((x.get("stability") or {}).get("stable", True) for x in (r, s))
        lines.append(f"| {row['batch_size']}{'*' if unsettled else ''} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} | {_f(r['throughput'], '.1f')} | "
                     f"{s['median_ms']:.2f} | {s['p99_ms']:.2f} | {_f(s['throughput'], '.1f')} | {_x(row['speedup_median'])} | "
                     f"{_x(row['speedup_p99'])} | {_x(row['throughput_ratio'])} |")
    for sk in speed.get("skipped_batch_sizes", []):
        lines.append(f"| {sk['batch_size']} | skipped: {sk['reason']} | | | | | | | | |")
    kept = speed.get("accuracy_kept")
    lines.append("")
    if not kept:
        lines.append("Accuracy kept: not measured (the accuracy phase did not run).")
    else:
        parts = []
        for name, m in kept["outputs"].items():
            bits = []
            if m.get("top1_agreement") is not None and name == kept.get("label_output"):
                bits.append(f"top-1 agreement {_pct(m['top1_agreement'])}")
            if m.get("reference_accuracy") is not None and m.get("candidate_accuracy") is not None:
                bits.append(f"accuracy {_pct(m['reference_accuracy'])} -> {_pct(m['candidate_accuracy'])}")
            bits.append(f"cosine mean {_f(m.get('cosine_mean'), '.6f')} (min {_f(m.get('cosine_min'), '.6f')})")
            parts.append(f"`{name}` " + ", ".join(bits))
        lines.append(f"Accuracy kept ({kept['samples']} samples, served vs {ref_name}): " + "; ".join(parts) + ".")
    return lines


def plot_speed(ax: Any, speed: Mapping[str, Any]) -> None:
    """Median (solid) and p99 (dashed) latency per batch size, reference vs served, speedups
    annotated (log scales)."""
    rows = speed["rows"]
    bs = [r["batch_size"] for r in rows]
    ref_name = speed["reference"]["label"]
    for side, label, color in (("reference", ref_name, "tab:orange"), ("served", "served model", "tab:blue")):
        ax.plot(bs, [r[side]["median_ms"] for r in rows], "o-", color=color, label=f"{label} median")
        ax.plot(bs, [r[side]["p99_ms"] for r in rows], "s--", color=color, alpha=0.6, label=f"{label} p99")
    for r in rows:
        if r["speedup_median"] is not None:
            ax.annotate(f"{r['speedup_median']:.2f}x", (r["batch_size"], r["served"]["median_ms"]), textcoords="offset points",
                        xytext=(4, -12), fontsize=8)
    if bs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.set_title(f"{ref_name} vs served, concurrency 1 (speedup = {ref_name} / served)", fontsize=9)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per request (ms)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)


# --------------------------------------------------------------------------------------------
# Measuring


def resolve_reference_device(device: str, kind: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one is a
    :class:`UsageError` (exit 2). An ``.onnx`` reference (``kind == "onnx"``) runs on the CPU."""
    if device not in REFERENCE_DEVICES:
        raise UsageError(f"--reference-device {device!r}: one of {', '.join(REFERENCE_DEVICES)}")
    if kind == "onnx":
        if device == "cuda":
            raise UsageError("--reference-device cuda: the reference is an ONNX file, timed with ONNX Runtime's CPU "
                             "provider; use --reference-device cpu or a PyTorch reference")
        return "cpu"

    torch = _import_torch()
    available = bool(torch.cuda.is_available())
    if device == "cuda" and not available:
        raise UsageError(f"--reference-device cuda: CUDA is not available to torch {torch.__version__} on this machine; "
                         f"use --reference-device cpu or auto")
    if device == "auto":
        return "cuda" if available else "cpu"
    return device


def _worst(spread_pct: Any) -> float:
    """The larger of a spread record's throughput and latency deviations (percent)."""
    if isinstance(spread_pct, Mapping):
        return max((float(v) for v in spread_pct.values()), default=math.nan)
    return math.nan if spread_pct is None else float(spread_pct)


TIMING_ATTEMPTS = 2  # series of windows the reference timing runs before it reports "not stable"
RETRY_PAUSE_S = 1.0


def time_stable(fn: Callable[[dict[str, np.ndarray]], Any], batches: Sequence[dict[str, np.ndarray]], stability: Any,
                warmup: int, batch_size: int, sync: Callable[[], None] | None = None,
                attempts: int = TIMING_ATTEMPTS) -> tuple[np.ndarray, float, dict[str, Any]]:
    """:func:`time_calls` in windows of ``stability.requests`` calls until the last three agree
    (perf_analyzer's rule, :mod:`trtrepo.measure`): the merged latencies, their wall time, and the
    windows' record. A series that ends unstable after ``stability.max_trials`` windows is retried
    (``attempts`` series in all, after a short pause); the most stable series is kept and the
    record says whether it met the rule."""

    for i in range(warmup):
        fn(batches[i % len(batches)])
    best: tuple[list[dict[str, Any]], list[np.ndarray]] | None = None
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            time.sleep(RETRY_PAUSE_S)  # let a transient load pass before the fresh series
        windows: list[dict[str, Any]] = []
        lats: list[np.ndarray] = []
        while True:
            lat, wall = time_calls(fn, batches, stability.requests, 0, sync)
            windows.append(window_summary(lat, len(lat) * batch_size, wall, stability.percentiles))
            lats.append(lat)
            if len(windows) >= stability.max_trials or is_stable(windows, stability.pct, stability.latency_key):
                break
        stable = is_stable(windows, stability.pct, stability.latency_key)
        if stable or best is None or \
                _worst(spread(windows, stability.latency_key)) < _worst(spread(best[0], stability.latency_key)):
            best = (windows, lats)
        if stable:
            break
    assert best is not None
    windows, lats = best
    lat, _, seconds = merged(windows, lats)
    return lat, seconds, {"windows": len(windows), "stable": is_stable(windows, stability.pct, stability.latency_key),
                          "spread_pct": spread(windows, stability.latency_key), "attempts": attempt}


def time_calls(fn: Callable[[dict[str, np.ndarray]], Any], batches: Sequence[dict[str, np.ndarray]], iterations: int,
               warmup: int, sync: Callable[[], None] | None = None) -> tuple[np.ndarray, float]:
    """Call ``fn`` on ``batches`` cyclically: ``warmup`` times unmeasured, then ``iterations``
    times, each timed with ``perf_counter`` (``sync`` runs before the clock stops). Returns the
    latencies (s) and the wall time of the measured loop."""
    for i in range(warmup):
        fn(batches[i % len(batches)])
    if sync is not None:
        sync()
    lat = np.empty(iterations)
    start = time.perf_counter()
    for i in range(iterations):
        t0 = time.perf_counter()
        fn(batches[i % len(batches)])
        if sync is not None:
            sync()
        lat[i] = time.perf_counter() - t0
    return lat, time.perf_counter() - start


class TimedReference:
    """The reference as a callable for timing: PyTorch on ``device`` with ``threads`` (set for
    the duration of :meth:`threads_set`), or ONNX Runtime on the CPU for an ``.onnx`` source."""

    def __init__(self, reference: str, io: Any, *, device: str, threads: int | None, weights: str | None = None) -> None:
        src = resolve_source(reference, weights)
        self.kind = src.kind
        self.device = device
        self.requested_threads = threads
        self._sync: Callable[[], None] | None = None
        if src.kind == "onnx":

            self.engine = "onnxruntime"
            sess = make_session(src.location, threads=threads)
            names = io.output_names
            in_names = {i.name for i in sess.get_inputs()}
            self.fn: Callable[[dict[str, np.ndarray]], Any] = \
                lambda feed: sess.run(names, {k: v for k, v in feed.items() if k in in_names})
            self.precision = "fp32"
            self.label = "ONNX Runtime reference"
            self.version = _ort_version()
        else:

            ref = Reference.for_io(src, io, device=device)
            self.engine = "torch"
            self.fn = ref
            torch = ref.torch
            params = list(ref.model.parameters())
            dtype = str(params[0].dtype).removeprefix("torch.") if params else "float32"
            self.precision = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
            self.label = f"PyTorch {self.precision.upper()}"
            self.version = torch.__version__
            if device.startswith("cuda"):
                self._sync = torch.cuda.synchronize

    def measure(self, batches: Sequence[dict[str, np.ndarray]], stability: Any, warmup: int,
                batch_size: int) -> tuple[np.ndarray, float, int | None, dict[str, Any]]:
        """Latencies and wall time of the stable windows (:func:`time_stable`), the thread count in
        effect (``torch.get_num_threads()``) and the windows' record."""
        if self.engine != "torch":
            lat, wall, rec = time_stable(self.fn, batches, stability, warmup, batch_size)
            return lat, wall, self.requested_threads, rec
        import torch

        before = torch.get_num_threads()
        if self.requested_threads is not None:
            torch.set_num_threads(self.requested_threads)
        try:
            used = torch.get_num_threads()
            lat, wall, rec = time_stable(self.fn, batches, stability, warmup, batch_size, self._sync)
        finally:
            torch.set_num_threads(before)
        return lat, wall, used, rec


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def compare_speed(target: Any, reference: TimedReference, batches: Sequence[Mapping[str, np.ndarray]], io: Any,
                  options: SpeedOptions, *, max_batch_size: int, accuracy: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Time the served model (``target``: a prepared :class:`~trtrepo.validate.TritonTarget`) and
    the reference on batches of one input shape taken from ``batches`` (the request batches
    of the accuracy data), batch size by batch size. Returns ``speed_vs_reference``."""

    sizes = list(options.batch_sizes)
    skipped = [{"batch_size": b, "reason": f"larger than the server's max_batch_size {max_batch_size}"}
               for b in sizes if b > max_batch_size]
    sizes = [b for b in sizes if b <= max_batch_size]
    shapes, pool, of_shape, total = fixed_shape_pool(batches, limit=max(options.batch_sizes) * options.max_batches)
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = []
    threads_used: int | None = reference.requested_threads
    for b in sizes:
        feeds = speed_batches(pool, b, options.max_batches)
        payloads = [Payload(f, expected_shapes(io, b)) for f in feeds]
        # Served first, then the reference: no Triton request is in flight while the reference runs.
        if options.warmup:
            target.load(payloads, 1, requests=options.warmup)
        m = target.measure(payloads, options.stability, concurrency=1)
        s_lat, _, s_wall = m.merged()
        served = timing_summary(s_lat, b, s_wall)
        served["stability"] = {"windows": len(m.windows), "stable": m.stable, "spread_pct": m.summary()["spread_pct"]}
        lat, wall, threads_used, record = reference.measure(feeds, options.stability, options.warmup, b)
        ref = timing_summary(lat, b, wall)
        ref["stability"] = record
        row = speed_row(b, ref, served)
        rows.append(row)
        log.info("batch %d: %s median %.2f ms, served median %.2f ms (%.2fx)", b, reference.label, ref["median_ms"],
                 served["median_ms"], row["speedup_median"] or float("nan"))
        if progress is not None:
            progress(1)
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    srv = dict(server or {})
    return {
        "compared": COMPARED,
        "reference": {"label": reference.label, "engine": reference.engine, "version": reference.version,
                      "precision": reference.precision, "device": reference.device, "threads": threads_used,
                      "threads_requested": reference.requested_threads},
        "served": {"model": srv.get("model"), "version": srv.get("version"), "protocol": srv.get("protocol"),
                   "concurrency": 1, "shared_memory": "none"},
        "iterations": options.iterations,
        "measurement": options.stability.to_dict(),
        "warmup": options.warmup,
        "input_shapes": shapes,
        "samples_of_shape": of_shape,
        "samples_total": total,
        "distinct_batches": options.max_batches,
        "order": "per batch size: served model, then reference (no Triton request in flight while the reference runs)",
        "cpu_count": os.cpu_count(),
        "load_average": [None if load0 is None else load0[0], None if load1 is None else load1[0]],
        "rows": rows,
        "skipped_batch_sizes": skipped,
        "accuracy_kept": accuracy_kept(accuracy),
    }
