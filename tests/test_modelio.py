from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO, TensorSpec


def _model(inputs, outputs, path):
    nodes = [helper.make_node("Identity", [inputs[0].name], [outputs[0].name])]
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    return path


def test_from_onnx_marks_dynamic_batch_axis(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8])
    io = ModelIO.from_onnx(_model([x], [y], tmp_path / "m.onnx"))
    assert io.has_batch_axis
    assert io.inputs[0].shape == (-1, 3, 8)
    assert io.inputs[0].sample_shape == (3, 8)
    assert io.inputs[0].dim_names == ("batch", None, None)
    assert io.inputs[0].triton_dtype == "TYPE_FP32"


def test_from_onnx_without_batch_axis(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [4, 3])
    io = ModelIO.from_onnx(_model([x], [y], tmp_path / "m.onnx"))
    assert not io.has_batch_axis
    assert io.inputs[0].batch_axis is None
    assert io.inputs[0].sample_shape == (4, 3)
    assert io.inputs[0].triton_dtype_short == "INT64"


def test_dict_round_trip(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    again = ModelIO.from_dict(io.to_dict())
    assert again == io
    assert io.input_names == ["input"] and io.output_names == ["logits"]


def test_check_feed_names_the_tensor(demo_onnx):
    io = ModelIO.from_onnx(demo_onnx)
    with pytest.raises(UsageError, match=r"input 'input'.*\[2, 3, 32, 32\].*axis 1: 3 != 1"):
        io.check_feed({"input": np.zeros((2, 3, 32, 32), np.float32)})
    with pytest.raises(UsageError, match="missing input"):
        io.check_feed({"other": np.zeros((2, 1, 32, 32), np.float32)})
    io.check_feed({"input": np.zeros((5, 1, 32, 32), np.float32)})


def test_invalid_specs_are_refused():
    with pytest.raises(UsageError, match="unsupported dtype"):
        TensorSpec("x", "complex64", (1,))
    with pytest.raises(UsageError, match="invalid dimension 0"):
        TensorSpec("x", "float32", (-1, 0))
    spec = TensorSpec("x", "float32", (-1, 3))
    with pytest.raises(UsageError, match="not unique"):
        ModelIO((spec,), (spec,))


def test_missing_and_corrupt_onnx_files(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        ModelIO.from_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(UsageError, match="bad.onnx: not a readable ONNX model"):
        ModelIO.from_onnx(bad)
