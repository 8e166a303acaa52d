#!/usr/bin/env bash
# Sourced by the GPU machine's scripts (gpu_check.sh, gpu_measurement.sh): unpacks gpu_bundle/
# (made by scripts/make_gpu_bundle.sh here) into $W and sets TRTREPO_TRITONSERVER, PY (the
# machine's torch venv), PYTHONPATH (tritonclient + this checkout packaged) and OUTDIR.
B=$PWD/gpu_bundle; W=/tmp/trtrepo-gpu; OUTDIR=${OUT:-/tmp/trtrepo-gpu-out}
PY=/opt/torch/.venv/bin/python
rm -rf "$W"; mkdir -p "$W" "$OUTDIR"
tar -xJf "$B/triton.tar.xz" -C "$W"
S=$W/pytriton/tritonserver
cp "$S/python_backend_stubs/3.12/triton_python_backend_stub" "$S/backends/python/"
source scripts/tritonserver_wrapper.sh
write_tritonserver_wrapper "$W/bin/tritonserver" "$S" "$W/nvidia_pytriton.libs"
export TRTREPO_TRITONSERVER=$W/bin/tritonserver

# The Python backend's environment: numpy 1.26 first, then the machine's packages (onnxruntime).
base=$(ls /usr/bin/python3.12 2>/dev/null || echo $PY)
"$base" -m venv "$W/pyenv"
"$W/pyenv/bin/python" -m pip install -q --no-index "$B"/wheels/numpy-1.26.4-*.whl
site=$("$W/pyenv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "/opt/torch/.venv/lib/python3.12/site-packages" > "$site/zz_torch_venv.pth"
"$W/pyenv/bin/python" -c "import numpy, onnxruntime; print('backend env: numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)"

# trtrepo's client side: tritonclient (+ rapidjson) beside the machine's packages.
"$PY" -m pip install -q --no-index --no-deps --target "$W/client" "$B"/wheels/tritonclient-*.whl "$B"/wheels/python_rapidjson-*.whl \
  "$B"/wheels/pytest-*.whl "$B"/wheels/pluggy-*.whl "$B"/wheels/iniconfig-*.whl
# trtrepo from this checkout as a package (templates/ is packaged as trtrepo.templates)
mkdir -p "$W/pkg" && cp -r trtrepo "$W/pkg/" && rm -rf "$W/pkg/trtrepo/templates" && cp -r templates "$W/pkg/trtrepo/templates"
export PYTHONPATH=$W/client:$W/pkg
