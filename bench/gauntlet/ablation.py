"""Why the onnxruntime-target defaults are what they are (issue 13): one calibration of each
trained model, then the same ranges under each placement / smoothing choice, measured on held-out
data against FP32.

* all-mpnet-base-v2: the old placement (full node units: QLinearMatMul/QLinearAdd/QLinearMul
  everywhere), the transformer-safe placement without SmoothQuant, with SmoothQuant at each alpha,
  and with SmoothQuant 0.8 and one role of MatMuls left in float (which role still costs accuracy);
* MobileNetV2: each group of layers left in float in turn (where its INT8 loss sits).

    python bench/gauntlet/ablation.py [--calib 256] [--eval 128] [--update-docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("TRTREPO_GAUNTLET_CACHE", "/work/gauntlet-cache")

SECTION = "## Placement and SmoothQuant ablation on the trained models (issue 13)"


def _stats(model_path: Path, source, options, channel_tensors=()):
    import onnx

    from trtrepo.autoquant import calibration_tensors
    from trtrepo.calibrate import Calibrator

    model = onnx.load(str(model_path))
    return Calibrator(model_path, source, batch_size=32, progress=False, tensors=calibration_tensors(model, options),
                      channel_tensors=list(channel_tensors)).collect()


def mpnet_rows(n_calib: int, n_eval: int) -> list[tuple[str, str]]:
    import onnx
    import text

    from trtrepo.autoquant import _smoothed_ranges, activation_ranges, layer_roles
    from trtrepo.data import ListSource, Sample, iter_batches
    from trtrepo.evaluate import integer_kernels, run_onnx
    from trtrepo.quantize import QuantizeOptions, insert_qdq, prepare_model
    from trtrepo.smoothquant import apply_smoothquant, smooth_candidates

    path = text.export_onnx(text.CACHE / "mpnet" / "model.onnx")
    model = prepare_model(onnx.load(str(path)))
    cal = ListSource("calib", [Sample(dict(s)) for s in text.calib_samples(n_calib)])
    ev = list(iter_batches(ListSource("eval", [Sample(dict(s)) for s in text.eval_samples(n_eval)]), 32))
    ref = run_onnx(path, None, batches=ev).outputs["sentence_embedding"]
    stats = _stats(path, cal, QuantizeOptions(target="onnxruntime"), smooth_candidates(model))
    rows = []

    def measure(label: str, m, ranges, options) -> None:
        qm = insert_qdq(m, ranges, options, warn=False)
        got = run_onnx(qm.model, None, batches=ev).outputs["sentence_embedding"]
        r = text.metrics(ref, got)
        k = integer_kernels(qm.model)["total"]
        rows.append((label, f"cosine {r['cosine_mean']:.4f} (min {r['cosine_min']:.4f}), NN agreement {100 * r['nn_agreement']:.1f} %, "
                            f"{k} integer kernels"))
        print(f"[ablation] mpnet {label}: {rows[-1][1]}", file=sys.stderr, flush=True)

    for method in ("entropy", "minmax", "percentile"):
        ranges = activation_ranges(stats.compute(method), stats)
        measure(f"old placement (full node units), {method}", model, ranges,
                QuantizeOptions(target="onnxruntime", transformer_safe=False))
    ranges = activation_ranges(stats.compute("minmax"), stats)
    measure("transformer-safe placement, no SmoothQuant, minmax", model, ranges, QuantizeOptions(target="onnxruntime"))
    for alpha in (0.5, 0.65, 0.8, 0.95):
        sm = apply_smoothquant(model, stats.channels, alpha)
        measure(f"transformer-safe + SmoothQuant {alpha}", sm.model, _smoothed_ranges(ranges, sm.ranges),
                QuantizeOptions(target="onnxruntime"))
    sm = apply_smoothquant(model, stats.channels, 0.8)
    plan_layers = insert_qdq(sm.model, _smoothed_ranges(ranges, sm.ranges), QuantizeOptions(target="onnxruntime"), warn=False).plan.layers
    roles = layer_roles(sm.model, plan_layers)
    for role in sorted(set(roles.values())):
        names = tuple(n for n, r in roles.items() if r == role)
        measure(f"SmoothQuant 0.8, role '{role}' ({len(names)} layers) in float", sm.model, _smoothed_ranges(ranges, sm.ranges),
                QuantizeOptions(target="onnxruntime", exclude_nodes=names))
    return rows


def mobilenet_rows(n_calib: int, n_eval: int) -> list[tuple[str, str]]:
    import onnx
    import vision

    from trtrepo.autoquant import activation_ranges
    from trtrepo.data import ArraySource, iter_batches
    from trtrepo.evaluate import run_onnx
    from trtrepo.quantize import GraphView, QuantizeOptions, insert_qdq, prepare_model

    folder = Path(os.environ["TRTREPO_GAUNTLET_CACHE"]) / "mobilenet_v2"
    path = folder / "model.onnx"
    if not path.is_file():
        vision.export_onnx(path)
    model = prepare_model(onnx.load(str(path)))
    cal = ArraySource("calib", {"input": vision.image_crops("calib", n_calib)})
    ev = list(iter_batches(ArraySource("eval", {"input": vision.image_crops("eval", n_eval)}), 32))
    ref = run_onnx(path, None, batches=ev).outputs["logits"]
    stats = _stats(path, cal, QuantizeOptions(target="onnxruntime"))
    view = GraphView(model)
    convs = [n for n in view.nodes if n.op_type == "Conv"]
    groups: dict[str, list[str]] = {"none": []}
    for i, n in enumerate(convs):
        kind = ("first conv" if i == 0 else "last conv" if i == len(convs) - 1 else
                "depthwise convs" if int(view.attr(n, "group", 1)) > 1 else
                "expansion 1x1 convs" if any(c.op_type in ("Clip", "Relu") for c, _ in view.consumers[n.output[0]]) else
                "projection 1x1 convs")
        groups.setdefault(kind, []).append(n.name)
    groups["classifier Gemm"] = [n.name for n in view.nodes if n.op_type == "Gemm"]
    groups["residual Adds"] = [n.name for n in view.nodes if n.op_type == "Add"]
    rows = []
    for method in ("minmax", "percentile", "mse"):
        ranges = activation_ranges(stats.compute(method), stats)
        for target in ("onnxruntime", "tensorrt"):
            for label, names in groups.items():
                if method != "percentile" and label != "none":
                    continue
                qm = insert_qdq(model, ranges, QuantizeOptions(target=target, exclude_nodes=tuple(names)), warn=False)
                m = vision.metrics(ref, run_onnx(qm.model, None, batches=ev).outputs["logits"])
                what = "all INT8" if label == "none" else f"{label} ({len(names)}) in float"
                rows.append((f"{target}, {method}, {what}", f"top-1 agreement {100 * m['top1']:.1f} %, top-5 {100 * m['top5']:.1f} %, "
                                                            f"cosine {m['cos_mean']:.4f}"))
                print(f"[ablation] mobilenet {rows[-1][0]}: {rows[-1][1]}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--models", nargs="*", default=["mpnet", "mobilenet_v2"])
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args(argv)
    from _common import cpu_name, publish

    cpu = cpu_name()
    lines = [SECTION, "",
             f"`python bench/gauntlet/ablation.py --calib {args.calib} --eval {args.eval}` on {cpu}, {time.strftime('%Y-%m-%d')}: "
             "one calibration per model, the same ranges under each choice, accuracy INT8 vs FP32 on held-out data "
             "(mpnet: generated sentences, sentence-embedding cosine; MobileNetV2: photo crops, top-1/top-5 agreement).", ""]
    for name, fn in (("mpnet", mpnet_rows), ("mobilenet_v2", mobilenet_rows)):
        if name not in args.models:
            continue
        rows = fn(args.calib, args.eval)
        lines += [f"### {name}", "", "| configuration | INT8 vs FP32 |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows] + [""]
    publish("\n".join(lines), SECTION, args.update_docs)
    return 0


if __name__ == "__main__":
    np.seterr(all="ignore")
    raise SystemExit(main())
