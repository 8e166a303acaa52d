#!/usr/bin/env bash
# GPU smoke test of 'trtrepo build' for a machine with an NVIDIA GPU, TensorRT (10.x or 11.x) and cuda-python:
# builds the demo engine from the Q/DQ model, runs it with TensorRT's runtime on demo:val and compares it with
# ONNX Runtime's FP32 and INT8 outputs (tests/test_build_gpu.py; on TensorRT 10 also the legacy calibrator).
#
# NOT RUN in this project: none of its machines (CI, development, the lent GPU machine) has TensorRT.
# Everything TensorRT-facing is checked here only against the real Python bindings (tests/test_build_conformance.py).
#
# Use: bash scripts/gpu_smoke.sh            (from a checkout with trtrepo installed: pip install -e '.[test,tensorrt]')
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -m trtrepo.cli doctor
"$PY" - <<'PYEOF'
import sys
from trtrepo.engine import gpu_status, tensorrt_status
t, g = tensorrt_status(), gpu_status()
if not (t.available and g.available):
    sys.exit(f"gpu_smoke: needs TensorRT ({t.detail}) and a GPU ({g.detail})")
PYEOF
exec "$PY" -m pytest -q -rs -s -m tensorrt tests/test_build_gpu.py "$@"
