"""bench/estimator.py (issue 40 item 2, docs/benchmarks.md "Issue 40: the expected-drop estimator
against real label drops") runs on a tiny subset: the demo with two INT8 variants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import estimator  # noqa: E402  # bench/estimator.py


def test_fit_temperature_recovers_the_temperature_that_made_the_labels():
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, size=(4000, 10))
    p = estimator.softmax(logits / 2.0)
    labels = np.array([rng.choice(10, p=row) for row in p])
    assert abs(estimator.fit_temperature(logits, labels) - 2.0) < 0.2
    assert estimator.ece(logits / 2.0, labels) < estimator.ece(logits, labels)


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_estimator_bench_runs_on_the_demo_with_two_variants(tmp_path):
    out = tmp_path / "estimator.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "estimator.py"), "--work", str(tmp_path / "work"),
                           "--out", str(out), "--models", "demo", "--variants", "minmax", "ranges x0.3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "## Issue 40: the expected-drop estimator against real label drops" in proc.stdout
    model = json.loads(out.read_text())["models"][0]
    assert model["name"] == "demo" and model["test_samples"] == 597
    rows = {r["variant"]: r for r in model["variants"]}
    assert set(rows) == {"minmax", "ranges x0.3"}
    clipped = rows["ranges x0.3"]
    assert clipped["real"] > 1.0 and clipped["lower"] <= clipped["real"] <= clipped["upper"]
