#!/usr/bin/env bash
# Runs on the lent GPU machine (H100/H200, /opt/torch/.venv with torch + CUDA, no network, no TensorRT):
# serves the demo with the real Triton server (Python backend, KIND_GPU instance) and runs
# `trtrepo validate` with CUDA shared memory and the PyTorch reference on CUDA.
# Needs gpu_bundle/ (made by scripts/make_gpu_bundle.sh here): the trimmed server (triton.tar.xz),
# numpy 1.26.4 (the backend stub's numpy), tritonclient and python-rapidjson wheels for cp312.
set -euo pipefail
cd "$(dirname "$0")/.."
B=$PWD/gpu_bundle; W=/tmp/trtrepo-gpu; OUTDIR=${OUT:-/tmp/trtrepo-gpu-out}
PY=/opt/torch/.venv/bin/python
rm -rf "$W"; mkdir -p "$W" "$OUTDIR"
tar -xJf "$B/triton.tar.xz" -C "$W"
S=$W/pytriton/tritonserver
cp "$S/python_backend_stubs/3.12/triton_python_backend_stub" "$S/backends/python/"
mkdir -p "$W/bin"
cat > "$W/bin/tritonserver" <<EOS
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$W/nvidia_pytriton.libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$S/bin/tritonserver" --backend-directory="$S/backends" "\$@"
EOS
chmod +x "$W/bin/tritonserver"
export TRTREPO_TRITONSERVER=$W/bin/tritonserver

# The Python backend's environment: numpy 1.26 first, then the machine's packages (onnxruntime).
base=$(ls /usr/bin/python3.12 2>/dev/null || echo $PY)
"$base" -m venv "$W/pyenv"
"$W/pyenv/bin/python" -m pip install -q --no-index "$B"/wheels/numpy-1.26.4-*.whl
site=$("$W/pyenv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "/opt/torch/.venv/lib/python3.12/site-packages" > "$site/zz_torch_venv.pth"
"$W/pyenv/bin/python" -c "import numpy, onnxruntime; print('backend env: numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)"

# trtrepo's client side: tritonclient (+ rapidjson) beside the machine's packages.
"$PY" -m pip install -q --no-index --no-deps --target "$W/client" "$B"/wheels/tritonclient-*.whl "$B"/wheels/python_rapidjson-*.whl
# trtrepo from this checkout as a package (templates/ is packaged as trtrepo.templates)
mkdir -p "$W/pkg" && cp -r trtrepo "$W/pkg/" && rm -rf "$W/pkg/trtrepo/templates" && cp -r templates "$W/pkg/trtrepo/templates"
export PYTHONPATH=$W/client:$W/pkg
T="$PY -P -m trtrepo.cli"   # -P: not the checkout on sys.path, the packaged copy
$T doctor | tee "$OUTDIR/doctor.txt"

$T deploy demo --repo "$W/repo" --backend python --instance-kind gpu --python-env "$W/pyenv" --limit 512 --workdir "$W/work" | tee "$OUTDIR/deploy.txt"
$T deploy demo-text --repo "$W/repo" --backend python --instance-kind gpu --python-env "$W/pyenv" --limit 512 --workdir "$W/work-text" | tee "$OUTDIR/deploy-text.txt"
grep -n "KIND_GPU" "$W/repo/demo/config.pbtxt"

$T serve "$W/repo" --http-port 18000 --grpc-port 18001 --metrics-port 18002 --timeout 180 > "$OUTDIR/serve.log" 2>&1 &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true; sleep 3' EXIT
rc=0
$T validate --url 127.0.0.1:18001 --model demo --reference demo --data demo:val --concurrency 1,4,16 --requests 300 \
  --shared-memory cuda --reference-device cuda --max-top1-drop 1.0 --ready-timeout 180 --no-progress \
  --report "$OUTDIR/demo-cuda-shm" || rc=$?
echo "validate demo (cuda shm) rc=$rc"
$T validate --url 127.0.0.1:18001 --model demo --reference demo --data demo:val --concurrency 1,4,16 --requests 300 \
  --shared-memory none --reference-device cuda --max-top1-drop 1.0 --ready-timeout 60 --no-progress \
  --report "$OUTDIR/demo-no-shm" || rc=$?
echo "validate demo (no shm) rc=$rc"
$T validate --url 127.0.0.1:18001 --model demo_text --reference demo-text --data demo-text:val --concurrency 1,4 --requests 200 \
  --shared-memory cuda --reference-device cuda --ready-timeout 60 --no-progress \
  --report "$OUTDIR/text-cuda-shm" || rc=$?
echo "validate demo-text (cuda shm) rc=$rc"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUTDIR/gpu.txt"
exit $rc
