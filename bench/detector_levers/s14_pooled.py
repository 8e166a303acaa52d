"""Pooled 640 crops (eval.npy 320 + fresh seed-7 320, all from the held-out photographs): official mAP50-95 vs
FP32 with trtrepo's 95% bootstrap interval, and over classes with >= 10 FP32 boxes."""
import json
from common import *
import common
from trtrepo.evaluate import Detector, compare_outputs
x = np.concatenate([np.load(C / "eval.npy"), np.load(W / "fresh.npy")])
fp = run_model(SRC, x); det = {"output0": Detector.of(fp, 80)}; common._ref[640] = (x, fp, det)
cls = np.concatenate([d.classes for d in det["output0"].reference]); u, c = np.unique(cls, return_counts=True)
print("pooled:", len(cls), "boxes,", len(u), "classes,", int((c <= 3).sum()), "with <= 3 boxes,", int((c >= 10).sum()), "with >= 10", flush=True)
M = {"default INT8 (percentile)": "final_0.onnx", "pre pct + post mse": "final_1.onnx", "pre pct + post minmax": "final_5.onnx",
     "pre pct + post minmax, cv2/cv3 scales 1-2 float": "final_6.onnx", "pre pct + post minmax, cv2/cv3 float": "final_3.onnx",
     "pre pct + post mse, cv2/cv3 float": "final_2.onnx", "bias-corrected (sequential) percentile": "bcseq_percentile_48.onnx"}
res = {}
for k, p in M.items():
    y = run_model(W / p, x)
    f = compare_outputs({"output0": fp}, {"output0": y}, detection=det)["output0"].detection
    from trtrepo.detect.nms import postprocess
    from trtrepo.detect.judge import CANDIDATE_CONF, IOU
    from trtrepo.detect.metrics import mean_ap
    r = mean_ap(postprocess(y, det["output0"].layout, conf=CANDIDATE_CONF, iou=IOU), det["output0"].reference)
    big = float(np.mean([r.per_class[int(k2)] for k2, v in zip(u, c) if v >= 10]))
    res[k] = dict(map=f.map50_95, lower=f.lower, upper=f.upper, big=big)
    print(f"{k:50s} pooled640 mAP {f.map50_95:.4f} [{f.lower:.3f}-{f.upper:.3f}] big-classes {big:.4f}", flush=True)
json.dump(res, open(W / "s14.json", "w"), indent=1)
