# Issue 43, 2026-11-28: the paired study behind trtrepo.quantize.ranges.detector_ranges (onnxruntime target). Ran against
# the tree at 3d6973a (before the rule existed: its A is the default then, its C the rule), writing to /tmp/s43; kept in git only.
"""Issue 43 study: A (trtrepo default, percentile everywhere) vs C (Conv outputs percentile, every
other activation min/max) vs NNCF ignored scope, on 640 held-out crops, paired bootstrap."""
import json, sys, time, pickle
from pathlib import Path
import numpy as np
sys.path.insert(0, "/work/main/bench")
C = Path("/work/gauntlet-cache/yolo11n"); W = Path("/tmp/s43"); SRC = C / "yolo11n_dyn.onnx"
import onnx
from trtrepo.evaluate import make_session, Detector
from trtrepo.qdq import QuantizeOptions, insert_qdq, load_model
from trtrepo.quantize.ranges import activation_ranges, calibration_tensors, split_holdout
from trtrepo.calibrate.calibrator import Calibrator
from trtrepo.data import open_data
from trtrepo.modelio import ModelIO
from trtrepo.detect.nms import postprocess
from trtrepo.detect.judge import CANDIDATE_CONF, IOU
from trtrepo.detect.metrics import _match_images, _class_aps, COCO_IOU_THRESHOLDS, COCO_MAX_DETS

def run(model, x, batch=8):
    s = make_session(str(model), threads=2)
    return np.concatenate([s.run(None, {"images": np.ascontiguousarray(x[i:i + batch])})[0] for i in range(0, len(x), batch)])

def log(*a): print(time.strftime("%H:%M:%S"), *a, flush=True)

opts = QuantizeOptions(target="onnxruntime")
if not (W / "stats.pkl").exists():
    model = load_model(SRC)
    src = open_data(str(C / "calib.npy"), io=ModelIO.from_onnx(model, source=SRC))
    src, _ = split_holdout(src, 0.2, 0)
    st = Calibrator(SRC, src, batch_size=8, progress=False, tensors=calibration_tensors(model, opts)).collect()
    pickle.dump(st, open(W / "stats.pkl", "wb"))
st = pickle.load(open(W / "stats.pkl", "rb"))
log("stats")
R = {m: activation_ranges(st.compute(m), st) for m in ("percentile", "minmax")}
prod = {o: n for n in onnx.load(str(SRC)).graph.node for o in n.output}
rC = {t: (R["percentile"][t] if t in prod and prod[t].op_type == "Conv" else R["minmax"][t]) for t in R["percentile"]}
models = {"A": W / "A.onnx", "C": W / "C.onnx"}
for k, r in (("A", R["percentile"]), ("C", rC)):
    if not models[k].exists():
        onnx.save(insert_qdq(load_model(SRC), r, opts).model, str(models[k]))
if not (W / "nncf.onnx").exists():
    import detector as B
    B.nncf_quantize(SRC, W / "nncf.onnx", np.load(C / "calib.npy"), True)
models["NNCF-ignored"] = W / "nncf.onnx"
if (W / "fresh.npy").exists():
    fresh = np.load(W / "fresh.npy")
else:
    import detector as B
    fresh = B.crops(B.photographs(C / "wheels"), B.EVAL_PHOTOS, 320, seed=7); np.save(W / "fresh.npy", fresh)
x = np.concatenate([np.load(C / "eval.npy"), fresh])
log("models", {k: str(v) for k, v in models.items()})
fp = run(SRC, x); det = Detector.of(fp, 80); ref = det.reference
cls = np.concatenate([d.classes for d in ref]); u, c = np.unique(cls, return_counts=True); big = set(u[c >= 10].tolist())
M = {}
for k, p in models.items():
    pred = postprocess(run(p, x), det.layout, conf=CANDIDATE_CONF, iou=IOU)
    M[k] = _match_images(pred, ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
    log(k, "matched")

def figs(m, idx):
    aps = _class_aps(m, idx)
    allc = float(np.mean([v[m.main].mean() for v in aps.values()]))
    bigc = float(np.mean([v[m.main].mean() for cc, v in aps.items() if cc in big]))
    return allc, bigc

sets = {"eval320": list(range(320)), "fresh320": list(range(320, 640)), "pooled640": list(range(640))}
out = {"boxes": int(len(cls)), "classes": int(len(u)), "big_classes": sorted(int(b) for b in big)}
for name, idx in sets.items():
    out[name] = {k: figs(m, idx) for k, m in M.items()}
    log(name, out[name])
rng = np.random.default_rng(0); n = 640; diffs = {p: [] for p in ("C-A", "C-NNCF-ignored", "A-NNCF-ignored")}
for _ in range(300):
    idx = rng.integers(0, n, n).tolist()
    f = {k: figs(m, idx) for k, m in M.items()}
    for p in diffs:
        a, b = p.split("-", 1)
        diffs[p].append((f[a][0] - f[b][0], f[a][1] - f[b][1]))
for p, v in diffs.items():
    v = np.asarray(v)
    out[p] = {"all": [float(np.percentile(v[:, 0], q)) for q in (2.5, 50, 97.5)], "big": [float(np.percentile(v[:, 1], q)) for q in (2.5, 50, 97.5)]}
    log(p, out[p])
json.dump(out, open(W / "study.json", "w"), indent=1)
