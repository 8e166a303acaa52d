#!/usr/bin/env bash
# Install a real Triton Inference Server (2.51.0, Python backend only) for CPU-only machines.
#
# The server ships inside the nvidia-pytriton 0.7.0 wheel. This script, idempotently:
#   1. downloads the wheel with `pip download --no-deps` (or reuses a local copy: $PYTRITON_WHEEL,
#      .triton/wheel/, /tmp/pyt/),
#   2. unpacks the server into .triton/ (git-ignored) and copies the Python 3.11 backend stub
#      into backends/python,
#   3. creates .triton/pyenv, a venv with numpy<2, onnxruntime and pillow: the stub is built
#      against numpy 1.x; trtrepo's TritonServer (serve, tests, benches) puts its bin first on
#      the server's PATH, so generated configs need no EXECUTION_ENV_PATH of this machine,
#   4. writes .triton/bin/tritonserver, a wrapper that sets LD_LIBRARY_PATH and --backend-directory.
#
# Use it with:  export TRTREPO_TRITONSERVER=$PWD/.triton/bin/tritonserver   (trtrepo serve and the
# tests also find .triton/bin/tritonserver in the repository root without the variable).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DEST="${TRTREPO_TRITON_DIR:-$ROOT/.triton}"
VERSION=0.7.0
WHEEL_NAME="nvidia_pytriton-${VERSION}-py3-none-manylinux_2_35_x86_64.whl"
PY="${TRTREPO_STUB_PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in /usr/bin/python3.11 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY="$(command -v "$cand")"; break; fi
  done
fi
if [ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "3.11" ]; then
  echo "install_tritonserver: the bundled Python backend stub needs Python 3.11 (found $PY)" >&2
  exit 1
fi

mkdir -p "$DEST/wheel"
WHEEL=""
for cand in "${PYTRITON_WHEEL:-}" "$DEST/wheel/$WHEEL_NAME" "/tmp/pyt/$WHEEL_NAME"; do
  if [ -n "$cand" ] && [ -f "$cand" ]; then WHEEL="$cand"; break; fi
done
if [ -z "$WHEEL" ]; then
  echo "install_tritonserver: downloading nvidia-pytriton==$VERSION (55 MB)"
  "$PY" -m pip download -q --no-deps "nvidia-pytriton==$VERSION" --only-binary=:all: \
    --platform manylinux_2_35_x86_64 --python-version 3.11 -d "$DEST/wheel"
  WHEEL="$DEST/wheel/$WHEEL_NAME"
fi

SERVER="$DEST/pyt/pytriton/tritonserver"
if [ ! -x "$SERVER/bin/tritonserver" ] || [ ! -f "$DEST/pyt/.complete" ]; then
  echo "install_tritonserver: unpacking $WHEEL"
  rm -rf "$DEST/pyt" "$DEST/pyt.tmp"
  "$PY" - "$WHEEL" "$DEST/pyt.tmp" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    members = [m for m in z.namelist()
               if m.startswith(("pytriton/tritonserver/", "nvidia_pytriton.libs/"))]
    z.extractall(sys.argv[2], members)
EOF
  mv "$DEST/pyt.tmp" "$DEST/pyt"
  chmod +x "$SERVER/bin/tritonserver" "$SERVER/python_backend_stubs/3.11/triton_python_backend_stub"
  touch "$DEST/pyt/.complete"
fi
cp "$SERVER/python_backend_stubs/3.11/triton_python_backend_stub" "$SERVER/backends/python/"
chmod +x "$SERVER/backends/python/triton_python_backend_stub"

# The execution environment of Python-backend models (numpy 1.x for the stub).
if [ ! -f "$DEST/pyenv/.complete" ]; then
  echo "install_tritonserver: creating $DEST/pyenv (numpy<2, onnxruntime, pillow)"
  rm -rf "$DEST/pyenv"
  "$PY" -m venv "$DEST/pyenv"
  "$DEST/pyenv/bin/python" -m pip install -q --disable-pip-version-check "numpy<2" onnxruntime pillow
  "$DEST/pyenv/bin/python" -c "import numpy, onnxruntime, PIL; assert numpy.__version__ < '2'"
  touch "$DEST/pyenv/.complete"
fi

source scripts/tritonserver_wrapper.sh
write_tritonserver_wrapper "$DEST/bin/tritonserver" "$SERVER" "$DEST/pyt/nvidia_pytriton.libs"

# Smoke test: the binary starts and resolves its libraries (--help exits 1 after printing usage).
usage="$("$DEST/bin/tritonserver" --help 2>&1 || true)"
if [[ "$usage" != *"Usage: tritonserver"* ]]; then
  echo "install_tritonserver: $DEST/bin/tritonserver does not start" >&2
  exit 1
fi
echo "tritonserver: $DEST/bin/tritonserver"
echo "python backend env (put first on the server's PATH by trtrepo serve): $DEST/pyenv"
echo "use it with: export TRTREPO_TRITONSERVER=$DEST/bin/tritonserver"
