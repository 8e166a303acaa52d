"""Issue 41 item 6's acceptance run: what ``trtrepo deploy`` of the trained MobileNetV2 shows on
stderr during its INT8 step, line by line with the time each line came.

One run: ``trtrepo -v deploy model.onnx --data calib256.npz --repo TMP/repo --backend python
--name mnv2 --workdir TMP/work --json`` with the first 256 crops of ``calib.npz`` (the crops of
``bench/deploy_seeds.py``'s seed-free case). ``-v`` shows the status lines off a terminal, as a
terminal shows them without it; it also shows INFO logs, which a terminal user does not see: they
are counted apart and left out of the gaps. Figures: the longest stretch without a status or
warning line inside the INT8 step (from ``[2/4] int8 ...`` to its end line), the progress lines
and the most of them in any one second, the lines per warning text (each ``WARNING`` line's text
is its cause) and the ``--json`` ``warnings`` by cause. Written as JSON and Markdown.

    python bench/int8_progress.py [--cache /work/gauntlet-cache/mobilenet_v2] [--out-dir DIR] [--extra "..."]
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROGRESS = re.compile(r"^  int8 \[(\d+\.\d) s\] (.*)$")
STEP = re.compile(r"^\[2/\d\] int8 ")


def run_timed(cmd: list[str]) -> tuple[int, str, list[tuple[float, str]]]:
    """(exit code, stdout, [(seconds since start, stderr line)])."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, bufsize=1)
    lines: list[tuple[float, str]] = []
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""))
    reader.start()
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append((time.monotonic() - t0, line.rstrip("\n")))
    reader.join()
    return proc.wait(), "".join(out), lines


def analyse(lines: list[tuple[float, str]]) -> dict:
    """The figures of the module doc from the timed stderr lines."""
    seen = [(t, s) for t, s in lines if not s.startswith("INFO ")]  # what a terminal shows (status, warnings)
    step = [i for i, (_, s) in enumerate(seen) if STEP.match(s)]
    inside = seen[step[0]:step[-1] + 1] if len(step) >= 2 else seen
    gaps = [b[0] - a[0] for a, b in zip(inside, inside[1:], strict=False)]
    worst = max(range(len(gaps)), key=gaps.__getitem__) if gaps else None
    progress = [t for t, s in seen if PROGRESS.match(s)]
    per_second = max((sum(1 for u in progress if t <= u < t + 1.0) for t in progress), default=0)
    warned = Counter(s.split(": ", 1)[-1] for _, s in lines if s.startswith("WARNING "))
    return {
        "int8_step_s": inside[-1][0] - inside[0][0] if inside else None,
        "max_gap_s": gaps[worst] if worst is not None else None,
        "max_gap_after": inside[worst][1] if worst is not None else None,
        "progress_lines": len(progress), "max_progress_lines_in_1s": per_second,
        "phases": sorted({PROGRESS.match(s).group(2).split(":")[0] for _, s in seen if PROGRESS.match(s)}),  # type: ignore[union-attr]
        "stderr_lines": len(lines), "info_lines": len(lines) - len(seen),
        "warning_lines": sum(warned.values()), "warning_lines_per_text": dict(warned),
        "max_lines_per_warning_text": max(warned.values(), default=0),
    }


def markdown(meta: dict, fig: dict, json_warnings: list) -> str:
    rows = "\n".join(f"| {n} | {t[:120]} |" for t, n in fig["warning_lines_per_text"].items()) or "| - | (none) |"
    causes = "\n".join(f"| {w.get('cause')} | {json.dumps(w.get('counts'))} | {str(w.get('message'))[:100]} |"
                       for w in json_warnings) or "| - | - | (none) |"
    return f"""# deploy of the trained MobileNetV2: progress during the INT8 step

{meta['cpu']}, {meta['date']}, load average before the run {meta['load_before']}; exit {meta['exit']}, wall {meta['wall_s']:.1f} s.
Command: `{meta['command']}`

| figure | value |
|---|---|
| INT8 step (from its first to its last line) | {fig['int8_step_s']:.1f} s |
| longest stretch without a status or warning line in it | {fig['max_gap_s']:.1f} s (after: `{fig['max_gap_after']}`) |
| progress lines / most in one second | {fig['progress_lines']} / {fig['max_progress_lines_in_1s']} |
| warning lines / most lines for one text | {fig['warning_lines']} / {fig['max_lines_per_warning_text']} |
| stderr lines (of which INFO, shown by -v only) | {fig['stderr_lines']} ({fig['info_lines']}) |

Phases shown: {', '.join(fig['phases'])}

Warning lines per text:

| lines | text |
|---|---|
{rows}

`--json` `warnings`:

| cause | counts | message |
|---|---|---|
{causes}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/mobilenet_v2"))
    ap.add_argument("--out-dir", type=Path, default=Path("int8-progress"))
    ap.add_argument("--extra", default="")
    args = ap.parse_args()
    from _common import cpu_name

    calib = np.load(args.cache / "calib.npz")["input"][:256]
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "calib256.npz"
        np.savez(data, input=calib)
        cmd = [sys.executable, "-m", "trtrepo.cli", "-v", "deploy", str(args.cache / "model.onnx"), "--data", str(data),
               "--repo", f"{tmp}/repo", "--backend", "python", "--name", "mnv2", "--workdir", f"{tmp}/work", "--json",
               *shlex.split(args.extra)]
        t0 = time.perf_counter()
        code, stdout, lines = run_timed(cmd)
        wall = time.perf_counter() - t0
    try:
        summary = json.loads(stdout[stdout.index("{"):])
    except ValueError:
        summary = {}
    fig = analyse(lines)
    meta = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "exit": code,
            "wall_s": wall, "load_before": load_before, "precision": summary.get("precision"),
            "command": "trtrepo -v deploy model.onnx --data calib256.npz --repo TMP/repo --backend python --name mnv2 "
                       "--workdir TMP/work --json" + (f" {args.extra}" if args.extra else "")}
    warnings = summary.get("warnings") or []
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "int8_progress.json").write_text(json.dumps(
        {"meta": meta, "figures": fig, "json_warnings": [{k: w.get(k) for k in ("cause", "counts", "message")} for w in warnings],
         "lines": [[round(t, 2), s] for t, s in lines]}, indent=1) + "\n")
    (args.out_dir / "int8_progress.md").write_text(markdown(meta, fig, warnings))
    print(json.dumps({"meta": meta, "figures": fig}, indent=1))


if __name__ == "__main__":
    main()
