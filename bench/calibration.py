"""Benchmark: trtrepo's streamed calibration (collection + entropy) against ONNX Runtime's
calibrator (``create_calibrator(..., CalibrationMethod.Entropy)`` + ``collect_data`` +
``compute_data``, what ``quantize_static`` runs) on the demo model and ``demo:calib`` data.

Each measurement runs in a fresh subprocess so that its peak RSS (``VmHWM``) is its own.
Reported per run: samples/s over the calibration itself (data already in memory, model already
exported), peak RSS of the process, and the growth of RSS during calibration (peak minus the
RSS measured just before it started). Both sides use the same tensors (trtrepo's op types),
the same batches and the same in-memory data.

    python bench/calibration.py [--samples 128 512 2048] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import status_mb


def _rss_mb() -> float:
    return status_mb("VmRSS")


def _peak_mb() -> float:
    # VmHWM belongs to this process image. ru_maxrss would not do: Linux carries the parent's
    # peak across fork + exec, so every worker would report the parent's (torch-sized) peak.
    hwm = status_mb("VmHWM")
    return hwm if hwm == hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(impl: str, model: str, samples: int, batch_size: int) -> dict:
    import numpy as np

    from trtrepo.calibrate import CALIBRATED_OPS, Calibrator
    from trtrepo.data import ArraySource
    from trtrepo.demo import split_tensors

    x = np.ascontiguousarray(split_tensors("calib")[0][:samples])
    if len(x) < samples:  # more than demo:calib holds: repeat it
        x = np.concatenate([x] * (samples // len(x) + 1))[:samples]
    if impl == "ort":
        from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(range(0, samples, batch_size))

            def get_next(self) -> dict | None:
                i = next(self.it, None)
                return None if i is None else {"input": x[i : i + batch_size]}

    base = _rss_mb()
    start = time.perf_counter()
    if impl == "trtrepo":
        cal = Calibrator(model, ArraySource("bench", {"input": x}), batch_size=batch_size, progress=False)
        ranges = cal.collect().compute("entropy")
        n_tensors = len(ranges)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            cal = create_calibrator(model, op_types_to_calibrate=sorted(CALIBRATED_OPS),
                                    augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                    calibrate_method=CalibrationMethod.Entropy)
            cal.collect_data(Reader())
            n_tensors = len(list(cal.compute_data().keys()))
    took = time.perf_counter() - start
    return {"impl": impl, "samples": samples, "seconds": took, "samples_per_s": samples / took,
            "peak_rss_mb": _peak_mb(), "rss_growth_mb": _peak_mb() - base, "tensors": n_tensors}


def run_one(impl: str, model: str, samples: int, batch_size: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, "--model", model, "--samples", str(samples),
           "--batch-size", str(batch_size)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--worker", choices=["trtrepo", "ort"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, args.samples[0], args.batch_size)))
        return

    from trtrepo.export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "demo.onnx")
        export_onnx("demo", model)
        rows = []
        for n in args.samples:
            ours = run_one("trtrepo", model, n, args.batch_size)
            ort = run_one("ort", model, n, args.batch_size)
            rows.append((n, ours, ort))
            print(f"# {n}: trtrepo {ours['samples_per_s']:.0f}/s {ours['peak_rss_mb']:.0f} MB | "
                  f"ORT {ort['samples_per_s']:.0f}/s {ort['peak_rss_mb']:.0f} MB", file=sys.stderr)

    import onnxruntime

    from trtrepo.cpu import cpu_int8

    print(f"Demo CNN, {rows[0][1]['tensors']} calibrated tensors, batch {args.batch_size}, entropy; "
          f"{os.cpu_count()} CPU cores ({cpu_int8().model or 'CPU model unknown'}); Python {sys.version.split()[0]}; "
          f"ONNX Runtime {onnxruntime.__version__}; load average {os.getloadavg()[0]:.1f} at the end.\n")
    print("| samples | trtrepo samples/s | ORT samples/s | throughput ratio | trtrepo peak RSS MB (growth) "
          "| ORT peak RSS MB (growth) | peak ratio ORT/trtrepo |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, a, b in rows:
        print(f"| {n} | {a['samples_per_s']:.0f} | {b['samples_per_s']:.0f} | {a['samples_per_s'] / b['samples_per_s']:.1f}x "
              f"| {a['peak_rss_mb']:.0f} ({a['rss_growth_mb']:+.0f}) | {b['peak_rss_mb']:.0f} ({b['rss_growth_mb']:+.0f}) "
              f"| {b['peak_rss_mb'] / a['peak_rss_mb']:.1f}x |")


if __name__ == "__main__":
    main()
