# Issue 43, 2026-11-28: the same study on the tensorrt target (symmetric int8), and the speed of A and C at batch 8.
# Ran against the tree at 3d6973a, writing to /tmp/s43; kept in git only.
import json, sys, time, pickle
from pathlib import Path
import numpy as np
sys.path.insert(0, "/work/main/bench"); sys.path.insert(0, "/tmp/s43")
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
opts = QuantizeOptions(target="tensorrt")
model = load_model(SRC)
src = open_data(str(C / "calib.npy"), io=ModelIO.from_onnx(model, source=SRC))
src, _ = split_holdout(src, 0.2, 0)
st = Calibrator(SRC, src, batch_size=8, progress=False, tensors=calibration_tensors(model, opts)).collect()
log("stats")
R = {m: activation_ranges(st.compute(m), st) for m in ("percentile", "minmax")}
prod = {o: n for n in onnx.load(str(SRC)).graph.node for o in n.output}
rC = {t: (R["percentile"][t] if t in prod and prod[t].op_type == "Conv" else R["minmax"][t]) for t in R["percentile"]}
models = {"A_trt": W / "A_trt.onnx", "C_trt": W / "C_trt.onnx"}
for k, r in (("A_trt", R["percentile"]), ("C_trt", rC)):
    onnx.save(insert_qdq(load_model(SRC), r, opts).model, str(models[k]))
x = np.concatenate([np.load(C / "eval.npy"), np.load(W / "fresh.npy")])
fp = run(SRC, x); det = Detector.of(fp, 80); ref = det.reference
cls = np.concatenate([d.classes for d in ref]); u, c = np.unique(cls, return_counts=True); big = set(u[c >= 10].tolist())
M = {k: _match_images(postprocess(run(p, x), det.layout, conf=CANDIDATE_CONF, iou=IOU), ref, COCO_IOU_THRESHOLDS, COCO_MAX_DETS) for k, p in models.items()}
def figs(m, idx):
    aps = _class_aps(m, idx)
    return float(np.mean([v[m.main].mean() for v in aps.values()])), float(np.mean([v[m.main].mean() for cc, v in aps.items() if cc in big]))
out = {}
for name, idx in {"eval320": list(range(320)), "fresh320": list(range(320, 640)), "pooled640": list(range(640))}.items():
    out[name] = {k: figs(m, idx) for k, m in M.items()}; log(name, out[name])
rng = np.random.default_rng(0); d = []
for _ in range(300):
    idx = rng.integers(0, 640, 640).tolist(); a, b = figs(M["C_trt"], idx), figs(M["A_trt"], idx); d.append((a[0] - b[0], a[1] - b[1]))
d = np.asarray(d); out["C-A"] = {"all": np.percentile(d[:, 0], [2.5, 50, 97.5]).tolist(), "big": np.percentile(d[:, 1], [2.5, 50, 97.5]).tolist()}
log("C-A trt", out["C-A"])
# speed at batch 8: FP32, A, C (onnxruntime target models), round-robin
sess = {k: make_session(str(p), threads=2) for k, p in {"FP32": SRC, "A": W / "A.onnx", "C": W / "C.onnx"}.items()}
xb = np.ascontiguousarray(x[:8]); t = {k: [] for k in sess}
for r in range(12):
    for k, s in sess.items():
        t0 = time.perf_counter(); s.run(None, {"images": xb}); 
        if r >= 2: t[k].append(time.perf_counter() - t0)
med = {k: float(np.median(v)) for k, v in t.items()}; out["speed_b8"] = {k: med["FP32"] / v for k, v in med.items()}
log("speed", out["speed_b8"])
json.dump(out, open(W / "study_trt.json", "w"), indent=1)
