"""Issue 40 item 4: `trtrepo quantize` of the trained MobileNetV2 on 256 crops, quiet and beside a
CPU burner on every core, per target: wall time, peak RSS and the report's per-step seconds.

Each run is ``trtrepo quantize MODEL --data calib256.npz -o OUT --target T --report DIR
--accept-accuracy-loss`` in a fresh process (its peak RSS from ``getrusage(RUSAGE_CHILDREN)``);
``--burn`` starts one busy-loop process per core for the run's duration. ``--code DIR`` runs the
trtrepo of another checkout (a ``git worktree`` of an older commit) for a side-by-side.

    python bench/quantize_time.py [--cache /work/gauntlet-cache/mobilenet_v2] [--targets onnxruntime tensorrt]
        [--burn] [--code DIR] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def run(code: Path, model: Path, calib: Path, target: str, burn: bool) -> dict:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] if burn else []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(code)!r}); from trtrepo.cli import main; main()",
                   "quantize", str(model), "--data", str(calib), "-o", f"{tmp}/q.onnx", "--target", target,
                   "--report", f"{tmp}/rep", "--accept-accuracy-loss"]
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            report = json.loads(Path(f"{tmp}/rep/quantize.json").read_text()) if proc.returncode == 0 else {}
    finally:
        for b in burners:
            b.kill()
    wr = report.get("weight_rounding") or {}
    return {"target": target, "burn": burn, "code": str(code), "exit": proc.returncode, "wall_s": wall,
            "peak_rss_mb": max(rss, before) / 1024, "seconds": report.get("seconds"), "weight_rounding": wr.get("chosen"),
            "budget_cut": [c.get("budget_cut") for c in wr.get("candidates", []) if c.get("step") == "adaround"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--targets", nargs="+", default=["onnxruntime", "tensorrt"])
    ap.add_argument("--burn", action="store_true")
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    calib = args.cache / "calib256.npz"
    if not calib.exists():
        np.savez(calib, input=np.load(args.cache / "calib.npz")["input"][:256])
    rows = []
    for target in args.targets:
        rows.append(run(args.code, args.cache / "model.onnx", calib, target, args.burn))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
