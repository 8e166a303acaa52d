"""Extension points with one owner (issue 14): a calibration method is one registry entry.

A new method registered with :func:`trtrepo.histogram.register` -- and nothing else -- must be
offered by ``calibrate``, ``quantize`` and ``deploy``, compute ranges, name its TensorRT cache
algorithm, and take part in ``--method auto``. The CLI runs in a child interpreter that registers
the method first (as a plug-in module would) and then calls the real ``trtrepo`` entry point.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trtrepo import histogram as H

PRELUDE = textwrap.dedent("""
    import sys
    from trtrepo import histogram as H
    # the one registration: amax = the 90th percentile (clips far more than any shipped method)
    H.register(H.CalibrationMethod("p90", lambda c, e, m, **o: H.amax_percentile(c, e, 90.0),
                                   cache_algorithm="MinMaxCalibration", help="90th percentile of |x|"))
    from trtrepo.cli import main
    main()
""")


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PRELUDE, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_registry_is_what_compute_amax_dispatches_to() -> None:
    rng = np.random.default_rng(0)
    x = rng.laplace(size=100_000)
    m = float(np.abs(x).max())
    counts = H.accumulate(np.zeros(2048, np.int64), x, m)
    edges = H.histogram_edges(m, 2048)
    assert H.method_names() == tuple(H.METHODS) == ("entropy", "minmax", "percentile", "mse")
    assert H.method_names(auto=True)[-1] == "auto"
    assert H.compute_amax("minmax", counts, edges, m) == m
    assert H.compute_amax("percentile", counts, edges, m, percentile=50.0) < H.compute_amax("percentile", counts, edges, m)
    with pytest.raises(ValueError, match="unknown calibration method 'nope'"):
        H.compute_amax("nope", counts, edges, m)
    with pytest.raises(ValueError, match="already registered"):
        H.register(H.CalibrationMethod("minmax", lambda c, e, m, **o: m))


def test_new_method_is_one_registration(tmp_path: Path, demo_onnx: Path) -> None:
    helps = {c: _cli(tmp_path, c, "--help").stdout for c in ("calibrate", "quantize", "deploy")}
    for command, text in helps.items():
        assert "p90" in text, f"{command} --help does not offer the registered method"

    # calibrate --method p90: ranges computed by the new method, its cache algorithm in the header
    proc = _cli(tmp_path, "calibrate", str(demo_onnx), "--data", "demo:calib", "--limit", "256", "--method", "p90",
                "--ranges", "p90.json", "--cache", "p90.cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ref = _cli(tmp_path, "calibrate", str(demo_onnx), "--data", "demo:calib", "--limit", "256", "--method", "minmax",
               "--ranges", "minmax.json")
    assert ref.returncode == 0, ref.stderr[-2000:]
    ours = json.loads((tmp_path / "p90.json").read_text())
    theirs = json.loads((tmp_path / "minmax.json").read_text())
    assert ours["method"] == "p90"
    tensors, other = ours["tensors"], theirs["tensors"]
    assert set(tensors) == set(other)
    smaller = [t for t in tensors if tensors[t]["amax"] < other[t]["amax"]]
    assert len(smaller) >= len(tensors) // 2, "a 90th-percentile range should clip most tensors"
    assert all(t["histogram"]["clipped_fraction"] > 0 for t in tensors.values() if t["amax"] < t["histogram"]["max_abs"])
    assert (tmp_path / "p90.cache").read_text().splitlines()[0].endswith("MinMaxCalibration")

    # quantize --method auto tries it beside the shipped ones (and reports each on held-out data)
    proc = _cli(tmp_path, "quantize", str(demo_onnx), "--data", "demo:calib", "--limit", "256", "--target",
                "onnxruntime", "-o", "q.onnx", "--report", "rep")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "rep" / "quantize.json").read_text())
    tried = [m["label"] for m in report["methods"]]
    assert tried == [*H.METHODS, "p90"]
    assert "p90" in proc.stdout
