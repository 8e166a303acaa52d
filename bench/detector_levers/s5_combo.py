"""Combinations: per-kind ranges (pre=Conv outputs, post=the rest) + groups kept float. mAP on 320 (official, and over classes with >=10 FP32 boxes)."""
import sys, json, time, re
import onnx
from common import *
st = stats(True)
src = onnx.load(str(SRC))
prod = {o: n for n in src.graph.node for o in n.output}
R = {m: ranges_of(st, m) for m in ("percentile", "mse", "minmax")}; R["p99.999"] = ranges_of(st, "percentile", percentile=99.999); R["p99.995"] = ranges_of(st, "percentile", percentile=99.995)
def kind(t):
    n = prod.get(t); return "pre" if n is not None and n.op_type == "Conv" else "post"
def mix(pre, post):
    return {t: (R[pre][t] if kind(t) == "pre" else R[post][t]) for t in R["percentile"]}
G = {"h0": r"/model\.23/cv[23]\.0/.*", "h12": r"/model\.23/cv[23]\.[12]/.*", "last": r"/model\.23/cv[23]\.\d/cv[23]\.\d\.2/Conv", "last3": r"/model\.23/cv3\.\d/cv3\.\d\.2/Conv", "last2": r"/model\.23/cv2\.\d/cv2\.\d\.2/Conv", "mid": r"/model\.[5-9]/.*", "cv3": r"/model\.23/cv3\..*", "cv2": r"/model\.23/cv2\..*", "psa": r"/model\.10/.*", "stem": r"/model\.[0-4]/.*", "neck": r"/model\.(1[1-9]|2[0-2])/.*"}
res = {}
for v in sys.argv[1:]:
    rngs, *groups = v.split(":")
    pre, post = rngs.split("+")
    t = time.time()
    q = quantize(mix(pre, post), options(exclude_nodes=tuple(G[g] for g in groups)))
    fc = sum(1 for n in q.model.graph.node if n.op_type == "Conv" and not (n.input[0] in {o for m in q.model.graph.node if m.op_type == "DequantizeLinear" for o in m.output}))
    a, b = mAP2(q.model, 320)
    res[v] = dict(map=a, map_big=b, float_convs=fc)
    print(f"{v:35s} mAP320 {a:.4f}  big-classes {b:.4f}  float convs {fc}/88 ({time.time()-t:.0f}s)", flush=True)
json.dump(res, open(W / f"s5_{int(time.time())}.json", "w"), indent=1)
