"""Issue 40 item 2: the expected top-1 drop (the label-free gate) against real label drops.

The gate of a classifier estimates, without labels, the *expected top-1 accuracy drop* of an INT8
model under FP32's own softmax, ``mean_i(p_fp32[i, top1_fp32[i]] - p_fp32[i, top1_int8[i]])``,
with a 95 % interval (:func:`trtrepo.evaluate.expected_top1_drop`). If FP32 is calibrated, the
estimate is an unbiased estimate of the label-accuracy drop. This script measures that claim on
labelled held-out data, for INT8 variants of four trained classifiers:

* ``demo``: trtrepo's embedded demo (residual CNN, ReLU, scikit-learn's ``load_digits`` at 32x32;
  ``demo:calib`` for calibration, the 597 labelled ``demo:val`` images held out).
* ``dwcnn``: a MobileNet-style depthwise-separable CNN with ReLU6 trained here (torch, CPU,
  seeded, about 20 s) on *noisy digits*: ``load_digits`` images at 16x16 with Gaussian pixel noise
  (sigma 0.5 of the [0, 1] range, a fresh draw every epoch), so that FP32 is far from 100 %.
  Own split of the 1797 images (seed 7): 800 train, 300 calibration (2 noise draws each: 600
  labelled samples, used for INT8 calibration and for fitting a temperature), 697 test (3 noise
  draws each: 2091 samples; the draws of one image share its digit, so they are not independent).
* ``dwcnn-overfit``: the same network trained to over-fit: 3 fixed noise draws of the 800 train
  images, Adam without weight decay, 40 epochs (training loss about 0.01): over-confident FP32.
* ``dwcnn-smoothed``: ``dwcnn``'s recipe with label smoothing 0.3: under-confident FP32.

Each INT8 variant is made by trtrepo's own library, ``trtrepo.quantize.run_quantize``: methods
(minmax, entropy, percentile, mse), weight rounding (bias correction, AdaRound), the tensorrt
target, the head kept in float, and clipped activation ranges (minmax ranges written as a JSON
ranges file with every activation's range, the model input's excepted, scaled by a factor < 1,
quantized with ``ranges=``). For each variant: the real drop (FP32 minus INT8 accuracy on the
labelled held-out data), the estimate and its interval, whether the real drop lies inside it,
top-1 agreement; the interval that the tool holds a labelled measurement against
(:meth:`trtrepo.evaluate.ExpectedDrop.label_interval`: the labels' own randomness when FP32 is
calibrated, ``+-1.96 sqrt(sum_i v_i) / n`` with ``v_i = p_a + p_b - (p_a - p_b)^2`` over the
flipped samples); FP32's expected calibration error (15 equal-width confidence bins).

``dwcnn``'s test images drawn again with 50 fresh noise draws each (34,850 samples) give its
drop in expectation over the noise, to set against the interval of the 2091 samples.

Then what can mislead: a miscalibrated FP32 (the same logits divided by a temperature: 0.5 and
0.25 sharper, 2 softer; the over-fitted and the smoothed models), and temperature scaling fitted
(NLL) on a labelled calibration split (``dwcnn*``: their 600 calibration samples; ``demo``:
two-fold cross-fitting on ``demo:val``, as ``demo:calib`` holds the training images); few
samples (random subsets of 50-200 held-out samples, the interval of each subset against that
subset's real drop); label noise (10 % of the held-out labels replaced by another class at random).

    python bench/estimator.py [--work /tmp/trtrepo-estimator] [--out docs/gauntlet/estimator.json]
        [--update-docs docs/benchmarks.md] [--models demo dwcnn dwcnn-overfit dwcnn-smoothed] [--variants NAME ...]
    python bench/estimator.py --from-json docs/gauntlet/estimator.json [--update-docs docs/benchmarks.md]

Writes the JSON results to ``--out`` and prints the Markdown section ("Issue 40: the
expected-drop estimator against real label drops"); ``--update-docs`` puts it into that file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_name, publish  # noqa: E402

HEADING = "## Issue 40: the expected-drop estimator against real label drops"
MODELS = ("demo", "dwcnn", "dwcnn-overfit", "dwcnn-smoothed")
MISCALIBRATED = ("dwcnn-overfit", "dwcnn-smoothed")  # trained to be over- / under-confident
ECE_BINS = 15
TEMPERATURES = (0.5, 0.25, 2.0)  # FP32's logits divided by them: < 1 over-confident, > 1 under-confident
SUBSET_SIZES = (50, 100, 200)
SUBSET_DRAWS = 200
LABEL_NOISE = 0.10
NOISE_SIGMA = 0.5
CALIB_LIMIT = 512  # demo:calib samples used to calibrate
GATE_LIMIT = 1.0  # points: the gate's default --max-top1-drop
POPULATION_DRAWS = 50  # dwcnn: fresh noise draws of each test image for the drop in expectation


@dataclass(frozen=True)
class Variant:
    """One INT8 model: ``run_quantize`` keywords, or minmax ranges scaled by ``clip``, with
    ``float_head`` keeping the last Gemm/MatMul in float."""

    name: str
    quantize: dict[str, Any] = field(default_factory=dict)
    clip: float | None = None
    float_head: bool = False
    target: str = "onnxruntime"


VARIANTS = (
    Variant("minmax", {"method": "minmax"}),
    Variant("entropy", {"method": "entropy"}),
    Variant("percentile", {"method": "percentile"}),
    Variant("mse", {"method": "mse"}),
    Variant("entropy + bias correction", {"method": "entropy", "weight_rounding": "bias_correction"}),
    Variant("entropy + AdaRound", {"method": "entropy", "weight_rounding": "adaround"}),
    Variant("minmax, tensorrt target", {"method": "minmax"}, target="tensorrt"),
    Variant("minmax, head in float", {"method": "minmax"}, float_head=True),
    *(Variant(f"ranges x{f}", clip=f) for f in (0.5, 0.45, 0.4, 0.35, 0.3, 0.25)),
    Variant("ranges x0.35, head in float", clip=0.35, float_head=True),
)


# ---------------------------------------------------------------------------------------------
# Statistics (pure numpy)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def ece(logits: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error of the top-1 confidence, ``bins`` equal-width bins."""
    p = softmax(logits)
    conf, right = p.max(axis=1), p.argmax(axis=1) == labels
    which = np.minimum((conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            total += abs(right[sel].mean() - conf[sel].mean()) * sel.mean()
    return float(total)


def nll(logits: np.ndarray, labels: np.ndarray) -> float:
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """The temperature T minimising the NLL of ``logits / T`` (golden-section search on log T)."""
    lo, hi = math.log(0.02), math.log(50.0)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = nll(logits / math.exp(a), labels), nll(logits / math.exp(b), labels)
    for _ in range(80):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = nll(logits / math.exp(a), labels)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = nll(logits / math.exp(b), labels)
    return float(math.exp((lo + hi) / 2))


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(logits.argmax(axis=1) == labels))


def real_drop(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray) -> float:
    """FP32 accuracy minus INT8 accuracy (fraction)."""
    return accuracy(ref, labels) - accuracy(cand, labels)


def judged(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The estimate (:func:`trtrepo.evaluate.expected_top1_drop`) against the real drop, in points."""
    from trtrepo.evaluate import expected_top1_drop

    ed = expected_top1_drop(ref, cand)
    real = real_drop(ref, cand, labels)
    lo, hi = ed.label_interval()
    return {"real": 100 * real, "estimate": 100 * ed.estimate, "lower": 100 * ed.lower, "upper": 100 * ed.upper,
            "inside": bool(ed.lower - 1e-12 <= real <= ed.upper + 1e-12), "below_upper": bool(real <= ed.upper + 1e-12),
            "prediction": [100 * lo, 100 * hi],
            "inside_prediction": bool(lo - 1e-12 <= real <= hi + 1e-12),
            "changed": ed.changed, "samples": ed.samples, "flip_cost": ed.flip_cost}


def subset_coverage(ref: np.ndarray, cand: np.ndarray, labels: np.ndarray, n: int, draws: int,
                    seed: int) -> dict[str, float]:
    """On ``draws`` random subsets of ``n`` held-out samples: how often the subset's interval holds
    the subset's own real drop, and how often it holds the whole set's real drop."""
    from trtrepo.evaluate import expected_top1_drop

    rng = np.random.default_rng(seed)
    whole = real_drop(ref, cand, labels)
    own = full = 0
    for _ in range(draws):
        idx = rng.choice(len(ref), size=n, replace=False)
        ed = expected_top1_drop(ref[idx], cand[idx])
        r = real_drop(ref[idx], cand[idx], labels[idx])
        own += ed.lower - 1e-12 <= r <= ed.upper + 1e-12
        full += ed.lower - 1e-12 <= whole <= ed.upper + 1e-12
    return {"own": own / draws, "whole": full / draws}


def noisy_labels(labels: np.ndarray, fraction: float, classes: int, seed: int) -> np.ndarray:
    """``labels`` with ``fraction`` of them replaced by another class, uniformly at random."""
    rng = np.random.default_rng(seed)
    out = labels.copy()
    pick = rng.choice(len(labels), size=int(round(fraction * len(labels))), replace=False)
    out[pick] = (labels[pick] + rng.integers(1, classes, size=len(pick))) % classes
    return out


# ---------------------------------------------------------------------------------------------
# The classifiers and their data


@dataclass
class Classifier:
    """A trained FP32 classifier: its ONNX file, calibration data (for INT8), labelled held-out
    data, and a labelled split to fit a temperature on (None: two-fold cross-fitting on the test)."""

    name: str
    what: str
    onnx: Path
    calib: np.ndarray
    test: np.ndarray
    test_labels: np.ndarray
    temp_x: np.ndarray | None = None
    temp_labels: np.ndarray | None = None
    population: tuple[np.ndarray, np.ndarray] | None = None  # many more labelled samples of the test's kind


def demo_classifier(work: Path) -> Classifier:
    from trtrepo.demo import split_tensors
    from trtrepo.export import export_onnx

    path = work / "demo.onnx"
    if not path.exists():
        export_onnx("demo", path)
    calib, _ = split_tensors("calib")
    x, y = split_tensors("val")
    return Classifier("demo", "trtrepo's demo: residual CNN (ReLU), load_digits at 32x32, 597 labelled demo:val images",
                      path, calib[:CALIB_LIMIT], x, y)


def noisy_digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """load_digits (the demo's copy) at 16x16 in [0, 1], split 800 / 300 / 697 images (seed 7);
    ``draw(split, draws, seed)`` adds the Gaussian noise and normalises to [-1, 1]."""
    import torch

    from trtrepo.demo import raw_digits

    imgs, labels = raw_digits()
    x = torch.nn.functional.interpolate(torch.from_numpy(imgs[:, None].astype(np.float32) / 255.0), size=(16, 16),
                                        mode="bilinear", align_corners=False).numpy()
    perm = np.random.default_rng(7).permutation(len(imgs))
    return {"train": (x[perm[:800]], labels[perm[:800]]), "calib": (x[perm[800:1100]], labels[perm[800:1100]]),
            "test": (x[perm[1100:]], labels[perm[1100:]])}


def draw(split: tuple[np.ndarray, np.ndarray], draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, y = np.repeat(split[0], draws, axis=0), np.repeat(split[1], draws)
    x = x + rng.normal(0.0, NOISE_SIGMA, x.shape).astype(np.float32)
    return ((x - 0.5) / 0.5).astype(np.float32), y


def dwcnn_model() -> Any:
    """MobileNet-style: 3x3 conv, four depthwise-separable blocks (BN, ReLU6), global pool, linear."""
    from torch import nn

    def block(cin: int, cout: int, stride: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
                             nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6())

    class DWCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
                                          block(16, 32, 2), block(32, 32, 1), block(32, 64, 2), block(64, 64, 1))
            self.head = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x).mean((2, 3)))

    return DWCNN()


def train_dwcnn(data: dict, name: str, path: Path) -> None:
    """Train and export to ONNX (dynamic batch). ``dwcnn``: a fresh noise draw of the 800 train
    images every epoch, AdamW (weight decay 5e-4), 30 epochs; ``dwcnn-smoothed``: the same with
    label smoothing 0.3 (under-confident); ``dwcnn-overfit``: 3 fixed draws, Adam without weight
    decay, 40 epochs (over-confident)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = dwcnn_model()
    overfit = name == "dwcnn-overfit"
    if overfit:
        xtr, ytr = draw(data["train"], 3, 11)
        opt = torch.optim.Adam(model.parameters(), lr=2e-3)
        epochs = 40
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=5e-4)
        epochs = 30
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.3 if name == "dwcnn-smoothed" else 0.0)
    rng = np.random.default_rng(3)
    for epoch in range(epochs):
        if not overfit:
            xtr, ytr = draw(data["train"], 1, 100 + epoch)
        model.train()
        order = rng.permutation(len(xtr))
        for i in range(0, len(order), 64):
            b = order[i:i + 64]
            opt.zero_grad()
            loss_fn(model(torch.from_numpy(xtr[b])), torch.from_numpy(ytr[b])).backward()
            opt.step()
    model.eval()
    torch.onnx.export(model, (torch.zeros(1, 1, 16, 16),), str(path), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=False)


def dwcnn_classifier(work: Path, name: str) -> Classifier:
    path = work / f"{name}.onnx"
    data = noisy_digits()
    if not path.exists():
        t0 = time.perf_counter()
        train_dwcnn(data, name, path)
        print(f"{name}: trained in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    cx, cy = draw(data["calib"], 2, 1)
    tx, ty = draw(data["test"], 3, 2)
    what = ("depthwise-separable CNN (ReLU6) on noisy 16x16 load_digits, "
            + {"dwcnn": "fresh noise every epoch", "dwcnn-smoothed": "the same with label smoothing 0.3",
               "dwcnn-overfit": "trained to over-fit (3 fixed noise draws, no weight decay)"}[name]
            + "; 2091 labelled test samples (697 images x 3 noise draws)")
    return Classifier(name, what, path, cx, tx, ty, cx, cy, population=draw(data["test"], POPULATION_DRAWS, 3))


# ---------------------------------------------------------------------------------------------
# INT8 variants


def logits_of(path: Path, x: np.ndarray) -> np.ndarray:
    from trtrepo.evaluate import make_session

    s = make_session(str(path), threads=1)
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: x[i:i + 256]})[0] for i in range(0, len(x), 256)]).astype(np.float64)


def head_node(path: Path) -> str:
    import onnx

    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type in ("Gemm", "MatMul")]
    return nodes[-1].name


def clipped_ranges(clf: Classifier, work: Path, factor: float) -> Path:
    """minmax ranges (with their signed min/max) of ``clf``, every tensor but the model inputs
    scaled by ``factor``, as a JSON ranges file."""
    from trtrepo.calibrate import CalibrateOptions, run_calibrate
    from trtrepo.data import DataOptions

    base = work / f"{clf.name}_minmax_ranges.json"
    if not base.exists():
        npz = work / f"{clf.name}_calib.npz"
        np.savez(npz, input=clf.calib)
        run_calibrate(clf.onnx, CalibrateOptions(data=DataOptions(spec=str(npz)), method="minmax", ranges=str(base)))
    d = json.loads(base.read_text())
    for name, entry in d["tensors"].items():
        if name == "input":
            continue
        for k in ("amax", "min", "max"):
            if k in entry:
                entry[k] = float(entry[k]) * factor
        entry.pop("scale", None)
    out = work / f"{clf.name}_ranges_x{factor}.json"
    out.write_text(json.dumps(d))
    return out


def quantize_variant(clf: Classifier, v: Variant, work: Path) -> Path:
    from trtrepo.data import ArraySource
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import run_quantize

    out = work / f"{clf.name}__{v.name.replace(' ', '_').replace(',', '').replace('+', 'plus')}.onnx"
    options = QuantizeOptions(target=v.target)
    if v.float_head:
        options = options.with_excluded_nodes([head_node(clf.onnx)])
    kw: dict[str, Any] = {"weight_rounding": "nearest", "smooth_quant": None, "check": None,
                          "accept_accuracy_loss": True, "force": True, **v.quantize}
    if v.clip is not None:
        kw["ranges"] = clipped_ranges(clf, work, v.clip)
    else:
        kw["data"] = ArraySource(f"{clf.name}:calib", {"input": clf.calib})
    run_quantize(clf.onnx, out, options=options, **kw)
    return out


# ---------------------------------------------------------------------------------------------
# The run


def temperatures(clf: Classifier, ref: np.ndarray, split: np.ndarray | None) -> tuple[np.ndarray, dict[str, Any]]:
    """FP32's test logits ``ref`` divided by the temperature fitted on FP32's logits ``split`` of
    the labelled calibration split (None: two-fold cross-fitted on the test set), with the fit."""
    if split is not None:
        t = fit_temperature(split, clf.temp_labels)
        return ref / t, {"fit_on": f"labelled calibration split ({len(clf.temp_labels)} samples)", "T": t}
    half = np.arange(len(ref)) % 2 == 0
    t_even, t_odd = fit_temperature(ref[~half], clf.test_labels[~half]), fit_temperature(ref[half], clf.test_labels[half])
    scaled = ref.copy()
    scaled[half] /= t_even
    scaled[~half] /= t_odd
    return scaled, {"fit_on": "two-fold cross-fitting on the held-out set", "T": [t_even, t_odd]}


def run_model(clf: Classifier, variants: list[Variant], work: Path) -> dict[str, Any]:
    from trtrepo.evaluate import expected_top1_drop

    ref = logits_of(clf.onnx, clf.test)
    y = clf.test_labels
    classes = ref.shape[1]
    split = None if clf.temp_x is None else logits_of(clf.onnx, clf.temp_x)
    scaled, tfit = temperatures(clf, ref, split)
    y_noisy = noisy_labels(y, LABEL_NOISE, classes, seed=5)
    ref_pop = None if clf.population is None else logits_of(clf.onnx, clf.population[0])
    model = {"name": clf.name, "what": clf.what, "test_samples": len(y), "fp32_accuracy": 100 * accuracy(ref, y),
             "ece": 100 * ece(ref, y), "temperature": tfit, "ece_scaled": 100 * ece(scaled, y),
             "ece_sharpened": {str(t): 100 * ece(ref / t, y) for t in TEMPERATURES}, "variants": []}
    print(f"{clf.name}: FP32 {model['fp32_accuracy']:.2f} %, ECE {model['ece']:.2f} %, temperature {tfit['T']}",
          file=sys.stderr, flush=True)
    for i, v in enumerate(variants):
        t0 = time.perf_counter()
        q = quantize_variant(clf, v, work)
        cand = logits_of(q, clf.test)
        row = {"model": clf.name, "variant": v.name, "quantize_s": time.perf_counter() - t0, "int8_accuracy": 100 * accuracy(cand, y),
               "agreement": 100 * float(np.mean(ref.argmax(1) == cand.argmax(1))), **judged(ref, cand, y)}
        row["scaled"] = judged(scaled, cand, y)
        row["sharpened"] = {str(t): judged(ref / t, cand, y) for t in TEMPERATURES}
        # temperature scaling fitted on the sharpened logits (undoes the sharpening)
        row["sharpened_rescaled"] = {str(t): judged(temperatures(clf, ref / t, None if split is None else split / t)[0],
                                                    cand, y) for t in TEMPERATURES}
        row["label_noise"] = judged(ref, cand, y_noisy)
        if ref_pop is not None:
            cand_pop = logits_of(q, clf.population[0])
            pop = 100 * real_drop(ref_pop, cand_pop, clf.population[1])
            row["population"] = {"samples": len(ref_pop), "real": pop, "inside": bool(row["lower"] - 1e-9 <= pop <= row["upper"] + 1e-9),
                                 "estimate": 100 * expected_top1_drop(ref_pop, cand_pop).estimate}
        row["subsets"] = {str(n): subset_coverage(ref, cand, y, n, SUBSET_DRAWS, seed=1000 + 10 * i + n)
                          for n in SUBSET_SIZES if n < len(y)}
        model["variants"].append(row)
        print(f"  {v.name}: real {row['real']:.2f}, estimate {row['estimate']:.2f} ({row['lower']:.2f}-{row['upper']:.2f})"
              f" {'inside' if row['inside'] else 'OUTSIDE'}; scaled {row['scaled']['estimate']:.2f}"
              f" ({row['quantize_s']:.1f} s)", file=sys.stderr, flush=True)
    return model


def frac(rows: list[dict], key: Any) -> tuple[int, int]:
    hits = [bool(key(r)) for r in rows]
    return sum(hits), len(hits)


def fmt_interval(j: dict) -> str:
    return f"{j['estimate']:.2f} ({j['lower']:.2f}-{j['upper']:.2f})"


def verdict(j: dict) -> str:
    """The gate's verdict at :data:`GATE_LIMIT` (:meth:`trtrepo.evaluate.ExpectedDrop.verdict`), from points."""
    if j["samples"] and j["upper"] < GATE_LIMIT - 1e-10:
        return "pass"
    if j["samples"] and j["estimate"] > GATE_LIMIT + 1e-10:
        return "fail"
    return "undecided"


def confidence_row(model: str, label: str, ece_v: float, rows: list[dict], judged_rows: list[dict]) -> str:
    real = sum(r["real"] for r in rows)
    est = sum(j["estimate"] for j in judged_rows)
    k = sum(j["inside"] for j in judged_rows)
    ratio = f"{est:.2f} / {real:.2f} ({est / real:.2f}x)" if real > 0 else f"{est:.2f} / {real:.2f}"
    return f"| {model} | {label} | {ece_v:.2f} % | {ratio} | {k} of {len(judged_rows)} |"


def _ratio(rows: list[dict], key: Any) -> float:
    return sum(key(r)["estimate"] for r in rows) / sum(r["real"] for r in rows)


def wrong_verdicts(models: list[dict]) -> str:
    """The gate's verdicts at :data:`GATE_LIMIT` that the labels contradict, per miscalibrated model."""
    parts = []
    for m in models:
        if m["name"] not in MISCALIBRATED:
            continue
        for label, key in (("", lambda r: r), (" temperature-scaled", lambda r: r["scaled"])):
            bad = [(r, key(r)) for r in m["variants"]
                   if (verdict(key(r)) == "fail") != (r["real"] > GATE_LIMIT) or verdict(key(r)) == "undecided"]
            cases = "; ".join(f"{r['variant']}: real {r['real']:.2f}, estimate {fmt_interval(j)}, {verdict(j)}"
                              for r, j in bad)
            parts.append(f"`{m['name']}`{label}: " + (cases or "none"))
    if not parts:
        return ""
    return (f" At the gate's {GATE_LIMIT:g}-point limit, the verdicts on the wrong side of the labels (or undecided): "
            + "; ".join(parts) + ".")


def mislead(models: list[dict]) -> list[str]:
    """The "where the estimate can mislead" paragraph, its figures taken from the results."""
    by = {m["name"]: m for m in models}
    cal = [r for m in models if m["name"] not in MISCALIBRATED for r in m["variants"]]
    big = {m["name"]: [r for r in m["variants"] if r["real"] >= 1.0] for m in models}
    out = ["Where the estimate can mislead (figures from the tables above):", ""]
    miss = [r for r in cal if not r["inside"]]
    if miss:
        above = [r for r in cal if not r["below_upper"]]
        pops = [r["population"]["real"] for r in cal if "population" in r and not r["population"]["inside"]]
        text = (f"- **Realized drops near zero.** The interval is that of the *expected* drop under FP32's "
                "probabilities, and it is never below 0 (FP32's top-1 is its most probable class); a flip between "
                "near-tied classes costs about 0 in it, while against a label each such flip is a coin toss of one "
                f"sample either way. All {len(miss)} misses of the calibrated classifiers are variants that changed at "
                f"most {max(r['changed'] for r in miss)} predictions, with real drops of "
                f"{min(r['real'] for r in miss):.2f} to {max(r['real'] for r in miss):.2f} points: the interval of "
                "the realized drop, the labels' randomness added, holds "
                f"{sum(r['inside_prediction'] for r in cal)} of {len(cal)}, and at real drops of 1 point or more "
                f"the interval holds {sum(r['inside'] for r in cal if r['real'] >= 1)} of "
                f"{sum(1 for r in cal if r['real'] >= 1)}.")
        if above:
            text += (" Above the upper end (the side a pass relies on): " + "; ".join(
                f"`{r['model']}` {r['variant']}, {r['real']:.2f} > {r['upper']:.2f}"
                + (f" (over {POPULATION_DRAWS} fresh noise draws: {r['population']['real']:.2f})" if "population" in r else "")
                for r in above) + ".")
        if pops:
            text += (f" The drop in expectation can itself be slightly negative (INT8 right where FP32 was wrong), "
                     f"which the estimate cannot show: `dwcnn`'s drops over the fresh draws missed the interval "
                     f"{len(pops)} times, at {min(pops):.2f} to {max(pops):.2f} points.")
        out.append(text)

    def r(name: str, key: Any) -> str:
        return f"{_ratio(big[name], key):.2f}x" if big.get(name) else "-"

    if "dwcnn" in by and "dwcnn-overfit" in by and big["dwcnn"] and big["dwcnn-overfit"]:
        ov, dw = by["dwcnn-overfit"], by["dwcnn"]
        demo_soft = f", `demo` {r('demo', lambda x: x['sharpened']['2.0'])}" if big.get("demo") else ""
        if big.get("dwcnn-smoothed"):
            sm = by["dwcnn-smoothed"]
            demo_soft += (f"; trained with label smoothing 0.3 (`dwcnn-smoothed`, ECE {sm['ece']:.1f} %): "
                          f"{r('dwcnn-smoothed', lambda x: x)}, "
                          f"{sum(x['inside'] for x in big['dwcnn-smoothed'])} of {len(big['dwcnn-smoothed'])} inside, "
                          f"temperature-scaled (T = {sm['temperature']['T']:.2f}) "
                          f"{r('dwcnn-smoothed', lambda x: x['scaled'])}, "
                          f"{sum(x['scaled']['inside'] for x in big['dwcnn-smoothed'])} inside")
        out.append(
            "- **A miscalibrated FP32.** Over-confidence makes the estimate *over*-state the drop (each flip is "
            "charged FP32's inflated confidence): the over-fitted model (ECE "
            f"{ov['ece']:.1f} %) {r('dwcnn-overfit', lambda x: x)} the real drop on its variants of 1 point or more, "
            f"{sum(x['inside'] for x in big['dwcnn-overfit'])} of {len(big['dwcnn-overfit'])} inside; `dwcnn`'s logits "
            f"/ 0.5 {r('dwcnn', lambda x: x['sharpened']['0.5'])}, / 0.25 {r('dwcnn', lambda x: x['sharpened']['0.25'])}."
            " The gate then fails models that are fine: it errs on the safe side. Under-confidence makes it "
            f"*under*-state: `dwcnn`'s logits / 2 (ECE {dw['ece_sharpened']['2.0']:.1f} %) "
            f"{r('dwcnn', lambda x: x['sharpened']['2.0'])}{demo_soft}. That is the side on which the gate would "
            "pass a model whose drop is over the limit. Temperature scaling fitted on a labelled split undoes a pure temperature error "
            f"(`dwcnn` {r('dwcnn', lambda x: x['sharpened_rescaled']['0.5'])} from / 0.5 and from / 2 alike) and "
            f"most of the over-fitted model's: {r('dwcnn-overfit', lambda x: x['scaled'])} (ECE "
            f"{ov['ece_scaled']:.1f} %, T = {ov['temperature']['T']:.2f}), "
            f"{sum(x['scaled']['inside'] for x in big['dwcnn-overfit'])} of {len(big['dwcnn-overfit'])} inside: "
            "one temperature does not fix the probabilities of the classes the INT8 model flips to. "
            f"On the calibrated classifiers (ECE {by['demo']['ece']:.1f} % and {dw['ece']:.1f} %) it changes little "
            f"(`dwcnn` {r('dwcnn', lambda x: x)} as trained, {r('dwcnn', lambda x: x['scaled'])} scaled). "
            "FP32's ECE on labelled data is the check that the estimate can be read as a label drop." + wrong_verdicts(models))
    if big.get("dwcnn") and big.get("dwcnn-overfit"):
        cov = {name: {n: np.mean([x["subsets"][str(n)]["own"] for x in big[name] if str(n) in x["subsets"]])
                      for n in SUBSET_SIZES} for name in ("dwcnn", "dwcnn-overfit")}
        lo_n, hi_n = SUBSET_SIZES[0], SUBSET_SIZES[-1]
        out.append(
            f"- **Few samples.** On random subsets of {lo_n}-{hi_n} held-out samples the interval held the subset's "
            f"own real drop {100 * min(cov['dwcnn'].values()):.0f}-{100 * max(cov['dwcnn'].values()):.0f} % of the "
            "time on `dwcnn`'s variants of 1 point or more: a small set widens the interval as it should. A bias does "
            f"not shrink with n: the over-fitted model's coverage fell from {100 * cov['dwcnn-overfit'][lo_n]:.0f} % "
            f"at n = {lo_n} to {100 * cov['dwcnn-overfit'][hi_n]:.0f} % at n = {hi_n}, as the interval narrowed "
            "around an over-stated estimate.")
        noisy = sum(x["label_noise"]["real"] for x in big["dwcnn"]) / sum(x["real"] for x in big["dwcnn"])
        k = 1 - LABEL_NOISE * 10 / 9
        out.append(
            f"- **Label noise.** {100 * LABEL_NOISE:.0f} % of the labels wrong at random shrink a measured label "
            f"drop by about {k:.2f}x (10 classes: 1 - 0.1 x 10/9; `dwcnn` measured {noisy:.2f}x), so against noisy "
            "labels a right estimate looks like an over-statement "
            f"({sum(x['label_noise']['inside'] for x in big['dwcnn'])} of {len(big['dwcnn'])} inside, was "
            f"{sum(x['inside'] for x in big['dwcnn'])}). The estimate stands for the drop against the labels FP32 "
            "predicts, not against a noisy test set.")
    return out


def markdown(results: dict[str, Any]) -> str:
    models = results["models"]
    calibrated = [r for m in models if m["name"] not in MISCALIBRATED for r in m["variants"]]
    every = [r for m in models for r in m["variants"]]
    lines = [HEADING, "",
             f"{results['date']}, {results['cpu']}, 2 cores shared with other work; ONNX Runtime "
             f"{results['onnxruntime']} (CPU), torch {results['torch']}; trtrepo at {results['commit']}. Command:",
             "", f"    {results['command']}", "",
             *([results["note"], ""] if results.get("note") else []),
             f"({results['seconds']:.0f} s.) Each INT8 model is made by `trtrepo.quantize.run_quantize` (onnxruntime "
             "target unless named; nearest weight rounding, no SmoothQuant, unless named; `ranges xF`: minmax ranges "
             "with every activation's range but the input's scaled by F, given as a JSON ranges file). Real drop: "
             "FP32 minus INT8 top-1 accuracy on the labelled held-out set; estimate: `expected_top1_drop` "
             "(no labels) with its 95 % interval; agreement: INT8 top-1 = FP32 top-1. Points throughout.", "",
             "The classifiers:", ""]
    for m in models:
        tf = m["temperature"]
        tval = tf["T"] if isinstance(tf["T"], float) else "/".join(f"{t:.2f}" for t in tf["T"])
        tval = f"{tval:.2f}" if isinstance(tval, float) else tval
        lines.append(f"- `{m['name']}`: {m['what']}. FP32 accuracy {m['fp32_accuracy']:.2f} %, ECE (15 bins) "
                     f"**{m['ece']:.2f} %**; temperature fitted on the {tf['fit_on']}: T = {tval}, ECE then "
                     f"{m['ece_scaled']:.2f} %; logits / 0.5: ECE {m['ece_sharpened']['0.5']:.2f} %, / 0.25: "
                     f"{m['ece_sharpened']['0.25']:.2f} %, / 2: {m['ece_sharpened']['2.0']:.2f} %.")
    a, n = frac(calibrated, lambda r: r["inside"])
    big = [r for r in calibrated if r["real"] >= 1.0]
    k, nk = frac(big, lambda r: r["inside"])
    u, _ = frac(calibrated, lambda r: r["below_upper"])
    b, nb = frac(every, lambda r: r["inside"])
    c, _ = frac(calibrated, lambda r: r["inside_prediction"])
    ts, _ = frac(every, lambda r: r["scaled"]["inside"])
    wrong_pass = sum(verdict(r) == "pass" and r["real"] > GATE_LIMIT for r in every)
    n_over = sum(r["real"] > GATE_LIMIT for r in every)
    cal_right = all((verdict(r) == "fail") == (r["real"] > GATE_LIMIT) and verdict(r) != "undecided" for r in calibrated)
    popr = [r for r in calibrated if "population" in r]
    pk, pn = frac(popr, lambda r: r["population"]["inside"])
    cb, _ = frac(every, lambda r: r["inside_prediction"])
    lines += ["", f"**Real drop inside the estimate's interval for a labelled measurement** "
              f"(`ExpectedDrop.label_interval`: the estimate -+ 1.96 x the spread that the labels' own randomness "
              f"gives on these samples when FP32 is calibrated; the tool holds a labelled drop against it): **{c} of {n} "
              f"variants ({100 * c / n:.0f} %) of the two calibrated classifiers** (`demo`, `dwcnn`; the acceptance "
              f"target is >= 80 %), {cb} of {nb} ({100 * cb / nb:.0f} %) with the miscalibrated models' variants too. "
              f"The interval of the drop *in expectation* (`lower..upper`, never below 0, whose upper end the gate "
              f"judges) holds the labelled drop {a} of {n} ({100 * a / n:.0f} %): {k} of {nk} at real drops of 1 point "
              f"or more, every miss a real drop near 0 (below); real drop at or below its upper end (what a pass relies "
              f"on): {u} of {n}; `dwcnn`'s drop over {POPULATION_DRAWS} fresh noise draws of the test images inside it: "
              f"{pk} of {pn}; with the miscalibrated models' variants: {b} of {nb}, temperature-scaled first: {ts} of {nb}. "
              f"**The gate's verdicts at {GATE_LIMIT:g} point** (table below): of the {n_over} variants whose real drop "
              f"is over the limit, {wrong_pass} passed; the calibrated classifiers' {len(calibrated)} verdicts "
              f"{'all' if cal_right else 'not all'} fell on the labels' side of the limit (none undecided)."]
    lines += ["", f"With the gate's rule at its default limit of {GATE_LIMIT:g} point (pass: upper end under it; fail: "
              "estimate over it; else undecided), the verdicts on the variants whose real drop is over the limit "
              "and on those at or under it:", "",
              "| model | FP32 | real drop > 1 point: fail / undecided / pass | real drop <= 1 point: pass / undecided / fail |",
              "|---|---|---|---|"]
    for m in models:
        for label, key in (("as trained", lambda r: r), ("temperature-scaled", lambda r: r["scaled"])):
            over = [verdict(key(r)) for r in m["variants"] if r["real"] > GATE_LIMIT]
            under = [verdict(key(r)) for r in m["variants"] if r["real"] <= GATE_LIMIT]
            lines.append(f"| {m['name']} | {label} | {over.count('fail')} / {over.count('undecided')} / "
                         f"**{over.count('pass')}** | {under.count('pass')} / {under.count('undecided')} / "
                         f"{under.count('fail')} |")
    lines += ["", "| model | variant | FP32 ECE | FP32 / INT8 acc | agreement (changed) | real drop | "
              "estimate (95 % interval) | inside | labelled-measurement interval (inside) | "
              f"drop over {POPULATION_DRAWS} fresh noise draws (inside) | temperature-scaled estimate | inside |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for r in m["variants"]:
            s, pop = r["scaled"], r.get("population")
            popcell = "-" if pop is None else f"{pop['real']:.2f} ({'yes' if pop['inside'] else '**no**'})"
            lines.append(f"| {m['name']} | {r['variant']} | {m['ece']:.2f} % | {m['fp32_accuracy']:.2f} / "
                         f"{r['int8_accuracy']:.2f} | {r['agreement']:.2f} % ({r['changed']}) | {r['real']:.2f} | "
                         f"{fmt_interval(r)} | {'yes' if r['inside'] else '**no**'} | {r['prediction'][0]:.2f} to "
                         f"{r['prediction'][1]:.2f} ({'yes' if r['inside_prediction'] else 'no'}) | {popcell} | "
                         f"{fmt_interval(s)} | {'yes' if s['inside'] else '**no**'} |")
    # over- and under-confidence: on the variants whose real drop is 1 point or more
    lines += ["FP32 over- and under-confident (its logits divided by a temperature; the over-fitted and the smoothed models), on the "
              "variants whose real drop is 1 point or more: the estimate against the real drop, both summed over "
              "those variants (points), and how many real drops lie inside their interval; \"then "
              "temperature-scaled\": a temperature fitted (NLL) on the labelled split, applied before the estimate:",
              "", "| model | FP32 logits | ECE | estimate / real (sum) | inside |", "|---|---|---|---|---|"]
    for m in models:
        rows = [r for r in m["variants"] if r["real"] >= 1.0]
        lines.append(confidence_row(m["name"], "as trained", m["ece"], rows, rows))
        for t in TEMPERATURES:
            label = f"/ {t:g} ({'sharper' if t < 1 else 'softer'})"
            lines.append(confidence_row(m["name"], label, m["ece_sharpened"][str(t)], rows,
                                        [r["sharpened"][str(t)] for r in rows]))
            lines.append(confidence_row(m["name"], f"/ {t:g}, then temperature-scaled", m["ece_scaled"], rows,
                                        [r["sharpened_rescaled"][str(t)] for r in rows]))
        lines.append(confidence_row(m["name"], "temperature-scaled", m["ece_scaled"], rows, [r["scaled"] for r in rows]))
    # few samples, label noise
    lines += ["", f"Few samples: {SUBSET_DRAWS} random subsets of n held-out samples per variant; how often the "
              "subset's interval holds the subset's own real drop / the whole set's real drop (mean over the "
              "variants; all of them, and those whose real drop is 1 point or more):", "",
              "| model | variants | " + " | ".join(f"n = {n}" for n in SUBSET_SIZES) + " |",
              "|---|---|" + "---|" * len(SUBSET_SIZES)]
    for m in models:
        for label, rows in (("all", m["variants"]), (">= 1 point", [r for r in m["variants"] if r["real"] >= 1.0])):
            cells = []
            for n in SUBSET_SIZES:
                vals = [r["subsets"][str(n)] for r in rows if str(n) in r["subsets"]]
                cells.append("-" if not vals else f"{100 * np.mean([v['own'] for v in vals]):.0f} % / "
                             f"{100 * np.mean([v['whole'] for v in vals]):.0f} %")
            lines.append(f"| {m['name']} | {label} ({len(rows)}) | " + " | ".join(cells) + " |")
    lines += ["", f"Label noise: with {100 * LABEL_NOISE:.0f} % of the held-out labels replaced by another class at "
              "random, the real drop measured against them on the variants whose real drop is 1 point or more "
              "(sums, points), and how many lie inside their interval:", ""]
    for m in models:
        rows = [r for r in m["variants"] if r["real"] >= 1.0]
        true, noisy = sum(r["real"] for r in rows), sum(r["label_noise"]["real"] for r in rows)
        lines.append(f"- `{m['name']}`: {true:.2f} with the true labels, {noisy:.2f} with the noisy ones "
                     f"({noisy / true:.2f}x); estimate {sum(r['estimate'] for r in rows):.2f}; inside "
                     f"{sum(r['label_noise']['inside'] for r in rows)} of {len(rows)} (was {sum(r['inside'] for r in rows)}).")
    lines += ["", *mislead(models), "", "Results: [`gauntlet/estimator.json`](gauntlet/estimator.json).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-estimator"), help="models and ranges (kept)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "gauntlet" / "estimator.json")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--variants", nargs="+", default=None, help="variant names (default: all)")
    ap.add_argument("--update-docs", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None, help="only render the section of an earlier run's results")
    args = ap.parse_args()
    if args.from_json is not None:
        publish(markdown(json.loads(args.from_json.read_text())), HEADING, args.update_docs)
        return
    import subprocess

    import onnxruntime
    import torch

    args.work.mkdir(parents=True, exist_ok=True)
    variants = [v for v in VARIANTS if args.variants is None or v.name in args.variants]
    t0 = time.perf_counter()
    models = []
    for name in args.models:
        clf = demo_classifier(args.work) if name == "demo" else dwcnn_classifier(args.work, name)
        models.append(run_model(clf, variants, args.work))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown (not a git checkout)"
    flags = Path("/proc/cpuinfo").read_text()
    cmd = "python bench/estimator.py" + ("" if args.models == list(MODELS) else " --models " + " ".join(args.models))
    results = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
               "cpu": f"{cpu_name()} ({'AVX512-VNNI' if 'avx512_vnni' in flags else 'no VNNI'})",
               "onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "commit": commit,
               "command": cmd + " --update-docs docs/benchmarks.md", "seconds": time.perf_counter() - t0,
               "models": models}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    publish(markdown(results), HEADING, args.update_docs)


if __name__ == "__main__":
    main()
