"""Issue 43 on the trained YOLO11n (the detection part of Ultralytics' COCO yolo11n-seg, fetched and
exported at test time by scripts/yolo_export.sh; AGPL weights, never committed), long tier:

* the decode head of the real export is found from the graph (dynamic batch and batch 1);
* the detection gate passes the FP16 copy and refuses the naive placement (ONNX Runtime's
  ``quantize_static`` with Q/DQ on the head: one INT8 scale over the box/score concat);
* the batch-1 export (Ultralytics' default) quantizes end to end at its batch.

Real photographs: scikit-image's and the Ultralytics wheel's, letterboxed to 640x640."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtrepo.evaluate import Detector, compare_outputs, make_session
from trtrepo.fp16 import convert_to_fp16
from trtrepo.qdq import detector_outputs, find_decode_heads, prepare_model
from trtrepo.qdq.graph import GraphView
from trtrepo.quantize import AccuracyCheck
from trtrepo.quantize.gate import DETECTION_RULE

pytestmark = pytest.mark.long



def _letterbox(img: np.ndarray, size: int = 640) -> np.ndarray:
    from PIL import Image

    h, w = img.shape[:2]
    r = min(size / h, size / w)
    nh, nw = int(round(h * r)), int(round(w * r))
    out = np.full((size, size, 3), 114, np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    out[top:top + nh, left:left + nw] = np.asarray(Image.fromarray(img).resize((nw, nh), Image.BILINEAR))
    return out.transpose(2, 0, 1).astype(np.float32) / 255.0


def _photos(yolo: Path) -> tuple[np.ndarray, np.ndarray]:
    """(calibration images: scikit-image's; held-out images: the Ultralytics wheel's bus and zidane
    and scikit-image's astronaut and chelsea, each also mirrored)."""
    import skimage.data as d
    from PIL import Image

    calib = [_letterbox(getattr(d, n)()[..., :3]) for n in ("coffee", "rocket")]
    calib += [_letterbox(np.stack([d.camera()] * 3, -1))]
    with zipfile.ZipFile(next((yolo / "wheels").glob("ultralytics-*.whl"))) as z:
        held = [np.asarray(Image.open(io.BytesIO(z.read(f"ultralytics/assets/{n}.jpg"))).convert("RGB"))
                for n in ("bus", "zidane")]
    held += [d.astronaut(), d.chelsea()]
    held_out = [_letterbox(np.ascontiguousarray(im[:, ::k])) for im in held for k in (1, -1)]
    return np.stack(calib * 4), np.stack(held_out)


def _run(model, x: np.ndarray) -> np.ndarray:
    s = make_session(model)
    return np.concatenate([s.run(None, {"images": x[i:i + 1]})[0] for i in range(len(x))])


def test_the_real_decode_head_is_found_in_both_exports(yolo):
    for name in ("yolo11n_dyn.onnx", "yolo11n_b1.onnx"):
        model = onnx.load(str(yolo / name))
        assert detector_outputs(model) == {"output0": 80}  # the exporter's class names
        view = GraphView(prepare_model(model))
        (head,) = find_decode_heads(view)
        ops = {n.op_type for n in view.nodes if n.name in head.nodes}
        assert {"Softmax", "Sigmoid", "Concat", "Conv", "Sub", "Add", "Mul", "Div"} <= ops, (name, ops)
        feature = [n for n in view.nodes if n.op_type == "Conv" and n.name not in head.nodes]
        assert len(feature) > 80  # the backbone, neck and the head's last convolutions stay INT8


def test_the_real_exports_stem_is_its_two_strided_convolutions(yolo):
    """The onnxruntime target keeps the image stem float: YOLO11's two stride-2 Conv + SiLU, not the
    first block's stride-1 convolution behind them (``image_stem_nodes``)."""
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.qdq.rules import image_stem_nodes

    for name in ("yolo11n_dyn.onnx", "yolo11n_b1.onnx"):
        view = GraphView(prepare_model(onnx.load(str(yolo / name))))
        ops = {n.name: n.op_type for n in view.nodes}
        convs = [n for n in image_stem_nodes(view, QuantizeOptions(target="onnxruntime")) if ops[n] == "Conv"]
        assert convs == ["/model.0/conv/Conv", "/model.1/conv/Conv"], (name, convs)


def test_the_gate_passes_the_fp16_copy_and_refuses_the_naive_placement(yolo, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    calib, held = _photos(yolo)
    fp32 = onnx.load(str(yolo / "yolo11n_dyn.onnx"))
    ref = _run(fp32, held)
    detectors = {"output0": Detector.of(ref, 80)}

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [{"images": calib[i:i + 1]} for i in range(len(calib))]

        def get_next(self):
            return self.left.pop() if self.left else None

    naive = tmp_path / "naive.onnx"
    quantize_static(str(yolo / "yolo11n_dyn.onnx"), str(naive), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    check = AccuracyCheck()
    verdicts = {}
    for name, model in (("fp16", convert_to_fp16(fp32)), ("naive", onnx.load(str(naive)))):
        metrics = compare_outputs({"output0": ref}, {"output0": _run(model, held)}, detection=detectors)
        verdicts[name] = check.judge(metrics["output0"])
    assert all(v["rule"] == DETECTION_RULE for v in verdicts.values())
    assert verdicts["fp16"]["ok"] is True and verdicts["fp16"]["value"] >= 0.95, verdicts["fp16"]["message"]
    assert verdicts["naive"]["ok"] is False and verdicts["naive"]["inconclusive"] is False
    assert verdicts["naive"]["value"] < 0.5, verdicts["naive"]["message"]


def _quantize(yolo, tmp_path, run_cli, model: str, out, *args):
    """``trtrepo quantize`` of one of the exports on the photographs (:func:`_photos`) saved as .npy."""
    calib, held = _photos(yolo)
    np.save(tmp_path / "calib.npy", calib)
    np.save(tmp_path / "held.npy", held)
    return run_cli("quantize", yolo / model, "-o", out, "--data", tmp_path / "calib.npy", "--eval-data",
                   tmp_path / "held.npy", "--target", "onnxruntime", "--method", "minmax", "--weight-rounding", "nearest",
                   "--no-progress", *args)


def test_the_batch_1_export_quantizes_at_its_batch(yolo, tmp_path, run_cli):
    out = tmp_path / "q.onnx"
    res = _quantize(yolo, tmp_path, run_cli, "yolo11n_b1.onnx", out, "--accept-accuracy-loss")
    assert res.exit_code == 0, res.output + res.stderr
    assert "mAP50-95 vs FP32" in res.output and "decode head" in res.output
    q = onnx.load(str(out))
    assert [d.dim_value for d in q.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 640, 640]


def test_trtrepos_own_naive_placement_is_refused_by_its_gate(yolo, tmp_path, run_cli):
    """--quantize-detector-head on the real export: Q/DQ on the box/score concat too (one INT8 scale over
    box pixels and class probabilities); the gate measures it and quantize writes nothing (exit 1)."""
    out = tmp_path / "naive.onnx"
    res = _quantize(yolo, tmp_path, run_cli, "yolo11n_dyn.onnx", out, "--quantize-detector-head")
    assert res.exit_code == 1, res.output + res.stderr
    assert "INT8 fails the held-out check vs FP32: output 'output0': mAP50-95 vs FP32 0.000" in res.stderr, res.stderr
    assert not out.exists()
