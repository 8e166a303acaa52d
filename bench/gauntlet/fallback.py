"""``--accuracy-target`` on the trained sentence encoder (issue 13, item 5): how much stays INT8,
how long the search takes against a plain quantize, and what the result measures on evaluation
sentences the search never saw.

For each configuration, one fresh ``trtrepo quantize`` process (defaults: method auto,
SmoothQuant auto, onnxruntime target) on the same calibration sentences; then, in this process,
the embedding cosine vs FP32 on held-out evaluation sentences and the INT8/FP32 latency at batch
32 (sequence 32, 2 threads, round-robin) of every result:

    python bench/gauntlet/fallback.py [--calib 512] [--targets 0.99 0.998] [--update-docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SECTION = "## Accuracy-target fallback on all-mpnet-base-v2 (issue 13)"


def run_quantize(model: Path, out: Path, report: Path, n: int, target: str | None) -> dict:
    cmd = [sys.executable, "-m", "trtrepo.cli", "quantize", str(model), "--data", "text:calib_samples", "--limit", str(n),
           "--target", "onnxruntime", "-o", str(out), "--report", str(report), "--no-progress"]
    if target is not None:
        cmd += ["--accuracy-target", f"cosine={target}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - t
    row: dict = {"target": target, "seconds": took, "exit": proc.returncode, "stderr_tail": proc.stderr.strip().splitlines()[-3:]}
    if proc.returncode == 0:
        rep = json.loads((report / "quantize.json").read_text())
        row.update({"method": rep["method"], "smooth_alpha": (rep.get("smooth_quant") or {}).get("alpha"),
                    "check": rep.get("accuracy_check"), "fallback": rep.get("fallback"),
                    "steps": [{k: s.get(k) for k in ("label", "value", "met", "speed")} | {"in_float": len(s["layers_in_float"])}
                              for s in rep.get("steps", [])],
                    "kernels": (rep.get("integer_kernels") or {}).get("kernels", {}).get("total")})
    return row


def main(argv: list[str] | None = None) -> int:
    from _common import cpu_name, publish

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calib", type=int, default=512)
    ap.add_argument("--eval", type=int, default=256)
    ap.add_argument("--targets", type=float, nargs="*", default=[0.99, 0.998])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", "/tmp")) / "fallback")
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args(argv)

    import text

    from trtrepo.data import ListSource, Sample, iter_batches
    from trtrepo.evaluate import run_onnx

    model = text.export_onnx(text.CACHE / "mpnet" / "model.onnx")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for target in [None, *args.targets]:
        tag = "plain" if target is None else f"cos{target}"
        print(f"[fallback] {tag} ...", file=sys.stderr, flush=True)
        row = run_quantize(model, args.work / f"{tag}.onnx", args.work / f"report_{tag}", args.calib, target)
        row["tag"] = tag
        rows.append(row)
        print(f"[fallback] {tag}: exit {row['exit']} in {row['seconds']:.0f}s", file=sys.stderr, flush=True)

    ev = list(iter_batches(ListSource("eval", [Sample(dict(s)) for s in text.eval_samples(args.eval)]), 32))
    ref = run_onnx(model, None, batches=ev).outputs["sentence_embedding"]
    for row in rows:
        if row["exit"] == 0:
            got = run_onnx(args.work / f"{row['tag']}.onnx", None, batches=ev).outputs["sentence_embedding"]
            row["eval"] = text.metrics(ref, got)
    from peers import time_models

    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(5, 30000, (32, 32)).astype(np.int64), "attention_mask": np.ones((32, 32), np.int64)}
    paths = {"fp32": str(model), **{r["tag"]: str(args.work / f"{r['tag']}.onnx") for r in rows if r["exit"] == 0}}
    times = time_models(paths, [feed], runs=8, threads=2)
    for row in rows:
        if row["tag"] in times:
            row["speedup_b32"] = times["fp32"]["median_ms"] / times[row["tag"]]["median_ms"]

    plain = next(r for r in rows if r["tag"] == "plain")
    lines = [SECTION, "",
             f"`python bench/gauntlet/fallback.py --calib {args.calib} --eval {args.eval} --targets {' '.join(map(str, args.targets))}` "
             f"on {cpu_name()} (2 cores), {time.strftime('%Y-%m-%d')}. Each row: one `trtrepo quantize` process with the "
             "defaults (method auto, SmoothQuant auto, onnxruntime target) on the same calibration sentences; cosine on "
             f"{args.eval} evaluation sentences the search never saw; speed-up vs FP32 at batch 32, sequence 32, 2 threads, "
             "timed round-robin in one process.", "",
             "| run | MatMul/Gemm layers INT8 | integer kernels | eval cosine mean / min | speed-up b32 | quantize s | x plain | evaluations |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if r["exit"] != 0:
            lines.append(f"| {r['tag']} | failed: {' '.join(r['stderr_tail'])[:200]} | | | | {r['seconds']:.0f} | | |")
            continue
        fb = r.get("fallback") or {}
        wl, wf = fb.get("weighted_layers"), fb.get("weighted_in_float", 0)
        int8 = f"{wl - wf} of {wl} ({100 * (wl - wf) / wl:.0f} %)" if wl else "all"
        e = r.get("eval", {})
        lines.append(f"| {r['tag']} | {int8} | {r.get('kernels')} | {e.get('cosine_mean', float('nan')):.4f} / "
                     f"{e.get('cosine_min', float('nan')):.4f} | {r.get('speedup_b32', float('nan')):.2f}x | {r['seconds']:.0f} | "
                     f"{r['seconds'] / plain['seconds']:.2f} | {len(r.get('steps') or [])} |")
    for r in rows:
        if r.get("steps") and len(r["steps"]) > 1:
            lines += ["", f"Search steps of {r['tag']} (value = held-out cosine; speed = FP32 time / candidate time on the held-out data):", "",
                      "| step | left in float | layers in float | value | met | speed |", "|---|---|---:|---:|---|---:|"]
            for i, s in enumerate(r["steps"]):
                speed = "-" if s["speed"] is None else f"{s['speed']:.2f}x"
                lines.append(f"| {i} | {s['label']} | {s['in_float']} | {s['value']:.5f} | {'yes' if s['met'] else 'no'} | {speed} |")
    (args.work / "fallback.json").write_text(json.dumps(rows, indent=1, default=str))
    publish("\n".join(lines) + "\n", SECTION, args.update_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
