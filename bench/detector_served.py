"""Issue 43: the YOLO11n detector ensemble served by the real tritonserver (image bytes in; letterbox,
the model, decode + NMS in Triton), judged by ``trtrepo validate`` against the local run of a
reference on the Ultralytics wheel's ``bus.jpg`` and ``zidane.jpg``: mAP50-95 vs the reference,
box counts, end-to-end latency per concurrency level.

* ``fp32``: ``deploy --ensemble --precision fp32``, reference the FP32 export (the serving alone);
* ``int8``: the same ensemble around the INT8 file bench/detector.py's ``deploy`` shipped (its
  ``--work`` folder), judged against the FP32 export and against that INT8 file run locally.

    python bench/detector_served.py [--work /tmp/trtrepo-detector] [--out docs/gauntlet/detector_served.json]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from detector import deployed_model

from trtrepo.server import TritonServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=Path("/work/gauntlet-cache/yolo11n"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/trtrepo-detector"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "gauntlet" / "detector_served.json")
    args = ap.parse_args()
    work = args.work / "served"
    shutil.rmtree(work, ignore_errors=True)
    (work / "photos").mkdir(parents=True)
    with zipfile.ZipFile(next((args.cache / "wheels").glob("ultralytics-*.whl"))) as z:
        for name in ("bus.jpg", "zidane.jpg"):
            (work / "photos" / name).write_bytes(z.read(f"ultralytics/assets/{name}"))
    fp32, int8 = args.cache / "yolo11n_dyn.onnx", deployed_model(args.work)
    cli = [sys.executable, "-m", "trtrepo.cli"]
    results: dict[str, dict] = {}
    for label, model in (("fp32", fp32), ("int8", int8)):
        dep = subprocess.run([*cli, "deploy", str(model), "--name", label, "--repo", str(work / "repo"), "--data", str(work / "photos"),
                              "--backend", "python", "--ensemble", *(["--precision", "fp32"] if label == "fp32" else []), "--json"],
                             capture_output=True, text=True)  # a Q/DQ file is deployed as it is
        if dep.returncode:
            raise SystemExit(f"deploy {label}: {dep.stderr.strip()[-500:]}")
    with TritonServer(work / "repo", timeout=300.0) as server:
        for label, ref in (("fp32", fp32), ("int8", fp32), ("int8 vs its file", int8)):
            report = work / label.replace(" ", "_")
            t0 = time.perf_counter()
            r = subprocess.run([*cli, "validate", "--url", server.grpc_url, "--model", f"{label.split()[0]}_ensemble",
                                "--reference", str(ref), "--data", str(work / "photos"), "--concurrency", "1,2",
                                "--no-reference-speed", "--report", str(report), "--no-progress"], capture_output=True, text=True)
            data = json.loads((report / "validate.json").read_text())
            det = data["detection"]
            results[label] = {"rc": r.returncode, "seconds": time.perf_counter() - t0, "figures": det["figures"],
                              "per_image": det["per_image"], "latency": data["latency"]["levels"], "console": r.stdout[-3000:]}
            print(label, r.returncode, {k: det["figures"].get(k) for k in ("map50_95", "map50", "count_agreement")}, flush=True)
    from trtrepo.cpu import cpu_int8

    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_int8().describe(),
                                    "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
