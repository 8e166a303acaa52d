"""Issue 43 study: AdaRound's wall-time budget on YOLO11n (onnxruntime target).

    python adaround_budget.py collect OUT BUDGET_S ITERATIONS   # `trtrepo quantize` with AdaRound's budget and per-layer cap
    python adaround_budget.py judge OUT BASE A...      # each OUT/A.onnx against OUT/BASE.onnx on 1280 crops

AdaRound's iterations fit a 30 s wall-time budget over the whole model (weightsteps.DEFAULT_BUDGET_S):
on YOLO11n's 88 quantized layers that is few iterations a layer. This study runs `quantize
--weight-rounding adaround --method entropy` on the 400 calibration crops with a larger budget and
judges the file against the 30 s one (9afb410's study, the same command) the way bench/detector.py
does, with paired bootstraps.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

CACHE = Path("/work/gauntlet-cache/yolo11n")
SRC = CACHE / "yolo11n_dyn.onnx"


def collect(out: Path, budget_s: float, iterations: int) -> None:
    from click.testing import CliRunner

    from trtrepo import weightsteps as WS
    from trtrepo.cli import cli

    out.mkdir(parents=True, exist_ok=True)
    WS.DEFAULT_BUDGET_S = budget_s
    WS.round_weights.__kwdefaults__["iterations"] = iterations  # type: ignore[index]  # the per-layer cap (300)
    notes: list[str] = []
    original = WS.AdaRoundBudget.note

    def note(self):  # type: ignore[no-untyped-def]
        notes.append(original(self))
        return notes[-1]

    WS.AdaRoundBudget.note = note  # type: ignore[method-assign]
    label = f"budget{budget_s:g}" + (f"_iter{iterations}" if iterations != WS.ADAROUND_ITERATIONS else "")
    t0 = time.time()
    r = CliRunner().invoke(cli, ["quantize", str(SRC), "-o", str(out / f"{label}.onnx"), "--force",
                                 "--target", "onnxruntime", "--accept-accuracy-loss", "--weight-rounding", "adaround",
                                 "--method", "entropy", "--data", str(CACHE / "calib.npy"), "--batch-size", "8",
                                 "--no-progress", "--json"])
    print(label, "exit", r.exit_code, f"{time.time() - t0:.0f}s", notes, flush=True)
    (out / f"{label}.log").write_text(r.output + "\nNOTES " + json.dumps(notes))


def judge(out: Path, b: str, others: list[str]) -> None:
    """Each of ``others`` against ``b`` (the baseline)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from detector import EVAL_PHOTOS, crops, photographs, run_model  # type: ignore[import-not-found]

    from trtrepo.detect.judge import borderline_detections, candidate_detections, reference_detections
    from trtrepo.detect.metrics import mean_ap, paired_map_bootstrap
    from trtrepo.evaluate import detection_layout

    sets = {"eval": lambda: np.load(CACHE / "eval.npy"),
            "fresh": lambda: crops(photographs(CACHE / "wheels"), EVAL_PHOTOS, 640, 7)}
    per: dict[str, dict] = {}  # detections only: three [640, 84, 8400] outputs per set do not fit beside each other
    for name, load in sets.items():
        x = load()
        fp32 = run_model(SRC, x)
        layout = detection_layout(fp32.shape, 80)
        per[name] = {"ref": reference_detections(fp32, layout), "border": borderline_detections(fp32, layout)}
        del fp32
        for label in (b, *others):
            per[name][label] = candidate_detections(run_model(out / f"{label}.onnx", x), layout)
        del x
    table: dict[str, dict] = {}
    for scope in ("eval", "fresh", "pooled"):
        names = ["eval", "fresh"] if scope == "pooled" else [scope]
        ref = [d for n in names for d in per[n]["ref"]]
        border = [d for n in names for d in per[n]["border"]]
        cls = np.concatenate([np.asarray(d.classes) for d in ref])
        u, k = np.unique(cls, return_counts=True)
        big = [int(c) for c, n in zip(u, k, strict=True) if n >= 10]
        refbig = [d.take(np.flatnonzero(np.isin(d.classes, big))) for d in ref]
        dets, row = {}, {}
        for label in (b, *others):
            d = [e for n in names for e in per[n][label]]
            dets[label] = d
            dbig = [e.take(np.flatnonzero(np.isin(e.classes, big))) for e in d]
            row[label] = {"strict": mean_ap(d, ref).map50_95, "big": mean_ap(dbig, refbig).map50_95,
                          "ignored": mean_ap(d, ref, ignore=border).map50_95}
        for a in others:
            _, _, pd = paired_map_bootstrap(dets[a], dets[b], ref, 200, 0)
            _, _, pdb = paired_map_bootstrap([e.take(np.flatnonzero(np.isin(e.classes, big))) for e in dets[a]],
                                             [e.take(np.flatnonzero(np.isin(e.classes, big))) for e in dets[b]],
                                             refbig, 200, 0)
            row[f"{a}_minus_{b}"] = {"strict": np.percentile(pd, [2.5, 50, 97.5]).tolist(),
                                     "big": np.percentile(pdb, [2.5, 50, 97.5]).tolist()}
        table[scope] = row
        print(scope, json.dumps(row), flush=True)
    (out / "adaround_budget.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "collect":
        collect(Path(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    else:
        judge(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
