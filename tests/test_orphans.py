"""Issue 28 item 3: servers trtrepo starts die with it. A SIGKILL of ``serve`` or ``tune`` leaves
no tritonserver (nor Python backend stub) running 10 s later; what a killed run leaves on disk,
and a server that outlived its trtrepo process anyway (no parent-death signal), are removed by
the next ``doctor`` (or server start), which says what it removed. Real servers throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import requires_tritonserver

pytestmark = [pytest.mark.triton, requires_tritonserver]


def _env(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp)}


def _cli(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "trtrepo.cli", *args], env=_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie stays until its new parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _processes_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().decode(errors="replace") and _running(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _record(tmp_path: Path, owner: int, timeout: float = 120) -> tuple[Path, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for rec in (tmp_path / "tmp").glob(f"trtrepo-server-{owner}-*/server.json"):
            with_text = rec.read_text()
            if with_text:
                return rec.parent, json.loads(with_text)
        time.sleep(0.1)
    raise AssertionError(f"no server record of process {owner} in {tmp_path / 'tmp'}")


def _sigkill_and_check(proc: subprocess.Popen[str], server_pid: int, folder: Path) -> None:
    """SIGKILL the trtrepo process, then its server and stubs must be gone within 10 s."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone_within(server_pid, folder)


def _assert_gone_within(pid: int, folder: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (_running(pid) or _processes_mentioning(str(folder))):
        time.sleep(0.2)
    assert not _running(pid), f"tritonserver {pid} still runs {seconds} s after its trtrepo process was killed"
    assert _processes_mentioning(str(folder)) == [], "a Python backend stub of the killed server still runs"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_onnx: Path) -> Path:
    from trtrepo.repository import add_onnx_model

    repo = tmp_path_factory.mktemp("orphans") / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    return repo


def _doctor(tmp_path: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "trtrepo.cli", "doctor", "--json"], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_sigkill_of_serve_leaves_no_server_and_doctor_removes_its_files(tmp_path, repo):
    serve = _cli(tmp_path, "serve", str(repo), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0")
    try:
        assert serve.stdout is not None
        for line in serve.stdout:
            if line.startswith("tritonserver ready"):
                break
        else:
            raise AssertionError(f"serve ended before the server was ready (exit {serve.wait()})")
        folder, rec = _record(tmp_path, serve.pid)
        assert _running(rec["pid"]) and _processes_mentioning(str(folder)), "the server and its stub serve the copy"
        _sigkill_and_check(serve, rec["pid"], folder)
    finally:
        if serve.poll() is None:
            serve.kill()
    assert folder.is_dir(), "a SIGKILL runs no cleanup: the record and the repository copy stay"
    report = _doctor(tmp_path)
    assert any(str(folder) in t and f"trtrepo process {serve.pid}" in t for t in report["servers_removed"]), report
    assert not folder.exists() and not any(str(folder) in p for p in report["leftovers"])
    assert _doctor(tmp_path)["servers_removed"] == []


def test_sigkill_of_tune_mid_run_leaves_no_server(tmp_path, repo):
    tune = _cli(tmp_path, "tune", str(repo), "--model", "demo", "--data", "demo:val", "--limit", "16",
                "--measurement-interval", "0.3", "--budget-s", "120")
    try:
        folder, rec = _record(tmp_path, tune.pid)
        deadline = time.monotonic() + 60
        while not _processes_mentioning(str(folder)) and time.monotonic() < deadline:  # the model loaded: mid-run
            time.sleep(0.2)
        time.sleep(1.0)
        assert tune.poll() is None, "tune ended before it could be killed mid-run"
        _sigkill_and_check(tune, rec["pid"], folder)
    finally:
        if tune.poll() is None:
            tune.kill()


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_a_server_that_outlived_its_trtrepo_process_is_killed_by_doctor(tmp_path, repo):
    """Where no parent-death signal arrives (another OS; a parent gone before the hook ran), the
    record names the server: the next doctor kills it (process group) and says so."""
    from trtrepo.server import TritonServer

    tmp = Path(_env(tmp_path)["TMPDIR"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    server = TritonServer(repo, timeout=120)
    server.start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        own = next(Path(server._tmp.name).glob("server.json"))  # type: ignore[union-attr]
        leftover = tmp / f"trtrepo-server-{dead.pid}-x"
        leftover.mkdir()
        (leftover / "server.json").write_text(own.read_text())  # as if a killed trtrepo process had started it
        report = _doctor(tmp_path)
        assert any(f"tritonserver pid {pid}" in t and f"trtrepo process {dead.pid}" in t
                   for t in report["servers_removed"]), report
        deadline = time.monotonic() + 10
        while _running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(pid) and not leftover.exists()
    finally:
        server.stop(grace=0)
