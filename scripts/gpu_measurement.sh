#!/usr/bin/env bash
# Runs on the lent GPU machine (16 CPU cores): bench/measurement.py on the demo CNN, FP32 ONNX in
# the Python backend on the CPU, as on the 2-core machines here: validate's throughput run to run
# and against the independent synchronous client of tests/test_validate.py, with the in-process
# ONNX Runtime probe of the machine's own speed. Needs gpu_bundle/ (scripts/make_gpu_bundle.sh).
# Results: $OUT/measurement.json and measurement.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
export TRTREPO_BENCH_PYTHON_ENV=$W/pyenv
nproc > "$OUTDIR/cpu.txt"; grep -m1 "model name" /proc/cpuinfo >> "$OUTDIR/cpu.txt"
"$PY" -P bench/measurement.py --models demo --rounds "${ROUNDS:-5}" --json "$OUTDIR/measurement.json" \
  > "$OUTDIR/measurement.md" 2> "$OUTDIR/measurement.log"
cat "$OUTDIR/measurement.md"
