"""Trained-model gauntlet: trtrepo's defaults against ONNX Runtime's ``quantize_static`` and NNCF 3.4
on two trained models, side by side in one run.

Models (``--models``): ``mobilenet_v2``, torchvision's ImageNet MobileNetV2 on photograph crops
(vision.py: the first ``--calib`` calibration crops, the 500 evaluation crops from the other half
of each photograph), and ``mpnet``, the all-mpnet-base-v2 sentence encoder on generated English
sentences (text.py: ``--calib`` calibration sentences picked as trtrepo's ``--limit N --seed 0``
picks them, 256 evaluation sentences from another seed).

Tools, each quantizing in a fresh process whose peak RSS (``VmHWM``) it reports:

* **trtrepo** with its defaults through the CLI: ``trtrepo quantize MODEL --data SPEC --limit N
  --target T -o OUT --report DIR`` (targets onnxruntime and, for MobileNetV2, tensorrt; the
  tensorrt-target model is Q/DQ for TensorRT, run here on ONNX Runtime for its accuracy only).
  trtrepo holds a fifth of the samples out for its choices and its gate; ``--accept-accuracy-loss``
  writes the model whatever the gate says, and the table shows the verdict (pass, fail, undecided).
* **ort-minmax**: ``quantize_static`` after ``quant_pre_process`` (its documented preprocessing),
  QDQ, per-channel int8 weights, uint8 activations, MinMax, ``reduce_range`` only on a CPU without
  VNNI (the docstring's remedy); **ort-percentile** the same with Percentile (Entropy at its
  defaults searches one threshold, the full range: the minmax model again); for mpnet also
  **ort-matmul-only** (``op_types_to_quantize=['MatMul']``, MinMax: only the GEMMs).
* **nncf**: ``nncf.quantize(model, nncf.Dataset(samples), subset_size=N)``, its defaults
  (``model_type=TRANSFORMER`` for mpnet), one sample per item as its documentation feeds it.
* **fp16**: trtrepo's FP16 copy of the model, the noise floor of the accuracy figures.

Figures per tool: accuracy against FP32 (MobileNetV2: top-1 agreement on all crops and on the
confident ones, ``trtrepo.evaluate.confident_mask``, and the gate's expected top-1 drop; mpnet:
embedding cosine), ONNX Runtime speed against FP32 at batch 32 and 1 (mpnet at 32 tokens; every
model of a model round-robin in one fresh process, 2 threads), seconds and peak RSS to quantize.

    python bench/gauntlet/run.py [--models mobilenet_v2 mpnet] [--calib 256] [--out DIR]
        [--update-docs docs/benchmarks.md]

writes ``gauntlet.json`` and ``gauntlet.md`` into ``--out`` (default /work/gauntlet-cache/results).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (str(HERE), str(HERE.parent), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _common import cpu_name, publish, status_mb  # noqa: E402

CACHE = Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", "/work/gauntlet-cache"))
HEADING = "## Trained-model gauntlet (issue 42 rewrite)"
TAG = "GAUNTLET-RESULT "
THREADS = 2
TEXT_SEQ = 32
VMHWM = ("import atexit, sys; from _common import status_mb; "
         "atexit.register(lambda: print('" + TAG + "' + str(status_mb('VmHWM')), file=sys.stderr)); "
         "from trtrepo.cli import main; sys.argv[0] = 'trtrepo'; main()")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "NNCF_CI": "1",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), str(ROOT), os.environ.get("PYTHONPATH", "")])}


def prepare(name: str, n_calib: int, work: Path) -> dict[str, Any]:
    """The model's FP32 file, trtrepo's data spec, the calibration samples (the very ones trtrepo
    reads) and the evaluation batches."""
    import onnx

    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO

    if name == "mobilenet_v2":
        import vision

        cache = CACHE / "mobilenet_v2"
        vision.build_cache(cache, 512, 500)
        spec = str(work / f"calib{n_calib}.npz")
        with np.load(cache / "calib.npz") as f:
            np.savez(spec, input=f["input"][:n_calib])
        model, eval_spec, targets, peers = cache / "model.onnx", str(cache / "eval.npz"), ("onnxruntime", "tensorrt"), ("ort-minmax", "ort-percentile", "nncf")
    else:
        import text

        model = text.export_onnx(CACHE / "mpnet" / "model.onnx", CACHE)
        spec, eval_spec, targets = "text:calib_samples", "text:eval_samples", ("onnxruntime",)
        peers = ("ort-minmax", "ort-percentile", "ort-matmul-only", "nncf")
    io = ModelIO.from_onnx(onnx.load(str(model), load_external_data=False))
    limit = None if name == "mobilenet_v2" else n_calib
    calib = [s.inputs for s in open_data(spec, io=io, limit=limit, seed=0)]
    evaluation = [s.inputs for s in open_data(eval_spec, io=io, limit=None, seed=None)]
    return {"model": Path(model), "spec": spec, "limit": limit, "calib": calib, "eval": batches(evaluation),
            "targets": targets, "peers": peers, "output": "logits" if name == "mobilenet_v2" else "sentence_embedding"}


def batches(samples: list[dict[str, np.ndarray]], size: int = 32) -> list[dict[str, np.ndarray]]:
    """Consecutive samples of one shape stacked into batches of at most ``size``."""
    out: list[dict[str, np.ndarray]] = []
    run: list[dict[str, np.ndarray]] = []
    for s in [*samples, None]:
        if run and (s is None or len(run) == size or any(v.shape != run[0][k].shape for k, v in s.items())):
            out.append({k: np.stack([r[k] for r in run]) for k in run[0]})
            run = []
        if s is not None:
            run.append(s)
    return out


def outputs(path: Path, feeds: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    from trtrepo.evaluate import make_session

    session = make_session(str(path), threads=THREADS, optimization="all")
    return np.concatenate([session.run([name], feed)[0] for feed in feeds]).astype(np.float64)


def figures(name: str, ref: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    if name == "mpnet":
        import text

        return text.metrics(ref, cand)
    from trtrepo.evaluate import confident_mask, expected_top1_drop

    same = ref.argmax(1) == cand.argmax(1)
    conf = confident_mask(ref)
    drop = expected_top1_drop(ref, cand)
    return {"top1": float(same.mean()), "confident_top1": float(same[conf].mean()), "confident": int(conf.sum()),
            "expected_drop": drop.estimate, "expected_drop_upper": drop.upper}


def quantize(tool: str, m: dict[str, Any], out: Path, work: Path, n_calib: int) -> dict[str, Any]:
    """Run one tool; its row: ok, error, seconds (the tool's own), process seconds, peak RSS."""
    t = time.perf_counter()
    if tool.startswith("trtrepo"):
        target = tool.split()[1]
        report = work / f"report-{target}"
        args = ["quantize", str(m["model"]), "--data", m["spec"], "--target", target, "-o", str(out), "--report", str(report),
                "--accept-accuracy-loss"]
        args += ["--limit", str(m["limit"])] if m["limit"] else []
        p = subprocess.run([sys.executable, "-c", VMHWM, *args], capture_output=True, text=True, env=env(), cwd=ROOT)
        row: dict[str, Any] = {"command": "trtrepo " + " ".join(args)}
        rss = [ln for ln in p.stderr.splitlines() if ln.startswith(TAG)]
        row["peak_rss_mb"] = round(float(rss[-1][len(TAG):]), 1) if rss else None
        if p.returncode or not out.is_file():
            tail = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(TAG)]
            return {**row, "ok": False, "error": f"exit {p.returncode}: {tail[-1] if tail else 'no output'}"}
        rep = json.loads((report / "quantize.json").read_text())
        took = [ln.rsplit(" in ", 1)[-1].rstrip("s") for ln in p.stdout.splitlines() if ln.startswith("quantized ")]
        check = rep.get("accuracy_check") or {}
        gate = "pass" if check.get("ok") else "undecided" if (check.get("verdict") or {}).get("inconclusive") else "fail"
        return {**row, "ok": True, "seconds": float(took[-1]) if took else None, "method": rep.get("method"),
                "kept_float": len(rep.get("kept_float") or []), "gate": gate if check.get("measured") else "not measured",
                "front": (rep.get("front") or {}).get("reason"), "process_s": round(time.perf_counter() - t, 1)}
    job = work / f"{tool}.npz"
    np.savez(job, **{f"{i}:{k}": v for i, s in enumerate(m["calib"]) for k, v in s.items()})
    res = child(["--peer", tool, str(m["model"]), str(job), str(out)])
    return {**res, "process_s": round(time.perf_counter() - t, 1)} if isinstance(res, dict) else {"ok": False, "error": res}


def child(args: list[str]) -> dict[str, Any] | str:
    """This script in a fresh process (``--peer`` or ``--time``): its result line, or why there is none."""
    p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env(), cwd=ROOT)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(TAG)]
    return json.loads(lines[-1][len(TAG):]) if lines else f"exit {p.returncode}: {(p.stderr.strip().splitlines() or ['no output'])[-1]}"


def peer(tool: str, model: str, job: str, out: str) -> dict[str, Any]:
    """Inside the peer's own process: load the samples, quantize, report."""
    with np.load(job) as f:
        samples: dict[int, dict[str, np.ndarray]] = {}
        for key in f.files:
            i, name = key.split(":", 1)
            samples.setdefault(int(i), {})[name] = f[key]
    calib = [samples[i] for i in sorted(samples)]
    row: dict[str, Any] = {"ok": False, "samples": len(calib)}
    t = time.perf_counter()
    try:
        if tool == "nncf":
            import nncf
            import onnx

            proto = onnx.load(model)
            kind = nncf.ModelType.TRANSFORMER if "input_ids" in calib[0] else None
            q = nncf.quantize(proto, nncf.Dataset([{k: v[None] for k, v in s.items()} for s in calib]),
                              subset_size=len(calib), model_type=kind)
            big = q.ByteSize() > 2**31 - 2**26
            onnx.save(q, out, save_as_external_data=big, location=Path(out).name + ".data" if big else None)
        else:
            from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
            from onnxruntime.quantization.shape_inference import quant_pre_process

            from trtrepo.cpu import cpu_int8

            feeds = iter(batches(calib))

            class Reader:
                def get_next(self) -> dict[str, np.ndarray] | None:
                    return next(feeds, None)

            with tempfile.TemporaryDirectory() as tmp:
                pre = str(Path(tmp) / "pre.onnx")
                quant_pre_process(model, pre)
                quantize_static(pre, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,  # type: ignore[arg-type]
                                reduce_range=cpu_int8().saturates, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8,
                                calibrate_method=CalibrationMethod.Percentile if tool == "ort-percentile" else CalibrationMethod.MinMax,
                                op_types_to_quantize=["MatMul"] if tool == "ort-matmul-only" else None)
        row["ok"] = True
    except Exception as exc:  # a peer failing is a result
        row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return {**row, "seconds": round(time.perf_counter() - t, 2), "peak_rss_mb": round(status_mb("VmHWM"), 1)}


def timing(paths: dict[str, Path], feeds: dict[str, dict[str, np.ndarray]], rounds: int) -> dict[str, dict[str, float]]:
    """Inside a fresh process: each round runs every model once per feed, round-robin; median ms."""
    from trtrepo.evaluate import make_session

    sessions = {k: make_session(str(p), threads=THREADS, optimization="all") for k, p in paths.items()}
    times: dict[str, dict[str, list[float]]] = {k: {b: [] for b in feeds} for k in sessions}
    for r in range(rounds + 2):
        for b, feed in feeds.items():
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feed)
                if r >= 2:
                    times[k][b].append(time.perf_counter() - t)
    return {k: {b: float(np.median(v) * 1e3) for b, v in per.items()} for k, per in times.items()}


def speeds(paths: dict[str, Path], m: dict[str, Any], work: Path, rounds: int) -> dict[str, dict[str, float]]:
    """FP32 median / model median at batch 32 and 1, from one fresh timing process."""
    pool = [{k: v[i] for k, v in b.items()} for b in m["eval"] for i in range(len(next(iter(b.values()))))]
    if "input_ids" in pool[0]:
        pool = [s for s in pool if len(s["input_ids"]) == TEXT_SEQ]
    pool = [pool[i % len(pool)] for i in range(32)]
    feeds = {"b32": batches(pool)[0], "b1": batches(pool[:1])[0]}
    job = work / "timing.npz"
    np.savez(job, **{f"{b}:{k}": v for b, f in feeds.items() for k, v in f.items()})
    ms = child(["--time", json.dumps({k: str(v) for k, v in paths.items()}), str(job), str(rounds)])
    if isinstance(ms, str):
        raise RuntimeError(f"timing process: {ms}")
    return {k: {b: ms["FP32"][b] / v[b] for b in v} | {f"{b}_ms": v[b] for b in v} for k, v in ms.items()}


def bench(name: str, n_calib: int, work: Path, rounds: int) -> dict[str, Any]:
    from trtrepo.fp16 import convert_to_fp16
    from trtrepo.qdq import load_model, save_model

    work.mkdir(parents=True, exist_ok=True)
    m = prepare(name, n_calib, work)
    log(f"{name}: {len(m['calib'])} calibration samples, {sum(len(next(iter(b.values()))) for b in m['eval'])} evaluation samples")
    ref = outputs(m["model"], m["eval"], m["output"])
    rows: dict[str, dict[str, Any]] = {}
    timed = {"FP32": m["model"]}
    fp16 = work / "fp16.onnx"
    save_model(convert_to_fp16(load_model(m["model"])), fp16)
    rows["fp16"] = {"ok": True, "figures": figures(name, ref, outputs(fp16, m["eval"], m["output"]))}
    for tool in [f"trtrepo {t}" for t in m["targets"]] + list(m["peers"]):
        log(f"{name}: {tool} ...")
        out = work / f"{tool.replace(' ', '_')}.onnx"
        row = quantize(tool, m, out, work, n_calib)
        if row["ok"]:
            try:
                row["figures"] = figures(name, ref, outputs(out, m["eval"], m["output"]))
                if tool != "trtrepo tensorrt":
                    timed[tool] = out
            except Exception as exc:  # a model that does not run is a result
                row.update(ok=False, error=f"does not run: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        log(f"{name}: {tool}: {row.get('figures') or row.get('error')}")
        rows[tool] = row
    log(f"{name}: timing {len(timed)} models, {rounds} rounds")
    for tool, s in speeds(timed, m, work, rounds).items():
        rows.setdefault(tool, {"ok": True})["speed"] = s
    return {"model": name, "calibration_samples": len(m["calib"]), "rows": rows}


def cell(name: str, r: dict[str, Any]) -> str:
    f = r.get("figures")
    if not f:
        return f"failed: {str(r.get('error', '?'))[:160]}"
    if name == "mpnet":
        return f"cosine {f['cosine_mean']:.4f} (min {f['cosine_min']:.3f})"
    return (f"{100 * f['top1']:.1f} % / {100 * f['confident_top1']:.1f} % of {f['confident']}; "
            f"expected drop {100 * f['expected_drop']:.2f} (upper {100 * f['expected_drop_upper']:.2f}) points")


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [HEADING, "", f"`{meta['command']}` on {meta['cpu']}, 2 cores, {meta['date']} (tree {meta['commit']}); what "
             "each column measures: the script's docstring. MobileNetV2: top-1 agreement on all 500 crops / on the "
             "confident ones, and the expected top-1 drop; mpnet: embedding cosine over 256 sentences.", ""]
    for res in results["models"]:
        lines += [f"**{res['model']}** ({res['calibration_samples']} calibration samples):", "",
                  "| tool | accuracy vs FP32 | speed b32 / b1 | quantize s | peak RSS MB | notes |", "|---|---|---|---|---|---|"]
        for tool, r in res["rows"].items():
            if tool == "FP32":
                continue
            s = r.get("speed")
            sp = f"{s['b32']:.2f}x / {s['b1']:.2f}x" if s else "-"
            secs = f"{r['seconds']:.1f}" if r.get("seconds") is not None else "-"
            rss = f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "-"
            note = (f"method {r['method']}, {r['kept_float']} nodes kept float, held-out gate: {r['gate']}"
                    if tool.startswith("trtrepo") and r.get("ok") else "")
            lines.append(f"| {tool} | {cell(res['model'], r)} | {sp} | {secs} | {rss} | {note} |")
        fp = res["rows"]["FP32"]["speed"]
        lines += ["", f"FP32: {fp['b32_ms']:.1f} ms at batch 32, {fp['b1_ms']:.2f} ms at batch 1.", ""]
    lines.append("Results: [`gauntlet/gauntlet.json`](gauntlet/gauntlet.json).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--peer"]:
        print(TAG + json.dumps(peer(*argv[1:5])), flush=True)
        return 0
    if argv[:1] == ["--time"]:
        with np.load(argv[2]) as f:
            feeds: dict[str, dict[str, np.ndarray]] = {}
            for key in f.files:
                b, name = key.split(":", 1)
                feeds.setdefault(b, {})[name] = f[key]
        print(TAG + json.dumps(timing({k: Path(v) for k, v in json.loads(argv[1]).items()}, feeds, int(argv[3]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mobilenet_v2", "mpnet"], choices=["mobilenet_v2", "mpnet"])
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20, help="timing rounds (default 20)")
    ap.add_argument("--out", type=Path, default=CACHE / "results")
    ap.add_argument("--update-docs", type=Path, default=None, metavar="MARKDOWN")
    ap.add_argument("--from-json", type=Path, default=None, help="only rewrite the report from a results JSON")
    a = ap.parse_args(argv)
    if a.from_json:
        publish(markdown(json.loads(a.from_json.read_text())), HEADING, a.update_docs)
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    meta = {"command": "python bench/gauntlet/run.py " + " ".join(argv), "cpu": cpu_name(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    results = {"meta": meta, "models": [bench(n, a.calib, a.out / "work" / n, a.rounds) for n in a.models]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "gauntlet.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    section = markdown(results)
    (a.out / "gauntlet.md").write_text(section)
    publish(section, HEADING, a.update_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
