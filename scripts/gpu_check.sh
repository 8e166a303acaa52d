#!/usr/bin/env bash
# Runs on the lent GPU machine (H100/H200, /opt/torch/.venv with torch + CUDA, no network, no TensorRT):
# serves the demo with the real Triton server (Python backend, KIND_GPU instance) and runs
# `trtrepo validate` with CUDA shared memory and the PyTorch reference on CUDA.
# Needs gpu_bundle/ (made by scripts/make_gpu_bundle.sh here): the trimmed server (triton.tar.xz),
# numpy 1.26.4 (the backend stub's numpy), tritonclient and python-rapidjson wheels for cp312.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
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
