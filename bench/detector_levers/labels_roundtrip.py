"""Issue 43, box labels on the trained YOLO11n: its own FP32 detections on 60 crops of six photographs
written as a COCO instances file (official category ids 1..90 with gaps, the categories listed in
reverse, file names under ``val/``), for ``trtrepo quantize --labels`` to read back (categories by the
export's class names, boxes into its letterbox). FP32 must score 1.000 against them. Then:

    trtrepo quantize yolo11n_dyn.onnx -o q.onnx --data OUT/photos --labels OUT/coco.json --report rep

``coco91.json``: Ultralytics' ``ultralytics.data.converter.coco80_to_coco91_class()``, written by the
torchvision venv (which has the ultralytics wheel) into OUT first.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import skimage.data as d
from PIL import Image

from trtrepo.detect import YoloLayout, postprocess, unletterbox
from trtrepo.evaluate import make_session
from trtrepo.modelio import ModelIO
from trtrepo.preprocessing import exporter_preprocess

CACHE = Path("/work/gauntlet-cache/yolo11n")


def main(out: Path) -> None:
    photos = out / "photos"
    photos.mkdir(parents=True, exist_ok=True)
    model = str(CACHE / "yolo11n_dyn.onnx")
    with zipfile.ZipFile(next((CACHE / "wheels").glob("ultralytics-*.whl"))) as z:
        base = {n: np.asarray(Image.open(io.BytesIO(z.read(f"ultralytics/assets/{n}.jpg"))).convert("RGB"))
                for n in ("bus", "zidane")}
    base.update({n: getattr(d, n)()[..., :3] for n in ("astronaut", "chelsea", "coffee", "rocket")})
    rng = np.random.default_rng(0)
    files = []
    for i in range(60):
        name = list(base)[i % len(base)]
        img = base[name]
        h, w = img.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1)), int(w * rng.uniform(0.6, 1))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        f = photos / f"{name}_{i:02d}.jpg"
        Image.fromarray(np.ascontiguousarray(img[y:y + ch, x:x + cw])).save(f, quality=92)
        files.append(f)
    pre = exporter_preprocess(model)
    assert pre is not None
    sess = make_session(model)
    names = ModelIO.from_onnx(model).class_names
    coco91 = json.loads((out / "coco91.json").read_text())
    images, anns = [], []
    for k, f in enumerate(files):
        im = Image.open(f)
        w, h = im.size
        raw = sess.run(None, {"images": pre.apply(im)[None]})[0]
        det = postprocess(raw, YoloLayout.from_shape(raw.shape, num_classes=80), conf=0.25, iou=0.7)[0]
        boxes = unletterbox(det.boxes, pre.letterbox_geometry((h, w)), (h, w))
        images.append({"id": 1000 + k, "file_name": "val/" + f.name, "width": w, "height": h})
        anns += [{"id": len(anns) + 1, "image_id": 1000 + k, "category_id": coco91[int(c)], "iscrowd": 0,
                  "area": float((b[2] - b[0]) * (b[3] - b[1])),
                  "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                 for b, c in zip(boxes, det.classes, strict=True)]
    cats = [{"id": coco91[i], "name": n, "supercategory": ""} for i, n in enumerate(names)][::-1]
    (out / "coco.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    print(len(files), "images", len(anns), "boxes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/labels-roundtrip"))
