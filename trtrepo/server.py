"""Locating and starting a ``tritonserver`` binary; the container command when there is none."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .contracts.location import is_remote
from .contracts.plan import read_plan_metadata
from .errors import OptionError, TrtrepoError, UsageError
from .fsutil import pid_alive, reap_stale, temp_dir

log = logging.getLogger(__name__)

# Where scripts/install_tritonserver.sh puts the server (repository root/.triton).
_LOCAL_INSTALL = Path(__file__).resolve().parent.parent / ".triton"


# tritonserver copies each model of an s3:// (gs://, as://) repository into ``<dir>/folderXXXXXX``
# (``/tmp`` unless these name another folder) and leaves the copies when it is stopped or killed:
# 2.51 left one per served model under /tmp (measured). trtrepo points them into the server's own
# temporary folder, removed on stop (and by the reaper after a kill).
MOUNT_DIRECTORY_VARS = ("TRITON_AWS_MOUNT_DIRECTORY", "TRITON_GCS_MOUNT_DIRECTORY", "TRITON_AZURE_MOUNT_DIRECTORY")

SHM_PREFIX = "trtrepo_pyb_"  # the Python backend's shared-memory regions of servers trtrepo starts

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


def runnable_server_binary(explicit: str | Path | None) -> Path | None:
    """:func:`find_server_binary`, refused (one line naming where it came from: ``--server-binary``
    or ``$TRTREPO_TRITONSERVER``) when the file found is not executable (``/etc/passwd``)."""
    binary = find_server_binary(explicit)
    if binary is None:
        return None
    source = ("--server-binary" if explicit else "$TRTREPO_TRITONSERVER" if os.environ.get("TRTREPO_TRITONSERVER")
              else "tritonserver")
    if not os.access(binary, os.X_OK):
        raise UsageError(f"{source} {binary}: not an executable file")
    return binary


def find_python_env() -> Path | None:
    """The Python environment the local server's Python-backend models run in: ``$TRTREPO_PYTHON_ENV``
    or the venv the install script made (``.triton/pyenv``, numpy<2 + onnxruntime + pillow).

    It is not written into the repository: :class:`TritonServer` puts its ``bin`` first on the
    server's ``PATH`` (what ``source ENV/bin/activate`` does for ``EXECUTION_ENV_PATH``), and the
    Python backend stub takes its interpreter prefix from the ``python3`` it finds there."""
    env = os.environ.get("TRTREPO_PYTHON_ENV")
    if env:
        return Path(env) if Path(env).is_dir() else None
    local = local_install_dir() / "pyenv"
    return local if (local / ".complete").is_file() else None


def python_env_vars(env: Path | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``env``'s ``bin`` first on ``PATH`` and
    ``VIRTUAL_ENV`` set, as ``ENV/bin/activate`` would; unchanged when ``env`` is None."""
    out = dict(os.environ if base is None else base)
    if env is not None:
        env = Path(env).absolute()
        out["PATH"] = os.pathsep.join([str(env / "bin"), *([out["PATH"]] if out.get("PATH") else [])])
        out["VIRTUAL_ENV"] = str(env)
        out.pop("PYTHONHOME", None)
    return out


def _wrapper_backend_dir(binary: Path) -> Path | None:
    """The ``--backend-directory`` a wrapper script (install_tritonserver.sh's) passes, if any."""
    try:
        head = binary.read_bytes()[:8192]
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    m = re.search(r"""--backend-directory[= ]["']?([^"'\s]+)""", head.decode(errors="replace"))
    return Path(m.group(1)) if m else None


def local_backends(binary: str | Path | None = None) -> set[str] | None:
    """Backends the local tritonserver has (the sub-folders of its backend directory: the one its
    wrapper passes, else ``BIN/../backends``, else ``/opt/tritonserver/backends``); None when there
    is no server here or its backend directory cannot be found."""
    found = find_server_binary(binary)
    if found is None:
        return None
    candidates = [d for d in (_wrapper_backend_dir(found),) if d is not None]
    candidates += [found.resolve().parent.parent / "backends", Path("/opt/tritonserver/backends")]
    for d in candidates:
        if d.is_dir():
            return {p.name for p in d.iterdir() if p.is_dir()}
    return None


def missing_backend_warning(backend: str) -> str | None:
    """A one-line warning when the local tritonserver lacks ``backend`` (None when it has it or
    when there is no local server to ask)."""
    have = local_backends()
    if have is None or backend in have:
        return None
    return (f"the tritonserver here has no '{backend}' backend (it has: {', '.join(sorted(have)) or 'none'}): "
            f"'trtrepo serve' cannot load this model here; serve the repository with a server that has it")


def check_distinct_ports(ports: Mapping[str, int | None]) -> None:
    """Refuse one port given for two of the server's listeners (``--http-port 8000 --grpc-port
    8000``): tritonserver itself answers with its whole usage text. 0 or None: a free one, picked later."""
    seen: dict[int, str] = {}
    for label, port in ports.items():
        if port and port in seen:
            raise UsageError(f"{seen[port]} and {label} are both {port}: each of the server's ports needs its own "
                             f"(0 picks a free one)")
        if port:
            seen[port] = label


def busy_ports(host: str, ports: Mapping[str, int]) -> list[tuple[str, int]]:
    """The ``(label, port)`` pairs of ``ports`` that cannot be bound on ``host`` (another process
    listens there). SO_REUSEADDR: a port in TIME_WAIT after a server stopped counts as free."""
    busy = []
    for label, port in ports.items():
        if not port:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):  # not a port's problem: the address's
                    raise OptionError("host", f"{host}: cannot listen there ({exc.strerror or exc})", concept="the host address") from None
                busy.append((label, port))
    return busy


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (from /proc/net/tcp{,6}); None without /proc."""
    inodes: set[str] = set()
    seen = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    return inodes if seen else None


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.append(int(d.name))
    return pids


def group_owns_port(pgid: int, port: int) -> bool | None:
    """Whether a process of process group ``pgid`` holds the listening socket of TCP ``port``
    (None: cannot tell here, no /proc)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    for pid in _group_pids(pgid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return True
    return False



# --- servers that outlive trtrepo -------------------------------------------------------------
# Each server trtrepo starts has a folder ``<tmp>/trtrepo-server-<our pid>-*`` holding its record
# (``server.json``: the tritonserver's pid and start time) and the repository copy it serves. The
# server gets SIGKILL when the thread that started it exits (Linux ``PR_SET_PDEATHSIG``), so a
# trtrepo process killed with SIGKILL takes its server along (the Python backend stubs see their
# parent go and exit). Where that cannot work (no prctl; a parent gone before the hook ran) the
# record stays behind: the next server start and ``trtrepo doctor`` kill a recorded server whose
# trtrepo process is gone and remove its folder (:func:`reap_leftover_servers`).

SERVER_DIR_KIND = "server"  # fsutil.temp_dir kind: <tmp>/trtrepo-server-<pid>-*
_RECORD = "server.json"
_PR_SET_PDEATHSIG = 1


def _prctl() -> Any:
    """libc's prctl, looked up in the parent (a dlopen between fork and exec can deadlock on a
    lock another thread held at the fork); None where there is none."""
    try:

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _die_with_parent(prctl: Any, parent: int) -> None:
    """preexec hook of the server process: SIGKILL when the starting thread exits."""
    if prctl is None:  # no prctl here: the record lets the next run reap it
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the hook ran: no signal will come
        os._exit(1)


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid
    it names one process, whatever the pid is reused for later. None: no such process (or no /proc)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Leftover:
    """A server record whose trtrepo process is gone."""

    folder: Path
    owner: int  # the trtrepo process that started it
    pid: int | None  # the tritonserver, when it still runs
    ports: tuple[int, ...] = ()

    def describe(self) -> str:
        what = (f"tritonserver pid {self.pid} (ports {', '.join(map(str, self.ports))})" if self.pid
                else "the files of a server that is gone")
        return f"{what} left by trtrepo process {self.owner}, which was killed: {self.folder}"


def leftover_servers(root: str | Path | None = None) -> list[Leftover]:
    """Records of servers whose trtrepo process is gone (see the section comment above)."""

    prefix = f"trtrepo-{SERVER_DIR_KIND}-"
    out = []
    for folder in sorted(Path(root or tempfile.gettempdir()).glob(f"{prefix}*")):
        owner_text = folder.name[len(prefix):].split("-", 1)[0]
        if not owner_text.isdigit() or int(owner_text) == os.getpid() or pid_alive(int(owner_text)):
            continue
        pid: int | None = None
        ports: tuple[int, ...] = ()
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            rec = json.loads((folder / _RECORD).read_text())
            ticks = rec["start_ticks"]
            if ticks is not None and _start_ticks(int(rec["pid"])) == ticks:  # that very process (no /proc: never)
                pid = int(rec["pid"])
            ports = tuple(int(p) for p in rec.get("ports", ()))
        out.append(Leftover(folder, int(owner_text), pid, ports))
    return out


def reap_leftover_servers(root: str | Path | None = None) -> list[Leftover]:
    """Kill the leftover servers (their process group: the stubs with them), remove their folders
    and shared-memory regions; returns what was found."""
    found = leftover_servers(root)
    for lo in found:
        if lo.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(lo.pid, signal.SIGKILL)
        shutil.rmtree(lo.folder, ignore_errors=True)
        for region in Path("/dev/shm").glob(f"{SHM_PREFIX}{lo.owner}_*") if Path("/dev/shm").is_dir() else ():
            with contextlib.suppress(OSError):
                region.unlink()
    return found

# Lines of Triton's log that say why models did not load or the server did not start.
_LOG_ERROR = re.compile(r"failed to load|unable to find backend|UNAVAILABLE|failed to start|[Aa]ddress (already )?in use|"
                        r"error: creating server|[Ii]nvalid argument|Unable to (open|find)|failed to (bind|listen)|unrecognized option|"
                        r"requires an argument")
_LOG_NOISE = re.compile(r"CudaDriverHelper|NVML|DCGM|CUDA driver version|unable to create stream|pinned memory")


def log_errors(text: str, limit: int = 20) -> list[str]:
    """The lines of a tritonserver log that explain a failed start (model load errors, the
    UNAVAILABLE rows of the model table, endpoint errors), without tracebacks; at most ``limit``."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _LOG_NOISE.search(line) or not _LOG_ERROR.search(line):
            continue
        line = line.split("\\n\\nAt:", 1)[0].split("\\n", 1)[0].rstrip()
        if line.startswith("|"):
            line = " ".join(c.strip() for c in line.strip("|").split("|"))
        if line not in out:
            out.append(line)
    return out[:limit]


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct free ports: every socket stays bound until all are picked, so the kernel cannot hand
    the same port out twice (sequential free_port() calls could, and tritonserver then refused to
    start: "cannot listen to HTTP requests and metrics requests at the same address and port")."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------------------------
# Container command for machines without a server binary


@dataclass(frozen=True)
class Release:
    release: str
    triton: str
    tensorrt: str


def release_table() -> tuple[list[Release], str]:
    """Triton container release -> TensorRT version, and the table's source (package data)."""

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
    configs = {c.parent.name: c.read_text() for c in sorted(Path(repo).glob("*/config.pbtxt"))}
    python = [n for n, t in configs.items() if re.search(r'backend:\s*"python"', t)]
    bundled = [n for n in python if '"$$TRITON_MODEL_DIRECTORY/' in configs[n]]
    host = [n for n, t in configs.items() if "EXECUTION_ENV_PATH" in t and n not in bundled]
    if host:
        notes.append(f"models {', '.join(host)} name an EXECUTION_ENV_PATH of this machine: mount that environment at the "
                     f"same path, or redeploy with --python-env ENV.tar.gz (a conda-pack archive shipped in the model folder)")
    plain = [n for n in python if n not in bundled and n not in host]
    if plain:
        notes.append(f"Python-backend models ({', '.join(plain)}) run in the container's own Python, which needs numpy, "
                     f"onnxruntime and pillow: use an image built FROM this one with 'pip install onnxruntime pillow', "
                     f"or redeploy with --python-env ENV.tar.gz")
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


class _StartFailed(Exception):
    """The server did not become ready (message: why); :meth:`TritonServer.start` reports it."""


class ServerError(TrtrepoError):
    """The server failed to start or died: the message lists its load errors, one per line."""

    multiline = True


@dataclass
class TritonServer:
    """Runs ``tritonserver`` on loopback ports in its own process group; a context manager.

    ``with TritonServer(repo) as s: s.http_url`` -- refuses ports another process listens on,
    waits until ``/v2/health/ready`` answers from *this* server (its process alive and holding the
    HTTP port; bounded by ``timeout``), and always stops the server (SIGTERM, then SIGKILL to the
    group). With ``copy=True`` (default) a temporary copy of the repository is served. The log is
    kept (``log_path``, outside the temporary folder); a failed start raises with the model load
    errors read from it. Python-backend models run in ``python_env`` (default
    :func:`find_python_env`; ``False``: the server's own Python), put first on the server's PATH.
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
    python_env: str | Path | bool | None = None
    keep_log: bool = False  # keep the log after a clean stop too (a failed start always keeps it)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _own_log: bool = field(default=False, init=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False)
    _log_file: Any = field(default=None, init=False)
    reaped: list[Leftover] = field(default_factory=list, init=False)  # leftovers of killed runs removed at start

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

    def command(self, repo: Path | str) -> list[str]:
        binary = runnable_server_binary(self.binary)
        if binary is None:
            where = self.binary or "PATH, $TRTREPO_TRITONSERVER or .triton/bin"
            raise OptionError("", f"tritonserver not found ({where}); run scripts/install_tritonserver.sh or pass {{server_binary}}",
                              others={"server_binary": "a server binary"})
        return [str(binary), f"--model-repository={repo}", f"--http-address={self.host}", f"--grpc-address={self.host}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true", "--log-verbose=0", f"--exit-timeout-secs={self.exit_timeout}",
                *([] if any("shm-region-prefix-name" in a for a in self.extra_args)
                  else [f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}"]),
                *self.extra_args]

    @property
    def shm_prefix(self) -> str:
        """Name prefix of the Python backend's /dev/shm regions of this server (Triton leaves them
        behind when it dies abnormally): ``trtrepo_pyb_<our pid>_<http port>_``."""
        return f"{SHM_PREFIX}{os.getpid()}_{self.http_port}_"

    def _remove_shm(self) -> None:
        for p in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            with contextlib.suppress(OSError):
                p.unlink()

    def environment(self) -> dict[str, str]:
        """The server's environment: the Python-backend environment first on PATH (see
        :func:`python_env_vars`), and this server's temporary folder as the place where tritonserver
        copies the models of an object-storage repository (:data:`MOUNT_DIRECTORY_VARS`, where the
        caller's environment does not name one)."""
        if self.python_env is False:
            out = dict(os.environ)
        else:
            out = python_env_vars(find_python_env() if self.python_env in (None, True) else Path(str(self.python_env)))
        if self._tmp is not None:
            for var in MOUNT_DIRECTORY_VARS:
                out.setdefault(var, self._tmp.name)
        return out

    def _claim_ports(self) -> None:
        """The ports given must differ and be free on the host (another process's port is an
        error); a port left at 0 gets a free one."""
        given = {"--http-port": self.http_port, "--grpc-port": self.grpc_port, "--metrics-port": self.metrics_port}
        check_distinct_ports(given)
        busy = busy_ports(self.host, {k: v for k, v in given.items() if v})
        if busy:
            label, port = busy[0]
            raise UsageError(f"port {port} ({label}) is in use on {self.host} by another process; stop it or choose "
                             f"another port ({label} 0 picks a free one)")
        taken = {p for p in (self.http_port, self.grpc_port, self.metrics_port) if p}
        picked = iter(p for p in free_ports(6) if p not in taken)
        self.http_port = self.http_port or next(picked)
        self.grpc_port = self.grpc_port or next(picked)
        self.metrics_port = self.metrics_port or next(picked)

    def _open_log_path(self) -> str | Path:
        """The log file given, else a temporary one of our own (removed on stop unless kept)."""
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"trtrepo-tritonserver-{self.http_port}-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = name, True
            return name
        return self.log_path

    def start(self) -> TritonServer:
        if Path("/dev/shm").is_dir():  # regions of servers whose trtrepo process was killed
            reap_stale(SHM_PREFIX, "/dev/shm")
        remote = is_remote(self.repo)  # an object-storage URL: tritonserver reads it itself, nothing is copied
        repo = Path(self.repo)
        if not remote and not repo.is_dir():
            raise UsageError(f"{repo}: model repository not found")
        self._claim_ports()
        cmd = self.command(str(self.repo) if remote else repo)  # fails (no server binary) before anything is copied
        self.reaped = reap_leftover_servers()
        for lo in self.reaped:
            log.warning("removed %s", lo.describe())
        self._tmp = temp_dir(SERVER_DIR_KIND)
        if self.copy and not remote:
            cmd = self.command(copy_repository(repo, Path(self._tmp.name) / "repo"))
        self._log_file = open(self._open_log_path(), "wb")  # noqa: SIM115 - closed in stop()
        log.info("starting %s", " ".join(cmd))
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=self.environment(),
                                         preexec_fn=functools.partial(_die_with_parent, _prctl(), os.getpid()))
        except OSError as exc:  # a file that is not a program (exec format error), ...
            self.stop()
            raise UsageError(f"tritonserver {cmd[0]}: cannot be run ({exc.strerror or exc})") from None
        record = {"pid": self.proc.pid, "start_ticks": _start_ticks(self.proc.pid), "owner": os.getpid(),
                  "ports": [self.http_port, self.grpc_port, self.metrics_port], "repo": str(self.repo)}
        staged = Path(self._tmp.name) / f".{_RECORD}"
        staged.write_text(json.dumps(record))
        os.replace(staged, Path(self._tmp.name) / _RECORD)  # a reader sees the whole record or none
        try:
            self.wait_ready()
        except _StartFailed as exc:
            self.keep_log = True
            self.stop()
            errors = log_errors(self.log_text())
            detail = "\n".join(f"  {e}" for e in errors) if errors else self.log_tail()
            raise ServerError(f"{exc}; log kept at {self.log_path}:\n{detail}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def log_text(self) -> str:
        try:
            return Path(str(self.log_path)).read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=timeout) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _answers_ready(self) -> bool:
        """``/v2/health/ready`` answers 200 and the answer comes from our process: it is alive and
        (its process group) holds the HTTP port (where /proc tells), also a moment later (a server that lost its ports
        to another one exits)."""
        for settle in (0.0, 0.5):
            time.sleep(settle)
            status = 0
            with contextlib.suppress(OSError):
                status, _ = self._get("/v2/health/ready", timeout=1.0)
            if status != 200 or not self._alive():
                return False
            assert self.proc is not None and self.http_port is not None
            if group_owns_port(self.proc.pid, self.http_port) is False:
                return False
        return True

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise _StartFailed(f"tritonserver exited with code {self.proc.returncode} while starting")
            if self._answers_ready():
                return
            time.sleep(0.1)
        raise _StartFailed(f"tritonserver not ready after {self.timeout:.0f}s")

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
        if proc is not None:
            self._remove_shm()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
            if self._own_log and not self.keep_log:
                with contextlib.suppress(OSError):
                    Path(str(self.log_path)).unlink()
        if self._tmp is not None:
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
