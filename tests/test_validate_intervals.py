"""Issue 41, items 2 and 4 for the latency levels: a level's client and server figures come from
the same requests (the windows end where the server's count stands), a negative overhead is never
printed, and console, validate.md, the CSV and latency.png mark a level the same way (one
decision, :func:`trtrepo.validate.report.level_verdict`).

Pure parts first, then the real tritonserver serving the demo CNN (Python backend, FP32)."""

from __future__ import annotations

import csv
import io
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from trtrepo.measure import Stability
from trtrepo.modelio import ModelIO
from trtrepo.validate import ValidateOptions, ValidationReport
from trtrepo.validate.report import latency_csv, level_overhead, level_verdict

# --------------------------------------------------------------------------------------------
# Pure parts


def _server(count, request_ms):
    return {"request_count": count, "failed_count": 0, "inference_count": count, "execution_count": count,
            "avg_batch": 1.0, "request_ms": request_ms, "queue_ms": 0.1, "compute_input_ms": 0.05,
            "compute_infer_ms": 0.5, "compute_output_ms": 0.05}


def test_level_overhead_only_from_the_same_requests_and_never_negative():
    assert level_overhead(1.5, 300, _server(300, 1.0)) == (pytest.approx(0.5), None)
    ov, why = level_overhead(1.5, 550, _server(1611, 1.0))  # the case: every window against the last three
    assert ov is None and why == "intervals differ: client 550 requests, server 1611"
    ov, why = level_overhead(84.01, 300, _server(300, 84.39))
    assert ov is None and "below the server's 84.39 ms for the same 300 requests" in why
    ov, why = level_overhead(1.0, 0, _server(0, None))
    assert ov is None and "no request" in why


def _level(c, *, stable=True, warnings=(), client_requests=300, server_requests=300):
    ov, note = level_overhead(1.2 * c, client_requests, _server(server_requests, 0.8 * c))
    return {"concurrency": c, "requests": client_requests, "inferences": client_requests, "wall_s": 1.0,
            "throughput": 100.0 * c, "client_ms": {"p50": 1.0 * c, "p90": 2.0 * c, "p95": 2.5 * c, "p99": 3.0 * c,
                                                     "mean": 1.2 * c, "min": 0.5, "max": 4.0 * c},
            "stable": stable, "spread_pct": {"throughput_pct": 2.0 if stable else 31.5, "latency_pct": 3.0},
            "windows": [{}] * (3 if stable else 10), "server": _server(server_requests, 0.8 * c),
            "client_requests": client_requests, "server_requests": server_requests, "overhead_ms": ov,
            "overhead_note": note, "warnings": list(warnings)}


def _csv_rows(text):
    return {int(r["Concurrency"]): r for r in csv.DictReader(io.StringIO(text))}


def _png_levels(path: Path) -> dict[str, dict]:
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        return {p["level"]: p for p in json.loads(img.info["Levels"])}


def _md_rows(md: str) -> dict[str, list[str]]:
    section = md[md.index("## Latency and throughput"):]
    section = section.split("\n## ")[0].split("\nPer server")[0]
    table = [ln for ln in section.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    return {cells[0]: cells for cells in ([c.strip() for c in ln.strip("|").split("|")] for ln in table[1:])} | {"": head}


def check_surfaces_agree(report: ValidationReport, csv_text: str, folder: Path) -> None:
    """Every level shown as level_verdict says, on each of the four surfaces."""
    console = report.summary_lines()
    md = _md_rows((folder / "validate.md").read_text())
    head = md[""]
    rows = _csv_rows(csv_text)
    plotted = _png_levels(folder / "latency.png")
    for lv in report.latency["levels"]:  # type: ignore[index]
        v, c = level_verdict(lv), lv["concurrency"]
        label = f"c={c}{v.marker}"
        (line,) = [ln for ln in console if ln.startswith(f"  {label}: ")]
        assert ("NOT STABLE" in line) == (not v.stable) and ("machine warning below" in line) == bool(v.warnings)
        if v.overhead_ms is None:
            assert f"client overhead not computed ({v.overhead_note})" in line
        else:
            assert f"client overhead {v.overhead_ms:.2f} ms" in line
        cells = md[f"{c}{v.marker}"]
        assert cells[head.index("stable")] == ("yes" if v.stable else "**no**")
        assert cells[head.index("overhead")] == ("-" if v.overhead_ms is None else f"{v.overhead_ms:.2f}")
        assert cells[head.index("flags")] == ("; ".join(v.flags()) or "-")
        assert cells[head.index("requests")] == str(lv["client_requests"])
        assert cells[head.index("server requests")] == str(lv["server"]["request_count"])
        row = rows[c]
        assert row["Stable"] == ("yes" if v.stable else "no") and row["Flags"] == "; ".join(v.flags())
        assert row["Network+Server Send/Recv"] == ("" if v.overhead_ms is None else str(round(v.overhead_ms * 1000)))
        p = plotted[f"c={c}"]
        assert p["label"].startswith(label) and ("machine warning" in p["label"]) == bool(v.warnings)
        assert p["stable"] == v.stable and p["marker"] == ("filled" if v.stable else "hollow") and p["flags"] == v.flags()
        assert p["throughput"] == pytest.approx(lv["throughput"]) and p["p99_ms"] == pytest.approx(lv["client_ms"]["p99"])


def test_one_verdict_marks_a_level_the_same_on_console_markdown_csv_and_plot(tmp_path):
    busy = "the machine was busy before the run (load average 11.30 on 2 cores): other work competes with the server"
    levels = [_level(1), _level(4, stable=False), _level(8, warnings=[busy], client_requests=550, server_requests=1611)]
    report = ValidationReport(server={"url": "127.0.0.1:1", "protocol": "grpc", "model": "m", "version": "1"},
                              contract={"ok": True, "max_batch_size": 8, "mismatches": []},
                              latency={"warmup": 2, "batch_size": 1, "shared_memory": "none", "levels": levels,
                                       "warnings": [f"concurrency 8: {busy}"]})
    report.write(tmp_path)
    text = latency_csv(report.latency)  # type: ignore[arg-type]
    check_surfaces_agree(report, text, tmp_path)
    verdicts = [level_verdict(lv) for lv in levels]
    assert [v.quotable for v in verdicts] == [True, False, False]
    assert verdicts[0].flags() == []
    assert verdicts[1].flags() == ["not stable after 10 windows (±31.5%)"]
    assert verdicts[2].flags() == ["1 machine warning", "overhead not computed: intervals differ: client 550 requests, "
                                                         "server 1611"]
    assert "  latency: 2 of 3 level(s) stable (the others are not figures to quote: rerun on a quieter machine or raise " \
           "--max-trials)" in report.summary_lines()
    assert not any("-0." in ln or "overhead -" in ln for ln in report.summary_lines())


# --------------------------------------------------------------------------------------------
# Real server


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_onnx, triton_server):
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        pytest.skip("no numpy<2 environment for the Python backend (run scripts/install_tritonserver.sh)")
    repo = tmp_path_factory.mktemp("intervals-repo") / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python", options=ModelOptions(execution_env=str(env)))
    return triton_server(repo)


@pytest.fixture(scope="module")
def payloads(demo_onnx):
    from trtrepo.data import open_data
    from trtrepo.validate import make_payloads

    io_ = ModelIO.from_onnx(demo_onnx)
    return io_, make_payloads(open_data("demo:val", io=io_, limit=64), io_, 1)[0]


def _target(server, protocol, io_):
    from trtrepo.validate import TritonTarget

    url = server.grpc_url if protocol == "grpc" else server.http_url
    t = TritonTarget(ValidateOptions(model="demo", url=url, protocol=protocol, progress=False, speed=None))
    t.wait_ready()
    t.prepare(io_)
    return t


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_each_window_and_the_level_cover_the_same_requests_on_both_sides(server, payloads, protocol):
    """Both transports (gRPC callbacks, asyncio HTTP): every window's client count equals the
    server's count between the readings at its ends, and a level's figures (the last three
    windows) are of the same requests on both sides, the overhead a positive number."""
    from trtrepo.validate import run_latency, stats_diff

    io_, pl = payloads
    with _target(server, protocol, io_) as t:
        t.load(pl, 4, requests=20)
        before = t.settled_statistics("1")
        m = t.measure(pl, Stability(interval_s=0.25, max_trials=5), concurrency=4, books=t.server_books("1", before))
        assert m.books_matched and len(m.readings) == len(m.windows) + 1
        for w, a, b in zip(m.windows, m.readings, m.readings[1:], strict=False):
            assert stats_diff(a, b, "demo", "1")["request_count"] == w["requests"] > 0
        span = m.reported_readings()
        assert span is not None and stats_diff(*span, "demo", "1")["request_count"] == m.summary()["requests"]
        opts = ValidateOptions(model="demo", url=t.url, protocol=protocol, concurrency=(1, 4), warmup=10, progress=False,
                               stability=Stability(interval_s=0.25, max_trials=5), speed=None)
        lat = run_latency(t, pl, opts, "1")
    for lv in lat["levels"]:
        assert lv["client_requests"] == lv["server_requests"] == lv["server"]["request_count"] == lv["requests"] > 0
        assert lv["overhead_ms"] is not None and lv["overhead_ms"] >= 0 and lv["overhead_note"] is None


def _burn(until: float) -> None:
    x = 0
    while time.time() < until:
        x += 1


@pytest.mark.long
@pytest.mark.triton
def test_no_negative_overhead_with_a_cpu_burner_beside(server, payloads):
    """A busy loop on every core beside the server and the client (the issue's busy machine,
    load 5-11): the figures of a level still cover the same requests and the overhead is a number
    of its own, never below zero."""
    from trtrepo.validate import run_latency

    io_, pl = payloads
    opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(1, 4, 16), warmup=20, progress=False,
                           stability=Stability(interval_s=0.5, max_trials=6), speed=None)
    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, args=(time.time() + 60,), daemon=True) for _ in range(os.cpu_count() or 2)]
    for b in burners:
        b.start()
    try:
        time.sleep(1.0)  # the burners run before the first level
        with _target(server, "grpc", io_) as t:
            lat = run_latency(t, pl, opts, "1")
    finally:
        for b in burners:
            b.terminate()
            b.join(10)
    for lv in lat["levels"]:
        assert lv["client_requests"] == lv["server_requests"] > 0, lv
        assert lv["overhead_ms"] is not None and lv["overhead_ms"] >= 0, (lv["concurrency"], lv["overhead_note"])


@pytest.mark.triton
def test_unstable_levels_are_marked_alike_in_every_report_of_a_real_run(run_cli, server, demo_onnx, tmp_path):
    """Windows that cannot agree (0.01 %) in three trials: each level is not stable, and the
    console, validate.md, the CSV and latency.png's plotted data say so the same way."""
    folder, csv_path = tmp_path / "r", tmp_path / "levels.csv"
    r = run_cli("validate", "--url", server.grpc_url, "--model", "demo", "--reference", "demo", "--onnx", demo_onnx,
                "--data", "demo:val", "--limit", "32", "--no-accuracy", "--no-reference-speed", "--no-progress",
                "--concurrency", "1,2", "--measurement-interval", "0.2", "--stability-percentage", "0.01",
                "--max-trials", "3", "--warmup", "5", "--report", folder, "--csv", csv_path)
    assert r.exit_code == 0, r.output
    data = json.loads((folder / "validate.json").read_text())
    levels = data["latency"]["levels"]
    assert [lv["stable"] for lv in levels] == [False, False]
    report = ValidationReport(server=data["server"], contract=data["contract"], latency=data["latency"])
    assert [ln for ln in report.summary_lines() if ln.startswith("  c=")] == \
        [ln for ln in r.output.splitlines() if ln.startswith("  c=")]
    check_surfaces_agree(report, csv_path.read_text(), folder)
    for lv in levels:
        assert lv["client_requests"] == lv["server_requests"]


@pytest.mark.triton
def test_a_fleet_level_counts_the_same_requests_on_every_server_and_in_the_totals(server, payloads, triton_server):
    """Two servers of one repository measured together: each server's row and the totals row
    cover the same requests on the client and the server side, the totals' overhead a number."""
    from trtrepo.validate import run_latency

    io_, pl = payloads
    other = triton_server(server.repo)
    opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(2,), warmup=10, progress=False,
                           stability=Stability(interval_s=0.25, max_trials=5), speed=None)
    with _target(server, "grpc", io_) as a, _target(other, "grpc", io_) as b:
        (lv,) = run_latency(a, pl, opts, "1", fleet=[b])["levels"]
    assert [s["url"] for s in lv["servers"]] == [server.grpc_url, other.grpc_url]
    for s in lv["servers"]:
        assert s["server"]["request_count"] == s["requests"] > 0
    assert lv["client_requests"] == lv["server_requests"] == lv["requests"] == sum(s["requests"] for s in lv["servers"])
    assert lv["overhead_ms"] is not None and lv["overhead_ms"] >= 0, lv["overhead_note"]
