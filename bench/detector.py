"""Issue 43: a trained COCO detector (YOLO11n, the detection part of Ultralytics' yolo11n-seg) from
checkpoint to INT8, judged in boxes: trtrepo's defaults, the naive placement (the decode head
quantized too), an FP16 copy, and peers (NNCF 3.4 defaults, NNCF with the published ignored scope,
ONNX Runtime ``quantize_static``), all on the same held-out crops, side by side in one run.

Data (no COCO images ship offline; FP32's own detections are the reference): 12 real photographs
(scikit-image's astronaut, camera, chelsea, coffee, rocket, stereo_motorcycle left/right;
scikit-learn's china and flower; the Ultralytics wheel's bus and zidane; imgaug's quokka), split
by photograph: calibration crops from one set, held-out crops from the other, so that no
held-out crop shares a photograph with calibration. A crop covers 35-100 % of its photograph's
area (aspect 3:4 to 4:3, random position, mirrored half the time) and is letterboxed to 640x640
(gray 114 padding, Ultralytics' LetterBox), RGB / 255, NCHW float32.

Measures (``--update-docs`` writes the section of docs/benchmarks.md):
* mAP50-95 (COCO definition) of each model's detections against FP32's as pseudo ground truth
  (decode + class-aware NMS, conf 0.25, iou 0.7, max 300 per image: Ultralytics' predict
  settings), mAP50, box-count agreement;
* speed against FP32 on ONNX Runtime CPU at batch 8 (the dynamic-batch export), round-robin
  in one process, medians of timing windows;
* the gate's verdict (``trtrepo.autoquant.AccuracyCheck``) on each.

    python bench/detector.py [--cache /work/gauntlet-cache/yolo11n] [--calib 256] [--eval 320]
        [--update-docs docs/benchmarks.md]

The model comes from ``scripts/yolo_export.sh`` (AGPL weights: fetched and exported here, never
committed).
"""

from __future__ import annotations

import argparse
import io
import os
import zipfile
from pathlib import Path

import numpy as np

CALIB_PHOTOS = ("china", "flower", "coffee", "rocket", "camera", "moto_l")
EVAL_PHOTOS = ("bus", "zidane", "astronaut", "chelsea", "quokka", "moto_r")
SIZE = 640


def photographs(wheels: Path) -> dict[str, np.ndarray]:
    """The 12 photographs as RGB uint8 arrays (see the module doc)."""
    import skimage.data as d
    from PIL import Image
    from sklearn.datasets import load_sample_images

    out: dict[str, np.ndarray] = {}
    for name in ("astronaut", "camera", "chelsea", "coffee", "rocket"):
        a = getattr(d, name)()
        out[name] = (np.stack([a] * 3, -1) if a.ndim == 2 else a)[..., :3]
    for p in load_sample_images().filenames:
        out[Path(p).stem] = np.asarray(Image.open(p).convert("RGB"))
    left, right, _ = d.stereo_motorcycle()
    out["moto_l"], out["moto_r"] = left, right
    with zipfile.ZipFile(next(wheels.glob("ultralytics-*.whl"))) as z:
        for n in ("bus", "zidane"):
            out[n] = np.asarray(Image.open(io.BytesIO(z.read(f"ultralytics/assets/{n}.jpg"))).convert("RGB"))
    with zipfile.ZipFile(next(wheels.glob("imgaug-*.whl"))) as z:
        out["quokka"] = np.asarray(Image.open(io.BytesIO(z.read("imgaug/quokka.jpg"))).convert("RGB"))
    return out


def letterbox(img: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Ultralytics' LetterBox (auto=False, centered): the longest side to ``size``, gray 114 padding."""
    from PIL import Image

    h, w = img.shape[:2]
    r = min(size / h, size / w)
    nh, nw = int(round(h * r)), int(round(w * r))
    resized = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
    out = np.full((size, size, 3), 114, np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top:top + nh, left:left + nw] = resized
    return out


def crops(photos: dict[str, np.ndarray], names: tuple[str, ...], n: int, seed: int) -> np.ndarray:
    """``n`` letterboxed crops, [n, 3, 640, 640] float32 in [0, 1], cycling over ``names``."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, SIZE, SIZE), np.float32)
    for i in range(n):
        img = photos[names[i % len(names)]]
        h, w = img.shape[:2]
        area = rng.uniform(0.35, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(h, round(np.sqrt(area / aspect))))
        cw = int(min(w, round(np.sqrt(area * aspect))))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        c = img[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            c = c[:, ::-1]
        out[i] = letterbox(np.ascontiguousarray(c)).transpose(2, 0, 1) / 255.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TRTREPO_YOLO_CACHE", "/work/gauntlet-cache/yolo11n")))
    ap.add_argument("--wheels", type=Path, default=None, help="folder with the ultralytics and imgaug wheels")
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--eval", type=int, default=320)
    args = ap.parse_args()
    wheels = args.wheels or args.cache / "wheels"
    photos = photographs(wheels)
    args.cache.mkdir(parents=True, exist_ok=True)
    np.save(args.cache / "calib.npy", crops(photos, CALIB_PHOTOS, args.calib, seed=1))
    np.save(args.cache / "eval.npy", crops(photos, EVAL_PHOTOS, args.eval, seed=2))


if __name__ == "__main__":
    main()
