"""Peer quantizers for the gauntlet: ONNX Runtime's ``quantize_static`` and NNCF 3.4 (ONNX backend)
quantize an FP32 ONNX model from the same calibration data, each run in a fresh subprocess so
that its wall time and peak RSS (``VmHWM``) are its own.

    python bench/gauntlet/peers.py --tool ort|nncf --model in.onnx --calib calib.npz --out out.onnx \\
        [--kind cnn|transformer] [--setting NAME] [--batch-size 32] [--kernels]

prints one JSON line: ``{"tool", "setting", "ok", "seconds", "peak_rss_mb", "error", ...}``.
``seconds`` is the tool's whole job (load, ``quant_pre_process`` for ONNX Runtime, calibration,
quantization, save), not the interpreter start or the imports (done first, also the lazy ones:
``quant_pre_process`` imports torch through ``onnxruntime.tools``, ~2.6 s); ``peak_rss_mb`` is the worker's
``VmHWM`` (interpreter, the tool's imports and the calibration data included; ``base_rss_mb`` is
the RSS after those, before the tool's work). A failure is the result: ``ok`` false, ``error`` one
line, ``seconds`` the time until it failed.

**Calibration file** (:func:`save_calib` writes it, :func:`load_calib` reads it): an ``.npz`` whose
keys are either the model's input names, each a full array with the samples on axis 0 (split
into batches of ``batch_size`` for ONNX Runtime), or ``b{i}:{name}`` (``b0:input_ids``,
``b0:attention_mask``, ``b1:input_ids``, ...): explicit batches, e.g. of different padded sequence
lengths, fed to ONNX Runtime as they are. NNCF always gets single samples (batch 1, rows of those
arrays: its documented usage; its default activation estimator averages per-item min/max, so the
item must be a sample) and ``subset_size`` = the number of samples.

**ONNX Runtime settings** (``quantize_static`` after ``quant_pre_process``, the documented
preprocessing: symbolic + ONNX shape inference and ORT basic optimization; if it fails the raw
model is quantized and ``preprocess`` says why). All QDQ (the documented CPU format since 1.11),
``per_channel=True`` (the docs: better accuracy, small cost), uint8 activations / int8 weights
(U8S8: the installed ``quantize_static`` docstring's choice for x86 with or without VNNI; S8S8 on
ARM), ``reduce_range`` only on x86 without VNNI (the docstring's remedy for ``VPMADDUBSW``
saturation), ActivationSymmetric/WeightSymmetric at their defaults (False/True):

* ``ort-qdq-minmax`` / ``ort-qdq-entropy`` / ``ort-qdq-percentile``: the three calibration
  methods the docs name (CNNs and transformers; every op type ORT's QDQ registry covers);
* ``ort-matmul-only`` (transformers): ``op_types_to_quantize=['MatMul']``, MinMax -- only the
  GEMMs, LayerNorm/Softmax/GELU/residual Adds stay float.

Known ORT 1.32 failures (they are results, not hidden): Entropy/Percentile stack every batch's
outputs into one array (``HistogramCalibrater.collect_data``), so ``b{i}:`` batches of different
sequence lengths fail ("inhomogeneous shape"); pad to one length instead. Entropy also fails on
BERT-style additive masks (``finfo.min`` values: "Too many bins for data range").

Not used: ``quantize_dynamic`` (the docs' choice for transformers, but it has no calibration),
the transformer optimizer + QAttention path (it needs a model-specific fusion step first),
``SmoothQuant`` (needs Intel Neural Compressor) and ``CalibMaxIntermediateOutputs`` (in ORT 1.32
``MinMaxCalibrater.collect_data`` clears the held outputs when the limit is hit *without*
folding them into the range, so the ranges would come from the last chunk only).

**NNCF 3.4** (``nncf.quantize(model_proto, nncf.Dataset(samples, transform_fn),
subset_size=len(samples), preset=..., model_type=...)`` -> ModelProto, saved with ``onnx.save``):
``nncf`` is the default call (``preset=None``; ``model_type=ModelType.TRANSFORMER`` for
``--kind transformer``), ``nncf-mixed`` (CNNs) sets ``preset=MIXED`` (asymmetric activations).
What it does, from the installed source:

* ``nncf/quantization/algorithms/post_training/pipeline.py:create_ptq_pipeline``: SmoothQuant
  (only for ``ModelType.TRANSFORMER``; ``AdvancedSmoothQuantParameters`` default ``matmul=0.95``,
  ``convolution=-1`` i.e. off) -> ChannelAlignment -> MinMaxQuantization -> FastBiasCorrection.
* ``nncf/quantization/algorithms/min_max/algorithm.py:_set_mode_based_params``: preset None ->
  MIXED for transformers (symmetric weights, asymmetric activations), PERFORMANCE (all symmetric)
  otherwise; ``_apply_model_type_pass``: transformer activation inputs of MatMuls without a
  constant operand are forced symmetric; ``_get_range_estimator_parameters``: weights MINMAX,
  activations MEAN_MINMAX (mean over calibration items of per-item min/max).
* ``nncf/quantization/algorithms/min_max/onnx_backend.py:get_ignored_metatypes``: for transformers
  Add, Pow, Squeeze, Sub, AveragePool, GlobalAveragePool, ReduceMean/L2/Sum, Div, Maximum, Sqrt,
  Reciprocal, BatchNorm, Greater/Less/Equal and Mul are not quantized (in practice the quantizers
  land on MatMul/Gemm inputs); ``nncf/onnx/quantization/ignored_patterns.py``: the attention
  Softmax -> MatMul (``MULTIHEAD_ATTENTION_OUTPUT``) and RoPE / SAM positional patterns are ignored.
  On demo-text that left 10 MatMulIntegerToFloat (the probs x V MatMuls float) and SmoothQuant's
  scales as 9 extra float Mul nodes in ONNX Runtime's optimized graph.
* ``nncf/onnx/quantization/quantize_model.py:quantize_impl``: opset >= 13 for per-channel weights;
  ``apply_preprocess_passes`` (ONNX shape inference, no-op Cast removal) first; the output is
  QDQ (standard QuantizeLinear/DequantizeLinear, weights folded to int8 initializers + DQ by
  ``compress_quantize_weights_transformation``), which ONNX Runtime's CPU EP fuses into integer
  kernels like any QDQ model; calibration runs on ONNX Runtime CPU (``nncf/onnx/engine.py``,
  default session options), one item per ``session.run``, statistics reduced in Python per item
  (``nncf/common/tensor_statistics/aggregator.py:collect_statistics``): that overhead, not the
  inference, dominates its time on small models.

NNCF 3.4 installs beside this venv's onnx 1.23 / onnxruntime 1.32 (nothing downgraded), so it
needs no separate venv; ``python=`` in :func:`quantize_peer` picks another interpreter if one does.
Telemetry is switched off in the worker (``NNCF_CI=1``: nothing else reads it).

Also: :func:`integer_kernels` (integer-kernel nodes in ONNX Runtime's optimized graph) and
:func:`time_models` (round-robin CPU latency of several models in one process).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for _p in (str(HERE.parent), str(ROOT)):  # bench/ (for _common) and the repository root
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _common import status_mb  # noqa: E402

TOOLS = ("ort", "nncf")
SETTINGS: dict[str, dict[str, Any]] = {
    "ort-qdq-minmax": {"tool": "ort", "kinds": ("cnn", "transformer"), "method": "MinMax"},
    "ort-qdq-entropy": {"tool": "ort", "kinds": ("cnn", "transformer"), "method": "Entropy"},
    "ort-qdq-percentile": {"tool": "ort", "kinds": ("cnn", "transformer"), "method": "Percentile"},
    "ort-matmul-only": {"tool": "ort", "kinds": ("transformer",), "method": "MinMax", "op_types": ["MatMul"]},
    "nncf": {"tool": "nncf", "kinds": ("cnn", "transformer"), "preset": None},
    "nncf-mixed": {"tool": "nncf", "kinds": ("cnn",), "preset": "mixed"},
}
DEFAULT_SETTING = {"ort": "ort-qdq-minmax", "nncf": "nncf"}
RESULT_TAG = "PEERS-RESULT "
_STARTED: list[float] = []  # when the timed part of the job began (a failure reports the time to it)


def settings_for(tool: str, kind: str = "cnn") -> list[str]:
    """The settings of ``tool`` meant for models of ``kind`` (cnn|transformer)."""
    return [k for k, s in SETTINGS.items() if s["tool"] == tool and kind in s["kinds"]]


# --------------------------------------------------------------------------------------------
# Calibration data


def save_calib(path: str | Path, data: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]]) -> Path:
    """Write calibration data: a mapping input name -> array (samples on axis 0), or a list of
    batches (mappings) stored as ``b{i}:{name}``."""
    if isinstance(data, Mapping):
        arrays = {k: np.asarray(v) for k, v in data.items()}
    else:
        arrays = {f"b{i}:{k}": np.asarray(v) for i, b in enumerate(data) for k, v in b.items()}
    np.savez(path, **arrays)
    return Path(path)


def load_calib(path: str | Path) -> tuple[list[dict[str, np.ndarray]], bool]:
    """(batches, explicit): the ``b{i}:{name}`` batches in order (explicit True), or one
    "batch" holding the full arrays (explicit False)."""
    with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    if not data:
        raise ValueError(f"{path}: no arrays")
    batched = [k for k in data if k.startswith("b") and ":" in k and k[1:].split(":", 1)[0].isdigit()]
    if not batched:
        n = {len(v) for v in data.values()}
        if len(n) != 1:
            raise ValueError(f"{path}: arrays disagree on the sample count (axis 0): {sorted(n)}")
        return [data], False
    if len(batched) != len(data):
        raise ValueError(f"{path}: mixes b{{i}}:{{name}} keys with plain keys")
    batches: dict[int, dict[str, np.ndarray]] = {}
    for k, v in data.items():
        i, name = k[1:].split(":", 1)
        batches.setdefault(int(i), {})[name] = v
    return [batches[i] for i in sorted(batches)], True


def split_batches(batches: list[dict[str, np.ndarray]], size: int) -> list[dict[str, np.ndarray]]:
    """Each batch cut into batches of at most ``size`` samples (axis 0)."""
    out = []
    for b in batches:
        n = len(next(iter(b.values())))
        out += [{k: np.ascontiguousarray(v[i:i + size]) for k, v in b.items()} for i in range(0, n, size)]
    return out


def _fixed_batch(model_path: str) -> int | None:
    """The batch size the model's inputs fix (dim 0), None when it is dynamic."""
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    dims = {i.type.tensor_type.shape.dim[0].dim_value for i in m.graph.input
            if i.name not in init and i.type.tensor_type.shape.dim}
    return dims.pop() if len(dims) == 1 and 0 not in dims else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


# --------------------------------------------------------------------------------------------
# The tools (run inside the worker)


def _ort(model: str, batches: list[dict[str, np.ndarray]], out: str, setting: str) -> dict:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from trtrepo.cpu import cpu_int8

    s = SETTINGS[setting]
    arm = platform.machine().lower() in ("aarch64", "arm64")
    reduce_range = cpu_int8().saturates

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(batches)

        def get_next(self) -> dict | None:
            return next(self.it, None)

    try:  # imported lazily by quant_pre_process (it pulls in torch): not the tool's work
        import onnxruntime.tools.symbolic_shape_infer  # noqa: F401
    except Exception:
        pass
    extra: dict[str, Any] = {"base_rss_mb": round(status_mb("VmRSS"), 1)}
    with tempfile.TemporaryDirectory(prefix="peers-ort.", dir=Path(out).parent) as tmp:
        t0 = time.perf_counter()
        _STARTED.append(t0)
        pre = str(Path(tmp) / "pre.onnx")
        try:
            quant_pre_process(model, pre)
            src, prep = pre, "ok"
        except Exception as exc:  # documented as optional: quantize the raw model then
            src, prep = model, f"failed: {_one_line(exc)}"
        extra["preprocess_seconds"] = round(time.perf_counter() - t0, 3)
        quantize_static(
            src, out, Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            reduce_range=reduce_range,
            activation_type=QuantType.QInt8 if arm else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, s["method"]),
            op_types_to_quantize=s.get("op_types"),
        )
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "preprocess": prep, "reduce_range": reduce_range,
            "activation_type": "int8" if arm else "uint8", **extra}


def _nncf(model: str, samples: list[dict[str, np.ndarray]], out: str, setting: str, kind: str) -> dict:
    import nncf
    import nncf.onnx.quantization.quantize_model  # noqa: F401  (imported lazily by nncf.quantize)
    import onnx

    preset = {None: None, "mixed": nncf.QuantizationPreset.MIXED,
              "performance": nncf.QuantizationPreset.PERFORMANCE}[SETTINGS[setting]["preset"]]
    base = round(status_mb("VmRSS"), 1)
    t0 = time.perf_counter()
    _STARTED.append(t0)
    proto = onnx.load(model)
    dataset = nncf.Dataset(samples, lambda item: item)  # items are already {input name: array}
    q = nncf.quantize(proto, dataset, preset=preset, subset_size=len(samples),
                      model_type=nncf.ModelType.TRANSFORMER if kind == "transformer" else None)
    large = q.ByteSize() > 2**31 - 2**26
    onnx.save(q, out, save_as_external_data=large, location=Path(out).name + ".data" if large else None)
    return {"seconds": time.perf_counter() - t0, "base_rss_mb": base, "nncf": nncf.__version__}


def _worker(job: dict) -> dict:
    res: dict[str, Any] = {"tool": job["tool"], "setting": job["setting"], "ok": False, "seconds": None,
                           "peak_rss_mb": None, "error": None}
    try:
        batches, explicit = load_calib(job["calib"])
        fixed = _fixed_batch(job["model"])
        if job["tool"] == "ort":
            if fixed or not explicit:
                batches = split_batches(batches, fixed or job["batch_size"])
        else:
            batches = split_batches(batches, fixed or 1)
        res["samples"] = sum(len(next(iter(b.values()))) for b in batches)
        if job["tool"] == "ort":
            res.update(_ort(job["model"], batches, job["out"], job["setting"]))
        else:
            res.update(_nncf(job["model"], batches, job["out"], job["setting"], job["kind"]))
        res["ok"] = True
    except Exception as exc:  # the failure is the result
        res["error"] = _one_line(exc)
        if _STARTED:
            res["seconds"] = time.perf_counter() - _STARTED[-1]
    res["peak_rss_mb"] = round(status_mb("VmHWM"), 1)
    if res["seconds"] is not None:
        res["seconds"] = round(res["seconds"], 3)
    return res


def quantize_peer(tool: str, model: str | Path, calib: str | Path, out: str | Path, *, kind: str = "cnn",
                  setting: str | None = None, batch_size: int = 32, timeout: float = 3600,
                  python: str | None = None) -> dict:
    """Quantize ``model`` with ``tool`` (ort|nncf) and ``setting`` (default per tool, see
    :data:`SETTINGS`) from the calibration ``.npz`` ``calib`` into ``out``, in a fresh
    subprocess of ``python`` (default this interpreter). Returns {"tool", "setting", "ok",
    "seconds", "peak_rss_mb", "error", "samples", "base_rss_mb", ...}."""
    setting = setting or DEFAULT_SETTING[tool]
    if tool not in TOOLS or SETTINGS.get(setting, {}).get("tool") != tool:
        raise ValueError(f"unknown tool/setting {tool}/{setting} (settings: {', '.join(SETTINGS)})")
    if kind not in ("cnn", "transformer"):
        raise ValueError(f"kind must be cnn or transformer, not {kind}")
    job = {"tool": tool, "setting": setting, "kind": kind, "model": str(model), "calib": str(calib),
           "out": str(out), "batch_size": batch_size}
    res = {"tool": tool, "setting": setting, "ok": False, "seconds": None, "peak_rss_mb": None, "error": None}
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "NNCF_CI": "1"}
    try:
        p = subprocess.run([python or sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
                           capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**res, "error": f"timed out after {timeout:.0f}s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    killed = " (killed: out of memory?)" if p.returncode == -9 else ""
    return {**res, "error": f"exit {p.returncode}{killed}: {tail}"}


# --------------------------------------------------------------------------------------------
# Inspecting and timing the results


def optimized_ops(model_path: str | Path, threads: int = 2) -> Counter:
    """Op-type histogram of the graph ONNX Runtime (CPU, ORT_ENABLE_ALL) runs for ``model_path``."""
    import onnx

    from trtrepo.evaluate import make_session

    with tempfile.TemporaryDirectory(prefix="peers-opt.") as tmp:
        opt = Path(tmp) / "opt.onnx"
        make_session(model_path, threads=threads, optimization="all", optimized_path=opt)
        m = onnx.load(str(opt), load_external_data=False)
    return Counter((n.domain or "ai.onnx", n.op_type) for n in m.graph.node)


def is_integer_kernel(domain: str, op_type: str) -> bool:
    """QLinear*/…Integer… in any domain, com.microsoft ops starting with Q (QGemm, QAttention, …,
    not QuickGelu) and DynamicQuantizeMatMul/LSTM; not the bare (De)QuantizeLinear."""
    if op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QuickGelu"):
        return False
    return ("Integer" in op_type or "QLinear" in op_type or op_type in ("DynamicQuantizeMatMul", "DynamicQuantizeLSTM")
            or (domain == "com.microsoft" and op_type.startswith("Q")))


def integer_kernels(model_path: str | Path, threads: int = 2) -> dict[str, int]:
    """{op_type: count} of the integer-kernel nodes in ONNX Runtime's optimized graph, plus
    ``total``."""
    counts: Counter = Counter()
    for (domain, op), n in optimized_ops(model_path, threads).items():
        if is_integer_kernel(domain, op):
            counts[op] += n
    return {**dict(sorted(counts.items())), "total": sum(counts.values())}


def time_models(paths: Mapping[str, str | Path] | Sequence[str | Path], feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                runs: int, threads: int = 2, warmup: int = 3) -> dict[str, dict[str, Any]]:
    """Latency of several models in this process, round-robin: each of ``runs`` rounds runs every
    model once per feed, so background load hits all alike. Sessions as trtrepo's
    (``trtrepo.evaluate.make_session``: CPU EP, ORT_ENABLE_ALL, ``threads`` intra-op threads, one
    inter-op thread, ``session.intra_op.allow_spinning=0``). Returns {name: {"median_ms" (over
    all runs and feeds), "min_ms", "per_feed_median_ms": [...]}}; names are the mapping's keys
    or the paths."""
    from trtrepo.evaluate import make_session

    named = dict(paths) if isinstance(paths, Mapping) else {str(p): p for p in paths}
    feed_list = [feeds] if isinstance(feeds, Mapping) else list(feeds)
    sessions = {k: make_session(p, threads=threads, optimization="all") for k, p in named.items()}
    times = {k: [[] for _ in feed_list] for k in named}
    for r in range(warmup + runs):
        for j, feed in enumerate(feed_list):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, feed)
                if r >= warmup:
                    times[k][j].append(time.perf_counter() - t)
    out = {}
    for k, per_feed in times.items():
        flat = np.concatenate([np.asarray(t) for t in per_feed]) * 1e3
        out[k] = {"median_ms": float(np.median(flat)), "min_ms": float(flat.min()),
                  "per_feed_median_ms": [float(np.median(t) * 1e3) for t in per_feed]}
    return out


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(RESULT_TAG + json.dumps(_worker(json.loads(argv[1]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", choices=TOOLS, required=True)
    ap.add_argument("--model", required=True, help="FP32 ONNX model")
    ap.add_argument("--calib", required=True, help=".npz: {input name: array} or {b<i>:<input name>: batch}")
    ap.add_argument("--out", required=True, help="quantized ONNX model to write")
    ap.add_argument("--kind", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--setting", choices=list(SETTINGS), help="default: ort-qdq-minmax / nncf")
    ap.add_argument("--batch-size", type=int, default=32, help="ONNX Runtime calibration batch for full arrays")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--kernels", action="store_true", help="add the output's integer kernels (ONNX Runtime CPU)")
    a = ap.parse_args(argv)
    res = quantize_peer(a.tool, a.model, a.calib, a.out, kind=a.kind, setting=a.setting,
                        batch_size=a.batch_size, timeout=a.timeout)
    if a.kernels and res["ok"]:
        res["kernels"] = integer_kernels(a.out)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
