"""Serving benchmark (issue 7): the demo INT8 model on the real CPU tritonserver, with the
dynamic-batching config trtrepo generates vs the same model without dynamic batching, at
several concurrency levels; and the harness's own overhead (client latency minus the server's
request time for the same window).

One server serves both models (Python backend running the ONNX Runtime Q/DQ model from
``trtrepo.qdq``); the two configs are measured alternately, level by level, for
``--rounds`` rounds, and the median of the rounds is reported, so that load from other
processes hits both sides alike. Requests are batch 1 over gRPC (``trtrepo.validate``'s
asyncio client), after a warm-up per level.

    python bench/serving.py --concurrency 1 4 16 --requests 400 --rounds 3 [--json out.json]
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


def build_repository(root: Path) -> Path:
    from trtrepo.export import export_onnx
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import QuantizeRequest, quantize_for_deploy
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        sys.exit("no numpy<2 environment for the Python backend: run scripts/install_tritonserver.sh")
    fp32 = export_onnx("demo", root / "demo.onnx").path
    int8 = quantize_for_deploy(QuantizeRequest.of(fp32, root / "demo_int8.onnx", data="demo:calib", method="entropy",
                                               options=QuantizeOptions(target="onnxruntime"),
                                               accept_accuracy_loss=True)).path
    repo = root / "repo"
    add_onnx_model(repo, "int8_batching", int8, backend="python", options=ModelOptions(execution_env=str(env)))
    add_onnx_model(repo, "int8_no_batching", int8, backend="python",
                   options=ModelOptions(execution_env=str(env), dynamic_batching=False))
    return repo


def measure(url: str, model: str, io, payloads: list, concurrency: int, requests: int, warmup: int) -> dict:
    from trtrepo.validate import TritonTarget, ValidateOptions, run_latency

    opts = ValidateOptions(model=model, url=url, protocol="grpc", concurrency=(concurrency,), requests=requests,
                           warmup=warmup, batch_size=1, progress=False)
    with TritonTarget(opts) as target:
        target.wait_ready()
        meta = target.metadata()
        target.prepare(io)  # the served models run the exported ONNX: its IO
        return run_latency(target, payloads, opts, target.resolve_version(meta))["levels"][0]


def _ms(v: float | None) -> str:
    """A figure in ms, or "-" where validate withheld it (the client and server counts differed)."""
    return "-" if v is None else f"{v:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO
    from trtrepo.server import TritonServer
    from trtrepo.validate import make_payloads

    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-serving-") as tmp:
        repo = build_repository(Path(tmp))
        io = ModelIO.from_onnx(Path(tmp) / "demo.onnx")
        payloads, _ = make_payloads(open_data("demo:val", io=io), io, 1)
        models = ("int8_batching", "int8_no_batching")
        runs: dict[tuple[str, int], list[dict]] = {}
        load0 = os.getloadavg()
        t0 = time.time()
        with TritonServer(repo, timeout=120) as server:
            for r in range(args.rounds):
                for c in args.concurrency:
                    for model in (models if r % 2 == 0 else models[::-1]):
                        lv = measure(server.grpc_url, model, io, payloads, c, args.requests, args.warmup)
                        runs.setdefault((model, c), []).append(lv)
                        print(f"round {r + 1} c={c} {model}: {lv['throughput']:.0f} infer/s, p99 {lv['client_ms']['p99']:.2f} ms, "
                              f"overhead {_ms(lv['overhead_ms'])} ms", file=sys.stderr)
        load1 = os.getloadavg()

    def med(model: str, c: int, key) -> float | None:
        values = [v for v in (key(lv) for lv in runs[(model, c)]) if v is not None]  # a withheld overhead is None
        return statistics.median(values) if values else None

    rows = []
    for c in args.concurrency:
        row = {"concurrency": c}
        for model in models:
            row[model] = {
                "throughput": med(model, c, lambda lv: lv["throughput"]),
                "p99_ms": med(model, c, lambda lv: lv["client_ms"]["p99"]),
                "p50_ms": med(model, c, lambda lv: lv["client_ms"]["p50"]),
                "client_mean_ms": med(model, c, lambda lv: lv["client_ms"]["mean"]),
                "server_request_ms": med(model, c, lambda lv: lv["server"]["request_ms"]),
                "overhead_ms": med(model, c, lambda lv: lv["overhead_ms"]),
                "avg_batch": med(model, c, lambda lv: lv["server"]["avg_batch"] or 0.0),
            }
        row["throughput_ratio"] = row[models[0]]["throughput"] / row[models[1]]["throughput"]
        row["p99_ratio"] = row[models[0]]["p99_ms"] / row[models[1]]["p99_ms"]
        rows.append(row)

    print(f"\nDemo INT8 (ORT Q/DQ, Python backend), batch-1 gRPC requests, {args.requests} per level after "
          f"{args.warmup} warm-up, median of {args.rounds} alternating rounds; {time.time() - t0:.0f} s; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; {os.cpu_count()} CPUs.\n")
    print("| concurrency | batching infer/s | no batching infer/s | throughput ratio | batching p99 ms | "
          "no batching p99 ms | p99 ratio | avg server batch | overhead ms (batching) | overhead ms (no batching) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        a, b = row[models[0]], row[models[1]]
        print(f"| {row['concurrency']} | {a['throughput']:.0f} | {b['throughput']:.0f} | {row['throughput_ratio']:.2f}x | "
              f"{a['p99_ms']:.2f} | {b['p99_ms']:.2f} | {row['p99_ratio']:.2f}x | {a['avg_batch']:.2f} | "
              f"{_ms(a['overhead_ms'])} of {a['client_mean_ms']:.2f} | {_ms(b['overhead_ms'])} of {b['client_mean_ms']:.2f} |")
    if args.json:
        from trtrepo.fsutil import atomic_write_text

        atomic_write_text(args.json, json.dumps({"rows": rows, "load_average": [load0, load1]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
