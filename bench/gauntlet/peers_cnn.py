"""Issue 26 (item 4): peer quantizers on the trained MobileNetV2, each in its own venv.

Peers, each run in a fresh subprocess of its own interpreter (pins must not collide):

* ``aimet`` -- Qualcomm AIMET ONNX (``aimet-onnx`` 2.42, venv ``/work/peer-venvs/aimet``), its
  recommended CNN recipe, following its documentation snippets ``Docs/snippets/onnx/apply_cle.py``
  and ``apply_adaround.py`` (MobileNetV2, 256 calibration samples in batches of 32):
  ``aimet_onnx.cross_layer_equalization.equalize_model`` (BN fold, ReLU6 -> ReLU between
  convolutions, cross-layer scaling, high-bias fold; in place) -> ``onnxsim.simplify`` (the
  AdaRound API page: "It is recommended to use onnx-simplifier before adarounding the model") ->
  ``aimet_onnx.QuantizationSimModel(model, param_type=int8, activation_type=int8,
  quant_scheme=QuantScheme.min_max, config_file="default")`` (alias of
  ``default_config_per_channel.json``: per-channel symmetric weights for Conv/Gemm, asymmetric
  activations, Conv+Relu/Clip supergroups) -> ``aimet_onnx.apply_adaround(sim, batches,
  num_iterations=N)`` (weight encodings frozen) -> ``sim.compute_encodings(batches)``
  (activations) -> ``sim.to_onnx_qdq(export_int32_bias=True, prequantize_constants=True)``: a
  standard QDQ model (int8 weights, int32 biases, uint8 activations) that ONNX Runtime runs.
  CLE runs *before* the simplifier on purpose: AIMET 2.42 recognizes a ReLU6 only as a ``Clip``
  whose min comes from a ``Constant`` node (``aimet_onnx.utils.check_if_clip_node_minimum_is_zero``);
  after onnxsim the bounds are initializers, no Clip is replaced and CLE scales almost nothing
  (measured: 6 of 108 initializers changed, against 88 of 106 and 34 ReLU6 -> ReLU on the exported
  model). ``cle`` in the JSON records what it did. AdaRound's documented default is 10,000
  iterations per layer; on this 2-core CPU the budget is ``--aimet-iters`` (default 100), because
  AdaRound's fixed cost is already large here: for each of the 53 layers it rebuilds two ONNX
  Runtime sessions and pushes all 256 crops through the FP32 model and through the simulation
  (whose QcQuantizeOp custom ops run ~10x slower than the FP32 model), about 5 minutes in all.
  ``aimet-simplify-first`` (not run unless named in ``--runs``) is the snippets' literal order,
  onnxsim -> CLE (so in effect AdaRound without CLE), same budget.
  Both the exported model under ONNX Runtime (the table) and AIMET's own simulation
  (``sim.session``; ``sim_*`` keys in the JSON) are scored.
* ``inc`` / ``inc-qdq-perchannel`` -- Intel Neural Compressor. ``neural-compressor`` 3.10 has no
  ONNX backend any more (its wheel ships only ``torch``, ``tensorflow``, ``jax``, ``common``,
  ``transformers``, ``evaluation``; ``neural_compressor.onnxrt`` / ``neural_compressor.quantization``
  do not exist): its ONNX post-training quantization lives in ``onnx-neural-compressor`` 1.0
  (onnx/neural-compressor, 2024-07, the last release), installed beside it in
  ``/work/peer-venvs/inc``. Its documented call (``docs/quantization.md``):
  ``onnx_neural_compressor.quantization.quantize(model, out, config.StaticQuantConfig(reader))``.
  ``inc`` keeps every default (QOperator format, per-tensor weights, MinMax, U8S8, ORT basic
  optimization first) except ``calibration_sampling_size`` (default 100 reader iterations), set to
  the number of calibration crops, fed one crop per iteration as in its ResNet-50 example;
  ``inc-qdq-perchannel`` also sets ``quant_format=QDQ, per_channel=True`` (like the ONNX Runtime
  rows).
* ``nncf`` -- NNCF 3.4 ``nncf.quantize`` (ONNX backend, default preset, ``subset_size`` = all
  crops, one crop per item), and ``ort-qdq-minmax`` / ``ort-qdq-percentile`` -- ONNX Runtime
  ``quantize_static`` (QDQ, per-channel, uint8 activations / int8 weights, MinMax or Percentile,
  after ``quant_pre_process``): exactly ``bench/gauntlet/peers.py``'s recipes, run through its
  ``--worker`` entry (NNCF in ``/work/peer-venvs/nncf``, ONNX Runtime in this interpreter).

All peers calibrate on all 256 crops of ``calib256.npz`` (trtrepo itself holds a fifth of them out
for its own choices: the peers see those too). Every produced ONNX model is then run by this
interpreter's ONNX Runtime (trtrepo's ``make_session``) on the 500 evaluation crops and compared
with FP32: top-1 agreement over all crops and on the "confident" crops (FP32 top-1/top-2
probability margin >= 0.10), INT8/FP32 speed at batch 32 (median of 5 alternating runs), and the
integer kernels in ONNX Runtime's optimized graph. Logits are kept as ``.npy`` in the work folder.
``quantize s`` is the tool's own job (load, calibrate, quantize, save; not the interpreter start
or the imports), ``process s`` the subprocess's whole wall time; ``peak RSS MB`` is the
subprocess's ``ru_maxrss`` (``os.wait4``). A peer that fails is a row with its exact error.

    .venv/bin/python bench/gauntlet/peers_cnn.py [--runs aimet inc ...] [--out DIR] [--aimet-iters 100] [--smoke]

Writes ``peers_cnn.json`` and ``peers_cnn.md`` into ``--out`` (default
``/work/gauntlet-cache/mobilenet_v2/results``; with ``--smoke``: 2 calibration crops, 4 evaluation
crops, 10 AdaRound iterations, into ``/tmp/peers_cnn_smoke``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CACHE = Path("/work/gauntlet-cache/mobilenet_v2")
VENVS = Path("/work/peer-venvs")
RESULT_TAG = "PEERS-CNN-RESULT "
PEERS_TAG = "PEERS-RESULT "  # bench/gauntlet/peers.py --worker
RUNS: dict[str, dict[str, Any]] = {
    "aimet": {"venv": "aimet", "child": "aimet"},
    "aimet-simplify-first": {"venv": "aimet", "child": "aimet", "default": False},
    "inc": {"venv": "inc", "child": "inc"},
    "inc-qdq-perchannel": {"venv": "inc", "child": "inc"},
    "nncf": {"venv": "nncf", "tool": "nncf", "setting": "nncf"},
    "ort-qdq-minmax": {"venv": None, "tool": "ort", "setting": "ort-qdq-minmax"},
    "ort-qdq-percentile": {"venv": None, "tool": "ort", "setting": "ort-qdq-percentile"},
}
PACKAGES = ("aimet-onnx", "neural-compressor", "onnx-neural-compressor", "nncf", "onnxruntime", "onnx", "onnxsim",
            "torch", "numpy")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


# --------------------------------------------------------------------------------------------
# Children (run inside a peer's venv: stdlib and numpy only at module level)


def _crops(path: str, n: int) -> np.ndarray:
    with np.load(path) as f:
        return np.ascontiguousarray(f["input"][:n])


def _child_aimet(job: dict, res: dict) -> None:
    import aimet_onnx
    import onnx
    import onnxruntime as ort
    import torch  # AdaRound optimizes its rounding in torch (CPU)
    from aimet_onnx.common.defs import QuantScheme
    from aimet_onnx.cross_layer_equalization import equalize_model
    from aimet_onnx.quantsim import QuantizationSimModel
    from onnx import numpy_helper

    calib = _crops(job["calib"], job["n_calib"])
    batches = [{"input": calib[i:i + 32]} for i in range(0, len(calib), 32)]
    res["torch_threads"] = torch.get_num_threads()
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    job["_t0"] = t0
    model = onnx.load(job["model"])
    phases["load"] = time.perf_counter() - t0

    def cle(model: onnx.ModelProto) -> onnx.ModelProto:
        before = {i.name: numpy_helper.to_array(i).copy() for i in model.graph.initializer}
        clips = sum(n.op_type == "Clip" for n in model.graph.node)
        t = time.perf_counter()
        equalize_model(model)  # in place
        phases["cle"] = time.perf_counter() - t
        after = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        res["cle"] = {"initializers_changed": sum(1 for k, v in before.items() if k in after and after[k].shape == v.shape
                                                  and not np.array_equal(after[k], v)),
                      "initializers": len(before), "clip_before": clips,
                      "clip_after": sum(n.op_type == "Clip" for n in model.graph.node),
                      "relu_after": sum(n.op_type == "Relu" for n in model.graph.node)}
        return model

    def simplify(model: onnx.ModelProto) -> onnx.ModelProto:
        t = time.perf_counter()
        try:
            import onnxsim

            model, ok = onnxsim.simplify(model)
            res["onnxsim"] = "ok" if ok else "check failed (simplified model kept)"
        except Exception as exc:  # the docs' snippet goes on with the unsimplified model
            res["onnxsim"] = f"failed: {_one_line(exc)}"
        phases["simplify"] = time.perf_counter() - t
        return model

    order = (simplify, cle) if job["run"] == "aimet-simplify-first" else (cle, simplify)
    res["order"] = " -> ".join(f.__name__ for f in order)
    for step in order:
        model = step(model)
    cle_fp32 = model.SerializeToString()  # the float model AIMET quantizes (CLE changed ReLU6 to ReLU)
    t = time.perf_counter()
    sim = QuantizationSimModel(model, param_type=aimet_onnx.int8, activation_type=aimet_onnx.int8,
                               quant_scheme=QuantScheme.min_max, config_file="default")
    phases["quantsim"] = time.perf_counter() - t
    t = time.perf_counter()
    aimet_onnx.apply_adaround(sim, batches, num_iterations=job["aimet_iters"])
    phases["adaround"] = time.perf_counter() - t
    t = time.perf_counter()
    sim.compute_encodings(batches)
    phases["compute_encodings"] = time.perf_counter() - t
    t = time.perf_counter()
    qdq = sim.to_onnx_qdq(export_int32_bias=True, prequantize_constants=True)
    onnx.save(qdq, job["out"])
    phases["export"] = time.perf_counter() - t
    res["seconds"] = time.perf_counter() - t0
    res["phases"] = {k: round(v, 2) for k, v in phases.items()}
    res["adaround_iterations"] = job["aimet_iters"]
    res["calibration_batches"] = [len(b["input"]) for b in batches]
    res["quantizers_enabled"] = sum(1 for q in sim.qc_quantize_op_dict.values() if q.enabled)
    res["qdq_nodes"] = sum(1 for n in qdq.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear"))
    # AIMET's own simulation (QcQuantizeOp custom ops in ONNX Runtime) on the evaluation crops.
    t = time.perf_counter()
    x = _crops(job["eval"], job["n_eval"])
    out = [sim.session.run(None, {"input": x[i:i + 50]})[0] for i in range(0, len(x), 50)]
    np.save(job["logits"], np.concatenate(out))
    res["sim_logits_seconds"] = round(time.perf_counter() - t, 2)
    res["logits_from"] = "AIMET QuantizationSimModel.session (simulation)"
    s = ort.InferenceSession(cle_fp32, providers=["CPUExecutionProvider"])
    np.save(job["logits"].replace(".npy", "_cle_fp32.npy"),
            np.concatenate([s.run(None, {"input": x[i:i + 50]})[0] for i in range(0, len(x), 50)]))


def _child_inc(job: dict, res: dict) -> None:
    import onnxruntime as ort
    from onnx_neural_compressor import data_reader
    from onnx_neural_compressor.quantization import QuantFormat, config, quantize

    calib = _crops(job["calib"], job["n_calib"])
    items = [{"input": calib[i:i + 1]} for i in range(len(calib))]

    class Reader(data_reader.CalibrationDataReader):
        def __init__(self) -> None:
            self.rewind()

        def get_next(self) -> dict | None:
            return next(self.it, None)

        def rewind(self) -> None:
            self.it = iter(items)

    extra = {"quant_format": QuantFormat.QDQ, "per_channel": True} if job["run"] == "inc-qdq-perchannel" else {}
    t0 = time.perf_counter()
    job["_t0"] = t0
    qconfig = config.StaticQuantConfig(Reader(), calibration_sampling_size=len(items), **extra)
    res["config"] = {"quant_format": qconfig.quant_format.name, "per_channel": qconfig.per_channel,
                     "calibrate_method": qconfig.calibrate_method.name, "activation_type": qconfig.activation_type.name,
                     "weight_type": qconfig.weight_type.name, "reduce_range": qconfig.reduce_range,
                     "execution_provider": qconfig.execution_provider, "calibration_sampling_size": len(items)}
    quantize(job["model"], job["out"], qconfig)
    res["seconds"] = time.perf_counter() - t0
    x = _crops(job["eval"], job["n_eval"])
    s = ort.InferenceSession(job["out"], providers=["CPUExecutionProvider"])
    np.save(job["logits"], np.concatenate([s.run(None, {"input": x[i:i + 50]})[0] for i in range(0, len(x), 50)]))
    res["logits_from"] = f"exported model, onnxruntime {ort.__version__} of the inc venv"


def child(job: dict) -> dict:
    res: dict[str, Any] = {"run": job["run"], "ok": False, "seconds": None, "error": None}
    try:
        {"aimet": _child_aimet, "inc": _child_inc}[job["child"]](job, res)
        res["ok"] = True
    except BaseException as exc:  # the failure is the result
        res["error"] = _one_line(exc)
        res["traceback"] = traceback.format_exc().strip().splitlines()[-15:]
        if res["seconds"] is None and "_t0" in job:
            res["seconds"] = time.perf_counter() - job["_t0"]
    if res["seconds"] is not None:
        res["seconds"] = round(res["seconds"], 3)
    return res


# --------------------------------------------------------------------------------------------
# Parent


def run_process(cmd: list[str], log: Path, timeout: float) -> dict:
    """Run ``cmd`` (stdout and stderr into ``log``); its exit code, wall time and peak RSS
    (``ru_maxrss`` of the child, from ``os.wait4``)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NNCF_CI": "1", "TQDM_DISABLE": "1"}
    with open(log, "w") as f:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                p.kill()
                pid, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.2)
        wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": p.returncode, "process_seconds": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "timed_out": timed_out}


def _result_line(log: Path, tag: str) -> dict | None:
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith(tag):
            return json.loads(line[len(tag):])
    return None


def versions(python: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor p in sys.argv[1:]:\n"
            "    try: out[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(out))")
    try:
        p = subprocess.run([python, "-c", code, *PACKAGES], capture_output=True, text=True, timeout=60)
        return json.loads(p.stdout.strip().splitlines()[-1])
    except Exception as exc:
        return {"error": _one_line(exc)}


def run_peer(name: str, args: argparse.Namespace, work: Path, calib: Path, n_calib: int, n_eval: int) -> dict:
    spec = RUNS[name]
    python = str(VENVS / spec["venv"] / "bin" / "python") if spec["venv"] else sys.executable
    out = work / f"{name}.onnx"
    logits = work / f"{name}_child_logits.npy"
    log = work / f"{name}.log"
    for p in (out, logits, logits.with_name(logits.stem + "_cle_fp32.npy"), work / f"{name}_logits.npy"):
        p.unlink(missing_ok=True)
    row: dict[str, Any] = {"tool": name, "python": python, "model_path": str(out), "log": str(log)}
    if not Path(python).exists():
        return {**row, "ok": False, "error": f"no interpreter {python} (venv not created)"}
    if "child" in spec:
        job = {"run": name, "child": spec["child"], "model": str(args.cache / "model.onnx"), "calib": str(calib),
               "n_calib": n_calib, "eval": str(args.cache / "eval.npz"), "n_eval": n_eval, "out": str(out),
               "logits": str(logits), "aimet_iters": args.aimet_iters}
        cmd, tag = [python, str(Path(__file__).resolve()), "--child-job", json.dumps(job)], RESULT_TAG
    else:
        job = {"tool": spec["tool"], "setting": spec["setting"], "kind": "cnn", "model": str(args.cache / "model.onnx"),
               "calib": str(calib), "out": str(out), "batch_size": 32}
        cmd, tag = [python, str(HERE / "peers.py"), "--worker", json.dumps(job)], PEERS_TAG
    proc = run_process(cmd, log, args.timeout)
    res = _result_line(log, tag)
    row.update(proc)
    if res is None:
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        why = f"timed out after {args.timeout:.0f}s" if proc["timed_out"] else f"exit {proc['rc']}"
        if proc["rc"] == -9 and not proc["timed_out"]:
            why += " (killed: out of memory?)"
        return {**row, "ok": False, "error": f"{why}: {tail[-1] if tail else 'no output'}", "log_tail": tail[-20:]}
    if "peak_rss_mb" in res:  # peers.py's own VmHWM of the worker
        res["worker_vmhwm_mb"] = res.pop("peak_rss_mb")
    row.update({k: v for k, v in res.items() if k not in ("tool",)})
    return row


def score(row: dict, fp32: np.ndarray, x: np.ndarray, conf: np.ndarray, model: Path, rounds: int) -> None:
    """Agreement (and speed, integer kernels) of a finished run, in place."""
    from cnn_int8 import agreement, logits, speed
    from peers import integer_kernels

    q = Path(row["model_path"])
    child_npy = Path(row["model_path"]).with_name(f"{row['tool']}_child_logits.npy")
    if child_npy.exists():
        child = np.load(child_npy)
        prefix = "sim_" if row["tool"].startswith("aimet") else "child_"
        row.update({prefix + k: v for k, v in agreement(fp32, child, conf).items() if k != "confident_n"})
    cle_npy = child_npy.with_name(child_npy.stem + "_cle_fp32.npy")
    if cle_npy.exists():  # AIMET's float model after CLE (ReLU6 -> ReLU), before quantization
        row.update({"cle_fp32_" + k: v for k, v in agreement(fp32, np.load(cle_npy), conf).items() if k != "confident_n"})
    if q.exists():
        try:
            lq = logits(q, x)
            np.save(q.with_name(f"{row['tool']}_logits.npy"), lq)
            row.update(agreement(fp32, lq, conf))
            row["logits_scored"] = "exported ONNX model run by onnxruntime (main venv, trtrepo make_session)"
            if child_npy.exists():
                row["child_vs_main_ort_max_abs"] = float(np.abs(np.load(child_npy) - lq).max())
            row["speed_b32"] = speed(model, q, x, rounds=rounds)
            row["integer_kernels"] = integer_kernels(q)
        except Exception as exc:  # an exported model that ONNX Runtime cannot run is a result too
            row["eval_error"] = _one_line(exc)
            if child_npy.exists():
                row.update({k: row["sim_" + k] for k in ("top1", "confident_top1") if "sim_" + k in row})
                row["logits_scored"] = "peer's own simulation (the exported model failed in ONNX Runtime)"
    elif child_npy.exists():
        row.update(agreement(fp32, np.load(child_npy), conf))
        row["logits_scored"] = "peer's own simulation (no ONNX model produced)"


def note(r: dict) -> str:
    parts = []
    if r["tool"].startswith("aimet"):
        parts.append(f"CLE + AdaRound {r.get('adaround_iterations', '?')} it/layer, per-channel int8 weights, min_max")
        c = r.get("cle") or {}
        if c:
            parts.append(f"CLE: {c['clip_before'] - c['clip_after']} ReLU6 -> ReLU, {c['initializers_changed']} of "
                         f"{c['initializers']} initializers changed")
        if "cle_fp32_top1" in r:
            parts.append(f"float model after CLE: {100 * r['cle_fp32_top1']:.1f}% / {100 * r['cle_fp32_confident_top1']:.1f}%")
        if "sim_top1" in r:
            parts.append(f"AIMET sim: {100 * r['sim_top1']:.1f}% / {100 * r['sim_confident_top1']:.1f}%")
        if r.get("onnxsim", "ok") != "ok":
            parts.append(f"onnxsim {r['onnxsim']}")
    elif r["tool"].startswith("inc"):
        c = r.get("config") or {}
        if c:
            parts.append(f"{c.get('quant_format')}, {'per-channel' if c.get('per_channel') else 'per-tensor'} weights, "
                         f"{c.get('calibrate_method')}")
    elif r["tool"] == "nncf":
        parts.append("default preset, subset_size = all crops")
    elif r["tool"].startswith("ort"):
        parts.append("QDQ, per-channel, U8S8" + (", reduce_range" if r.get("reduce_range") else ""))
    k = (r.get("integer_kernels") or {}).get("total")
    if k is not None:
        parts.append(f"{k} integer kernels")
    if r.get("eval_error"):
        parts.append(f"ORT eval failed: {r['eval_error']}")
    if r.get("logits_scored", "").startswith("peer's own"):
        parts.append("scored on the peer's simulation")
    return "; ".join(parts)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"`python bench/gauntlet/peers_cnn.py{' --smoke' if meta['smoke'] else ''}` on {meta['cpu']}, {meta['date']}: "
             f"trained MobileNetV2, the first {meta['calibration_crops']} calibration crops of calib256.npz (the peers "
             f"also see the fifth trtrepo holds out), {meta['eval_crops']} evaluation crops of which {meta['confident_crops']} "
             "confident (FP32 top-1/top-2 margin >= 0.10). Each peer in its own venv and subprocess; quantize s = the "
             "tool's job without interpreter start and imports; peak RSS = the subprocess's ru_maxrss.", "",
             "| run | top-1 agreement | on confident crops | INT8/FP32 speed b32 | quantize s | peak RSS MB | notes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        rss = f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") is not None else "-"
        secs = f"{r['seconds']:.1f}" if r.get("seconds") is not None else "-"
        if not r.get("ok"):
            lines.append(f"| {r['tool']} | failed: {r.get('error')} | | | {secs} | {rss} | {note(r)} |")
            continue
        top1 = f"{100 * r['top1']:.1f}%" if "top1" in r else "-"
        ctop1 = f"{100 * r['confident_top1']:.1f}%" if "confident_top1" in r else "-"
        sp = f"{r['speed_b32']:.2f}x" if "speed_b32" in r else "-"
        lines.append(f"| {r['tool']} | {top1} | {ctop1} | {sp} | {secs} | {rss} | {note(r)} |")
    lines += ["", "Versions: " + "; ".join(f"{venv}: " + ", ".join(f"{k} {v}" for k, v in vs.items())
                                            for venv, vs in meta["versions"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--out", type=Path, default=None, help="default CACHE/results (--smoke: /tmp/peers_cnn_smoke)")
    ap.add_argument("--runs", nargs="+", default=[k for k, v in RUNS.items() if v.get("default", True)], choices=list(RUNS))
    ap.add_argument("--calib", type=int, default=256, help="calibration crops (the first N of calib256.npz)")
    ap.add_argument("--aimet-iters", type=int, default=100, help="AdaRound iterations per layer (AIMET default 10000)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per peer subprocess")
    ap.add_argument("--smoke", action="store_true", help="2 calibration crops, 4 evaluation crops, 10 AdaRound iterations")
    ap.add_argument("--child-job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_job:
        print(RESULT_TAG + json.dumps(child(json.loads(args.child_job)), default=str), flush=True)
        return
    for p in (str(HERE), str(ROOT)):  # cnn_int8 / peers (bench/gauntlet) and trtrepo
        if p not in sys.path:
            sys.path.insert(0, p)
    from cnn_int8 import cpu_name, logits

    from trtrepo.evaluate import confident_mask

    n_calib, n_eval, rounds = (2, 4, 1) if args.smoke else (args.calib, None, 5)
    if args.smoke:
        args.aimet_iters = min(args.aimet_iters, 10)
    out = args.out or (Path("/tmp/peers_cnn_smoke") if args.smoke else args.cache / "results")
    work = out / "peers_cnn"
    work.mkdir(parents=True, exist_ok=True)
    model = args.cache / "model.onnx"
    calib = work / f"calib{n_calib}.npz"
    np.savez(calib, input=np.load(args.cache / "calib256.npz")["input"][:n_calib])
    x = np.load(args.cache / "eval.npz")["input"][:n_eval]
    fp32 = logits(model, x)
    np.save(work / "fp32_logits.npy", fp32)
    conf = confident_mask(fp32)
    venvs = {"main": sys.executable, **{v: str(VENVS / v / "bin" / "python") for v in ("aimet", "inc", "nncf")}}
    meta = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "smoke": args.smoke,
            "eval_crops": len(x), "confident_crops": int(conf.sum()), "calibration_crops": n_calib,
            "aimet_adaround_iterations": args.aimet_iters,
            "versions": {k: versions(p) for k, p in venvs.items() if Path(p).exists()}, "interpreters": venvs}
    print(json.dumps({"meta": meta}), flush=True)
    rows = []
    for name in args.runs:
        row = run_peer(name, args, work, calib, n_calib, len(x))
        if row.get("ok"):
            score(row, fp32, x, conf, model, rounds)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("log_tail", "traceback")}, default=str), flush=True)
    name = "peers_cnn"
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    md = markdown(meta, rows)
    (out / f"{name}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
