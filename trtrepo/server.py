"""Locating and starting a ``tritonserver`` binary; the container command when there is none."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contracts.plan import read_plan_metadata
from .errors import TrtrepoError, UsageError

log = logging.getLogger(__name__)

# Where scripts/install_tritonserver.sh puts the server (repository root/.triton).
_LOCAL_INSTALL = Path(__file__).resolve().parent.parent / ".triton"


def local_install_dir() -> Path:
    return Path(os.environ.get("TRTREPO_TRITON_DIR", str(_LOCAL_INSTALL)))


def find_server_binary(explicit: str | Path | None) -> Path | None:
    """``explicit``, else ``$TRTREPO_TRITONSERVER``, else ``tritonserver`` on PATH, else the
    wrapper that ``scripts/install_tritonserver.sh`` writes (``.triton/bin/tritonserver``)."""
    for candidate in (explicit, os.environ.get("TRTREPO_TRITONSERVER")):
        if candidate:
            p = Path(candidate)
            return p if p.is_file() else None
    found = shutil.which("tritonserver")
    if found:
        return Path(found)
    local = local_install_dir() / "bin" / "tritonserver"
    return local if local.is_file() and os.access(local, os.X_OK) else None


def find_python_env() -> Path | None:
    """The venv for Python-backend models (``EXECUTION_ENV_PATH``): ``$TRTREPO_PYTHON_ENV`` or
    the one the install script made (``.triton/pyenv``, numpy<2 + onnxruntime + pillow)."""
    env = os.environ.get("TRTREPO_PYTHON_ENV")
    if env:
        return Path(env) if Path(env).is_dir() else None
    local = local_install_dir() / "pyenv"
    return local if (local / ".complete").is_file() else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# Container command for machines without a server binary


@dataclass(frozen=True)
class Release:
    release: str
    triton: str
    tensorrt: str


def release_table() -> tuple[list[Release], str]:
    """Triton container release -> TensorRT version, and the table's source (package data)."""
    from importlib import resources

    data = json.loads(resources.files("trtrepo.templates").joinpath("triton_releases.json").read_text())
    rows = [Release(r["release"], r["triton"], r["tensorrt"]) for r in data["releases"]]
    return rows, str(data["source"])


def release_for_tensorrt(version: str | None) -> Release:
    """Newest release whose TensorRT major.minor matches ``version`` (newest release when None)."""
    rows, _ = release_table()
    rows = sorted(rows, key=lambda r: tuple(int(x) for x in r.release.split(".")))
    if not version:
        return rows[-1]
    want = tuple(version.split(".")[:2])
    matches = [r for r in rows if tuple(r.tensorrt.split(".")[:2]) == want]
    if not matches:
        known = ", ".join(sorted({".".join(r.tensorrt.split(".")[:2]) for r in rows}, key=lambda v: tuple(map(int, v.split(".")))))
        raise UsageError(f"no Triton release in trtrepo's table ships TensorRT {version} (known: {known}); rebuild the plan "
                         f"with a listed TensorRT version")
    return matches[-1]


def plan_tensorrt_versions(repo: str | Path) -> set[str]:
    """TensorRT versions recorded in ``model.plan.json`` files of a repository."""
    versions = set()
    for path in Path(repo).glob("*/*/*.plan.json"):
        with contextlib.suppress(TrtrepoError):
            meta = read_plan_metadata(path)
            if meta is not None and meta.tensorrt_version:
                versions.add(meta.tensorrt_version)
    return versions


def container_command(repo: str | Path, *, http_port: int = 8000, grpc_port: int = 8001, metrics_port: int = 8002,
                      gpus: bool = True) -> tuple[str, Release, list[str]]:
    """``docker run`` command for a repository, with the release matching its plans' TensorRT."""
    notes = []
    versions = plan_tensorrt_versions(repo)
    if len(versions) > 1:
        raise UsageError(f"{repo}: plans were built with several TensorRT versions ({', '.join(sorted(versions))}); "
                         f"one Triton release loads only one")
    version = next(iter(versions), None)
    rel = release_for_tensorrt(version)
    if version:
        notes.append(f"plans built with TensorRT {version}: Triton {rel.release} ships TensorRT {rel.tensorrt}")
    else:
        notes.append(f"no TensorRT plans in the repository: newest known release {rel.release}")
    envs = sorted({str(c.parent.name) for c in Path(repo).glob("*/config.pbtxt") if "EXECUTION_ENV_PATH" in c.read_text()})
    if envs:
        notes.append(f"Python-backend models ({', '.join(envs)}) name an EXECUTION_ENV_PATH on this machine: inside the container "
                     f"remove that parameter and pip install 'numpy<2' onnxruntime pillow, or mount the environment at the same path")
    repo_abs = Path(repo).resolve()
    gpu = "--gpus=all " if gpus else ""
    cmd = (f"docker run --rm {gpu}-p{http_port}:8000 -p{grpc_port}:8001 -p{metrics_port}:8002 "
           f"-v {repo_abs}:/models nvcr.io/nvidia/tritonserver:{rel.release}-py3 "
           f"tritonserver --model-repository=/models")
    return cmd, rel, notes


# --------------------------------------------------------------------------------------------
# Running a server


def copy_repository(repo: Path, dest: Path) -> Path:
    """Copy a repository for serving (the Python backend writes __pycache__ into it)."""
    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(".*", "__pycache__"), symlinks=True)
    return dest


@dataclass
class TritonServer:
    """Runs ``tritonserver`` on loopback ports in its own process group; a context manager.

    ``with TritonServer(repo) as s: s.http_url`` -- waits until ``/v2/health/ready`` answers
    (bounded by ``timeout``), and always stops the server (SIGTERM, then SIGKILL to the group).
    With ``copy=True`` (default) a temporary copy of the repository is served.
    """

    repo: str | Path
    binary: str | Path | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    host: str = "127.0.0.1"
    timeout: float = 60.0
    exit_timeout: int = 5
    copy: bool = True
    extra_args: Sequence[str] = ()
    log_path: str | Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False)
    _log_file: Any = field(default=None, init=False)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def urls(self) -> tuple[str, str]:
        """(http_url, grpc_url)."""
        return self.http_url, self.grpc_url

    def command(self, repo: Path) -> list[str]:
        binary = find_server_binary(self.binary)
        if binary is None:
            where = self.binary or "PATH, $TRTREPO_TRITONSERVER or .triton/bin"
            raise UsageError(f"tritonserver not found ({where}); run scripts/install_tritonserver.sh or pass --server-binary")
        return [str(binary), f"--model-repository={repo}", f"--http-address={self.host}", f"--grpc-address={self.host}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true", "--log-verbose=0", f"--exit-timeout-secs={self.exit_timeout}", *self.extra_args]

    def start(self) -> TritonServer:
        repo = Path(self.repo)
        if not repo.is_dir():
            raise UsageError(f"{repo}: model repository not found")
        self.http_port = self.http_port or free_port()
        self.grpc_port = self.grpc_port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        serve_repo = repo
        if self.copy:
            self._tmp = tempfile.TemporaryDirectory(prefix="trtrepo-serve-")
            serve_repo = copy_repository(repo, Path(self._tmp.name) / "repo")
        cmd = self.command(serve_repo)
        if self.log_path is None:
            base = Path(self._tmp.name) if self._tmp else Path(tempfile.mkdtemp(prefix="trtrepo-serve-log-"))
            self.log_path = base / "tritonserver.log"
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        log.info("starting %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])  # type: ignore[arg-type]
        except OSError:
            return ""

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=timeout) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise TrtrepoError(f"tritonserver exited with code {self.proc.returncode} while starting; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                status, _ = self._get("/v2/health/ready", timeout=1.0)
                if status == 200:
                    return
            time.sleep(0.1)
        raise TrtrepoError(f"tritonserver not ready after {self.timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}")

    def model_config(self, name: str) -> dict[str, Any]:
        status, body = self._get(f"/v2/models/{name}/config")
        if status != 200:
            raise TrtrepoError(f"GET /v2/models/{name}/config: HTTP {status}: {body[:200]!r}")
        return dict(json.loads(body))

    def model_ready(self, name: str) -> bool:
        with contextlib.suppress(OSError):
            return self._get(f"/v2/models/{name}/ready")[0] == 200
        return False

    def repository_index(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(f"http://{self.http_url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return list(json.loads(r.read()))

    def stop(self, grace: float | None = None) -> None:
        grace = self.exit_timeout + 5.0 if grace is None else grace
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            # The Python backend stubs are in the same group: make sure none is left behind.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._tmp is not None:
            keep = Path(self._tmp.name) / "tritonserver.log"
            if self.log_path == keep and keep.is_file():
                saved = Path(tempfile.gettempdir()) / f"trtrepo-tritonserver-{os.getpid()}-{self.http_port}.log"
                with contextlib.suppress(OSError):
                    shutil.copyfile(keep, saved)
                    self.log_path = saved
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_server(repo: str | Path, **kw: Any) -> Iterator[TritonServer]:
    server = TritonServer(repo, **kw)
    with server:
        yield server
