"""Where the INT8 MobileNetV2's remaining error comes from, by activation category.

Quantizes the trained MobileNetV2 (gauntlet cache, see vision.py) with trtrepo on 256
calibration crops (nearest rounding, no equalization, so that no weight step compensates
activation noise), then runs the Q/DQ model in float (ONNX Runtime, graph optimizations off) with
the Q/DQ pairs of one activation category removed ("float X"), or of all categories but one
("only X quantized"), and compares its logits with FP32 on the 500 evaluation crops. Categories:
the network input, ReLU6 outputs, linear (projection) Conv outputs, residual Add outputs.
Quantization noises add roughly in quadrature, so the logit RMSE squared of "only X" minus that of
"weights only" is X's share.

    python bench/gauntlet/activation_noise.py [--cache DIR] [--target onnxruntime|tensorrt] [--defaults]

With ``--defaults`` the weights were rounded for quantized inputs (AdaRound's asymmetric loss), so
removing activation quantizers is no longer a clean ablation: read those rows as "what the
activations cost on top of the shipped weights", not as shares.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--target", default="onnxruntime")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--defaults", action="store_true",
                    help="quantize with trtrepo's defaults (equalization, weight steps) instead of nearest rounding")
    args = ap.parse_args()
    import onnx
    import onnxruntime as ort

    from trtrepo.autoquant import run_quantize
    from trtrepo.quantize import QuantizeOptions

    ev = np.load(args.cache / "eval.npz")["input"]
    calib = args.cache / "calib256.npz"
    if not calib.exists():
        np.savez(calib, input=np.load(args.cache / "calib.npz")["input"][:256])
    out = args.cache / "results" / f"noise_{args.target}{'_defaults' if args.defaults else ''}.onnx"
    out.parent.mkdir(exist_ok=True)
    steps = {} if args.defaults else {"weight_rounding": "nearest", "equalize": False}
    run_quantize(args.cache / "model.onnx", out, data=calib, options=QuantizeOptions(target=args.target), check=None,
                 **steps)

    def logits(m: onnx.ModelProto, simulate: bool = True) -> np.ndarray:
        so = ort.SessionOptions()
        if simulate:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return np.concatenate([s.run(None, {"input": ev[i:i + 50]})[0] for i in range(0, len(ev), 50)])

    a = logits(onnx.load(args.cache / "model.onnx"))
    p = np.exp(a - a.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    s = np.sort(p, 1)
    conf = (s[:, -1] - s[:, -2]) >= 0.10
    q = onnx.load(out)
    inits = {i.name for i in q.graph.initializer}
    prod = {o: n for n in q.graph.node for o in n.output}

    def category(t: str) -> str:
        n = prod.get(t)
        if n is None:
            return "input"
        return {"Add": "residual Add", "Clip": "ReLU6", "Relu": "ReLU6", "Conv": "linear Conv"}.get(n.op_type, n.op_type)

    quantizers = [n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits]
    cats = sorted({category(n.input[0]) for n in quantizers})

    def without(drop: set[str]) -> tuple[onnx.ModelProto, int]:
        m = onnx.ModelProto()
        m.CopyFrom(q)
        ren = {}
        for n in m.graph.node:
            if n.op_type == "QuantizeLinear" and n.input[0] not in inits and category(n.input[0]) in drop:
                for d in m.graph.node:
                    if d.op_type == "DequantizeLinear" and d.input[0] == n.output[0]:
                        ren[d.output[0]] = n.input[0]
        for n in m.graph.node:
            for i, x in enumerate(n.input):
                if x in ren:
                    n.input[i] = ren[x]
        return m, len(ren)

    rows = []

    def row(name: str, m: onnx.ModelProto, count: int | None, simulate: bool = True) -> None:
        b = logits(m, simulate)
        ag = a.argmax(1) == b.argmax(1)
        r = {"variant": name, "quantizers": count, "top1": float(ag.mean()), "confident_top1": float(ag[conf].mean()),
             "rmse": float(np.sqrt(((a - b) ** 2).mean()))}
        rows.append(r)
        print(json.dumps(r), flush=True)

    row("all quantized (ONNX Runtime integer kernels)", q, len(quantizers), simulate=False)
    row("all quantized (float simulation)", q, len(quantizers))
    m, k = without(set(cats))
    row("weights only", m, 0)
    for c in cats:
        m, k = without(set(cats) - {c})
        row(f"weights + {c} only", m, len(quantizers) - k)
    for c in cats:
        m, k = without({c})
        row(f"all but {c}", m, len(quantizers) - k)
    base = rows[2]["rmse"] ** 2
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    how = "trtrepo's defaults (equalization, weight step chosen on held-out crops)" if args.defaults else \
        "nearest rounding, no equalization"
    lines = [f"`python bench/gauntlet/activation_noise.py --target {args.target}{' --defaults' if args.defaults else ''}` "
             f"on {cpu}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: trained MobileNetV2, 256 calibration crops, "
             f"{how}; 500 evaluation crops ({int(conf.sum())} confident); Q/DQ run in float unless marked.", "",
             "| variant | activation quantizers | top-1 agreement | on confident crops | logit RMSE | share of the activation noise (RMSE^2 above weights only) |",
             "|---|---:|---:|---:|---:|---:|"]
    total = rows[1]["rmse"] ** 2 - base
    for r in rows:
        share = ""
        if r["variant"].startswith("weights + "):
            share = f"{100 * (r['rmse'] ** 2 - base) / total:.0f} %"
        lines.append(f"| {r['variant']} | {r['quantizers']} | {100 * r['top1']:.1f} % | {100 * r['confident_top1']:.1f} % | "
                     f"{r['rmse']:.3f} | {share} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
