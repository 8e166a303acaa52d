"""Issue 17 item 3: are validate's latency figures trustworthy? Run to run, and against an
independent client on the same server.

One tritonserver serves the model (FP32 ONNX in the Python backend, the generated default config).
For ``--rounds`` rounds, each concurrency level is measured by validate's load generator (windows
until stable, the default 2 s) and right after by the plainly written synchronous client of
``tests/test_validate.py`` (threads of ``tritonclient.grpc`` clients; above 4 in flight spread
over 4 processes), ``--plain-seconds`` each. Recorded with every measurement: the hypervisor's
steal share and the machine's busy share over it (``/proc/stat``).

Reported per model and level: validate's throughput in each round, its spread over the first three
rounds (max/min - 1), the independent client's, the median ratio validate / independent, and the
mean steal share. Before each level a probe of the machine's own speed: the same ONNX file run
in this process by ONNX Runtime (one thread, batch 1, no server, no client) for ``--probe-seconds``;
its spread over the rounds tells a machine that drifts from a serving stack that does.

    TRTREPO_GAUNTLET_CACHE=/work/gauntlet-cache python bench/measurement.py --rounds 5 [--update-docs docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _common import cpu_name, publish, served_fp32  # noqa: E402


def models(root: Path, which: list[str]) -> dict[str, tuple[Path, str]]:
    """label -> (FP32 ONNX file, data spec of batch-1 requests): the demo CNN, all-mpnet-base-v2 at 32 tokens."""
    import numpy as np

    from trtrepo.data import collect, open_data
    from trtrepo.export import export_onnx
    from trtrepo.modelio import ModelIO

    out = {}
    if "demo" in which:
        demo = export_onnx("demo", root / "demo.onnx").path
        np.savez(root / "demo.npz", **collect(open_data("demo:val", io=ModelIO.from_onnx(demo), limit=64)))
        out["demo CNN"] = (demo, str(root / "demo.npz"))
    if "mpnet" in which:
        sys.path.insert(0, str(HERE / "gauntlet"))
        import text  # bench/gauntlet/text.py

        enc = text.tokenizer()(text.split("eval", 32), truncation=True, max_length=32, padding="max_length", return_tensors="np")
        np.savez(root / "mpnet.npz", **{k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")})
        out["all-mpnet-base-v2 (seq 32)"] = (text.export_onnx(text.CACHE / "mpnet" / "model.onnx"), str(root / "mpnet.npz"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--plain-seconds", type=float, default=4.0)
    ap.add_argument("--models", nargs="+", default=["demo", "mpnet"])
    ap.add_argument("--probe-seconds", type=float, default=1.0)
    ap.add_argument("--interval", type=float, nargs="+", default=[2.0],
                    help="validate's window(s), seconds (its default 2); several are measured in turn each round")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--update-docs", type=Path, default=None)
    args = ap.parse_args()

    from test_validate import _plain_client_loop  # the independent client, as the test writes it

    from trtrepo.cpu import available_cores
    from trtrepo.measure import cpu_sample, machine_usage

    t_all = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtrepo-bench-measure-") as tmp:
        root = Path(tmp)
        for label, (onnx_path, data) in models(root, args.models).items():
            if "demo-text" in label:
                continue
            probes: dict[int, list[float]] = {c: [] for c in args.concurrency}
            ours: dict[tuple[float, int], list[dict]] = {(w, c): [] for w in args.interval for c in args.concurrency}
            plain: dict[int, list[dict]] = {c: [] for c in args.concurrency}
            with served_fp32(root / f"repo-{len(rows)}", onnx_path, data) as served:
                server, io, payloads = served.server, served.io, served.payloads
                probe = _probe(onnx_path, payloads[0].inputs, args.probe_seconds)
                for r in range(args.rounds):
                    for c in args.concurrency:
                        probes[c].append(probe())
                        for w in args.interval[r % len(args.interval):] + args.interval[:r % len(args.interval)]:
                            lv = served.level(c, w)  # records the machine's usage
                            steal = lv["machine"]["steal_share"] or 0.0
                            ours[(w, c)].append({"throughput": lv["throughput"], "p50": lv["client_ms"]["p50"],
                                                 "stable": lv["stable"], "windows": len(lv["windows"]), "steal": steal,
                                                 "busy": lv["machine"]["busy_share"]})
                            print(f"{label} round {r + 1} c={c} {w:g} s windows: validate {lv['throughput']:.1f} "
                                  f"infer/s ({len(lv['windows'])} windows, stable {lv['stable']}); steal "
                                  f"{100 * steal:.0f}%", file=sys.stderr)
                        s0 = cpu_sample()
                        thr = _plain_client_loop(server.grpc_url, payloads, c, args.plain_seconds, "demo",
                                                 io.output_names[0])
                        usage = machine_usage(s0, cpu_sample(), available_cores())
                        steal2 = usage["steal_share"] or 0.0
                        plain[c].append({"throughput": thr, "steal": steal2, "busy": usage["busy_share"]})
                        print(f"{label} round {r + 1} c={c}: independent {thr:.1f} infer/s; steal "
                              f"{100 * steal2:.0f}%; probe {probes[c][-1]:.0f} runs/s", file=sys.stderr)
            for w, c in ours:
                a = [x["throughput"] for x in ours[(w, c)]]
                b = [x["throughput"] for x in plain[c]]
                pr = probes[c]
                rows.append({"model": label, "window_s": w, "concurrency": c, "validate": a, "independent": b, "probe": pr,
                             "spread3_probe": max(pr[:3]) / min(pr[:3]) - 1, "spread_probe": max(pr) / min(pr) - 1,
                             "spread3_validate": max(a[:3]) / min(a[:3]) - 1, "spread3_independent": max(b[:3]) / min(b[:3]) - 1,
                             "spread_validate": max(a) / min(a) - 1, "spread_independent": max(b) / min(b) - 1,
                             "ratio_median": statistics.median(x / y for x, y in zip(a, b, strict=True)),
                             "steal_mean": statistics.mean([x["steal"] for x in ours[(w, c)] + plain[c]]),
                             "stable_share": sum(x["stable"] for x in ours[(w, c)]) / len(ours[(w, c)])})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    cmd = " ".join([f"--rounds {args.rounds}", *_changed(ap, args, "interval", "plain_seconds", "models")])
    lines = [f"Command: `TRTREPO_GAUNTLET_CACHE=... python bench/measurement.py {cmd}`. CPU: {cpu_name()}, "
             f"{available_cores()} cores; {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; {time.time() - t_all:.0f} s.", "",
             "One server, FP32 ONNX in the Python backend (default config), batch-1 gRPC requests. Each round: validate's "
             "level (windows of the row's length until three agree within 10%; with several lengths, each in turn, in "
             "rotating order), then the independent synchronous client of the test "
             f"({args.plain_seconds:g} s, second half counted). Spread = max/min - 1; steal = the hypervisor's share of the "
             "CPU time during the measurements; probe = the same ONNX file run in the bench's own process by ONNX Runtime "
             f"(1 thread, batch 1, no server) for {args.probe_seconds:g} s before each level, its spread over all rounds.", "",
             "| model | window | c | validate infer/s per round | spread, first 3 | spread, all | independent infer/s per round | "
             "its spread, first 3 | median ratio validate / independent | steal | stable levels | probe runs/s per round | "
             "probe spread |",
             "|---|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['window_s']:g} s | {r['concurrency']} | {', '.join(f'{x:.0f}' for x in r['validate'])} | "
                     f"{100 * r['spread3_validate']:.0f}% | {100 * r['spread_validate']:.0f}% | "
                     f"{', '.join(f'{x:.0f}' for x in r['independent'])} | {100 * r['spread3_independent']:.0f}% | "
                     f"{r['ratio_median']:.2f} | {100 * r['steal_mean']:.0f}% | {100 * r['stable_share']:.0f}% | "
                     f"{', '.join(f'{x:.0f}' for x in r['probe'])} | {100 * r['spread_probe']:.0f}% |")
    heading = "## Issue 17: validate's figures run to run and against an independent client"
    publish(heading + "\n\n" + "\n".join(lines) + "\n", heading, args.update_docs)


def _changed(ap: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> list[str]:
    """The named options as given on the command line, those left at their defaults omitted."""
    out = []
    for name in names:
        value = getattr(args, name)
        if value != ap.get_default(name):
            values = value if isinstance(value, list) else [value]
            out.append(f"--{name.replace('_', '-')} " + " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values))
    return out


def _probe(onnx_path: Path, feed: dict, seconds: float):
    """A function timing ``onnx_path`` run in this process (ONNX Runtime, one thread, no
    spinning) on ``feed`` for ``seconds``: runs per second, the machine's own speed."""
    from trtrepo.evaluate import make_session

    sess = make_session(onnx_path, threads=1)
    feed = dict(feed)
    sess.run(None, feed)

    def run() -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sess.run(None, feed)
            n += 1
        return n / (time.perf_counter() - t0)

    return run


if __name__ == "__main__":
    main()
