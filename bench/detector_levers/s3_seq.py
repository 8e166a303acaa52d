"""Step 3 (sequential, NNCF BiasCorrection-like): Convs in topological order; for each, the per-channel
mean of its output in the Q/DQ model (all earlier corrections in place) minus FP32's over N_CAL calibration
crops is subtracted from its int32 bias. The graph is cut to that conv's output for each pass."""
import sys, json, time, copy
import onnx
from onnx import numpy_helper
from common import *
from trtrepo.evaluate import make_session
N_CAL = int(sys.argv[1]) if len(sys.argv) > 1 else 48
METHOD = sys.argv[2] if len(sys.argv) > 2 else "percentile"

def cut(model, out):
    """model with `out` as its only output and only the nodes needed for it."""
    g = model.graph
    prod = {o: n for n in g.node for o in n.output}
    need, stack = set(), [out]
    while stack:
        t = stack.pop()
        n = prod.get(t)
        if n is None or id(n) in need: continue
        need.add(id(n)); stack.extend(i for i in n.input if i)
    m = onnx.ModelProto(); m.CopyFrom(model)
    keep = [n for n in g.node if id(n) in need]
    del m.graph.node[:]; m.graph.node.extend(keep)
    del m.graph.output[:]; m.graph.output.append(onnx.helper.make_value_info(out, onnx.TypeProto()))
    return m

def chan_mean(model, out, x, batch=8):
    s = make_session(cut(model, out).SerializeToString(), threads=2); inp = s.get_inputs()[0].name
    acc, cnt = 0.0, 0
    for i in range(0, len(x), batch):
        o = s.run(None, {inp: x[i:i + batch]})[0]
        acc = acc + o.astype(np.float64).sum(axis=(0, 2, 3)); cnt += o.shape[0] * o.shape[2] * o.shape[3]
    return acc / cnt

def correct(q, x, log=print):
    g = q.graph
    init = {i.name: i for i in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    fp = onnx.load(str(SRC))
    convs = [(n.output[0], prod[n.input[2]].input[0], prod[n.input[2]].input[1]) for n in g.node
             if n.op_type == "Conv" and len(n.input) > 2 and n.input[2] in prod and prod[n.input[2]].op_type == "DequantizeLinear"]
    t = time.time(); shifts = {}
    for k, (out, bq, bs) in enumerate(convs):
        d = chan_mean(q, out, x) - chan_mean(fp, out, x)
        bi = numpy_helper.to_array(init[bq]).astype(np.float64); sc = numpy_helper.to_array(init[bs]).astype(np.float64)
        init[bq].CopyFrom(numpy_helper.from_array(np.clip(np.rint((bi * sc - d) / sc), -2**31, 2**31 - 1).astype(np.int32), bq))
        shifts[out] = float(np.abs(d).mean())
        if k % 10 == 0: log(f"{k}/{len(convs)} {out} mean|shift| {shifts[out]:.4f} max {np.abs(d).max():.3f} {time.time()-t:.0f}s")
    return q, shifts

if __name__ == "__main__":
    st = stats(True)
    x = np.ascontiguousarray(np.load(C / "calib.npy", mmap_mode="r")[:N_CAL])
    q = quantize(ranges_of(st, METHOD)).model
    q, shifts = correct(q, x, lambda s: print(s, flush=True))
    onnx.save(q, str(W / f"bcseq_{METHOD}_{N_CAL}.onnx"))
    r = {"map320": mAP(q, 320), "shifts": shifts}; print("bias corrected (sequential)", r["map320"], flush=True)
    json.dump(r, open(W / f"s3seq_{METHOD}_{N_CAL}.json", "w"), indent=1)
