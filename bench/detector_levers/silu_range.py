"""Issue 43 study: the pre-activation (a Conv output read by a SiLU) quantized over
``[max(min, -6), max]`` of the calibration data instead of the method's clipped range (SiLU is flat
below -6: SiLU(-6) = -0.015; its positive side is the identity, so the upper tail is kept).
Re-quantizes YOLO11n with trtrepo (onnxruntime target, the all-INT8 command of bench/detector.py:
the same ranges, weight rounding and choices, the rule patched in) and judges it against the
run's all-INT8 file on the 640 held-out crops and on 640 fresh crops of the same six photographs
(seed 7), paired bootstrap over the crops (300 draws), every class / classes >= 10 boxes / FP32's
borderline boxes ignored.

    python bench/detector_levers/silu_range.py [--work /tmp/trtrepo-detector] [--out docs/gauntlet/silu_range.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, crops, photographs, run_model, speeds  # noqa: E402

import trtrepo.quantize.run as qrun  # noqa: E402
from trtrepo.cpu import cpu_int8  # noqa: E402
from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _class_aps, _match_images  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402
from trtrepo.onnxgraph import producer_map  # noqa: E402
from trtrepo.qdq.options import ActivationRange  # noqa: E402

FLAT = -6.0


def patched(original):
    def rule(model, ranges, minmax):
        out = original(model, ranges, minmax)
        producers = producer_map(model.graph.node)
        readers: dict[str, set[str]] = {}
        for n in model.graph.node:
            for x in n.input:
                readers.setdefault(x, set()).add(n.op_type)
        for name in out:
            node = producers.get(name)
            mm = minmax.get(name)
            if node is not None and node.op_type == "Conv" and "Sigmoid" in readers.get(name, ()) and mm is not None \
                    and mm.lo is not None and mm.hi is not None:
                lo, hi = max(mm.lo, FLAT), mm.hi
                out[name] = ActivationRange(max(abs(lo), abs(hi)), lo, hi)
        return out
    return rule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "gauntlet" / "silu_range.json")
    a = ap.parse_args()
    src = a.cache / "yolo11n_dyn.onnx"
    new = a.work / "silu_range.onnx"
    qrun.detector_ranges = patched(qrun.detector_ranges)
    from trtrepo.cli import cli
    t0 = time.perf_counter()
    cli.main(["quantize", str(src), "-o", str(new), "--target", "onnxruntime", "--accept-accuracy-loss", "--data",
              str(a.cache / "calib.npy"), "--batch-size", "8", "--no-progress"], standalone_mode=False)
    seconds = time.perf_counter() - t0
    sets = {"held-out 640": np.load(a.cache / "eval.npy"),
            "fresh 640 (seed 7)": crops(photographs(a.cache / "wheels"), EVAL_PHOTOS, 640, seed=7)}
    models = {"all-INT8 (what deploy shipped)": a.work / "all-INT8.onnx", "Conv->SiLU over [max(min, -6), max]": new}
    result: dict = {}
    rng = np.random.default_rng(0)
    for set_name, x in sets.items():
        raw = run_model(src, x)
        layout = Detector.of(raw[:8], 80).layout
        fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
        ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
        ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
        u, k = np.unique(np.concatenate([d.classes for d in ref]), return_counts=True)
        big = set(u[k >= BIG].tolist())
        matched = {}
        for name, m in models.items():
            p = postprocess(run_model(m, x), layout, conf=CANDIDATE_CONF, iou=IOU)
            matched[name] = (_match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS),
                             _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS, ign))

        def fig(m, images, classes=None):
            aps = _class_aps(m, images)
            return float(np.mean([v[m.main].mean() for c, v in aps.items() if classes is None or c in classes]))
        everything = list(range(len(x)))
        rows = {n: [fig(s, everything), fig(s, everything, big), fig(g, everything)] for n, (s, g) in matched.items()}
        draws = [rng.integers(0, len(x), len(x)).tolist() for _ in range(300)]
        (a_s, a_g), (b_s, b_g) = matched[list(models)[1]], matched[list(models)[0]]
        diff = np.array([[fig(a_s, d) - fig(b_s, d), fig(a_s, d, big) - fig(b_s, d, big), fig(a_g, d) - fig(b_g, d)] for d in draws])
        result[set_name] = {"rows": rows, "new_minus_shipped": np.percentile(diff, [2.5, 50, 97.5], axis=0).T.tolist()}
        print(set_name, json.dumps(result[set_name]), flush=True)
    t = speeds({"FP32": src, **models}, sets["held-out 640"][:8], rounds=12)
    result["speed_vs_fp32"] = {k: t["FP32"] / v for k, v in t.items()}
    print(result["speed_vs_fp32"])
    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(),
                                 "quantize_seconds": seconds, **result}, indent=1))


if __name__ == "__main__":
    main()
