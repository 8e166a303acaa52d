"""Issue 26, a lever measured and rejected (2026-11-26): empirical bias correction on top of
trtrepo's tensorrt-target model of the trained MobileNetV2 (AdaRound already chosen), which
TensorRT's float simulation in ONNX Runtime computes as it will run.

For each Conv whose output is not rescaled by trtrepo's equalization (34 of 52: the 17 expand
convolutions feeding a depthwise one and the first conv are left out), the per-channel mean of its
output over calibration crops in the FP32 model minus the same in the Q/DQ model is added to its
float bias: ``--mode oneshot`` corrects every layer at once and repeats (``--iters``);
``--mode sequential`` corrects one layer at a time in graph order, each on the Q/DQ network
with the layers before it already corrected. The result is compared with FP32 on the gauntlet's
500 evaluation crops, as ``cnn_int8.py`` does.

    python bench/gauntlet/bias_after_adaround.py QDQ_MODEL [--mode sequential|oneshot] [--calib 64] [--iters 3]

QDQ_MODEL: a ``trtrepo quantize --target tensorrt`` model of the gauntlet's ``model.onnx``
(e.g. ``cnn_levers.py``'s or ``cnn_int8.py``'s). Prints one JSON line per result.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
PRODUCER = re.compile(r"/features/features\.(0/features\.0\.0|\d+/conv/conv\.0/conv\.0\.0)/Conv$")


def channel_means(model, names: list[str], crops: np.ndarray) -> dict[str, np.ndarray]:
    from trtrepo.evaluate import make_session
    from trtrepo.modelio import with_outputs

    session = make_session(with_outputs(model, names), arena=False)
    acc: dict[str, np.ndarray] = {}
    for i in range(0, len(crops), 16):
        for name, v in zip(names, session.run(names, {"input": crops[i:i + 16]}), strict=True):
            s = v.astype(np.float64).mean(axis=(2, 3)).sum(axis=0)
            acc[name] = s if name not in acc else acc[name] + s
    return {k: v / len(crops) for k, v in acc.items()}


def main() -> None:
    import onnx
    from cnn_int8 import agreement, cpu_name, logits
    from onnx import numpy_helper

    from trtrepo.evaluate import confident_mask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("qdq", type=Path)
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--mode", choices=("sequential", "oneshot"), default="sequential")
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    print(json.dumps({"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **vars(args)}, default=str))
    x = np.load(args.cache / "eval.npz")["input"]
    crops = np.load(args.cache / "calib.npz")["input"][:args.calib]
    fp32 = logits(args.cache / "model.onnx", x)
    conf = confident_mask(fp32)
    mf, mq = onnx.load(str(args.cache / "model.onnx")), onnx.load(str(args.qdq))
    fp32_convs = {n.output[0] for n in mf.graph.node if n.op_type == "Conv"}
    layers = [n for n in mq.graph.node if n.op_type == "Conv" and n.output[0] in fp32_convs and len(n.input) > 2
              and not PRODUCER.match(n.name)]
    target = channel_means(mf, [n.output[0] for n in layers], crops)
    inits = {i.name: i for i in mq.graph.initializer}
    out = Path("/tmp") / f"bias_after_adaround_{args.mode}.onnx"

    def correct(node, mean_q: np.ndarray) -> None:
        b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64) + (target[node.output[0]] - mean_q)
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(b.astype(np.float32), node.input[2]))

    print(json.dumps({"step": "before", "layers": len(layers), **agreement(fp32, logits(args.qdq, x), conf)}), flush=True)
    t0 = time.perf_counter()
    if args.mode == "sequential":
        for node in layers:
            correct(node, channel_means(mq, [node.output[0]], crops)[node.output[0]])
        onnx.save(mq, str(out))
        print(json.dumps({"step": "sequential", "seconds": round(time.perf_counter() - t0, 1),
                          **agreement(fp32, logits(out, x), conf)}), flush=True)
        return
    for it in range(1, args.iters + 1):
        means = channel_means(mq, [n.output[0] for n in layers], crops)
        for node in layers:
            correct(node, means[node.output[0]])
        onnx.save(mq, str(out))
        print(json.dumps({"step": f"oneshot {it}", **agreement(fp32, logits(out, x), conf)}), flush=True)


if __name__ == "__main__":
    main()
