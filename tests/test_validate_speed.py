"""trtrepo validate: speed against the PyTorch reference (issue 8, item 5).

Pure parts first (summary/speedup math, the fixed-shape batches, the report section and the
two-panel PNG), then the real tritonserver serving the demo CNN and demo-text (Python backend
running ONNX Runtime), few iterations each.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from trtrepo.errors import UsageError
from trtrepo.validate import ValidationReport
from trtrepo.validate.speed import (
    SpeedOptions,
    accuracy_kept,
    fixed_shape_pool,
    parse_batch_sizes,
    speed_batches,
    speed_row,
    speedup,
    timing_summary,
)

SPEED_KEYS = ["compared", "sides", "reference", "served", "onnx", "iterations", "measurement", "warmup", "input_shapes",
              "samples_of_shape", "samples_total", "distinct_batches", "order", "cpu_count", "load_average", "machine",
              "warnings", "budget", "rows", "skipped_batch_sizes", "accuracy_kept", "first_call"]
SUMMARY_KEYS = ["iterations", "median_ms", "p99_ms", "mean_ms", "min_ms", "max_ms", "throughput"]
ROW_KEYS = ["batch_size", "reference", "served", "speedup_median", "speedup_p99", "throughput_ratio", "onnx",
            "speedup_vs_onnx", "implausible"]
REPORT_KEYS = ["schema", "trtrepo_version", "passed", "failures", "server", "contract", "accuracy", "latency",
               "speed_vs_reference", "fleet", "detection", "thresholds", "files"]

# --------------------------------------------------------------------------------------------
# Pure parts


def test_timing_summary_speedup_and_row_math():
    lat = np.arange(1, 101) / 1000.0  # 1..100 ms
    s = timing_summary(lat, batch_size=8)
    assert list(s) == SUMMARY_KEYS
    assert s["iterations"] == 100
    assert s["median_ms"] == pytest.approx(50.5) and s["p99_ms"] == pytest.approx(99.01)
    assert s["min_ms"] <= s["median_ms"] <= s["p99_ms"] <= s["max_ms"]
    assert s["throughput"] == pytest.approx(8 * 100 / 5.05)  # wall = sum of latencies
    assert timing_summary(lat, 8, wall_s=10.0)["throughput"] == pytest.approx(80.0)
    assert speedup(10.0, 2.5) == pytest.approx(4.0)
    assert speedup(None, 1.0) is None and speedup(1.0, 0.0) is None and speedup(float("nan"), 1.0) is None
    ref = {"median_ms": 12.0, "p99_ms": 30.0, "throughput": 100.0}
    served = {"median_ms": 3.0, "p99_ms": 20.0, "throughput": 250.0}
    row = speed_row(4, ref, served)
    assert list(row) == ROW_KEYS
    assert row["speedup_median"] == pytest.approx(4.0)  # reference / served: > 1 means served is faster
    assert row["speedup_p99"] == pytest.approx(1.5)
    assert row["throughput_ratio"] == pytest.approx(2.5)  # served / reference
    with pytest.raises(UsageError):
        timing_summary([], 1)


def test_fixed_shape_pool_picks_the_most_common_shape_and_batches_wrap():
    def batch(n, length, start):
        ids = np.arange(start, start + n)[:, None] + np.zeros((n, length), np.int64)
        return {"input_ids": ids, "attention_mask": np.ones((n, length), np.int64)}

    batches = [batch(3, 8, 0), batch(4, 16, 100), batch(4, 16, 200), batch(5, 24, 300)]
    shapes, pool, of_shape, total = fixed_shape_pool(batches)
    assert shapes == {"attention_mask": [16], "input_ids": [16]}
    assert (of_shape, total, len(pool)) == (8, 16, 8)
    assert [int(p["input_ids"][0]) for p in pool] == [100, 101, 102, 103, 200, 201, 202, 203]  # data order
    # A tie between shapes goes to the larger one (the longer sequence).
    shapes, _, of_shape, _ = fixed_shape_pool([batch(4, 8, 0), batch(4, 24, 10)])
    assert shapes["input_ids"] == [24] and of_shape == 4
    _, pool, _, _ = fixed_shape_pool(batches, limit=5)
    assert len(pool) == 5
    # Batches of 32 from a pool of 8: one batch, samples repeated in order.
    feeds = speed_batches(pool, 3, count=8)
    assert len(feeds) == 2 and feeds[0]["input_ids"].shape == (3, 16)
    assert [int(v) for v in feeds[1]["input_ids"][:, 0]] == [103, 200, 100]
    big = speed_batches(pool, 32, count=8)
    assert len(big) == 1 and big[0]["input_ids"].shape == (32, 16) and big[0]["input_ids"].flags.c_contiguous


def test_speed_options_and_batch_sizes_reject_bad_values():
    assert parse_batch_sizes("32,1,8,8") == (1, 8, 32)
    for bad in ("", "0,1", "a"):
        with pytest.raises(UsageError, match="the batch sizes '"):
            parse_batch_sizes(bad)
    assert SpeedOptions(batch_sizes=(8, 1)).batch_sizes == (1, 8)
    with pytest.raises(UsageError, match="the timed calls per batch size 1: must be >= 2"):
        SpeedOptions(iterations=1)
    with pytest.raises(UsageError, match="the reference device 'tpu': one of"):
        SpeedOptions(device="tpu")
    with pytest.raises(UsageError, match="the reference's threads 0: must be >= 1"):
        SpeedOptions(threads=0)


def _speed_dict():
    def summ(median, p99, thr):
        return {"iterations": 10, "median_ms": median, "p99_ms": p99, "mean_ms": median, "min_ms": median / 2,
                "max_ms": p99, "throughput": thr}

    rows = [speed_row(b, summ(2.0 * b, 3.0 * b, 500.0), summ(1.0 * b, 2.0 * b, 1000.0)) for b in (1, 8, 32)]
    acc = {"samples": 100, "label_output": "logits",
           "outputs": {"logits": {"top1_agreement": 0.99, "cosine_mean": 0.9995, "cosine_min": 0.98,
                                  "reference_accuracy": 0.97, "candidate_accuracy": 0.965}}}
    return {"compared": "x", "sides": "y",
            "reference": {"label": "PyTorch eager FP32", "engine": "torch", "version": "2", "precision": "fp32",
                          "device": "cpu", "threads": 2, "threads_requested": None},
            "served": {"model": "m", "version": "1", "protocol": "grpc", "concurrency": 1, "shared_memory": "none"},
            "onnx": None,
            "iterations": 10, "measurement": SpeedOptions(iterations=10).stability.to_dict(), "warmup": 2, "input_shapes": {"input": [1, 32, 32]}, "samples_of_shape": 100,
            "samples_total": 100, "distinct_batches": 8, "order": "o", "cpu_count": 2, "load_average": [1.0, 1.0],
            "machine": {}, "warnings": [], "budget": {"time_budget_s": 90.0, "phase_s": 20.0, "spent_s": 1.0, "cut": []},
            "rows": rows, "skipped_batch_sizes": [{"batch_size": 64, "reason": "larger than the server's max_batch_size 32"}],
            "accuracy_kept": accuracy_kept(acc), "first_call": {"batch_size": 1, "seconds": 0.01, "slow": False}}


def _png_panels(path: Path) -> tuple[tuple[int, int], str]:
    from PIL import Image

    with Image.open(path) as img:
        assert img.format == "PNG"
        img.load()
        return img.size, img.info.get("Description", "")


def test_report_section_and_two_panel_png_without_a_server(tmp_path):
    report = ValidationReport(server={"url": "127.0.0.1:1", "protocol": "grpc", "model": "m", "version": "1"},
                              contract={"ok": True, "max_batch_size": 32, "mismatches": []},
                              speed_vs_reference=_speed_dict())
    paths = report.write(tmp_path / "r")
    data = json.loads(paths["json"].read_text())
    assert list(data) == REPORT_KEYS and list(data["speed_vs_reference"]) == SPEED_KEYS
    md = paths["markdown"].read_text()
    assert "## Speed: PyTorch eager FP32 | served model" in md
    assert "| 8 | 16.00 | 24.00 | 500.0 | 8.00 | 16.00 | 1000.0 | 2.00x | 1.50x | 2.00x |" in md
    assert "| 64 | skipped: larger than the server's max_batch_size 32" in md
    assert "`logits` top-1 agreement 99.00%, accuracy 97.00% -> 96.50%, cosine mean 0.999500" in md
    # Speed only: one panel. With the latency levels too: two panels side by side.
    size, desc = _png_panels(paths["plot"])
    assert desc == "panels: latency per batch size: reference vs served"
    lv = {"concurrency": 1, "requests": 10, "inferences": 10, "wall_s": 0.1, "throughput": 100.0,
          "client_ms": {"p50": 1.0, "p90": 2.0, "p95": 2.5, "p99": 3.0, "mean": 1.2, "min": 0.5, "max": 4.0},
          "server": {"request_count": 10, "failed_count": 0, "inference_count": 10, "execution_count": 10, "avg_batch": 1.0,
                     "request_ms": 0.8, "queue_ms": 0.1, "compute_input_ms": 0.05, "compute_infer_ms": 0.5,
                     "compute_output_ms": 0.05},
          "overhead_ms": 0.4}
    report.latency = {"requests_per_level": 10, "duration_s": None, "warmup": 2, "batch_size": 1, "shared_memory": "none",
                      "levels": [lv]}
    paths = report.write(tmp_path / "r2")
    size2, desc2 = _png_panels(paths["plot"])
    assert desc2 == "panels: latency vs throughput; latency per batch size: reference vs served"
    assert size2[0] == 2 * size[0] and size2[1] == size[1]
    import matplotlib.image as mpimg

    assert mpimg.imread(paths["plot"]).shape[:2] == (size2[1], size2[0])


def _torch_has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def test_reference_device_cuda_without_cuda_is_a_usage_error(run_cli, demo_onnx, tmp_path):
    if _torch_has_cuda():
        pytest.skip("torch sees a CUDA GPU here")
    r = run_cli("validate", "--url", "127.0.0.1:1", "--model", "demo", "--reference", "demo", "--onnx", demo_onnx,
                "--data", "demo:val", "--reference-device", "cuda", "--ready-timeout", "1", "--report", tmp_path / "r")
    assert r.exit_code == 2
    assert "--reference-device cuda: CUDA is not available" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # failed before any work


# --------------------------------------------------------------------------------------------
# Real server


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_onnx, triton_server):
    from trtrepo.export import export_onnx
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        pytest.skip("no numpy<2 environment for the Python backend (run scripts/install_tritonserver.sh)")
    d = tmp_path_factory.mktemp("speed")
    text = export_onnx("demo-text", d / "demo_text.onnx").path
    repo = d / "repo"
    opts = ModelOptions(execution_env=str(env))
    add_onnx_model(repo, "demo", demo_onnx, backend="python", options=opts)
    add_onnx_model(repo, "demo_text", text, backend="python", options=opts)
    srv = triton_server(repo)
    srv.onnx = {"demo": Path(demo_onnx), "demo_text": Path(text)}
    return srv


FAST = ("--concurrency", "1", "--requests", "20", "--warmup", "2", "--speed-iterations", "8", "--speed-warmup", "2",
        "--no-progress")


def _run(run_cli, server, tmp_path, name, *args):
    report = tmp_path / name
    r = run_cli("validate", "--url", server.grpc_url, "--report", report, *FAST, *args)
    data = json.loads((report / "validate.json").read_text()) if (report / "validate.json").is_file() else None
    return r, data, report


def _check_rows(speed, batch_sizes, iterations):
    assert list(speed) == SPEED_KEYS
    assert [row["batch_size"] for row in speed["rows"]] == list(batch_sizes)
    for row in speed["rows"]:
        assert list(row) == ROW_KEYS
        for side in ("reference", "served"):
            s = row[side]
            # windows of `iterations` calls until three agree; the last three merged
            assert list(s) == [*SUMMARY_KEYS, "stability"] and s["iterations"] == 3 * iterations
            assert 3 <= s["stability"]["windows"] <= 10
            assert 0 < s["min_ms"] <= s["median_ms"] <= s["p99_ms"] <= s["max_ms"]
            assert s["throughput"] > 0
        assert row["speedup_median"] == pytest.approx(row["reference"]["median_ms"] / row["served"]["median_ms"])
        assert row["throughput_ratio"] > 0


@pytest.mark.triton
def test_demo_speed_table_against_pytorch_on_cpu(run_cli, server, tmp_path):
    r, data, report = _run(run_cli, server, tmp_path, "demo", "--model", "demo", "--reference", "demo", "--onnx",
                           server.onnx["demo"], "--data", "demo:val", "--limit", "96", "--speed-batch-sizes", "1,8,32",
                           "--reference-device", "cpu", "--reference-threads", "1")
    assert r.exit_code == 0, r.output
    assert list(data) == REPORT_KEYS
    speed = data["speed_vs_reference"]
    _check_rows(speed, (1, 8, 32), 8)
    ref = speed["reference"]
    assert (ref["label"], ref["engine"], ref["device"], ref["threads"], ref["threads_requested"]) == \
        ("PyTorch eager FP32", "torch", "cpu", 1, 1)
    assert {k: v for k, v in speed["served"].items() if k != "server_version"} == \
        {"model": "demo", "version": "1", "protocol": "grpc", "concurrency": 1, "shared_memory": "none", "backend": "python"}
    assert speed["input_shapes"] == {"input": [1, 32, 32]} and speed["samples_of_shape"] == speed["samples_total"] == 96
    assert speed["skipped_batch_sizes"] == []
    assert speed["accuracy_kept"]["outputs"]["logits"]["top1_agreement"] == 1.0
    # Both sides named (issue 41); the deployed ONNX model (--onnx) is timed beside them, FP32 on ONNX Runtime.
    assert "PyTorch eager FP32 (cpu, torch threads 1) vs served demo v1 (Triton " in r.output
    assert ", python backend); and ONNX Runtime FP32 (demo.onnx, onnxruntime threads 1), concurrency 1:" in r.output
    assert speed["onnx"]["label"] == "ONNX Runtime FP32" and speed["onnx"]["precision"] == "fp32"
    for row in speed["rows"]:
        assert row["onnx"]["median_ms"] > 0
        assert row["speedup_vs_onnx"] == pytest.approx(row["onnx"]["median_ms"] / row["served"]["median_ms"])
    md = (report / "validate.md").read_text()
    assert "## Speed: PyTorch eager FP32 | served model" in md and "reference on cpu, torch threads 1" in md
    assert "| served vs ONNX Runtime FP32 |" in md
    size, desc = _png_panels(report / "latency.png")
    assert desc == "panels: latency vs throughput; latency per batch size: reference vs served"
    assert size[0] >= 2 * size[1]


@pytest.mark.triton
def test_demo_text_speed_table_uses_one_sequence_length(run_cli, server, tmp_path):
    r, data, report = _run(run_cli, server, tmp_path, "text", "--model", "demo_text", "--reference", "demo-text",
                           "--onnx", server.onnx["demo_text"], "--data", "demo-text:val", "--batch-size", "8",
                           "--speed-batch-sizes", "1,8,32,64", "--reference-threads", "1")
    assert r.exit_code == 0, r.output
    speed = data["speed_vs_reference"]
    _check_rows(speed, (1, 8, 32), 8)
    # The server's max batch size (32) drops 64, named in the report.
    assert speed["skipped_batch_sizes"] == [{"batch_size": 64, "reason": "larger than the server's max_batch_size 32"}]
    shapes = speed["input_shapes"]
    assert set(shapes) == {"input_ids", "attention_mask"} and shapes["input_ids"] == shapes["attention_mask"]
    assert len(shapes["input_ids"]) == 1 and shapes["input_ids"][0] in (8, 16, 24, 32)
    assert 32 <= speed["samples_of_shape"] < speed["samples_total"] == 512
    assert speed["reference"]["device"] == "cpu"  # auto on a machine without CUDA
    kept = speed["accuracy_kept"]["outputs"]
    assert kept["logits"]["top1_agreement"] == 1.0 and kept["embedding"]["cosine_mean"] > 0.9999
    md = (report / "validate.md").read_text()
    assert f"`input_ids` [{shapes['input_ids'][0]}]" in md and "the most common one is used" in md


@pytest.mark.triton
def test_no_reference_speed_skips_the_comparison(run_cli, server, tmp_path):
    r, data, report = _run(run_cli, server, tmp_path, "skip", "--model", "demo", "--reference", "demo", "--onnx",
                           server.onnx["demo"], "--data", "demo:val", "--limit", "32", "--no-reference-speed")
    assert r.exit_code == 0, r.output
    assert list(data) == REPORT_KEYS and data["speed_vs_reference"] is None
    assert "## Speed" not in (report / "validate.md").read_text()
    _, desc = _png_panels(report / "latency.png")
    assert desc == "panels: latency vs throughput"


# A bursty CPU load: busy for 50-300 ms, idle for 50-300 ms, forever.
BURN = ("import random, time\n"
        "while True:\n"
        "    end = time.perf_counter() + random.uniform(0.05, 0.3)\n"
        "    while time.perf_counter() < end:\n"
        "        pass\n"
        "    time.sleep(random.uniform(0.05, 0.3))\n")


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@pytest.mark.triton
def test_a_loaded_machine_marks_unstable_timings_and_prints_no_bare_speedup(run_cli, server, tmp_path):
    """Issue 27: with CPU burners beside validate, a timing that misses the stability rule is
    printed with its spread and a marker, its row gets no speedup number, and the summary lines
    count the stable rows and levels."""
    import re
    import subprocess
    import sys

    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(2)]
    try:
        r, data, _ = _run(run_cli, server, tmp_path, "loaded", "--model", "demo", "--reference", "demo", "--onnx",
                          server.onnx["demo"], "--data", "demo:val", "--limit", "64", "--speed-batch-sizes", "1,8",
                          "--reference-threads", "1", "--stability-percentage", "2", "--max-trials", "3")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert r.exit_code == 0, r.output
    rows = data["speed_vs_reference"]["rows"]
    settled = [all(row[s]["stability"]["stable"] for s in ("reference", "served")) for row in rows]
    assert not all(settled), "the burners left every timing stable: the test measured nothing"
    quoted = 0
    for row, ok in zip(rows, settled, strict=True):
        (line,) = [ln for ln in r.output.splitlines() if ln.strip().startswith(f"batch {row['batch_size']}")]
        if ok and not row["implausible"]:
            quoted += 1
            assert re.search(r"speedup \d+\.\d+x(;|$)", line), line
        elif not ok:
            assert line.strip().startswith(f"batch {row['batch_size']}*") and "NOT STABLE ±" in line, line
            assert "speedup not computed" in line and not re.search(r"speedup \d", line), line
    assert f"{quoted} of {len(rows)} batch size(s) stable on both sides and plausible" in r.output
    levels = data["latency"]["levels"]
    assert f"latency: {sum(lv['stable'] for lv in levels)} of {len(levels)} level(s) stable" in r.output


def test_speed_console_lines_mark_each_unstable_side():
    from trtrepo.validate.speed import speed_console_lines

    def side(ms, stable, spread=3.0):
        return {"median_ms": ms, "p99_ms": 2 * ms,
                "stability": {"stable": stable, "spread_pct": {"throughput_pct": spread / 2, "latency_pct": spread},
                              "windows": 10}}

    rows = [{"batch_size": 1, "reference": side(10.0, True), "served": side(2.0, True), "speedup_median": 5.0},
            {"batch_size": 8, "reference": side(1592.08, False, 46.0), "served": side(14.55, True), "speedup_median": 109.43}]
    lines = speed_console_lines(rows)
    assert lines[0].endswith("speedup 5.00x") and "*" not in lines[0]
    assert lines[1].startswith("batch 8*: reference median 1592.08 ms (p99 3184.16; * NOT STABLE ±46% over 10 windows)")
    assert "109.43" not in lines[1] and lines[1].endswith("speedup not computed (reference timing not stable)")
    assert lines[2] == "1 of 2 batch size(s) stable on both sides and plausible; * and ! rows are not figures to quote"


# --------------------------------------------------------------------------------------------
# Issue 41: the time budget, a slow reference announced, an implausible row flagged everywhere

SLOW_REFERENCE = '''"""The demo CNN behind a sleep: a reference slow at every batch size, or at batch 8 only."""
import time

import torch

from trtrepo.export import load_torch_model, resolve_source


class Sleepy(torch.nn.Module):
    def __init__(self, sleeps):
        super().__init__()
        self.inner = load_torch_model(resolve_source("demo"))
        self.sleeps = sleeps

    def forward(self, x):
        time.sleep(self.sleeps.get(int(x.shape[0]), self.sleeps.get(0, 0.0)))
        return self.inner(x)


def slow_everywhere():
    return Sleepy({0: 0.6})


def slow_at_8():
    return Sleepy({8: 0.25})
'''


@pytest.fixture
def sleepy(tmp_path, monkeypatch):
    (tmp_path / "sleepy_ref.py").write_text(SLOW_REFERENCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.triton
def test_the_time_budget_cuts_a_slow_reference_and_says_so(run_cli, server, sleepy, tmp_path, caplog):
    """A reference at 0.6 s a call: announced before any timing; with a 4 s budget the phase ends
    near it (timed fully it takes over 30 s), and the summary names what was cut and --thorough."""
    import logging

    caplog.set_level(logging.WARNING, logger="trtrepo")
    start = time.monotonic()
    r, data, report = _run(run_cli, server, tmp_path, "budget", "--model", "demo", "--reference", "sleepy_ref:slow_everywhere",
                           "--onnx", server.onnx["demo"], "--data", "demo:val", "--limit", "32", "--no-accuracy",
                           "--speed-batch-sizes", "1,8", "--reference-threads", "1", "--time-budget", "4", "-v")
    took = time.monotonic() - start
    assert r.exit_code == 0, r.output
    assert "takes 0.6" in caplog.text and "s a call at batch 1 on the cpu; timing it at batch sizes 1, 8 takes about " \
        in caplog.text and "--no-reference-speed skips this" in caplog.text
    speed = data["speed_vs_reference"]
    assert speed["first_call"]["slow"] is True and speed["first_call"]["seconds"] >= 0.6
    bud = speed["budget"]
    assert bud["time_budget_s"] == 4 and bud["cut"], bud
    # The phase got what the budget left, at least its floor (4 s here), and overran it by a call or two at most.
    assert bud["spent_s"] < bud["phase_s"] + 4 * 0.6 + 2, bud
    assert took < 40, took
    cut_rows = {c["batch_size"] for c in bud["cut"]}
    for row in speed["rows"]:
        rec = row["reference"]["stability"]
        assert rec["calls_per_window"] <= 8
        if row["batch_size"] in cut_rows and rec["cut"]:
            (line,) = [ln for ln in r.output.splitlines() if ln.strip().startswith(f"batch {row['batch_size']}*")]
            assert "not settled in the time budget" in line and "speedup not computed" in line, line
    assert "time budget (4 s for validate" in r.output and "--thorough lifts the budget" in r.output
    md = (report / "validate.md").read_text()
    assert "time budget (4 s for validate" in md
    # A status line per phase, with what is left.
    assert "] latency: " in r.stderr and "concurrency level(s) 1: 60 to 200 request(s) each" in r.stderr, r.stderr
    assert "] reference speed: 0/2 batch sizes" in r.stderr and "4 s of the time budget left" in r.stderr, r.stderr
    assert "] accuracy" not in r.stderr  # --no-accuracy


@pytest.mark.triton
def test_an_implausible_reference_row_is_flagged_in_json_console_markdown_and_plot(run_cli, server, sleepy, tmp_path):
    """The reference sleeps at batch 8 only: batch 8 takes longer than batch 32 every time, which
    the stability windows accept; the rows are flagged and no surface gives them a speedup."""
    r, data, report = _run(run_cli, server, tmp_path, "implausible", "--model", "demo", "--reference", "sleepy_ref:slow_at_8",
                           "--onnx", server.onnx["demo"], "--data", "demo:val", "--limit", "64", "--no-accuracy",
                           "--speed-batch-sizes", "1,8,32", "--speed-iterations", "4", "--reference-threads", "1")
    assert r.exit_code == 0, r.output
    rows = {row["batch_size"]: row for row in data["speed_vs_reference"]["rows"]}
    assert rows[8]["reference"]["median_ms"] > 250
    assert not rows[1]["implausible"] or "reference" not in rows[1]["implausible"]["sides"]  # load may flag served
    for b in (8, 32):
        flag = rows[b]["implausible"]
        assert flag["sides"] == ["reference"] and flag["reason"].startswith("reference takes longer at batch 8 ("), flag
        (line,) = [ln for ln in r.output.splitlines() if ln.strip().startswith(f"batch {b}")]
        assert line.strip().startswith(f"batch {b}!") or line.strip().startswith(f"batch {b}*!"), line
        assert "speedup not computed (" in line and "implausible: reference takes longer at batch 8" in line, line
    md = (report / "validate.md").read_text()
    for b in (8, 32):
        (row_line,) = [ln for ln in md.splitlines() if ln.startswith(f"| {b}!") or ln.startswith(f"| {b}*!")]
        assert "not computed | not computed | not computed" in row_line, row_line
    from PIL import Image

    with Image.open(report / "latency.png") as img:
        img.load()
        drawn = {d["batch_size"]: d for d in json.loads(img.info["SpeedRows"])}
    for b in (8, 32):
        assert "!" in drawn[b]["mark"] and drawn[b]["speedup"] is None and "implausible" in drawn[b]["withheld"]
    # Batch 1: the plot annotates its speedup exactly when the console prints it.
    (line,) = [ln for ln in r.output.splitlines() if ln.strip().startswith("batch 1")]
    assert (drawn[1]["speedup"] is not None) == (drawn[1]["withheld"] is None) == ("speedup not computed" not in line)
    if drawn[1]["speedup"] is not None:
        assert f"speedup {drawn[1]['speedup']}" in line
