"""``trtrepo serve`` owns its process, ``trtrepo repo check`` and a portable repository (issue 15,
items 4 and 5), against the real tritonserver on loopback."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import tarfile
from pathlib import Path

import numpy as np
import pytest
from _servers import live_server
from conftest import requires_tritonserver

from trtrepo.errors import TrtrepoError
from trtrepo.repository import add_onnx_model, add_plan_model, host_specific
from trtrepo.server import TritonServer, find_python_env, free_ports, local_backends

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def listener():
    """A plain TCP listener on a free 127.0.0.1 port (another process's server, as far as serve can tell)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield int(s.getsockname()[1])
    s.close()


@pytest.fixture(scope="module")
def python_repo(tmp_path_factory, demo_onnx):
    repo = tmp_path_factory.mktemp("serve") / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    return repo


def _infer(url: str, model: str, name: str, data: np.ndarray, output: str) -> np.ndarray:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    inp = httpclient.InferInput(name, list(data.shape), "BYTES" if data.dtype == object else "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp]).as_numpy(output)


# --- serve: busy ports, readiness of its own server, load errors ----------------------------------


@requires_tritonserver
@pytest.mark.parametrize("option", ["--http-port", "--grpc-port", "--metrics-port"])
def test_serve_refuses_a_busy_port_and_never_prints_ready(python_repo, listener, run_cli, option):
    ports = dict(zip(["--http-port", "--grpc-port", "--metrics-port"], free_ports(3), strict=True))
    ports[option] = listener
    r = run_cli("serve", python_repo, *[x for kv in ports.items() for x in map(str, kv)])
    assert r.exit_code == 2, r.output
    assert f"error: port {listener} ({option}) is in use on 127.0.0.1" in r.output
    assert "ready" not in r.output and len(r.output.strip().splitlines()) == 1


@requires_tritonserver
def test_serve_refuses_ports_of_another_tritonserver(python_repo, triton_server, run_cli):
    other = triton_server(python_repo)
    r = run_cli("serve", python_repo, "--http-port", other.http_port, "--grpc-port", other.grpc_port,
                "--metrics-port", other.metrics_port)
    assert r.exit_code == 2 and f"port {other.http_port} (--http-port) is in use" in r.output
    assert "ready" not in r.output
    assert other.model_ready("demo")  # the other server is untouched


@requires_tritonserver
def test_ready_only_for_our_own_server(python_repo, triton_server, monkeypatch):
    """Another server answers on the HTTP port (taken between the port check and the bind): ours
    dies with 'address in use' and is never reported ready, although readiness answers 200."""
    import trtrepo.server

    other = triton_server(python_repo)
    monkeypatch.setattr(trtrepo.server, "busy_ports", lambda host, ports: [])  # lose the race on purpose
    ours = TritonServer(python_repo, http_port=other.http_port, timeout=60)
    with pytest.raises(TrtrepoError) as exc:
        ours.start()
    msg = str(exc.value)
    assert "exited with code" in msg and "log kept at" in msg, msg
    assert re.search(r"[Aa]ddress (already )?in use|failed to start", msg), msg
    assert Path(str(ours.log_path)).is_file()
    assert other.model_ready("demo")


@requires_tritonserver
def test_failed_start_prints_the_load_error_and_keeps_the_log(tmp_path, demo_onnx, run_cli):
    have = local_backends()
    if have is None or "onnxruntime" in have:
        pytest.skip("needs a local tritonserver without the onnxruntime backend")
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="onnxruntime")
    r = run_cli("serve", repo, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--timeout", "60")
    assert r.exit_code == 1, r.output
    assert "unable to find backend library for backend 'onnxruntime'" in r.output
    assert "ready" not in r.output.split("error:")[0]
    assert "--model-control-mode" not in r.output  # not Triton's options table
    log_path = re.search(r"log kept at (\S+):", r.output)
    assert log_path, r.output
    log = Path(log_path.group(1))
    assert log.is_file() and "onnxruntime" in log.read_text()
    log.unlink()


# --- repo add / deploy warn about a backend the local server lacks ------------------------------


@requires_tritonserver
def test_repo_add_warns_when_the_local_server_lacks_the_backend(tmp_path, demo_onnx, run_cli):
    have = local_backends()
    if have is None or "onnxruntime" in have or "python" not in have:
        pytest.skip("needs the local install (python backend only)")
    r = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "r", "--name", "m", "--backend", "onnxruntime")
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no 'onnxruntime' backend" in warnings[0] and "python" in warnings[0]
    assert (tmp_path / "r" / "m" / "config.pbtxt").is_file()  # a warning, not an error
    r = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "r", "--name", "p", "--backend", "python")
    assert r.exit_code == 0 and "warning" not in r.stderr


@requires_tritonserver
def test_deploy_warns_when_the_local_server_lacks_the_backend(tmp_path, run_cli):
    have = local_backends()
    if have is None or "onnxruntime" in have:
        pytest.skip("needs a local tritonserver without the onnxruntime backend")
    r = run_cli("deploy", "demo", "--backend", "onnxruntime", "--precision", "fp32", "--repo", tmp_path / "r")
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no 'onnxruntime' backend" in warnings[0], r.stderr
    assert (tmp_path / "r" / "demo" / "1" / "model.onnx").is_file()


# --- repo check ----------------------------------------------------------------------------------


def test_repo_check_reports_host_specific_things(tmp_path, demo_onnx, run_cli):
    repo = tmp_path / "repo"
    env_dir = tmp_path / "venv"
    env_dir.mkdir()
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "py", "--backend", "python", "--python-env", env_dir)
    assert r.exit_code == 0, r.output
    assert "warning: --python-env" in r.stderr and "does not travel" in r.stderr
    (repo / "py" / "extra.json").write_text(json.dumps({"source": str(tmp_path / "model.onnx")}))
    (repo / "py" / "link.txt").symlink_to(env_dir)
    r = run_cli("repo", "check", repo)
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    assert any(line.startswith("host-specific: py/config.pbtxt: absolute path " + str(env_dir)) for line in lines), r.output
    assert any("py/config.pbtxt: EXECUTION_ENV_PATH" in line and "not under $$TRITON_MODEL_DIRECTORY" in line
               for line in lines), r.output
    assert any(line.startswith("host-specific: py/extra.json: absolute path") for line in lines), r.output
    assert any(line.startswith("host-specific: py/link.txt: symlink") for line in lines), r.output
    data = json.loads(run_cli("repo", "check", repo, "--json").output)
    assert data["portable"] is False and {f["path"] for f in data["findings"]} >= {"py/config.pbtxt", "py/extra.json", "py/link.txt"}
    r = run_cli("repo", "check", tmp_path / "nope")
    assert r.exit_code == 2 and "nope: model repository not found" in r.output


def test_plan_metadata_in_the_repository_has_no_build_paths_and_check_notes_the_target(tmp_path):
    from trtrepo.contracts.plan import PLAN_METADATA_FORMAT
    from trtrepo.modelio import ModelIO, TensorSpec

    build = tmp_path / "build"
    build.mkdir()
    plan = build / "model.plan"
    plan.write_bytes(b"not-a-real-engine")
    io_ = ModelIO(inputs=(TensorSpec("input", "float32", (-1, 1, 32, 32)),), outputs=(TensorSpec("logits", "float32", (-1, 10)),))
    meta = {"format": PLAN_METADATA_FORMAT, "tensorrt_version": "10.3.0.26", "gpu": {"name": "NVIDIA H100", "compute_capability": "9.0"},
            "profiles": [{"input": {"min": [1, 1, 32, 32], "opt": [8, 1, 32, 32], "max": [16, 1, 32, 32]}}], "io": io_.to_dict(),
            "source_onnx": {"path": str(build / "demo.qdq.onnx"), "sha256": "0"},
            "trtexec": f"trtexec --onnx={build}/demo.qdq.onnx --saveEngine={build}/model.plan --shapes=input:8x1x32x32",
            "build": {"timing_cache": str(build / "timing.cache"), "calibration_cache": None}}
    (build / "model.plan.json").write_text(json.dumps(meta))
    repo = tmp_path / "repo"
    add_plan_model(repo, "p", plan)
    written = (repo / "p" / "1" / "model.plan.json").read_text()
    assert str(tmp_path) not in written
    data = json.loads(written)
    assert data["source_onnx"]["path"] == "demo.qdq.onnx" and data["build"]["timing_cache"] == "timing.cache"
    assert data["trtexec"] == "trtexec --onnx=demo.qdq.onnx --saveEngine=model.plan --shapes=input:8x1x32x32"
    findings = host_specific(repo)
    assert [f.kind for f in findings] == ["note"], findings
    assert findings[0].path == "p/1/model.plan" and "TensorRT 10.3.0.26" in findings[0].message and "9.0" in findings[0].message


# --- a portable repository: copied elsewhere, it loads and answers ------------------------------


def _absolute_paths_of_this_machine(repo: Path) -> list[str]:
    forbidden = {str(repo.parent), str(Path.home()), str(ROOT), str(Path(os.getcwd()))}
    hits = []
    for p in repo.rglob("*"):
        if not p.is_file():
            continue
        text = p.read_bytes().decode(errors="replace")
        hits += [f"{p}: {f}" for f in forbidden if f in text]
        for m in re.findall(r"(?<![\w.])(/[\w.+-]+(?:/[\w.+-]+)+)", text):
            if os.path.isdir(m) and not m.startswith(("/proc", "/sys", "/dev")):
                hits.append(f"{p}: {m}")
    return hits


def _png() -> np.ndarray:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.arange(32 * 32) % 255).astype(np.uint8).reshape(32, 32)).save(buf, format="PNG")
    return np.array([[buf.getvalue()]], dtype=object)


@requires_tritonserver
def test_deployed_repository_is_portable_and_loads_from_another_directory(tmp_path, run_cli):
    if find_python_env() is None:
        pytest.skip("no Python-backend environment (run scripts/install_tritonserver.sh)")
    repo = tmp_path / "build" / "repo"
    r = run_cli("deploy", "demo", "--backend", "python", "--ensemble", "--repo", repo, "--precision", "fp32")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(".")) == ["demo", "demo_ensemble", "demo_preprocess"]
    assert _absolute_paths_of_this_machine(repo) == []
    assert "EXECUTION_ENV_PATH" not in (repo / "demo" / "config.pbtxt").read_text()
    r = run_cli("repo", "check", repo)
    assert r.exit_code == 0 and r.output.strip().endswith("portable (0 host-specific finding(s))"), r.output

    moved = tmp_path / "elsewhere" / "models"
    shutil.copytree(repo, moved)
    shutil.rmtree(tmp_path / "build")
    server = TritonServer(moved, copy=False, timeout=120)
    with server:
        x = np.full((2, 1, 32, 32), 0.1, dtype=np.float32)
        logits = _infer(server.http_url, "demo", "input", x, "logits")
        assert logits.shape == (2, 10) and np.isfinite(logits).all()
        out = _infer(server.http_url, "demo_ensemble", "IMAGE", _png(), "logits")
        assert out.shape == (1, 10) and np.isfinite(out).all()


def _packed_env(tmp_path: Path, site_packages: Path) -> Path:
    """A small relocatable environment archive in conda-pack's layout (bin/activate finds its own
    folder): its site-packages reaches numpy/onnxruntime through a .pth file."""
    src = tmp_path / "penv"
    (src / "bin").mkdir(parents=True)
    (src / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    os.symlink("/usr/bin/python3.11", src / "bin" / "python3")
    (src / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11\n")
    (src / "bin" / "activate").write_text('VIRTUAL_ENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\n'
                                          'export VIRTUAL_ENV PATH="$VIRTUAL_ENV/bin:$PATH"\n')
    (src / "lib" / "python3.11" / "site-packages" / "deps.pth").write_text(f"{site_packages}\n")
    archive = tmp_path / "penv.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=".")
    return archive


@requires_tritonserver
def test_packed_python_env_is_shipped_in_the_model_folder(tmp_path, demo_onnx, run_cli):
    env = find_python_env()
    sites = sorted(env.glob("lib/python3.*/site-packages")) if env else []
    if not sites or not Path("/usr/bin/python3.11").exists():
        pytest.skip("needs .triton/pyenv and /usr/bin/python3.11")
    archive = _packed_env(tmp_path, sites[0])
    repo = tmp_path / "repo"
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--backend", "python", "--python-env", archive)
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output
    assert (repo / "demo" / "penv.tar.gz").read_bytes() == archive.read_bytes()
    assert '"$$TRITON_MODEL_DIRECTORY/penv.tar.gz"' in (repo / "demo" / "config.pbtxt").read_text()
    assert run_cli("repo", "check", repo).exit_code == 0
    # Not the local env on PATH: the model runs in the archive Triton unpacks from the model folder.
    with live_server(repo, python_env=False, timeout=120) as server:
        logits = _infer(server.http_url, "demo", "input", np.zeros((1, 1, 32, 32), np.float32), "logits")
        assert logits.shape == (1, 10)
        assert re.search(r"Using Python execution env \S+/demo/penv\.tar\.gz", server.log_text()), server.log_tail()
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "bad", "--backend", "python", "--python-env", demo_onnx)
    assert r.exit_code == 2 and "--python-env" in r.output and "expected a packed environment" in r.output


def test_free_ports_are_distinct_and_bindable():
    # tritonserver refuses to start when two of its ports coincide (seen in CI with sequential picks)
    import socket as _socket

    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:8]:
        with _socket.socket() as s:
            s.bind(("127.0.0.1", port))
