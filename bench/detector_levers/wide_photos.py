"""Issue 43 study: the same INT8 files judged on the six-photograph held-out crops and on the wide
set's (bench/detector.py ``--photos``). ``python wide_photos.py OUT.json LABEL=MODEL.onnx ...``:
strict mAP50-95 against FP32 over every class, over the classes with >= 10 FP32 boxes, FP32's
borderline boxes ignored, per held-out photograph; the crop files come from bench/detector.py's
cache (``calib.npy``/``eval.npy`` and ``*_wide.npy``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import EVAL_PHOTOS, run_model  # type: ignore[import-not-found]  # noqa: E402

CACHE = Path("/work/gauntlet-cache/yolo11n")
SRC = CACHE / "yolo11n_dyn.onnx"


def main(out: Path, models: dict[str, Path]) -> None:
    from trtrepo.detect.judge import borderline_detections, candidate_detections, reference_detections
    from trtrepo.detect.metrics import mean_ap
    from trtrepo.evaluate import detection_layout

    table: dict[str, dict] = {}
    for scope, file in (("six", "eval.npy"), ("wide", "eval_wide.npy")):
        x = np.load(CACHE / file)
        fp32 = run_model(SRC, x)
        layout = detection_layout(fp32.shape, 80)
        ref, border = reference_detections(fp32, layout), borderline_detections(fp32, layout)
        del fp32
        cls = np.concatenate([np.asarray(d.classes) for d in ref])
        u, k = np.unique(cls, return_counts=True)
        big = [int(c) for c, n in zip(u, k, strict=True) if n >= 10]
        refbig = [d.take(np.flatnonzero(np.isin(d.classes, big))) for d in ref]
        names = EVAL_PHOTOS[:6] if scope == "six" else EVAL_PHOTOS
        row: dict[str, dict] = {"_": {"crops": len(x), "fp32_boxes": int(len(cls)), "classes": int(len(u)),
                                      "classes_le3": int((k <= 3).sum()), "classes_ge10": len(big)}}
        for label, path in models.items():
            d = candidate_detections(run_model(path, x), layout)
            dbig = [e.take(np.flatnonzero(np.isin(e.classes, big))) for e in d]
            per = {}
            for j, n in enumerate(names):
                idx = range(j, len(x), len(names))
                per[n] = round(mean_ap([d[i] for i in idx], [ref[i] for i in idx]).map50_95, 3)
            row[label] = {"strict": mean_ap(d, ref).map50_95, "big": mean_ap(dbig, refbig).map50_95,
                          "ignored": mean_ap(d, ref, ignore=border).map50_95, "per_photograph": per}
        del x
        table[scope] = row
        print(scope, json.dumps(row), flush=True)
    out.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), {a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in sys.argv[2:]})
