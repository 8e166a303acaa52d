"""Step 2: keep one group of nodes float (exclude_nodes regex), percentile ranges; mAP on N crops."""
import sys, json, re, time
from common import *
N = int(sys.argv[1]) if len(sys.argv) > 1 else 320
GROUPS = {
    "none": [],
    "backbone stem model.0-4": [r"/model\.[0-4]/.*"],
    "backbone model.5-9 (incl. SPPF)": [r"/model\.[5-9]/.*"],
    "C2PSA model.10": [r"/model\.10/.*"],
    "neck model.11-22 (all)": [r"/model\.(1[1-9]|2[0-2])/.*"],
    "neck Concats only": [r"/model\.(1[1-9]|2[0-2])/.*Concat.*"],
    "Detect cv2 (box branch)": [r"/model\.23/cv2\..*"],
    "Detect cv3 (class branch)": [r"/model\.23/cv3\..*"],
    "Detect final 1x1 convs (cv2.x.2, cv3.x.2)": [r"/model\.23/cv[23]\.\d\.[^/]*2/Conv"],
}
st = stats(True)
rng = ranges_of(st, "percentile")
def float_convs(model):
    prod = {o: n for n in model.graph.node for o in n.output}
    k = 0
    for n in model.graph.node:
        if n.op_type == "Conv" and not (n.input[0] in prod and prod[n.input[0]].op_type == "DequantizeLinear"):
            k += 1
    return k
res = {}
import onnx
src = onnx.load(str(SRC))
for g, pats in GROUPS.items():
    t = time.time()
    matched = sum(1 for n in src.graph.node if any(re.fullmatch(p, n.name) for p in pats) and n.op_type not in ("Constant", "Shape", "Gather", "Unsqueeze", "Concat") or (pats and any(re.fullmatch(p, n.name) for p in pats) and n.op_type == "Concat"))
    q = quantize(rng, options(exclude_nodes=tuple(pats)))
    res[g] = dict(map=mAP(q.model, N), float_convs=float_convs(q.model), matched_nodes=matched)
    print(g, res[g], round(time.time() - t), flush=True)
json.dump(res, open(f"work/s2_{N}.json", "w"), indent=1)
