"""Shared fixtures. Other test modules append their own fixtures below; keep sections separate."""

from __future__ import annotations

import os


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``-n N``) each worker, and every process it starts (tritonserver
    included), runs on its own share of the CPUs, and the thread pools of OpenBLAS, OpenMP (torch)
    and ONNX Runtime are sized to that share: they size themselves to the machine and spin, so N
    workers sharing every core slow each other far more than N times. Runs on import, before numpy
    or torch start their pools. Without xdist nothing changes."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cpus, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    if n > 1:  # more workers than cores: several single-threaded workers share a core
        share = set(cpus[i::n]) if len(cpus) >= n else {cpus[i % len(cpus)]}
        os.sched_setaffinity(0, share)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, str(len(share)))


_pin_xdist_worker()


def _keep_bytecode() -> None:
    """Write bytecode caches even where the environment says not to (``PYTHONDONTWRITEBYTECODE``,
    set by some container images): the run starts a few hundred Python processes (the CLI, the
    servers' Python stubs), and without a cache each compiles trtrepo from source again, about
    0.5 s per process (docs/benchmarks.md, "The test run"). The caches land in the gitignored
    ``__pycache__`` folders; pytest's rewritten test modules are cached the same way."""
    import sys

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_keep_bytecode()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from trtrepo.cli import cli  # noqa: E402

# Modules that take longest (half a minute or more of one worker in the README's command or in the
# `long` tier; docs/benchmarks.md, "The test run"): handed out first under pytest-xdist, so that no
# long module starts last and runs alone.
LONG_MODULES = ("test_gauntlet_mobilenet_trt.py", "test_tune.py", "test_byom.py", "test_objectstore.py", "test_validate.py",
                "test_gauntlet_mobilenet.py", "test_fuzz_inputs.py", "test_readme.py", "test_quantize_transformer.py",
                "test_pipeline_cli.py", "test_mountpoint.py", "test_commit_protocol.py")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER") is None and not getattr(config.option, "numprocesses", None):
        return
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order inside a module kept


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo CNN exported once per test session (FP32, dynamic batch)."""
    from trtrepo.export import export_onnx

    path = tmp_path_factory.mktemp("demo") / "demo.onnx"
    export_onnx("demo", path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _reference_cache(tmp_path_factory: pytest.TempPathFactory):
    """The reference export cache (trtrepo.validate.reference) of this test run: a temporary folder, never
    the user's ~/.cache; shared by the session's tests, so a reference is exported once per run."""
    import os

    old = os.environ.get("TRTREPO_CACHE_DIR")
    os.environ["TRTREPO_CACHE_DIR"] = str(tmp_path_factory.mktemp("trtrepo-cache"))
    yield
    if old is None:
        os.environ.pop("TRTREPO_CACHE_DIR", None)
    else:
        os.environ["TRTREPO_CACHE_DIR"] = old


@pytest.fixture
def run_cli():
    """Run the trtrepo CLI in-process; returns click's Result (exit_code, output, stderr)."""
    runner = CliRunner()

    def run(*args: str, **kw):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False, **kw)

    return run


# --- Triton server (issue 6) -----------------------------------------------------------------
# A real tritonserver (scripts/install_tritonserver.sh puts one in .triton/). Tests that need it
# are marked `triton` and skipped with a reason when it is missing.


def _tritonserver_binary():
    from trtrepo.server import find_server_binary

    return find_server_binary(None)


requires_tritonserver = pytest.mark.skipif(
    _tritonserver_binary() is None,
    reason="tritonserver not installed (run scripts/install_tritonserver.sh or set TRTREPO_TRITONSERVER)",
)


@pytest.fixture(scope="module")
def triton_server():
    """Factory: ``server = triton_server(repo_path, **TritonServer kwargs)`` starts the real
    tritonserver on free 127.0.0.1 ports (serving a temporary copy of the repository) and waits
    until it is ready; ``server.http_url`` / ``server.grpc_url`` ("127.0.0.1:PORT") and
    ``server.urls`` give the addresses. Every server is stopped (process group) at the end of the
    module, also when a test fails. Skips when no tritonserver is installed."""
    from trtrepo.server import TritonServer

    if _tritonserver_binary() is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh or set TRTREPO_TRITONSERVER)")
    servers: list[TritonServer] = []

    def start(repo, **kw):
        kw.setdefault("timeout", 120.0)
        server = TritonServer(repo, **kw)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop(grace=0)  # killed: see tests/_servers.py


# --- the bad-input suite's count (tests/test_fuzz_inputs.py) ----------------------------------


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    fuzz = sys.modules.get("test_fuzz_inputs")
    if fuzz is not None and fuzz.COUNTS["cases"]:
        c = fuzz.COUNTS
        terminalreporter.write_line(f"bad-input cases (hypothesis): {c['cases']} run, {c['tracebacks']} tracebacks, "
                                    f"{c['wrong_exit']} wrong exit codes, {c['modified']} modified inputs")


# --- the trained YOLO11n (issue 43; long tier) ------------------------------------------------


@pytest.fixture(scope="session")
def yolo(tmp_path_factory) -> Path:
    """The YOLO11n export (scripts/yolo_export.sh, AGPL weights fetched at test time; reused from
    TRTREPO_YOLO_CACHE when set), once per session for every test that needs it."""
    import subprocess

    out = Path(os.environ.get("TRTREPO_YOLO_CACHE") or tmp_path_factory.mktemp("yolo11n"))
    script = Path(__file__).resolve().parents[1] / "scripts" / "yolo_export.sh"
    try:
        subprocess.run(["bash", str(script), str(out)], check=True, capture_output=True, text=True, timeout=1800)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"the YOLO11n export could not run here (scripts/yolo_export.sh): {str(exc)[-300:]}")
    return out
