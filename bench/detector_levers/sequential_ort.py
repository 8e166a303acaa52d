"""Issue 43 study: AdaRound in its sequential form on the onnxruntime target (YOLO11n).

    python sequential_ort.py collect OUT            # two `trtrepo quantize` runs: local and sequential AdaRound
    python sequential_ort.py judge OUT              # both files on the 640 eval crops and 640 fresh ones (seed 7)

The onnxruntime target runs AdaRound locally: each layer's quantized input is its FP32 input
fake-quantized (``weightsteps.sequential_inputs`` is False for targets with integer kernels),
because on the trained MobileNetV2 the sequential form (inputs from the Q/DQ network run in
float) lost to it (docs/quantization.md, "Measured and not kept", abfa032). This study forces
the sequential form for the detector, everything else as `quantize --weight-rounding adaround
--method entropy` on the 400 calibration crops (the deployed placement), and judges both files
the way bench/detector.py does (strict / classes with >= 10 FP32 boxes / borderline ignored),
with paired bootstraps (the same draws for both files).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

CACHE = Path("/work/gauntlet-cache/yolo11n")
SRC = CACHE / "yolo11n_dyn.onnx"


def collect(out: Path) -> None:
    from click.testing import CliRunner

    from trtrepo import weightsteps as WS
    from trtrepo.cli import cli

    out.mkdir(parents=True, exist_ok=True)
    original = WS.sequential_inputs
    for label, sequential in (("local", False), ("sequential", True)):
        WS.sequential_inputs = (lambda target: True) if sequential else original  # type: ignore[assignment]
        t0 = time.time()
        r = CliRunner().invoke(cli, ["quantize", str(SRC), "-o", str(out / f"{label}.onnx"), "--force",
                                     "--target", "onnxruntime", "--accept-accuracy-loss", "--weight-rounding", "adaround",
                                     "--method", "entropy", "--data", str(CACHE / "calib.npy"), "--batch-size", "8",
                                     "--no-progress", "--json"])
        print(label, "exit", r.exit_code, f"{time.time() - t0:.0f}s", flush=True)
        (out / f"{label}.log").write_text(r.output)
    WS.sequential_inputs = original  # type: ignore[assignment]


def judge(out: Path) -> None:
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
        for label in ("local", "sequential"):
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
        for label in ("local", "sequential"):
            d = [e for n in names for e in per[n][label]]
            dets[label] = d
            dbig = [e.take(np.flatnonzero(np.isin(e.classes, big))) for e in d]
            row[label] = {"strict": mean_ap(d, ref).map50_95, "big": mean_ap(dbig, refbig).map50_95,
                          "ignored": mean_ap(d, ref, ignore=border).map50_95}
        _, _, pd = paired_map_bootstrap(dets["sequential"], dets["local"], ref, 200, 0)
        _, _, pdb = paired_map_bootstrap([e.take(np.flatnonzero(np.isin(e.classes, big))) for e in dets["sequential"]],
                                         [e.take(np.flatnonzero(np.isin(e.classes, big))) for e in dets["local"]],
                                         refbig, 200, 0)
        row["sequential_minus_local"] = {"strict": np.percentile(pd, [2.5, 50, 97.5]).tolist(),
                                         "big": np.percentile(pdb, [2.5, 50, 97.5]).tolist()}
        table[scope] = row
        print(scope, json.dumps(row), flush=True)
    (out / "sequential_ort.json").write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    {"collect": collect, "judge": judge}[sys.argv[1]](Path(sys.argv[2]))
