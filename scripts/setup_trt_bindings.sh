#!/usr/bin/env bash
# Real TensorRT Python bindings (10.13 and 11.4) on a machine without TensorRT, for the API
# conformance tests (tests/test_build_conformance.py). Idempotent; everything goes into
# .trt-bindings/ (git-ignored):
#
#   .trt-bindings/<major>/site/tensorrt_bindings/   the real binding package from the wheel
#   .trt-bindings/<major>/lib/libnvinfer.so.<major>  stub libraries exporting the nine symbols
#   .trt-bindings/<major>/lib/libnvonnxparser.so.<major>   the extension module needs (each
#   .trt-bindings/<major>/lib/libnvinfer_plugin.so.<major> returns 0: nothing can be built)
#
# Use: LD_LIBRARY_PATH=.trt-bindings/11/lib PYTHONPATH=.trt-bindings/11/site python -c 'import tensorrt_bindings'
# Needs: python (the one that runs the tests; picks the wheel for its version), pip, gcc, unzip-free (python -m zipfile).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
DEST="${TRT_BINDINGS_DIR:-.trt-bindings}"

# major -> wheel requirement (see ../shared/docs/environment.md)
declare -A WHEELS=(
  [10]="tensorrt-cu12-bindings==10.13.3.9"
  [11]="tensorrt-cu13-bindings==11.4.0.106"
)

build_stubs() {  # $1 = major, $2 = lib dir
  local n="$1" lib="$2" src
  src="$(mktemp -d)"
  cat >"$src/nvinfer.c" <<'C'
void *createInferBuilder_INTERNAL(void *logger, int version) { (void)logger; (void)version; return 0; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) { (void)engine; (void)logger; (void)version; return 0; }
void *createInferRuntime_INTERNAL(void *logger, int version) { (void)logger; (void)version; return 0; }
void *getBuilderPluginRegistry(int capability) { (void)capability; return 0; }
void *getPluginRegistry(void) { return 0; }
C
  cat >"$src/nvonnxparser.c" <<'C'
void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) { (void)network; (void)logger; (void)version; return 0; }
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) { (void)refitter; (void)logger; (void)version; return 0; }
int getNvOnnxParserVersion(void) { return 0; }
C
  cat >"$src/nvinfer_plugin.c" <<'C'
int initLibNvInferPlugins(void *logger, const char *ns) { (void)logger; (void)ns; return 0; }
C
  for name in nvinfer nvonnxparser nvinfer_plugin; do
    gcc -shared -fPIC -O0 -Wl,-soname,"lib${name}.so.${n}" -o "$lib/lib${name}.so.${n}" "$src/${name}.c"
  done
  rm -rf "$src"
}

for n in "${!WHEELS[@]}"; do
  req="${WHEELS[$n]}"
  root="$DEST/$n"
  stamp="$root/.complete"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$req" ]; then
    echo "TensorRT $n bindings: already set up in $root ($req)"
    continue
  fi
  rm -rf "$root"
  mkdir -p "$root/wheel" "$root/site" "$root/lib"
  "$PY" -m pip download -q --no-deps --only-binary=:all: "$req" -d "$root/wheel"
  whl="$(ls "$root"/wheel/*.whl)"
  "$PY" -m zipfile -e "$whl" "$root/site"
  build_stubs "$n" "$root/lib"
  # Import check in a fresh process (the two versions cannot share one process).
  LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$root/site" \
    "$PY" -c 'import tensorrt_bindings as t; print("TensorRT", t.__version__, "bindings import")'
  echo "$req" >"$stamp"
done
