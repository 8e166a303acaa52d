"""Measurement you can trust (issue 17): perf_analyzer's stability rule, as pure functions.

A load level is measured in **windows** -- a fixed time (``--measurement-interval``, 2 s by
default) or a fixed number of requests (``--requests``) each -- under continuous load, until the
last :data:`STABLE_WINDOWS` windows agree: each window's throughput *and* latency (the mean, or
the percentile of :attr:`Stability.percentile`) within ``--stability-percentage`` of those
windows' mean, or until ``--max-trials`` windows were measured. The figures reported are those of
the last windows merged (their requests' latencies together, throughput = their inferences /
their time), with the spread and ``stable: false`` when the rule was not met; the same as
perf_analyzer's ``inference_profiler`` (``IsInfStable`` / ``IsLatencyStable``).

The same rule times the PyTorch reference in ``validate`` (:func:`trtrepo.validate.speed.compare_speed`)
and each candidate in ``trtrepo tune``.

Also here: the open-loop schedule of the request-rate mode (:func:`send_times`), and the machine
warnings of a run (:func:`machine_warnings`). No I/O except :func:`cpu_sample` (``/proc``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import OptionError, UsageError

STABLE_WINDOWS = 3  # consecutive windows that must agree (perf_analyzer's stability window)
DEFAULT_INTERVAL_S = 2.0
DEFAULT_STABILITY_PCT = 10.0
DEFAULT_MAX_TRIALS = 10
DEFAULT_PERCENTILES = (50, 90, 95, 99)
DISTRIBUTIONS = ("constant", "poisson")
ALWAYS_PERCENTILES = (50, 99)  # computed whatever --percentiles says: the p99 gate and the plot read them

# Machine warnings (documented in docs/serving.md, "trtrepo validate"): thresholds on what a run saw
BUSY_BEFORE = 0.5  # load average / cores before the run
CLIENT_SHARE = 0.30  # share of the machine's CPU time the load generator itself used
STEAL_SHARE = 0.05  # hypervisor steal time share
DELAYED_SHARE = 0.10  # request-rate mode: share of requests sent more than 1 ms late


@dataclass(frozen=True)
class Stability:
    """How a level is measured: windows of ``interval_s`` seconds (or ``requests`` requests)
    until :data:`STABLE_WINDOWS` agree within ``pct`` percent, at most ``max_trials`` windows."""

    interval_s: float = DEFAULT_INTERVAL_S
    requests: int | None = None  # count windows instead of time windows
    pct: float = DEFAULT_STABILITY_PCT
    max_trials: int = DEFAULT_MAX_TRIALS
    percentile: int | None = None  # latency compared across windows: None = the mean, else this percentile
    percentiles: tuple[int, ...] = DEFAULT_PERCENTILES

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise OptionError("measurement_interval", f"{self.interval_s}: a positive number of seconds")
        if self.requests is not None and self.requests < 1:
            raise OptionError("requests", f"{self.requests}: must be >= 1", concept="the requests per window")
        if not (0 < self.pct <= 100):
            raise OptionError("stability_percentage", f"{self.pct}: between 0 (exclusive) and 100")
        if self.max_trials < STABLE_WINDOWS:
            raise OptionError("max_trials", f"{self.max_trials}: at least {STABLE_WINDOWS} (the windows that must agree)",
                              concept="the most windows per level")
        pcts = tuple(sorted({int(p) for p in self.percentiles}))
        if not pcts or any(not 1 <= p <= 99 for p in pcts):
            raise OptionError("percentiles", f"{list(self.percentiles)}: integers 1..99", concept="the latency percentiles")
        object.__setattr__(self, "percentiles", tuple(sorted({*pcts, *ALWAYS_PERCENTILES})))
        if self.percentile is not None:
            if not 1 <= self.percentile <= 99:
                raise OptionError("stability_percentile", f"{self.percentile}: an integer 1..99")
            if self.percentile not in pcts:
                object.__setattr__(self, "percentiles", tuple(sorted({*pcts, self.percentile})))

    @property
    def mode(self) -> str:
        return "count_windows" if self.requests is not None else "time_windows"

    @property
    def latency_key(self) -> str:
        return "mean" if self.percentile is None else f"p{self.percentile}"

    def describe(self) -> str:
        size = f"{self.requests} requests" if self.requests is not None else f"{self.interval_s:g} s"
        return (f"windows of {size} until {STABLE_WINDOWS} agree within {self.pct:g}% on throughput and "
                f"{self.latency_key} latency (at most {self.max_trials})")

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "measurement_interval_s": self.interval_s, "requests_per_window": self.requests,
                "stability_percentage": self.pct, "max_trials": self.max_trials, "stable_windows": STABLE_WINDOWS,
                "latency_compared": self.latency_key, "percentiles": list(self.percentiles)}


def parse_percentiles(text: str) -> tuple[int, ...]:
    """``50,90,99`` -> (50, 90, 99)."""
    try:
        values = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise OptionError("percentiles", f"{text!r}: comma-separated integers 1..99, e.g. 50,90,95,99",
                          concept="the latency percentiles") from None
    if not values or any(not 1 <= p <= 99 for p in values):
        raise OptionError("percentiles", f"{text!r}: comma-separated integers 1..99, e.g. 50,90,95,99",
                          concept="the latency percentiles")
    return values


def parse_rates(text: str) -> tuple[float, ...]:
    """``10,20.5`` -> (10.0, 20.5) requests per second (sorted, duplicates dropped)."""
    try:
        rates = tuple(sorted({float(p) for p in text.split(",") if p.strip()}))
    except ValueError:
        raise OptionError("request_rate", f"{text!r}: comma-separated requests per second, e.g. 10,20,40",
                          concept="the request rates") from None
    if not rates or any(not (r > 0 and math.isfinite(r)) or r > 1e6 for r in rates):
        raise OptionError("request_rate", f"{text!r}: rates must be positive numbers of requests per second (at most 1e6)",
                          concept="the request rates")
    return rates


def latency_ms(latencies_s: Sequence[float] | np.ndarray, percentiles: Sequence[int] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """Latency percentiles (linear interpolation), mean, min and max, in milliseconds."""
    x = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if x.size == 0:
        raise UsageError("no latencies to summarise")
    out = {f"p{p}": float(np.percentile(x, p)) for p in percentiles}
    out.update(mean=float(x.mean()), min=float(x.min()), max=float(x.max()))
    return out


def window_summary(latencies_s: np.ndarray, inferences: int, duration_s: float,
                   percentiles: Sequence[int] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """One window: requests completed in it, their inferences per second and latency (ms)."""
    lat = latency_ms(latencies_s, percentiles) if len(latencies_s) else None
    return {"requests": int(len(latencies_s)), "inferences": int(inferences), "duration_s": float(duration_s),
            "throughput": inferences / duration_s if duration_s > 0 else 0.0, "latency_ms": lat}


def deviation(values: Sequence[float]) -> float:
    """Largest distance from the mean, in percent of the mean (inf for an empty or zero mean)."""
    if not values:
        return math.inf
    mean = float(np.mean(values))
    if not mean > 0:
        return math.inf
    return 100.0 * max(abs(v - mean) for v in values) / mean


def spread(windows: Sequence[Mapping[str, Any]], latency_key: str = "mean") -> dict[str, float]:
    """The last :data:`STABLE_WINDOWS` windows' deviation (percent) in throughput and latency."""
    last = list(windows)[-STABLE_WINDOWS:]
    lats = [w["latency_ms"][latency_key] for w in last if w.get("latency_ms")]
    return {"throughput_pct": deviation([w["throughput"] for w in last]),
            "latency_pct": deviation(lats) if len(lats) == len(last) else math.inf}


def is_stable(windows: Sequence[Mapping[str, Any]], pct: float, latency_key: str = "mean") -> bool:
    """perf_analyzer's rule: the last :data:`STABLE_WINDOWS` windows each within ``pct`` percent
    of their mean throughput and of their mean ``latency_key`` latency."""
    if len(windows) < STABLE_WINDOWS:
        return False
    s = spread(windows, latency_key)
    return s["throughput_pct"] <= pct and s["latency_pct"] <= pct


def merged(windows: Sequence[Mapping[str, Any]], latencies: Sequence[np.ndarray]) -> tuple[np.ndarray, int, float]:
    """The reported figures: the last :data:`STABLE_WINDOWS` windows' latencies together, their
    inferences and their time (``latencies`` holds each window's latencies in seconds)."""
    last = list(windows)[-STABLE_WINDOWS:]
    lats = list(latencies)[-STABLE_WINDOWS:]
    lat = np.concatenate([np.asarray(x, dtype=np.float64) for x in lats]) if lats else np.empty(0)
    return lat, int(sum(w["inferences"] for w in last)), float(sum(w["duration_s"] for w in last))


def send_times(rate: float, count: int, distribution: str = "constant", seed: int = 0) -> np.ndarray:
    """Offsets (s) from the start at which an open-loop client sends its first ``count`` requests
    at ``rate`` per second: evenly spaced, or a Poisson process (exponential gaps)."""
    if distribution not in DISTRIBUTIONS:
        raise OptionError("request_distribution", f"{distribution!r}: one of {', '.join(DISTRIBUTIONS)}")
    if distribution == "constant":
        return np.arange(count, dtype=np.float64) / rate
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if count else np.empty(0)


# --------------------------------------------------------------------------------------------
# The machine during a run


@dataclass(frozen=True)
class CpuSample:
    """Counters read at one instant: wall clock, this process's CPU time, the machine's busy,
    steal and total jiffies, the 1-minute load average."""

    wall: float
    process_cpu: float
    busy: int
    steal: int
    total: int
    load1: float | None


def cpu_sample() -> CpuSample:
    busy = steal = total = 0
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal guest guest_nice
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        steal = fields[7] if len(fields) > 7 else 0
        total = sum(fields[:8])
        busy = total - idle
    except (OSError, ValueError, IndexError):
        pass
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return CpuSample(time.perf_counter(), time.process_time(), busy, steal, total, load1)


def machine_usage(before: CpuSample, after: CpuSample, cores: int) -> dict[str, Any]:
    """What the machine did between two samples: its busy and steal shares, the share of all
    cores' time this process (the load generator) used, the load average before."""
    wall = max(after.wall - before.wall, 1e-9)
    total = after.total - before.total
    return {"cores": cores, "load_average_before": before.load1,
            "busy_share": (after.busy - before.busy) / total if total > 0 else None,
            "steal_share": (after.steal - before.steal) / total if total > 0 else None,
            "client_share": (after.process_cpu - before.process_cpu) / (wall * max(1, cores))}


def machine_warnings(usage: Mapping[str, Any], *, server_local: bool) -> list[str]:
    """Warnings for the report when the figures may not be the server's alone: the machine was
    busy before the run, the load generator took a large share of a machine it shares with the
    server, or the hypervisor stole time."""
    out = []
    cores = int(usage.get("cores") or 1)
    load = usage.get("load_average_before")
    if load is not None and load > BUSY_BEFORE * cores:
        out.append(f"the machine was busy before the run (load average {load:.2f} on {cores} cores): other work "
                   f"competes with the server, figures may be low")
    client = usage.get("client_share")
    if server_local and client is not None and client > CLIENT_SHARE:
        out.append(f"the load generator used {100 * client:.0f}% of this machine's CPU time, which it shares with the "
                   f"server: throughput is capped by the client too; measure from another machine for the server's peak")
    steal = usage.get("steal_share")
    if steal is not None and steal > STEAL_SHARE:
        out.append(f"the hypervisor took {100 * steal:.0f}% of the CPU time (steal): figures vary from run to run")
    return out
