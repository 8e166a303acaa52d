"""ONNX Runtime placement of a CNN's data-movement ops and a detector's float head (issue 43 speed):

* the outputs of Split, MaxPool and nearest Resize take their input's scale and zero point
  (``QdqPlan.tied``), so that ONNX Runtime runs them on uint8 instead of a DQ/float/Q round trip
  (checked in ONNX Runtime's own optimized graph);
* a Softmax over an inner axis (YOLO's DFL) becomes Exp(x - ReduceMax) / ReduceSum over that axis in
  the models written for ONNX Runtime, with the same values;
* a Shape reads the quantized tensor there (no DQ runs only for a dynamic export's shape arithmetic),
  the DQ on TensorRT's.

Real ONNX Runtime and the real CLI; the trained YOLO11n's figures are in docs/benchmarks.md."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_detector_head import SIZE, AnchorFree, _export
from torch import nn

from trtrepo.qdq.graph import decompose_inner_softmax, prepare_model

MOVERS = ("Split", "MaxPool", "Resize")


class Neck(nn.Module):
    """C3k2-like Split, SPPF-like MaxPools, an FPN-like nearest upsampling, joined by Concats."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(8, 8, 3, 1, 1)
        self.c3, self.c4 = nn.Conv2d(16, 16, 3, 2, 1), nn.Conv2d(64, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.silu(self.c1(nn.functional.relu(self.c0(x))))  # a ReLU stem: a SiLU one stays float
        a, b = y.split((8, 8), 1)
        z = torch.cat((a, nn.functional.silu(self.c2(b))), 1)
        s = nn.functional.silu(self.c3(z))
        p1 = nn.functional.max_pool2d(s, 5, 1, 2)
        p2 = nn.functional.max_pool2d(p1, 5, 1, 2)
        u = nn.functional.interpolate(torch.cat((s, p1, p2), 1), scale_factor=2.0, mode="nearest")
        return self.c4(torch.cat((u, z), 1))


def _quantize(run_cli, tmp_path, model_path, target="onnxruntime"):
    data = tmp_path / "calib.npy"
    np.save(data, np.random.default_rng(0).random((16, 3, SIZE, SIZE), np.float32))
    out = tmp_path / f"int8_{target}.onnx"
    res = run_cli("quantize", model_path, "-o", out, "--data", data, "--target", target, "--method", "minmax",
                  "--weight-rounding", "nearest", "--batch-size", "8", "--accept-accuracy-loss", "--no-progress")
    assert res.exit_code == 0, res.output + res.stderr
    return out


def test_data_movement_outputs_share_their_inputs_parameters_and_run_on_uint8(tmp_path, run_cli):
    _export(Neck(), tmp_path / "neck.onnx")
    out = _quantize(run_cli, tmp_path, tmp_path / "neck.onnx")
    model = onnx.load(str(out))
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    movers = [n for n in model.graph.node if n.op_type in MOVERS]
    assert sorted(n.op_type for n in movers) == ["MaxPool", "MaxPool", "Resize", "Split"]
    for node in movers:
        dq = producer[node.input[0]]
        assert dq.op_type == "DequantizeLinear", node.name
        for o in node.output:
            qs = [c for c in consumers[o] if c.op_type == "QuantizeLinear"]
            assert qs and all(list(q.input[1:3]) == list(dq.input[1:3]) for q in qs), (node.name, o)
    # ONNX Runtime's own optimized graph: no float round trip into or out of those ops
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    opt = onnx.load(str(tmp_path / "optimized.onnx"))
    made_by = {o: n.op_type for n in opt.graph.node for o in n.output}
    moving = [n for n in opt.graph.node if n.op_type in MOVERS or n.op_type.endswith("MaxPool")]
    assert len(moving) == 4
    assert all(made_by.get(n.input[0]) != "DequantizeLinear" for n in moving), \
        [(n.op_type, made_by.get(n.input[0])) for n in moving]


def test_an_inner_axis_softmax_is_decomposed_with_the_same_values(tmp_path, run_cli):
    path = tmp_path / "det.onnx"
    fp32 = prepare_model(_export(AnchorFree(), path))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(fp32)
    assert decompose_inner_softmax(rewritten) == 1
    assert not [n for n in rewritten.graph.node if n.op_type == "Softmax"]
    x = np.random.default_rng(1).random((2, 3, SIZE, SIZE), np.float32)

    def run(m):
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, {"images": x})[0]

    np.testing.assert_allclose(run(rewritten), run(fp32), rtol=1e-6, atol=1e-4)
    assert decompose_inner_softmax(rewritten) == 0  # nothing left to rewrite
    int8 = onnx.load(str(_quantize(run_cli, tmp_path, path)))
    assert not [n for n in int8.graph.node if n.op_type == "Softmax"]
    assert {"ReduceMax", "Exp", "ReduceSum"} <= {n.op_type for n in int8.graph.node}
    trt = onnx.load(str(_quantize(run_cli, tmp_path, path, target="tensorrt")))  # TensorRT's own kernels: as exported
    axes = [[a.i for a in n.attribute if a.name == "axis"] for n in trt.graph.node if n.op_type == "Softmax"]
    assert axes == [[1]]


class ShapeReader(nn.Module):
    """A dynamic export's shape arithmetic on a quantized feature map (YOLO's anchors read three)."""

    def __init__(self) -> None:
        super().__init__()
        self.c0, self.c1, self.c2 = nn.Conv2d(3, 8, 1), nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(16, 8, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = nn.functional.silu(self.c1(nn.functional.relu(self.c0(x))))  # a ReLU stem: a SiLU one stays float
        return self.c2(f).reshape(f.shape[0], 8, -1)


# TensorRT: Q/DQ only on the weighted op's input, the Shape reads the SiLU's float output as exported
@pytest.mark.parametrize("target,reads", [("onnxruntime", "QuantizeLinear"), ("tensorrt", "Mul")])
def test_a_shape_reads_the_quantized_tensor_on_onnxruntime(tmp_path, run_cli, target, reads):
    _export(ShapeReader(), tmp_path / "shape.onnx")
    out = _quantize(run_cli, tmp_path, tmp_path / "shape.onnx", target=target)
    model = onnx.load(str(out))
    producer = {o: n for n in model.graph.node for o in n.output}
    (shape,) = [n for n in model.graph.node if n.op_type == "Shape"]
    assert producer[shape.input[0]].op_type == reads
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).random((3, 3, SIZE, SIZE), np.float32)
    assert session.run(None, {"images": x})[0].shape == (3, 8, (SIZE // 4) ** 2)
    if target == "onnxruntime":  # no DQ left whose only reader is a Shape
        opt = onnx.load(str(tmp_path / "optimized.onnx"))
        readers: dict[str, list[str]] = {}
        for n in opt.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n.op_type)
        dqs = [n for n in opt.graph.node if n.op_type == "DequantizeLinear"]
        assert not [n.name for n in dqs if set(readers.get(n.output[0], [])) == {"Shape"}]
