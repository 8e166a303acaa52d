"""Issue 40's acceptance run: `trtrepo deploy` of the trained MobileNetV2 on 256 calibration crops
with the default hold-out (a fifth), over several hold-outs; what it ships and that model's
expected top-1 drop on the 500 evaluation crops.

deploy's hold-out split is fixed (seed 0 of ``split_holdout``), so each run gets the 256 crops in
another order (a permutation seeded by the run's number): the fifth held out is a different set
of crops each time, as a user's own 256 images would be. Each run: ``trtrepo deploy model.onnx
--data calib_SEED.npz --repo TMP --backend python --workdir TMP/work --json`` [plus ``EXTRA``
options, e.g. a damaged configuration ``--method entropy --weight-rounding nearest``]; the
shipped model (``model.onnx`` of the version folder) is then run on the evaluation crops and
judged by ``trtrepo.evaluate.expected_top1_drop`` against FP32.

    python bench/deploy_seeds.py [--cache /work/gauntlet-cache/mobilenet_v2] [--seeds 10]
        [--extra "--method entropy --weight-rounding nearest"] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--extra", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from _common import cpu_name, logits

    from trtrepo.evaluate import expected_top1_drop

    calib = np.load(args.cache / "calib.npz")["input"][:256]
    x = np.load(args.cache / "eval.npz")["input"]
    fp32 = logits(args.cache / "model.onnx", x)
    rows = []
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / f"calib_{seed}.npz"
            np.savez(data, input=calib[np.random.default_rng(seed).permutation(len(calib))])
            cmd = [sys.executable, "-m", "trtrepo.cli", "deploy", str(args.cache / "model.onnx"), "--data", str(data),
                   "--repo", f"{tmp}/repo", "--backend", "python", "--name", "mnv2", "--workdir", f"{tmp}/work", "--json",
                   *shlex.split(args.extra)]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            wall = time.perf_counter() - t0
            row: dict = {"seed": seed, "exit": proc.returncode, "wall_s": wall}
            try:
                summary = json.loads(proc.stdout[proc.stdout.index("{"):])
            except ValueError:
                row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
                rows.append(row)
                print(json.dumps(row), flush=True)
                continue
            front = summary.get("front") or {}
            row.update(precision=summary.get("precision"),
                       kept_float=len((summary.get("accuracy") or {}).get("kept_float") or []),
                       gate=((summary.get("accuracy") or {}).get("gate") or {}).get("passed"),
                       front_reason=front.get("reason"),
                       front=[{k: r.get(k) for k in ("label", "drop", "upper", "confirm_drop", "verdict", "speed", "speed_stable")}
                              for r in front.get("rows", [])] or None)
            model = next(Path(tmp, "repo", "mnv2").glob("*/model.onnx"), None)
            if model is not None:
                e = expected_top1_drop(fp32, logits(model, x))
                row.update(eval_expected_drop=100 * e.estimate, eval_interval=[100 * e.lower, 100 * e.upper])
            rows.append(row)
            print(json.dumps(row), flush=True)
    int8 = [r for r in rows if r.get("precision") == "int8"]
    meta = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "extra": args.extra,
            "shipped_int8": len(int8), "runs": len(rows),
            "int8_max_eval_drop": max((r["eval_expected_drop"] for r in int8 if "eval_expected_drop" in r), default=None)}
    print(json.dumps(meta))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
