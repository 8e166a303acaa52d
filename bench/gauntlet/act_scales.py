"""Issue 26, exploration: activation ranges learned against the network's logits.

Not part of trtrepo: a measurement of whether choosing every activation quantizer's range for
the whole network's output (instead of per tensor, as the calibration methods do, or per block,
as ``block_recon.py`` does) closes the gap to the issue's 92 % top-1 agreement on the trained
MobileNetV2. The weights stay exactly trtrepo's defaults (equalization, the chosen rounding, the
corrected biases); only a scale multiplier per activation quantizer is learned (straight-through
rounding, Adam on the log of the multiplier), on the 205 calibration crops trtrepo keeps after
its hold-out, with the FP32 logits as the target (``--loss mse`` or ``kl``). ``--learn-rounding``
also learns the weights' up/down rounding against the logits (AdaRound at network level).

    python bench/gauntlet/block_recon.py --capture onnxruntime     # saves defaults.onnx too
    python bench/gauntlet/act_scales.py --pack-out P.pkl           # here
    python bench/gauntlet/act_scales.py --pack-in P.pkl --device cuda --out R.npz   # torch only
    python bench/gauntlet/act_scales.py --evaluate R.npz           # here: 500 crops, ONNX Runtime
"""

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from block_recon import CACHE, CH, Sim, key, load_cap, writeback_and_eval  # noqa: E402

try:
    import onnx
    from onnx import numpy_helper
except ImportError:
    onnx = None


def defaults_of(cap: Path, g) -> tuple[dict, dict]:
    """trtrepo's default weights on their grid (int8 codes) and float biases, per weighted node."""
    m = onnx.load(str(cap / "defaults.onnx"))
    init = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    producer = {o: n for n in m.graph.node for o in n.output}
    byname = {n.name: n for n in m.graph.node}
    codes, biases = {}, {}
    for name in g.wnodes:
        n = byname[name]
        dq = producer[n.input[1]]
        q = init[dq.input[0]]
        assert q.dtype == np.int8, (name, q.dtype)
        codes[name] = q.astype(np.int32)
        if len(n.input) > 2:
            src = n.input[2]
            p = producer.get(src)
            if p is not None and p.op_type == "DequantizeLinear":
                biases[name] = (init[p.input[0]].astype(np.float64) * init[p.input[1]].astype(np.float64)).astype(np.float32)
            else:
                biases[name] = init[src].astype(np.float32)
    return codes, biases


def defaults_as_result(cap: Path, g) -> dict:
    """trtrepo's defaults in the form ``learn`` returns (no scale changed)."""
    codes, biases = defaults_of(cap, g)
    res = {}
    for n, d in g.wnodes.items():
        shape = [1] * codes[n].ndim
        shape[d["axis"]] = -1
        scale = d["scale"].reshape(shape) if d["scale"].ndim else d["scale"]
        res["w:" + n] = (codes[n] * scale).astype(np.float32)
    res.update({"b:" + n: b for n, b in biases.items()})
    res.update({"u:" + qn: np.float32(0) for qn in g.aq})
    return res


def learn(pk: dict, args, dev: str, log=print):
    g = pk["graph"]
    torch.manual_seed(args.seed)
    sim = Sim(g)
    with torch.no_grad():
        for name, q in pk["codes"].items():
            w, s = sim.Wf[name], sim.Sw[name]
            up = torch.from_numpy(q.astype(np.int32)).float() > torch.floor(w / s)
            sim.V[key(name)].copy_(torch.where(up, torch.tensor(3.0), torch.tensor(-3.0)))
            if name in pk["biases"]:
                sim.B[name] = torch.from_numpy(pk["biases"][name])
    sim = sim.to(dev)
    sim.mode, sim.hard = "q", True
    with torch.no_grad():  # the codes came through exactly
        for name, q in pk["codes"].items():
            got = torch.round(sim.weight(name) / sim.Sw[name]).cpu().numpy().astype(np.int32)
            assert np.array_equal(got, q.astype(np.int32)), name
    X = torch.from_numpy(pk["X"]).float().to(dev)
    n = len(X)
    out = sim.g.output
    with torch.no_grad():
        sim.mode = "fp"
        yfp = torch.cat([sim.run({g.input: X[i:i + CH]}, 0, len(g.nodes))[out] for i in range(0, n, CH)])
        sim.mode = "q"
        y0 = torch.cat([sim.run({g.input: X[i:i + CH]}, 0, len(g.nodes))[out] for i in range(0, n, CH)])
    log(f"start: calib agreement {float((y0.argmax(1) == yfp.argmax(1)).float().mean()):.4f} "
        f"rmse {float(((y0 - yfp) ** 2).mean().sqrt()):.4f}")
    groups = [{"params": list(sim.U.parameters()), "lr": args.lr_u}]
    if args.learn_rounding:
        sim.hard = False
        groups.append({"params": list(sim.V.parameters()), "lr": args.lr_v})
    opt = torch.optim.Adam(groups)
    t0 = time.time()
    for it in range(args.iters):
        idx = torch.randint(0, n, (args.batch,), device=dev)
        y = sim.run({g.input: X[idx]}, 0, len(g.nodes))[out]
        t = yfp[idx]
        if args.loss == "kl":
            T = args.temp
            loss = F.kl_div(F.log_softmax(y / T, 1), F.log_softmax(t / T, 1), log_target=True, reduction="batchmean") * T * T
        else:
            loss = ((y - t) ** 2).mean()
        if args.learn_rounding:
            frac = it / max(1, args.iters - 1)
            loss = loss + args.reg * sim.reg(list(g.wnodes), 20 + (2 - 20) * frac) / sum(v.numel() for v in sim.V.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 50 == 0 or it == args.iters - 1:
            log(f"it {it} loss {loss.item():.5f} {time.time() - t0:.1f}s")
    sim.hard = True
    with torch.no_grad():
        y1 = torch.cat([sim.run({g.input: X[i:i + CH]}, 0, len(g.nodes))[out] for i in range(0, n, CH)])
    log(f"end: calib agreement {float((y1.argmax(1) == yfp.argmax(1)).float().mean()):.4f} "
        f"rmse {float(((y1 - yfp) ** 2).mean().sqrt()):.4f}")
    res = {}
    with torch.no_grad():
        for name in g.wnodes if args.learn_rounding else ():  # else the defaults' weights, unchanged
            res["w:" + name] = sim.weight(name).float().cpu().numpy()
            if sim.B[name] is not None:
                res["b:" + name] = sim.B[name].float().cpu().numpy()
        for qn in g.aq:
            res["u:" + qn] = np.float32(sim.U[key(qn)].item())
    return res, time.time() - t0


def evaluate(cap: Path, meta: dict, g, result: dict, out: Path) -> dict:
    """The model ``result`` describes, against FP32 on the 500 evaluation crops (integer kernels)."""
    return writeback_and_eval(cap, meta, g, result, out, levels=("all",), source="act_scales")["all"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--target", default="onnxruntime", choices=("onnxruntime", "tensorrt"))
    ap.add_argument("--pack-out", type=Path, default=None)
    ap.add_argument("--pack-n", type=int, default=205, help="crops in the pack (float16)")
    ap.add_argument("--pack-in", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--evaluate", nargs="+", type=Path, default=None)
    ap.add_argument("--baseline", action="store_true", help="evaluate the defaults through this path (U = 0)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr-u", type=float, default=5e-3)
    ap.add_argument("--lr-v", type=float, default=1e-2)
    ap.add_argument("--reg", type=float, default=0.01)
    ap.add_argument("--loss", default="mse", choices=("mse", "kl"))
    ap.add_argument("--learn-rounding", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temp", type=float, default=1.0, help="softmax temperature of the kl loss")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.pack_in:
        with open(args.pack_in, "rb") as f:
            pk = pickle.load(f)
        res, secs = learn(pk, args, args.device, log=lambda m: print(m, flush=True))
        np.savez(args.out, **{k.replace("/", "|"): v for k, v in res.items()})
        print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seconds": secs}), flush=True)
        return
    cap = args.cache / f"block_recon_{args.target}"
    g, meta = load_cap(cap)
    if args.pack_out:
        codes, biases = defaults_of(cap, g)
        with open(args.pack_out, "wb") as f:
            pickle.dump({"graph": g, "X": np.load(cap / "calib.npy")[:args.pack_n].astype(np.float16),
                         "codes": {k: v.astype(np.int8) for k, v in codes.items()}, "biases": biases}, f, protocol=4)
        return
    if args.baseline:
        res = defaults_as_result(cap, g)
        print(json.dumps({"baseline": str(cap / "defaults.onnx"), **evaluate(cap, meta, g, res, cap / "baseline_rt.onnx")}))
        return
    for p in args.evaluate or []:
        z = np.load(p)
        res = {**defaults_as_result(cap, g), **{k.replace("|", "/"): z[k] for k in z.files}}
        print(json.dumps({"result": str(p), "target": args.target,
                          **evaluate(cap, meta, g, res, cap / f"{p.stem}.onnx")}), flush=True)


if __name__ == "__main__":
    main()
