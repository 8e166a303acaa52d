"""Confirmation on fresh crops not used for any choice: 320 new crops of the held-out photographs (seed 7;
eval.npy used seed 2). Every candidate's mAP50-95 vs FP32 (official) and over classes with >=10 FP32 boxes."""
import json, sys
from common import *
import detector as B
import common
f = W / "fresh.npy"
if not f.exists():
    photos = B.photographs(C / "wheels")
    np.save(f, B.crops(photos, B.EVAL_PHOTOS, 320, seed=7))
x = np.load(f)
from trtrepo.evaluate import Detector
fp = run_model(SRC, x); common._ref[320] = (x, fp, {"output0": Detector.of(fp, 80)})
cls = np.concatenate([d.classes for d in common._ref[320][2]["output0"].reference]); u, c = np.unique(cls, return_counts=True)
print("fresh set:", len(cls), "FP32 boxes,", len(u), "classes,", int((c <= 3).sum()), "with <= 3 boxes", flush=True)
M = {"default INT8 (percentile)": "final_0.onnx", "pre pct + post mse": "final_1.onnx", "pre pct + post mse, cv2/cv3 float": "final_2.onnx",
     "pre pct + post minmax, cv2/cv3 float": "final_3.onnx", "pre pct + post mse, cv2/cv3 scales 1-2 float": "final_4.onnx",
     "bias-corrected (sequential) percentile": "bcseq_percentile_48.onnx"}
res = {}
for k, p in M.items():
    a, b = mAP2(W / p, 320); res[k] = dict(map=a, big=b); print(f"{k:50s} fresh mAP320 {a:.4f} big-classes {b:.4f}", flush=True)
json.dump(res, open(W / "s11.json", "w"), indent=1)
