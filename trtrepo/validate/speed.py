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

**What each row compares** (issue 41): the reference is named by what runs it (``PyTorch eager
FP32 (cpu, torch threads 2)``) and the served side by its server and backend. Where the FP32 ONNX
model is at hand (``--onnx``, or the reference's cached export) it is timed too, on ONNX Runtime's
CPU provider in this process with the reference's thread count: ``speedup_vs_onnx`` (its median /
the served median) is the served model's gain over the same graph in FP32, so the share of the
PyTorch speedup that is ONNX Runtime's, not INT8's, is a number of its own. It includes Triton's
transport, so it is a lower bound of INT8's own gain.

**The time budget** (issue 41): eager PyTorch on a busy machine took 15 minutes here. The phase
runs under a deadline (:func:`compare_speed`'s ``deadline``): what is left is shared equally by the
batch sizes still to time (time a fast size leaves flows to the next); inside a size, the warm-up
calls time each side (they stop after a quarter of the share), and the calls per window shrink
(:func:`calls_per_window`, at least :data:`MIN_CALLS`) so that :data:`PLANNED_WINDOWS` windows of
all sides fit the share. A side whose windows run into the deadline stops there and is recorded
``cut`` (not settled in the budget): no retry series is started without time for it. A size
reached with nothing left, or whose one call of each side (the last size's, scaled by the batch)
would not fit what is left, is skipped, named.
``deadline=inf`` (``validate --thorough``) is the former behaviour: windows of ``iterations``
calls, a second series for an unsettled side.

**Plausibility** (issue 41): stability windows cannot catch a size that is slow every time. A
larger batch whose median call takes less total time than a smaller batch's, by more than
:data:`IMPLAUSIBLE_MARGIN`, on any side, flags both rows (:func:`implausible_rows`). A flagged row,
like an unsettled one, gets no speedup on any surface (:func:`withheld`: console, Markdown, plot).

Pure parts (:func:`timing_summary`, :func:`speedup`, :func:`speed_row`, :func:`fixed_shape_pool`,
:func:`speed_batches`, :func:`accuracy_kept`, :func:`speed_markdown`, :func:`implausible_rows`,
:func:`withheld`, :func:`calls_per_window`, :func:`reference_estimate_s`) have no I/O.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.payload import Payload, expected_shapes
from ..cpu import available_cores
from ..errors import OptionError, UsageError
from ..measure import Stability, cpu_sample, is_stable, machine_usage, machine_warnings, merged, spread, window_summary
from ..modelio import qdq_counts
from ..modelsource import import_torch, resolve_source
from ..onnxgraph import make_session
from .reference import Reference

log = logging.getLogger(__name__)

REFERENCE_DEVICES = ("auto", "cpu", "cuda")
DEFAULT_BATCH_SIZES = (1, 8, 32)
COMPARED = ("served: client-side latency per request at concurrency 1 (request sent -> numpy response decoded); "
            "reference: one forward call on the same batch (numpy in -> numpy out, device copies included); "
            "inferences/s = samples / wall time of the measured loop; speedup = reference / served (> 1: served is faster)")
DEFAULT_TIME_BUDGET_S = 90.0  # validate's wall-time budget (--time-budget); the speed phase gets what is left
SPEED_FLOOR_S = 20.0  # the speed phase gets at least this (or the budget if shorter), whatever the earlier phases took
SLOW_CALL_S = 0.5  # a warm reference call at batch 1 this slow is announced before any timing
MIN_CALLS = 3  # calls per window at least, however short the share
PLANNED_WINDOWS = 5  # the windows a share is sized for: the three that must agree and two more
IMPLAUSIBLE_MARGIN = 0.2  # a larger batch faster than a smaller one by more than this share is implausible
PROGRESS_EVERY_S = 5.0  # a long side prints a status line at most this often


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
            raise OptionError("speed_batch_sizes", f"{list(self.batch_sizes)}: batch sizes must be integers >= 1",
                              concept="the batch sizes")
        object.__setattr__(self, "batch_sizes", tuple(sorted({int(b) for b in self.batch_sizes})))
        if self.iterations < 2:
            raise OptionError("speed_iterations", f"{self.iterations}: must be >= 2 (a median and a p99)",
                              concept="the timed calls per batch size")
        if self.warmup < 0:
            raise OptionError("speed_warmup", f"{self.warmup}: must be >= 0", concept="the warm-up calls per batch size")
        if self.device not in REFERENCE_DEVICES:
            raise OptionError("reference_device", f"{self.device!r}: one of {', '.join(REFERENCE_DEVICES)}")
        if self.threads is not None and self.threads < 1:
            raise OptionError("reference_threads", f"{self.threads}: must be >= 1", concept="the reference's threads")
        if self.max_batches < 1:
            raise UsageError(f"max_batches {self.max_batches}: must be >= 1")


@dataclass(frozen=True)
class SpeedRun:
    """How one speed phase runs in its caller's run: until ``deadline`` (``time.perf_counter()``
    seconds; ``inf``: no budget), with ``budget_s`` (validate's budget, for the record) and
    ``load_before`` (the load average at validate's start, for the machine warnings); ``progress``
    gets 1 per batch size done, ``note`` what is under way (a size, a long side's window)."""

    deadline: float = math.inf
    budget_s: float | None = None
    load_before: float | None = None
    progress: Callable[[int], None] | None = None
    note: Callable[[str], None] | None = None


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    """``1,8,32`` -> (1, 8, 32) (sorted, duplicates dropped)."""
    try:
        sizes = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise OptionError("speed_batch_sizes", f"{text!r}: expected comma-separated integers, e.g. 1,8,32", concept="the batch sizes") from None
    if not sizes or sizes[0] < 1:
        raise OptionError("speed_batch_sizes", f"{text!r}: batch sizes must be integers >= 1", concept="the batch sizes")
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


def speed_row(batch_size: int, reference: Mapping[str, Any], served: Mapping[str, Any],
              onnx: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One table row: both summaries (:func:`timing_summary`) and the ratios. ``speedup_median``
    and ``speedup_p99`` divide the reference latency by the served one; ``throughput_ratio``
    divides the served inferences/s by the reference's. With ``onnx`` (the FP32 ONNX model on ONNX
    Runtime), ``speedup_vs_onnx`` divides its median by the served one. ``implausible`` is set from
    :func:`implausible_rows` (its sides and reason, or None)."""
    r_thr, s_thr = reference.get("throughput"), served.get("throughput")
    return {"batch_size": int(batch_size), "reference": dict(reference), "served": dict(served),
            "speedup_median": speedup(reference.get("median_ms"), served.get("median_ms")),
            "speedup_p99": speedup(reference.get("p99_ms"), served.get("p99_ms")),
            "throughput_ratio": speedup(s_thr, r_thr),
            "onnx": None if onnx is None else dict(onnx),
            "speedup_vs_onnx": None if onnx is None else speedup(onnx.get("median_ms"), served.get("median_ms")),
            "implausible": None}


SIDE_NAMES = {"reference": "reference", "served": "served", "onnx": "ONNX Runtime"}


def implausible_rows(rows: Sequence[Mapping[str, Any]], margin: float = IMPLAUSIBLE_MARGIN) -> dict[int, dict[str, Any]]:
    """Batch size -> ``{"sides": [...], "reason": ...}`` for each implausible row: on a side
    (reference, served, onnx), a larger batch's median call took less total time than a smaller
    batch's by more than ``margin`` (a share). A call on more samples is not faster than one on
    fewer, so one of the two figures is not what the model costs (a size slow every time, which
    stability windows cannot catch); which one cannot be told from the pair, so both rows are
    flagged, with the first reason found and every side concerned."""
    out: dict[int, dict[str, Any]] = {}
    for side, name in SIDE_NAMES.items():
        pts = sorted((int(r["batch_size"]), float(r[side]["median_ms"])) for r in rows if r.get(side))
        for i, (small, small_ms) in enumerate(pts):
            for large, large_ms in pts[i + 1:]:
                if large > small and large_ms * (1 + margin) < small_ms:
                    why = (f"{name} takes longer at batch {small} ({small_ms:.2f} ms) than at batch {large} "
                           f"({large_ms:.2f} ms)")
                    for b in (small, large):
                        flag = out.setdefault(b, {"sides": [], "reason": why})
                        if side not in flag["sides"]:
                            flag["sides"].append(side)
    return out


def _implausible(row: Mapping[str, Any], sides: Sequence[str]) -> str | None:
    flag = row.get("implausible")
    if flag and any(s in flag.get("sides", ()) for s in sides):
        return str(flag["reason"])
    return None


def _unsettled(t: Mapping[str, Any] | None) -> bool:
    return t is not None and not (t.get("stability") or {}).get("stable", True)


def withheld(row: Mapping[str, Any]) -> str | None:
    """Why the row's speedup is not a figure (every surface withholds it the same way): a side
    that did not settle, or an implausible row; None when it is one."""
    unstable = [name for name in ("reference", "served") if _unsettled(row.get(name))]
    if unstable:
        cut = any(((row.get(n) or {}).get("stability") or {}).get("cut") for n in unstable)
        return " and ".join(unstable) + " timing not " + ("settled in the time budget" if cut else "stable")
    why = _implausible(row, ("reference", "served"))
    return None if why is None else f"implausible: {why}"


def row_mark(row: Mapping[str, Any]) -> str:
    """The row's mark on every surface: ``*`` a side did not settle, ``!`` implausible."""
    return (("*" if any(_unsettled(row.get(n)) for n in ("reference", "served")) else "")
            + ("!" if _implausible(row, ("reference", "served")) else ""))


def _onnx_withheld(row: Mapping[str, Any]) -> str | None:
    """Why ``speedup_vs_onnx`` is not a figure (the served or ONNX side unsettled, or implausible)."""
    if row.get("onnx") is None:
        return None
    unstable = [name for name in ("served", "onnx") if _unsettled(row.get(name))]
    if unstable:
        return " and ".join(SIDE_NAMES[n] for n in unstable) + " timing not settled"
    why = _implausible(row, ("served", "onnx"))
    return None if why is None else f"implausible: {why}"


def calls_per_window(share_s: float, round_s: float, iterations: int, windows: int = PLANNED_WINDOWS,
                     least: int = MIN_CALLS) -> int:
    """Calls per window such that ``windows`` windows of every side (one call of each side takes
    ``round_s`` seconds together) fit ``share_s`` seconds: at most ``iterations``, at least
    ``least`` (or ``iterations`` when that is fewer); ``iterations`` without a deadline."""
    least = min(least, iterations)
    if not math.isfinite(share_s) or not round_s > 0:
        return iterations
    return int(min(iterations, max(least, share_s // (windows * round_s))))


def reference_estimate_s(call_s: float, batch_sizes: Sequence[int], iterations: int, warmup: int) -> float:
    """Seconds the reference's timing takes at least (three windows and the warm-up per size),
    from one warm call at batch 1 taking ``call_s``, a call's time growing with the batch."""
    return sum((max(1, warmup) + 3 * iterations) * call_s * b for b in batch_sizes)


def slow_reference_message(label: str, device: str, call_s: float, batch_sizes: Sequence[int], estimate_s: float,
                           budget_s: float | None) -> str:
    """The warning printed before any timing when the reference is slow."""
    cap = "" if budget_s is None else f" (the time budget caps it at about {budget_s:.0f} s: what does not settle in it is cut)"
    return (f"{label} takes {call_s:.2f} s a call at batch 1 on the {device}; timing it at batch sizes "
            f"{', '.join(str(b) for b in batch_sizes)} takes about {estimate_s:.0f} s{cap}; --no-reference-speed skips this")


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


def _side_mark(t: Mapping[str, Any]) -> str:
    st = t.get("stability") or {}
    if st.get("stable", True):
        return ""
    if st.get("cut"):
        return (f"; * NOT SETTLED in the time budget: {st.get('windows', '?')} window(s) of "
                f"{st.get('calls_per_window', '?')} calls")
    return f"; * NOT STABLE ±{_worst(st.get('spread_pct')):.0f}% over {st.get('windows', '?')} windows"


def speed_console_lines(rows: Sequence[Mapping[str, Any]], onnx_label: str = "ONNX Runtime") -> list[str]:
    """One line per batch size. A side whose timing did not meet the stability rule is marked
    ``*`` with its spread (or "NOT SETTLED in the time budget" when the budget cut it), an
    implausible row ``!`` (:func:`implausible_rows`); neither gets its speedup printed as a number
    (:func:`withheld`). With the FP32 ONNX model timed, each line ends with the served model
    against it. The last line counts the rows that are figures."""
    def side(label: str, t: Mapping[str, Any]) -> str:
        return f"{label} median {t['median_ms']:.2f} ms (p99 {t['p99_ms']:.2f}{_side_mark(t)})"

    lines = []
    quoted = 0
    for row in rows:
        r, s = row["reference"], row["served"]
        why = withheld(row)
        if why:
            x = f"not computed ({why})"
        else:
            quoted += 1
            x = "-" if row["speedup_median"] is None else f"{row['speedup_median']:.2f}x"
        mark = row_mark(row)
        line = f"batch {row['batch_size']}{mark}: {side('reference', r)}, {side('served', s)}, speedup {x}"
        o = row.get("onnx")
        if o is not None:
            ow = _onnx_withheld(row)
            ox = f"not computed ({ow})" if ow else _x(row.get("speedup_vs_onnx"))
            line += f"; {side(onnx_label, o)}, served vs it {ox}"
        lines.append(line)
    bad = len(rows) - quoted
    lines.append(f"{quoted} of {len(rows)} batch size(s) stable on both sides and plausible"
                 + ("" if not bad else "; * and ! rows are not figures to quote"))
    return lines


def compared_sides(speed: Mapping[str, Any]) -> str:
    """Both sides named: ``PyTorch eager FP32 (cpu, torch threads 2) vs served demo v1 (Triton
    2.51, python backend)``, and the ONNX model when it was timed."""
    r, s = speed["reference"], speed["served"]
    ref = f"{r['label']} ({r['device']}, {r['engine']} threads {r['threads'] if r.get('threads') is not None else '-'})"
    srv_bits = [b for b in (f"Triton {s['server_version']}" if s.get("server_version") else "Triton",
                            f"{s['backend']} backend" if s.get("backend") else None) if b]
    text = f"{ref} vs served {s.get('model')} v{s.get('version')} ({', '.join(srv_bits)})"
    o = speed.get("onnx")
    if o:
        where = "the reference's export" if o.get("origin") == "export" else Path(str(o["path"])).name
        text += f"; and {o['label']} ({where}, onnxruntime threads {o['threads'] if o.get('threads') is not None else 'default'})"
    return text


def budget_lines(speed: Mapping[str, Any]) -> list[str]:
    """What the time budget cut and how to ask for more; nothing when nothing was cut."""
    bud = speed.get("budget") or {}
    cut = bud.get("cut") or []
    if not cut:
        return []
    what = "; ".join(f"batch {c['batch_size']} {c['what']}" for c in cut)
    more = bud.get("full_estimate_s")
    ask = f"--thorough lifts the budget (timing the sizes timed here fully takes {more:.0f} s at least)" if more else \
        "--thorough lifts the budget"
    return [f"time budget ({bud.get('time_budget_s'):g} s for validate, {bud.get('phase_s', 0):.0f} s for this phase): "
            f"{what}; {ask}, or raise --time-budget"]


def speed_summary_lines(speed: Mapping[str, Any]) -> list[str]:
    """The console block: what was compared (both sides named), one line per batch size
    (:func:`speed_console_lines`, indented), what the budget cut, the phase's machine warnings."""
    lines = [f"{compared_sides(speed)}, concurrency 1:"]
    lines += [f"  {line}" for line in speed_console_lines(speed["rows"], (speed.get("onnx") or {}).get("label", "ONNX Runtime"))]
    lines += [f"  skipped batch {sk['batch_size']}: {sk['reason']}" for sk in speed.get("skipped_batch_sizes", [])
              if "budget" in sk["reason"]]
    lines += [f"  {line}" for line in budget_lines(speed)]
    lines += [f"  warning: reference speed: {w}" for w in speed.get("warnings") or []]
    return lines


def speed_markdown(speed: Mapping[str, Any]) -> list[str]:
    """The report section: what was compared, the table (a row the console withholds has
    "not computed" in its speedup cells and the same ``*``/``!`` mark), the accuracy kept."""
    ref, srv = speed["reference"], speed["served"]
    ref_name = ref["label"]
    onnx = speed.get("onnx")
    shapes = ", ".join(f"`{n}` {s}" for n, s in speed["input_shapes"].items())
    threads = ref.get("threads")
    lines = ["", f"## Speed: {ref_name} | served model", "",
             f"Compared: {compared_sides(speed)}.", "",
             f"Concurrency 1, per batch size: the served model's client-side latency per request ({srv['protocol']}, "
             f"request sent -> numpy response decoded) beside {ref_name}'s latency per forward call on the same batch "
             f"(numpy in -> numpy out, device copies included{', `torch.cuda.synchronize()`' if ref['device'].startswith('cuda') else ''}); "
             f"inferences/s = samples / wall time. Speedup = {ref_name} / served (> 1: the served model is faster). "
             f"Windows of up to {speed['iterations']} timed calls after {speed['warmup']} warm-up calls per batch size and "
             f"side, until three windows agree within {(speed.get('measurement') or {}).get('stability_percentage', '?')}% "
             f"(the last three merged; rows marked * did not settle, rows marked ! are implausible: a larger batch "
             f"took less time than a smaller one; neither has a speedup); "
             f"reference on {ref['device']}, {ref['engine']} threads {threads if threads is not None else '-'}; "
             f"the reference runs while no Triton request is in flight.",
             "",
             f"Inputs of one shape: {shapes} ({speed['samples_of_shape']} of {speed['samples_total']} samples have it"
             f"{'; the data has several shapes, the most common one is used' if speed['samples_of_shape'] < speed['samples_total'] else ''}).",
             ""]
    if onnx:
        lines += [f"{onnx['label']} is the same graph on ONNX Runtime's CPU provider in this process: served vs "
                  f"{onnx['label']} is the served model's own gain over it (Triton's transport included, so a lower "
                  f"bound), apart from what ONNX Runtime gains over {ref_name}.", ""]
    lines += _speed_table(speed)
    extra = budget_lines(speed) + [f"warning: {w}" for w in speed.get("warnings") or []]
    if extra:
        lines += [""] + [f"- {e}" for e in extra]
    lines += ["", _accuracy_kept_line(speed.get("accuracy_kept"), ref_name)]
    return lines


def _speed_table(speed: Mapping[str, Any]) -> list[str]:
    """The speed table (ONNX columns when the ONNX model was timed), a row per skipped size, and
    the notes on rows whose speedup is withheld."""
    ref_name, onnx = speed["reference"]["label"], speed.get("onnx")
    head = (f"| batch | {ref_name} median ms | {ref_name} p99 ms | {ref_name} infer/s | served median ms | served p99 ms | "
            "served infer/s | speedup (median) | speedup (p99) | throughput ratio |")
    sep = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    if onnx:
        head += f" {onnx['label']} median ms | served vs {onnx['label']} |"
        sep += "---:|---:|"
    lines = [head, sep]
    notes = []
    for row in speed["rows"]:
        why = withheld(row)
        lines.append(_speed_table_row(row, why, bool(onnx)))
        if why:
            notes.append(f"- batch {row['batch_size']}{row_mark(row)}: speedup not computed ({why})")
    for sk in speed.get("skipped_batch_sizes", []):
        lines.append(f"| {sk['batch_size']} | skipped: {sk['reason']} |" + " |" * (head.count("|") - 3))
    if notes:
        lines += [""] + notes
    return lines


def _speed_table_row(row: Mapping[str, Any], why: str | None, onnx: bool) -> str:
    """One size's row; decision: a withheld row (``why``) shows "not computed" in its speedup
    cells, and its ONNX speedup likewise when that one is withheld."""
    r, s = row["reference"], row["served"]
    ratios = ("not computed | not computed | not computed" if why else
              f"{_x(row['speedup_median'])} | {_x(row['speedup_p99'])} | {_x(row['throughput_ratio'])}")
    line = (f"| {row['batch_size']}{row_mark(row)} | {r['median_ms']:.2f} | {r['p99_ms']:.2f} | {_f(r['throughput'], '.1f')} | "
            f"{s['median_ms']:.2f} | {s['p99_ms']:.2f} | {_f(s['throughput'], '.1f')} | {ratios} |")
    if onnx:
        o = row.get("onnx")
        ow = _onnx_withheld(row)
        line += " - | - |" if o is None else \
            f" {o['median_ms']:.2f}{'*' if _unsettled(o) else ''} | {'not computed' if ow else _x(row.get('speedup_vs_onnx'))} |"
    return line


def _accuracy_kept_line(kept: Mapping[str, Any] | None, ref_name: str) -> str:
    """What accuracy the served model kept, per output; decision: top-1 agreement only for the
    label output, accuracy only when both sides have one, cosine always."""
    if not kept:
        return "Accuracy kept: not measured (the accuracy phase did not run)."
    parts = []
    for name, m in kept["outputs"].items():
        bits = []
        if m.get("top1_agreement") is not None and name == kept.get("label_output"):
            bits.append(f"top-1 agreement {_pct(m['top1_agreement'])}")
        if m.get("reference_accuracy") is not None and m.get("candidate_accuracy") is not None:
            bits.append(f"accuracy {_pct(m['reference_accuracy'])} -> {_pct(m['candidate_accuracy'])}")
        bits.append(f"cosine mean {_f(m.get('cosine_mean'), '.6f')} (min {_f(m.get('cosine_min'), '.6f')})")
        parts.append(f"`{name}` " + ", ".join(bits))
    return f"Accuracy kept ({kept['samples']} samples, served vs {ref_name}): " + "; ".join(parts) + "."


def plot_speed(ax: Any, speed: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Median (solid) and p99 (dashed) latency per batch size, reference vs served (and the ONNX
    model when timed), log scales. A row's speedup is annotated only where the console prints
    it (:func:`withheld`); an unsettled or implausible row's points are circled in red and
    labelled ``*`` / ``!`` instead. Returns what was drawn, JSON-ready (the report keeps it in the
    PNG's ``SpeedRows`` text chunk): one entry per row, ``batch_size``, ``speedup`` (the annotated
    text, or None), ``mark`` and ``withheld`` (the reason, or None)."""
    rows = speed["rows"]
    bs = [r["batch_size"] for r in rows]
    ref_name = speed["reference"]["label"]
    sides = [("reference", ref_name, "tab:orange"), ("served", "served model", "tab:blue")]
    if speed.get("onnx"):
        sides.append(("onnx", speed["onnx"]["label"], "tab:green"))
    for side, label, color in sides:
        pts = [(r["batch_size"], r[side]) for r in rows if r.get(side)]
        ax.plot([b for b, _ in pts], [t["median_ms"] for _, t in pts], "o-", color=color, label=f"{label} median")
        ax.plot([b for b, _ in pts], [t["p99_ms"] for _, t in pts], "s--", color=color, alpha=0.6, label=f"{label} p99")
    drawn: list[dict[str, Any]] = []
    for r in rows:
        why = withheld(r)
        if why is None:
            text = None
            if r["speedup_median"] is not None:
                text = f"{r['speedup_median']:.2f}x"
                ax.annotate(text, (r["batch_size"], r["served"]["median_ms"]), textcoords="offset points",
                            xytext=(4, -12), fontsize=8)
            drawn.append({"batch_size": r["batch_size"], "speedup": text, "mark": "", "withheld": None})
            continue
        mark = row_mark(r)
        ys = [r[n]["median_ms"] for n in ("reference", "served") if r.get(n)]
        ax.plot([r["batch_size"]] * len(ys), ys, "o", markersize=12, markerfacecolor="none", markeredgecolor="red",
                gid=f"flag:{r['batch_size']}:{mark}")
        ax.annotate(f"{mark} {'not settled' if '*' in mark else 'implausible'}",
                    (r["batch_size"], r["served"]["median_ms"]), textcoords="offset points", xytext=(4, -12),
                    fontsize=8, color="red")
        drawn.append({"batch_size": r["batch_size"], "speedup": None, "mark": mark, "withheld": why})
    if bs:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs)
        ax.set_xticklabels([str(b) for b in bs])
        ax.set_yscale("log")
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.set_title(f"{ref_name} vs served, concurrency 1 (speedup = {ref_name} / served; red: * not settled, "
                 f"! implausible, no speedup)", fontsize=8)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency per request (ms)")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return drawn


# --------------------------------------------------------------------------------------------
# Measuring


def resolve_reference_device(device: str, kind: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one is a
    :class:`UsageError` (exit 2). An ``.onnx`` reference (``kind == "onnx"``) runs on the CPU."""
    if device not in REFERENCE_DEVICES:
        raise OptionError("reference_device", f"{device!r}: one of {', '.join(REFERENCE_DEVICES)}")
    if kind == "onnx":
        if device == "cuda":
            raise OptionError("reference_device", "cuda: the reference is an ONNX file, timed with ONNX Runtime's CPU "
                                                  "provider; use {reference_device} cpu or a PyTorch reference")
        return "cpu"

    torch = import_torch()
    available = bool(torch.cuda.is_available())
    if device == "cuda" and not available:
        raise OptionError("reference_device", f"cuda: CUDA is not available to torch {torch.__version__} on this "
                                              f"machine; use {{reference_device}} cpu or auto")
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
                attempts: int = TIMING_ATTEMPTS, deadline: float = math.inf,
                on_window: Callable[[int], None] | None = None) -> tuple[np.ndarray, float, dict[str, Any]]:
    """:func:`time_calls` in windows of ``stability.requests`` calls until the last three agree
    (perf_analyzer's rule, :mod:`trtrepo.measure`): the merged latencies, their wall time, and the
    windows' record. A series that ends unstable after ``stability.max_trials`` windows is retried
    (``attempts`` series in all, after a short pause); the most stable series is kept and the
    record says whether it met the rule.

    ``deadline`` (``time.perf_counter()`` seconds): a window stops at it (after one call at
    least) and no window starts that the last one's duration says would end past it; the record
    then says ``cut``. No retry series starts after a cut or without time for its pause (a series
    that ran all its windows is then "not stable", as without a deadline). ``on_window`` gets the
    window count after each window."""

    for i in range(warmup):
        fn(batches[i % len(batches)])
    best: tuple[list[dict[str, Any]], list[np.ndarray]] | None = None
    cut = False
    attempt = 0
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            if time.perf_counter() + RETRY_PAUSE_S >= deadline:
                break  # no time for a retry: the series ran its windows, it is "not stable", not cut
            time.sleep(RETRY_PAUSE_S)  # let a transient load pass before the fresh series
        windows: list[dict[str, Any]] = []
        lats: list[np.ndarray] = []
        while True:
            if windows and time.perf_counter() + windows[-1]["duration_s"] > deadline:
                cut = True
                break
            lat, wall = time_calls(fn, batches, stability.requests, 0, sync, deadline=deadline)
            windows.append(window_summary(lat, len(lat) * batch_size, wall, stability.percentiles))
            lats.append(lat)
            if on_window is not None:
                on_window(len(windows))
            if len(lat) < stability.requests:
                cut = True
                break
            if len(windows) >= stability.max_trials or is_stable(windows, stability.pct, stability.latency_key):
                break
        stable = is_stable(windows, stability.pct, stability.latency_key)
        if best is None or _series_rank(windows, stability) > _series_rank(best[0], stability):
            best = (windows, lats)
        if stable or cut:
            break
    assert best is not None
    windows, lats = best
    lat, _, seconds = merged(windows, lats)
    stable = is_stable(windows, stability.pct, stability.latency_key)
    return lat, seconds, {"windows": len(windows), "stable": stable,
                          "spread_pct": spread(windows, stability.latency_key), "attempts": attempt,
                          "calls_per_window": int(stability.requests), "cut": bool(cut and not stable)}


def _series_rank(windows: Sequence[Mapping[str, Any]], stability: Any) -> tuple[bool, bool, float]:
    """Which series of windows to keep: a stable one, else one of three windows or more, else the
    smallest spread."""
    return (is_stable(windows, stability.pct, stability.latency_key), len(windows) >= 3,
            -_worst(spread(windows, stability.latency_key)))


def time_calls(fn: Callable[[dict[str, np.ndarray]], Any], batches: Sequence[dict[str, np.ndarray]], iterations: int,
               warmup: int, sync: Callable[[], None] | None = None,
               deadline: float = math.inf) -> tuple[np.ndarray, float]:
    """Call ``fn`` on ``batches`` cyclically: ``warmup`` times unmeasured, then ``iterations``
    times, each timed with ``perf_counter`` (``sync`` runs before the clock stops); calls stop at
    ``deadline`` (after the first). Returns the latencies (s) and the wall time of the measured loop."""
    for i in range(warmup):
        fn(batches[i % len(batches)])
    if sync is not None:
        sync()
    lat = np.empty(iterations)
    done = 0
    start = time.perf_counter()
    for i in range(iterations):
        t0 = time.perf_counter()
        if i and t0 >= deadline:
            break
        fn(batches[i % len(batches)])
        if sync is not None:
            sync()
        lat[i] = time.perf_counter() - t0
        done = i + 1
    return lat[:done], time.perf_counter() - start


class TimedReference:
    """The reference as a callable for timing: PyTorch on ``device`` with ``threads`` (set while
    it is timed), or ONNX Runtime on the CPU for an ``.onnx`` source (:meth:`for_onnx`: the FP32
    ONNX model timed beside the reference)."""

    def __init__(self, reference: str, io: Any, *, device: str, threads: int | None, weights: str | None = None) -> None:
        src = resolve_source(reference, weights)
        self.kind = src.kind
        self.device = device
        self.requested_threads = threads
        self.path: str | None = None
        self.origin = "reference"  # for_onnx: "onnx" (the deployed model given) or "export" (the reference's export)
        self._sync: Callable[[], None] | None = None
        if src.kind == "onnx":

            self.engine = "onnxruntime"
            sess = make_session(src.location, threads=threads)
            names = io.output_names
            in_names = {i.name for i in sess.get_inputs()}
            self.fn: Callable[[dict[str, np.ndarray]], Any] = \
                lambda feed: sess.run(names, {k: v for k, v in feed.items() if k in in_names})
            self.path = str(src.location)
            self.precision = "int8" if any(qdq_counts(src.location)) else "fp32"
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
            self.label = f"PyTorch eager {self.precision.upper()}"
            self.version = torch.__version__
            if device.startswith("cuda"):
                self._sync = torch.cuda.synchronize

    @classmethod
    def for_onnx(cls, path: str | Path, io: Any, *, threads: int | None, origin: str = "onnx") -> TimedReference:
        """The deployed (``origin="onnx"``) or exported (``"export"``) ONNX model on ONNX Runtime's
        CPU provider, labelled by its precision (``ONNX Runtime FP32``; a Q/DQ model is ``ONNX
        Runtime INT8``)."""
        timed = cls(str(path), io, device="cpu", threads=threads)
        timed.label = f"ONNX Runtime {timed.precision.upper()}"
        timed.origin = origin
        return timed

    @contextlib.contextmanager
    def _threads(self) -> Iterator[int | None]:
        """torch's thread count set to the requested one while timing (restored after); yields
        the count in effect."""
        if self.engine != "torch":
            yield self.requested_threads
            return
        import torch

        before = torch.get_num_threads()
        if self.requested_threads is not None:
            torch.set_num_threads(self.requested_threads)
        try:
            yield torch.get_num_threads()
        finally:
            torch.set_num_threads(before)

    def warm(self, batches: Sequence[dict[str, np.ndarray]], calls: int, until: float = math.inf) -> float:
        """``calls`` unmeasured warm-up calls (at least one; none started after ``until``), each
        timed: the median of those after the first (the first pays for allocation), in seconds."""
        times: list[float] = []
        with self._threads():
            for i in range(max(1, calls)):
                if times and time.perf_counter() >= until:
                    break
                t0 = time.perf_counter()
                self.fn(batches[i % len(batches)])
                if self._sync is not None:
                    self._sync()
                times.append(time.perf_counter() - t0)
        return float(np.median(times[1:] if len(times) > 1 else times))

    def measure(self, batches: Sequence[dict[str, np.ndarray]], stability: Any, warmup: int,
                batch_size: int, *, deadline: float = math.inf, attempts: int = TIMING_ATTEMPTS,
                on_window: Callable[[int], None] | None = None) -> tuple[np.ndarray, float, int | None, dict[str, Any]]:
        """Latencies and wall time of the stable windows (:func:`time_stable`), the thread count in
        effect (``torch.get_num_threads()``) and the windows' record."""
        with self._threads() as used:
            lat, wall, rec = time_stable(self.fn, batches, stability, warmup, batch_size, self._sync, attempts=attempts,
                                         deadline=deadline, on_window=on_window)
        return lat, wall, used, rec


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _side(lat: np.ndarray, wall: float, batch_size: int, record: Mapping[str, Any]) -> dict[str, Any]:
    out = timing_summary(lat, batch_size, wall)
    out["stability"] = dict(record)
    return out


def compare_speed(target: Any, reference: TimedReference, batches: Sequence[Mapping[str, np.ndarray]], io: Any,
                  options: SpeedOptions, *, max_batch_size: int, accuracy: Mapping[str, Any] | None = None,
                  server: Mapping[str, Any] | None = None, onnx: TimedReference | None = None,
                  run: SpeedRun | None = None) -> dict[str, Any]:
    """Time the served model (``target``: a prepared :class:`~trtrepo.validate.TritonTarget`) and
    the reference (and ``onnx``, the FP32 ONNX model, when given) on batches of one input shape
    taken from ``batches`` (the request batches of the accuracy data), batch size by batch size,
    until ``run.deadline`` (the module docstring says how it is shared). Returns
    ``speed_vs_reference``.

    The machine warnings of :func:`trtrepo.measure.machine_warnings` cover the phase; the load
    average before it is the lower of the phase's and ``run.load_before`` (validate's start): the
    latency levels just before leave a load of this run's own, which is not other work."""

    sizes = list(options.batch_sizes)
    skipped = [{"batch_size": b, "reason": f"larger than the server's max_batch_size {max_batch_size}"}
               for b in sizes if b > max_batch_size]
    sizes = [b for b in sizes if b <= max_batch_size]
    shapes, pool, of_shape, total = fixed_shape_pool(batches, limit=max(options.batch_sizes) * options.max_batches)
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    cpu0 = cpu_sample()
    phase_start = time.perf_counter()
    run = run or SpeedRun()
    phase = _SpeedPhase(target, reference, onnx, options, run, pool, io)
    phase.skipped = skipped
    for k, b in enumerate(sizes):
        phase.time_size(b, len(sizes) - k)
    flags = implausible_rows(phase.rows)
    for row in phase.rows:
        row["implausible"] = flags.get(row["batch_size"])
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    usage = _usage_since(cpu0, run.load_before)
    spent = time.perf_counter() - phase_start
    cut = phase.cut
    out = {
        "compared": COMPARED,
        "sides": "",  # both sides named, below
        **phase.side_records(server),
        "iterations": options.iterations,
        "measurement": options.stability.to_dict(),
        "warmup": options.warmup,
        "input_shapes": shapes,
        "samples_of_shape": of_shape,
        "samples_total": total,
        "distinct_batches": options.max_batches,
        "order": "per batch size: served model, then reference, then the ONNX model when timed (no Triton request in "
                 "flight while the others run)",
        "cpu_count": os.cpu_count(),
        "load_average": [None if load0 is None else load0[0], None if load1 is None else load1[0]],
        "machine": usage,
        "warnings": machine_warnings(usage, server_local=False),
        "budget": {"time_budget_s": run.budget_s,
                   "phase_s": None if not phase.bounded else max(0.0, phase.deadline - phase_start),
                   "spent_s": spent, "cut": cut, "full_estimate_s": phase.full_s if cut else None},
        "rows": phase.rows,
        "skipped_batch_sizes": phase.skipped,
        "accuracy_kept": accuracy_kept(accuracy),
    }
    out["sides"] = compared_sides(out)
    return out


def _usage_since(cpu0: Any, load_before: float | None) -> dict[str, Any]:
    """The machine's usage over the phase; decision: the load before it is the lower of the
    phase's and ``load_before`` (validate's start), since the latency levels leave a load of
    this run's own."""
    usage = machine_usage(cpu0, cpu_sample(), available_cores())
    if load_before is not None and usage.get("load_average_before") is not None:
        usage["load_average_before"] = min(float(usage["load_average_before"]), float(load_before))
    return usage


class _SpeedPhase:
    """The speed phase's state across batch sizes: the sides, the deadline shared among the
    sizes, and what was measured, cut and skipped so far. ``full_s``: what timing every size
    fully (three windows of ``iterations`` calls per side, at the medians) takes."""

    def __init__(self, target: Any, reference: TimedReference, onnx: TimedReference | None, options: SpeedOptions,
                 run: SpeedRun, pool: Any, io: Any) -> None:
        self.target, self.reference, self.onnx, self.options, self.run = target, reference, onnx, options, run
        self.pool, self.io = pool, io
        self.deadline = run.deadline
        self.say: Callable[[str], None] = run.note or (lambda _msg: None)
        self.bounded = math.isfinite(self.deadline)
        self.attempts = TIMING_ATTEMPTS  # under a deadline, a retry series only starts with time left for it (time_stable)
        self.rows: list[dict[str, Any]] = []
        self.cut: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.threads_used: int | None = reference.requested_threads
        self.onnx_threads: int | None = None if onnx is None else onnx.requested_threads
        self.full_s = 0.0
        self.last_round: tuple[int, float] | None = None  # (batch size, seconds of one call of every side) of the last size

    def time_size(self, b: int, sizes_left: int) -> None:
        """Time batch size ``b`` on every side within its share of the time left (the time left
        over the ``sizes_left`` sizes still to time), or record it as not timed."""
        now = time.perf_counter()
        left = self.deadline - now
        why = self._why_not_timed(b, left)
        if why is not None:
            self.skipped.append({"batch_size": b, "reason": f"not timed: {why} (--thorough times it)"})
            self.cut.append({"batch_size": b, "side": None, "what": "not timed"})
            return
        size_deadline = now + left / sizes_left if self.bounded else math.inf
        feeds = speed_batches(self.pool, b, self.options.max_batches)
        payloads = [Payload(f, expected_shapes(self.io, b)) for f in feeds]
        self.say(f"batch {b}" + (f", {left:.0f} s left of the time budget" if self.bounded else ""))
        t_s, t_r, t_o = self._warm(now, size_deadline, feeds, payloads)
        round_s = t_s + t_r + t_o
        self.last_round = (b, round_s)
        n = calls_per_window(size_deadline - time.perf_counter(), round_s, self.options.iterations)
        tick = self._ticker(b)
        served = self._time_served(b, payloads, n, size_deadline, (t_s, round_s))
        ref, onnx_side = self._time_references(b, feeds, n, (size_deadline, t_r, t_o), tick)
        row = speed_row(b, ref, served, onnx_side)
        self.rows.append(row)
        self.full_s += 3 * self.options.iterations * sum(t["median_ms"] for t in (ref, served, onnx_side) if t) / 1e3
        self._note_unsettled(b, n, {"served": served, "reference": ref, "onnx": onnx_side})
        log.info("batch %d: %s median %.2f ms, served median %.2f ms (%.2fx)", b, self.reference.label,
                 ref["median_ms"], served["median_ms"], row["speedup_median"] or float("nan"))
        if self.run.progress is not None:
            self.run.progress(1)

    def _why_not_timed(self, b: int, left: float) -> str | None:
        """Decision: under a deadline, a size is not timed once the budget is spent or when one
        call of every side (the last size's, grown with the batch) would not fit in what is left."""
        if not self.bounded:
            return None
        guess = None if self.last_round is None else self.last_round[1] * b / self.last_round[0]
        if left <= 0:
            return "the time budget was spent"
        if guess is not None and guess > left:
            return f"one call of each side would take about {guess:.1f} s, {left:.1f} s of the time budget are left"
        return None

    def _warm(self, now: float, size_deadline: float, feeds: list[Any], payloads: list[Any]) -> tuple[float, float, float]:
        """Warm-up round (each side timed), served first: no Triton request is in flight while the
        reference runs. Under a deadline the warm-up calls stop after a quarter of the size's
        share. Returns seconds per call (served, reference, ONNX or 0)."""
        warm_n = max(1, self.options.warmup)
        warm_until = now + (size_deadline - now) / 4 if self.bounded else math.inf
        t0 = time.perf_counter()
        self.target.load(payloads, 1, requests=warm_n)
        t_s = (time.perf_counter() - t0) / warm_n
        t_r = self.reference.warm(feeds, warm_n, until=warm_until)
        t_o = self.onnx.warm(feeds, warm_n, until=warm_until) if self.onnx is not None else 0.0
        return t_s, t_r, t_o

    def _ticker(self, b: int) -> Callable[[str, int], None]:
        """A window callback that says progress at most every PROGRESS_EVERY_S."""
        last = [time.perf_counter()]

        def tick(what: str, windows: int) -> None:
            if time.perf_counter() - last[0] >= PROGRESS_EVERY_S:
                last[0] = time.perf_counter()
                rest = f", {max(0.0, self.deadline - last[0]):.0f} s left of the time budget" if self.bounded else ""
                self.say(f"batch {b}, {what} window {windows}{rest}")

        return tick

    def _time_served(self, b: int, payloads: list[Any], n: int, size_deadline: float,
                     warm: tuple[float, float]) -> dict[str, Any]:
        """Decision: the served side's windows cannot be cut mid-way (trtrepo.validate's load
        loop), so under a deadline its share of the size's time (its part of the warm-up round
        ``warm`` = (served call, whole round)) bounds how many windows it may take (at least 3)."""
        t_s, round_s = warm
        opts = self.options
        served_trials = opts.max_trials
        if self.bounded and t_s > 0:
            share = (size_deadline - time.perf_counter()) * t_s / round_s
            served_trials = int(min(opts.max_trials, max(3, share // (n * t_s))))
        m = self.target.measure(payloads, Stability(requests=n, pct=opts.stability_pct, max_trials=served_trials),
                                concurrency=1)
        s_lat, _, s_wall = m.merged()
        served = timing_summary(s_lat, b, s_wall)
        served["stability"] = {"windows": len(m.windows), "stable": m.stable, "spread_pct": m.summary()["spread_pct"],
                               "calls_per_window": n, "cut": bool(not m.stable and served_trials < opts.max_trials)}
        return served

    def _time_references(self, b: int, feeds: list[Any], n: int, share: tuple[float, float, float],
                         tick: Callable[[str, int], None]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Decision: the reference and the ONNX model split what is left of the size's share
        (``share`` = (size deadline, reference call, ONNX call)) in proportion to their warm-up
        calls; the ONNX model runs to the size's deadline."""
        size_deadline, t_r, t_o = share
        stab = Stability(requests=n, pct=self.options.stability_pct, max_trials=self.options.max_trials)
        now = time.perf_counter()
        ref_deadline = now + (size_deadline - now) * t_r / (t_r + t_o) if self.bounded and t_r + t_o > 0 else size_deadline
        reference = self.reference
        lat, wall, self.threads_used, record = reference.measure(feeds, stab, 0, b, deadline=ref_deadline,
                                                                 attempts=self.attempts,
                                                                 on_window=lambda w: tick(reference.label, w))
        ref = _side(lat, wall, b, record)
        onnx = self.onnx
        if onnx is None:
            return ref, None
        lat, wall, self.onnx_threads, record = onnx.measure(feeds, stab, 0, b, deadline=size_deadline,
                                                            attempts=self.attempts,
                                                            on_window=lambda w: tick(onnx.label, w))
        return ref, _side(lat, wall, b, record)

    def _note_unsettled(self, b: int, n: int, sides: Mapping[str, dict[str, Any] | None]) -> None:
        """Each side whose timing was cut before it settled goes into ``cut``."""
        for side, t in sides.items():
            if t is not None and t["stability"].get("cut"):
                self.cut.append({"batch_size": b, "side": side,
                                 "what": f"{SIDE_NAMES[side]} not settled ({t['stability']['windows']} window(s) of "
                                         f"{n} calls)"})

    def side_records(self, server: Mapping[str, Any] | None) -> dict[str, Any]:
        """The report's ``reference``, ``served`` and ``onnx`` entries (threads as used)."""
        reference, onnx = self.reference, self.onnx
        srv = dict(server or {})
        return {
            "reference": {"label": reference.label, "engine": reference.engine, "version": reference.version,
                          "precision": reference.precision, "device": reference.device, "threads": self.threads_used,
                          "threads_requested": reference.requested_threads},
            "served": {"model": srv.get("model"), "version": srv.get("version"), "protocol": srv.get("protocol"),
                       "concurrency": 1, "shared_memory": "none", "backend": srv.get("backend"),
                       "server_version": srv.get("server_version")},
            "onnx": None if onnx is None else {"label": onnx.label, "path": onnx.path, "origin": onnx.origin,
                                               "precision": onnx.precision, "engine": "onnxruntime",
                                               "version": onnx.version, "threads": self.onnx_threads},
        }
