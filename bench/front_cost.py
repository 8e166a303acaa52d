"""Issue 40: what one layer left in float costs INT8's speed on the onnxruntime target (the
front's float cost, ``trtrepo.quantize.front._float_costs``). The trained MobileNetV2 with minmax
ranges on its first 256 calibration crops; all-INT8, then each weighted layer alone in float,
timed against FP32 at batch 32 on 64 crops with the front's stable windows; each layer's
activation elements read and written (per sample) beside it.

    python bench/front_cost.py [--cache /work/gauntlet-cache/mobilenet_v2] [--out docs/gauntlet/front_cost.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from _common import cpu_name

    from trtrepo.data import open_data
    from trtrepo.qdq import QuantizeOptions, insert_qdq, load_model, prepare_model
    from trtrepo.qdq.modelfiles import ranges_from_json
    from trtrepo.quantize.fallback import layer_roles
    from trtrepo.quantize.front import FRONT_STABILITY, WEIGHTED_ROLES, _float_costs
    from trtrepo.quantize.select import Evaluator

    with tempfile.TemporaryDirectory() as tmp:
        data, ranges_path = Path(tmp) / "calib.npz", Path(tmp) / "ranges.json"
        np.savez(data, input=np.load(args.cache / "calib.npz")["input"][:256])
        subprocess.run([sys.executable, "-m", "trtrepo.cli", "calibrate", str(args.cache / "model.onnx"), "--data", str(data),
                        "--method", "minmax", "--ranges", str(ranges_path), "-q"], check=True, cwd=ROOT)
        model = load_model(args.cache / "model.onnx")
        ranges = ranges_from_json(ranges_path)
        options = QuantizeOptions(target="onnxruntime")
        qm0 = insert_qdq(model, ranges, options, warn=False)
        layers = list(qm0.plan.layers)
        roles = layer_roles(prepare_model(model), layers)
        weighted = [n for n in layers if roles.get(n) in WEIGHTED_ROLES]
        costs = _float_costs(model, weighted)
        ev = Evaluator(model, open_data(str(data), limit=64), batch_size=32, threads=2)
        base = ev.stable_ratio(model, qm0.model, FRONT_STABILITY)
        print(f"all INT8: {base['ratio']:.2f}x FP32", file=sys.stderr)
        rows = []
        for layer in weighted:
            t = ev.stable_ratio(model, insert_qdq(model, ranges, options.with_excluded_nodes([layer]), warn=False).model,
                                FRONT_STABILITY)
            rows.append({"layer": layer, "speed_vs_fp32": t["ratio"], "vs_all_int8": t["ratio"] / base["ratio"],
                         "stable": t["stable"], "float_cost": costs[layer]})
            print(json.dumps(rows[-1]), file=sys.stderr)
    result = {"cpu": cpu_name(), "all_int8_vs_fp32": base["ratio"], "layers": rows,
              "spearman_cost_vs_slowdown": _spearman([r["float_cost"] for r in rows], [-r["vs_all_int8"] for r in rows])}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


if __name__ == "__main__":
    main()
