from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from trtrepo.cli import COMMANDS
from trtrepo.modelio import ModelIO


def test_help_lists_pipeline_commands(run_cli):
    res = run_cli("--help")
    assert res.exit_code == 0
    listed = [line.split()[0] for line in res.output.split("Commands:", 1)[1].splitlines() if line.startswith("  ")]
    # every command is listed, the pipeline's stages in the order a user runs them
    assert set(listed) == set(COMMANDS) and len(listed) == len(COMMANDS)
    stages = [n for n in listed if n in ("export", "calibrate", "quantize", "build", "deploy", "serve", "validate")]
    assert stages == ["export", "calibrate", "quantize", "build", "deploy", "serve", "validate"]


def test_import_and_help_do_not_load_heavy_dependencies():
    code = (
        "import sys; from click.testing import CliRunner; from trtrepo.cli import cli; "
        "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0, r.output; "
        "heavy = [m for m in ('torch', 'tensorrt', 'cuda', 'onnxruntime', 'tritonclient') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_export_command(tmp_path, run_cli):
    out = tmp_path / "demo.onnx"
    res = run_cli("export", "demo", "-o", out)
    assert res.exit_code == 0, res.output
    assert "max abs error" in res.output
    assert ModelIO.from_onnx(out).has_batch_axis
    x = np.zeros((2, 1, 32, 32), np.float32)
    assert ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0].shape == (2, 10)


def test_export_usage_errors_exit_2_without_traceback(tmp_path, run_cli):
    res = run_cli("export", str(tmp_path / "missing.onnx"), "-o", tmp_path / "o.onnx")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {tmp_path / 'missing.onnx'}: ONNX file not found"
    assert "Traceback" not in res.output
    res = run_cli("export", "nosuch_mod_q:make", "--input-shape", "3", "-o", tmp_path / "o.onnx")
    assert res.exit_code == 2 and "cannot import module 'nosuch_mod_q'" in res.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_debug_shows_the_exception(tmp_path):
    from click.testing import CliRunner

    from trtrepo.cli import cli

    res = CliRunner().invoke(cli, ["--debug", "export", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o.onnx")])
    assert res.exit_code == 2  # the documented code of a usage error, traceback or not
    assert "Traceback (most recent call last)" in res.stderr and "UsageError" in res.stderr


def test_export_with_input_shape_and_names(tmp_path, run_cli, demo_onnx):
    ts = tmp_path / "demo.ts"
    import torch

    from trtrepo.export import load_torch_model

    torch.jit.trace(load_torch_model("demo"), torch.zeros(1, 1, 32, 32)).save(str(ts))
    res = run_cli("export", ts, "--input-shape", "1x32x32", "--input-names", "pixels", "--output-names", "scores",
                  "--opset", "18", "-o", tmp_path / "ts.onnx")
    assert res.exit_code == 0, res.output
    io = ModelIO.from_onnx(tmp_path / "ts.onnx")
    assert io.input_names == ["pixels"] and io.output_names == ["scores"]


def test_preprocess_command_round_trip(tmp_path, run_cli):
    res = run_cli("preprocess", "-o", tmp_path / "p.yaml", "--resize", "256", "--center-crop", "224",
                  "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")
    assert res.exit_code == 0, res.output
    from trtrepo.data import Preprocess

    p = Preprocess.load(tmp_path / "p.yaml")
    assert p.center_crop == (224, 224) and p.mean == (0.485, 0.456, 0.406)
    res = run_cli("preprocess", "-o", tmp_path / "bad.json", "--mean", "1,2")
    assert res.exit_code == 2 and "'mean'" in res.stderr and not (tmp_path / "bad.json").exists()


def test_doctor_reports_components(run_cli):
    res = run_cli("doctor", "--json")
    assert res.exit_code == 0
    report = json.loads(res.output)
    names = {c["name"]: c for c in report["components"]}
    assert names["onnxruntime"]["available"] and "CPUExecutionProvider" in names["onnxruntime"]["detail"]
    assert names["torch"]["available"]
    try:
        import tensorrt  # noqa: F401
        have_trt = True
    except ImportError:
        have_trt = False
    assert names["tensorrt"]["available"] == have_trt
    assert report["stages"]["build"]["available"] == have_trt


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_atomic_writes_get_the_mode_a_plain_write_gets(tmp_path, umask):
    """Not mkstemp's 0600: a served file must be readable by the server's user under umask 022."""
    import os
    import stat

    from trtrepo.fsutil import atomic_write_text

    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "f.txt", "x")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == stat.S_IMODE(os.stat(tmp_path / "plain.txt").st_mode) == 0o666 & ~umask


def test_deploy_rejects_an_unknown_metric_output(tmp_path, run_cli):
    res = run_cli("deploy", "demo", "--repo", tmp_path / "repo", "--backend", "onnxruntime", "--limit", "64",
                  "--metric-output", "pooled")
    assert res.exit_code == 2
    assert "--metric-output 'pooled'" in res.stderr and "outputs: logits" in res.stderr
    assert not (tmp_path / "repo" / "demo").exists()
