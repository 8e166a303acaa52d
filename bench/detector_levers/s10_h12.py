"""pre percentile + post mse, Detect branches of the two coarse scales (cv2.1/2, cv3.1/2) float: save, figures."""
import json, onnx
from common import *
from trtrepo.evaluate import compare_outputs, Detector
st = stats(True); src = onnx.load(str(SRC)); prod = {o: n for n in src.graph.node for o in n.output}
R = {m: ranges_of(st, m) for m in ("percentile", "mse")}
rng = {t: (R["percentile"][t] if t in prod and prod[t].op_type == "Conv" else R["mse"][t]) for t in R["percentile"]}
q = quantize(rng, options(exclude_nodes=(r"/model\.23/cv[23]\.[12]/.*",))).model
onnx.save(q, str(W / "final_4.onnx"))
held, fp, det = reference(320); y = run_model(q, held)
f = compare_outputs({"output0": fp}, {"output0": y}, detection=det)["output0"].detection
h = [compare_outputs({"output0": fp[a:b]}, {"output0": y[a:b]}, detection={"output0": Detector.of(fp[a:b], 80)})["output0"].detection.map50_95 for a, b in ((0, 160), (160, 320))]
print(f"h12: mAP320 {f.map50_95:.4f} [{f.lower:.3f}-{f.upper:.3f}] halves {h[0]:.3f}/{h[1]:.3f}")
