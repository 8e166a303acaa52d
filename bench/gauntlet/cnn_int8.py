"""Issue 26: INT8 on the trained MobileNetV2 with each weight-rounding step, both targets.

For each target (onnxruntime, tensorrt) and ``--weight-rounding`` choice (nearest,
bias_correction, adaround, auto) trtrepo's ``run_quantize`` runs with its defaults otherwise on
the first 256 calibration crops (it holds a fifth out for its choices and its gate), each in a
fresh subprocess (peak RSS measured there). The INT8 model is then compared with FP32 on the
gauntlet's 500 evaluation crops (other regions of the photographs than the calibration crops):
top-1 agreement over all crops and on the crops whose FP32 top-1/top-2 probability margin is
>= 0.10; the FP16 cast of the model on the same crops as the noise floor; ONNX Runtime CPU speed
of INT8 vs FP32 at batch 32 (onnxruntime target), measured alternately in one process.

    python bench/gauntlet/cnn_int8.py [--cache /work/gauntlet-cache/mobilenet_v2] [--out DIR]

Writes ``cnn_int8.json`` and ``cnn_int8.md`` into ``--out`` (default: CACHE/results).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
STEPS = ("nearest", "bias_correction", "adaround", "auto")
TARGETS = ("onnxruntime", "tensorrt")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
            flags = Path("/proc/cpuinfo").read_text()
            return f"{name} ({'avx512_vnni' if 'avx512_vnni' in flags else 'no VNNI'})"
    return platform.processor()


def child(args: argparse.Namespace) -> None:
    """One quantize run (in its own process): prints a JSON line."""
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import run_quantize

    t0 = time.perf_counter()
    res = run_quantize(args.model, args.out_model, data=args.calib, options=QuantizeOptions(target=args.target),
                       weight_rounding=args.step, accept_accuracy_loss=True)
    took = time.perf_counter() - t0
    rep = res.report.to_dict()
    print(json.dumps({"seconds": took, "timings": rep.get("seconds"), "method": res.method,
                      "weight_rounding": {k: v for k, v in (rep.get("weight_rounding") or {}).items() if k != "layers"},
                      "check": rep.get("accuracy_check"),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def logits(model: str | Path, x: np.ndarray, session_cache: dict | None = None) -> np.ndarray:
    from trtrepo.evaluate import make_session

    s = make_session(str(model))
    return np.concatenate([s.run(None, {"input": x[i:i + 50]})[0] for i in range(0, len(x), 50)])


def agreement(a: np.ndarray, b: np.ndarray, conf: np.ndarray) -> dict[str, float]:
    ag = a.argmax(1) == b.argmax(1)
    return {"top1": float(ag.mean()), "confident_top1": float(ag[conf].mean()), "confident_n": int(conf.sum())}


def speed(fp32: Path, int8: Path, x: np.ndarray, rounds: int = 5) -> float:
    from trtrepo.evaluate import make_session

    a, b = make_session(str(fp32)), make_session(str(int8))
    xb = x[:32]
    ta, tb = [], []
    for s in (a, b):
        s.run(None, {"input": xb})
    for _ in range(rounds):
        for s, t in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            s.run(None, {"input": xb})
            t.append(time.perf_counter() - t0)
    return float(np.median(ta) / np.median(tb))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--calib", type=int, default=256)
    ap.add_argument("--steps", nargs="+", default=list(STEPS))
    ap.add_argument("--targets", nargs="+", default=list(TARGETS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model"), ap.add_argument("--out-model"), ap.add_argument("--target"), ap.add_argument("--step")
    args = ap.parse_args()
    if args.child:
        args.calib = str(args.cache / f"calib{args.calib}.npz")
        child(args)
        return
    from trtrepo.evaluate import confident_mask
    from trtrepo.fp16 import convert_to_fp16
    from trtrepo.qdq import load_model

    out = args.out or args.cache / "results"
    work = out / "cnn_int8"
    work.mkdir(parents=True, exist_ok=True)
    model = args.cache / "model.onnx"
    calib = args.cache / f"calib{args.calib}.npz"
    if not calib.exists():
        np.savez(calib, input=np.load(args.cache / "calib.npz")["input"][:args.calib])
    x = np.load(args.cache / "eval.npz")["input"]
    fp32 = logits(model, x)
    conf = confident_mask(fp32)
    fp16_path = work / "fp16.onnx"
    import onnx

    onnx.save(convert_to_fp16(load_model(model)), str(fp16_path))
    rows = [{"tool": "FP16 cast (noise floor)", **agreement(fp32, logits(fp16_path, x), conf)}]
    print(json.dumps(rows[-1]), flush=True)
    for target in args.targets:
        for step in args.steps:
            q = work / f"{target}_{step}.onnx"
            cmd = [sys.executable, __file__, "--child", "--cache", str(args.cache), "--calib", str(args.calib),
                   "--model", str(model), "--out-model", str(q), "--target", target, "--step", step]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                rows.append({"tool": f"trtrepo {target} {step}", "error": proc.stderr.strip().splitlines()[-1:]})
                continue
            info = json.loads(proc.stdout.strip().splitlines()[-1])
            row = {"tool": f"trtrepo {target} {step}", "process_seconds": time.perf_counter() - t0, **info,
                   **agreement(fp32, logits(q, x), conf)}
            if target == "onnxruntime":
                row["speed_b32"] = speed(model, q, x)
            rows.append(row)
            print(json.dumps({k: row[k] for k in row if k not in ("check", "weight_rounding", "timings")}), flush=True)
    meta = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "eval_crops": len(x),
            "confident_crops": int(conf.sum()), "calibration_crops": args.calib}
    (out / "cnn_int8.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    lines = [f"`python bench/gauntlet/cnn_int8.py` on {meta['cpu']}, {meta['date']}: trained MobileNetV2, "
             f"{args.calib} calibration crops (a fifth held out by trtrepo), {len(x)} evaluation crops of which "
             f"{meta['confident_crops']} confident (FP32 top-1/top-2 margin >= 0.10).", "",
             "| run | top-1 agreement | on confident crops | INT8/FP32 speed b32 | quantize s | peak RSS MB | weight step chosen | held-out gate |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['tool']} | failed: {r['error']} | | | | | | |")
            continue
        chk = (r.get("check") or {}).get("verdict") or {}
        gate = "" if not chk else f"{'pass' if chk.get('ok') else 'FAIL'}: {chk.get('message', '')}"
        sp = f"{r['speed_b32']:.2f}x" if "speed_b32" in r else "-"
        wr = (r.get("weight_rounding") or {}).get("chosen", "-")
        secs = f"{r['seconds']:.1f}" if "seconds" in r else "-"
        rss = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "-"
        lines.append(f"| {r['tool']} | {100 * r['top1']:.1f}% | {100 * r['confident_top1']:.1f}% | {sp} | {secs} | {rss} | {wr} | {gate} |")
    (out / "cnn_int8.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
