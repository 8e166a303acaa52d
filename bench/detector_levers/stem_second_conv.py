"""Issue 43 study: the image stem's strided second convolution kept float with its SiLU
(``trtrepo.qdq.rules.image_stem_nodes``, ``IMAGE_STEM_CONVS = 2``), measured through ``trtrepo
deploy`` (defaults: the gate, the front) on three calibration sets of 400 crops, judged on
bench/detector.py's 640 held-out crops of the wide set.

    python stem_second_conv.py ranges                  # every Conv + SiLU pre-activation on 48 calibration crops
    python stem_second_conv.py deploy OUT SETS_DIR     # 3 deploys (about 8 min each)
    python stem_second_conv.py judge OUT               # every class / populated / borderline ignored

Calibration sets: ``wide`` (bench/detector.py's ``calib_wide.npy``), ``wide_s3`` and ``more`` (written by
af2d93d:bench/detector_levers/top_percentile.py's ``collect`` into SETS_DIR as ``calib_wide_s3.npy`` and
``calib_more.npy``). Each deploy: ``trtrepo deploy yolo11n_dyn.onnx --name yolo11n --backend python --repo
OUT/<set>/repo --workdir OUT/<set>/deploy --force --data CALIB --batch-size 8 --json``.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, class_map, run_model  # noqa: E402

CACHE = Path("/work/gauntlet-cache/yolo11n")
SRC = CACHE / "yolo11n_dyn.onnx"


def ranges() -> None:
    """min, max and the 99.999th percentile of |x| of every SiLU's convolution output."""
    import onnx
    import onnxruntime as ort

    from trtrepo.onnxgraph import GraphView
    from trtrepo.qdq.rules import conv_silu_input

    model = onnx.load(str(SRC))
    view = GraphView(model)
    pre = [x for x in (conv_silu_input(view, n) for n in view.nodes) if x]
    del model.graph.output[:]
    for x in pre:
        model.graph.output.add().name = x
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    data = np.load(CACHE / "calib_wide.npy", mmap_mode="r")
    idx = np.sort(np.random.default_rng(0).choice(len(data), 48, replace=False))
    seen: dict[str, list[tuple[float, float, float]]] = {x: [] for x in pre}
    for i in range(0, 48, 8):
        for x, o in zip(pre, sess.run(None, {sess.get_inputs()[0].name: np.asarray(data[idx[i:i + 8]], np.float32)}), strict=True):
            seen[x].append((float(o.min()), float(o.max()), float(np.percentile(np.abs(o), 99.999))))
    for x in pre:
        a = np.array(seen[x])
        lo, hi, top = a[:, 0].min(), a[:, 1].max(), a[:, 2].max()
        print(f"{x:55s} min {lo:8.2f} max {hi:8.2f} p99.999 {top:7.2f} uint8 step {(min(hi, top) - max(lo, -6.0)) / 255:.3f}")


def deploy(out: Path, sets_dir: Path) -> None:
    sets = {"wide": CACHE / "calib_wide.npy", "more": sets_dir / "calib_more.npy", "wide_s3": sets_dir / "calib_wide_s3.npy"}
    for label, calib in sets.items():
        d = out / label
        d.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "trtrepo.cli", "deploy", str(SRC), "--name", "yolo11n", "--backend", "python",
                               "--repo", str(d / "repo"), "--workdir", str(d / "deploy"), "--force", "--data", str(calib),
                               "--batch-size", "8", "--json"], capture_output=True, text=True)
        (d / "deploy.json").write_text(proc.stdout)
        (d / "deploy.err").write_text(proc.stderr)
        print(label, proc.returncode, flush=True)


def judge(out: Path) -> None:
    from trtrepo.detect.judge import CANDIDATE_CONF, IOU, borderline_detections
    from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _match_images, mean_ap
    from trtrepo.detect.nms import postprocess
    from trtrepo.evaluate import Detector

    held = np.load(CACHE / "eval_wide.npy", mmap_mode="r")
    raw = np.concatenate([run_model(SRC, np.asarray(held[i:i + 64])) for i in range(0, len(held), 64)])
    det = Detector.of(raw, 80)
    ref, border = det.reference, borderline_detections(raw, det.layout)
    u, k = np.unique(np.concatenate([np.asarray(d.classes) for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())
    best, arg = raw[:, 4:].max(1), raw[:, 4:].argmax(1)
    mask = best > 0.05

    def logit(q: np.ndarray) -> np.ndarray:
        q = np.clip(q, 1e-6, 1 - 1e-6)
        return np.log(q / (1 - q))

    rows = {}
    for d in sorted(p for p in out.iterdir() if (p / "deploy.json").exists()):
        summary = json.loads((d / "deploy.json").read_text() or "{}")
        acc = summary.get("accuracy") or {}
        versions = sorted((p for p in (d / "repo" / "yolo11n").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        path = versions[-1] / "model.onnx"
        o = np.concatenate([run_model(path, np.asarray(held[i:i + 64])) for i in range(0, len(held), 64)])
        err = (logit(np.take_along_axis(o[:, 4:], arg[:, None], 1)[:, 0]) - logit(best))[mask]
        p = postprocess(o, det.layout, conf=CANDIDATE_CONF, iou=IOU)
        m = _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
        rows[d.name] = {"every": class_map(m, range(len(held))), "big": class_map(m, range(len(held)), big),
                        "ignored": mean_ap(p, ref, ignore=border).map50_95, "logit_rms": float(np.sqrt((err ** 2).mean())),
                        "per_photograph": {n: class_map(m, range(j, len(held), len(EVAL_PHOTOS))) for j, n in enumerate(EVAL_PHOTOS)},
                        "deploy": {"precision": summary.get("precision"), "gate": acc.get("gate", {}).get("message"),
                                   "weight_rounding": acc.get("steps", {}).get("weight_rounding"), "front": summary.get("front") is not None,
                                   "kept_float": [k["name"] for k in acc.get("kept_float", [])],
                                   "seconds": sum(s["seconds"] for s in summary.get("steps", []))}}
        print(d.name, {k: round(v, 3) for k, v in rows[d.name].items() if isinstance(v, float)}, flush=True)
    (out / "stem_second_conv.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "ranges":
        ranges()
    elif cmd == "deploy":
        deploy(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        judge(Path(sys.argv[2]))
