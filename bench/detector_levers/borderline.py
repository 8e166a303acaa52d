"""Issue 43 study: what the every-class mAP50-95 against FP32 measures on YOLO11n, and the figure
with FP32's borderline boxes (0.10-0.25) ignored. Reads the model files of a bench/detector.py run
(``--work``), the cached crops, and writes a JSON report.

    python bench/detector_levers/borderline.py [--work /tmp/trtrepo-detector] [--out docs/gauntlet/borderline.json]

1. Strict and borderline-ignored mAP50-95 (every class / classes with >= 10 FP32 boxes) of each
   model on the 640 held-out crops, on each half, per photograph, and on deploy's own hold-out
   (the 80 calibration crops ``split_holdout`` holds out of 400).
2. Where INT8's class scores move: the logit difference INT8 - FP32 of each anchor's FP32-best
   class where FP32 scores it 0.1-0.5 (first 160 held-out crops), per output scale (P3/P4/P5), for
   FP16, the all-INT8 model, and that model with every activation quantizer removed (weights only).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, float_baselines, run_model  # noqa: E402

from trtrepo.cpu import cpu_int8  # noqa: E402
from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import mean_ap  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402
from trtrepo.quantize.ranges import split_holdout  # noqa: E402


def figures(pred, fp, big):
    ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
    ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
    out = {}
    for key, ignore in (("strict", None), ("borderline_ignored", ign)):
        r = mean_ap(pred, ref, ignore=ignore)
        out[key] = [r.map50_95, float(np.mean([v for c, v in r.per_class.items() if c in big]))]
    return out


def activations_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """The Q/DQ model with every activation's QuantizeLinear -> DequantizeLinear pair removed."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name for i in g.initializer}
    rename = {n.output[0]: n.input[0] for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    rename.update({n.output[0]: rename[n.input[0]] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in rename})
    keep = [n for n in g.node if not any(o in rename for o in n.output)]
    for n in keep:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "gauntlet" / "borderline.json")
    a = ap.parse_args()
    src = a.cache / "yolo11n_dyn.onnx"
    w = a.work
    models = {"FP16 copy": float_baselines(src)["FP16 copy"], "trtrepo all-INT8 (what deploy shipped)": w / "all-INT8.onnx",
              "trtrepo naive (head quantized)": w / "naive.onnx", "NNCF 3.4 + published ignored scope": w / "nncf_1.onnx",
              "NNCF 3.4 defaults": w / "nncf_0.onnx"}
    held = np.load(a.cache / "eval.npy")
    calib = np.load(a.cache / "calib.npy", mmap_mode="r")
    _, idx = split_holdout(np.arange(len(calib)))
    gate_x = np.asarray(calib[np.asarray(idx)])
    raw = run_model(src, held)
    layout = Detector.of(raw[:8], 80).layout
    fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
    fp_gate = postprocess(run_model(src, gate_x), layout, conf=BORDERLINE_CONF, iou=IOU)
    classes = np.concatenate([d.classes[d.scores > REFERENCE_CONF] for d in fp])
    u, k = np.unique(classes, return_counts=True)
    big = set(u[k >= BIG].tolist())
    rows = {}
    for name, model in models.items():
        pred = postprocess(run_model(model, held), layout, conf=CANDIDATE_CONF, iou=IOU)
        halves = [figures([pred[i] for i in r], [fp[i] for i in r], big) for r in (range(0, 320), range(320, 640))]
        photos = {p: figures(pred[j::6], fp[j::6], big) for j, p in enumerate(EVAL_PHOTOS)}
        gate = figures(postprocess(run_model(model, gate_x), layout, conf=CANDIDATE_CONF, iou=IOU), fp_gate, big)
        rows[name] = {"held_out": figures(pred, fp, big), "halves": halves, "photographs": photos, "gate_hold_out": gate}
        print(name, rows[name]["held_out"], "gate", gate, flush=True)
    # 2. the class-logit noise per scale
    x = held[:160]
    f = raw[:160, 4:, :]
    best, cls = f.max(1), f.argmax(1)
    band = (best > 0.1) & (best < 0.5)
    scale = np.repeat([0, 1, 2], [6400, 1600, 400])[None, :].repeat(len(x), 0)

    def logit(p):
        p = np.clip(p, 1e-6, 1 - 1e-6)
        return np.log(p / (1 - p))
    noise = {}
    int8 = onnx.load(str(w / "all-INT8.onnx"))
    for name, model in (("FP16 copy", models["FP16 copy"]), ("all-INT8", int8), ("all-INT8, activations float (weights only)", activations_float(int8))):
        q = np.take_along_axis(run_model(model, x)[:, 4:, :], cls[:, None, :], 1)[:, 0]
        d = logit(q) - logit(best)
        noise[name] = {f"P{3 + s}": [float(d[band & (scale == s)].std()), float(d[band & (scale == s)].mean()), int((band & (scale == s)).sum())]
                       for s in range(3)}
        print(name, noise[name], flush=True)
    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(),
                                 "models_from": str(w), "rows": rows, "logit_noise_sd_mean_n": noise,
                                 "big_classes": sorted(big)}, indent=1))


if __name__ == "__main__":
    main()
