"""Issue 43 study: where the all-INT8 YOLO11n loses mAP50-95 against FP32 on ONNX Runtime's kernels.
Starts from the all-INT8 model of a bench/detector.py run (``--work``: what deploy shipped) and
removes quantizers from it (no re-calibration, no new weight rounding), or changes the ranges of
the Conv outputs that feed a SiLU; judges each on the 640 held-out crops (strict, the 7 classes
with >= 10 FP32 boxes, FP32's borderline boxes ignored) and times some at batch 8 (round-robin).

    python bench/detector_levers/where_map_goes.py [--work /tmp/trtrepo-detector] [--out docs/gauntlet/where_map_goes.json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper as nh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detector import BIG, run_model, speeds  # noqa: E402

from trtrepo.cpu import cpu_int8  # noqa: E402
from trtrepo.detect.judge import BORDERLINE_CONF, CANDIDATE_CONF, IOU, REFERENCE_CONF  # noqa: E402
from trtrepo.detect.metrics import mean_ap  # noqa: E402
from trtrepo.detect.nms import postprocess  # noqa: E402
from trtrepo.evaluate import Detector, make_session  # noqa: E402
from trtrepo.quantize.ranges import split_holdout  # noqa: E402


def copy(m):
    out = onnx.ModelProto()
    out.CopyFrom(m)
    return out


def strip(model, pred):
    """Every activation's Q -> DQ pair whose tensor ``pred(producer node or None)`` selects removed."""
    m = copy(model)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name for i in g.initializer}
    rename = {n.output[0]: n.input[0] for n in g.node
              if n.op_type == "QuantizeLinear" and n.input[0] not in inits and pred(producer.get(n.input[0]))}
    rename.update({n.output[0]: rename[n.input[0]] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in rename})
    keep = [n for n in g.node if not any(o in rename for o in n.output)]
    for n in keep:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    return m


def weights_float(model, src):
    """Every weight's DequantizeLinear replaced by the FP32 model's initializer."""
    m = copy(model)
    g = m.graph
    f = {i.name: i for i in src.graph.initializer}
    drop = []
    for n in g.node:
        orig = n.input[0][:-len("_quantized")] if n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized") else None
        if orig in f:
            t = onnx.TensorProto()
            t.CopyFrom(f[orig])
            t.name = n.output[0]
            g.initializer.append(t)
            drop.append(n.name)
    keep = [n for n in g.node if n.name not in drop]
    del g.node[:]
    g.node.extend(keep)
    return m


def silu_conv_outputs(model):
    prod = {o: n for n in model.graph.node for o in n.output}
    cons: dict[str, list] = {}
    for n in model.graph.node:
        for x in n.input:
            cons.setdefault(x, []).append(n)
    out = []
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in prod and prod[n.input[0]].op_type == "Conv":
            dqs = [c for c in cons.get(n.output[0], []) if c.op_type == "DequantizeLinear"]
            if any(c.op_type == "Sigmoid" for d in dqs for c in cons.get(d.output[0], [])):
                out.append(n.input[0])
    return out


def set_ranges(model, stats, fn):
    m = copy(model)
    init = {i.name: i for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] in stats:
            s, z = float(nh.to_array(init[n.input[1]])), int(nh.to_array(init[n.input[2]]))
            lo, hi = fn(-z * s, (255 - z) * s, *stats[n.input[0]])
            s2 = (hi - lo) / 255
            init[n.input[1]].CopyFrom(nh.from_array(np.array(s2, np.float32), n.input[1]))
            init[n.input[2]].CopyFrom(nh.from_array(np.array(int(np.clip(round(-lo / s2), 0, 255)), np.uint8), n.input[2]))
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "gauntlet" / "where_map_goes.json")
    a = ap.parse_args()
    src_path = a.cache / "yolo11n_dyn.onnx"
    src, base = onnx.load(str(src_path)), onnx.load(str(a.work / "all-INT8.onnx"))
    held = np.load(a.cache / "eval.npy")
    raw = run_model(src_path, held)
    layout = Detector.of(raw[:8], 80).layout
    fp = postprocess(raw, layout, conf=BORDERLINE_CONF, iou=IOU)
    ref = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in fp]
    ign = [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF)) for d in fp]
    u, k = np.unique(np.concatenate([d.classes for d in ref]), return_counts=True)
    big = set(u[k >= BIG].tolist())

    def judge(m):
        p = postprocess(run_model(m, held), layout, conf=CANDIDATE_CONF, iou=IOU)
        r, r2 = mean_ap(p, ref), mean_ap(p, ref, ignore=ign)
        return [r.map50_95, float(np.mean([v for c, v in r.per_class.items() if c in big])), r2.map50_95]

    def op(*types):
        return lambda p: p is not None and p.op_type in types

    def conv_in(rx):
        return lambda p: p is not None and p.op_type == "Conv" and re.search(rx, p.name) is not None
    regions = {"head (model.23)": r"^/model\.23/", "neck (11-22)": r"^/model\.(1[1-9]|2[0-2])/",
               "backbone 5-10": r"^/model\.([5-9]|10)/", "backbone 0-4": r"^/model\.[0-4]/", "every layer": r"."}
    variants = {"all-INT8 (what deploy shipped)": base, "INT8 weights only (every activation float)": strip(base, lambda p: True),
                "INT8 activations only (FP32 weights)": weights_float(base, src)}
    for name, types in (("Conv", ("Conv",)), ("SiLU Mul", ("Mul",)), ("SiLU Sigmoid", ("Sigmoid",)), ("Concat", ("Concat",)), ("Add", ("Add",))):
        variants[f"{name} outputs float"] = strip(base, op(*types))
    for name, rx in regions.items():
        variants[f"Conv outputs float: {name}"] = strip(base, conv_in(rx))
    # the Conv outputs that feed a SiLU: their FP32 min/max on 160 of deploy's calibration crops
    targets = silu_conv_outputs(base)
    probe = copy(src)
    for t in targets:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None))
    session = make_session(probe)
    calib = np.load(a.cache / "calib.npy", mmap_mode="r")
    cal_idx = np.asarray(split_holdout(np.arange(len(calib)))[0])[:160]
    stats = {t: [np.inf, -np.inf] for t in targets}
    for i in range(0, len(cal_idx), 8):
        for t, v in zip(targets, session.run(targets, {"images": np.asarray(calib[cal_idx[i:i + 8]])}), strict=True):
            stats[t] = [min(stats[t][0], float(v.min())), max(stats[t][1], float(v.max()))]
    variants["Conv->SiLU ranges: calibration max above, entropy below"] = set_ranges(base, stats, lambda ql, qh, lo, hi: (ql, max(qh, hi)))
    variants["Conv->SiLU ranges: calibration max above, max(min, -6) below"] = set_ranges(base, stats, lambda ql, qh, lo, hi: (max(lo, -6.0), max(qh, hi)))
    variants["Conv->SiLU ranges: calibration min/max"] = set_ranges(base, stats, lambda ql, qh, lo, hi: (lo, hi))
    rows = {}
    for name, m in variants.items():
        rows[name] = {"strict_big_borderline_ignored": judge(m)}
        print(name, rows[name], flush=True)
    timed = {"FP32": src_path, **{k: v for k, v in variants.items() if k.startswith(("all-INT8", "Conv outputs float"))}}
    t = speeds(timed, held[:8], rounds=12)
    for name in timed:
        if name in rows:
            rows[name]["speed_vs_fp32"] = t["FP32"] / t[name]
    print({k: round(t["FP32"] / v, 2) for k, v in t.items()})
    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(),
                                 "models_from": str(a.work), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
