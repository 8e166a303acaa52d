"""Helpers shared by the benchmark scripts (run as ``python bench/NAME.py``: this folder is on sys.path)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def status_mb(key: str) -> float:
    """A memory figure of this process from /proc/self/status (``VmRSS``, ``VmHWM``, ...) in MiB; NaN when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" when there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def logits(path: str | Path, x: Any) -> Any:
    """A classifier's outputs on ``x`` (its first input), ONNX Runtime CPU, 50 samples a run."""
    import numpy as np

    from trtrepo.evaluate import make_session

    session = make_session(str(path))
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: x[i:i + 50]})[0] for i in range(0, len(x), 50)])


def publish(section: str, heading: str, docs: Path | None = None) -> None:
    """Print a results section and, with ``docs``, put it into that Markdown file (:func:`update_docs`)."""
    print(section)
    if docs is not None:
        update_docs(docs, heading, section)


def update_docs(path: Path, heading: str, section: str) -> None:
    """Replace the ``heading`` section of the Markdown file ``path`` (up to the next ``## ``) by
    ``section``, or append it; written atomically."""
    from trtrepo.fsutil import atomic_write_text

    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(heading)
    if start >= 0:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, text)


@dataclass
class Served:
    """A tritonserver serving one ONNX file as model ``demo`` and validate's target on it."""

    server: Any
    target: Any
    io: Any
    payloads: list

    def level(self, concurrency: int, interval_s: float | None = None) -> dict:
        """One of validate's load levels (windows of ``interval_s`` until three agree, validate's
        default when None): its report entry, with the machine's usage over it."""
        from trtrepo.measure import Stability
        from trtrepo.validate import ValidateOptions, run_latency

        stability = Stability() if interval_s is None else Stability(interval_s=interval_s)
        opts = ValidateOptions(model="demo", url=self.server.grpc_url, concurrency=(concurrency,), warmup=20,
                               progress=False, stability=stability, speed=None)
        return run_latency(self.target, self.payloads, opts, "1")["levels"][0]


@contextmanager
def served_fp32(repo: Path, onnx_path: Path, data: Any) -> Iterator[Served]:
    """``onnx_path`` added to ``repo`` as model ``demo`` (FP32 ONNX in the Python backend, the
    generated default config; ``$TRTREPO_BENCH_PYTHON_ENV`` names the backend's environment where
    the machine needs one: scripts/gpu_measurement.sh), served by one tritonserver, with batch-1
    payloads of ``data`` and validate's target ready on it."""
    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import TritonServer
    from trtrepo.tritonconfig import ModelOptions
    from trtrepo.validate import TritonTarget, ValidateOptions, make_payloads

    env = os.environ.get("TRTREPO_BENCH_PYTHON_ENV") or None
    add_onnx_model(repo, "demo", onnx_path, backend="python", options=ModelOptions(execution_env=env))
    io = ModelIO.from_onnx(onnx_path)
    payloads, _ = make_payloads(open_data(data, io=io), io, 1)
    with TritonServer(repo, timeout=300) as server:
        with TritonTarget(ValidateOptions(model="demo", url=server.grpc_url, progress=False, speed=None)) as target:
            target.wait_ready()
            target.prepare(io)
            yield Served(server, target, io, payloads)
