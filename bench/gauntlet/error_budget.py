"""How much INT8 error the trained MobileNetV2 can take, and what leaving layers in float buys
(issue 26). Two measurements on a quantized model (default: the gauntlet's onnxruntime defaults,
``CACHE/results/cnn_int8/onnxruntime_auto.onnx``), against the FP32 logits of the gauntlet's 500
evaluation crops:

1. ``--scale``: the model's own logit error scaled by alpha (FP32 + alpha * (INT8 - FP32)), and
   Gaussian noise of a given RMSE: the top-1 agreement each error size allows.
2. ``--fallback``: every Conv/Gemm alone in float (FP32 weights and bias of the equalized model,
   its input read before its Q/DQ pair), ranked by how much of the logit MSE it removes on 128
   calibration crops; then the K most sensitive in float together, measured on the evaluation
   crops.

    python bench/gauntlet/error_budget.py --scale --fallback [--model Q.onnx] [--equalized EQ.onnx] [--k 24]

``--equalized``: the FP32 model the Q/DQ model was made from (trtrepo equalizes first), e.g.
``CACHE/block_recon_onnxruntime/model_eq.onnx`` from ``block_recon.py --capture onnxruntime``.
Prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))


def logits(model, x: np.ndarray) -> np.ndarray:
    from trtrepo.evaluate import make_session

    s = make_session(model if isinstance(model, (str, Path)) else model.SerializeToString())
    return np.concatenate([s.run(None, {"input": x[i:i + 64]})[0] for i in range(0, len(x), 64)])


def figures(fp32: np.ndarray, q: np.ndarray, conf: np.ndarray) -> dict:
    ag = q.argmax(1) == fp32.argmax(1)
    return {"rmse": round(float(np.sqrt(((q - fp32) ** 2).mean())), 4), "top1": round(float(ag.mean()), 4),
            "confident": round(float(ag[conf].mean()), 4), "confident_flips": int((~ag[conf]).sum())}


def scale(fp32: np.ndarray, q: np.ndarray, conf: np.ndarray) -> None:
    for a in np.linspace(0.0, 1.0, 11):
        print(json.dumps({"scaled_error": round(float(a), 2), **figures(fp32, fp32 + a * (q - fp32), conf)}))
    rng = np.random.default_rng(0)
    for r in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):
        runs = [figures(fp32, fp32 + rng.normal(0.0, r, fp32.shape), conf) for _ in range(20)]
        print(json.dumps({"gaussian_rmse": r, "top1": round(float(np.mean([f["top1"] for f in runs])), 4),
                          "confident": round(float(np.mean([f["confident"] for f in runs])), 4)}))


def floated(qm, em, names: set[str]):
    """``qm`` with the nodes ``names`` in float: the equalized model's weight and bias, the input
    read before its Q/DQ pair."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(qm)
    einit = {t.name: t for t in em.graph.initializer}
    enodes = {n.name: n for n in em.graph.node}
    prod = {o: n for n in m.graph.node for o in n.output}
    for n in m.graph.node:
        if n.name not in names:
            continue
        e = enodes[n.name]
        for i in (1, 2):
            if len(e.input) > i and e.input[i]:
                name = f"{n.name}_float{i}"
                m.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(einit[e.input[i]]), name))
                n.input[i] = name
        dq = prod.get(n.input[0])
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = prod.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                n.input[0] = q.input[0]
    return m


def fallback(args, fp32: np.ndarray, conf: np.ndarray, x_eval: np.ndarray) -> None:
    import onnx

    qm, em = onnx.load(args.model), onnx.load(args.equalized)
    cal = np.load(args.cache / "calib256.npz")["input"][:128]
    fc = logits(em, cal)
    base = float(((logits(qm, cal) - fc) ** 2).mean())
    layers = [n.name for n in qm.graph.node if n.op_type in ("Conv", "Gemm")]
    t = time.perf_counter()
    sens = sorted(((base - float(((logits(floated(qm, em, {L}), cal) - fc) ** 2).mean()), L) for L in layers), reverse=True)
    print(json.dumps({"calibration_mse": base, "sensitivity_seconds": round(time.perf_counter() - t, 1),
                      "top": [[L, round(d, 5)] for d, L in sens[:args.k]]}))
    current: set[str] = set()
    for k, (_d, layer) in enumerate(sens[:args.k], start=1):
        current.add(layer)
        print(json.dumps({"in_float": k, "layer": layer, **figures(fp32, logits(floated(qm, em, current), x_eval), conf)}),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--equalized", type=Path, default=None)
    ap.add_argument("--scale", action="store_true")
    ap.add_argument("--fallback", action="store_true")
    ap.add_argument("--k", type=int, default=24)
    args = ap.parse_args()
    args.model = args.model or args.cache / "results" / "cnn_int8" / "onnxruntime_auto.onnx"
    args.equalized = args.equalized or args.cache / "block_recon_onnxruntime" / "model_eq.onnx"
    from trtrepo.evaluate import confident_mask

    x_eval = np.load(args.cache / "eval.npz")["input"]
    fp32 = logits(args.cache / "model.onnx", x_eval)
    conf = confident_mask(fp32)
    q = logits(args.model, x_eval)
    print(json.dumps({"model": str(args.model), **figures(fp32, q, conf)}))
    if args.scale:
        scale(fp32, q, conf)
    if args.fallback:
        fallback(args, fp32, conf, x_eval)


if __name__ == "__main__":
    main()
