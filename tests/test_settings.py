"""Issue 42 item 1: the INT8 request is declared once. A new INT8 knob is a field of
:class:`~trtrepo.quantize.QuantizeSettings` and an option of the ``@quantize_options`` group --
two files -- and both ``trtrepo quantize`` and ``trtrepo deploy`` take it and hand it to the
quantize stage (``QuantizeRequest.int8``), with nothing else touched.

Proved the way tests/test_registries.py proves a backend: a copy of the package with exactly those
two files edited, run by a child interpreter through the real CLI, the stage's entry replaced by a
probe that prints what it received."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from trtrepo.commands._options import build_settings
from trtrepo.qdq import QDQ_TARGETS, QuantizeOptions
from trtrepo.quantize import QuantizeSettings

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
import trtrepo.quantize.run as run

def probe(req):
    print("KNOB", req.int8.example_knob, req.int8.placement.target.name, req.int8.method, flush=True)
    raise SystemExit(0)

run._quantize_request = probe
from trtrepo.cli import cli
cli(sys.argv[1:])
"""


def _copy_with_knob(dest: Path) -> list[str]:
    """The package copied to ``dest`` with the knob added; the files that differ from the original."""
    pkg = dest / "trtrepo"
    shutil.copytree(ROOT / "trtrepo", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    settings = pkg / "quantize" / "settings.py"
    text = settings.read_text()
    anchor = "    metric_output: str | None = None\n"
    assert text.count(anchor) == 1
    settings.write_text(text.replace(anchor, anchor + "    example_knob: int = 0\n"))
    options = pkg / "commands" / "_options.py"
    text = options.read_text()
    anchor = '        click.option("--method", '
    assert text.count(anchor) == 1  # the group's first option
    options.write_text(text.replace(anchor, '        click.option("--example-knob", type=int, default=0),\n' + anchor))
    return sorted(str(p.relative_to(dest)) for p in pkg.rglob("*.py")
                  if p.read_bytes() != (ROOT / p.relative_to(dest)).read_bytes())


def test_a_new_int8_knob_touches_two_files_and_reaches_the_stage_from_both_commands(tmp_path, demo_onnx):
    changed = _copy_with_knob(tmp_path)
    assert changed == ["trtrepo/commands/_options.py", "trtrepo/quantize/settings.py"]
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    runs = {
        "quantize": ["quantize", str(demo_onnx), "-o", str(tmp_path / "q.onnx"), "--data", "demo:calib",
                     "--limit", "64", "--example-knob", "7", "--method", "minmax"],
        "deploy": ["deploy", str(demo_onnx), "--repo", str(tmp_path / "repo"), "--backend", "onnxruntime",
                   "--data", "demo:calib", "--limit", "64", "--example-knob", "7", "--method", "minmax"],
    }
    for command, argv in runs.items():
        r = subprocess.run([sys.executable, str(probe), *argv], capture_output=True, text=True, env=env, timeout=300,
                           cwd=tmp_path)
        knob = [line for line in r.stdout.splitlines() if line.startswith("KNOB")]
        assert knob, (command, r.stdout[-2000:], r.stderr[-2000:])
        target = "tensorrt" if command == "quantize" else "onnxruntime"  # deploy: --target auto is the backend's
        assert knob == [f"KNOB 7 {target} minmax"], (command, knob)
    h = subprocess.run([sys.executable, str(probe), "deploy", "--help"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    assert "--example-knob" in h.stdout


def test_the_option_group_builds_the_record_by_name():
    """Values named like a ``QuantizeSettings`` field set it, those named like a ``QuantizeOptions``
    field set the placement; ``--target`` becomes the registry's record, ``auto`` the backend's."""
    s = build_settings({"target": "onnxruntime", "exclude_ops": ("Add",), "reduce_range": True, "method": "mse",
                        "holdout": 0.25, "accept_accuracy_loss": True})
    assert s.placement.target is QDQ_TARGETS["onnxruntime"] and s.target_from_backend is False
    assert s.placement.exclude_ops == ("Add",) and s.placement.reduce_range is True
    assert (s.method, s.holdout, s.accept_accuracy_loss) == ("mse", 0.25, True)
    auto = build_settings({"target": "auto"})
    assert auto.target_from_backend is True and auto.placement == QuantizeOptions()
    assert auto == QuantizeSettings(target_from_backend=True)
