# Issue 43, 2026-11-28: ad-hoc lever screens on YOLO11n (helper session), kept in git only: they ran against a
# `git archive` of trtrepo at c82de05 in /tmp/h44/acc/snap (module names before issue 42 item 9) and write to /tmp/h44/acc/work.
"""acc's harness: FP32 reference on eval crops, mAP of a model, trtrepo calibration stats."""
import os, sys, pickle, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "/tmp/h44/acc/snap"); sys.path.insert(0, "/tmp/h44/acc/snap/bench")
C = Path("/work/gauntlet-cache/yolo11n"); W = Path("/tmp/h44/acc/work")
SRC = C / "yolo11n_dyn.onnx"
import trtrepo.plugins as _pl
_pl.entry_points = lambda group: []  # the venv metadata names the working tree's trtrepo.qdq (mid-rename); built-ins only

def run_model(model, x, batch=8, threads=2):
    from trtrepo.evaluate import make_session
    if not isinstance(model, (str, Path)):
        model = model.SerializeToString()
    s = make_session(str(model) if isinstance(model, Path) else model, threads=threads)
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: np.ascontiguousarray(x[i:i + batch])})[0] for i in range(0, len(x), batch)])

_ref = {}
def reference(n=160):
    if n not in _ref:
        f = W / f"fp32_{n}.npy"
        held = np.load(C / "eval.npy", mmap_mode="r")[:n]
        if f.exists(): fp = np.load(f)
        else:
            fp = run_model(SRC, held); np.save(f, fp)
        from trtrepo.evaluate import Detector
        _ref[n] = (held, fp, {"output0": Detector.of(fp, 80)})
    return _ref[n]

def mAP(model, n=160):
    from trtrepo.evaluate import compare_outputs
    held, fp, det = reference(n)
    out = run_model(model, held)
    m = compare_outputs({"output0": fp}, {"output0": out}, detection=det)["output0"]
    return float(m.detection.map50_95)

def options(**kw):
    from trtrepo.quantize import QuantizeOptions
    return QuantizeOptions(target="onnxruntime", **kw)

def stats(split=True):
    """trtrepo's calibration statistics on calib.npy (its default 80/20 split when split)."""
    f = W / f"stats_{int(split)}.pkl"
    if f.exists():
        return pickle.load(open(f, "rb"))
    from trtrepo.calibrate.calibrator import Calibrator
    from trtrepo.autoquant.ranges import calibration_tensors, split_holdout
    from trtrepo.data import open_data
    from trtrepo.quantize import load_model
    from trtrepo.modelio import ModelIO
    model = load_model(SRC)
    io = ModelIO.from_onnx(model, source=SRC)
    src = open_data(str(C / "calib.npy"), io=io)
    if split:
        src, _ = split_holdout(src, 0.2, 0)
    cal = Calibrator(SRC, src, batch_size=8, progress=False, tensors=calibration_tensors(model, options()))
    st = cal.collect()
    pickle.dump(st, open(f, "wb"))
    return st

def quantize(ranges, opts=None):
    from trtrepo.quantize import insert_qdq, load_model, prepare_model
    model = load_model(SRC)
    return insert_qdq(model, ranges, opts or options())

def ranges_of(st, method, **kw):
    from trtrepo.autoquant.ranges import activation_ranges
    return activation_ranges(st.compute(method, **kw), st)

def mAP2(model, n=320, min_boxes=10):
    """(official mAP50-95 vs FP32, mAP50-95 over the classes with >= min_boxes FP32 boxes)."""
    from trtrepo.detect.nms import postprocess
    from trtrepo.detect.judge import CANDIDATE_CONF, IOU
    from trtrepo.detect.metrics import mean_ap
    held, fp, det = reference(n); D = det["output0"]
    out = run_model(model, held)
    r = mean_ap(postprocess(out, D.layout, conf=CANDIDATE_CONF, iou=IOU), D.reference)
    cls = np.concatenate([d.classes for d in D.reference]); u, c = np.unique(cls, return_counts=True)
    big = [int(k) for k, v in zip(u, c) if v >= min_boxes]
    return float(r.map50_95), float(np.mean([r.per_class[k] for k in big]))
