"""The held-out choice of calibration method on the trained MobileNetV2 (issue 26): trtrepo's
defaults on the onnxruntime target with ``--method`` forced to each method, and ``auto`` with
other held-out splits, on 256 and 512 calibration crops; each quantize in its own process, each
result measured on the gauntlet's 500 evaluation crops (top-1 agreement, on the confident crops,
logit RMSE).

    python bench/gauntlet/method_choice.py [--cache CACHE] [--runs 256:percentile:0 512:auto:1 ...]

Prints one JSON line per run (``--runs`` items are CALIB:METHOD:SEED; SEED is the held-out split's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

RUNS = ["256:percentile:0", "256:mse:0", "256:minmax:0", "256:entropy:0", "512:percentile:0", "512:mse:0",
        "512:minmax:0", "256:auto:1", "256:auto:2", "512:auto:1"]


def child(cache: Path, calib: Path, method: str, seed: int, out: str) -> None:
    from trtrepo.autoquant import run_quantize
    from trtrepo.quantize import QuantizeOptions

    t = time.perf_counter()
    r = run_quantize(cache / "model.onnx", out, data=str(calib), options=QuantizeOptions(target="onnxruntime"),
                     method=None if method == "auto" else method, seed=seed, accept_accuracy_loss=True)
    rep = r.report.to_dict()
    print(json.dumps({"method": r.method, "weight_rounding": (rep.get("weight_rounding") or {}).get("chosen"),
                      "seconds": round(time.perf_counter() - t, 1)}))


def main() -> None:
    from error_budget import figures, logits

    from trtrepo.evaluate import confident_mask

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--runs", nargs="+", default=RUNS)
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        calib, method, seed, out = args.child
        child(args.cache, Path(calib), method, int(seed), out)
        return
    x = np.load(args.cache / "eval.npz")["input"]
    fp32 = logits(args.cache / "model.onnx", x)
    conf = confident_mask(fp32)
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs:
            n, method, seed = run.split(":")
            calib = args.cache / f"calib{n}.npz"
            if not calib.exists():
                np.savez(calib, input=np.load(args.cache / "calib.npz")["input"][:int(n)])
            out = str(Path(tmp) / "q.onnx")
            proc = subprocess.run([sys.executable, __file__, "--cache", str(args.cache), "--child", str(calib), method, seed, out],
                                  capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
            info = json.loads(lines[-1]) if lines else {"error": proc.stderr[-500:]}
            if lines:
                info.update(figures(fp32, logits(out, x), conf))
            print(json.dumps({"calib": int(n), "requested": method, "seed": int(seed), **info}), flush=True)


if __name__ == "__main__":
    main()
