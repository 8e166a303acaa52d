"""Issue 26, two levers measured and rejected on the trained MobileNetV2 (2026-11-26):

* ``depthwise-float``: trtrepo's defaults with the 17 depthwise convolutions left in float
  (``--exclude-node``), the removal the ceiling study pointed at;
* ``stream-eq ALPHA``: residual-stream equalization, a function-preserving per-channel rescale of
  every tensor of a residual stream (the projection convolutions that write it and the Adds that
  join it divided by ``s``, the dense convolutions that read it multiplied by ``s``), with
  SmoothQuant's ``s = max|x|^alpha / max|w|^(1 - alpha)`` over the stream's tensors and readers'
  columns, applied to the FP32 model before trtrepo's defaults run on it.

Each variant is quantized with ``run_quantize`` (defaults otherwise) on the gauntlet's first 256
calibration crops and compared with FP32 on its 500 evaluation crops, as ``cnn_int8.py`` does.

    python bench/gauntlet/cnn_levers.py [--cache /work/gauntlet-cache/mobilenet_v2] \
        [--variants depthwise-float stream-eq:0.5 stream-eq:0.8 select-cosine] [--targets onnxruntime tensorrt]

Prints one JSON line per run (the CPU first).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEPTHWISE = r"/features/features\.(1/conv/conv\.0/conv\.0\.0|\d+/conv/conv\.1/conv\.1\.0)/Conv"


def find_streams(model):
    """Residual streams: sets of tensors joined by activation + activation Adds, written by Convs
    (or Adds) and read only by those Adds and dense Convs (a stream with any other reader, or one
    that is a graph output, is skipped)."""
    from trtrepo.quantize import GraphView

    v = GraphView(model)
    producer = {o: n for n in v.nodes for o in n.output}
    parent: dict[str, str] = {}

    def find(a: str) -> str:
        while parent.setdefault(a, a) != a:
            a = parent[a]
        return a

    tensors = set()
    for n in v.nodes:
        if n.op_type == "Add" and len(n.input) == 2 and not any(v.is_constant(i) for i in n.input):
            for i in n.input:
                parent[find(i)] = find(n.output[0])
            tensors |= {n.input[0], n.input[1], n.output[0]}
        if n.op_type == "Conv" and v.is_constant(n.input[1]):
            tensors.add(n.output[0])
    groups: dict[str, set[str]] = {}
    for t in tensors:
        groups.setdefault(find(t), set()).add(t)
    streams = []
    for group in groups.values():
        writers, readers, ok = [], [], True
        for t in group:
            p = producer.get(t)
            if p is None or p.op_type not in ("Conv", "Add") or t in v.graph_outputs:
                ok = False
                break
            if p.op_type == "Conv":
                writers.append(p)
            for c, idx in v.consumers.get(t, []):
                if c.op_type == "Add" and c.output[0] in group:
                    continue
                if c.op_type == "Conv" and idx == 0 and int(v.attr(c, "group", 1)) == 1 and v.is_constant(c.input[1]):
                    readers.append(c)
                    continue
                ok = False
        if ok and writers and readers:
            streams.append({"tensors": sorted(group), "writers": writers, "readers": readers})
    return streams


def stream_equalize(model, calib: np.ndarray, alpha: float, samples: int = 64):
    import onnx
    from onnx import numpy_helper

    from trtrepo.evaluate import make_session
    from trtrepo.modelio import with_outputs

    streams = find_streams(model)
    names = sorted({t for s in streams for t in s["tensors"]})
    session = make_session(with_outputs(model, names), arena=False)
    amax: dict[str, np.ndarray] = {}
    for i in range(0, samples, 16):
        for name, x in zip(names, session.run(names, {"input": calib[i:i + 16]}), strict=True):
            m = np.abs(x).max(axis=(0, 2, 3))
            amax[name] = m if name not in amax else np.maximum(amax[name], m)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}

    def scale(name: str, factor: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array((numpy_helper.to_array(inits[name]) * factor).astype(np.float32), name))

    spread = []
    for s in streams:
        xa = np.max([amax[t] for t in s["tensors"]], axis=0)
        wa = np.max([np.abs(numpy_helper.to_array(inits[r.input[1]])).max(axis=(0, 2, 3)) for r in s["readers"]], axis=0)
        sc = np.maximum(xa, 1e-5) ** alpha / np.maximum(wa, 1e-5) ** (1 - alpha)
        sc = (sc / np.exp(np.mean(np.log(sc)))).astype(np.float32)
        spread.append([round(float(xa.max() / np.median(xa)), 2), round(float((xa / sc).max() / np.median(xa / sc)), 2)])
        for w in s["writers"]:
            scale(w.input[1], 1 / sc.reshape(-1, 1, 1, 1))
            if len(w.input) > 2 and w.input[2]:
                scale(w.input[2], 1 / sc)
        for r in s["readers"]:
            scale(r.input[1], sc.reshape(1, -1, 1, 1))
    return out, spread


def main() -> None:
    import onnx
    from cnn_int8 import agreement, cpu_name, logits, speed

    from trtrepo.autoquant import run_quantize
    from trtrepo.evaluate import confident_mask
    from trtrepo.quantize import QuantizeOptions

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--variants", nargs="+", default=["depthwise-float", "stream-eq:0.5", "stream-eq:0.8"])
    ap.add_argument("--targets", nargs="+", default=["onnxruntime", "tensorrt"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/cnn_levers"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}), flush=True)
    model_path = args.cache / "model.onnx"
    calib_path = args.cache / "calib256.npz"
    if not calib_path.exists():
        np.savez(calib_path, input=np.load(args.cache / "calib.npz")["input"][:256])
    x = np.load(args.cache / "eval.npz")["input"]
    fp32 = logits(model_path, x)
    conf = confident_mask(fp32)
    import trtrepo.evaluate as E

    ties = E.TIE_SAMPLES
    for variant in args.variants:
        source, exclude, extra = model_path, (), {}
        E.TIE_SAMPLES = 10**9 if variant == "select-cosine" else ties  # the variant is this setting alone
        if variant == "depthwise-float":
            exclude = (DEPTHWISE,)
        elif variant.startswith("stream-eq:"):
            alpha = float(variant.split(":", 1)[1])
            eq, spread = stream_equalize(onnx.load(str(model_path)), np.load(calib_path)["input"], alpha)
            source = args.work / f"stream_eq_{alpha}.onnx"
            onnx.save(eq, str(source))
            change = float(np.abs(logits(source, x[:32]) - fp32[:32]).max())
            extra = {"fp32_max_logit_change": change, "channel_range_max_over_median_before_after": spread}
        elif variant != "select-cosine":
            raise SystemExit(f"unknown variant {variant!r}")
        for target in args.targets:
            out = args.work / f"{variant.replace(':', '_')}_{target}.onnx"
            t0 = time.perf_counter()
            res = run_quantize(source, out, data=str(calib_path), options=QuantizeOptions(target=target, exclude_nodes=exclude),
                               accept_accuracy_loss=True)
            row = {"variant": variant, "target": target, "quantize_s": round(time.perf_counter() - t0, 1),
                   **agreement(fp32, logits(out, x), conf),
                   "weight_rounding": res.report.weight_rounding.get("chosen"), "method": res.method, **extra}
            if target == "onnxruntime":
                row["speed_b32"] = speed(model_path, out, x)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
