"""Several servers of one repository (``validate --url A,B,...``): do they agree, and what do
they serve together?

- :func:`agreement`: every request sent to every server; per output, the largest absolute
  difference from the first server's answer (servers running one repository should give the
  same bits on the same hardware; a different GPU or TensorRT build can change low bits).
- :func:`measure_together`: one load level on every server at the same time (each server gets
  the level's concurrency, or request rate, of its own), one thread per server.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..contracts.payload import Payload
from ..measure import Stability, latency_ms
from .client import TritonTarget
from .load import Measurement, ServerBooks


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.dtype.kind in "OSUb" or b.dtype.kind in "OSUb":
        return 0.0 if np.array_equal(a, b) else float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def agreement(targets: Sequence[TritonTarget], payloads: Sequence[Payload], limit: float) -> dict[str, Any]:
    """Each payload to every server; per (server, output) the largest absolute difference from the
    first server, and whether every one is within ``limit``."""
    first = targets[0]
    worst: dict[str, dict[str, float]] = {t.url: {} for t in targets[1:]}
    for p in payloads:
        ref = first.infer(p)
        for t in targets[1:]:
            got = t.infer(p)
            for name, arr in ref.items():
                d = _diff(arr, got[name])
                worst[t.url][name] = max(worst[t.url].get(name, 0.0), d)
    rows = [{"server": url, "output": name, "max_abs_diff": d, "identical": d == 0.0, "within_limit": d <= limit}
            for url, outs in worst.items() for name, d in outs.items()]
    return {"reference_server": first.url, "requests": len(payloads), "limit": limit, "outputs": rows,
            "identical": all(r["identical"] for r in rows), "agree": all(r["within_limit"] for r in rows)}


def measure_together(targets: Sequence[TritonTarget], payloads: Sequence[Payload], stability: Stability, *,
                     concurrency: int | None, rate: float | None, distribution: str,
                     books: Sequence[ServerBooks | None] | None = None) -> list[Measurement]:
    """One level on every server at once (a thread per server; each its own concurrency or rate;
    ``books``: each server's count, so that its windows end where that count stands)."""
    books = list(books) if books is not None else [None] * len(targets)
    with ThreadPoolExecutor(len(targets)) as pool:
        futures = [pool.submit(t.measure, payloads, stability, concurrency=concurrency, rate=rate,
                               distribution=distribution, books=bk) for t, bk in zip(targets, books, strict=True)]
        return [f.result() for f in futures]


def added_requests(servers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The servers' request count and mean request time (ms) together, from each one's statistics
    of the same windows (:func:`~trtrepo.validate.contract.stats_diff`): the server side of a
    fleet's totals row."""
    count = sum(int(s.get("request_count") or 0) for s in servers)
    timed = [(int(s["request_count"]), float(s["request_ms"])) for s in servers if s.get("request_ms") is not None]
    ms = sum(n * t for n, t in timed) / count if count and len(timed) == len(servers) else None
    return {"request_count": count, "request_ms": ms}


def total_row(measurements: Sequence[Measurement], percentiles: Sequence[int]) -> dict[str, Any]:
    """The fleet's level: throughputs added, latencies of every server's reported windows together."""

    lats = [m.merged()[0] for m in measurements]
    every = np.concatenate(lats) if lats else np.empty(0)
    return {"throughput": float(sum(m.throughput for m in measurements)),
            "client_ms": latency_ms(every, percentiles) if every.size else None,
            "requests": int(every.size), "stable": all(m.stable for m in measurements)}
