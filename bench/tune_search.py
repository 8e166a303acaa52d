"""Issue 17 item 1: ``trtrepo tune``'s quick search against the exhaustive grid, and the generated
default config against the tuned one, side by side in one run.

Per model (the demo CNN, demo-text, and the trained sentence encoder all-mpnet-base-v2 from the
gauntlet cache when it is there; each an FP32 ONNX file in the Python backend as ``deploy``
writes it on this machine):

1. ``tune`` quick (coordinate descent + confirmation round), then ``tune --exhaustive`` (the whole
   grid + confirmation round), each on its own explicit-mode server; their wall times.
2. Head to head on one explicit-mode server: the default config, the quick search's choice and the
   grid's choice, loaded in turn through the model-control API and measured ``--rounds`` times
   in rotating order; medians. That is the comparison the acceptance asks for (the searches' own
   figures are single measurements taken minutes apart on a machine whose speed drifts).

    TRTREPO_GAUNTLET_CACHE=/work/gauntlet-cache python bench/tune_search.py --rounds 3 [--update-docs docs/benchmarks.md]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_name, publish  # noqa: E402


def models(root: Path, which: list[str]) -> dict[str, tuple[Path, str]]:
    """label -> (FP32 ONNX file, data spec of batch-1 requests)."""
    import numpy as np

    from trtrepo.data import collect, open_data
    from trtrepo.export import export_onnx
    from trtrepo.modelio import ModelIO

    out = {}
    if "demo" in which:
        demo = export_onnx("demo", root / "demo.onnx").path
        np.savez(root / "demo.npz", **collect(open_data("demo:val", io=ModelIO.from_onnx(demo), limit=64)))
        out["demo CNN"] = (demo, str(root / "demo.npz"))
    if "demo-text" in which:
        text = export_onnx("demo-text", root / "demo_text.onnx").path
        out["demo-text"] = (text, "demo-text:val")
    if "mpnet" in which:
        from _common import mpnet_batch

        mpnet = mpnet_batch(root / "mpnet.npz")
        if mpnet is not None:
            out["all-mpnet-base-v2 (seq 32)"] = (mpnet, str(root / "mpnet.npz"))
    return out


def head_to_head(repo: Path, name: str, data: str, configs: dict[str, object], args: argparse.Namespace) -> dict:
    """Each config loaded in turn on one explicit-mode server, ``args.rounds`` rounds in rotating
    order; per config the median throughput and p99 of the rounds."""
    from trtrepo.data import DataOptions
    from trtrepo.repository import read_config
    from trtrepo.server import TritonServer
    from trtrepo.tune import CandidateRunner, TuneOptions

    opts = TuneOptions(model=name, concurrency=args.concurrency, interval_s=args.interval, max_trials=args.max_trials)
    rows: dict[str, list[dict]] = {k: [] for k in configs}
    extra = ("--model-control-mode=explicit", f"--load-model={name}")
    with TritonServer(repo, extra_args=extra, timeout=300) as server:
        runner = CandidateRunner(server.grpc_url, opts, read_config(repo / name), data=DataOptions(spec=data))
        try:
            keys = list(configs)
            for r in range(args.rounds):
                order = keys[r % len(keys):] + keys[:r % len(keys)]
                for k in order:
                    res = runner.measure(configs[k])  # type: ignore[arg-type]
                    rows[k].append(res)
                    print(f"  h2h round {r + 1} {k}: {res.get('throughput') or 0:.1f} infer/s, p99 "
                          f"{res.get('p99_ms') or 0:.2f} ms", file=sys.stderr)
        finally:
            runner.close()
    return {k: {"throughput": statistics.median(x["throughput"] for x in v if x.get("throughput")),
                "p99_ms": statistics.median(x["p99_ms"] for x in v if x.get("throughput")),
                "all": [x.get("throughput") for x in v]} for k, v in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["demo", "demo-text", "mpnet"])
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--max-trials", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args()

    from trtrepo.cpu import available_cores
    from trtrepo.data import DataOptions
    from trtrepo.repository import add_onnx_model
    from trtrepo.tritonconfig import ModelOptions
    from trtrepo.tune import Candidate, TuneOptions, tune

    cores = available_cores()
    t_all = time.time()
    load0 = os.getloadavg()
    out = []
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-tune-") as tmp:
        root = Path(tmp)
        for i, (label, (onnx_path, data)) in enumerate(models(root, args.models).items()):
            repo = root / f"repo-{i}"
            add_onnx_model(repo, "m", onnx_path, backend="python", options=ModelOptions())
            runs = {}
            for mode in ("quick", "exhaustive"):
                opts = TuneOptions(model="m", concurrency=args.concurrency, exhaustive=mode == "exhaustive",
                                   budget_s=3600, interval_s=args.interval, max_trials=args.max_trials)
                print(f"{label}: tune {mode}", file=sys.stderr)
                runs[mode] = tune(repo, opts, data=DataOptions(spec=data), say=lambda s: print(s, file=sys.stderr))
            quick, grid = runs["quick"], runs["exhaustive"]
            # distinct configs only (a search that keeps the default measures the same config); the default
            # twice, as an A/A pair: how far two measurements of one config fall apart on this machine
            configs: dict[str, Candidate] = {"default": quick.start, "default (again)": quick.start}
            for key, c in (("quick", quick.chosen), ("grid", grid.chosen)):
                if c not in configs.values():
                    configs[key] = c
            h2h = head_to_head(repo, "m", data, configs, args)
            for key, c in (("quick", quick.chosen), ("grid", grid.chosen)):
                if key not in h2h:
                    same = next(k for k, v in configs.items() if v == c)
                    h2h[key] = {**h2h[same], "same_as": same}
            row = {"model": label, "default": quick.start.label(), "quick_choice": quick.chosen.label(),
                   "grid_choice": grid.chosen.label(), "quick_s": quick.seconds, "grid_s": grid.seconds,
                   "quick_measurements": len(quick.results), "grid_measurements": len(grid.results),
                   "grid_candidates": grid.to_dict()["candidates_measured"], "h2h": h2h}
            out.append(row)
            print(json.dumps(row, default=str), file=sys.stderr)
    load1 = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    lines = [f"Command: `TRTREPO_GAUNTLET_CACHE=... python bench/tune_search.py --rounds {args.rounds} --concurrency "
             f"{args.concurrency}`. CPU: {cpu_name()}, {cores} cores; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; "
             f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; {time.time() - t_all:.0f} s in all.", "",
             f"FP32 ONNX in the Python backend as `deploy` writes it here (the default), concurrency {args.concurrency}, "
             f"batch-1 gRPC requests, objective throughput. Quick = coordinate descent + confirmation round; grid = every "
             f"candidate + confirmation round. Head to head: the distinct configs among default, quick choice and grid "
             f"choice, plus the default a second time (A/A: the machine's own noise), loaded in turn on one server, "
             f"{args.rounds} rounds in rotating order, medians (infer/s; p99 ms). A choice equal to the default (or to "
             f"the other choice) is reported with that config's figures.", "",
             "| model | default config | quick choice | grid choice | quick time | grid time (candidates) | time ratio | "
             "default | default again (A/A) | quick | grid | quick / grid | default / quick |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in out:
        h = r["h2h"]
        lines.append(f"| {r['model']} | {r['default']} | {r['quick_choice']} | {r['grid_choice']} | {r['quick_s']:.0f} s | "
                     f"{r['grid_s']:.0f} s ({r['grid_candidates']}) | {r['quick_s'] / r['grid_s']:.2f} | "
                     f"{h['default']['throughput']:.1f} ({h['default']['p99_ms']:.1f}) | "
                     f"{h['default (again)']['throughput']:.1f} ({h['default (again)']['p99_ms']:.1f}) | "
                     f"{h['quick']['throughput']:.1f} ({h['quick']['p99_ms']:.1f}) | "
                     f"{h['grid']['throughput']:.1f} ({h['grid']['p99_ms']:.1f}) | "
                     f"{h['quick']['throughput'] / h['grid']['throughput']:.2f} | "
                     f"{h['default']['throughput'] / h['quick']['throughput']:.2f} |")
    heading = "## Issue 17: `trtrepo tune` quick search vs exhaustive grid, default config vs tuned"
    publish(heading + "\n\n" + "\n".join(lines) + "\n", heading, args.update_docs)


if __name__ == "__main__":
    main()
