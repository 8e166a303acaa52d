"""Issue 43: what the gate's hold-out size does to the deploy of the trained YOLO11n. ``trtrepo deploy``
with defaults on the first N crops of bench/detector.py's calibration crops (seed 1, the same six
photographs; its held-out fifth judges), then the shipped model judged on the 640 held-out crops of
the other six photographs (mAP50-95 vs FP32, every class / the classes with >= 10 FP32 boxes) and
timed at batch 8 against FP32.

    python bench/detector_levers/calib_size.py [--n 400]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import detector as B  # noqa: E402

from trtrepo.detect.judge import CANDIDATE_CONF, IOU  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _class_aps, _match_images  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--work", type=Path, default=Path("/tmp/calib_size"))
    ap.add_argument("--reuse", action="store_true", help="judge the deploy already in --work")
    args = ap.parse_args()
    cache = Path("/work/gauntlet-cache/yolo11n")
    src, data = cache / "yolo11n_dyn.onnx", args.work / f"calib{args.n}.npy"
    args.work.mkdir(exist_ok=True)
    if not data.exists():
        np.save(data, B.crops(B.photographs(cache / "wheels"), B.CALIB_PHOTOS, args.n, seed=1))
    if not (args.reuse and (args.work / "deploy.log").exists()):
        shutil.rmtree(args.work / "repo", ignore_errors=True)
        B.trtrepo_cli(["deploy", str(src), "--name", "yolo11n", "--backend", "python", "--repo", str(args.work / "repo"),
                       "--workdir", str(args.work / "deploy"), "--force", "--data", str(data), "--batch-size", "8"],
                      args.work / "deploy.log")
    log = (args.work / "deploy.log").read_text()
    summary = json.JSONDecoder().raw_decode(log[log.index("{"):])[0]
    for step in summary["steps"]:
        print(step["step"], step["status"], step.get("detail"))
    print("front:", json.dumps(summary.get("front"))[:600])
    shipped = sorted((args.work / "repo" / "yolo11n").glob("[0-9]*/model.onnx"))[-1]
    x = np.load(cache / "eval.npy")
    det = Detector.of(B.run_model(src, x), 80)
    cls, counts = np.unique(np.concatenate([d.classes for d in det.reference]), return_counts=True)
    big = set(cls[counts >= B.BIG].tolist())
    m = _match_images(postprocess(B.run_model(shipped, x), det.layout, conf=CANDIDATE_CONF, iou=IOU), det.reference,
                      COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
    aps = _class_aps(m, list(range(len(x))))
    print(f"held-out 640: mAP50-95 vs FP32 every class {np.mean([v[m.main].mean() for v in aps.values()]):.3f}, classes >= 10 boxes {np.mean([v[m.main].mean() for c, v in aps.items() if c in big]):.3f}")
    t = B.speeds({"FP32": src, "shipped": shipped}, x, rounds=15)
    print("speed vs FP32 at batch 8: %.2fx" % (t["FP32"] / t["shipped"]))


if __name__ == "__main__":
    main()
