"""Issue 40: how often the label-free gate passes a model on the default hold-out (51 crops).

The gate's figure is the expected top-1 drop under FP32's softmax with a 95 % upper bound
(``trtrepo.evaluate.expected_top1_drop``). This script takes INT8 (or FP16) copies of the trained
MobileNetV2 that already exist as files, computes each one's per-crop terms on the gauntlet's 500
evaluation crops once, then draws 1,000 random 51-crop hold-outs (seeded) and counts how often
each rule passes (upper end < 1 point), fails (estimate > 1 point) or cannot decide:

* ``plain``: the rule as shipped (the normal bound; the unseen flip only under 30 samples);
* ``unseen flip``: the first version, one unseen flip at the mean confident margin on every size.

    python bench/gate_holdout.py NAME=MODEL.onnx [NAME=MODEL.onnx ...] [--cache DIR] [--draws 1000]
        [--holdout 51] [--out results.json]

The models come from ``bench/gauntlet/run.py`` (its work folder: ``fp16.onnx``,
``trtrepo_onnxruntime.onnx``, ``trtrepo_tensorrt.onnx``) and from ``trtrepo quantize`` runs (a damaged
one: ``--target onnxruntime --method entropy --weight-rounding nearest --no-equalize``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rates(terms: np.ndarray, reference: np.ndarray, holdout: int, draws: int, seed: int = 0) -> dict[str, dict[str, float]]:
    from trtrepo.evaluate import ExpectedDrop, unseen_flip_cost

    rng = np.random.default_rng(seed)
    out: dict[str, list[str]] = {"plain": [], "unseen flip": []}
    for _ in range(draws):
        idx = rng.choice(len(terms), holdout, replace=False)
        t = terms[idx]
        shipped = ExpectedDrop.of(t, unseen_flip_cost(reference[idx]))
        out["plain"].append(shipped.verdict(1.0))
        # the first version: the bound of the same sample with one more flip at the confident margin
        cost = unseen_flip_cost(reference[idx])
        upper = max(shipped.upper, ExpectedDrop.of(np.append(t, cost), cost).upper)
        out["unseen flip"].append("pass" if upper < 0.01 else "fail" if shipped.estimate > 0.01 else "undecided")
    return {rule: {v: float(np.mean(np.array(vs) == v)) for v in ("pass", "fail", "undecided")} for rule, vs in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="NAME=MODEL.onnx")
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--holdout", type=int, default=51)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from _common import cpu_name, logits

    from trtrepo.evaluate import expected_top1_drop

    x = np.load(args.cache / "eval.npz")["input"]
    ref = logits(args.cache / "model.onnx", x)
    rows = []
    for item in args.models:
        name, path = item.split("=", 1)
        cand = logits(path, x)
        full = expected_top1_drop(ref, cand)
        from trtrepo.evaluate import expected_drop_terms

        r = {"model": name, "file": path, "eval_crops": len(x), "estimate_points": 100 * full.estimate,
             "interval_points": [100 * full.lower, 100 * full.upper], "top1_agreement": float(np.mean(ref.argmax(1) == cand.argmax(1))),
             "holdout": args.holdout, "draws": args.draws, "rates": rates(expected_drop_terms(ref, cand), ref, args.holdout, args.draws)}
        rows.append(r)
        print(json.dumps(r), flush=True)
    meta = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    lines = [f"{meta['date']}, {meta['cpu']}; {args.draws} random {args.holdout}-crop hold-outs of the {len(x)} evaluation crops "
             "(seed 0), limit 1 point.", "",
             "| model | top-1 agreement (500) | expected drop on 500 (95 % interval) | plain bound: pass / fail / cannot decide | unseen flip on every size: pass / fail / cannot decide |",
             "|---|---:|---|---|---|"]
    for r in rows:
        a, b = r["rates"]["plain"], r["rates"]["unseen flip"]
        lines.append(f"| {r['model']} | {100 * r['top1_agreement']:.1f} % | {r['estimate_points']:.2f} "
                     f"({r['interval_points'][0]:.2f}-{r['interval_points'][1]:.2f}) | "
                     f"{100 * a['pass']:.0f} % / {100 * a['fail']:.0f} % / {100 * a['undecided']:.0f} % | "
                     f"{100 * b['pass']:.0f} % / {100 * b['fail']:.0f} % / {100 * b['undecided']:.0f} % |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
