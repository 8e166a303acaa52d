"""Issue 43 item 5: a model exported with a fixed batch (Ultralytics exports batch 1 unless asked
otherwise) goes through every step that runs it -- calibration, the method choice and held-out
check, weight rounding (AdaRound collects at its own batch size), the speed figure -- at the
batch it accepts, and deploys with ``max_batch_size: 0`` (real ONNX Runtime, the real CLI)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.data import iter_batches, open_data
from trtrepo.modelio import ModelIO


def _cnn(path, batch: int | str) -> None:
    """Conv(3->8, 3x3) -> Relu -> Conv(8->8) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(8->10)."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32)
    fc = rng.normal(0, 0.5, (10, 8)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "fixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 10])],
                              [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (fc, "fc"))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "x.npz"
    np.savez(path, x=np.random.default_rng(1).uniform(0, 1, (70, 3, 16, 16)).astype(np.float32))
    return path


def test_fixed_batch_is_read_off_the_model(tmp_path, data):
    _cnn(tmp_path / "b1.onnx", 1)
    _cnn(tmp_path / "b4.onnx", 4)
    _cnn(tmp_path / "dyn.onnx", "batch")
    io1, io4, dyn = (ModelIO.from_onnx(tmp_path / n) for n in ("b1.onnx", "b4.onnx", "dyn.onnx"))
    assert (io1.fixed_batch, io4.fixed_batch, dyn.fixed_batch) == (1, 4, None)
    source = open_data(str(data), io=io4)
    sizes = [len(b.indices) for b in iter_batches(source, 32, io4)]
    assert sizes == [4] * 17  # 70 samples: 68 in batches of 4, the 2 left over are not used
    assert [len(b.indices) for b in iter_batches(open_data(str(data), io=io1), 32, io1)] == [1] * 70
    assert [len(b.indices) for b in iter_batches(open_data(str(data), io=dyn), 32, dyn)] == [32, 32, 6]


@pytest.mark.parametrize("batch", [1, 4])
def test_a_fixed_batch_model_quantizes_with_weight_rounding_and_the_speed_figure(tmp_path, data, run_cli, batch, caplog):
    model, out, rep = tmp_path / "m.onnx", tmp_path / "q.onnx", tmp_path / "rep"
    _cnn(model, batch)
    res = run_cli("quantize", model, "-o", out, "--data", data, "--target", "onnxruntime", "--method", "minmax",
                  "--weight-rounding", "adaround", "--accept-accuracy-loss", "--report", rep, "--no-progress")
    assert res.exit_code == 0, res.output + res.stderr
    report = json.loads((rep / "quantize.json").read_text())
    assert report["weight_rounding"]["chosen"] == "adaround", report["weight_rounding"]
    assert "speed INT8/FP32" in res.output
    q = onnx.load(str(out))
    assert [d.dim_value for d in q.graph.input[0].type.tensor_type.shape.dim] == [batch, 3, 16, 16]
    if batch == 4:
        assert "the model's batch is fixed at 4: 2 of 14 samples that cannot fill a batch are not used" in caplog.text


def test_a_fixed_batch_model_deploys_without_a_batch_axis(tmp_path, data, run_cli):
    model = tmp_path / "m.onnx"
    _cnn(model, 1)
    res = run_cli("deploy", model, "--repo", tmp_path / "repo", "--name", "m", "--data", data, "--backend", "python",
                  "--method", "minmax", "--weight-rounding", "nearest", "--accept-accuracy-loss")
    assert res.exit_code == 0, res.output + res.stderr
    config = (tmp_path / "repo" / "m" / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in config and "int8" in res.output
