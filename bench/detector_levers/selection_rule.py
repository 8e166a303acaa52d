"""Issue 43 study: which figure on deploy's 80-crop hold-out chooses YOLO11n's INT8 candidates
(calibration methods, weight roundings) the way 1280 held-out crops would.

    python selection_rule.py collect OUT [--data calib.npy]   # runs `trtrepo quantize` in-process, keeps every candidate
    python selection_rule.py judge OUT... --crops eval.npy fresh.npy
    python selection_rule.py cosines OUT...   # per-crop cosines on the hold-out, sign test per pair

``collect`` runs quantize with its defaults (onnxruntime target) and saves every candidate the
selection evaluates (the four methods with nearest rounding, then bias correction and AdaRound
of the winning method), with its hold-out figures: the strict mAP50-95 vs FP32 (the selection's
figure today), its detections, and the class-logit error at FP32's scoring anchors (anchors where
FP32's best class scores above 0.05: that class's logit, INT8 minus FP32; RMS). ``judge`` judges
every candidate on the given crops (pooled) and, for every pair the selection compares, says
which candidate each hold-out rule prefers and which the pooled crops prefer.
"""
from __future__ import annotations

import json
import pickle
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

SRC = "/work/gauntlet-cache/yolo11n/yolo11n_dyn.onnx"
ANCHOR_P = 0.05


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def class_logit_errors(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per anchor where FP32's best class scores above ANCHOR_P: that class's logit error."""
    rs, cs = ref[:, 4:84, :], cand[:, 4:84, :]
    best = rs.argmax(1)  # [N, A]
    pr = np.take_along_axis(rs, best[:, None], 1)[:, 0]
    pc = np.take_along_axis(cs, best[:, None], 1)[:, 0]
    keep = pr > ANCHOR_P
    return (logit(pc) - logit(pr))[keep]


def collect(out: Path, data: str) -> None:
    import onnx

    from trtrepo.detect.judge import candidate_detections
    from trtrepo.quantize import select

    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, dict] = {}
    original = select.Evaluator.__call__

    def patched(self, model):  # type: ignore[no-untyped-def]
        f = sys._getframe(1).f_locals
        label = f.get("step") or f.get("method") or f"c{len(seen)}"
        if "step" in f:
            label = f"{f['nearest'].label}+{label}"
        metrics = original(self, model)
        cand = self._run(model).outputs["output0"]
        ref = self.reference.outputs["output0"]
        layout = self.detection["output0"].layout
        onnx.save(model, str(out / f"{label}.onnx"))
        m = metrics["output0"]
        seen[label] = {"map": m.detection.map50_95, "cosine": m.cosine_mean,
                       "logit_rms": float(np.sqrt(np.mean(class_logit_errors(ref, cand) ** 2)))}
        with open(out / f"{label}.pkl", "wb") as fh:
            pickle.dump(candidate_detections(cand, layout), fh)
        with open(out / "reference.pkl", "wb") as fh:
            pickle.dump(self.detection["output0"].reference, fh)
        print("CANDIDATE", label, seen[label], flush=True)
        return metrics

    select.Evaluator.__call__ = patched
    from click.testing import CliRunner

    from trtrepo.cli import cli
    r = CliRunner().invoke(cli, ["quantize", SRC, "-o", str(out / "chosen.onnx"), "--force", "--target", "onnxruntime",
                                 "--accept-accuracy-loss", "--data", data, "--batch-size", "8", "--no-progress", "--json"])
    print(r.output[-3000:])
    (out / "holdout.json").write_text(json.dumps(seen, indent=1))


def judge(outs: list[Path], crop_files: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from detector import run_model  # type: ignore[import-not-found]

    from trtrepo.detect.judge import borderline_detections, candidate_detections, reference_detections
    from trtrepo.detect.metrics import mean_ap, paired_map_bootstrap
    from trtrepo.evaluate import detection_layout

    x = np.concatenate([np.load(f) for f in crop_files])
    fp32 = run_model(Path(SRC), x)
    layout = detection_layout(fp32.shape, 80)
    ref, border = reference_detections(fp32, layout), borderline_detections(fp32, layout)
    cls = np.concatenate([np.asarray(d.classes) for d in ref])
    u, k = np.unique(cls, return_counts=True)
    big = {int(c) for c, n in zip(u, k, strict=True) if n >= 10}
    refbig = [d.take(np.flatnonzero(np.isin(d.classes, list(big)))) for d in ref]
    results = {}
    for out in outs:
        hold = {k: v for k, v in json.loads((out / "holdout.json").read_text()).items() if v["cosine"] < 0.99999}  # not the FP16 copy
        href = pickle.loads((out / "reference.pkl").read_bytes())
        dets, pooled = {}, {}
        for label in hold:
            y = run_model(out / f"{label}.onnx", x)
            d = candidate_detections(y, layout)
            dets[label] = d
            dbig = [e.take(np.flatnonzero(np.isin(e.classes, list(big)))) for e in d]
            pooled[label] = {"strict": mean_ap(d, ref).map50_95, "big": mean_ap(dbig, refbig).map50_95,
                             "ignored": mean_ap(d, ref, ignore=border).map50_95,
                             "logit_rms": float(np.sqrt(np.mean(class_logit_errors(fp32, y) ** 2)))}
            print(out.name, label, hold[label], pooled[label], flush=True)
        hdets = {label: pickle.loads((out / f"{label}.pkl").read_bytes()) for label in hold}
        pairs = []
        for a, b in combinations(list(hold), 2):
            _, _, hd = paired_map_bootstrap(hdets[a], hdets[b], href, 400, 0)
            _, _, pd = paired_map_bootstrap(dets[a], dets[b], ref, 200, 0)
            _, _, pdb = paired_map_bootstrap([e.take(np.flatnonzero(np.isin(e.classes, list(big)))) for e in dets[a]],
                                             [e.take(np.flatnonzero(np.isin(e.classes, list(big)))) for e in dets[b]],
                                             refbig, 200, 0)
            row = {"a": a, "b": b, "holdout_map_diff": hold[a]["map"] - hold[b]["map"],
                   "holdout_paired": np.percentile(hd, [2.5, 50, 97.5]).tolist(),
                   "holdout_logit_rms_diff": hold[a]["logit_rms"] - hold[b]["logit_rms"],
                   "holdout_cosine_diff": hold[a]["cosine"] - hold[b]["cosine"],
                   "pooled_strict_diff": pooled[a]["strict"] - pooled[b]["strict"],
                   "pooled_strict_paired": np.percentile(pd, [2.5, 50, 97.5]).tolist(),
                   "pooled_big_diff": pooled[a]["big"] - pooled[b]["big"],
                   "pooled_big_paired": np.percentile(pdb, [2.5, 50, 97.5]).tolist(),
                   "pooled_ignored_diff": pooled[a]["ignored"] - pooled[b]["ignored"]}
            pairs.append(row)
            print("PAIR", json.dumps(row), flush=True)
        results[out.name] = {"holdout": hold, "pooled": pooled, "pairs": pairs}
    Path(outs[0].parent / "selection_rule.json").write_text(json.dumps(results, indent=1))


def cosines(outs: list[Path]) -> None:
    """Each candidate's per-crop cosine on deploy's hold-out (the 80 crops ``split_holdout`` keeps:
    seed 0, a fifth of calib.npy) and, per pair, on how many crops the first is higher."""
    import math

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from detector import run_model  # type: ignore[import-not-found]

    from trtrepo.evaluate import cosine_similarity

    calib = np.load("/work/gauntlet-cache/yolo11n/calib.npy", mmap_mode="r")
    x = np.asarray(calib[np.sort(np.random.default_rng(0).choice(len(calib), size=80, replace=False))])
    fp32 = run_model(Path(SRC), x)
    path = outs[0].parent / "selection_rule.json"
    results = json.loads(path.read_text())
    for out in outs:
        hold = results[out.name]["holdout"]
        cos = {label: cosine_similarity(fp32, run_model(out / f"{label}.onnx", x)) for label in hold}
        for row in results[out.name]["pairs"]:
            d = cos[row["a"]] - cos[row["b"]]
            n, k = int(np.count_nonzero(d)), int(np.count_nonzero(d > 0))
            row["holdout_cosine_higher"] = [k, n, (k - n / 2) / (math.sqrt(n) / 2)]
            print(out.name, row["a"], row["b"], row["holdout_cosine_higher"], flush=True)
    path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "cosines":
        cosines([Path(p) for p in sys.argv[2:]])
    elif sys.argv[1] == "collect":
        data = sys.argv[sys.argv.index("--data") + 1] if "--data" in sys.argv else "/work/gauntlet-cache/yolo11n/calib.npy"
        collect(Path(sys.argv[2]), data)
    else:
        i = sys.argv.index("--crops")
        judge([Path(p) for p in sys.argv[2:i]], sys.argv[i + 1:])
