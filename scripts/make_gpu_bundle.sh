#!/usr/bin/env bash
# Builds gpu_bundle/ (git-ignored, about 45 MB) for scripts/gpu_check.sh: the Triton server from the
# nvidia-pytriton wheel trimmed to bin, caches, the Python backend and its 3.12 stub (without the
# bundled libpython3.13), and cp312 wheels of numpy 1.26.4, tritonclient and python-rapidjson
# (pytest for bench/measurement.py, which imports the independent client of tests/test_validate.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_tritonserver.sh >/dev/null
mkdir -p gpu_bundle/wheels
(cd .triton/pyt && tar -cJf ../../gpu_bundle/triton.tar.xz --exclude='libpython3-*' --exclude='__pycache__' \
  pytriton/tritonserver/bin pytriton/tritonserver/caches pytriton/tritonserver/backends/python \
  pytriton/tritonserver/python_backend_stubs/3.12 nvidia_pytriton.libs)
pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d gpu_bundle/wheels \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  numpy==1.26.4 tritonclient==2.73.0 python-rapidjson==1.25 pytest==8.3.4 pluggy==1.5.0 iniconfig==2.0.0
du -sh gpu_bundle
