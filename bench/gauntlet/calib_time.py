"""Calibration time of trtrepo against NNCF on the gauntlet's vision models (issue 13), alternating
runs in fresh subprocesses on an otherwise idle machine, a few repetitions, medians.

trtrepo: ``trtrepo quantize MODEL --data calib.npz --limit N --target onnxruntime`` with its
defaults; its report's ``seconds`` gives the calibration (both passes of statistics collection)
and the whole run (method choice on held-out data, SmoothQuant choice, held-out check included).
NNCF 3.4: ``bench/gauntlet/peers.py --tool nncf`` (``nncf.quantize``: statistics, FastBiasCorrection,
the quantized model; its ``seconds``). Same calibration crops for both.

    python bench/gauntlet/calib_time.py [--models mobilenet_v2 vit_random convnext_random] [--reps 3]
        [--calib 256] [--update-docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", Path.home() / ".cache" / "trtrepo-gauntlet"))
SECTION = "## Calibration time against NNCF on the vision models (issue 13)"


def run_trtrepo(model: Path, calib: Path, n: int, work: Path) -> dict[str, float]:
    report = work / "rep"
    cmd = [sys.executable, "-m", "trtrepo.cli", "quantize", str(model), "--data", str(calib), "--limit", str(n),
           "--target", "onnxruntime", "-o", str(work / "q.onnx"), "--report", str(report), "--no-progress"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"trtrepo failed: {proc.stderr[-2000:]}")
    seconds = json.loads((report / "quantize.json").read_text())["seconds"]
    return {"calibration": seconds["calibration"], "total": seconds["total"], "process": wall}


def run_nncf(model: Path, calib: Path, work: Path) -> dict[str, float]:
    cmd = [sys.executable, str(HERE / "peers.py"), "--tool", "nncf", "--model", str(model), "--calib", str(calib),
           "--out", str(work / "nncf.onnx")]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    if not row.get("ok"):
        raise SystemExit(f"nncf failed: {row.get('error')}")
    return {"total": row["seconds"], "process": wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2", "vit_random", "convnext_random"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from _common import cpu_name, publish

    calib_npz = CACHE / "mobilenet_v2" / "calib.npz"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # NNCF gets exactly the samples trtrepo calibrates on: the first N crops of the file
        import numpy as np

        with np.load(calib_npz) as f:
            arrays = {k: f[k][: args.calib] for k in f.files}
        calib = work / "calib.npz"
        np.savez(calib, **arrays)
        for name in args.models:
            model = CACHE / name / "model.onnx"
            ours, theirs = [], []
            for rep in range(args.reps):
                first, second = (run_trtrepo, run_nncf) if rep % 2 == 0 else (run_nncf, run_trtrepo)
                for fn in (first, second):
                    if fn is run_trtrepo:
                        ours.append(run_trtrepo(model, calib, args.calib, work))
                    else:
                        theirs.append(run_nncf(model, calib, work))
                print(f"{name} rep {rep + 1}: trtrepo {ours[-1]}  nncf {theirs[-1]}", flush=True)
            med = {k: statistics.median(r[k] for r in ours) for k in ours[0]}
            nmed = {k: statistics.median(r[k] for r in theirs) for k in theirs[0]}
            rows.append((name, med, nmed, ours, theirs))
    cpu = cpu_name()
    flags = Path("/proc/cpuinfo").read_text()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    lines = [SECTION, "",
             f"`python bench/gauntlet/calib_time.py --reps {args.reps} --calib {args.calib}` on {cpu} ({os.cpu_count()} "
             f"cores, avx512_vnni: {'yes' if 'avx512_vnni' in flags else 'no'}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"trtrepo at {commit}: trtrepo and NNCF alternate in fresh subprocesses on an otherwise idle machine, "
             f"{args.calib} calibration crops each; medians of {args.reps} runs (seconds). trtrepo's calibration is both "
             "passes of statistics collection; its whole run adds the method choice on held-out data, the SmoothQuant "
             "choice and the held-out check against FP32. NNCF's time is its whole `nncf.quantize` (statistics, "
             "FastBiasCorrection, model). ViT and ConvNeXt have random weights (coverage only).", "",
             "| model | trtrepo calibration | trtrepo whole run | NNCF whole run | calibration / NNCF |",
             "|---|---:|---:|---:|---:|"]
    for name, med, nmed, _, _ in rows:
        lines.append(f"| {name} | {med['calibration']:.1f} | {med['total']:.1f} | {nmed['total']:.1f} | "
                     f"{med['calibration'] / nmed['total']:.2f} |")
    lines.append("")
    publish("\n".join(lines), SECTION, args.update_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
