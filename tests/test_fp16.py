from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.data import iter_batches, open_data
from trtrepo.evaluate import make_session
from trtrepo.export import export_onnx
from trtrepo.fp16 import convert_file, convert_to_fp16
from trtrepo.modelio import ModelIO


def _session(model):
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return make_session(data)


@pytest.mark.parametrize("source,data", [("demo", "demo:val"), ("demo-text", "demo-text:val")])
def test_fp16_keeps_io_types_and_top1(tmp_path, source, data):
    src = tmp_path / "m.onnx"
    export_onnx(source, src)
    dst = tmp_path / "m.fp16.onnx"
    model = convert_file(str(src), str(dst))
    assert ModelIO.from_onnx(dst) == ModelIO.from_onnx(src)  # float32 inputs/outputs kept
    assert all(i.data_type != TensorProto.FLOAT for i in model.graph.initializer)
    io = ModelIO.from_onnx(src)
    s32, s16 = _session(str(src)), _session(str(dst))
    agree = total = 0
    for batch in iter_batches(open_data(data, io=io, limit=200, seed=0), 50, io):
        a, b = s32.run(["logits"], batch.inputs)[0], s16.run(["logits"], batch.inputs)[0]
        assert b.dtype == np.float32 and np.isfinite(b).all()
        np.testing.assert_allclose(b, a, atol=0.1, rtol=0.05)
        agree += int((a.argmax(1) == b.argmax(1)).sum())
        total += batch.size
    assert agree / total >= 0.99


def test_fp16_clamps_the_attention_mask_minimum(tmp_path):
    """(1 - mask) * finfo(float32).min must not become 0 * -inf = NaN in float16."""
    x = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    fmin = numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "fmin")
    nodes = [helper.make_node("Sub", ["one", "mask"], ["inv"]), helper.make_node("Mul", ["inv", "fmin"], ["add"]),
             helper.make_node("Softmax", ["add"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [one, fmin]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    out = _session(convert_to_fp16(model)).run(None, {"mask": np.array([[1, 1, 0, 0]], np.float32)})[0]
    np.testing.assert_allclose(out, [[0.5, 0.5, 0, 0]], atol=1e-3)


def test_fp16_qdq_scales_and_opset(tmp_path):
    """A Q/DQ graph gets float16 scales (DQ then outputs float16) and opset >= 19."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])
    w = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"), numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]), helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("MatMul", ["xd", "w"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    fp16 = convert_to_fp16(model)
    onnx.checker.check_model(fp16)
    assert fp16.opset_import[0].version >= 19
    scale = next(i for i in fp16.graph.initializer if i.name == "s")
    assert scale.data_type == TensorProto.FLOAT16
    feed = {"x": np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)}
    ref = _session(model).run(None, feed)[0]
    got = _session(fp16).run(None, feed)[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=0.02, rtol=0.01)


def test_fp16_keep_fp32_ops(tmp_path):
    src = tmp_path / "t.onnx"
    export_onnx("demo-text", src)
    model = convert_to_fp16(onnx.load(str(src)), keep_fp32_ops=["LayerNormalization", "Softmax"])
    onnx.checker.check_model(model)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    kept = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "Softmax")]
    assert kept and all(types.get(n.output[0]) == TensorProto.FLOAT for n in kept)
    io = ModelIO.from_onnx(src)
    batch = next(iter_batches(open_data("demo-text:val", io=io, limit=32), 32, io))
    a = _session(str(src)).run(["logits"], batch.inputs)[0]
    b = _session(model).run(["logits"], batch.inputs)[0]
    np.testing.assert_allclose(b, a, atol=0.1, rtol=0.05)


def test_a_resize_keeps_float32_scales_and_runs():
    """A YOLO neck's nearest upsample: Resize's scales may only be float32; the FP16 copy runs."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtrepo.evaluate import make_session
    from trtrepo.fp16 import convert_to_fp16

    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = helper.make_graph([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="up")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6, 6])], [scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(18, dtype=np.float32).reshape(1, 2, 3, 3)
    (y,) = make_session(convert_to_fp16(model)).run(None, {"x": x})
    assert y.shape == (1, 2, 6, 6) and np.array_equal(y[:, :, ::2, ::2], x)
    onnx.checker.check_model(convert_to_fp16(model))
