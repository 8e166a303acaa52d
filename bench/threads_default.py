"""Issue 17 item 2: the Python-backend config's ONNX Runtime intra-op threads, the old default (1)
against the new one (the cores available divided by the instances), side by side in one server.

Per model, both configs serve the same FP32 ONNX file from one tritonserver; they are measured
alternately, level by level, for ``--rounds`` rounds (the order flips every round), and the
median of the rounds is reported. Models: the demo CNN, and the trained sentence encoder
all-mpnet-base-v2 from the gauntlet cache (sequence length 32) when it is there.

    TRTREPO_GAUNTLET_CACHE=/work/gauntlet-cache python bench/threads_default.py --rounds 3 [--update-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_name, publish  # noqa: E402
from serving import measure  # noqa: E402


def models(root: Path) -> dict[str, tuple[Path, Path]]:
    """name -> (FP32 ONNX file, npz of batch-1 request samples)."""
    import numpy as np

    from trtrepo.data import collect, open_data
    from trtrepo.export import export_onnx
    from trtrepo.modelio import ModelIO

    out = {}
    demo = export_onnx("demo", root / "demo.onnx").path
    np.savez(root / "demo.npz", **collect(open_data("demo:val", io=ModelIO.from_onnx(demo), limit=64)))
    out["demo CNN"] = (demo, root / "demo.npz")
    from _common import mpnet_batch

    mpnet = mpnet_batch(root / "mpnet.npz")
    if mpnet is not None:
        out["all-mpnet-base-v2 (seq 32)"] = (mpnet, root / "mpnet.npz")
    return out


def _median(levels: list[dict], key: str) -> float:
    return float(statistics.median(lv["throughput"] if key == "thr" else lv["client_ms"][key] for lv in levels))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args()

    from trtrepo.contracts.backends import machine_threads
    from trtrepo.cpu import available_cores
    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import TritonServer
    from trtrepo.tritonconfig import ModelOptions
    from trtrepo.validate import make_payloads

    cores = available_cores()
    new = machine_threads(1, cores)
    rows = []
    t0 = time.time()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-threads-") as tmp:
        root = Path(tmp)
        for label, (onnx_path, data) in models(root).items():
            repo = root / f"repo-{len(rows)}"
            names = ("threads_1", "threads_machine")
            add_onnx_model(repo, names[0], onnx_path, backend="python", options=ModelOptions(intra_op_threads=1))
            add_onnx_model(repo, names[1], onnx_path, backend="python", options=ModelOptions())
            io = ModelIO.from_onnx(onnx_path)
            payloads, _ = make_payloads(open_data(str(data), io=io), io, 1)
            runs: dict[tuple[str, int], list[dict]] = {}
            with TritonServer(repo, timeout=300) as server:
                for r in range(args.rounds):
                    for c in args.concurrency:
                        for name in (names if r % 2 == 0 else names[::-1]):
                            lv = measure(server.grpc_url, name, io, payloads, c, args.requests, args.warmup)
                            runs.setdefault((name, c), []).append(lv)
                            print(f"{label} round {r + 1} c={c} {name}: {lv['throughput']:.1f} infer/s, "
                                  f"p50 {lv['client_ms']['p50']:.2f} ms", file=sys.stderr)
            for c in args.concurrency:
                old, new_ = runs[(names[0], c)], runs[(names[1], c)]
                rows.append({"model": label, "concurrency": c, "old_thr": _median(old, "thr"),
                             "new_thr": _median(new_, "thr"), "old_p50": _median(old, "p50"),
                             "new_p50": _median(new_, "p50")})
    load1 = os.getloadavg()
    lines = [f"Command: `TRTREPO_GAUNTLET_CACHE=... python bench/threads_default.py --rounds {args.rounds} --requests "
             f"{args.requests}`. CPU: {cpu_name()}, {cores} cores available; "
             f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load average {load0[0]:.1f} before, "
             f"{load1[0]:.1f} after; {time.time() - t0:.0f} s.", "",
             f"FP32 ONNX in the Python backend (one instance, dynamic batching, batch-1 gRPC requests), intra-op "
             f"threads 1 (the old default) vs {new} (the new default: cores / instances), one server, alternating "
             f"rounds, median of {args.rounds}.", "",
             "| model | concurrency | threads 1 infer/s | threads default infer/s | throughput ratio | threads 1 p50 ms | "
             "threads default p50 ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['concurrency']} | {r['old_thr']:.1f} | {r['new_thr']:.1f} | "
                     f"{r['new_thr'] / r['old_thr']:.2f}x | {r['old_p50']:.2f} | {r['new_p50']:.2f} |")
    heading = "## Issue 17: ONNX Runtime threads of the Python-backend config (old default vs machine default)"
    publish(heading + "\n\n" + "\n".join(lines) + "\n", heading, args.update_docs)


if __name__ == "__main__":
    main()
