"""Issue 43 study: two float islands at no integer-kernel change: the first convolution (on the
image, 3 -> 16, 3x3; its pre-activation range is [-6, 64] in the shipped file, a 0.27 step) and
the coarsest Detect branch (P5, 20x20 maps). Quantizers removed from the deployed all-INT8 file of
a bench/detector.py run (no new calibration or rounding); judged on the 640 held-out crops plus 640
fresh crops of the same six photographs (seed 7), paired bootstrap against the shipped file; the
class-logit error per Conv output made float (64 crops, anchors FP32 scores above 0.05); speed at
batch 8, round-robin.

    python bench/detector_levers/first_conv_p5.py [--work /tmp/trtrepo-detector]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, EVAL_PHOTOS, class_map, crops, photographs, run_model, speeds  # noqa: E402

from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _match_images, mean_ap  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector  # noqa: E402


def strip(model, pred):
    """Every activation's Q -> DQ pair whose producer ``pred(node or None)`` selects removed."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name for i in g.initializer}
    rename = {n.output[0]: n.input[0] for n in g.node
              if n.op_type == "QuantizeLinear" and n.input[0] not in inits and pred(producer.get(n.input[0]))}
    rename.update({n.output[0]: rename[n.input[0]] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in rename})
    keep = [n for n in g.node if not any(o in rename for o in n.output)]
    for n in keep:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    return m


def logit(p):
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    a = ap.parse_args()
    src = a.cache / "yolo11n_dyn.onnx"
    base = onnx.load(str(a.work / "deploy" / "model.int8.onnx"))
    layer0 = lambda p: p is None or (p.name.startswith("/model.0/") and p.op_type in ("Conv", "Sigmoid"))  # noqa: E731
    p5 = lambda p: p is not None and re.match(r"^/model\.23/cv[23]\.2/", p.name) is not None  # noqa: E731
    variants = {"shipped": base, "first conv float": strip(base, layer0), "P5 branch float": strip(base, p5),
                "both": strip(base, lambda p: layer0(p) or p5(p))}
    held = np.concatenate([np.load(a.cache / "eval.npy"), crops(photographs(a.cache / "wheels"), EVAL_PHOTOS, 640, seed=7)])
    raw = run_model(src, held)
    layout = Detector.of(raw[:8], 80).layout
    fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
    ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
    ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
    u, k = np.unique(np.concatenate([d.classes for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())
    matched = {}
    for name, m in variants.items():
        p = postprocess(run_model(m, held), layout, conf=CANDIDATE_CONF, iou=IOU)
        matched[name] = _match_images(p, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
        row = {s: [round(class_map(matched[name], idx, c), 3) for c in (None, big)]
               for s, idx in (("eval", range(640)), ("fresh", range(640, 1280)), ("pooled", range(1280)))}
        print(name, row, "borderline ignored, pooled", round(mean_ap(p, ref, ignore=ign).map50_95, 3), flush=True)
    rng = np.random.default_rng(0)
    draws = [rng.integers(0, 1280, 1280).tolist() for _ in range(200)]
    for name in list(variants)[1:]:
        d = np.array([[class_map(matched[name], x, c) - class_map(matched["shipped"], x, c) for c in (None, big)] for x in draws])
        print(name, "minus shipped (every class, classes >= 10 boxes):", np.percentile(d, [2.5, 50, 97.5], axis=0).T.round(3).tolist())
    few = held[:640][::10][:64]
    f = run_model(src, few)
    arg, mask = f[:, 4:].argmax(1), f[:, 4:].max(1) > 0.05
    lf = logit(np.take_along_axis(f[:, 4:], arg[:, None], 1)[:, 0])
    prod = {o: n for n in base.graph.node for o in n.output}
    convs = [prod[n.input[0]].name for n in base.graph.node
             if n.op_type == "QuantizeLinear" and n.input[0] in prod and prod[n.input[0]].op_type == "Conv"]
    errs = {}
    for name in [None, *convs]:
        m = base if name is None else strip(base, lambda p, nm=name: p is not None and p.name == nm)
        out = run_model(m, few)
        errs[name or "shipped"] = float(np.sqrt(((logit(np.take_along_axis(out[:, 4:], arg[:, None], 1)[:, 0]) - lf)[mask] ** 2).mean()))
    print("class-logit RMS error, shipped and the 6 Conv outputs whose float form lowers it most:",
          sorted(errs.items(), key=lambda kv: kv[1])[:6], errs["shipped"])
    for _ in range(2):
        t = speeds({"FP32": src, **variants}, held, rounds=15)
        print({k: round(t["FP32"] / v, 3) for k, v in t.items()})


if __name__ == "__main__":
    main()
