"""Issue 43: where a quantized YOLO11n's time goes on ONNX Runtime CPU, by op type (batch 8, 2 threads,
ONNX Runtime's own profiler), and a round-robin speed of the models against the first (FP32).

    python bench/detector_levers/ops_profile.py FP32.onnx INT8.onnx [...]
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

CACHE = Path("/work/gauntlet-cache/yolo11n")


def session(path: str, profile: str | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    if profile:
        so.enable_profiling, so.profile_file_prefix = True, profile
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def by_op(path: str, x: np.ndarray, runs: int = 5) -> dict[str, float]:
    """Milliseconds per run by op type (kernel time)."""
    s = session(path, str(Path(tempfile.mkdtemp()) / "p"))
    for _ in range(2 + runs):
        s.run(None, {"images": x})
    ms: collections.Counter[str] = collections.Counter()
    for e in json.load(open(s.end_profiling())):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            ms[e["args"]["op_name"]] += e["dur"] / 1e3 / (2 + runs)
    return dict(ms.most_common())


def round_robin(paths: list[str], x: np.ndarray, rounds: int = 12) -> dict[str, float]:
    sessions = [session(p) for p in paths]
    for s in sessions:
        s.run(None, {"images": x})
    times: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(rounds):
        for p, s in zip(paths, sessions, strict=True):
            t = time.perf_counter()
            for _ in range(3):
                s.run(None, {"images": x})
            times[p].append((time.perf_counter() - t) / 3)
    return {p: float(np.median(v)) * 1e3 for p, v in times.items()}


if __name__ == "__main__":
    paths = sys.argv[1:]
    x = np.ascontiguousarray(np.load(CACHE / "calib.npy")[:8].astype(np.float32))
    ms = round_robin(paths, x)
    for p in paths:
        print(f"{p}: {ms[p]:.1f} ms, {ms[paths[0]] / ms[p]:.2f}x the first")
    for p in paths[1:]:
        ops = by_op(p, x)
        print(p, "; ".join(f"{k} {v:.1f}" for k, v in list(ops.items())[:14]))
