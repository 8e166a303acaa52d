"""Issue 43 item 1: ``deploy DETECTOR.onnx --data photos/ --ensemble``: a detector exported with its
input size (Ultralytics' metadata: task, imgsz, names) calibrates on an image folder through its own
letterbox and is written with its preprocessing, NMS postprocessing and ensemble (the real CLI and
ONNX Runtime; the served boxes are checked against local ones in tests/test_detector_ensemble.py)."""

from __future__ import annotations

import numpy as np
import onnx
from PIL import Image
from test_detector_head import SIZE, AnchorFree, _export


def _ultralytics_like(tmp_path):
    model = _export(AnchorFree(), tmp_path / "det.onnx")
    for key, value in (("task", "detect"), ("imgsz", f"[{SIZE}, {SIZE}]"), ("names", "{0: 'a', 1: 'b', 2: 'c'}")):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(tmp_path / "det.onnx"))
    return tmp_path / "det.onnx"


def test_a_detector_deploys_from_photos_with_its_letterbox_and_an_nms_ensemble(tmp_path, run_cli):
    import skimage.data as d

    model = _ultralytics_like(tmp_path)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i, name in enumerate(["astronaut", "coffee", "chelsea", "rocket"] * 10):
        img = getattr(d, name)()[..., :3]
        h, w = img.shape[:2]
        y, x = rng.integers(0, h // 3), rng.integers(0, w // 3)
        Image.fromarray(img[y:y + 2 * h // 3, x:x + 2 * w // 3]).save(photos / f"{i:02d}.jpg")
    res = run_cli("deploy", model, "--name", "det", "--repo", tmp_path / "repo", "--data", photos, "--backend", "python",
                  "--ensemble", "--method", "minmax", "--weight-rounding", "nearest", "--accept-accuracy-loss")
    assert res.exit_code == 0, res.output + res.stderr
    assert "mAP50-95 vs FP32" in res.output  # judged in boxes
    repo = tmp_path / "repo"
    assert sorted(p.name for p in repo.iterdir() if p.is_dir()) == ["det", "det_ensemble", "det_postprocess",
                                                                      "det_preprocess"]
    post = (repo / "det_postprocess" / "config.pbtxt").read_text()
    assert 'key: "iou"' in post and 'key: "num_classes"' in post and 'string_value: "3"' in post
    pre = (repo / "det_preprocess" / "1" / "preprocess.json").read_text()
    assert '"letterbox"' in pre and f"{SIZE}" in pre
