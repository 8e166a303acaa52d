"""SiLU-aware ranges for Conv outputs that feed only a SiLU (Sigmoid+Mul): lo clipped at -L (SiLU(x<-L) ~ 0),
hi from a chosen method; post tensors (SiLU outputs etc.) from mse. Also diagnostics: bypass the Q/DQ of
pre (Conv output) or of post tensors to see which quantization costs the most."""
import sys, json, time
import onnx
from common import *
from trtrepo.quantize import ActivationRange
st = stats(True)
src = onnx.load(str(SRC)); g = src.graph
prod = {o: n for n in g.node for o in n.output}
cons = {}
for n in g.node:
    for i in n.input: cons.setdefault(i, []).append(n)
def feeds_only_silu(t):
    c = cons.get(t, [])
    if len(c) != 2 or sorted(n.op_type for n in c) != ["Mul", "Sigmoid"]: return False
    sig = next(n for n in c if n.op_type == "Sigmoid"); mul = next(n for n in c if n.op_type == "Mul")
    return sig.output[0] in mul.input
R = {m: ranges_of(st, m) for m in ("percentile", "mse", "minmax")}
pre = [t for t in R["percentile"] if t in prod and prod[t].op_type == "Conv"]
silu_pre = [t for t in pre if feeds_only_silu(t)]
print(f"{len(pre)} conv outputs quantized, {len(silu_pre)} of them feed only a SiLU", flush=True)
lo = np.array([R["minmax"][t].lo for t in silu_pre]); print("their measured lo: quantiles", np.quantile(lo, [0, .25, .5, .75, 1]).round(2))
def ranges(hi_method, L, post="mse", pre_other="percentile"):
    out = {}
    for t in R["percentile"]:
        if t in silu_pre and L is not None:
            h = min(R["minmax"][t].hi, R[hi_method][t].amax)
            l = max(R["minmax"][t].lo, -L)
            out[t] = ActivationRange(max(h, -l), l, h)
        elif t in pre:
            out[t] = R[pre_other][t]
        else:
            out[t] = R[post][t]
    return out
def bypass(model, which):
    """drop the Q->DQ pairs on the given tensors (consumers read the float tensor)."""
    g = model.graph; q_of = {n.input[0]: n for n in g.node if n.op_type == "QuantizeLinear"}
    dq_of = {n.input[0]: n for n in g.node if n.op_type == "DequantizeLinear"}
    drop = []
    for t in which:
        if t not in q_of: continue
        q = q_of[t]; dq = dq_of.get(q.output[0])
        if dq is None: continue
        for n in g.node:
            for k, i in enumerate(n.input):
                if i == dq.output[0]: n.input[k] = t
        drop += [q, dq]
    for n in drop: g.node.remove(n)
    return model
res = {}
def report(name, model):
    t = time.time(); a, b = mAP2(model, 320); res[name] = dict(map=a, big=b)
    print(f"{name:60s} mAP320 {a:.4f} big-classes {b:.4f} ({time.time()-t:.0f}s)", flush=True)
args = sys.argv[1:]
if "diag" in args:
    base = ranges(None, None)
    report("diag: pct+mse, pre (conv out) Q/DQ bypassed", bypass(quantize(base).model, pre))
    post = [t for t in R["percentile"] if t not in pre and t != "images"]
    report("diag: pct+mse, post Q/DQ bypassed", bypass(quantize(base).model, post))
for a in args:
    if a == "diag": continue
    hm, L, post = a.split(",")
    report(f"silu-pre lo>=-{L}, hi={hm}; post={post}", quantize(ranges(hm, float(L), post)).model)
json.dump(res, open(W / f"s8_{int(time.time())}.json", "w"), indent=1)
