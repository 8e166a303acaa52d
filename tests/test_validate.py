"""trtrepo validate (issue 7): pure parts without a server, then the real tritonserver.

The server tests start one real tritonserver per module on 127.0.0.1 free ports, serving a
repository written by trtrepo: the demo CNN (Python backend running ONNX Runtime) in FP32 and
INT8 (``trtrepo.qdq``), demo-text (two int64 inputs, variable sequence length) and a model
that fails to load. Every call is bounded; the server is stopped by the fixture.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from trtrepo.contracts.payload import check_shape
from trtrepo.errors import TrtrepoError, UsageError
from trtrepo.measure import Stability, latency_ms, parse_rates
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.validate import (
    REPORT_SCHEMA,
    ThresholdResult,
    Thresholds,
    ValidateOptions,
    ValidationReport,
    check_thresholds,
    compare_contract,
    parse_concurrency,
    parse_url,
    stats_diff,
)

# --------------------------------------------------------------------------------------------
# Pure parts


def test_client_latency_percentiles_match_numpy_and_are_ordered():
    lat = np.arange(1, 101) / 1000.0  # 1..100 ms
    s = latency_ms(lat)
    assert s["p50"] == pytest.approx(50.5)
    assert s["p99"] == pytest.approx(99.01)
    assert s["mean"] == pytest.approx(50.5)
    assert s["min"] == pytest.approx(1.0) and s["max"] == pytest.approx(100.0)
    assert s["min"] <= s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"]
    with pytest.raises(UsageError):
        latency_ms([])


def _stats(count, ns, inf, exe, as_str=False):
    conv = str if as_str else int

    def cn(c, n):
        return {"count": conv(c), "ns": conv(n)}

    return {"model_stats": [{"name": "m", "version": "1", "inference_count": conv(inf), "execution_count": conv(exe),
                             "inference_stats": {"success": cn(count, ns), "fail": {}, "queue": cn(count, ns // 10),
                                                 "compute_input": cn(exe, ns // 20), "compute_infer": cn(exe, ns // 2),
                                                 "compute_output": cn(exe, ns // 20)}}]}


@pytest.mark.parametrize("as_str", [False, True], ids=["http-ints", "grpc-strings"])
def test_stats_diff_is_the_window_between_two_snapshots(as_str):
    before = _stats(10, 10_000_000, 10, 10, as_str)
    after = _stats(110, 210_000_000, 110, 35, as_str)
    d = stats_diff(before, after, "m", "1")
    assert d["request_count"] == 100 and d["inference_count"] == 100 and d["execution_count"] == 25
    assert d["avg_batch"] == pytest.approx(4.0)
    assert d["request_ms"] == pytest.approx(2.0)  # 200 ms over 100 requests
    assert d["queue_ms"] == pytest.approx(0.2)
    assert d["compute_infer_ms"] == pytest.approx((105_000_000 - 5_000_000) / 25 / 1e6)
    assert d["failed_count"] == 0
    empty = stats_diff(before, before, "m", "1")
    assert empty["request_ms"] is None and empty["avg_batch"] is None


def _demo_io():
    return ModelIO((TensorSpec("input", "float32", (-1, 1, 32, 32)),), (TensorSpec("logits", "float32", (-1, 10)),))


def _meta(inputs, outputs):
    return {"inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
            "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs]}


def test_compare_contract_accepts_the_matching_model_in_both_json_flavours():
    io = _demo_io()
    http = _meta([("input", "FP32", [-1, 1, 32, 32])], [("logits", "FP32", [-1, 10])])
    grpc = _meta([("input", "FP32", ["-1", "1", "32", "32"])], [("logits", "FP32", ["-1", "10"])])
    assert compare_contract(io, http, {"max_batch_size": 32}) == []
    assert compare_contract(io, grpc, {"config": {"max_batch_size": "32"}}, batch_size=32) == []


def test_compare_contract_reports_every_field():
    io = _demo_io()
    meta = _meta([("input", "FP16", [-1, 3, 32, 32]), ("extra", "FP32", [-1, 2])], [("probs", "FP32", [-1, 10])])
    issues = compare_contract(io, meta, {"max_batch_size": 8}, batch_size=16)
    fields = [m.field for m in issues]
    assert "input 'input' datatype" in fields and "input 'input' shape" in fields
    assert "output 'logits'" in fields and "output 'probs'" in fields and "input 'extra'" in fields
    assert "max_batch_size" in fields
    dtype = next(m for m in issues if m.field == "input 'input' datatype")
    assert (dtype.expected, dtype.actual) == ("FP32", "FP16")
    # No batching on the server for a batched reference.
    issues = compare_contract(io, _meta([("input", "FP32", [-1, 1, 32, 32])], [("logits", "FP32", [-1, 10])]),
                              {"max_batch_size": 0})
    assert [m.field for m in issues] == ["max_batch_size"]


def test_compare_contract_dynamic_sequence_axis_needs_a_dynamic_server_axis():
    io = ModelIO((TensorSpec("ids", "int64", (-1, -1)),), (TensorSpec("out", "float32", (-1, 4)),))
    ok = _meta([("ids", "INT64", [-1, -1])], [("out", "FP32", [-1, 4])])
    fixed = _meta([("ids", "INT64", [-1, 16])], [("out", "FP32", [-1, -1])])
    assert compare_contract(io, ok, {"max_batch_size": 4}) == []
    issues = compare_contract(io, fixed, {"max_batch_size": 4})
    assert [m.field for m in issues] == ["input 'ids' shape"]  # a dynamic server output axis is fine


def test_check_shape_names_the_output_and_hints_at_empty_responses():
    check_shape("logits", (4, 10), (4, 10), "r")
    check_shape("emb", (4, 7), (4, -1), "r")
    with pytest.raises(TrtrepoError, match="output 'logits' has shape \\[0\\].*numpy<2"):
        check_shape("logits", (0,), (4, 10), "r")


def _report_dict(top1_drop=0.0, cosine=1.0, p99=(3.0, 8.0)):
    return {"accuracy": {"label_output": "logits",
                         "outputs": {"logits": {"top1_drop_points": top1_drop, "accuracy_drop_points": top1_drop,
                                                "cosine_mean": cosine},
                                     "embedding": {"top1_drop_points": 50.0, "cosine_mean": cosine}}},
            "latency": {"levels": [{"concurrency": c, "client_ms": {"p99": v}} for c, v in zip((1, 4), p99, strict=True)]}}


def test_check_thresholds_names_each_failing_value():
    res = check_thresholds(_report_dict(), Thresholds(max_top1_drop=0.5, max_p99_ms=10, min_cosine=0.99))
    assert all(r.passed for r in res)
    assert [r.name for r in res] == ["top1_drop[logits]", "cosine[logits]", "cosine[embedding]",
                                     "embedding_cosine[embedding]", "p99_ms[c=1]", "p99_ms[c=4]"]
    # the embedding gate is on by default (0.99) and applies to outputs without classes only
    res = check_thresholds(_report_dict(cosine=0.95), Thresholds())
    assert [(r.name, r.passed) for r in res] == [("embedding_cosine[embedding]", False)]
    assert check_thresholds(_report_dict(cosine=0.95), Thresholds(min_embedding_cosine=None)) == []
    res = check_thresholds(_report_dict(top1_drop=1.0, p99=(3.0, 12.0)), Thresholds(max_top1_drop=0.5, max_p99_ms=10))
    assert [r.name for r in res if not r.passed] == ["top1_drop[logits]", "p99_ms[c=4]"]
    with pytest.raises(UsageError, match="the p99 latency limit needs the latency phase"):
        check_thresholds({"accuracy": None, "latency": None}, Thresholds(max_p99_ms=1))


def test_options_and_parsers_reject_bad_values_with_one_line():
    assert parse_url("", "grpc") == "127.0.0.1:8001"
    assert parse_url("http://localhost:8000/", "http") == "localhost:8000"
    assert parse_url("myhost", "http") == "myhost:8000"
    assert parse_concurrency("4,1,2,2") == (1, 2, 4)
    for bad in ("a,b", "0,1", ""):
        with pytest.raises(UsageError):
            parse_concurrency(bad)
    with pytest.raises(UsageError, match="the server URL 'host:99999'"):
        parse_url("host:99999", "grpc")
    with pytest.raises(UsageError, match="the request distribution 'burst'"):
        ValidateOptions(model="m", distribution="burst")
    with pytest.raises(UsageError, match="the most windows per level 2: at least 3"):
        Stability(max_trials=2)
    with pytest.raises(UsageError, match="the stability percentage 0: between 0"):
        Stability(pct=0)
    with pytest.raises(UsageError, match="the request rates '10,-1'"):
        parse_rates("10,-1")
    assert ValidateOptions(model="m", requests=7).stability.requests == 7
    with pytest.raises(UsageError, match="the protocol 'tcp'"):
        ValidateOptions(model="m", protocol="tcp")
    with pytest.raises(UsageError, match="the timeout 0: must be a positive"):
        ValidateOptions(model="m", timeout=0)


def test_report_has_stable_keys_and_files_are_written(tmp_path):
    levels = [{"concurrency": c, "requests": 10, "inferences": 10, "wall_s": 0.1, "throughput": 100.0 * c,
               "client_ms": {"p50": 1.0 * c, "p90": 2.0 * c, "p95": 2.5 * c, "p99": 3.0 * c, "mean": 1.2 * c, "min": 0.5, "max": 4.0 * c},
               "server": {"request_count": 10, "failed_count": 0, "inference_count": 10, "execution_count": 5, "avg_batch": 2.0,
                          "request_ms": 0.8 * c, "queue_ms": 0.1, "compute_input_ms": 0.05, "compute_infer_ms": 0.5,
                          "compute_output_ms": 0.05},
               "overhead_ms": 0.4 * c} for c in (1, 4)]
    report = ValidationReport(
        server={"url": "127.0.0.1:1", "protocol": "grpc", "model": "m", "version": "1"},
        contract={"ok": True, "max_batch_size": 8, "mismatches": []},
        latency={"requests_per_level": 10, "duration_s": None, "warmup": 2, "batch_size": 1, "shared_memory": "none",
                 "levels": levels},
        thresholds=[ThresholdResult("p99_ms[c=4]", 5.0, 12.0, False)],
    )
    paths = report.write(tmp_path / "r")
    data = json.loads(paths["json"].read_text())
    assert list(data) == ["schema", "trtrepo_version", "passed", "failures", "server", "contract", "accuracy", "latency",
                          "speed_vs_reference", "fleet", "detection", "thresholds", "files"]
    # /2 speed_vs_reference, /3 latency measured in windows, /4 fleet (several servers), /5 detection (a detector ensemble)
    assert REPORT_SCHEMA == "trtrepo.validate/5" and data["fleet"] is None and data["detection"] is None
    assert data["schema"] == REPORT_SCHEMA and data["passed"] is False and data["failures"] == ["p99_ms[c=4]"]
    md = paths["markdown"].read_text()
    assert "**FAIL**" in md
    # every Markdown table row has as many cells as its header
    for table in [t for t in md.split("\n\n") if t.startswith("|")]:
        rows = table.strip().splitlines()
        assert len({r.count("|") for r in rows}) == 1, table
    from PIL import Image

    with Image.open(paths["plot"]) as img:
        assert img.format == "PNG" and img.size[0] > 100
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".")]  # no temporary files left


def test_report_summary_lines_are_what_validate_prints():
    """The console summary comes from the report: one line per server pair, per level (totals, then
    each server), the count of stable levels, each threshold; an unstable level is marked."""
    def level(c, stable):
        return {"concurrency": c, "throughput": 100.0 * c, "client_ms": {"p50": 1.0 * c, "p99": 3.0 * c},
                "overhead_ms": None if c == 2 else 0.4, "stable": stable, "windows": [1, 2, 3],
                "spread_pct": {"throughput_pct": 3.2},
                "servers": [{"url": u, "throughput": 50.0 * c, "client_ms": {"p50": 1.0, "p99": 2.0}} for u in ("a:1", "b:1")]}
    report = ValidationReport(
        server={"url": "a:1", "servers": ["a:1", "b:1"], "protocol": "http", "model": "m", "version": "2"},
        contract={"ok": True},
        fleet={"agreement": {"reference_server": "a:1",
                             "outputs": [{"server": "b:1", "output": "logits", "max_abs_diff": 0.0, "identical": True}]}},
        latency={"levels": [level(1, True), level(2, False)], "warnings": ["w"]},
        thresholds=[ThresholdResult("p99_ms[c=2]", 5.0, 6.0, False), ThresholdResult("min_cosine[logits]", 0.99, 0.999, True)])
    assert report.summary_lines() == [
        "model m v2 at a:1, b:1 (http): contract ok",
        "  b:1 vs a:1: logits max abs diff 0 (identical)",
        "  c=1: 2 servers together: 100.0 infer/s, p50 1.00 ms, p99 3.00 ms, client overhead 0.40 ms, "
        "stable over 3 windows (±3.2%)",
        "    a:1: 50.0 infer/s, p50 1.00 ms, p99 2.00 ms",
        "    b:1: 50.0 infer/s, p50 1.00 ms, p99 2.00 ms",
        "  c=2*: 2 servers together: 200.0 infer/s, p50 2.00 ms, p99 6.00 ms, client overhead not computed, "
        "* NOT STABLE after 3 windows (±3.2%)",
        "    a:1: 100.0 infer/s, p50 1.00 ms, p99 2.00 ms",
        "    b:1: 100.0 infer/s, p50 1.00 ms, p99 2.00 ms",
        "  latency: 1 of 2 level(s) stable (the others are not figures to quote: rerun on a quieter machine or raise "
        "--max-trials)",
        "  warning: w",
        "  p99_ms[c=2]: 6 (limit 5) FAILED",
        "  min_cosine[logits]: 0.999 (limit 0.99) ok",
    ]
    assert report.failure_detail() == "p99_ms[c=2] = 6, limit 5"


def _gpu_visible() -> bool:
    try:
        import cuda.bindings.runtime as cudart
    except ImportError:
        return False
    err, count = cudart.cudaGetDeviceCount()
    return int(err) == 0 and bool(count)


def test_cuda_shared_memory_without_a_gpu_is_a_usage_error(run_cli, demo_onnx, tmp_path):
    if _gpu_visible():
        pytest.skip("a CUDA GPU is visible: CUDA shared memory is allowed here")
    r = run_cli("validate", "--url", "127.0.0.1:1", "--model", "demo", "--reference", "demo", "--onnx", demo_onnx,
                "--data", "demo:val", "--shared-memory", "cuda", "--report", tmp_path / "r")
    assert r.exit_code == 2
    assert "--shared-memory cuda" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------------------------
# Real server


@pytest.fixture(scope="module")
def models(tmp_path_factory, demo_onnx):
    """ONNX files: demo FP32, demo INT8 (ONNX Runtime Q/DQ via trtrepo.qdq), demo-text."""
    from trtrepo.export import export_onnx
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import QuantizeRequest, quantize_for_deploy

    d = tmp_path_factory.mktemp("validate-models")
    int8 = quantize_for_deploy(QuantizeRequest.of(demo_onnx, d / "demo_int8.onnx", data="demo:calib", method="minmax",
                                                  options=QuantizeOptions(target="onnxruntime"), weight_rounding="nearest",
                                                  accept_accuracy_loss=True)).path
    text = export_onnx("demo-text", d / "demo_text.onnx").path
    return {"fp32": Path(demo_onnx), "int8": Path(int8), "text": Path(text)}


@pytest.fixture(scope="module")
def server(tmp_path_factory, models, triton_server):
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        pytest.skip("no numpy<2 environment for the Python backend (run scripts/install_tritonserver.sh)")
    repo = tmp_path_factory.mktemp("validate-repo") / "repo"
    opts = ModelOptions(execution_env=str(env))
    add_onnx_model(repo, "demo", models["fp32"], backend="python", options=opts)
    add_onnx_model(repo, "demo_int8", models["int8"], backend="python", options=opts)
    add_onnx_model(repo, "demo_text", models["text"], backend="python", options=opts)
    # A model that cannot load: its model.onnx is not an ONNX file (written by hand: trtrepo refuses
    # to add a model its runtime does not load).
    add_onnx_model(repo, "broken", models["fp32"], backend="python", options=opts)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    return triton_server(repo, extra_args=("--exit-on-error=false", "--strict-readiness=false"))


def _validate(run_cli, server, tmp_path, *args, protocol="grpc"):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    report = tmp_path / f"report-{protocol}"
    t0 = time.monotonic()
    # The reference-speed comparison has its own tests (test_validate_speed.py); a later
    # --reference-speed in args turns it back on.
    r = run_cli("validate", "--url", url, "--protocol", protocol, "--report", report, "--no-progress",
                "--no-reference-speed", *args)
    elapsed = time.monotonic() - t0
    data = json.loads((report / "validate.json").read_text()) if (report / "validate.json").is_file() else None
    return r, data, elapsed


def _check_latency(data, requests):
    levels = data["latency"]["levels"]
    for lv in levels:
        c = lv["client_ms"]
        assert 0 < c["min"] <= c["p50"] <= c["p90"] <= c["p95"] <= c["p99"] <= c["max"]
        assert c["mean"] > 0 and lv["throughput"] > 0
        # count windows of at least `requests` requests, each ending where the server's count stands:
        # the last three merged are reported
        assert lv["requests"] >= 3 * requests and all(w["requests"] >= requests for w in lv["windows"])
        assert 3 <= len(lv["windows"]) <= 10
        # The server's figures are those of the reported requests (issue 41): the same count.
        assert lv["server"]["request_count"] == lv["server_requests"] == lv["client_requests"] == lv["requests"]
        assert lv["completed"] >= sum(w["requests"] for w in lv["windows"])
        assert lv["server"]["request_ms"] > 0 and lv["overhead_ms"] is not None and lv["overhead_ms"] >= 0, \
            (lv["overhead_note"], c["mean"], lv["server"])
    return {lv["concurrency"]: lv for lv in levels}




@pytest.mark.triton
def test_fp32_over_grpc_agrees_fully_and_batching_raises_throughput(run_cli, server, models, tmp_path):
    r, data, _ = _validate(run_cli, server, tmp_path, "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                           "--data", "demo:val", "--limit", "200", "--concurrency", "1,4", "--requests", "150",
                           "--max-top1-drop", "0", "--min-cosine", "0.99999")
    assert r.exit_code == 0, r.output
    assert data["passed"] and data["contract"]["ok"]
    m = data["accuracy"]["outputs"]["logits"]
    assert m["top1_agreement"] == 1.0 and m["samples"] == 200
    assert m["max_abs_error"] < 1e-4
    assert data["accuracy"]["worst_samples"]["logits"]
    by_c = _check_latency(data, 150)
    assert by_c[4]["server"]["avg_batch"] > 1.0  # dynamic batching merged requests
    md = (tmp_path / "report-grpc" / "validate.md").read_text()
    assert "PASSED" in md and (tmp_path / "report-grpc" / "latency.png").stat().st_size > 1000


@pytest.mark.triton
def test_fp32_over_http_with_system_shared_memory(run_cli, server, models, tmp_path):
    r, data, _ = _validate(run_cli, server, tmp_path, "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                           "--data", "demo:val", "--limit", "100", "--batch-size", "4", "--concurrency", "2",
                           "--requests", "60", "--shared-memory", "system", "--max-top1-drop", "0", protocol="http")
    assert r.exit_code == 0, r.output
    assert data["accuracy"]["outputs"]["logits"]["top1_agreement"] == 1.0
    _check_latency(data, 60)
    assert data["server"]["protocol"] == "http" and data["latency"]["shared_memory"] == "system"


@pytest.mark.triton
def test_int8_within_bound_and_thresholds_flip_the_exit_code(run_cli, server, models, tmp_path):
    common = ("--model", "demo_int8", "--reference", "demo", "--onnx", models["fp32"], "--data", "demo:val",
              "--concurrency", "1", "--requests", "40", "--warmup", "5")
    r, data, _ = _validate(run_cli, server, tmp_path, *common, "--max-top1-drop", "1.0")
    assert r.exit_code == 0, r.output
    m = data["accuracy"]["outputs"]["logits"]
    assert m["top1_drop_points"] <= 1.0 and m["top1_agreement"] >= 0.98
    assert m["max_abs_error"] > 0  # really the quantized model
    # The same run with limits it cannot meet: exit 1, the failing thresholds named, report written.
    r, data, _ = _validate(run_cli, server, tmp_path, *common, "--max-p99-ms", "0.001", "--min-cosine", "1.0")
    assert r.exit_code == 1
    assert "p99_ms[c=1]" in r.stderr and "cosine[logits]" in r.stderr
    assert data["passed"] is False and set(data["failures"]) == {"p99_ms[c=1]", "cosine[logits]"}


@pytest.mark.triton
def test_variable_length_multi_input_model(run_cli, server, models, tmp_path):
    r, data, _ = _validate(run_cli, server, tmp_path, "--model", "demo_text", "--reference", "demo-text", "--onnx",
                           models["text"], "--data", "demo-text:val", "--batch-size", "8", "--concurrency", "1,4",
                           "--requests", "60", "--max-top1-drop", "0", "--min-cosine", "0.9999")
    assert r.exit_code == 0, r.output
    assert set(data["accuracy"]["outputs"]) == {"logits", "embedding"}
    assert data["accuracy"]["label_output"] == "logits"
    assert data["accuracy"]["outputs"]["logits"]["top1_agreement"] == 1.0
    assert data["accuracy"]["outputs"]["embedding"]["top1_agreement"] is None  # only the label output is a classifier
    assert data["accuracy"]["samples"] == 512
    _check_latency(data, 60)


@pytest.mark.triton
def test_io_mismatch_is_reported_field_by_field_before_traffic(run_cli, server, models, tmp_path):
    r, data, _ = _validate(run_cli, server, tmp_path, "--model", "demo_text", "--reference", "demo", "--onnx", models["fp32"],
                           "--data", "demo:val", "--requests", "10")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: contract:") and len(r.stderr.strip().splitlines()) == 1
    assert "input 'input'" in r.stderr and "output 'logits' shape" in r.stderr
    assert data["contract"]["ok"] is False and data["accuracy"] is None and data["latency"] is None
    fields = {m["field"] for m in data["contract"]["mismatches"]}
    assert {"input 'input'", "input 'input_ids'", "output 'embedding'"} <= fields


@pytest.mark.triton
def test_server_not_running_fails_fast_with_exit_2(run_cli, models, tmp_path):
    from trtrepo.server import free_port

    port = free_port()
    t0 = time.monotonic()
    r = run_cli("validate", "--url", f"127.0.0.1:{port}", "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                "--data", "demo:val", "--ready-timeout", "1.5", "--report", tmp_path / "r")
    assert r.exit_code == 2
    assert f"cannot reach Triton at 127.0.0.1:{port}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "r" / "validate.json").exists()


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_wrong_model_name_lists_the_served_models(run_cli, server, models, tmp_path, protocol):
    r, _, elapsed = _validate(run_cli, server, tmp_path, "--model", "demo_nope", "--reference", "demo", "--onnx",
                              models["fp32"], "--data", "demo:val", protocol=protocol)
    assert r.exit_code == 2
    assert "model 'demo_nope' is not in the repository" in r.stderr and "demo_int8" in r.stderr
    assert elapsed < 20  # no waiting for the ready timeout


@pytest.mark.triton
def test_model_that_failed_to_load_is_not_ready(run_cli, server, models, tmp_path):
    r, _, elapsed = _validate(run_cli, server, tmp_path, "--model", "broken", "--reference", "demo", "--onnx", models["fp32"],
                              "--data", "demo:val", "--ready-timeout", "20")
    assert r.exit_code == 1
    assert "model 'broken' failed to load" in r.stderr and "UNAVAILABLE" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert elapsed < 20


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_request_timeout_is_reported_and_nothing_hangs(run_cli, server, models, tmp_path, protocol):
    r, _, elapsed = _validate(run_cli, server, tmp_path, "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                              "--data", "demo:val", "--limit", "64", "--batch-size", "32", "--timeout", "0.0005",
                              "--concurrency", "4", "--requests", "20", protocol=protocol)
    assert r.exit_code == 1
    assert "timed out after 0.0005s (--timeout)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert elapsed < 30
    # The server is still healthy afterwards.
    r, data, _ = _validate(run_cli, server, tmp_path, "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                           "--data", "demo:val", "--limit", "32", "--no-latency", protocol=protocol)
    assert r.exit_code == 0 and data["accuracy"]["outputs"]["logits"]["top1_agreement"] == 1.0


@pytest.mark.triton
def test_python_api_mirrors_the_command(server, models):
    from trtrepo.data import DataOptions
    from trtrepo.validate import ReferenceSource, validate

    opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(2,), stability=Stability(interval_s=0.5),
                           warmup=2, progress=False, speed=None)
    report = validate(opts, reference=ReferenceSource("demo", onnx=models["fp32"]), data=DataOptions("demo:val", limit=50),
                      thresholds=Thresholds(max_top1_drop=0.0))
    assert report.passed and report.server["version"] == "1" and report.server["dynamic_batching"] is True
    level = report.latency["levels"][0]
    # the figures are those of the last 3 windows, the server's for the same requests (issue 41)
    assert level["requests"] > 0 and level["server"]["request_count"] == level["requests"] <= level["completed"]
    # a window ends at the last answer the server counted, which came at most a request's time
    # before the window's 0.5 s were up: 3 windows span a little under 1.5 s at least
    assert len(level["windows"]) >= 3 and 1.5 - 0.1 <= level["wall_s"] < 1.5 + 1


@pytest.mark.long
@pytest.mark.triton
def test_dynamic_batching_forms_batches_at_concurrency_4_and_keeps_throughput(server, models):
    """Side by side on the shared machine, the levels alternating for 5 rounds: at concurrency 4
    the server executes batches (Triton's statistics: more inferences than executions), at 1 it
    cannot, and throughput at 4 keeps at least 0.8x that at 1 (medians). Whether batching also
    raises the demo's throughput depends on the machine: with the client and the server on one
    Zen 3 core (2026-11-26) the medians were 439 against 477 infer/s in one run and higher at 4 in
    the next; where the cores are free, validate's own runs show the gain (docs/benchmarks.md)."""
    from trtrepo.data import open_data
    from trtrepo.validate import TritonTarget, make_payloads, run_latency

    io = ModelIO.from_onnx(models["fp32"])
    payloads, _ = make_payloads(open_data("demo:val", io=io, limit=100), io, 1)
    thr: dict[int, list[float]] = {1: [], 4: []}
    batch: dict[int, list[float]] = {1: [], 4: []}
    with TritonTarget(ValidateOptions(model="demo", url=server.grpc_url, requests=300, warmup=20, progress=False)) as t:
        t.wait_ready()
        t.prepare(io)
        for _ in range(5):
            for c in (1, 4):
                opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(c,), requests=300, warmup=20,
                                       progress=False)
                level = run_latency(t, payloads, opts, "1")["levels"][0]
                thr[c].append(level["throughput"])
                batch[c].append(level["server"]["avg_batch"])
    assert all(b == 1.0 for b in batch[1]) and all(b > 1.2 for b in batch[4]), batch
    assert np.median(thr[4]) >= 0.8 * np.median(thr[1]), thr


def _plain_threads(url: str, feeds, concurrency: int, t_mid: float, t_end: float, counts, model: str = "demo",
                   output: str = "logits") -> None:
    import threading

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    def loop(k: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        i = k
        while time.time() < t_end:
            feed = feeds[i % len(feeds)]
            inputs = []
            for name, arr in feed.items():
                x = grpcclient.InferInput(name, list(arr.shape), np_to_triton_dtype(arr.dtype))
                x.set_data_from_numpy(arr)
                inputs.append(x)
            batch = next(iter(feed.values())).shape[0]
            out = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(output)]).as_numpy(output)
            assert out.shape[0] == batch
            if t_mid <= time.time() < t_end:
                counts[k] += batch
            i += concurrency
        client.close()

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _plain_process(url: str, feeds, concurrency: int, t_mid: float, t_end: float, queue, model: str, output: str) -> None:
    counts = [0] * concurrency
    _plain_threads(url, feeds, concurrency, t_mid, t_end, counts, model, output)
    queue.put(sum(counts))


def _plain_client_loop(url: str, payloads, concurrency: int, seconds: float, model: str = "demo",
                       output: str = "logits", processes: int | None = None) -> float:
    """An independent load generator, written plainly: `concurrency` threads, each with its own
    synchronous tritonclient gRPC client, sending requests back to back for `seconds` and reading
    each response as numpy (as validate does); returns inferences per second counted over the
    second half. Above 4 requests in flight the threads are spread over 4 processes, so that
    Python's GIL does not make the generator itself the bottleneck (``processes`` overrides)."""
    import multiprocessing

    feeds = [dict(p.inputs) for p in payloads]
    procs = processes or (1 if concurrency <= 4 else 4)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    start = time.time() + (0.0 if procs == 1 else 3.0)  # spawned processes import first
    t_mid, t_end = start + seconds / 2, start + seconds
    if procs == 1:
        counts = [0] * concurrency
        _plain_threads(url, feeds, concurrency, t_mid, t_end, counts, model, output)
        return sum(counts) / (t_end - t_mid)
    workers = [ctx.Process(target=_plain_process, args=(url, feeds, concurrency // procs, t_mid, t_end, queue, model,
                                                        output)) for _ in range(procs)]
    for w in workers:
        w.start()
    total = sum(queue.get(timeout=seconds + 60) for _ in workers)
    for w in workers:
        w.join(10)
    return total / (t_end - t_mid)


ROUNDS = 2  # back-to-back rounds per level; the test holds the median ratio (the mean of two)


@pytest.mark.long
@pytest.mark.triton
def test_latency_figures_agree_with_an_independent_client(server, models):
    """Issue 17: validate's figures against a plainly written synchronous client on the same
    server, each level measured by both, back to back, for two rounds. On the demo's ~1 ms
    requests these 2-core VMs drift by 2-66% from minute to minute, for both clients (Intel: with
    20-37% hypervisor steal; AMD EPYC: with none), and at c=16 the synchronous client reads
    1.13-1.21x less than validate's asyncio one in 1, 2 or 4 processes alike (median ratios
    0.80-0.99 / 0.98-1.08 / 1.13-1.31 at c=1/4/16, four runs of five rounds,
    bench/measurement.py and fe27e6f:bench/independent_layout.py). So the test holds the ratio of the round
    closest to 1 to 0.67-1.5 at c=1 and 4: a counting or windowing error (a factor of 2 or more)
    is in every round and every level and breaks it there. At c=16 the 16 threads of the
    synchronous client on one core are the weaker side when the other test worker is busy (on a
    Zen 3, 2026-11-26, rounds of 1.17 and 1.89, 1.11 and 2.25, 0.97 and 4.25, 1.92 and 2.07; on an
    Intel Xeon beside the YOLO11n tests, 2026-11-29, 4.87 and 4.87 in the CI run of df298d3):
    there only the lower bound 0.67 holds (validate must not read less than a plain client; a
    factor too many fails c=1 and 4 already). The 10% agreement is measured by the benches
    (docs/benchmarks.md)."""
    from trtrepo.data import open_data
    from trtrepo.validate import TritonTarget, make_payloads, run_latency

    io = ModelIO.from_onnx(models["fp32"])
    payloads, _ = make_payloads(open_data("demo:val", io=io, limit=64), io, 1)
    levels = (1, 4, 16)
    ours: dict[int, list[float]] = {c: [] for c in levels}
    plain: dict[int, list[float]] = {c: [] for c in levels}
    with TritonTarget(ValidateOptions(model="demo", url=server.grpc_url, progress=False, speed=None)) as t:
        t.wait_ready()
        t.prepare(io)
        for _ in range(ROUNDS):
            for c in levels:
                opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(c,), warmup=20, progress=False,
                                       stability=Stability(interval_s=0.5), speed=None)
                level = run_latency(t, payloads, opts, "1")["levels"][0]
                assert 3 <= len(level["windows"]) <= 10
                assert level["server"]["request_count"] == level["requests"]
                ours[c].append(level["throughput"])
                plain[c].append(_plain_client_loop(server.grpc_url, payloads, c, 2.0))
    for c in levels:
        ratio = min((a / b for a, b in zip(ours[c], plain[c], strict=True)), key=lambda r: abs(np.log(r)))
        assert 0.67 <= ratio <= (np.inf if c == 16 else 1.5), (c, ours[c], plain[c])


@pytest.mark.triton
def test_request_rate_mode_holds_the_rate_and_writes_perf_analyzer_csv(run_cli, server, models, tmp_path):
    csv_path = tmp_path / "rate.csv"
    r = run_cli("validate", "--url", server.grpc_url, "--model", "demo", "--reference", "demo", "--onnx", models["fp32"],
                "--data", "demo:val", "--limit", "32", "--no-reference-speed", "--request-rate", "40,80",
                "--request-distribution", "poisson", "--measurement-interval", "1", "--stability-percentage", "25",
                "--percentiles", "75", "--csv", csv_path, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    lat = data["latency"]
    assert lat["mode"] == "request_rate" and lat["distribution"] == "poisson"
    for lv, rate in zip(lat["levels"], (40.0, 80.0), strict=True):
        assert lv["request_rate"] == rate and lv["concurrency"] is None
        # an open loop sends at the rate whatever the answers do: the demo keeps up with 80/s
        assert 0.8 * rate <= lv["throughput"] <= 1.2 * rate, lv["throughput"]
        assert set(lv["client_ms"]) >= {"p50", "p75", "p99", "mean"} and lv["sent"] >= lv["completed"] > 0
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("Request Rate,Inferences/Second,") and rows[1].startswith("40,")


@pytest.mark.triton
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_both_transports_keep_the_budget_and_raise_a_failure_of_the_open_loop_schedule(server, models, protocol):
    """validate.load's schedules over each transport (gRPC callbacks and asyncio HTTP): a budget of
    3 requests at concurrency 8 sends 3, kept in request order; a schedule that cannot draw its
    send times fails the level with the schedule's own error (it once left the gRPC level without
    requests instead)."""
    from trtrepo.data import open_data
    from trtrepo.validate import TritonTarget, make_payloads

    io = ModelIO.from_onnx(models["fp32"])
    payloads, _ = make_payloads(open_data("demo:val", io=io, limit=8), io, 1)
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with TritonTarget(ValidateOptions(model="demo", url=url, protocol=protocol, progress=False, speed=None)) as t:
        t.wait_ready()
        t.prepare(io)
        res = t.load(payloads, 8, requests=3, keep=True)
        assert res.requests == 3 and sorted(res.outputs) == [0, 1, 2]
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="the request distribution 'uniform': one of constant, poisson"):
            t.measure(payloads, Stability(interval_s=0.5), rate=50.0, distribution="uniform")
        assert time.monotonic() - t0 < 5


@pytest.mark.triton
def test_shared_memory_is_compared_with_none_and_a_slower_one_is_named(server, models):
    from trtrepo.data import open_data
    from trtrepo.validate import TritonTarget, make_payloads, run_latency

    io = ModelIO.from_onnx(models["fp32"])
    payloads, _ = make_payloads(open_data("demo:val", io=io, limit=16), io, 1)
    opts = ValidateOptions(model="demo", url=server.grpc_url, concurrency=(2,), shared_memory="system", warmup=5,
                           progress=False, stability=Stability(interval_s=0.5), speed=None)
    with TritonTarget(opts) as t:
        t.wait_ready()
        t.prepare(io)
        lat = run_latency(t, payloads, opts, "1")
    cmp_ = lat["shared_memory_comparison"]
    assert cmp_["level"] == "concurrency 2" and cmp_["without"] > 0 and cmp_["with_shared_memory"] > 0
    slower = cmp_["without"] > cmp_["with_shared_memory"] * 1.1
    assert any("shared memory made it slower" in w for w in lat["warnings"]) == slower


@pytest.mark.parametrize("terms,verdict", [
    ([0.05] * 60 + [0.0] * 940, "pass"),  # 6 % near-tie flips cost 0.3 points: under 1 with 95 % confidence
    ([0.9] * 20 + [0.0] * 980, "fail"),  # 2 % confident flips: 1.8 points
    ([0.33] + [0.0] * 50, "undecided"),  # one flip costing 0.33 in 51: 0.65 points, its interval reaches over 1
])
def test_max_top1_drop_without_labels_is_quantizes_expected_drop(terms, verdict):
    """Issue 40: without labels ``--max-top1-drop`` judges the expected top-1 drop under the
    reference's softmax exactly as quantize's gate does (one implementation): the value is the
    upper end of its 95 % interval; too few samples to decide fail and say how many would."""
    import dataclasses

    from trtrepo.evaluate import ExpectedDrop, OutputMetrics
    from trtrepo.quantize import AccuracyCheck

    ed = ExpectedDrop.of(np.asarray(terms), 0.9)
    m = OutputMetrics("logits", len(terms), 0.1, 0.01, 0.999, 0.99, top1_agreement=0.9, expected_drop=ed)
    report = {"accuracy": {"label_output": "logits", "outputs": {"logits": {
        **m.to_dict(), "top1_drop_points": m.top1_drop_points}}}, "latency": None}
    (res,) = check_thresholds(report, Thresholds(max_top1_drop=1.0))
    gate = AccuracyCheck().judge(m)
    assert res.passed == gate["ok"] == (verdict == "pass") and ed.verdict(1.0) == verdict
    assert res.value == pytest.approx(100 * ed.upper) and "expected top-1 drop" in res.detail
    assert ExpectedDrop.from_dict(dataclasses.asdict(ed)) == ed
    if verdict == "undecided":
        assert f"cannot decide on 51 samples, about {gate['samples_to_decide']} would decide" in res.detail


def test_max_top1_drop_on_metrics_without_the_expected_drop_is_the_disagreement():
    report = {"accuracy": {"label_output": "logits", "outputs": {"logits": {
        "top1_drop_points": 2.0, "accuracy_drop_points": None, "cosine_mean": 0.999}}}, "latency": None}
    (res,) = check_thresholds(report, Thresholds(max_top1_drop=1.0))
    assert not res.passed and res.value == 2.0 and "disagreement" in res.detail


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_refused_connection_ends_the_default_wait_with_the_serve_hint(run_cli, demo_onnx, tmp_path, protocol):
    """Issue 27: nothing listens on the port: exit 2 after the short grace, not the 30 s ready
    timeout, and the message says how to start a server."""
    from trtrepo.server import free_port
    from trtrepo.validate.options import REFUSED_GRACE_S

    port = free_port()
    t0 = time.monotonic()
    r = run_cli("validate", "--url", f"127.0.0.1:{port}", "--protocol", protocol, "--model", "demo", "--reference", "demo",
                "--onnx", demo_onnx, "--data", "demo:val", "--limit", "8", "--report", tmp_path / "r")
    took = time.monotonic() - t0
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (f"error: cannot reach Triton at 127.0.0.1:{port} ({protocol}): connection refused "
                                "(nothing listens there); start one with: trtrepo serve REPO")
    assert REFUSED_GRACE_S <= took < 20  # the ready timeout's default is 30 s
    assert not (tmp_path / "r" / "validate.json").exists()
