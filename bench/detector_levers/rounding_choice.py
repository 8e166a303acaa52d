"""Issue 43 study: how well deploy's 80-crop hold-out chooses between weight-rounding candidates on
YOLO11n. The two candidates are quantized with everything else the default (entropy ranges, the
onnxruntime target):

    for w in nearest adaround; do trtrepo quantize yolo11n_dyn.onnx -o head_$w.onnx --target onnxruntime \\
        --accept-accuracy-loss --data calib.npy --batch-size 8 --weight-rounding $w --method entropy; done
    python bench/detector_levers/rounding_choice.py --work DIR   # DIR holds head_nearest.onnx, head_adaround.onnx

Judged on bench/detector.py's 640 held-out crops plus 640 fresh crops of the same six photographs
(seed 7): strict mAP50-95 against FP32, the classes with >= 10 FP32 boxes, FP32's borderline boxes
ignored; how often AdaRound leads on random 80-crop subsets (the gate's hold-out size); the paired
bootstrap over the 1280 crops.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, class_map, crops, photographs, run_model  # noqa: E402

from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _match_images, mean_ap  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args()
    held = np.concatenate([np.load(a.cache / "eval.npy"), crops(photographs(a.cache / "wheels"), EVAL_PHOTOS, 640, seed=7)])
    raw = run_model(a.cache / "yolo11n_dyn.onnx", held)
    layout = Detector.of(raw[:8], 80).layout
    fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
    ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
    ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
    u, k = np.unique(np.concatenate([d.classes for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())
    matched = {}
    for name in ("nearest", "adaround"):
        p = postprocess(run_model(a.work / f"head_{name}.onnx", held), layout, conf=CANDIDATE_CONF, iou=IOU)
        matched[name] = _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
        row = {s: [round(class_map(matched[name], idx, c), 3) for c in (None, big)]
               for s, idx in (("eval", range(640)), ("fresh", range(640, 1280)), ("pooled", range(1280)))}
        print(name, row, "borderline ignored: eval", round(mean_ap(p[:640], ref[:640], ignore=ign[:640]).map50_95, 3),
              "pooled", round(mean_ap(p, ref, ignore=ign).map50_95, 3), flush=True)
    rng = np.random.default_rng(0)
    diffs = []
    for _ in range(200):
        idx = rng.choice(1280, 80, replace=False).tolist()
        diffs.append(class_map(matched["adaround"], idx) - class_map(matched["nearest"], idx))
    print("80-crop subsets (200): AdaRound ahead in", int(np.sum(np.array(diffs) > 0)), "; AdaRound minus nearest 2.5/50/97.5 %:",
          np.percentile(diffs, [2.5, 50, 97.5]).round(3).tolist())
    d = np.array([[class_map(matched["adaround"], x, c) - class_map(matched["nearest"], x, c) for c in (None, big)]
                  for x in [rng.integers(0, 1280, 1280).tolist() for _ in range(200)]])
    print("paired over the 1280 crops, AdaRound minus nearest (every class, classes >= 10 boxes):",
          np.percentile(d, [2.5, 50, 97.5], axis=0).T.round(3).tolist())


if __name__ == "__main__":
    main()
