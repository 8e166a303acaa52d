"""Issue 43: one scale for every input and the output of each quantized Concat (QLinearConcat then
copies instead of requantizing, as TensorRT's scale unification does), measured against trtrepo's
placement on the trained YOLO11n: mAP50-95 vs FP32 on bench/detector.py's 640 held-out crops (every
class / the classes with >= 10 FP32 boxes), paired bootstrap over the crops, and the speed at batch 8.

    python bench/detector_levers/concat_scales.py
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ops_profile import CACHE, round_robin  # noqa: E402

from trtrepo.calibrate.calibrator import Calibrator  # noqa: E402
from trtrepo.data import open_data  # noqa: E402
from trtrepo.detect.judge import CANDIDATE_CONF, IOU  # noqa: E402
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _class_aps, _match_images  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector, make_session  # noqa: E402
from trtrepo.modelio import ModelIO  # noqa: E402
from trtrepo.onnxgraph import GraphView  # noqa: E402
from trtrepo.qdq import ActivationRange, QuantizeOptions, insert_qdq, load_model, plan_qdq, prepare_model  # noqa: E402
from trtrepo.quantize.ranges import activation_ranges, calibration_tensors, detector_ranges, split_holdout  # noqa: E402

SRC, WORK = CACHE / "yolo11n_dyn.onnx", Path("/tmp/concat_scales")
OPTS = QuantizeOptions(target="onnxruntime")


def unified(model, ranges):
    """Each group of tensors joined by quantized Concats (through the tied data-movement outputs)
    gets the union of its members' ranges."""
    work = prepare_model(model)
    plan = plan_qdq(work, OPTS, view=GraphView(work), ranges=ranges)
    quantized, parent = set(plan.activation_tensors()), {}

    def find(a):
        parent.setdefault(a, a)
        while parent[a] != a:
            a = parent[a]
        return a
    for n in GraphView(work).nodes:
        if n.op_type == "Concat" and all(t in quantized for t in [*n.input, n.output[0]]):
            for t in n.input:
                parent[find(plan.tied.get(t, t))] = find(plan.tied.get(n.output[0], n.output[0]))
    groups = collections.defaultdict(list)
    for t in list(parent):
        groups[find(t)].append(t)
    out = dict(ranges)
    for g in groups.values():
        lo, hi = min(ranges[t].lo for t in g), max(ranges[t].hi for t in g)
        out.update({t: ActivationRange(max(abs(lo), abs(hi)), lo, hi) for t in g})
    return out


def run(path, x, b=8):
    s = make_session(str(path), threads=2)
    return np.concatenate([s.run(None, {"images": np.ascontiguousarray(x[i:i + b])})[0] for i in range(0, len(x), b)])


def main() -> None:
    WORK.mkdir(exist_ok=True)
    model = load_model(SRC)
    src, _ = split_holdout(open_data(str(CACHE / "calib.npy"), io=ModelIO.from_onnx(model, source=SRC)), 0.2, 0)
    st = Calibrator(SRC, src, batch_size=8, progress=False, tensors=calibration_tensors(model, OPTS)).collect()
    r = detector_ranges(model, activation_ranges(st.compute("percentile"), st), activation_ranges(st.compute("minmax"), st))
    paths = {"trtrepo (all-INT8)": WORK / "int8.onnx", "Concat scales unified": WORK / "unified.onnx"}
    for (_name, path), ranges in zip(paths.items(), (r, unified(model, r)), strict=True):
        onnx.save(insert_qdq(load_model(SRC), ranges, OPTS, warn=False).model, str(path))
    x = np.load(CACHE / "eval.npy")
    det = Detector.of(run(SRC, x), 80)
    cls, counts = np.unique(np.concatenate([d.classes for d in det.reference]), return_counts=True)
    big = set(cls[counts >= 10].tolist())
    matched = {k: _match_images(postprocess(run(p, x), det.layout, conf=CANDIDATE_CONF, iou=IOU), det.reference,
                                COCO_IOU_THRESHOLDS, COCO_MAX_DETS) for k, p in paths.items()}

    def figs(m, idx):
        aps = _class_aps(m, idx)
        return (np.mean([v[m.main].mean() for v in aps.values()]),
                np.mean([v[m.main].mean() for c, v in aps.items() if c in big]))
    every = list(range(len(x)))
    for k, m in matched.items():
        print(k, "mAP50-95 vs FP32 every class {:.3f}, classes >= 10 boxes {:.3f}".format(*figs(m, every)))
    rng, d = np.random.default_rng(0), []
    a, b = matched.values()
    for _ in range(300):
        idx = rng.integers(0, len(x), len(x)).tolist()
        d.append(np.subtract(figs(b, idx), figs(a, idx)))
    q = np.percentile(np.asarray(d), [2.5, 50, 97.5], axis=0)
    print(f"unified minus trtrepo, paired (median, 95 %): every class {q[1, 0]:+.3f} ({q[0, 0]:+.3f}..{q[2, 0]:+.3f}), big {q[1, 1]:+.3f} ({q[0, 1]:+.3f}..{q[2, 1]:+.3f})")
    ms = round_robin([str(SRC), *map(str, paths.values())], np.ascontiguousarray(x[:8]))
    print("; ".join(f"{Path(p).name} {v:.1f} ms ({ms[str(SRC)] / v:.2f}x FP32)" for p, v in ms.items()))


if __name__ == "__main__":
    main()
