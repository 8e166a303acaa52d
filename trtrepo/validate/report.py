""":class:`ValidationReport`: ``validate.json``, ``validate.md`` and ``latency.png``."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..evaluate import ExpectedDrop
from ..fsutil import atomic_write_bytes, atomic_write_text, report_json, write_report
from ..pngplot import png_figure
from .contract import ThresholdResult
from .detection import detection_console_lines, detection_markdown, output_detection_line
from .options import REPORT_SCHEMA
from .speed import plot_speed, speed_markdown, speed_summary_lines

log = logging.getLogger(__name__)


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
    fleet: dict[str, Any] | None = None  # several servers (--url A,B,...): their agreement
    detection: dict[str, Any] | None = None  # a detector ensemble: its detections vs the reference's (issue 43)

    @property
    def passed(self) -> bool:
        return bool(self.contract.get("ok")) and all(t.passed for t in self.thresholds)

    @property
    def failures(self) -> list[str]:
        names = [] if self.contract.get("ok") else ["contract"]
        return names + [t.name for t in self.thresholds if not t.passed]

    def to_dict(self) -> dict[str, Any]:
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
            "fleet": self.fleet,
            "detection": self.detection,
            "thresholds": [t.to_dict() for t in self.thresholds],
            "files": self.files,
        }

    def summary_lines(self) -> list[str]:
        """What ``trtrepo validate`` prints, indented as printed: the contract, the servers'
        agreement (a fleet), accuracy per output, each latency level (and each server of it), how
        many levels were stable, the reference-vs-served speed rows, then each threshold."""
        s = self.server
        lines = [f"model {s['model']} v{s['version']} at {', '.join(s.get('servers') or [s['url']])} "
                 f"({s['protocol']}): contract ok"]
        if self.fleet:
            a = self.fleet["agreement"]
            lines += [f"  {r['server']} vs {a['reference_server']}: {r['output']} max abs diff {r['max_abs_diff']:.3g}"
                      f"{' (identical)' if r['identical'] else ''}" for r in a["outputs"]]
        if self.accuracy:
            lines += [f"  {line}" for line in accuracy_console_lines(self.accuracy)]
        if self.detection:
            lines += [f"  {line}" for line in detection_console_lines(self.detection)]
        if self.latency:
            lines += self._latency_lines(self.latency)
        sp = self.speed_vs_reference
        if sp:
            lines += [f"  {line}" for line in speed_summary_lines(sp)]
        lines += [f"  {t.name}: {t.value:.4g} (limit {t.limit:g}) {'ok' if t.passed else 'FAILED'}" for t in self.thresholds]
        return lines

    def _latency_lines(self, latency: Mapping[str, Any]) -> list[str]:
        """The console's latency block: each level, how many were stable, the warnings. Decision:
        an image endpoint's latency is said to be end to end (decode, preprocessing, model, and
        NMS for a detector)."""
        levels = latency["levels"]
        lines = []
        if self.detection or self.server.get("image_input"):
            lines.append("  latency end to end (one encoded image per request: decode + preprocessing + model"
                         + (" + NMS):" if self.detection else "):"))
        for lv in levels:
            lines += _level_lines(lv)
        stable = sum(1 for lv in levels if level_verdict(lv).stable)
        lines.append(f"  latency: {stable} of {len(levels)} level(s) stable"
                     + ("" if stable == len(levels) else " (the others are not figures to quote: rerun on a quieter "
                                                         "machine or raise --max-trials)"))
        lines += [f"  warning: {w}" for w in latency.get("warnings", [])]
        return lines

    def failure_detail(self) -> str:
        """The failed thresholds, one clause each (empty when none failed)."""
        return "; ".join(f"{t.name} = {t.value:.4g}, limit {t.limit:g}" for t in self.thresholds if not t.passed)

    def to_json(self) -> str:
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
            lines += accuracy_markdown(self.accuracy)
        if self.detection:
            lines += detection_markdown(self.detection)
        if self.fleet:
            lines += fleet_markdown(self.fleet)
        if self.latency:
            lines += latency_markdown(self.latency)
        if self.speed_vs_reference:
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

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = {"json": folder / "validate.json", "markdown": folder / "validate.md"}
        if self.accuracy and self.accuracy.get("per_sample"):
            paths["samples"] = folder / "samples.csv"
        if (self.latency and self.latency.get("levels")) or (self.speed_vs_reference and self.speed_vs_reference.get("rows")):
            paths["plot"] = folder / "latency.png"
        self.files = {k: str(v) for k, v in paths.items()}
        if "plot" in paths:
            write_plot(self, paths["plot"])
        if "samples" in paths:
            write_samples_csv(self.accuracy["per_sample"], paths["samples"])  # type: ignore[index]
        write_report(folder, "validate", self.to_json(), self.to_markdown())
        return paths


def accuracy_markdown(a: Mapping[str, Any]) -> list[str]:
    """The accuracy section: one row per output, the worst samples of each, where the per-sample
    rows are."""
    lines = ["", f"## Accuracy ({a['samples']} samples, {a['requests']} requests of up to {a['batch_size']})", "",
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
                  "| sample | file | cosine | max abs err | reference top-1 | served top-1 | label |",
                  "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['sample']} | {r.get('file', '-')} | {r['cosine']:.6f} | {r['max_abs_error']:.4g} | "
                         f"{r.get('reference_top1', '-')} | {r.get('served_top1', '-')} | {r.get('label', '-')} |")
    if a.get("per_sample"):
        lines += ["", f"Per-sample results ({len(a['per_sample'])} rows: file, cosine per output, top-1 of both "
                  f"sides): `per_sample` in validate.json and samples.csv."]
    return lines


def accuracy_console_lines(accuracy: Mapping[str, Any], worst: int = 3) -> list[str]:
    """Per output: label accuracy (reference -> served) when the data has labels, top-1
    agreement, the expected top-1 drop without labels, cosine and the largest error; then the ``worst`` samples of each output by cosine,
    named by file when the data has files."""
    lines = []
    for name, m in accuracy["outputs"].items():
        bits = []
        if m.get("reference_accuracy") is not None and m.get("candidate_accuracy") is not None:
            bits.append(f"label accuracy {100 * m['reference_accuracy']:.2f}% (reference) -> "
                        f"{100 * m['candidate_accuracy']:.2f}% (served)")
        if m.get("top1_agreement") is not None:
            bits.append(f"top-1 agreement {100 * m['top1_agreement']:.2f}%")
        if m.get("candidate_accuracy") is None and m.get("expected_drop"):
            bits.append(ExpectedDrop.from_dict(m["expected_drop"]).describe())
        bits.append(f"cosine {m['cosine_mean']:.6f}")
        bits.append(f"max abs err {m['max_abs_error']:.3g}")
        lines.append(f"{name}: " + ", ".join(bits))
        boxes = output_detection_line(name, m)
        if boxes:
            lines.append(boxes)
    for name, rows in (accuracy.get("worst_samples") or {}).items():
        if not rows or worst <= 0:
            continue
        shown = []
        for r in rows[:worst]:
            who = r.get("file") or f"sample {r['sample']}"
            top = ""
            if r.get("reference_top1") is not None:
                top = f", top-1 {r['reference_top1']} -> {r['served_top1']}"
                if r.get("label") is not None:
                    top += f" (label {r['label']})"
            shown.append(f"{who} (cosine {r['cosine']:.4f}{top})")
        lines.append(f"{name} worst: " + "; ".join(shown))
    return lines


def level_overhead(client_mean_ms: float, client_requests: int,
                   server: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """The client's overhead of a level (client mean - the server's mean request time) and, where
    it is not computed, why: only from figures of the same requests (equal counts; the windows are
    cut where the server's count stands, :mod:`trtrepo.validate.load`), and never negative (a
    client latency holds the server's request time: a negative difference means the two figures
    describe different requests, a bug; it is reported as such, not printed as a number)."""
    requests, server_ms = int(server.get("request_count") or 0), server.get("request_ms")
    if server_ms is None or requests == 0:
        return None, "the server booked no request in these windows"
    if requests != client_requests:
        return None, f"intervals differ: client {client_requests} requests, server {requests}"
    overhead = float(client_mean_ms) - float(server_ms)
    if overhead < 0:
        return None, (f"client mean {client_mean_ms:.2f} ms below the server's {server_ms:.2f} ms for the same "
                      f"{requests} requests: the figures disagree")
    return overhead, None


@dataclass(frozen=True)
class LevelVerdict:
    """What every report says about one latency level, decided once (:func:`level_verdict`) and
    asked by each: the console (:meth:`ValidationReport.summary_lines`), validate.md
    (:func:`latency_markdown`), the CSV (:func:`latency_csv`) and latency.png (:func:`write_plot`).
    A level's measured figures are shown everywhere, marked: ``*`` (and a hollow marker in the
    plot) when its windows never agreed, so they are not figures to quote; a flag when the run
    warned about the machine during it. The overhead is withheld everywhere where it was not
    computed (:func:`level_overhead`), with the reason."""

    stable: bool
    windows: int
    spread_pct: float | None
    warnings: tuple[str, ...]
    overhead_ms: float | None
    overhead_note: str | None

    @property
    def marker(self) -> str:
        return "" if self.stable else "*"

    @property
    def quotable(self) -> bool:
        return self.stable and not self.warnings

    def flags(self) -> list[str]:
        """Short reasons, the same words on every surface."""
        out = []
        if not self.stable:
            out.append(f"not stable after {self.windows} windows" + ("" if self.spread_pct is None else
                                                                     f" (±{self.spread_pct:.1f}%)"))
        if self.warnings:
            out.append(f"{len(self.warnings)} machine warning{'s' if len(self.warnings) > 1 else ''}")
        if self.overhead_ms is None:
            out.append("overhead not computed" + (f": {self.overhead_note}" if self.overhead_note else ""))
        return out


def level_verdict(level: Mapping[str, Any]) -> LevelVerdict:
    """The one decision on how a latency level is shown (:class:`LevelVerdict`), from its row in
    validate.json."""
    sp = (level.get("spread_pct") or {}).get("throughput_pct")
    return LevelVerdict(stable=bool(level.get("stable", True)), windows=len(level.get("windows") or []),
                        spread_pct=None if sp is None else float(sp), warnings=tuple(level.get("warnings") or ()),
                        overhead_ms=level.get("overhead_ms"), overhead_note=level.get("overhead_note"))


def _level_lines(lv: Mapping[str, Any]) -> list[str]:
    """One latency level on the console: the totals, then each server of a fleet."""
    c = lv["client_ms"]
    v = level_verdict(lv)
    ov = (f"{v.overhead_ms:.2f} ms" if v.overhead_ms is not None
          else "not computed" + (f" ({v.overhead_note})" if v.overhead_note else ""))
    sp = "" if v.spread_pct is None else f" (±{v.spread_pct:.1f}%)"
    steady = f"stable over {v.windows} windows{sp}" if v.stable else f"* NOT STABLE after {v.windows} windows{sp}"
    if v.warnings:
        steady += ", machine warning below"
    total = f"{len(lv['servers'])} servers together: " if lv.get("servers") else ""
    lines = [f"  {level_label(lv)}{v.marker}: {total}{lv['throughput']:.1f} infer/s, p50 {c['p50']:.2f} ms, "
             f"p99 {c['p99']:.2f} ms, client overhead {ov}, {steady}"]
    lines += [f"    {sv['url']}: {sv['throughput']:.1f} infer/s, p50 {sv['client_ms']['p50']:.2f} ms, "
              f"p99 {sv['client_ms']['p99']:.2f} ms" for sv in lv.get("servers", [])]
    return lines


def level_label(level: Mapping[str, Any]) -> str:
    """``c=4`` for a concurrency level, ``20/s`` for a request rate."""
    return f"{level['request_rate']:g}/s" if level.get("request_rate") is not None else f"c={level['concurrency']}"


def latency_markdown(lat: dict[str, Any]) -> list[str]:
    """The latency section: how it was measured, one row per level, the warnings."""
    m = lat.get("measurement") or {}
    how = (f"windows of {m['requests_per_window']} requests" if m.get("requests_per_window")
           else f"{m.get('measurement_interval_s', 0):g} s windows")
    rate_mode = lat.get("mode") == "request_rate"
    pcts = [f"p{p}" for p in m.get("percentiles", [50, 90, 95, 99])]
    lines = ["", f"## Latency and throughput (batch {lat['batch_size']}, shared memory {lat['shared_memory']}"
             + (f", open loop: {lat.get('distribution')} request rate" if rate_mode else "") + ")", "",
             f"Each level: {lat['warmup']} warm-up requests, then {how} under continuous load until "
             f"{m.get('stable_windows', 3)} agree within {m.get('stability_percentage', 0):g}% on throughput and "
             f"{m.get('latency_compared', 'mean')} latency (at most {m.get('max_trials', '?')} windows); the figures are "
             f"those windows merged. Client latency in ms; server columns are Triton's statistics for the same "
             f"requests (the windows end where the server's count stands: requests and server requests are equal; mean "
             f"ms per request); overhead = client mean - server request time, not computed where the two differ. "
             f"`*`: the windows never agreed, not figures to quote; flags: what the console says of the level.", "",
             f"| {'request rate' if rate_mode else 'concurrency'} | requests | server requests | infer/s | "
             + " | ".join(pcts) + " | mean | windows | spread infer/s | stable | server request | queue | "
             "compute input | compute infer | compute output | avg batch | overhead | flags |",
             "|" + "---|" * (16 + len(pcts))]
    lines += [_latency_row(lv, pcts, rate_mode) for lv in lat["levels"]]
    lines += _per_server_markdown(lat["levels"], pcts, rate_mode)
    cmp_ = lat.get("shared_memory_comparison")
    if cmp_:
        lines += ["", f"Without shared memory, {cmp_['level']}: {cmp_['without']:.1f} infer/s "
                      f"(with: {cmp_['with_shared_memory']:.1f})."]
    if lat.get("warnings"):
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in lat["warnings"]]
    return lines


def _latency_row(lv: Mapping[str, Any], pcts: list[str], rate_mode: bool) -> str:
    """One level's row of the latency table (its verdict's marker, stability and flags)."""
    c, sv = lv["client_ms"], lv["server"]
    v = level_verdict(lv)
    avg = "-" if sv["avg_batch"] is None else f"{sv['avg_batch']:.2f}"
    level = (f"{lv['request_rate']:g}/s" if rate_mode else str(lv["concurrency"])) + v.marker
    return (f"| {level} | {lv['requests']} | {sv.get('request_count', '-')} | {lv['throughput']:.1f} | "
            + " | ".join(f"{c[p]:.2f}" if p in c else "-" for p in pcts)
            + f" | {c['mean']:.2f} | {v.windows} | {_ms(v.spread_pct)}% | "
            f"{'yes' if v.stable else '**no**'} | {_ms(sv['request_ms'])} | {_ms(sv['queue_ms'])} | "
            f"{_ms(sv['compute_input_ms'])} | {_ms(sv['compute_infer_ms'])} | {_ms(sv['compute_output_ms'])} | "
            f"{avg} | {_ms(v.overhead_ms)} | {'; '.join(v.flags()) or '-'} |")


def _per_server_markdown(levels: list[Mapping[str, Any]], pcts: list[str], rate_mode: bool) -> list[str]:
    """A fleet's table of each server's figures per level (nothing without a fleet)."""
    per_server = [(lv, sv) for lv in levels for sv in lv.get("servers", [])]
    if not per_server:
        return []
    lines = ["", "Per server (each level ran on every server at once, each with the level's concurrency or rate "
             "of its own; the rows above are the totals: throughputs added, latencies of all servers together):",
             "", f"| {'request rate' if rate_mode else 'concurrency'} | server | requests | infer/s | "
             + " | ".join(pcts) + " | stable | server request |", "|" + "---|" * (6 + len(pcts))]
    for lv, sv in per_server:
        level = f"{lv['request_rate']:g}/s" if rate_mode else str(lv["concurrency"])
        c = sv["client_ms"]
        lines.append(f"| {level} | {sv['url']} | {sv['requests']} | {sv['throughput']:.1f} | "
                     + " | ".join(f"{c[p]:.2f}" if p in c else "-" for p in pcts)
                     + f" | {'yes' if level_verdict(sv).stable else '**no**'} | {_ms(sv['server']['request_ms'])} |")
    return lines


def fleet_markdown(fleet: dict[str, Any]) -> list[str]:
    """Several servers: the outputs of each against the first server's, for the same requests."""
    a = fleet["agreement"]
    lines = ["", f"## Servers ({len(fleet['servers'])}: {', '.join(fleet['servers'])})", "",
             f"Every request ({a['requests']}) went to every server; largest absolute difference from "
             f"{a['reference_server']}'s outputs (limit {a['limit']:g}): "
             f"{'identical' if a['identical'] else 'agree within the limit' if a['agree'] else '**they disagree**'}.", "",
             "| server | output | max abs diff | identical |", "|---|---|---|---|"]
    lines += [f"| {r['server']} | {r['output']} | {r['max_abs_diff']:.4g} | {'yes' if r['identical'] else 'no'} |"
              for r in a["outputs"]]
    return lines


# perf_analyzer's -f CSV header (its report writer), times in microseconds
PERF_ANALYZER_COLUMNS = ("Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
                         "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
                         "p50 latency", "p90 latency", "p95 latency", "p99 latency")
VERDICT_COLUMNS = ("Stable", "Flags")  # after perf_analyzer's: the level's verdict (level_verdict)


def latency_csv(latency: dict[str, Any]) -> str:
    """The latency table in perf_analyzer's CSV layout: one row per concurrency level. Client Send
    and Client Recv are empty (validate does not split the client's time); Network+Server
    Send/Recv is the client mean minus the server's request time, empty where it was not computed.
    Two columns after perf_analyzer's say what the console says of the level
    (:func:`level_verdict`): Stable (yes/no) and Flags."""

    def us(ms: float | None) -> str:
        return "" if ms is None else str(int(round(ms * 1000)))

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    rate_mode = latency.get("mode") == "request_rate"
    head = ("Request Rate",) + PERF_ANALYZER_COLUMNS[1:] if rate_mode else PERF_ANALYZER_COLUMNS
    w.writerow(head + VERDICT_COLUMNS)
    for lv in latency["levels"]:
        c, sv = lv["client_ms"], lv["server"]
        v = level_verdict(lv)
        w.writerow([f"{lv['request_rate']:g}" if rate_mode else lv["concurrency"], f"{lv['throughput']:.2f}", "",
                    us(v.overhead_ms), us(sv["queue_ms"]),
                    us(sv["compute_input_ms"]), us(sv["compute_infer_ms"]), us(sv["compute_output_ms"]), "",
                    us(c.get("p50")), us(c.get("p90")), us(c.get("p95")), us(c.get("p99")),
                    "yes" if v.stable else "no", "; ".join(v.flags())])
    return buf.getvalue()


def write_latency_csv(latency: dict[str, Any], path: str | Path) -> Path:
    return atomic_write_text(path, latency_csv(latency))


def write_samples_csv(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """``samples.csv``: one row per sample (position, file, label, top-1 of both sides and their
    agreement, cosine per output), written atomically."""

    outputs = list(rows[0].get("cosine", {})) if rows else []
    head = ["sample", "file", "label", "reference_top1", "served_top1", "top1_agree"] + [f"cosine[{o}]" for o in outputs]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for r in rows:
        w.writerow([r["sample"], r.get("file", ""), r.get("label", ""), r.get("reference_top1", ""),
                    r.get("served_top1", ""), "" if "top1_agree" not in r else int(r["top1_agree"])]
                   + [f"{r['cosine'][o]:.6f}" if o in r.get("cosine", {}) else "" for o in outputs])
    atomic_write_bytes(path, buf.getvalue().encode())
    return Path(path)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def write_plot(report: ValidationReport, path: str | Path) -> Path:
    """PNG (Agg), one panel per measurement that ran: client p50/p99 latency against throughput,
    one point per concurrency level; and, with ``speed_vs_reference``, latency per batch size of
    the reference beside the served model (:func:`trtrepo.validate.speed.plot_speed`). The PNG's
    ``Description`` text chunk names the panels. Levels are shown as :func:`level_verdict` says:
    an unstable level's points are hollow and its label ends in ``*``, a level with machine
    warnings is labelled so; the ``Levels`` text chunk holds what was plotted, one JSON object per
    level (label, throughput, p50, p99, server request ms, stable, marker, flags), so the plot
    can be read back."""
    levels = (report.latency or {}).get("levels", [])
    speed = report.speed_vs_reference if (report.speed_vs_reference or {}).get("rows") else None
    panels = (["latency vs throughput"] if levels else []) + (["latency per batch size: reference vs served"] if speed else [])
    with png_figure(path, nrows=1, ncols=max(1, len(panels)), figsize=(7 * max(1, len(panels)), 4.5), dpi=100,
                    squeeze=False) as (_fig, axes, meta):
        s = report.server
        ax_iter = iter(axes[0])
        plotted: list[dict[str, Any]] = []
        if levels:
            plotted = _plot_levels(next(ax_iter), levels, s)
        if speed:
            speed_drawn = plot_speed(next(ax_iter), speed)
        meta.update({"Title": f"trtrepo validate: {s.get('model')}", "Description": "panels: " + "; ".join(panels)})
        if levels:
            meta["Levels"] = json.dumps(plotted)
        if speed:
            meta["SpeedRows"] = json.dumps(speed_drawn)
    return Path(path)


def _plot_levels(ax: Any, levels: list[dict[str, Any]], s: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The latency-vs-throughput panel: client p50/p99 (and the server's mean request time when
    every level has it) per level; decision: an unstable level's points are hollow and labelled
    ``*``, one with machine warnings says so. Returns what was plotted, one row per level."""
    verdicts = [level_verdict(lv) for lv in levels]
    thr = [lv["throughput"] for lv in levels]
    srv = [lv["server"]["request_ms"] for lv in levels]
    series = [(f"client {key}", [lv["client_ms"][key] for lv in levels], style, marker)
              for key, style, marker in (("p50", "-", "o"), ("p99", "--", "s"))]
    if all(v is not None for v in srv):
        series.append(("server request (mean)", srv, ":", "^"))
    for name, ys, style, marker in series:
        line, = ax.plot(thr, ys, style, label=name)
        for x, y, v in zip(thr, ys, verdicts, strict=True):
            ax.plot([x], [y], marker, color=line.get_color(),
                    markerfacecolor=line.get_color() if v.stable else "none")
    labels = [level_label(lv) + v.marker + ("" if v.stable else " not stable")
              + (" (machine warning)" if v.warnings else "") for lv, v in zip(levels, verdicts, strict=True)]
    for lv, text in zip(levels, labels, strict=True):
        ax.annotate(text, (lv["throughput"], lv["client_ms"]["p99"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    if not all(v.stable for v in verdicts):
        ax.plot([], [], "o", color="gray", markerfacecolor="none", label="* not stable (hollow)")
    ax.set_title(f"{s.get('model')} v{s.get('version') or '-'} over {s.get('protocol')}: latency vs throughput")
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return [{"level": level_label(lv), "label": text, "throughput": lv["throughput"],
             "p50_ms": lv["client_ms"]["p50"], "p99_ms": lv["client_ms"]["p99"],
             "server_request_ms": lv["server"]["request_ms"], "stable": v.stable,
             "marker": "filled" if v.stable else "hollow", "flags": v.flags()}
            for lv, v, text in zip(levels, verdicts, labels, strict=True)]
