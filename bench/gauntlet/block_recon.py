"""Issue 26, exploration: block reconstruction (BRECQ / QDrop style) on trtrepo's Q/DQ placement.

Not part of trtrepo: a measurement of whether reconstructing whole blocks, with the activation
quantizers in the loop, closes the gap to the issue's 92 % top-1 agreement on the trained
MobileNetV2 (it does not; docs/benchmarks.md, "Issue 26", 2026-11-26 fourth session).

1. ``--capture TARGET``: runs trtrepo's ``run_quantize`` defaults on the gauntlet's 256
   calibration crops and saves what its weight step receives: the equalized FP32 model, the chosen
   method's ranges and options, the nearest-rounding Q/DQ model (placement and Q/DQ parameters) and
   the 205 calibration crops trtrepo keeps after its hold-out.
2. Reconstruction (torch, CPU or ``--device cuda``): the Q/DQ graph is interpreted in torch; the
   graph is cut where one tensor is live, cuts grouped into blocks of ``--min-convs`` weighted
   layers; block by block (input: the quantized network's output so far, target: the FP32 block
   output) it learns AdaRound rounding for every weight and a scale multiplier for every
   activation quantizer (straight-through rounding), with QDrop (each activation element left
   unquantized with probability ``--drop`` while learning), on random ``--window`` x ``--window``
   windows of the block input (a ``--margin`` rim left out of the loss).
3. The learned weights (on their INT8 grid) and scaled ranges go through trtrepo's own
   ``insert_qdq``; the result is measured against FP32 on the 500 evaluation crops through ONNX
   Runtime (all graph optimizations: integer kernels; and none: the float simulation).

    python bench/gauntlet/block_recon.py --capture onnxruntime
    python bench/gauntlet/block_recon.py --target onnxruntime --iters 200 --batch 32
    # GPU machine: --pack-out N FILE here; there --pack-in FILE --device cuda --out R.npz
    # (torch only); back here --evaluate R.npz
"""

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

try:
    import onnx
    from onnx import numpy_helper
except ImportError:
    onnx = None
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CACHE = Path("/work/gauntlet-cache/mobilenet_v2")
ZETA, GAMMA = 1.1, -0.1
CH = 8


def round_ste(x):
    return (x.round() - x).detach() + x


class Node:
    def __init__(self, n):
        self.op_type, self.name = n.op_type, n.name
        self.input, self.output = list(n.input), list(n.output)
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}


class Graph:
    def __init__(self, qdq: onnx.ModelProto, fp: onnx.ModelProto):
        self.const = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
        for n in qdq.graph.node:
            if n.op_type == "Constant":
                self.const[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        fpinit = {t.name: numpy_helper.to_array(t) for t in fp.graph.initializer}
        fpnodes = {n.name: n for n in fp.graph.node}
        producer = {o: n for n in qdq.graph.node for o in n.output}
        self.nodes = [Node(n) for n in qdq.graph.node if n.op_type != "Constant"]
        self.input = qdq.graph.input[0].name
        self.output = qdq.graph.output[0].name
        # weights: Conv/Gemm input[1] produced by DQ (possibly of Q of a constant)
        self.wnodes = {}  # node name -> dict(w, b, scale, axis)
        skip = set()
        for n in self.nodes:
            if n.op_type not in ("Conv", "Gemm"):
                continue
            fpn = fpnodes[n.name]
            w = fpinit[fpn.input[1]].astype(np.float32)
            b = fpinit[fpn.input[2]].astype(np.float32) if len(fpn.input) > 2 else None
            dq = producer.get(n.input[1])
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            s = self.const[dq.input[1]].astype(np.float32)
            axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
            self.wnodes[n.name] = dict(w=w, b=b, scale=s, axis=axis)
            # mark weight/bias DQ/Q chains to skip
            for inp in n.input[1:]:
                p = producer.get(inp)
                while p is not None and p.op_type in ("DequantizeLinear", "QuantizeLinear"):
                    skip.add(p.name)
                    p = producer.get(p.input[0])
        self.nodes = [n for n in self.nodes if n.name not in skip]
        # activation quantizers: Q nodes on non-constant tensors
        self.aq = {}  # Q output name -> dict(tensor, scale, zp, lo, hi)
        for n in self.nodes:
            if n.op_type == "QuantizeLinear":
                zp = self.const[n.input[2]]
                lo, hi = (0, 255) if zp.dtype == np.uint8 else (-128, 127)
                self.aq[n.output[0]] = dict(tensor=n.input[0], scale=float(self.const[n.input[1]]), zp=int(zp), lo=lo, hi=hi)
        consumers = {}
        for i, n in enumerate(self.nodes):
            for t in n.input:
                consumers.setdefault(t, []).append(i)
        self.last_use = {t: max(v) for t, v in consumers.items()}

    def cuts(self):
        """Indices i such that after node i exactly one non-constant tensor is live and it is a
        float compute tensor (not Q/DQ)."""
        live = {self.input}
        out = []
        for i, n in enumerate(self.nodes):
            for t in n.output:
                live.add(t)
            live = {t for t in live if self.last_use.get(t, -1) > i}
            if len(live) == 1 and n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                (t,) = live
                if t == n.output[0]:
                    out.append(i)
        return out


class Sim(torch.nn.Module):
    def __init__(self, g: Graph):
        super().__init__()
        self.g = g
        self.V = torch.nn.ParameterDict()
        self.U = torch.nn.ParameterDict()
        self.Wf, self.Sw, self.B = {}, {}, {}
        for name, d in g.wnodes.items():
            w = torch.from_numpy(d["w"])
            shape = [1] * w.ndim
            shape[d["axis"]] = -1
            s = torch.from_numpy(d["scale"]).reshape(shape) if d["scale"].ndim else torch.tensor(float(d["scale"]))
            self.Wf[name], self.Sw[name] = w, s
            self.B[name] = None if d["b"] is None else torch.from_numpy(d["b"])
            rest = w / s - torch.floor(w / s)
            v = -torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)
            self.V[key(name)] = torch.nn.Parameter(v)
        for qn in g.aq:
            self.U[key(qn)] = torch.nn.Parameter(torch.zeros(()))
        self.mode = "fp"  # fp | q
        self.hard = False
        self.drop = 0.0

    def h(self, name):
        v = self.V[key(name)]
        if self.hard:
            return (v >= 0).float()
        return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0, 1)

    def weight(self, name):
        w, s = self.Wf[name], self.Sw[name]
        if self.mode == "fp":
            return w
        q = torch.clamp(torch.floor(w / s) + self.h(name), -127, 127)
        return q * s

    def reg(self, names, beta):
        tot = 0.0
        for n in names:
            hh = self.h(n)
            tot = tot + (1 - (2 * hh - 1).abs().pow(beta)).sum()
        return tot

    def fq(self, qn, x):
        d = self.g.aq[qn]
        if self.mode == "fp":
            return x
        s = d["scale"] * torch.exp(self.U[key(qn)])
        y = (torch.clamp(round_ste(x / s) + d["zp"], d["lo"], d["hi"]) - d["zp"]) * s
        if self.drop > 0 and self.training:
            m = torch.rand_like(x) < self.drop
            y = torch.where(m, x, y)
        return y

    def to(self, dev):
        super().to(dev)
        for d in (self.Wf, self.Sw, self.B):
            for k in d:
                if d[k] is not None:
                    d[k] = d[k].to(dev)
        self.dev = dev
        return self

    def run(self, env, lo, hi):
        g = self.g
        for i in range(lo, hi):
            n = g.nodes[i]
            op = n.op_type
            ins = [env[t] if t in env else (g.const[t] if t in g.const else None) for t in n.input]
            if op == "QuantizeLinear":
                out = ("Q", n.output[0], ins[0])
            elif op == "DequantizeLinear":
                tag, qn, x = ins[0]
                out = self.fq(qn, x)
            elif op == "Conv":
                attrs = n.attrs
                pads = attrs.get("pads", [0, 0, 0, 0])
                assert pads[0] == pads[2] and pads[1] == pads[3]
                out = F.conv2d(ins[0], self.weight(n.name), self.B[n.name], stride=attrs.get("strides", [1, 1]),
                               padding=(pads[0], pads[1]), dilation=attrs.get("dilations", [1, 1]), groups=attrs.get("group", 1))
            elif op == "Gemm":
                attrs = n.attrs
                w = self.weight(n.name)
                if not attrs.get("transB", 0):
                    w = w.t()
                out = F.linear(ins[0], w, self.B[n.name])
            elif op == "Clip":
                out = torch.clamp(ins[0], float(np.asarray(ins[1])), float(np.asarray(ins[2])))
            elif op == "Relu":
                out = F.relu(ins[0])
            elif op == "Add":
                out = ins[0] + ins[1]
            elif op == "GlobalAveragePool":
                out = ins[0].mean(dim=(2, 3), keepdim=True)
            elif op == "Flatten":
                out = torch.flatten(ins[0], 1)
            else:
                raise NotImplementedError(op)
            env[n.output[0]] = out
        return env


def key(name):
    return name.replace(".", "_").replace("/", "_").replace(":", "_")


def blocks_from_cuts(g, cuts, min_convs):
    """[(lo, hi)] node ranges; each block has >= min_convs weighted layers (the last takes the rest)."""
    out, lo, convs = [], 0, 0
    for i in range(len(g.nodes)):
        if g.nodes[i].name in g.wnodes:
            convs += 1
        if i in cuts and convs >= min_convs:
            out.append((lo, i + 1))
            lo, convs = i + 1, 0
    if lo < len(g.nodes):
        out.append((lo, len(g.nodes)))
    return out


def block_io(g, lo, hi):
    """The input tensor of the block (live before node lo) and its output (node hi-1's output)."""
    if lo == 0:
        return g.input, g.nodes[hi - 1].output[0]
    return g.nodes[lo - 1].output[0], g.nodes[hi - 1].output[0]



def parser():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--target", default="onnxruntime", choices=("onnxruntime", "tensorrt"))
    ap.add_argument("--capture", metavar="TARGET", default=None)
    ap.add_argument("--evaluate", nargs="+", type=Path, default=None)
    ap.add_argument("--pack-out", nargs=2, metavar=("N", "FILE"), default=None)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--min-convs", type=int, default=3)
    ap.add_argument("--drop", type=float, default=0.5)
    ap.add_argument("--lr-v", type=float, default=1e-2)
    ap.add_argument("--lr-u", type=float, default=1e-3)
    ap.add_argument("--reg", type=float, default=0.01)
    ap.add_argument("--no-act", action="store_true")
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="")
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--margin", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pack-in", type=Path, default=None, help="device mode: graph+data pickle")
    ap.add_argument("--out", type=Path, default=None)
    return ap


def reconstruct(g, X, args, dev="cpu", log=print):
    torch.manual_seed(0)
    sim = Sim(g).to(dev)
    X = X.to(dev)
    cuts = g.cuts()
    blocks = blocks_from_cuts(g, set(cuts), args.min_convs)
    log(f"{len(g.wnodes)} weighted layers, {len(g.aq)} act quantizers, {len(cuts)} cuts, {len(blocks)} blocks, {len(X)} samples")
    t0 = time.time()
    xin_fp, xin_q = X, X
    n = len(X)
    for bi, (lo, hi) in enumerate(blocks):
        tb = time.time()
        tin, tout = block_io(g, lo, hi)
        names = [g.nodes[i].name for i in range(lo, hi) if g.nodes[i].name in g.wnodes]
        qns = [g.nodes[i].output[0] for i in range(lo, hi) if g.nodes[i].op_type == "QuantizeLinear"]
        with torch.no_grad():
            sim.mode, sim.hard = "fp", False
            yfp = torch.cat([sim.run({tin: xin_fp[i:i + CH]}, lo, hi)[tout] for i in range(0, n, CH)])
        groups = [{"params": [sim.V[key(nm)] for nm in names], "lr": args.lr_v}]
        pu = [sim.U[key(q)] for q in qns]
        if not args.no_act and pu:
            groups.append({"params": pu, "lr": args.lr_u})
        opt = torch.optim.Adam(groups)
        sim.mode, sim.hard, sim.drop = "q", False, args.drop
        sim.train()
        warm = int(0.2 * args.iters)
        first = last = None
        for it in range(args.iters):
            idx = torch.randint(0, n, (args.batch,), device=dev)
            xq_b, xf_b = xin_q[idx], xin_fp[idx]
            if xq_b.ndim == 4 and xq_b.shape[-1] > args.window:
                H, Wd = xq_b.shape[-2:]
                r0 = int(torch.randint(0, H - args.window + 1, ()))
                c0 = int(torch.randint(0, Wd - args.window + 1, ()))
                xq_b = xq_b[..., r0:r0 + args.window, c0:c0 + args.window]
                xf_b = xf_b[..., r0:r0 + args.window, c0:c0 + args.window]
                with torch.no_grad():
                    sim.mode = "fp"
                    target = sim.run({tin: xf_b}, lo, hi)[tout]
                    sim.mode = "q"
                m = args.margin
                sl = (..., slice(m, target.shape[-2] - m), slice(m, target.shape[-1] - m)) if target.shape[-1] > 4 * m + 2 else (...,)
            else:
                target, sl = yfp[idx], (...,)
            y = sim.run({tin: xq_b}, lo, hi)[tout]
            rec = ((y[sl] - target[sl]) ** 2).sum(1).mean()
            if it < warm:
                loss = rec
            else:
                frac = (it - warm) / max(1, args.iters - warm)
                loss = rec + args.reg * sim.reg(names, 20 + (2 - 20) * frac)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if it == 0:
                first = rec.item()
            last = rec.item()
        sim.train(False)
        sim.drop, sim.hard = 0.0, True
        with torch.no_grad():
            xq_next = torch.cat([sim.run({tin: xin_q[i:i + CH]}, lo, hi)[tout] for i in range(0, n, CH)])
            err = float(((xq_next - yfp) ** 2).sum(1).mean())
        log(f"block {bi} nodes {lo}-{hi} layers {len(names)} aq {len(qns)} rec {first}->{last} hard {err:.4g} "
            f"{time.time() - tb:.1f}s u={[round(float(sim.U[key(q)]), 3) for q in qns]}")
        xin_fp, xin_q = yfp, xq_next
    return sim, time.time() - t0


def result_of(sim):
    """{'w:<node>': on-grid float32 weight, 'u:<qname>': float}"""
    out = {}
    sim.hard, sim.mode = True, "q"
    with torch.no_grad():
        for name in sim.g.wnodes:
            out["w:" + name] = sim.weight(name).float().cpu().numpy()
        for qn in sim.g.aq:
            out["u:" + qn] = np.float32(sim.U[key(qn)].item())
    return out


def writeback_and_eval(cap, meta, g, result, out, levels=("all", "disable"), source="brecq"):
    """Write ``result``'s weights ('w:'), biases ('b:', where given) and activation scale
    multipliers ('u:') into the equalized model through trtrepo's insert_qdq; measure it against
    FP32 on the 500 evaluation crops at each ONNX Runtime optimization level in ``levels``."""
    from trtrepo.evaluate import confident_mask, make_session
    from trtrepo.quantize import insert_qdq
    from trtrepo.quantize.options import ActivationRange
    model = onnx.load(str(cap / "model_eq.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    fpnodes = {nn.name: nn for nn in model.graph.node}
    for name in g.wnodes:
        t = inits[fpnodes[name].input[1]]
        t.CopyFrom(numpy_helper.from_array(np.asarray(result["w:" + name], np.float32), t.name))
        if "b:" + name in result:
            t = inits[fpnodes[name].input[2]]
            t.CopyFrom(numpy_helper.from_array(np.asarray(result["b:" + name], np.float32), t.name))
    ranges = dict(meta["ranges"])
    for qn, d in g.aq.items():
        k = float(np.exp(result["u:" + qn]))
        r = ranges[d["tensor"]]
        ranges[d["tensor"]] = ActivationRange(r.amax * k, None if r.lo is None else r.lo * k, None if r.hi is None else r.hi * k)
    qm = insert_qdq(model, ranges, meta["options"], source=source, warn=False)
    onnx.save(qm.model, str(out))
    xe = np.load(cap.parent / "eval.npz")["input"]
    fpl = fp32_eval(cap.parent, xe)
    conf = confident_mask(fpl)
    res = {}
    for opt_level in levels:
        s = make_session(str(out), optimization=opt_level)
        q = np.concatenate([s.run(None, {"input": xe[i:i + 50]})[0] for i in range(0, len(xe), 50)])
        ag = q.argmax(1) == fpl.argmax(1)
        res[opt_level] = dict(top1=float(ag.mean()), conf=float(ag[conf].mean()), rmse=float(np.sqrt(((q - fpl) ** 2).mean())))
    return res


def load_cap(cap):
    qdq, fp = onnx.load(str(cap / "nearest_qdq.onnx")), onnx.load(str(cap / "model_eq.onnx"))
    meta = pickle.load(open(cap / "ranges.pkl", "rb"))
    g = Graph(qdq, fp)
    for k, v in list(g.const.items()):
        g.const[k] = torch.from_numpy(np.asarray(v).copy()) if np.asarray(v).dtype == np.float32 else v
    return g, meta


def fp32_eval(cache, xe):
    from trtrepo.evaluate import make_session

    path = cache / "results" / "fp32_eval_logits.npy"
    if not path.exists():
        s = make_session(str(cache / "model.onnx"))
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.concatenate([s.run(None, {"input": xe[i:i + 50]})[0] for i in range(0, len(xe), 50)]))
    return np.load(path)


def capture(cache, target):
    """trtrepo's defaults on calib256.npz, saving the inputs of its weight step into cache/block_recon_TARGET."""
    import trtrepo.autoquant.run as R
    from trtrepo import weightsteps as WS
    from trtrepo.modelio import ModelIO
    from trtrepo.quantize import QuantizeOptions

    out = cache / f"block_recon_{target}"
    out.mkdir(exist_ok=True)
    orig = R.choose_weight_rounding

    def patched(model, ranges, options, calib_src, evaluator, nearest, requested, **kw):
        onnx.save(model, str(out / "model_eq.onnx"))
        onnx.save(nearest.quantized.model, str(out / "nearest_qdq.onnx"))
        with open(out / "ranges.pkl", "wb") as f:
            pickle.dump({"ranges": dict(ranges), "options": options, "label": nearest.label}, f)
        b = WS.cached_batches(calib_src, ModelIO.from_onnx(model), max_samples=512)
        np.save(out / "calib.npy", np.concatenate([x.inputs["input"] for x in b]))
        return orig(model, ranges, options, calib_src, evaluator, nearest, requested, **kw)

    R.choose_weight_rounding = patched
    res = R.run_quantize(cache / "model.onnx", out / "defaults.onnx", data=str(cache / "calib256.npz"),
                         options=QuantizeOptions(target=target), accept_accuracy_loss=True)
    print(json.dumps({"target": target, "method": res.method, "folder": str(out)}))


def main():
    args = parser().parse_args()
    torch.set_num_threads(args.threads)
    if args.capture:
        capture(args.cache, args.capture)
        return
    if args.pack_in:  # device mode: no onnx, no trtrepo
        with open(args.pack_in, "rb") as f:
            pk = pickle.load(f)
        X = torch.from_numpy(pk["X"]).float()
        if args.samples:
            X = X[:args.samples]
        sim, secs = reconstruct(pk["graph"], X, args, args.device, log=lambda m: print(m, flush=True))
        np.savez(args.out, **{k.replace("/", "|"): v for k, v in result_of(sim).items()})
        print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": secs}), flush=True)
        return
    cap = args.cache / f"block_recon_{args.target}"
    g, meta = load_cap(cap)
    if args.pack_out:
        n, path = int(args.pack_out[0]), args.pack_out[1]
        with open(path, "wb") as f:
            pickle.dump({"graph": g, "X": np.load(cap / "calib.npy")[:n].astype(np.float16)}, f, protocol=4)
        return
    if args.evaluate:
        for p in args.evaluate:
            z = np.load(p)
            res = {k.replace("|", "/"): z[k] for k in z.files}
            out = writeback_and_eval(cap, meta, g, res, cap / f"{p.stem}.onnx")
            print(json.dumps({"result": str(p), "target": args.target, **out}), flush=True)
        return
    X = torch.from_numpy(np.load(cap / "calib.npy"))
    if args.samples:
        X = X[:args.samples]
    sim, secs = reconstruct(g, X, args, args.device, log=lambda m: print(m, flush=True))
    res = writeback_and_eval(cap, meta, g, result_of(sim), cap / f"brecq{args.tag}.onnx")
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": secs, **res}), flush=True)


if __name__ == "__main__":
    main()
