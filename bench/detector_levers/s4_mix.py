"""Step 4: per-tensor-kind range choice. 'pre' = tensors produced by a Conv (its pre-activation output,
requantized for QLinearConv); 'post' = every other quantized activation (SiLU outputs, concats, adds, input)."""
import sys, json, time
import onnx
from common import *
st = stats(True)
src = onnx.load(str(SRC))
prod = {o: n for n in src.graph.node for o in n.output}
R = {m: ranges_of(st, m) for m in ("percentile", "minmax", "mse", "entropy")}
for p in (99.9, 99.999, 99.9999):
    R[f"p{p}"] = ranges_of(st, "percentile", percentile=p)
def kind(t):
    n = prod.get(t); return "pre" if n is not None and n.op_type == "Conv" else "post"
def mix(pre, post):
    return {t: (R[pre][t] if kind(t) == "pre" else R[post][t]) for t in R["percentile"]}
print("tensors pre/post:", sum(kind(t) == "pre" for t in R["percentile"]), sum(kind(t) == "post" for t in R["percentile"]))
variants = [v.split("+") for v in sys.argv[1:]]
res = {}
for pre, post in variants:
    t = time.time()
    q = quantize(mix(pre, post))
    res[f"{pre}+{post}"] = mAP(q.model, 320); print(f"pre(conv out)={pre:10s} post={post:10s} mAP320 {res[f'{pre}+{post}']:.4f} ({time.time()-t:.0f}s)", flush=True)
json.dump(res, open(W / f"s4_{int(time.time())}.json", "w"), indent=1)
