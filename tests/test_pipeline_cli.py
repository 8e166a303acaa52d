"""Issue 15 item 6: a CLI that fits pipelines -- status lines per deploy stage, -v/-q on every
command (before or after it), --json summaries on stdout, validate's CSV and optional --report,
evaluate's thresholds, and a quiet exit when the reader of stdout goes away."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import requires_tritonserver


def trtrepo(*args: object, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess[str]:
    """The real console entry (stdout/stderr are pipes, not a terminal)."""
    return subprocess.run([sys.executable, "-m", "trtrepo.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=600, **kw)


@pytest.mark.slow
def test_deploy_prints_a_status_line_per_stage_with_v_and_nothing_with_q(tmp_path, demo_onnx):
    common = [demo_onnx, "--data", "demo:calib", "--limit", "128", "--backend", "python", "--method", "minmax",
              "--weight-rounding", "nearest"]  # the status lines are the subject: the fastest INT8 step
    res = trtrepo("deploy", *common, "--repo", tmp_path / "r1", "-v")
    assert res.returncode == 0, res.stderr
    for i, step in enumerate(("export", "int8", "build", "repository"), start=1):
        assert f"[{i}/4] {step} ..." in res.stderr
        assert any(line.startswith(f"[{i}/4] {step} ") and " in " in line for line in res.stderr.splitlines())
    fp32 = [demo_onnx, "--backend", "python", "--precision", "fp32"]  # the same four stages, no INT8 work
    quiet = trtrepo("-q", "deploy", *fp32, "--repo", tmp_path / "r2")
    after = trtrepo("deploy", *fp32, "--repo", tmp_path / "r3", "--quiet")
    for r in (quiet, after):
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert "demo" in r.stdout  # the results still print
    plain = trtrepo("deploy", *fp32, "--repo", tmp_path / "r4")  # not a terminal: no status lines by default
    assert plain.returncode == 0 and "[1/4]" not in plain.stderr
    both = trtrepo("deploy", *common, "--repo", tmp_path / "r5", "-v", "-q")
    assert both.returncode == 2 and "-v and -q exclude each other" in both.stderr


def test_every_command_takes_v_and_q_after_its_name(run_cli):
    from trtrepo.cli import COMMANDS

    for name in COMMANDS:
        res = run_cli(name, "--help")
        if "Usage:" in res.output and "Commands:" not in res.output:
            assert "-q, --quiet" in res.output and "-v, --verbose" in res.output, name
    res = run_cli("repo", "add", "--help")
    assert "-q, --quiet" in res.output


def test_json_summaries_of_calibrate_quantize_evaluate_and_deploy(tmp_path, demo_onnx):
    res = trtrepo("calibrate", demo_onnx, "--data", "demo:calib", "--limit", "64", "--ranges", tmp_path / "r.json", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    ranges = json.loads((tmp_path / "r.json").read_text())["tensors"]
    assert summary["samples"] == 64 and summary["written"] == [str(tmp_path / "r.json")]
    assert summary["amax"] == {k: v["amax"] for k, v in ranges.items()}
    assert "calibrated" in res.stderr  # the human line went to stderr

    res = trtrepo("quantize", demo_onnx, "--ranges", tmp_path / "r.json", "-o", tmp_path / "q.onnx", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["output"] == str(tmp_path / "q.onnx") and (tmp_path / "q.onnx").is_file()
    from trtrepo.modelio import qdq_counts

    assert summary["activations"] > 0 and sum(qdq_counts(tmp_path / "q.onnx")) > 0

    res = trtrepo("evaluate", demo_onnx, tmp_path / "q.onnx", "--data", "demo:val", "--limit", "64", "--json",
                  "--max-top1-drop", "100")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["passed"] is True and summary["thresholds"][0]["name"] == "top1_drop[logits]"
    res = trtrepo("evaluate", demo_onnx, tmp_path / "q.onnx", "--data", "demo:val", "--limit", "64", "--json",
                  "--min-cosine", "0.99999999")
    assert res.returncode == 1 and "evaluation failed: cosine[logits]" in res.stderr
    summary = json.loads(res.stdout)  # the summary is still printed
    assert summary["passed"] is False
    cos = summary["outputs"]["logits"]["cosine_mean"]
    assert summary["thresholds"][0]["value"] == pytest.approx(cos)

    res = trtrepo("deploy", demo_onnx, "--repo", tmp_path / "repo", "--backend", "python", "--precision", "fp32", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["precision"] == "fp32" and [s["step"] for s in summary["steps"]] == ["export", "int8", "build",
                                                                                       "repository"]
    assert Path(summary["models"][0]["path"]).is_dir()


def test_a_closed_pipe_ends_the_run_quietly(tmp_path, demo_onnx):
    """`trtrepo calibrate ... | head -1` ended with 'error: BrokenPipeError' and exit 1."""
    cmd = (f"set -o pipefail; {sys.executable} -m trtrepo.cli calibrate {demo_onnx} --data demo:calib --limit 32 "
           f"--no-progress | head -1")
    res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("calibrated") and res.stdout.count("\n") == 1
    assert res.stderr == ""


@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_validate_without_report_with_csv_and_json(tmp_path, run_cli, triton_server):
    from trtrepo.validate.report import PERF_ANALYZER_COLUMNS, VERDICT_COLUMNS

    repo = tmp_path / "repo"
    assert run_cli("deploy", "--repo", repo, "--backend", "python", "--precision", "fp32").exit_code == 0
    server = triton_server(repo)
    res = trtrepo("validate", "--url", server.grpc_url, "--model", "demo", "--reference", "demo", "--data", "demo:val",
                  "--limit", "32", "--concurrency", "1,2", "--requests", "20", "--no-reference-speed", "--csv",
                  tmp_path / "lat.csv", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["passed"] is True and summary["files"] == {}  # no --report: nothing else written
    m = summary["accuracy"]["outputs"]["logits"]  # demo:val has labels: the console gives both accuracies
    assert (f"logits: label accuracy {100 * m['reference_accuracy']:.2f}% (reference) -> "
            f"{100 * m['candidate_accuracy']:.2f}% (served), top-1 agreement") in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lat.csv", "repo"]
    with open(tmp_path / "lat.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == PERF_ANALYZER_COLUMNS + VERDICT_COLUMNS and [int(r["Concurrency"]) for r in rows] == [1, 2]
    assert [r["Stable"] for r in rows] == ["yes" if lv["stable"] else "no" for lv in summary["latency"]["levels"]]
    levels = summary["latency"]["levels"]
    for row, level in zip(rows, levels, strict=True):
        assert int(row["p99 latency"]) == round(level["client_ms"]["p99"] * 1000)
        assert float(row["Inferences/Second"]) == pytest.approx(level["throughput"], abs=0.01)
    res = trtrepo("validate", "--url", server.grpc_url, "--model", "demo", "--reference", "demo", "--data", "demo:val",
                  "--no-latency", "--csv", tmp_path / "x.csv")
    assert res.returncode == 2 and "--csv writes the latency table" in res.stderr


def test_status_lines_follow_the_environment_not_stdout(tmp_path, demo_onnx):
    """-v status lines go to stderr: stdout keeps the results alone (what a pipe reads)."""
    res = trtrepo("deploy", demo_onnx, "--repo", tmp_path / "r", "--backend", "python", "--precision", "fp32", "-v",
                  env={**os.environ})
    assert res.returncode == 0 and "[1/4]" not in res.stdout and "[1/4]" in res.stderr
