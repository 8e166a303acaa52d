"""Trained-model gauntlet: trtrepo (default settings) against ONNX Runtime's quantize_static and NNCF.

For every model (``--models``; trained: ``mobilenet_v2`` torchvision's ImageNet MobileNetV2 on
photograph crops, ``mpnet`` the all-mpnet-base-v2 sentence encoder on generated sentences,
``demo`` / ``demo_text`` trtrepo's trained demo CNN / text encoder on their own data; the random-weight
ViT and ConvNeXt of issue 13 left with issue 42, see docs/benchmarks.md) and every tool:

* **trtrepo** with its DEFAULT settings through the CLI in a fresh subprocess::

      trtrepo quantize MODEL --data SPEC --limit N --target onnxruntime|tensorrt -o OUT --report DIR

  (no ``--method``: the default ``auto`` with SmoothQuant ``auto`` and the held-out check vs FP32;
  ``--limit N`` with the default ``--seed 0`` picks the calibration samples, the peers get the very
  same ones; trtrepo holds 20 % of them out for its own choice/check and calibrates on the rest).
  The CLI runs in-process inside a small wrapper (``trtrepo.cli:main``) that prints the process's
  ``VmHWM`` at exit: peak RSS. Recorded from the report (DIR/quantize.json): method chosen,
  SmoothQuant alpha, the held-out check (ok/failures), and whether the CLI printed its WARNING.
* **peers** (peers.py, each in a fresh subprocess): every ``settings_for("ort", kind)`` and
  ``settings_for("nncf", kind)`` setting, on the same samples (one .npz; explicit ``b{i}:``
  batches grouped by shape where the sequence length varies: ORT Entropy/Percentile fail on those
  and that failure is a result).

Per model and tool: accuracy on the evaluation data (FP32 vs INT8 agreement; accuracy vs labels
for the demos), ONNX Runtime CPU latency at batch 1 and 32 of FP32 and every INT8 model of the
model, timed round-robin in one fresh process (peers.time_models, 2 threads; text models at
sequence length 32), speedup = FP32 median / INT8 median, integer kernels in ORT's optimized graph,
quantize time (the tool's own: trtrepo's "in X s", peers' ``seconds``; the whole process in
parentheses) and peak RSS. trtrepo's tensorrt-target model is a Q/DQ (fake-quant) model on the
CPU: accuracy only.

    python bench/gauntlet/run.py [--models ...] [--quick] [--out DIR] [--update-docs docs/benchmarks.md]

writes results.json, results.md, results.csv and results.png into ``--out``
(default /work/gauntlet-cache/results), progress on stderr.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (str(HERE.parent), str(HERE)):  # bench/ (_common) and bench/gauntlet (vision, text, peers)
    if _p not in sys.path:
        sys.path.insert(0, _p)

DEFAULT_CACHE = Path(os.environ.get("TRTREPO_GAUNTLET_CACHE", "/work/gauntlet-cache"))
MODEL_NAMES = ("mobilenet_v2", "mpnet", "demo", "demo_text")
DOCS_HEADING = "## Trained-model gauntlet (issue 13)"
TIMING_TAG = "GAUNTLET-TIMING "
RSS_TAG = "GAUNTLET-VMHWM-KB "
THREADS = 2
MAX_BATCH = 32
TEXT_SEQ = 32
# evaluation samples per model: (full, --quick); None = the whole split
EVAL_SAMPLES: dict[str, tuple[int | None, int | None]] = {
    "mobilenet_v2": (500, 100), "mpnet": (256, 64), "demo": (None, None), "demo_text": (None, None)}

# The CLI in-process, then its peak RSS (VmHWM) on stderr, whatever the exit.
CLI_WRAPPER = f"""
import sys
sys.argv = ["trtrepo"] + sys.argv[1:]
try:
    from trtrepo.cli import main
    main()
finally:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("\\n{RSS_TAG}" + line.split()[1] + "\\n")
"""

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - _T0:8.1f}s] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Models


@dataclass
class ModelSpec:
    name: str
    describe: str
    trained: bool
    kind: str  # cnn | transformer (the peers' model kind)
    path: Path
    calib_spec: str  # trtrepo data spec (also read here for the peers)
    eval_spec: str
    outputs: list[str]  # the outputs the metrics read
    primary: str  # metric key plotted against the speedup
    rounds: tuple[int, int]  # timing rounds at batch 1, batch 32
    text: bool = False
    labels: bool = False
    eval_seed: int | None = 0


def _vision_cache(cache: Path) -> Path:
    import vision

    d = cache / "mobilenet_v2"
    if not all((d / f).is_file() for f in ("model.onnx", "calib.npz", "eval.npz")):
        log(f"building {d} (MobileNetV2 export, 512 + 500 photograph crops)")
        vision.build_cache(d, 512, 500)
    return d


def prepare(name: str, cache: Path, quick: bool) -> ModelSpec:
    """Export/build what ``name`` needs into ``cache`` (kept when present); its spec."""
    big = (10, 3) if quick else (30, 10)
    if name == "mobilenet_v2":
        d = _vision_cache(cache)
        return ModelSpec(name, "torchvision's ImageNet MobileNetV2 (trained), real photograph crops", True, "cnn",
                         d / "model.onnx", str(d / "calib.npz"), str(d / "eval.npz"), ["logits"], "top1", big)
    if name == "mpnet":
        import text

        path = text.export_onnx(cache / "mpnet" / "model.onnx", cache)
        return ModelSpec(name, "all-mpnet-base-v2 sentence encoder (trained), generated English sentences", True,
                         "transformer", path, "text:calib_samples", "text:eval_samples", ["sentence_embedding"],
                         "cosine_mean", (10, 3) if quick else (20, 10), text=True)
    if name in ("demo", "demo_text"):
        from trtrepo.export import export_onnx

        src = name.replace("_", "-")
        path = cache / name / "model.onnx"
        if not path.is_file():
            log(f"exporting trtrepo's {src} model to {path}")
            export_onnx(src, path)
        if name == "demo":
            return ModelSpec(name, "trtrepo's demo CNN (trained, 8x8 digits upscaled to 32x32)", True, "cnn", path,
                             "demo:calib", "demo:val", ["logits"], "top1", (50, 20) if quick else (200, 100),
                             labels=True, eval_seed=None)
        return ModelSpec(name, "trtrepo's demo-text encoder (trained, synthetic token task; outputs logits + embedding)",
                         True, "transformer", path, "demo-text:calib", "demo-text:val", ["logits", "embedding"], "top1",
                         (50, 20) if quick else (200, 100), text=True, labels=True, eval_seed=None)
    raise ValueError(f"unknown model {name}")


# --------------------------------------------------------------------------------------------
# Data


def load_samples(spec: str, model: Path, limit: int | None, seed: int | None) -> list[Any]:
    """trtrepo's own reading of a data spec (the subset ``--limit N --seed S`` takes): Samples."""
    import onnx

    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO

    io = ModelIO.from_onnx(onnx.load(str(model), load_external_data=False))
    return list(open_data(spec, io=io, limit=limit, seed=seed))


def batches_of(samples: Sequence[Any], size: int = MAX_BATCH) -> list[dict[str, np.ndarray]]:
    """Consecutive samples of one shape stacked into batches of at most ``size``."""
    out: list[dict[str, np.ndarray]] = []
    pending: list[Any] = []

    def key(s: Any) -> tuple:
        return tuple(sorted((k, np.shape(v)) for k, v in s.inputs.items()))

    for s in samples:
        if pending and (key(s) != key(pending[0]) or len(pending) == size):
            out.append({k: np.stack([p.inputs[k] for p in pending]) for k in pending[0].inputs})
            pending = []
        pending.append(s)
    if pending:
        out.append({k: np.stack([p.inputs[k] for p in pending]) for k in pending[0].inputs})
    return out


def write_calib(path: Path, samples: Sequence[Any]) -> dict[str, Any]:
    """The peers' calibration file: full arrays when every sample has one shape, else ``b{i}:`` batches."""
    from peers import save_calib

    batches = batches_of(samples)
    shapes = {tuple(v.shape[1:]) for b in batches for v in b.values()}
    if len({tuple(sorted((k, v.shape[1:]) for k, v in b.items())) for b in batches}) == 1:
        save_calib(path, {k: np.concatenate([b[k] for b in batches]) for k in batches[0]})
        return {"layout": "arrays", "batches": None, "shapes": sorted(map(str, shapes))}
    save_calib(path, batches)
    return {"layout": "explicit batches", "batches": len(batches), "shapes": sorted(map(str, shapes))}


def run_outputs(path: Path, batches: Sequence[dict[str, np.ndarray]], outputs: Sequence[str]) -> dict[str, np.ndarray]:
    """The model's ``outputs`` on ``batches`` (ONNX Runtime CPU, 2 threads), concatenated."""
    from trtrepo.evaluate import make_session

    sess = make_session(str(path), threads=THREADS, optimization="all")
    got: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    for b in batches:
        for o, v in zip(outputs, sess.run(list(outputs), b), strict=True):
            got[o].append(v)
    return {o: np.concatenate(v).astype(np.float64) for o, v in got.items()}


def latency_feeds(spec: ModelSpec, samples: Sequence[Any]) -> dict[str, dict[str, np.ndarray]]:
    """{"b1": feed, "b32": feed}: evaluation samples (text: those of sequence length 32, rows repeated
    when fewer than 32 exist)."""
    pool = list(samples)
    if spec.text:
        lengths = [len(next(iter(s.inputs.values()))) for s in pool]
        want = min(set(lengths), key=lambda n: (abs(n - TEXT_SEQ), n))
        pool = [s for s, n in zip(pool, lengths, strict=True) if n == want]
    pool = [pool[i % len(pool)] for i in range(MAX_BATCH)]
    return {"b1": batches_of(pool[:1])[0], "b32": batches_of(pool[:MAX_BATCH])[0]}


# --------------------------------------------------------------------------------------------
# Metrics


def compute_metrics(spec: ModelSpec, ref: dict[str, np.ndarray], cand: dict[str, np.ndarray],
                    labels: np.ndarray | None) -> dict[str, float]:
    import vision

    if spec.name == "mpnet":
        import text

        return text.metrics(ref["sentence_embedding"], cand["sentence_embedding"])
    m = vision.metrics(ref["logits"], cand["logits"])
    out = {k: m[k] for k in ("top1", "top5", "cos_mean", "cos_min")}
    if labels is not None:
        out["accuracy"] = float(np.mean(cand["logits"].argmax(1) == labels))
    for extra in spec.outputs[1:]:  # embedding / pooled outputs: cosine
        e = vision.metrics(ref[extra], cand[extra])
        out[f"{extra}_cos_mean"], out[f"{extra}_cos_min"] = e["cos_mean"], e["cos_min"]
    return out


def metric_text(spec: ModelSpec, m: dict[str, float] | None, fp32_acc: float | None) -> str:
    if not m:
        return "-"
    if spec.name == "mpnet":
        return f"cos {m['cosine_mean']:.4f} (min {m['cosine_min']:.3f}), NN agr {100 * m['nn_agreement']:.1f}%"
    parts = []
    if "accuracy" in m:
        parts.append(f"acc {100 * m['accuracy']:.2f}% (FP32 {100 * (fp32_acc or 0):.2f}%)")
    parts.append(f"top1 agr {100 * m['top1']:.1f}%")
    if spec.name == "mobilenet_v2":  # top-5 of 1000 ImageNet classes (not of the demos' 4 or 10)
        parts.append(f"top5 {100 * m['top5']:.1f}%")
    parts.append(f"cos {m['cos_mean']:.4f} (min {m['cos_min']:.3f})")
    for extra in spec.outputs[1:]:
        parts.append(f"{extra} cos {m[f'{extra}_cos_mean']:.4f}")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------
# Tools


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run_trtrepo(spec: ModelSpec, target: str, out: Path, report_dir: Path, n_calib: int, timeout: float) -> dict[str, Any]:
    """``trtrepo quantize`` with default settings in a fresh subprocess; the row's quantize fields."""
    args = ["quantize", str(spec.path), "--data", spec.calib_spec, "--limit", str(n_calib), "--target", target,
            "-o", str(out), "--report", str(report_dir)]
    row: dict[str, Any] = {"command": "trtrepo " + " ".join(args), "ok": False, "error": None}
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CLI_WRAPPER, *args], capture_output=True, text=True,
                           timeout=timeout, env=_env(), cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        return {**row, "process_s": round(time.perf_counter() - t, 2), "error": f"timed out after {timeout:.0f}s"}
    row["process_s"] = round(time.perf_counter() - t, 2)
    rss = [ln for ln in p.stderr.splitlines() if ln.startswith(RSS_TAG)]
    row["peak_rss_mb"] = round(int(rss[-1].split()[1]) / 1024, 1) if rss else None
    warn = [ln.strip() for ln in p.stderr.splitlines() if "WARNING" in ln and "ACCURACY" in ln.upper()]
    row["warned"] = bool(warn)
    row["warning"] = warn[-1] if warn else None
    took = re.search(r"^quantized .* in ([0-9.]+)s$", p.stdout, re.M)
    row["seconds"] = float(took.group(1)) if took else None
    if p.returncode != 0 or not out.is_file():
        tail = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith(RSS_TAG)]
        row["error"] = f"exit {p.returncode}: {tail[-1] if tail else 'no output'}"
        row["stderr_tail"] = "\n".join(tail[-20:])
        return row
    row["ok"] = True
    rpath = report_dir / "quantize.json"
    if rpath.is_file():
        rep = json.loads(rpath.read_text())
        sq = rep.get("smooth_quant") or {}
        check = rep.get("accuracy_check") or {}
        row.update(method=rep.get("method"), smooth_quant_alpha=sq.get("alpha"),
                   smooth_quant_groups=len(sq.get("groups") or []),
                   accuracy_check_ok=check.get("ok"), accuracy_check_failures=check.get("failures") or [],
                   accuracy_check_output=check.get("output"), trtrepo_calibration_samples=rep.get("calibration_samples"),
                   trtrepo_holdout_samples=(rep.get("evaluation_data") or {}).get("samples"),
                   kept_float=len(rep.get("kept_float") or []),
                   calibration_s=(rep.get("seconds") or {}).get("calibration"))
    else:
        row["error"] = f"no report {rpath}"
    return row


def run_peer(spec: ModelSpec, tool: str, setting: str, calib: Path, out: Path, timeout: float) -> dict[str, Any]:
    from peers import quantize_peer

    t = time.perf_counter()
    res = quantize_peer(tool, spec.path, calib, out, kind=spec.kind, setting=setting, timeout=timeout)
    res.pop("tool", None)  # the row's own name and family stay
    res["process_s"] = round(time.perf_counter() - t, 2)
    res["ok"] = bool(res.get("ok")) and out.is_file()
    return res


def time_in_subprocess(paths: dict[str, Path], feeds: dict[str, dict[str, np.ndarray]], rounds: tuple[int, int],
                       work: Path, timeout: float) -> dict[str, Any]:
    """peers.time_models at batch 1 and batch 32 for every model, in one fresh process."""
    fpath = work / "feeds.npz"
    np.savez(fpath, **{f"{b}:{k}": v for b, feed in feeds.items() for k, v in feed.items()})
    job = {"paths": {k: str(v) for k, v in paths.items()}, "feeds": str(fpath), "rounds": list(rounds)}
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--time-worker", json.dumps(job)],
                       capture_output=True, text=True, timeout=timeout, env=_env())
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(TIMING_TAG):
            return json.loads(line[len(TIMING_TAG):])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"timing worker exit {p.returncode}: {tail}")


def _time_worker(job: dict[str, Any]) -> dict[str, Any]:
    from peers import time_models

    with np.load(job["feeds"]) as f:
        feeds: dict[str, dict[str, np.ndarray]] = {}
        for key in f.files:
            b, name = key.split(":", 1)
            feeds.setdefault(b, {})[name] = f[key]
    out = {}
    for (b, feed), runs in zip(sorted(feeds.items(), key=lambda kv: int(kv[0][1:])), job["rounds"], strict=True):
        out[b] = time_models(job["paths"], feed, runs=runs, threads=THREADS, warmup=2)
    return out


# --------------------------------------------------------------------------------------------
# One model


def tools_for(spec: ModelSpec) -> list[tuple[str, str, str]]:
    """(row name, tool, setting/target)."""
    from peers import settings_for

    rows = [("trtrepo (onnxruntime)", "trtrepo", "onnxruntime"), ("trtrepo (tensorrt)", "trtrepo", "tensorrt")]
    for tool in ("ort", "nncf"):
        rows += [(s, tool, s) for s in settings_for(tool, spec.kind)]
    return rows


def bench_model(name: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    t_model = time.perf_counter()
    log(f"{name}: preparing")
    spec = prepare(name, args.cache, args.quick)
    n_calib = 64 if args.quick else args.calib
    n_eval = args.eval or EVAL_SAMPLES[name][1 if args.quick else 0]
    work = out_dir / "work" / name
    if work.exists():
        shutil.rmtree(work)
    (work / "reports").mkdir(parents=True)
    result: dict[str, Any] = {"model": name, "describe": spec.describe, "trained": spec.trained, "kind": spec.kind,
                              "onnx": str(spec.path), "calib_spec": spec.calib_spec, "eval_spec": spec.eval_spec,
                              "primary_metric": spec.primary, "rows": []}

    calib_samples = load_samples(spec.calib_spec, spec.path, n_calib, 0)
    calib_path = work / "calib.npz"
    result["calibration"] = {"samples": len(calib_samples), **write_calib(calib_path, calib_samples)}
    eval_samples = load_samples(spec.eval_spec, spec.path, n_eval, spec.eval_seed)
    eval_batches = batches_of(eval_samples)
    labels = np.asarray([s.label for s in eval_samples]) if spec.labels else None
    result["evaluation"] = {"samples": len(eval_samples), "spec": spec.eval_spec}
    log(f"{name}: {len(calib_samples)} calibration samples ({result['calibration']['layout']}), "
        f"{len(eval_samples)} evaluation samples; FP32 reference")
    ref = run_outputs(spec.path, eval_batches, spec.outputs)
    fp32_acc = float(np.mean(ref["logits"].argmax(1) == labels)) if labels is not None else None
    result["fp32"] = {"accuracy": fp32_acc}

    timed: dict[str, Path] = {"FP32": spec.path}
    for row_name, tool, setting in tools_for(spec):
        t = time.perf_counter()
        log(f"{name}: {row_name} ...")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", row_name).strip("_")
        out = work / f"{safe}.onnx"
        row: dict[str, Any] = {"model": name, "tool": row_name, "family": tool,
                               "target": setting if tool == "trtrepo" else "onnxruntime"}
        stage = "runner"
        try:
            if tool == "trtrepo":
                row.update(run_trtrepo(spec, setting, out, work / "reports" / safe, n_calib, args.timeout))
            else:
                row.update(run_peer(spec, tool, setting, calib_path, out, args.timeout))
            if row["ok"]:
                stage = "the INT8 model fails on the evaluation data"
                cand = run_outputs(out, eval_batches, spec.outputs)
                row["metrics"] = compute_metrics(spec, ref, cand, labels)
                from peers import integer_kernels

                row["integer_kernels"] = integer_kernels(out, threads=THREADS)
                if row["target"] == "onnxruntime":
                    timed[row_name] = out
        except Exception as exc:  # one tool failing is a result; the run goes on
            row["quantized"], row["ok"] = row.get("ok", False), False
            row["error"] = f"{stage}: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        row["path"] = str(out)
        status = "ok" if row["ok"] else f"FAILED: {row.get('error')}"
        m = (row.get("metrics") or {}).get(spec.primary)
        log(f"{name}: {row_name} {status}" + (f", {spec.primary} {m:.4f}" if m is not None else "")
            + (" (CLI WARNED: accuracy loss)" if row.get("warned") else "") + f" [{time.perf_counter() - t:.1f}s]")
        result["rows"].append(row)

    log(f"{name}: timing FP32 + {len(timed) - 1} INT8 models (batch 1, {spec.rounds[0]} rounds; batch 32, "
        f"{spec.rounds[1]} rounds; round-robin, {THREADS} threads)")
    t = time.perf_counter()
    try:
        feeds = latency_feeds(spec, eval_samples)
        lat = time_in_subprocess(timed, feeds, spec.rounds, work, args.timeout)
        result["fp32"]["latency_ms"] = {b: lat[b]["FP32"]["median_ms"] for b in lat}
        result["latency_feed"] = {b: {k: list(v.shape) for k, v in f.items()} for b, f in feeds.items()}
        for row in result["rows"]:
            if row["tool"] in timed:
                row["latency_ms"] = {b: lat[b][row["tool"]]["median_ms"] for b in lat}
                row["speedup"] = {b: lat[b]["FP32"]["median_ms"] / lat[b][row["tool"]]["median_ms"] for b in lat}
        result["timing_s"] = round(time.perf_counter() - t, 1)
    except Exception as exc:
        result["timing_error"] = f"{type(exc).__name__}: {exc}"
        log(f"{name}: timing FAILED: {result['timing_error']}")
    fp = result["fp32"].get("latency_ms") or {}
    log(f"{name}: FP32 latency b1 {fp.get('b1', float('nan')):.2f} ms, b32 {fp.get('b32', float('nan')):.1f} ms "
        f"[{time.perf_counter() - t:.1f}s]")
    for row in result["rows"]:
        row["primary"] = (row.get("metrics") or {}).get(spec.primary)
        row["metric_text"] = metric_text(spec, row.get("metrics"), fp32_acc)
        row["notes"] = notes(row)
    result["seconds"] = round(time.perf_counter() - t_model, 1)
    if not args.keep_models:
        for p in work.glob("*.onnx*"):
            p.unlink()
    log(f"{name}: done in {result['seconds']:.0f}s")
    return result


def notes(row: dict[str, Any]) -> str:
    parts = []
    if not row.get("ok"):
        err = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : (Non-zero status code returned while running )?", "",
                     str(row.get("error") or "?"))
        return "FAILED: " + err[:240]
    if row["family"] == "trtrepo":
        alpha = row.get("smooth_quant_alpha")
        parts.append(f"method {row.get('method')}, SmoothQuant {'alpha ' + str(alpha) if alpha is not None else 'off'}")
        if row.get("calibration_s") is not None:
            parts.append(f"calibration {row['calibration_s']:.1f} s of it")
        ok = row.get("accuracy_check_ok")
        if ok is True:
            parts.append("held-out check ok")
        elif ok is False:
            parts.append("held-out check FAILED: " + "; ".join(row.get("accuracy_check_failures") or []))
        else:
            parts.append("held-out check not measured")
        if row.get("warned"):
            parts.append("CLI WARNED")
        if row["target"] == "tensorrt":
            parts.append("speed n/a (TensorRT target)")
    elif row.get("preprocess", "ok") != "ok":
        parts.append(f"quant_pre_process {row['preprocess']}")
    return "; ".join(p for p in parts if p)


# --------------------------------------------------------------------------------------------
# Outputs


def machine_info() -> dict[str, Any]:
    cpu, flags = "unknown", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    versions = {}
    for pkg in ("onnxruntime", "nncf", "torch", "onnx", "transformers", "numpy"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "trtrepo"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    if commit and dirty:
        commit += " + uncommitted changes in trtrepo/"
    return {"cpu": cpu, "avx512_vnni": "avx512_vnni" in flags, "avx_vnni": "avx_vnni" in flags,
            "cpu_count": os.cpu_count(), "threads": THREADS, "versions": versions, "trtrepo_commit": commit or None,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _f(v: Any, fmt: str, na: str = "-") -> str:
    return na if v is None else format(v, fmt)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = []
    for res in results["models"]:
        fp = res.get("fp32", {}).get("latency_ms") or {}
        cal = res.get("calibration", {})
        lines += [f"### {res['model']}", "",
                  f"{res['describe']}. Calibration: {cal.get('samples')} samples (`{res['calib_spec']}`; trtrepo "
                  f"holds 20 % of them out for its method choice and check), evaluation: "
                  f"{res.get('evaluation', {}).get('samples')} samples (`{res['eval_spec']}`). FP32 on ONNX Runtime CPU "
                  f"({meta['threads']} threads): batch 1 {_f(fp.get('b1'), '.2f')} ms, batch 32 {_f(fp.get('b32'), '.1f')} ms"
                  + (f"; FP32 accuracy {100 * res['fp32']['accuracy']:.2f}%" if res.get("fp32", {}).get("accuracy") is not None else "")
                  + (f". Timing failed: {res['timing_error']}" if res.get("timing_error") else "") + ".", "",
                  "| tool | accuracy (INT8 vs FP32) | speedup b1 | speedup b32 | integer kernels | quantize s (process) "
                  "| peak RSS MB | notes |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for r in res["rows"]:
            sp = r.get("speedup") or {}
            na = "n/a (TensorRT target)" if r["target"] == "tensorrt" and r.get("ok") else "-"
            secs = f"{_f(r.get('seconds'), '.1f')} ({_f(r.get('process_s'), '.1f')})"
            lines.append(f"| {r['tool']} | {r.get('metric_text', '-')} | {_f(sp.get('b1'), '.2f', na)} | "
                         f"{_f(sp.get('b32'), '.2f', na)} | {_f((r.get('integer_kernels') or {}).get('total'), 'd')} | "
                         f"{secs} | {_f(r.get('peak_rss_mb'), '.0f')} | {r.get('notes', '').replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def header(results: dict[str, Any]) -> str:
    meta = results["meta"]
    v = meta["versions"]
    return "\n".join([
        f"Command: `{meta['command']}` ({'quick smoke configuration' if meta['quick'] else 'full configuration'}; "
        f"{meta['calibration_samples']} calibration samples for every tool).",
        f"CPU: {meta['cpu']} ({meta['cpu_count']} cores visible, avx512_vnni: {'yes' if meta['avx512_vnni'] else 'no'}), "
        f"{meta['date']}; onnxruntime {v['onnxruntime']}, nncf {v['nncf']}, torch {v['torch']}, "
        f"transformers {v['transformers']}; trtrepo at {meta['trtrepo_commit']}.",
        "",
        "trtrepo runs with its default settings (`trtrepo quantize MODEL --data SPEC --limit N --target "
        "onnxruntime|tensorrt`: method auto, SmoothQuant auto, held-out check vs FP32). Peers: ONNX Runtime "
        "`quantize_static` (QDQ, per-channel, after `quant_pre_process`) with each calibration method, NNCF 3.4 "
        "(ONNX backend); see bench/gauntlet/peers.py. Accuracy: INT8 vs FP32 on held-out evaluation data "
        "(top-1/top-5 agreement with FP32's predictions, logit cosine; sentence-embedding cosine and nearest-"
        "neighbour agreement for mpnet; accuracy vs labels for the demos). Speedup: FP32 median / INT8 median "
        "latency on ONNX Runtime CPU, all models of a row's table timed round-robin in one process; text models "
        "at sequence length 32. Quantize s: the tool's own time (trtrepo's 'in X s'; peers.py's 'seconds'), the "
        "whole subprocess (interpreter, imports) in parentheses; peak RSS: that subprocess's VmHWM. Integer "
        "kernels: QLinear*/MatMulInteger*/QGemm... nodes in ONNX Runtime's optimized graph. "
        "trtrepo's tensorrt-target model is a Q/DQ model meant for TensorRT: on the CPU only its "
        "accuracy is meaningful. ORT's Entropy calibrator at its defaults (num_bins = num_quantized_bins = 128) "
        "searches a single threshold, the full range, so ort-qdq-entropy normally matches ort-qdq-minmax.",
        "", "",
    ])


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    from trtrepo.fsutil import atomic_write_text

    atomic_write_text(out_dir / "results.json", json.dumps(results, indent=1, default=str) + "\n")
    atomic_write_text(out_dir / "results.md", "# Trained-model gauntlet\n\n" + header(results) + markdown(results))
    metric_keys = sorted({k for res in results["models"] for r in res["rows"] for k in (r.get("metrics") or {})})
    cols = ["model", "tool", "family", "target", "ok", "error", "primary", *[f"metric_{k}" for k in metric_keys],
            "fp32_ms_b1", "fp32_ms_b32", "int8_ms_b1", "int8_ms_b32", "speedup_b1", "speedup_b32", "integer_kernels",
            "seconds", "process_s", "peak_rss_mb", "method", "smooth_quant_alpha", "accuracy_check_ok", "warned", "notes"]
    tmp = out_dir / "results.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for res in results["models"]:
            fp = res.get("fp32", {}).get("latency_ms") or {}
            for r in res["rows"]:
                lat, sp, m = r.get("latency_ms") or {}, r.get("speedup") or {}, r.get("metrics") or {}
                vals = {**{k: r.get(k) for k in cols}, **{f"metric_{k}": m.get(k) for k in metric_keys},
                        "fp32_ms_b1": fp.get("b1"), "fp32_ms_b32": fp.get("b32"), "int8_ms_b1": lat.get("b1"),
                        "int8_ms_b32": lat.get("b32"), "speedup_b1": sp.get("b1"), "speedup_b32": sp.get("b32"),
                        "integer_kernels": (r.get("integer_kernels") or {}).get("total")}
                w.writerow(["" if vals[c] is None else vals[c] for c in cols])
    os.replace(tmp, out_dir / "results.csv")
    try:
        plot(results, out_dir / "results.png")
    except Exception as exc:  # the plot is a nicety
        log(f"plot failed: {type(exc).__name__}: {exc}")


def plot(results: dict[str, Any], path: Path) -> None:
    """Accuracy metric vs batch-32 speedup, one panel per model, one colour per tool (shared legend);
    trtrepo's tensorrt-target model (no CPU speed) as a dashed line at its accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in results["models"] if m.get("rows")]
    if not models:
        return
    tools = list(dict.fromkeys(r["tool"] for m in models for r in m["rows"]))
    colors = {t: plt.get_cmap("tab10")(i % 10) for i, t in enumerate(tools)}
    markers = {"trtrepo": "o", "ort": "s", "nncf": "^"}
    cols = min(3, len(models))
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.9 * rows + 0.9), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, res in zip(axes.flat, models, strict=False):
        for r in res["rows"]:
            sp, y = (r.get("speedup") or {}).get("b32"), r.get("primary")
            if y is None:
                continue
            if sp is None and r["target"] == "tensorrt":
                handles[r["tool"]] = ax.axhline(y, color=colors[r["tool"]], ls="--", lw=1)
            elif sp is not None:
                handles[r["tool"]] = ax.scatter(sp, y, marker=markers.get(r["family"], "x"), color=colors[r["tool"]],
                                                s=45, alpha=0.85, edgecolors="black", linewidths=0.4)
        ax.axvline(1.0, color="gray", lw=0.6, ls=":")
        ax.set_title(f"{res['model']}{'' if res['trained'] else ' (RANDOM weights)'}", fontsize=10)
        ax.set_xlabel("speedup vs FP32, batch 32 (ORT CPU)", fontsize=8)
        ax.set_ylabel(f"{res['primary_metric']} (INT8 vs FP32)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    labels = [t + (" (accuracy only)" if t == "trtrepo (tensorrt)" else "") for t in handles]
    fig.legend(list(handles.values()), labels, loc="lower center", ncol=min(4, len(handles)), fontsize=8, frameon=False)
    meta = results["meta"]
    fig.suptitle(f"Gauntlet: accuracy vs speedup ({meta['cpu']}, {meta['threads']} threads"
                 f"{', quick' if meta['quick'] else ''})", fontsize=10)
    fig.tight_layout(rect=(0, 0.75 / (3.9 * rows + 0.9), 1, 1))
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------


def set_mem_limit(gb: float | None) -> float | None:
    """RLIMIT_DATA (inherited by the subprocesses): ``gb`` GiB, default 75 % of MemTotal; None when off."""
    import resource

    if gb is None:
        with open("/proc/meminfo") as f:
            total_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        gb = round(0.75 * total_kb / 2**20, 1)
    if gb <= 0:
        return None
    limit = int(gb * 2**30)
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return round(limit / 2**30, 1)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--time-worker"]:
        print(TIMING_TAG + json.dumps(_time_worker(json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES))
    ap.add_argument("--quick", action="store_true", help="smoke configuration: 64 calibration samples, 100 evaluation "
                                                         "images / 64 sentences, few timing rounds")
    ap.add_argument("--calib", type=int, default=512, help="calibration samples for every tool (default 512; --quick: 64)")
    ap.add_argument("--eval", type=int, default=None, help="evaluation samples (default: 500 images, 256 sentences, the demos' whole "
                                                               "validation splits; --quick: 100 images, 64 sentences)")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"models and data (default {DEFAULT_CACHE})")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default CACHE/results)")
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per quantization / timing subprocess")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="RLIMIT_DATA for this process and every quantizer/timing subprocess, so that a tool that "
                         "runs out of memory fails with MemoryError (a result) instead of waking the OOM killer "
                         "(default 75%% of MemTotal; 0: none)")
    ap.add_argument("--keep-models", action="store_true", help="keep the INT8 models in OUT/work/MODEL")
    ap.add_argument("--update-docs", type=Path, default=None, metavar="MD",
                    help=f"replace/append the section '{DOCS_HEADING}' of MD (e.g. docs/benchmarks.md)")
    a = ap.parse_args(argv)
    a.cache = a.cache.resolve()
    os.environ["TRTREPO_GAUNTLET_CACHE"] = str(a.cache)  # text.py reads it at import (here and in the CLI)
    out_dir = (a.out or a.cache / "results").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    mem_limit = set_mem_limit(a.mem_limit_gb)
    cmd = "python bench/gauntlet/run.py " + " ".join(argv) if argv else "python bench/gauntlet/run.py"
    results: dict[str, Any] = {"meta": {**machine_info(), "command": cmd, "quick": a.quick,
                                        "calibration_samples": 64 if a.quick else a.calib,
                                        "mem_limit_gb": mem_limit}, "models": []}
    log(f"gauntlet: {', '.join(a.models)}{' (quick)' if a.quick else ''}; CPU {results['meta']['cpu']} "
        f"(avx512_vnni {results['meta']['avx512_vnni']}); memory limit per process "
        f"{mem_limit or 'none'} GiB; results in {out_dir}")
    for name in a.models:
        try:
            res = bench_model(name, a, out_dir)
        except Exception as exc:
            log(f"{name}: FAILED before any tool ran: {type(exc).__name__}: {exc}")
            res = {"model": name, "describe": name, "trained": True,
                   "calib_spec": "-", "eval_spec": "-", "primary_metric": "-", "rows": [],
                   "error": f"{type(exc).__name__}: {exc}"}
        results["models"].append(res)
        write_outputs(results, out_dir)
    print(markdown(results))
    log(f"wrote {out_dir}/results.json, results.md, results.csv, results.png")
    if a.update_docs is not None:
        from _common import update_docs

        section = f"{DOCS_HEADING}\n\n" + header(results) + markdown(results).rstrip("\n") + "\n"
        update_docs(a.update_docs, DOCS_HEADING, section)
        log(f"updated {a.update_docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
