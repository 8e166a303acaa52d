"""Issue 43 study: a detector's min/max ranges (SiLU inputs and outputs, Concat, Add, pooling)
ended at the 99.999th percentile of |x| (``trtrepo.quantize.ranges.DETECTOR_TOP_PERCENTILE``)
against the plain min/max ranges, on three calibration sets of 400 crops each, judged on
bench/detector.py's 640 held-out crops of the wide set.

    python top_percentile.py collect OUT   # quantize: 3 calibration sets x 2 rules (about 40 min)
    python top_percentile.py judge OUT     # every class / populated / borderline ignored, paired

Calibration sets: ``wide`` (bench/detector.py's ``calib_wide.npy``: its 12 calibration photographs,
seed 1), ``wide_s3`` (the same photographs, seed 3), ``more`` (those 12 and 15 photographs from
detector repositories' sample folders, seed 1: fetch github:pjreddie/darknet,
github:eriklindernoren/PyTorch-YOLOv3, github:WongKinYiu/yolov7 and github:Megvii-BaseDetection/YOLOX
with the tool library's ``fetch``; MIRROR below, files checked against sha256 prefixes). Each file:
``trtrepo quantize yolo11n_dyn.onnx --target onnxruntime --data CALIB --batch-size 8
--accept-accuracy-loss``; "minmax" runs it with ``detector_ranges``' top left out.
"""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, CALIB_PHOTOS, EVAL_PHOTOS, class_map, crops, photographs, run_model, wide_photographs  # noqa: E402

CACHE = Path("/work/gauntlet-cache/yolo11n")
MIRROR = Path("/work/.mirror")
MORE = {  # name: (repository, commit, path, sha256 prefix)
    "dn_dog": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/dog.jpg", "5a9522051c3cec2b"),
    "dn_eagle": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/eagle.jpg", "f95f57297fd51a6c"),
    "dn_giraffe": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/giraffe.jpg", "00dc48a9b2af8a1f"),
    "dn_horses": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/horses.jpg", "c8f0a677a1356569"),
    "dn_kite": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/kite.jpg", "87410f52f79cc256"),
    "dn_person": ("pjreddie+darknet", "f6afaabcdf85f77e7aff2ec55c020c0e297c77f9", "data/person.jpg", "cdcbab947e46110f"),
    "py3_messi": ("eriklindernoren+PyTorch-YOLOv3", "1d621c8489e22c76ceb93bb2397ac6c8dfb5ceb7", "data/samples/messi.jpg", "b96f01a88bf15513"),
    "py3_person": ("eriklindernoren+PyTorch-YOLOv3", "1d621c8489e22c76ceb93bb2397ac6c8dfb5ceb7", "data/samples/person.jpg", "3f0bdad67d01aa45"),
    "py3_room": ("eriklindernoren+PyTorch-YOLOv3", "1d621c8489e22c76ceb93bb2397ac6c8dfb5ceb7", "data/samples/room.jpg", "fbb7fad63f242bf1"),
    "py3_street": ("eriklindernoren+PyTorch-YOLOv3", "1d621c8489e22c76ceb93bb2397ac6c8dfb5ceb7", "data/samples/street.jpg", "57b72b15708e0203"),
    "py3_train": ("eriklindernoren+PyTorch-YOLOv3", "1d621c8489e22c76ceb93bb2397ac6c8dfb5ceb7", "data/custom/images/train.jpg", "f2a1c49a48de3473"),
    "y7_image1": ("WongKinYiu+yolov7", "a207844b1ce82d204ab36d87d496728d3d2348e7", "inference/images/image1.jpg", "fb0f943cc1b027c6"),
    "y7_image2": ("WongKinYiu+yolov7", "a207844b1ce82d204ab36d87d496728d3d2348e7", "inference/images/image2.jpg", "90fad7bfc9fab884"),
    "y7_image3": ("WongKinYiu+yolov7", "a207844b1ce82d204ab36d87d496728d3d2348e7", "inference/images/image3.jpg", "2fb0ce5595986915"),
    "yolox_sunjian": ("Megvii-BaseDetection+YOLOX", "6ddff4824372906469a7fae2dc3206c7aa4bbaee", "assets/sunjian.png", "bff3508ded0d16b7"),
}


def more_photographs() -> dict[str, np.ndarray]:
    from PIL import Image

    out = {}
    for name, (repo, commit, path, sha) in MORE.items():
        blob = subprocess.run(["git", "-C", str(MIRROR / repo / "repo"), "show", f"{commit}:{path}"],
                              capture_output=True, check=True).stdout
        if not hashlib.sha256(blob).hexdigest().startswith(sha):
            raise SystemExit(f"error: {repo}:{path}: sha256 differs from {sha}")
        out[name] = np.asarray(Image.open(io.BytesIO(blob)).convert("RGB"))
    return out


def collect(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    photos = photographs(CACHE / "wheels") | wide_photographs(CACHE / "photos") | more_photographs()
    sets = {"wide": CACHE / "calib_wide.npy", "wide_s3": out / "calib_wide_s3.npy", "more": out / "calib_more.npy"}
    if not sets["wide_s3"].exists():
        np.save(sets["wide_s3"], crops(photos, CALIB_PHOTOS, 400, seed=3))
    if not sets["more"].exists():
        np.save(sets["more"], crops(photos, (*CALIB_PHOTOS, *sorted(MORE)), 400, seed=1))
    for label, calib in sets.items():
        for rule in ("minmax", "top"):
            target = out / f"{label}_{rule}.onnx"
            if target.exists():
                continue
            code = ("import sys, trtrepo.quantize.run as R\n"
                    "if sys.argv.pop(1) == 'minmax':\n"
                    "    f = R.detector_ranges; R.detector_ranges = lambda m, r, mm, top=None: f(m, r, mm)\n"
                    "from trtrepo.cli import main\nsys.argv = ['trtrepo', *sys.argv[1:]]\nmain()\n")
            log = subprocess.run([sys.executable, "-c", code, rule, "quantize", str(CACHE / "yolo11n_dyn.onnx"), "-o", str(target),
                                  "--target", "onnxruntime", "--data", str(calib), "--batch-size", "8", "--no-progress",
                                  "--accept-accuracy-loss"], capture_output=True, text=True)
            (out / f"{label}_{rule}.log").write_text(log.stdout + log.stderr)
            print(label, rule, log.returncode, log.stdout.splitlines()[:1], flush=True)


def judge(out: Path) -> None:
    from trtrepo.detect.judge import CANDIDATE_CONF, IOU, borderline_detections
    from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _match_images, mean_ap
    from trtrepo.detect.nms import postprocess
    from trtrepo.evaluate import Detector

    held = np.load(CACHE / "eval_wide.npy", mmap_mode="r")
    raw = np.concatenate([run_model(CACHE / "yolo11n_dyn.onnx", np.asarray(held[i:i + 64])) for i in range(0, len(held), 64)])
    det = Detector.of(raw, 80)
    ref, border = det.reference, borderline_detections(raw, det.layout)
    u, k = np.unique(np.concatenate([np.asarray(d.classes) for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())
    best, arg = raw[:, 4:].max(1), raw[:, 4:].argmax(1)
    mask = best > 0.05

    def logit(q: np.ndarray) -> np.ndarray:
        q = np.clip(q, 1e-6, 1 - 1e-6)
        return np.log(q / (1 - q))

    rows, matched = {}, {}
    for path in sorted(out.glob("*_*.onnx")):
        o = np.concatenate([run_model(path, np.asarray(held[i:i + 64])) for i in range(0, len(held), 64)])
        err = (logit(np.take_along_axis(o[:, 4:], arg[:, None], 1)[:, 0]) - logit(best))[mask]
        p = postprocess(o, det.layout, conf=CANDIDATE_CONF, iou=IOU)
        matched[path.stem] = m = _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
        rows[path.stem] = {"every": class_map(m, range(len(held))), "big": class_map(m, range(len(held)), big),
                           "ignored": mean_ap(p, ref, ignore=border).map50_95, "logit_rms": float(np.sqrt((err ** 2).mean())),
                           "per_photograph": {n: class_map(m, range(j, len(held), len(EVAL_PHOTOS))) for j, n in enumerate(EVAL_PHOTOS)}}
        print(path.stem, {k: round(v, 3) for k, v in rows[path.stem].items() if k != "per_photograph"}, flush=True)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, len(held), len(held)).tolist() for _ in range(300)]
    for label in sorted({s.rsplit("_", 1)[0] for s in matched}):
        a, b = matched[f"{label}_top"], matched[f"{label}_minmax"]
        d = np.array([[class_map(a, x, c) - class_map(b, x, c) for c in (None, big)] for x in draws])
        rows[f"{label}: top minus minmax"] = np.percentile(d, [2.5, 50, 97.5], axis=0).T.tolist()
        print(label, "top minus minmax (every class, populated):", np.percentile(d, [2.5, 50, 97.5], axis=0).T.round(3).tolist())
    (out / "top_percentile.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    {"collect": collect, "judge": judge}[sys.argv[1]](Path(sys.argv[2]))
