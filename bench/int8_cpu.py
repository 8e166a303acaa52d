"""Benchmark: INT8 on the CPU (issue 4) -- accuracy per calibration method and ONNX Runtime
latency of FP32 vs trtrepo's Q/DQ model vs ONNX Runtime's own ``quantize_static``, in one run.

On the demo model:

* accuracy on ``demo:val`` of FP32 and of INT8 per method (entropy, minmax, percentile, mse),
  both targets (onnxruntime: what runs on the CPU; tensorrt: the TensorRT placement simulated
  by ONNX Runtime in float), ``--method auto`` (selection on a held-out part of the calibration
  data) and ``--accuracy-target`` fallback;
* ONNX Runtime CPU latency (``--threads`` intra-op threads, default 2, ORT_ENABLE_ALL, no
  spinning) at batch 1 and 32, median of ``--runs`` runs (>= 30), models measured round-robin
  so that load from other processes hits all of them alike: FP32, trtrepo INT8 (onnxruntime
  target, best method) and ``quantize_static`` (QDQ, per_channel=True, uint8 activations / int8
  weights, Entropy and MinMax) on the same model and calibration data;
* which integer kernels each model's optimized graph holds.

    python bench/int8_cpu.py [--calib-limit 1024] [--runs 50] [--threads 2] [--json out.json] [--update-docs]

``--update-docs`` rewrites the section "INT8 on the CPU (issue 4)" of docs/benchmarks.md
(creating the file if needed) and leaves every other section alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import update_docs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTION = "## INT8 on the CPU (issue 4)"
METHODS = ("entropy", "minmax", "percentile", "mse")
INTEGER_OPS = ("QLinearConv", "NhwcQLinearConv", "QGemm", "QLinearMatMul", "MatMulIntegerToFloat", "ConvInteger",
               "QLinearAdd", "QLinearGlobalAveragePool", "QLinearAveragePool")


def integer_kernels(model_path: Path | tuple[Path, dict], tmp: Path) -> dict[str, int]:
    import onnx
    import onnxruntime as ort

    if isinstance(model_path, tuple):
        model_path = model_path[0]
    so = ort.SessionOptions()
    so.log_severity_level = 3  # not the warning that an NCHWc-optimized file is machine-specific
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(tmp / f"{model_path.stem}.opt.onnx")
    ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
    counts = {op: ops.count(op) for op in INTEGER_OPS if op in ops}
    counts["float Conv"] = sum(op in ("Conv", "FusedConv") for op in ops)
    return counts


def ort_quantize_static(fp32: Path, out: Path, calib: np.ndarray, method: str, batch_size: int,
                        input_name: str = "input") -> float:
    """ONNX Runtime's ``quantize_static`` (after ``quant_pre_process``): QDQ, per-channel, uint8
    activations / int8 weights, ``method`` entropy or minmax. Returns the seconds it took."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(range(0, len(calib), batch_size))

        def get_next(self) -> dict | None:
            i = next(self.it, None)
            return None if i is None else {input_name: calib[i : i + batch_size]}

    pre = out.with_suffix(".pre.onnx")
    t = time.perf_counter()
    quant_pre_process(str(fp32), str(pre))
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method={"entropy": CalibrationMethod.Entropy, "minmax": CalibrationMethod.MinMax}[method])
    return time.perf_counter() - t


def latency(models: dict[str, Path | tuple[Path, dict]], x: np.ndarray, batches: tuple[int, ...], runs: int,
            threads: int, input_name: str = "input") -> dict:
    """Round-robin timing; a model is a path or (path, session config entries)."""
    from trtrepo.evaluate import make_session

    sessions = {}
    for k, p in models.items():
        path, config = p if isinstance(p, tuple) else (p, None)
        sessions[k] = make_session(path, threads=threads, optimization="all", config=config)
    result: dict[str, dict[str, dict[int, float]]] = {k: {"median": {}, "min": {}, "cpu": {}} for k in models}
    for bs in batches:
        feed = {input_name: np.ascontiguousarray(x[:bs])}
        times: dict[str, list[float]] = {k: [] for k in models}
        cpu: dict[str, list[float]] = {k: [] for k in models}
        for s in sessions.values():  # warm-up
            for _ in range(5):
                s.run(None, feed)
        for _ in range(runs):  # round-robin: every model sees the same background load
            for k, s in sessions.items():
                c = time.process_time()
                t = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
        for k in models:
            result[k]["median"][bs] = float(np.median(times[k]) * 1e3)
            result[k]["min"][bs] = float(np.min(times[k]) * 1e3)
            result[k]["cpu"][bs] = float(np.median(cpu[k]) * 1e3)
    return result


def conv_layers(fp32: Path, calib: np.ndarray, batch: int, runs: int) -> list[dict]:
    """Each Conv of the model alone (its weights, its input shape at ``batch``), FP32 against
    the same conv as an ONNX Runtime INT8 node unit (Q -> DQ -> Conv -> Q -> DQ, uint8
    activations, int8 per-channel weights), 1 intra-op thread, median of ``runs``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtrepo.evaluate import make_session
    from trtrepo.qdq import QuantizeOptions, insert_qdq

    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp32)))
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in
              list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rows = []
    rng = np.random.default_rng(0)
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        w = inits[node.input[1]]
        in_shape = [batch] + shapes[node.input[0]][1:]
        out_shape = [batch] + shapes[node.output[0]][1:]
        x = np.maximum(rng.standard_normal(in_shape), 0).astype(np.float32)
        g = helper.make_graph(
            [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", **{a.name: helper.get_attribute_value(a) for a in node.attribute}),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Relu", ["r"], ["y"], name="out")],  # keeps r an inner tensor (output Q)
            "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(inits.get(node.input[2], np.zeros(w.shape[0], np.float32))
                                                                       if len(node.input) > 2 else np.zeros(w.shape[0], np.float32), "b")])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        sess = make_session(m)
        r = sess.run(["y"], {"x": x})[0]
        ranges = {"x": (0.0, float(x.max())), "r": (0.0, float(r.max())), "c": float(np.abs(r).max())}
        q = insert_qdq(m, ranges, QuantizeOptions(target="onnxruntime", ort_min_reduction=0)).model
        sessions = {"fp32": make_session(m, threads=1), "int8": make_session(q, threads=1)}
        t: dict[str, list[float]] = {k: [] for k in sessions}
        for s in sessions.values():
            for _ in range(3):
                s.run(None, {"x": x})
        for _ in range(runs):  # interleaved, like the whole-model measurement
            for k, s in sessions.items():
                a = time.perf_counter()
                s.run(None, {"x": x})
                t[k].append(time.perf_counter() - a)
        times = {k: float(np.median(v) * 1e3) for k, v in t.items()}
        rows.append({"layer": node.name, "cin": int(w.shape[1]), "cout": int(w.shape[0]), "hw": in_shape[2:],
                     "stride": [a for a in node.attribute if a.name == "strides"][0].ints[0] if any(a.name == "strides" for a in node.attribute) else 1,
                     **times})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calib-limit", type=int, default=1024, help="calibration samples of demo:calib (all methods alike)")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--accuracy-target", default="cosine=0.9995")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--update-docs", action="store_true")
    ap.add_argument("--heading", default=SECTION, help="the docs/benchmarks.md section to write (e.g. one per CPU kind)")
    ap.add_argument("--render", type=Path, default=None, help="only re-render the section from a --json file of a run")
    args = ap.parse_args()
    if args.render is not None:
        md = markdown(json.loads(args.render.read_text(), object_hook=_int_keys))
        print(md)
        if args.update_docs:
            update_docs(ROOT / "docs" / "benchmarks.md", args.heading, md)
        return
    if args.runs < 30:
        ap.error("--runs must be at least 30")

    import onnx

    from trtrepo.calibrate import Calibrator
    from trtrepo.cpu import X64_QUANT_PRECISION, cpu_int8
    from trtrepo.data import open_data
    from trtrepo.demo import split_tensors
    from trtrepo.evaluate import compare_outputs, run_onnx
    from trtrepo.export import export_onnx
    from trtrepo.qdq import QuantizeOptions, insert_qdq, save_model
    from trtrepo.quantize import activation_ranges, run_quantize

    started = time.time()
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="trtrepo-int8-bench-"))
    fp32 = tmp / "demo.onnx"
    export_onnx("demo", fp32)
    model = onnx.load(fp32)
    calib_src = open_data("demo:calib").subset(args.calib_limit, seed=0)
    val = open_data("demo:val")
    ref = run_onnx(fp32, val, batch_size=args.batch_size)
    fp32_acc = float(np.mean(np.argmax(ref.outputs["logits"], 1) == ref.labels))

    def val_metrics(m: object) -> dict:
        out = run_onnx(m, val, batch_size=args.batch_size)
        r = compare_outputs(ref.outputs, out.outputs, ref.labels)["logits"]
        return {"accuracy": r.candidate_accuracy, "drop_points": r.accuracy_drop_points,
                "top1_agreement": r.top1_agreement, "cosine": r.cosine_mean}

    # --- trtrepo: one collection pass, four methods, two targets -------------------------------
    t = time.perf_counter()
    stats = Calibrator(fp32, calib_src, batch_size=args.batch_size, progress=False).collect()
    collect_s = time.perf_counter() - t
    accuracy: dict[str, dict] = {}
    ort_models: dict[str, Path] = {}
    for method in METHODS:
        ranges = activation_ranges(stats.compute(method), stats)
        row = {}
        for target in ("onnxruntime", "tensorrt"):
            qm = insert_qdq(model, ranges, QuantizeOptions(target=target))
            row[target] = val_metrics(qm.model)
            if target == "onnxruntime":
                ort_models[method] = save_model(qm.model, tmp / f"demo.{method}.ort.onnx")
        accuracy[method] = row
    auto = run_quantize(fp32, tmp / "demo.auto.onnx", data=calib_src, method="auto",
                        options=QuantizeOptions(target="onnxruntime"), batch_size=args.batch_size)
    auto_val = val_metrics(tmp / "demo.auto.onnx")
    best = auto.method  # chosen on held-out calibration samples, not on demo:val
    targets = {}
    for target_text in (args.accuracy_target, "top1-drop=0.5"):
        res = run_quantize(fp32, tmp / "demo.target.onnx", data=calib_src, method="entropy", eval_data=None,
                           options=QuantizeOptions(target="onnxruntime"), accuracy_target=target_text,
                           batch_size=args.batch_size)
        targets[target_text] = {"layers_in_float": res.layers_in_float, "steps": res.report.to_dict()["steps"],
                                "held_out": res.report.evaluation_data, "val": val_metrics(tmp / "demo.target.onnx")}

    # --- ONNX Runtime quantize_static on the same model and data ----------------------------------
    calib = np.ascontiguousarray(split_tensors("calib")[0][calib_src.indices])
    ort_static: dict[str, dict] = {}
    for method in ("entropy", "minmax"):
        out = tmp / f"demo.ortstatic.{method}.onnx"
        secs = ort_quantize_static(fp32, out, calib, method, args.batch_size)
        ort_static[method] = {"quantize_s": secs, **val_metrics(out)}

    # --- latency, round-robin --------------------------------------------------------------------
    # The same INT8 model with ONNX Runtime's exact-U8S8 option forced on: what it costs here (trtrepo sets it
    # only on CPUs whose U8S8 kernels saturate, see trtrepo.cpu).
    models = {"fp32": fp32, f"trtrepo {best}": ort_models[best],
              f"trtrepo {best}, {X64_QUANT_PRECISION}=1 forced": (ort_models[best], {X64_QUANT_PRECISION: "1"}),
              "ort quantize_static entropy": tmp / "demo.ortstatic.entropy.onnx",
              "ort quantize_static minmax": tmp / "demo.ortstatic.minmax.onnx"}
    x = split_tensors("val")[0][:32]
    lat = latency(models, x, (1, 32), args.runs, args.threads)
    kernels = {k: integer_kernels(p, tmp) for k, p in models.items()}
    layers = conv_layers(fp32, x, 32, 30)
    load_after = os.getloadavg()

    result = {
        "heading": args.heading,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "cpu_int8": cpu_int8().describe(),
                    "loadavg_before": load_before, "loadavg_after": load_after},
        "versions": _versions(),
        "calibration_samples": len(calib_src), "collect_s": collect_s, "fp32_accuracy": fp32_acc,
        "val_samples": len(val), "accuracy": accuracy, "best": best,
        "auto": {"method": auto.method, "held_out": auto.report.evaluation_data, "val": auto_val},
        "accuracy_targets": targets, "ort_static": ort_static, "latency_ms": lat, "integer_kernels": kernels,
        "conv_layers": layers,
        "runs": args.runs, "threads": args.threads, "wall_s": time.time() - started,
    }
    md = markdown(result)
    print(md)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if args.update_docs:
        update_docs(ROOT / "docs" / "benchmarks.md", args.heading, md)


def _int_keys(d: dict) -> dict:
    return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in d.items()}


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    return {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__, "numpy": np.__version__}


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def markdown(r: dict) -> str:
    fp = r["fp32_accuracy"]
    heading = r.get("heading", SECTION)
    flag = "" if heading == SECTION else f" --heading '{heading}'"
    cpu = f" CPU: {r['machine']['cpu_int8']}." if "cpu_int8" in r["machine"] else ""
    lines = [heading, "",
             f"Command: `python bench/int8_cpu.py --calib-limit {r['calibration_samples']} --runs {r['runs']} "
             f"--threads {r['threads']} --update-docs{flag}` (one run, {r['wall_s']:.0f} s).{cpu} ONNX Runtime "
             f"{r['versions']['onnxruntime']}, {r['machine']['cores']} cores ({r['machine']['cpu']}); load average "
             f"{r['machine']['loadavg_before'][0]:.1f} before / {r['machine']['loadavg_after'][0]:.1f} after: "
             + ("**taken under load** from other workers on the same 2 cores, so compare ratios, not absolute times."
              if r['machine']['loadavg_before'][0] > 1.0  # before the run: other work (the run itself loads 2 cores)
              else "a quiet machine (nothing else running); still compare ratios, measured side by side."),
             "",
             f"Demo model, calibration on {r['calibration_samples']} samples of `demo:calib` (one collection pass, "
             f"{r['collect_s']:.1f} s, serves all four methods); accuracy on `demo:val` ({r['val_samples']} labelled "
             f"samples, never used for calibration). FP32 top-1: **{_pct(fp)}**.", "",
             "### Accuracy per method", "",
             "| method | INT8 top-1 (onnxruntime target) | drop (pts) | top-1 agreement | cosine | tensorrt target (simulated) top-1 | drop (pts) |",
             "|---|---|---|---|---|---|---|"]
    for m, row in r["accuracy"].items():
        o, t = row["onnxruntime"], row["tensorrt"]
        best = " (auto's choice)" if m == r["best"] else ""
        lines.append(f"| {m}{best} | {_pct(o['accuracy'])} | {o['drop_points']:.2f} | {_pct(o['top1_agreement'])} | "
                     f"{o['cosine']:.5f} | {_pct(t['accuracy'])} | {t['drop_points']:.2f} |")
    for m, row in r["ort_static"].items():
        lines.append(f"| ORT quantize_static {m} (QDQ, per-channel, U8S8) | {_pct(row['accuracy'])} | "
                     f"{row['drop_points']:.2f} | {_pct(row['top1_agreement'])} | {row['cosine']:.5f} | - | - |")
    a = r["auto"]
    lines += ["", f"`--method auto` chose **{a['method']}** on a held-out {a['held_out']['samples']} of the calibration "
              f"samples; on demo:val: top-1 {_pct(a['val']['accuracy'])} (drop {a['val']['drop_points']:.2f} pts), "
              f"cosine {a['val']['cosine']:.5f}.", ""]
    for text, t in r["accuracy_targets"].items():
        steps = t["steps"]
        lines.append(f"`--accuracy-target {text}` (entropy, checked on {t['held_out']['samples']} held-out calibration "
                     f"samples): {'met' if steps[-1]['met'] else 'NOT met'} after {len(steps) - 1} fallback step(s) with "
                     f"{len(t['layers_in_float'])} layer(s) left in float "
                     f"({', '.join('`' + n + '`' for n in t['layers_in_float']) or 'none'}); held-out value "
                     f"{steps[0]['value']:.6g} -> {steps[-1]['value']:.6g}; on demo:val top-1 {_pct(t['val']['accuracy'])}, "
                     f"cosine {t['val']['cosine']:.5f}.")
    lines += ["", "### Against the issue's targets", ""] + [f"- {t}" for t in targets_summary(r)]
    lines += ["", f"### ONNX Runtime CPU latency ({r['threads']} intra-op threads, ORT_ENABLE_ALL, no spinning, "
              f"{r['runs']} runs per model, round-robin)", "",
              "Median wall time per run (speedup = FP32 / model); in brackets the fastest run and the median CPU "
              "time per run (both threads), which the background load distorts least.", "",
              "| model | batch 1 (ms) | speedup | batch 32 (ms) | speedup | batch 32 [min ms, CPU ms] | speedup [min, CPU] |",
              "|---|---|---|---|---|---|---|"]
    base = r["latency_ms"]["fp32"]
    for k, v in r["latency_ms"].items():
        med, mn, cpu = v["median"], v["min"], v["cpu"]
        lines.append(f"| {k} | {med[1]:.3f} | {base['median'][1] / med[1]:.2f}x | {med[32]:.2f} | "
                     f"{base['median'][32] / med[32]:.2f}x | [{mn[32]:.2f}, {cpu[32]:.2f}] | "
                     f"[{base['min'][32] / mn[32]:.2f}x, {base['cpu'][32] / cpu[32]:.2f}x] |")
    lines += ["", "Per convolution, each alone at batch 32 (1 thread, median of 30; INT8 = a full ONNX Runtime node "
              "unit, QLinearConv): where the INT8 gain goes.", "",
              "| conv | Cin -> Cout | input HxW | FP32 ms | INT8 ms | speedup |", "|---|---|---|---|---|---|"]
    for row in r["conv_layers"]:
        lines.append(f"| `{row['layer']}` | {row['cin']} -> {row['cout']} | {row['hw'][0]}x{row['hw'][1]} | "
                     f"{row['fp32']:.2f} | {row['int8']:.2f} | {row['fp32'] / row['int8']:.2f}x |")
    lines += ["", "Kernels in each model's optimized graph (ORT_ENABLE_ALL):", ""]
    for k in r["latency_ms"]:
        kern = ", ".join(f"{op} x{n}" for op, n in r["integer_kernels"][k].items() if n) or "none"
        lines.append(f"- {k}: {kern}")
    return "\n".join(lines) + "\n"


def targets_summary(r: dict) -> list[str]:
    """The issue's targets, checked on this run's numbers."""
    best = r["accuracy"][r["best"]]["onnxruntime"]
    best_drop = min(row["onnxruntime"]["drop_points"] for row in r["accuracy"].values())
    lat = r["latency_ms"]
    ours = next(k for k in lat if k.startswith("trtrepo"))
    speed32 = lat["fp32"]["median"][32] / lat[ours]["median"][32]
    theirs = {k: v for k, v in r["ort_static"].items()}
    their_best_acc = max(v["accuracy"] for v in theirs.values())
    their_best_lat = min(v["median"][32] for k, v in lat.items() if k.startswith("ort quantize_static"))
    out = [f"best method within 1 point top-1 of FP32: {'yes' if best_drop <= 1.0 else 'NO'} (best drop {best_drop:.2f} pts; "
           f"auto's choice {r['best']}: {best['drop_points']:.2f} pts)"]
    for text, t in r["accuracy_targets"].items():
        out.append(f"`--accuracy-target {text}` holds on the held-out data: {'yes' if t['steps'][-1]['met'] else 'NO'}")
    convs = r["conv_layers"]
    narrow = [c for c in convs if c["cin"] == c["cout"] == 16]
    wide = [c for c in convs if c["cout"] >= 32]
    why = ""
    if narrow and wide:
        share = sum(c["fp32"] for c in narrow) / sum(c["fp32"] for c in convs)
        sp = lambda cs: f"{min(c['fp32'] / c['int8'] for c in cs):.2f}-{max(c['fp32'] / c['int8'] for c in cs):.2f}x"  # noqa: E731
        why = (f"; per convolution: the 16 -> 16 channel ones ({100 * share:.0f}% of the FP32 conv time) gain {sp(narrow)} "
               f"in ONNX Runtime's QLinearConv, those with 32 or 64 output channels {sp(wide)}")
    fastest = lat["fp32"]["min"][32] / lat[ours]["min"][32]
    cpu = lat["fp32"]["cpu"][32] / lat[ours]["cpu"][32]
    out.append(f"INT8 speedup >= 2x at batch 32: {'yes' if speed32 >= 2.0 else 'NO'} ({speed32:.2f}x median wall time; "
               f"{fastest:.2f}x fastest run, {cpu:.2f}x CPU time{why})")
    out.append(f"accuracy at least ONNX Runtime quantize_static's: {'yes' if best['accuracy'] >= their_best_acc else 'NO'} "
               f"({100 * best['accuracy']:.2f}% vs {100 * their_best_acc:.2f}%); INT8 latency no worse: "
               f"{'yes' if lat[ours]['median'][32] <= their_best_lat * 1.02 else 'NO'} ({lat[ours]['median'][32]:.2f} vs "
               f"{their_best_lat:.2f} ms at batch 32)")
    return out


if __name__ == "__main__":
    main()
