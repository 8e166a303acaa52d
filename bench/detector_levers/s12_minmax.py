"""pre (Conv outputs) percentile + post (the rest) minmax: all INT8, and with the coarse-scale Detect branches float; on eval.npy and the fresh crops."""
import json, onnx
from common import *
import common
from trtrepo.evaluate import Detector
st = stats(True); src = onnx.load(str(SRC)); prod = {o: n for n in src.graph.node for o in n.output}
R = {m: ranges_of(st, m) for m in ("percentile", "minmax")}
rng = {t: (R["percentile"][t] if t in prod and prod[t].op_type == "Conv" else R["minmax"][t]) for t in R["percentile"]}
onnx.save(quantize(rng).model, str(W / "final_5.onnx"))
onnx.save(quantize(rng, options(exclude_nodes=(r"/model\.23/cv[23]\.[12]/.*",))).model, str(W / "final_6.onnx"))
M = {"pre pct + post minmax (all INT8)": "final_5.onnx", "pre pct + post minmax, cv2/cv3 scales 1-2 float": "final_6.onnx"}
for k, p in M.items():
    a, b = mAP2(W / p, 320); print(f"{k:50s} eval mAP320 {a:.4f} big-classes {b:.4f}", flush=True)
x = np.load(W / "fresh.npy"); fp = run_model(SRC, x); common._ref[320] = (x, fp, {"output0": Detector.of(fp, 80)})
for k, p in M.items():
    a, b = mAP2(W / p, 320); print(f"{k:50s} fresh mAP320 {a:.4f} big-classes {b:.4f}", flush=True)
