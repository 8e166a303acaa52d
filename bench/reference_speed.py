"""PyTorch vs served (issue 8): ``trtrepo validate``'s speed-against-the-reference comparison on
the real CPU tritonserver, for the demo CNN and demo-text, FP32 and INT8 served models, at
batch 1, 8 and 32.

Each served model is the ONNX model under the Python backend (ONNX Runtime, 1 intra-op thread,
as ``trtrepo.repository`` generates it); INT8 is the ONNX Runtime Q/DQ model from
``trtrepo.quantize.quantize_for_deploy`` (minmax on ``demo:calib`` / ``demo-text:calib``). The
measurement is :func:`trtrepo.validate.validate` with :class:`trtrepo.validate.speed.SpeedOptions`:
per batch size, concurrency 1, the served model then the PyTorch FP32 reference on the same
batches of one input shape. Every model is measured ``--rounds`` times, the models in turn
(order reversed every round); each cell is the median over rounds of the per-round median/p99.

    python bench/reference_speed.py --iterations 100 --rounds 3 --threads 1 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODELS = {  # name on the server -> (reference, data, precision)
    "demo_fp32": ("demo", "demo", "FP32"),
    "demo_int8": ("demo", "demo", "INT8"),
    "demo_text_fp32": ("demo-text", "demo-text", "FP32"),
    "demo_text_int8": ("demo-text", "demo-text", "INT8"),
}


def build_repository(root: Path, names: list[str]) -> dict[str, Path]:
    from trtrepo.export import export_onnx
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import QuantizeRequest, quantize_for_deploy
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        sys.exit("no numpy<2 environment for the Python backend: run scripts/install_tritonserver.sh")
    fp32 = {"demo": export_onnx("demo", root / "demo.onnx").path,
            "demo-text": export_onnx("demo-text", root / "demo_text.onnx").path}
    onnx: dict[str, Path] = {}
    for name in names:
        ref, data, precision = MODELS[name]
        path = fp32[ref]
        if precision == "INT8":
            path = quantize_for_deploy(QuantizeRequest.of(fp32[ref], root / f"{name}.onnx", data=f"{data}:calib", method="minmax",
                                                       options=QuantizeOptions(target="onnxruntime"),
                                               accept_accuracy_loss=True)).path
        add_onnx_model(root / "repo", name, path, backend="python", options=ModelOptions(execution_env=str(env)))
        onnx[name] = Path(fp32[ref])
    return onnx


def run_one(url: str, name: str, onnx: Path, args: argparse.Namespace) -> dict:
    from trtrepo.data import DataOptions
    from trtrepo.validate import ReferenceSource, ValidateOptions, validate
    from trtrepo.validate.speed import SpeedOptions

    ref, data, _ = MODELS[name]
    opts = ValidateOptions(model=name, url=url, protocol="grpc", concurrency=(1,), requests=20, warmup=5, progress=False,
                           batch_size=8, speed=SpeedOptions(batch_sizes=tuple(args.batch_sizes), iterations=args.iterations,
                                                            warmup=args.warmup, device=args.device, threads=args.threads),
                           time_budget=None)  # every timing to the end, as before the budget (issue 41)
    report = validate(opts, reference=ReferenceSource(ref, onnx=onnx), data=DataOptions(f"{data}:val"))
    return report.speed_vs_reference


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the reference (the server's ORT uses 1)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from trtrepo.server import TritonServer

    runs: dict[str, list[dict]] = {}
    load0 = os.getloadavg()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-refspeed-") as tmp:
        onnx = build_repository(Path(tmp), args.models)
        with TritonServer(Path(tmp) / "repo", timeout=180) as server:
            for r in range(args.rounds):
                for name in (args.models if r % 2 == 0 else args.models[::-1]):
                    sp = run_one(server.grpc_url, name, onnx[name], args)
                    runs.setdefault(name, []).append(sp)
                    print(f"round {r + 1} {name}: " + ", ".join(
                        f"b{row['batch_size']} {row['reference']['median_ms']:.2f}/{row['served']['median_ms']:.2f} ms"
                        for row in sp["rows"]), file=sys.stderr)
    load1 = os.getloadavg()

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    table = []
    for name in args.models:
        sps = runs[name]
        first = sps[0]
        for i, row in enumerate(first["rows"]):
            rows = [sp["rows"][i] for sp in sps]
            cell = {"model": name, "batch_size": row["batch_size"]}
            for side in ("reference", "served"):
                for key in ("median_ms", "p99_ms", "throughput"):
                    cell[f"{side}_{key}"] = med(r[side][key] for r in rows)
            cell["speedup_median"] = cell["reference_median_ms"] / cell["served_median_ms"]
            cell["speedup_p99"] = cell["reference_p99_ms"] / cell["served_p99_ms"]
            kept = first["accuracy_kept"]
            lo = kept["label_output"]
            cell["top1_agreement"] = kept["outputs"][lo]["top1_agreement"]
            cell["cosine_mean"] = min(m["cosine_mean"] for m in kept["outputs"].values())
            cell["input_shapes"] = first["input_shapes"]
            cell["threads"] = first["reference"]["threads"]
            cell["device"] = first["reference"]["device"]
            table.append(cell)

    print(f"\n{args.iterations} timed calls after {args.warmup} warm-up per batch size and side, median of {args.rounds} "
          f"rounds; reference on {table[0]['device']}, torch threads {table[0]['threads']}; {time.time() - t0:.0f} s; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; {os.cpu_count()} CPUs.\n")
    print("| served model | inputs | batch | PyTorch FP32 median ms | PyTorch p99 ms | served median ms | served p99 ms | "
          "speedup (median) | speedup (p99) | served infer/s | top-1 agreement | cosine (min over outputs) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in table:
        shapes = ", ".join(f"{k} {v}" for k, v in c["input_shapes"].items())
        print(f"| {c['model']} | {shapes} | {c['batch_size']} | {c['reference_median_ms']:.2f} | {c['reference_p99_ms']:.2f} | "
              f"{c['served_median_ms']:.2f} | {c['served_p99_ms']:.2f} | {c['speedup_median']:.2f}x | {c['speedup_p99']:.2f}x | "
              f"{c['served_throughput']:.0f} | {100 * c['top1_agreement']:.2f}% | {c['cosine_mean']:.5f} |")
    if args.json:
        from trtrepo.fsutil import atomic_write_text

        atomic_write_text(args.json, json.dumps({"table": table, "runs": runs, "load_average": [load0, load1]}, indent=2,
                                                default=str) + "\n")


if __name__ == "__main__":
    main()
