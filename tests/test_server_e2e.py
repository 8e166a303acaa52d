"""End to end with the real tritonserver (pytriton's 2.51, Python backend): a repository written by
``trtrepo deploy`` for the demo (Python-backend model + preprocessing + ensemble) loads, the server
reports the configs that were rendered, and the ensemble on PNG bytes gives ONNX Runtime's top-1."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trtrepo.errors import TrtrepoError
from trtrepo.evaluate import make_session
from trtrepo.repository import list_repository, read_config
from trtrepo.server import find_server_binary
from trtrepo.tritonconfig import config_to_dict

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(find_server_binary(None) is None,
                       reason="tritonserver not installed (run scripts/install_tritonserver.sh or set TRTREPO_TRITONSERVER)"),
]

MODELS = ("demo", "demo_preprocess", "demo_ensemble")


@pytest.fixture(scope="module")
def deployed_repo(tmp_path_factory) -> Path:
    from click.testing import CliRunner

    from trtrepo.cli import cli

    repo = tmp_path_factory.mktemp("e2e") / "model_repository"
    # The calibration subset keeps the INT8 step short; the precision is whatever deploy can do here.
    args = ["deploy", "--repo", str(repo), "--backend", "python", "--ensemble", "--limit", "256",
            "--preferred-batch-size", "4", "--preferred-batch-size", "8", "--max-queue-delay", "2000",
            "--weight-rounding", "nearest"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "demo_ensemble" in result.output
    return repo


@pytest.fixture(scope="module")
def server(deployed_repo, triton_server):
    return triton_server(deployed_repo)


def png_bytes(images: np.ndarray) -> np.ndarray:
    from PIL import Image

    out = []
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img, mode="L").save(buf, format="PNG")
        out.append([buf.getvalue()])
    return np.array(out, dtype=object)


def ort_logits(repo: Path, x: np.ndarray) -> np.ndarray:

    version = max(int(p.name) for p in (repo / "demo").iterdir() if p.name.isdigit())
    sess = make_session(repo / "demo" / str(version) / "model.onnx")  # the server's session options
    return sess.run(["logits"], {"input": x})[0]


def test_every_model_is_ready(server):
    index = {m["name"]: m for m in server.repository_index()}
    assert set(index) == set(MODELS)
    for name in MODELS:
        assert index[name]["state"] == "READY", index[name]
        assert server.model_ready(name)


@pytest.mark.parametrize("name", MODELS)
def test_server_reports_the_rendered_config(server, deployed_repo, name):
    rendered = config_to_dict(read_config(deployed_repo / name))
    served = server.model_config(name)
    assert served["max_batch_size"] == rendered["max_batch_size"]
    for section in ("input", "output"):
        got = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in served[section]]
        want = [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in rendered[section]]
        assert got == want
    if "dynamic_batching" in rendered:
        db, want = served["dynamic_batching"], rendered["dynamic_batching"]
        assert [int(b) for b in db.get("preferred_batch_size", [])] == [int(b) for b in want.get("preferred_batch_size", [])]
        assert int(db["max_queue_delay_microseconds"]) == int(want["max_queue_delay_microseconds"])
    if name == "demo":
        assert [int(b) for b in served["dynamic_batching"]["preferred_batch_size"]] == [4, 8]
        assert served["output"][0]["label_filename"] == "labels.txt"
    for got, want in zip(served.get("instance_group", []), rendered.get("instance_group", []), strict=False):
        assert (got["kind"], int(got["count"])) == (want["kind"], int(want.get("count", 1)))
    if name == "demo_ensemble":
        steps = served["ensemble_scheduling"]["step"]
        assert [s["model_name"] for s in steps] == ["demo_preprocess", "demo"]


def test_ensemble_on_png_bytes_matches_onnxruntime_top1(server, deployed_repo):
    import tritonclient.http as httpclient

    from trtrepo import demo

    images, labels = demo.raw_split("val")
    images, labels = images[:48], labels[:48]
    expected = ort_logits(deployed_repo, demo.to_tensors(images))
    blobs = png_bytes(images)
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)

    def request(sl: slice):
        inp = httpclient.InferInput("IMAGE", [sl.stop - sl.start, 1], "BYTES")
        inp.set_data_from_numpy(blobs[sl])
        return client.async_infer("demo_ensemble", [inp], outputs=[httpclient.InferRequestedOutput("logits")])

    # One batch of 16, then 32 single-image requests in flight together (batched by the server).
    try:
        slices = [slice(0, 16)] + [slice(i, i + 1) for i in range(16, 48)]
        pending = [(sl, request(sl)) for sl in slices]
        parts = []
        for sl, req in pending:
            out = req.get_result().as_numpy("logits")
            assert out is not None and out.shape == (sl.stop - sl.start, 10), None if out is None else out.shape
            parts.append(out)
    finally:
        client.close()
    got = np.concatenate(parts)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.argmax(1), expected.argmax(1))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert (got.argmax(1) == labels).mean() > 0.9


def test_model_over_grpc_matches_onnxruntime(server, deployed_repo):
    import tritonclient.grpc as grpcclient

    from trtrepo import demo

    x = demo.split_tensors("val")[0][:5]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    try:
        out = client.infer("demo", [inp]).as_numpy("logits")
    finally:
        client.close()
    assert out.shape == (5, 10)
    np.testing.assert_allclose(out, ort_logits(deployed_repo, x), rtol=1e-5, atol=1e-5)


def test_served_copy_keeps_the_repository_clean(server, deployed_repo):
    assert not list(deployed_repo.rglob("__pycache__"))
    assert [e.name for e in list_repository(deployed_repo)] == sorted(MODELS)


def test_server_failing_to_load_is_stopped_with_the_log(tmp_path, deployed_repo, triton_server):
    import shutil

    repo = tmp_path / "bad"
    shutil.copytree(deployed_repo / "demo", repo / "demo")
    for v in (repo / "demo").iterdir():
        if v.is_dir():
            (v / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(TrtrepoError, match="tritonserver exited with code"):
        triton_server(repo, timeout=60)


def test_serve_command_runs_in_foreground_and_stops_on_sigint(deployed_repo):
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "trtrepo.cli", "serve", str(deployed_repo), "--http-port", "0", "--grpc-port", "0",
           "--metrics-port", "0"]
    # Started with SIGINT ignored, as a background job of a shell script (or a pytest-xdist worker's
    # child) is: serve still stops on SIGINT.
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 120
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("log:"):
                break
        text = "".join(lines)
        assert "tritonserver ready: HTTP 127.0.0.1:" in text, text
        assert "models: demo, demo_ensemble, demo_preprocess" in text
        url = text.split("HTTP ")[1].split()[0]
        import urllib.request

        with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert "stopping tritonserver" in rest
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
