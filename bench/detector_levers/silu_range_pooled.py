"""Issue 43 study, with silu_range.py: its two models (the run's all-INT8 file and
``silu_range.onnx`` in ``--work``) judged on both crop sets pooled (the 640 held-out crops and 640
fresh crops of the same six photographs, seed 7), paired bootstrap over the 1280 crops (300 draws):
every class / classes >= 10 FP32 boxes / FP32's borderline boxes ignored.

    python bench/detector_levers/silu_range_pooled.py [--work /tmp/trtrepo-detector] [--out docs/gauntlet/silu_range_pooled.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, crops, photographs, run_model  # noqa: E402

from trtrepo.cpu import cpu_int8  # noqa: E402
from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _class_aps, _match_images  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402


def fig(m, images, classes=None):
    aps = _class_aps(m, images)
    return float(np.mean([v[m.main].mean() for c, v in aps.items() if classes is None or c in classes]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "gauntlet" / "silu_range_pooled.json")
    a = ap.parse_args()
    x = np.concatenate([np.load(a.cache / "eval.npy"), crops(photographs(a.cache / "wheels"), EVAL_PHOTOS, 640, seed=7)])
    raw = run_model(a.cache / "yolo11n_dyn.onnx", x)
    layout = Detector.of(raw[:8], 80).layout
    fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
    ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
    ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
    u, k = np.unique(np.concatenate([d.classes for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())
    matched = {}
    for name, f in (("all-INT8 (what deploy shipped)", "all-INT8.onnx"), ("Conv->SiLU over [max(min, -6), max]", "silu_range.onnx")):
        p = postprocess(run_model(a.work / f, x), layout, conf=CANDIDATE_CONF, iou=IOU)
        matched[name] = (_match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS),
                         _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS, ign))
    every = list(range(len(x)))
    rows = {n: [fig(s, every), fig(s, every, big), fig(g, every)] for n, (s, g) in matched.items()}
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(x), len(x)).tolist() for _ in range(300)]
    (b, bg), (n, ng) = matched.values()
    diff = np.array([[fig(n, d) - fig(b, d), fig(n, d, big) - fig(b, d, big), fig(ng, d) - fig(bg, d)] for d in draws])
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(), "crops": len(x),
              "classes": len(u), "big_classes": len(big), "fp32_boxes": int(k.sum()), "rows": rows,
              "new_minus_shipped": np.percentile(diff, [2.5, 50, 97.5], axis=0).T.tolist()}
    print(json.dumps(result))
    a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
