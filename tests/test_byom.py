"""Bring your own model (issue 15, first part): a custom PyTorch entry point with a state dict and a
folder of PNG images with a preprocessing file goes through ``deploy`` and ``validate --reference``
with the input shape read off the data (no ``--input-shape``, no ``--onnx``), against the real
tritonserver; ``--input-shape`` works too, batch axis excluded."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from trtrepo.tritonconfig import parse_config_text

TINY = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
            self.head = nn.Linear(8 * 16, 5)

        def forward(self, x):
            return self.head(torch.flatten(self.features(x), 1))


    def build():
        return TinyCNN()
''')


@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mymodels/tinycnn.py (entry point mymodels.tinycnn:build), tiny.pt, 40 PNG images of two sizes
    and pre.json: what a user brings."""
    import torch
    from PIL import Image

    from trtrepo.data import Preprocess

    root = tmp_path_factory.mktemp("byom")
    (root / "mymodels").mkdir()
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "tinycnn.py").write_text(TINY)
    sys.path.insert(0, str(root))
    try:
        from mymodels.tinycnn import build

        torch.manual_seed(0)
        torch.save(build().state_dict(), root / "tiny.pt")
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("mymodels.tinycnn", None)
        sys.modules.pop("mymodels", None)
    rng = np.random.default_rng(0)
    (root / "imgs").mkdir()
    for i in range(40):
        h, w = (48, 64) if i % 2 else (40, 40)
        img = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        Image.fromarray(img).save(root / "imgs" / f"img{i:02d}.png")
    from click.testing import CliRunner

    from trtrepo.cli import cli

    res = CliRunner().invoke(cli, ["preprocess", "-o", str(root / "pre.json"), "--resize", "32x32",
                                   "--mean", "0.5,0.5,0.5", "--std", "0.5,0.5,0.5"])
    assert res.exit_code == 0, res.output
    assert Preprocess.load(root / "pre.json").resize == (32, 32)
    return root


def _cli(root: Path, monkeypatch: pytest.MonkeyPatch, run_cli, *args):
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    return run_cli(*args)


def test_deploy_an_entry_point_with_shapes_from_the_data(user_project, monkeypatch, run_cli):
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "--backend", "onnxruntime", "--repo", "repo1", "--name", "tiny")
    assert res.exit_code == 0, res.output
    config = parse_config_text((user_project / "repo1" / "tiny" / "config.pbtxt").read_text(), "config.pbtxt")
    assert [list(t.dims) for t in config.input] == [[3, 32, 32]] and [list(t.dims) for t in config.output] == [[5]]
    assert (user_project / "repo1" / "tiny" / "1" / "model.onnx").is_file()


def test_deploy_an_entry_point_with_input_shape_and_no_data(user_project, monkeypatch, run_cli):
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--input-shape", "pixels:3x24x24", "--backend", "onnxruntime", "--repo", "repo2", "--name", "tiny")
    assert res.exit_code == 0, res.output
    config = parse_config_text((user_project / "repo2" / "tiny" / "config.pbtxt").read_text(), "config.pbtxt")
    assert config.input[0].name == "pixels" and list(config.input[0].dims) == [3, 24, 24]
    # neither: the error says what to give, naming the source
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--backend", "onnxruntime", "--repo", "repo3")
    assert res.exit_code == 2 and "--input-shape" in res.stderr and "--data" in res.stderr
    assert not (user_project / "repo3").exists()


def test_input_shape_does_not_apply_to_an_onnx_model(user_project, monkeypatch, run_cli, demo_onnx):
    res = _cli(user_project, monkeypatch, run_cli, "deploy", str(demo_onnx), "--input-shape", "1x32x32",
               "--backend", "onnxruntime", "--repo", "repo4", "--precision", "fp32")
    assert res.exit_code == 2 and "--input-shape does not apply" in res.stderr


@pytest.mark.slow
@pytest.mark.triton
def test_validate_the_served_entry_point_against_its_pytorch_reference(user_project, monkeypatch, run_cli,
                                                                         triton_server):
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "--backend", "python", "--precision", "fp32",
               "--repo", "repo5", "--name", "tiny")
    assert res.exit_code == 0, res.output
    server = triton_server(user_project / "repo5")
    res = _cli(user_project, monkeypatch, run_cli, "validate", "--url", server.grpc_url, "--model", "tiny",
               "--reference", "mymodels.tinycnn:build", "--weights", "tiny.pt", "--data", "imgs",
               "--preprocess", "pre.json", "--report", "report", "--no-progress", "--concurrency", "1",
               "--requests", "20")
    assert res.exit_code == 0, res.output + res.stderr
    report = (user_project / "report" / "validate.json").read_text()
    assert '"passed": true' in report


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_deploy_a_qdq_model_as_given(tmp_path, monkeypatch, run_cli, demo_onnx):
    """A model quantized earlier (trtrepo quantize here) is deployed byte for byte and reported int8."""
    qdq = tmp_path / "demo.qdq.onnx"
    res = run_cli("quantize", demo_onnx, "--data", "demo:calib", "--limit", "64", "--method", "minmax",
                  "--target", "onnxruntime", "-o", qdq, "--no-progress")
    assert res.exit_code == 0, res.output
    res = run_cli("deploy", qdq, "--backend", "onnxruntime", "--repo", tmp_path / "repo", "--name", "q")
    assert res.exit_code == 0, res.output
    assert "int8" in res.output and "deployed as is" in res.output
    assert _sha(tmp_path / "repo" / "q" / "1" / "model.onnx") == _sha(qdq)
    res = run_cli("deploy", qdq, "--backend", "onnxruntime", "--repo", tmp_path / "repo2", "--precision", "fp32")
    assert res.exit_code == 2 and "already a Q/DQ INT8 model" in res.stderr


def test_deploy_with_a_calibration_cache_does_not_calibrate(tmp_path, run_cli, demo_onnx):
    """No --data at all: without the cache deploy falls back to FP32; with it, INT8 from the cache."""
    cache = tmp_path / "demo.cache"
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", "128", "--cache", cache, "--no-progress")
    assert res.exit_code == 0, res.output
    plain = run_cli("deploy", demo_onnx, "--backend", "onnxruntime", "--repo", tmp_path / "r0", "--name", "d")
    assert plain.exit_code == 0 and "fp32" in plain.output
    res = run_cli("deploy", demo_onnx, "--backend", "onnxruntime", "--repo", tmp_path / "r1", "--name", "d",
                  "--cache", cache)
    assert res.exit_code == 0, res.output
    assert "from --cache" in res.output and "no calibration" in res.output and "int8" in res.output
    assert "NOT measured" in res.output  # no data for the check against FP32
    deployed = onnx_ops(tmp_path / "r1" / "d" / "1" / "model.onnx")
    assert deployed.count("QuantizeLinear") > 0 and deployed.count("DequantizeLinear") > 0
    res = run_cli("deploy", demo_onnx, "--repo", tmp_path / "r2", "--cache", cache, "--ranges", cache)
    assert res.exit_code == 2 and "only one of --cache, --ranges" in res.stderr


def onnx_ops(path: Path) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_deploy_passes_exclusions_and_accuracy_target_to_quantize(tmp_path, run_cli, demo_onnx):
    base = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                   "--repo", tmp_path / "r0", "--name", "d", "--method", "minmax")
    assert base.exit_code == 0 and "int8" in base.output, base.output
    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                  "--repo", tmp_path / "r1", "--name", "d", "--method", "minmax", "--exclude-op", "Conv")
    assert res.exit_code == 0 and "int8" in res.output, res.output
    ops0, ops1 = onnx_ops(tmp_path / "r0" / "d" / "1" / "model.onnx"), onnx_ops(tmp_path / "r1" / "d" / "1" / "model.onnx")
    assert ops1.count("DequantizeLinear") < ops0.count("DequantizeLinear")
    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                  "--repo", tmp_path / "r2", "--accuracy-target", "top1=101")
    assert res.exit_code == 2 and "--accuracy-target" in res.stderr
