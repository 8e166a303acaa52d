"""Issue 16 item 11: what a killed run leaves behind is cleaned up -- by the run itself on
SIGTERM (it unwinds like Ctrl-C), and by the next run after a SIGKILL (nothing runs then):
temporary folders, /dev/shm regions and the server's shared-memory registrations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import requires_tritonserver


def _deploy(tmp_path: Path, repo: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    return subprocess.Popen([sys.executable, "-m", "trtrepo.cli", "deploy", "--repo", str(tmp_path / repo),
                             "--backend", "onnxruntime", "--limit", "512", "--weight-rounding", "nearest"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(pattern: str, folder: Path, timeout: float = 60) -> list[Path]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob(pattern))
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"nothing matched {pattern} in {folder}")


SLOW_IMPORT = """
import sys, time
print("importing", flush=True)
time.sleep(1.5)
print("imported", flush=True)
"""

RUN_SLOW_IMPORT = """
import sys, time
import click
import trtrepo.cli as c

@click.command()
def slow():
    import slowmod  # noqa: F401
    time.sleep(30)
    print("not stopped", flush=True)

c.cli = slow
c.main()
"""


def test_a_sigterm_during_an_import_waits_for_it_then_unwinds(tmp_path):
    """trtrepo's SIGTERM handler raises nothing inside an import (there it was swallowed, or aborted
    torch's initialisation): the import finishes, then the run unwinds with 128 + SIGTERM."""
    (tmp_path / "slowmod.py").write_text(SLOW_IMPORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", RUN_SLOW_IMPORT], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "importing\n"
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert out == "imported\n", (out, err[-2000:])
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert time.monotonic() - t0 < 10, "delivered once the import ended, not after the command's work"


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@pytest.mark.slow
def test_sigterm_removes_the_deploy_work_folder_and_sigkill_leftovers_go_with_the_next_run(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _deploy(tmp_path, "r1")
    work = _wait_for("trtrepo-deploy-*", tmp)
    assert work[0].name.startswith(f"trtrepo-deploy-{proc.pid}-")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]  # once -6 (SIGABRT) on a loaded machine
    assert not list(tmp.glob("trtrepo-deploy-*")), "SIGTERM unwinds: the work folder is removed"
    proc = _deploy(tmp_path, "r2")
    _wait_for(f"trtrepo-deploy-{proc.pid}-*", tmp)
    time.sleep(0.5)
    proc.kill()
    proc.communicate(timeout=60)
    assert list(tmp.glob(f"trtrepo-deploy-{proc.pid}-*")), "a SIGKILL leaves the work folder"
    killed = proc.pid
    proc = _deploy(tmp_path, "r3")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not list(tmp.glob(f"trtrepo-deploy-{killed}-*")), "the next run removed the killed run's folder"
    assert not list(tmp.glob("trtrepo-*")), list(tmp.iterdir())


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_shared_memory_of_a_killed_validate_is_released_by_the_next_one(tmp_path, run_cli, triton_server):
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    assert run_cli("deploy", "--repo", repo, "--backend", "python", "--precision", "fp32").exit_code == 0
    server = triton_server(repo)
    args = [sys.executable, "-m", "trtrepo.cli", "validate", "--url", server.http_url, "--protocol", "http",
            "--model", "demo", "--reference", "demo", "--data", "demo:val", "--limit", "32", "--no-accuracy",
            "--no-reference-speed", "--shared-memory", "system", "--concurrency", "2", "--warmup", "0",
            "--no-progress", "--report", str(tmp_path / "rep")]
    proc = subprocess.Popen([*args, "--duration", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = httpclient.InferenceServerClient(server.http_url)

    def ours(pid: int) -> list[str]:
        return [r["name"] for r in client.get_system_shared_memory_status() if r["name"].startswith(f"trtrepo_{pid}_")]

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not ours(proc.pid):
        time.sleep(0.1)
    assert ours(proc.pid), "the run registered its regions"
    proc.kill()
    proc.communicate(timeout=60)
    killed = proc.pid
    # (its /dev/shm files go with Python's resource tracker; the server keeps the registrations)
    assert ours(killed), "a SIGKILL leaves the registrations on the server"
    res = subprocess.run([*args, "--requests", "10"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert not ours(killed) and not list(Path("/dev/shm").glob(f"trtrepo_{killed}_*"))


@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_the_python_backend_regions_of_a_server_that_died_are_removed(tmp_path, run_cli):
    """Each abnormal server exit left a 1 MiB /dev/shm region of the Python backend: the servers
    trtrepo starts name theirs after the trtrepo process, and remove them when they stop (also
    after a SIGKILL of the server), or at the next start when the trtrepo process itself was killed."""
    from trtrepo.server import SHM_PREFIX, TritonServer

    repo = tmp_path / "repo"
    assert run_cli("deploy", "--repo", repo, "--backend", "python", "--precision", "fp32").exit_code == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path("/dev/shm") / f"{SHM_PREFIX}{dead.pid}_8000_0123"
    stale.write_bytes(b"\0" * 16)
    server = TritonServer(repo, timeout=120).start()
    assert not stale.exists(), "the region of a killed trtrepo process is removed at the next start"
    ours = list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
    assert ours, "the Python backend's regions carry this server's prefix"
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGKILL)  # the server dies abnormally
    server.proc.wait(30)
    assert any(p.exists() for p in ours), "Triton leaves them behind"
    server.stop()
    assert not list(Path("/dev/shm").glob(f"{server.shm_prefix}*"))
