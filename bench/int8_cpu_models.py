"""Benchmark: ONNX Runtime CPU speed of FP32 vs INT8 on ImageNet-size CNNs (issue 4), in one run.

The demo CNN is small (16-64 channels on 32x32 images); users deploy ResNets and MobileNets. For
each ``--onnx`` model (one float NCHW input with fixed C, H, W and a dynamic batch axis) this
quantizes with trtrepo (``--target onnxruntime``, ``--method``) and with ONNX Runtime's
``quantize_static`` (QDQ, per-channel, uint8 activations / int8 weights, MinMax, after
``quant_pre_process``) on the same calibration batches, then times FP32 and both INT8 models
round-robin (``--threads`` intra-op threads, ORT_ENABLE_ALL, no spinning, median of ``--runs``).

Speed only: the models come with random weights (torchvision's initialisation, no download here)
and the calibration and timing inputs are random images normalised like ImageNet, so the cosine
to FP32 printed beside is a sanity check of the quantized graph, not an accuracy figure.

Models (torchvision is not importable beside torch 2.13; ``scripts/torchvision_venv.sh`` builds a
second venv that has it)::

    .venv-tv/bin/trtrepo export torchvision.models:resnet18 --input-shape 3x224x224 -o /tmp/resnet18.onnx
    python bench/int8_cpu_models.py --onnx /tmp/resnet18.onnx [--onnx ...] [--batches 1 8] [--runs 30] [--update-docs]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import update_docs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SECTION = "## INT8 on the CPU: ImageNet-size CNNs (issue 4)"
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``n`` random images in [0, 1], normalised with the ImageNet mean/std (3-channel) or to
    zero mean / unit spread (other channel counts)."""
    x = np.random.default_rng(seed).random((n, *shape), dtype=np.float32)
    if shape[0] == 3:
        return (x - MEAN[:, None, None]) / STD[:, None, None]
    return (x - 0.5) / 0.25


def bench_model(path: Path, args: argparse.Namespace, tmp: Path) -> dict:
    from int8_cpu import integer_kernels, latency, ort_quantize_static

    from trtrepo.data import ArraySource
    from trtrepo.evaluate import cosine_similarity, make_session
    from trtrepo.modelio import ModelIO
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import run_quantize

    io = ModelIO.from_onnx(str(path))
    if len(io.inputs) != 1 or any(d < 0 for d in io.inputs[0].shape[1:]):
        raise SystemExit(f"{path}: expected one input with fixed C, H, W (got {io.inputs[0]})")
    inp = io.inputs[0]
    shape = tuple(int(d) for d in inp.shape[1:])
    calib = images(args.calib_samples, shape, seed=0)
    t = time.perf_counter()
    ours = tmp / f"{path.stem}.trtrepo.onnx"
    res = run_quantize(path, ours, data=ArraySource("random-images", {inp.name: calib}), method=args.method,
                       options=QuantizeOptions(target="onnxruntime"), batch_size=args.calib_batch, progress=False)
    ours_s = time.perf_counter() - t
    theirs = tmp / f"{path.stem}.ortstatic.onnx"
    theirs_s = ort_quantize_static(path, theirs, calib, "minmax", args.calib_batch, input_name=inp.name)

    x = images(max(args.batches), shape, seed=1)
    ref = make_session(path).run(None, {inp.name: x})[0]
    cos = {k: float(np.mean(cosine_similarity(ref, make_session(p).run(None, {inp.name: x})[0])))
           for k, p in (("trtrepo", ours), ("ort", theirs))}
    models = {"fp32": path, f"trtrepo {res.method}": ours, "ort quantize_static minmax": theirs}
    lat = latency(models, x, tuple(args.batches), args.runs, args.threads, input_name=inp.name)
    return {"model": path.stem, "input": [inp.name, list(shape)], "params_mb": path.stat().st_size / 2**20,
            "quantize_s": {"trtrepo": ours_s, "ort": theirs_s}, "layers_in_float": res.layers_in_float,
            "cosine_random": cos, "latency_ms": lat, "kernels": {k: integer_kernels(p, tmp) for k, p in models.items()}}


def markdown(results: list[dict], args: argparse.Namespace, load: tuple[float, float], wall: float) -> str:
    import onnxruntime

    from trtrepo.cpu import cpu_int8

    onnx_args = " ".join(f"--onnx {r['model']}.onnx" for r in results)
    lines = [SECTION, "",
             f"Command: `python bench/int8_cpu_models.py {onnx_args} --batches {' '.join(map(str, args.batches))} "
             f"--runs {args.runs} --threads {args.threads} --method {args.method} --update-docs` (one run, {wall:.0f} s; "
             "models exported with `.venv-tv/bin/trtrepo export torchvision.models:NAME --input-shape 3x224x224`). "
             f"CPU: {cpu_int8().describe()}. ONNX Runtime {onnxruntime.__version__}, {os.cpu_count()} cores; load "
             f"average {load[0]:.1f} before / {load[1]:.1f} after.", "",
             "Speed only: random weights (torchvision's initialisation) and random normalised images for both "
             f"calibration ({args.calib_samples} images) and timing; the cosine column is a sanity check of the INT8 "
             "graph on those inputs, not an accuracy figure. Median wall time per run, models round-robin; "
             "speedup = FP32 / model.", ""]
    head = "| model | quantized with | " + " | ".join(f"batch {b} ms | speedup" for b in args.batches) + " | cosine vs FP32 (random inputs) |"
    lines += [head, "|---|---|" + "---|---|" * len(args.batches) + "---|"]
    for r in results:
        lat = r["latency_ms"]
        base = lat["fp32"]["median"]
        for k, v in lat.items():
            cells = " | ".join(f"{v['median'][b]:.2f} | {base[b] / v['median'][b]:.2f}x" for b in args.batches)
            cos = "-" if k == "fp32" else f"{r['cosine_random']['trtrepo' if k.startswith('trtrepo') else 'ort']:.4f}"
            lines.append(f"| {r['model']} | {k} | {cells} | {cos} |")
    lines += ["", "Integer kernels in the optimized graphs (ORT_ENABLE_ALL) and convolutions left in float:", ""]
    for r in results:
        for k, kern in r["kernels"].items():
            if k == "fp32":
                continue
            text = ", ".join(f"{op} x{n}" for op, n in kern.items() if n) or "none"
            lines.append(f"- {r['model']}, {k}: {text}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", type=Path, action="append", required=True, help="a CNN's ONNX file (repeatable)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--method", default="minmax", choices=["entropy", "minmax", "percentile", "mse"])
    ap.add_argument("--calib-samples", type=int, default=64)
    ap.add_argument("--calib-batch", type=int, default=8)
    ap.add_argument("--update-docs", action="store_true")
    args = ap.parse_args()
    if args.runs < 30:
        ap.error("--runs must be at least 30")
    started, before = time.time(), os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-") as tmp:
        for path in args.onnx:
            results.append(bench_model(path, args, Path(tmp)))
            print(f"# {path.stem} done", file=sys.stderr)
    md = markdown(results, args, (before, os.getloadavg()[0]), time.time() - started)
    print(md)
    if args.update_docs:
        update_docs(ROOT / "docs" / "benchmarks.md", SECTION, md)


if __name__ == "__main__":
    main()
