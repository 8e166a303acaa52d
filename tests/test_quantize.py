"""Q/DQ placement (issue 4): rules per op type on tiny graphs built in code, validity, ONNX Runtime
integer kernels, bad input, auto method selection and accuracy fallback on the demo model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.errors import UsageError
from trtrepo.evaluate import make_session
from trtrepo.qdq import (
    ActivationRange,
    QuantizeOptions,
    insert_qdq,
    plan_qdq,
    prepare_model,
    quantize_model,
)

RNG = np.random.default_rng(0)
INTEGER_KERNELS = {"QLinearConv", "ConvInteger", "MatMulInteger", "MatMulIntegerToFloat", "QLinearMatMul", "QGemm",
                   "QLinearAdd", "DynamicQuantizeMatMul", "QLinearGlobalAveragePool", "NhwcQLinearConv"}


# --------------------------------------------------------------------------------------------
# Tiny graphs


def make_model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a, np.float32), n) for n, a in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def conv_model(opset=17):
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    w[2] *= 10  # a channel with a larger range: per-channel scales differ
    return make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        [("x", [1, 3, 8, 8])], [("y", [1, 4, 8, 8])], [("w", w), ("b", RNG.standard_normal(4))], opset=opset,
    ), w


def residual_model(swap=False, tail=False, rng=None):
    """x -> conv0 -> relu0 = r;  r -> conv1 -> relu1 -> conv2 = c;  Add(r, c) -> relu -> out
    (with ``tail``: -> conv3 -> out)."""
    ws = [(rng or RNG).standard_normal((4, c, 3, 3)).astype(np.float32) * 0.3 for c in (3, 4, 4, 4)]
    add_in = ["c", "r"] if swap else ["r", "c"]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r"], name="relu0"),
        helper.make_node("Conv", ["r", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", add_in, ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["t" if tail else "out"], name="relu_out"),
    ]
    if tail:
        nodes.append(helper.make_node("Conv", ["t", "w3"], ["out"], name="conv3", pads=[1, 1, 1, 1]))
    else:
        ws = ws[:3]
    return make_model(nodes, [("x", ["N", 3, 8, 8])], [("out", ["N", 4, 8, 8])], [(f"w{i}", w) for i, w in enumerate(ws)])


def amax_all(model, x=None):
    """Exact ranges of every float tensor (min, max) from one run with ONNX Runtime."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [i.name for i in m.graph.input] + [o for n in m.graph.node for o in n.output]
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = x if x is not None else {i.name: _random_input(i) for i in sess.get_inputs()}
    values = sess.run(names, feed)
    return {n: ActivationRange(float(np.abs(v).max()), float(v.min()), float(v.max())) for n, v in zip(names, values, strict=True)}, feed


def _random_input(i):
    shape = [d if isinstance(d, int) else 2 for d in i.shape]
    return RNG.standard_normal(shape).astype(np.float32)


def producers(model):
    return {o: n for n in model.graph.node for o in n.output}


def input_producer(model, node_name, index):
    node = next(n for n in model.graph.node if n.name == node_name)
    return producers(model).get(node.input[index])


def init(model, name):
    return numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))


def q_params(model, dq_node):
    return init(model, dq_node.input[1]), init(model, dq_node.input[2])


def run(model, feed):
    return make_session(model).run(None, feed)


def integer_kernels(model_or_path, tmp_path, level=ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    data = model_or_path.SerializeToString() if hasattr(model_or_path, "SerializeToString") else str(model_or_path)
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    return ops


# --------------------------------------------------------------------------------------------
# TensorRT target: placement per op type


def test_conv_tensorrt_quantizes_input_and_weight_per_output_channel():
    model, w = conv_model()
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges).model
    x_dq = input_producer(qm, "conv", 0)
    w_dq = input_producer(qm, "conv", 1)
    assert x_dq.op_type == "DequantizeLinear" and w_dq.op_type == "DequantizeLinear"
    # activation: int8 symmetric per tensor, zp 0, scale amax/127
    s, z = q_params(qm, x_dq)
    assert z.dtype == np.int8 and z.shape == () and int(z) == 0
    assert np.isclose(float(s), ranges["x"].amax / 127, rtol=1e-6)
    # weight: FP32 behind Q -> DQ, per output channel (axis 0), scale max|w_c| / 127
    w_q = producers(qm)[w_dq.input[0]]
    assert w_q.op_type == "QuantizeLinear" and w_q.input[0] == "w"
    assert helper.get_attribute_value(next(a for a in w_dq.attribute if a.name == "axis")) == 0
    s, z = q_params(qm, w_dq)
    np.testing.assert_allclose(s, np.abs(w).reshape(4, -1).max(axis=1) / 127, rtol=1e-6)
    assert z.dtype == np.int8 and not z.any()
    # bias stays float; the network output is not quantized
    assert next(n for n in qm.graph.node if n.name == "conv").input[2] == "b"
    assert producers(qm)["y"].op_type == "Conv"
    onnx.checker.check_model(qm, full_check=True)
    (ref,), (got,) = run(model, feed), run(qm, feed)
    assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()


@pytest.mark.parametrize("trans_b, axis", [(1, 0), (0, 1)])
def test_gemm_weight_axis_follows_transB(trans_b, axis):
    n_out, k = 5, 6
    w = RNG.standard_normal((n_out, k) if trans_b else (k, n_out)).astype(np.float32)
    model = make_model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=trans_b)],
                       [("x", [2, k])], [("y", [2, n_out])], [("w", w), ("b", np.zeros(n_out))])
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges).model
    w_dq = input_producer(qm, "fc", 1)
    assert helper.get_attribute_value(next(a for a in w_dq.attribute if a.name == "axis")) == axis
    scale, _ = q_params(qm, w_dq)
    assert scale.shape == (n_out,)
    np.testing.assert_allclose(scale, np.abs(w).max(axis=1 - axis) / 127, rtol=1e-6)
    assert input_producer(qm, "fc", 0).op_type == "DequantizeLinear"
    (ref,), (got,) = run(model, feed), run(qm, feed)
    np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())


def test_matmul_weight_last_axis_and_two_activation_inputs_per_tensor():
    w = RNG.standard_normal((6, 3)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm_w"),
         helper.make_node("MatMul", ["h", "y"], ["out"], name="mm_act")],
        [("x", [2, 4, 6]), ("y", [2, 3, 5])], [("out", [2, 4, 5])], [("w", w)],
    )
    ranges, _ = amax_all(model)
    # A MatMul of two activations is the attention pattern: float by default (issue 8), quantized on request.
    default = insert_qdq(model, ranges)
    assert "mm_act" in default.plan.auto_float and input_producer(default.model, "mm_act", 1) is None
    qm = insert_qdq(model, ranges, QuantizeOptions(quantize_attention=True)).model
    w_dq = input_producer(qm, "mm_w", 1)
    assert helper.get_attribute_value(next(a for a in w_dq.attribute if a.name == "axis")) == 1
    assert q_params(qm, w_dq)[0].shape == (3,)
    for i in (0, 1):
        dq = input_producer(qm, "mm_act", i)
        assert dq.op_type == "DequantizeLinear"
        assert q_params(qm, dq)[0].shape == ()  # activations per tensor
    onnx.checker.check_model(qm, full_check=True)


def test_conv_transpose_weight_axis_1():
    w = RNG.standard_normal((3, 5, 2, 2)).astype(np.float32)  # [Cin, Cout, kh, kw]
    model = make_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv", strides=[2, 2])],
                       [("x", [1, 3, 4, 4])], [("y", [1, 5, 8, 8])], [("w", w)])
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges).model
    w_dq = input_producer(qm, "deconv", 1)
    assert helper.get_attribute_value(next(a for a in w_dq.attribute if a.name == "axis")) == 1
    np.testing.assert_allclose(q_params(qm, w_dq)[0], np.abs(w).transpose(1, 0, 2, 3).reshape(5, -1).max(axis=1) / 127, rtol=1e-6)
    (ref,), (got,) = run(model, feed), run(qm, feed)
    np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())


@pytest.mark.parametrize("swap", [False, True])
def test_residual_add_quantizes_residual_input_not_backbone(swap):
    model = residual_model(swap)
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges).model
    add = next(n for n in qm.graph.node if n.name == "add")
    backbone, residual = (0, 1) if swap else (1, 0)
    assert add.input[backbone] == "c"  # straight from conv2: TensorRT fuses the Add into it
    assert producers(qm)[add.input[residual]].op_type == "DequantizeLinear"
    # the residual's Q/DQ is the same pair conv1 reads (one Q per tensor)
    assert add.input[residual] == next(n for n in qm.graph.node if n.name == "conv1").input[0]
    assert producers(qm)["out"].op_type == "Relu"
    plan = plan_qdq(prepare_model(model))
    assert [p.rule for p in plan.points if p.consumer == "add"] == ["residual_add"]


def test_add_without_conv_input_gets_no_qdq():
    model = make_model([helper.make_node("Add", ["a", "b"], ["s"], name="add"),
                        helper.make_node("MatMul", ["s", "w"], ["y"], name="mm")],
                       [("a", [2, 4]), ("b", [2, 4])], [("y", [2, 3])], [("w", RNG.standard_normal((4, 3)))])
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges).model
    add = next(n for n in qm.graph.node if n.name == "add")
    assert list(add.input) == ["a", "b"]


def test_exclusions_by_op_type_and_node_pattern():
    model = residual_model()
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(exclude_nodes=("conv[12]",))).model
    for name in ("conv1", "conv2"):
        node = next(n for n in qm.graph.node if n.name == name)
        assert not any(producers(qm).get(i) is not None and producers(qm)[i].op_type == "DequantizeLinear" for i in node.input)
    assert input_producer(qm, "conv0", 0).op_type == "DequantizeLinear"
    qm = insert_qdq(model, ranges, QuantizeOptions(exclude_ops=("Add",))).model
    assert list(next(n for n in qm.graph.node if n.name == "add").input) == ["r", "c"]
    with pytest.raises(UsageError, match="nothing to quantize: every quantizable operator stays float: .* excluded by --exclude-op"):
        insert_qdq(model, ranges, QuantizeOptions(exclude_ops=("Conv",), exclude_nodes=("add",)))
    with pytest.raises(UsageError, match="the node pattern 'conv\\['"):
        QuantizeOptions(exclude_nodes=("conv[",))


def test_low_opset_is_upgraded_to_13_and_passes_checker():
    model, _ = conv_model(opset=11)
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges).model
    assert next(o.version for o in qm.opset_import if o.domain in ("", "ai.onnx")) >= 13
    onnx.checker.check_model(qm, full_check=True)
    assert np.isfinite(run(qm, feed)[0]).all()


def test_unnamed_nodes_get_names_and_graph_outputs_stay_float():
    model = residual_model()
    for n in model.graph.node:
        n.name = ""
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    names = [n.name for n in qm.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert producers(qm)["out"].op_type == "Relu"


# --------------------------------------------------------------------------------------------
# ONNX Runtime target


def test_onnxruntime_target_forms_node_units_with_uint8_activations():
    model = residual_model()
    x = RNG.uniform(-1.0, 3.0, (2, 3, 8, 8)).astype(np.float32)
    x.flat[:2] = (-1.0, 3.0)
    ranges, feed = amax_all(model, {"x": x})
    assert (ranges["x"].lo, ranges["x"].hi) == (-1.0, 3.0)  # an asymmetric input range
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    x_dq = input_producer(qm, "conv0", 0)
    s, z = q_params(qm, x_dq)
    assert z.dtype == np.uint8 and int(z) == round(1.0 / (4.0 / 255))  # zp != 0 for a signed range
    assert np.isclose(float(s), 4.0 / 255)
    # the Relu after conv0 is followed by the output Q (zp 0: ONNX Runtime drops the Relu)
    relu_consumers = [n for n in qm.graph.node if "r" in n.input and n.op_type == "QuantizeLinear"]
    assert relu_consumers and int(init(qm, relu_consumers[0].input[2])) == 0
    # weights stored as int8, bias-free convs, Add inputs and output quantized
    w_dq = input_producer(qm, "conv1", 1)
    assert init(qm, w_dq.input[0]).dtype == np.int8
    add = next(n for n in qm.graph.node if n.name == "add")
    assert all(producers(qm)[i].op_type == "DequantizeLinear" for i in add.input)
    onnx.checker.check_model(qm, full_check=True)
    (ref,), (got,) = run(model, feed), run(qm, feed)
    assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()


def test_onnxruntime_target_runs_integer_kernels(tmp_path):
    model = residual_model(tail=True)
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    ops = integer_kernels(qm, tmp_path)
    assert ops.count("QLinearConv") == 3, ops  # conv3 produces the network output: no output Q
    assert "QLinearAdd" in ops and "Add" not in ops and ops.count("Conv") == 1
    # the TensorRT placement has no output Q: ONNX Runtime keeps float convolutions
    ops_trt = integer_kernels(insert_qdq(model, ranges).model, tmp_path)
    assert "QLinearConv" not in ops_trt


def test_onnxruntime_target_bias_is_int32_with_product_scale():
    model, _ = conv_model()
    ranges, feed = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    b_dq = input_producer(qm, "conv", 2)
    x_scale = q_params(qm, input_producer(qm, "conv", 0))[0]
    w_scale = q_params(qm, input_producer(qm, "conv", 1))[0]
    assert init(qm, b_dq.input[0]).dtype == np.int32
    np.testing.assert_allclose(q_params(qm, b_dq)[0], x_scale * w_scale, rtol=1e-6)


def test_without_minmax_non_negative_tensors_get_zero_point_zero():
    model = residual_model()
    ranges, _ = amax_all(model)
    amax_only = {k: v.amax for k, v in ranges.items()}
    qm = insert_qdq(model, amax_only, QuantizeOptions(target="onnxruntime")).model
    assert int(q_params(qm, input_producer(qm, "conv1", 0))[1]) == 0  # relu output: [0, amax]
    assert int(q_params(qm, input_producer(qm, "conv0", 0))[1]) in (127, 128)  # network input: [-amax, amax]


def test_demo_onnxruntime_target_integer_kernels(demo_onnx, demo_ranges, tmp_path):
    out = tmp_path / "demo.ort.onnx"
    quantize_model(demo_onnx, demo_ranges, out, QuantizeOptions(target="onnxruntime"))
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        ops = integer_kernels(out, tmp_path, level)
        assert ops.count("QLinearConv") == 8, ops  # the first conv (1 input channel) stays float
        assert ops.count("QLinearAdd") == 3 and "QGemm" in ops and "QLinearGlobalAveragePool" in ops
        assert sum(o in ("Conv", "FusedConv") for o in ops) == 1


def test_onnxruntime_target_keeps_tiny_reduction_conv_float():
    w = RNG.standard_normal((8, 1, 3, 3)).astype(np.float32)  # Cin * kh * kw = 9
    w2 = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="stem", pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["r"], name="relu"),
                        helper.make_node("Conv", ["r", "w2"], ["y"], name="body", pads=[1, 1, 1, 1])],
                       [("x", [1, 1, 8, 8])], [("y", [1, 8, 8, 8])], [("w", w), ("w2", w2)])
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime"))
    assert qm.plan.kept_float == ["stem"] and "stem" not in qm.plan.layers
    stem = next(n for n in qm.model.graph.node if n.name == "stem")
    assert list(stem.input) == ["x", "w"]
    assert input_producer(qm.model, "body", 0).op_type == "DequantizeLinear"  # the Relu output is still quantized
    # the TensorRT target and ort_min_reduction=0 quantize it
    assert input_producer(insert_qdq(model, ranges).model, "stem", 1).op_type == "DequantizeLinear"
    qm0 = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime", ort_min_reduction=0))
    assert input_producer(qm0.model, "stem", 1).op_type == "DequantizeLinear"


def test_onnxruntime_target_keeps_the_image_stem_before_a_silu_float(tmp_path):
    """The convolution on a 3-channel image input whose output feeds a SiLU stays float with the
    SiLU on the onnxruntime target (reduction 27: above ort_min_reduction); the SiLU's output is
    quantized for the next convolution. A ReLU stem and the TensorRT target are quantized."""
    from trtrepo.qdq.rules import IMAGE_STEM_REASON

    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)

    def stem_model(act: str):
        act_nodes = ([helper.make_node("Sigmoid", ["c"], ["s"], name="sig"), helper.make_node("Mul", ["c", "s"], ["r"], name="silu")]
                     if act == "silu" else [helper.make_node("Relu", ["c"], ["r"], name="relu")])
        return make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="stem", pads=[1, 1, 1, 1]), *act_nodes,
                           helper.make_node("Conv", ["r", "w2"], ["y"], name="body", pads=[1, 1, 1, 1])],
                          [("x", [1, 3, 8, 8])], [("y", [1, 8, 8, 8])], [("w", w), ("w2", w2)])

    model = stem_model("silu")
    ranges, _ = amax_all(model)
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime"))
    assert {n: r for n, r in qm.plan.auto_float.items() if r == IMAGE_STEM_REASON} == dict.fromkeys(["stem", "sig", "silu"],
                                                                                                     IMAGE_STEM_REASON)
    stem = next(n for n in qm.model.graph.node if n.name == "stem")
    assert list(stem.input) == ["x", "w"] and "stem" not in qm.plan.layers
    assert input_producer(qm.model, "body", 0).op_type == "DequantizeLinear"  # the SiLU output is quantized
    out = tmp_path / "stem.onnx"
    onnx.save(qm.model, str(out))
    ops = integer_kernels(out, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "QLinearSigmoid" not in ops and "QLinearMul" not in ops, ops  # the SiLU runs in float (QuickGelu)
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = ort.InferenceSession(str(out)).run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99
    # the TensorRT target, ort_min_reduction=0 and a ReLU stem quantize it
    for m, opts in ((model, QuantizeOptions()), (model, QuantizeOptions(target="onnxruntime", ort_min_reduction=0)),
                    (stem_model("relu"), QuantizeOptions(target="onnxruntime"))):
        q = insert_qdq(m, amax_all(m)[0], opts)
        assert input_producer(q.model, "stem", 1).op_type == "DequantizeLinear" and IMAGE_STEM_REASON not in q.plan.auto_float.values()


def _silu_chain(strides, fork=False):
    """Image -> Conv + SiLU per stride (8 channels) -> a stride-1 body Conv; ``fork``: the first
    SiLU's output is also a graph output."""
    nodes, inits, x = [], [], "x"
    for i, s in enumerate(strides):
        inits.append((f"w{i}", RNG.standard_normal((8, 3 if i == 0 else 8, 3, 3)).astype(np.float32)))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1], strides=[s, s]),
                  helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"], name=f"sig{i}"),
                  helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"r{i}"], name=f"silu{i}")]
        x = f"r{i}"
    inits.append(("wb", RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)))
    nodes.append(helper.make_node("Conv", [x, "wb"], ["y"], name="body", pads=[1, 1, 1, 1]))
    side = 32 // int(np.prod(strides))
    outputs = [("y", [1, 8, side, side])] + ([("r0", [1, 8, 32 // strides[0], 32 // strides[0]])] if fork else [])
    return make_model(nodes, [("x", [1, 3, 32, 32])], outputs, inits)


@pytest.mark.parametrize("strides, fork, stem", [((2, 2), False, 2), ((2, 1), False, 1), ((2, 2), True, 1), ((2, 2, 2), False, 2),
                                                 ((1, 2), False, 2)])
def test_onnxruntime_target_keeps_the_stems_strided_second_convolution_float(tmp_path, strides, fork, stem):
    """The convolution that alone reads the image convolution's SiLU keeps float with its SiLU
    when it is strided (YOLO's two stride-2 stem convolutions); a stride-1 one, a SiLU output read
    elsewhere too, and a third strided convolution are quantized. The model still computes the
    float model's output."""
    from trtrepo.qdq.rules import IMAGE_STEM_NEXT_REASON, IMAGE_STEM_REASON

    model = _silu_chain(strides, fork)
    qm = insert_qdq(model, amax_all(model)[0], QuantizeOptions(target="onnxruntime"))
    want = {f"{op}{i}": IMAGE_STEM_NEXT_REASON if i else IMAGE_STEM_REASON for i in range(stem) for op in ("conv", "sig", "silu")}
    assert {n: r for n, r in qm.plan.auto_float.items() if r in (IMAGE_STEM_REASON, IMAGE_STEM_NEXT_REASON)} == want
    for i in range(len(strides)):  # float convolutions read float weights and the float SiLU, the others dequantized ones
        assert (input_producer(qm.model, f"conv{i}", 1) is None) == (i < stem), i
        if i:
            assert input_producer(qm.model, f"conv{i}", 0).op_type == ("Mul" if i < stem else "DequantizeLinear"), i
    assert input_producer(qm.model, "body", 0).op_type == "DequantizeLinear"  # the stem's last SiLU output is quantized
    out = tmp_path / "chain.onnx"
    onnx.save(qm.model, str(out))
    x = RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)
    got = ort.InferenceSession(str(out)).run(["y"], {"x": x})[0]
    ref = ort.InferenceSession(model.SerializeToString()).run(["y"], {"x": x})[0]
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.99
    # the TensorRT target quantizes the whole stem
    assert not {IMAGE_STEM_REASON, IMAGE_STEM_NEXT_REASON} & set(insert_qdq(model, amax_all(model)[0]).plan.auto_float.values())


# --------------------------------------------------------------------------------------------
# Bad input


def test_model_without_quantizable_ops(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", [2])], [("y", [2])])
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    with pytest.raises(UsageError, match="no quantizable operator"):
        quantize_model(path, {"x": 1.0}, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()


def test_ranges_not_covering_the_model_name_the_tensor(tmp_path):
    model = residual_model()
    ranges, _ = amax_all(model)
    del ranges["r"]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(UsageError, match="no range for tensor 'r'"):
        quantize_model(path, ranges, tmp_path / "out.onnx", source="R.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing written, no temp file


def test_cache_for_another_model_is_refused(demo_onnx, tmp_path, run_cli):
    from trtrepo.cache import write_cache

    cache = tmp_path / "other.cache"
    write_cache(cache, {"x": 1.0, "r": 2.0})
    out = tmp_path / "q.onnx"
    res = run_cli("quantize", demo_onnx, "--cache", cache, "-o", out)
    assert res.exit_code == 2
    assert "another model" in res.stderr and "'x'" in res.stderr
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# Demo model: CLI, auto selection, fallback


@pytest.fixture(scope="module")
def demo_stats(demo_onnx):
    from trtrepo.calibrate import Calibrator
    from trtrepo.data import DataOptions

    return Calibrator(demo_onnx, DataOptions("demo:calib", limit=256), progress=False).collect()


@pytest.fixture(scope="module")
def demo_ranges(demo_stats):
    from trtrepo.quantize import activation_ranges

    return activation_ranges(demo_stats.compute("entropy"), demo_stats)


def test_cli_quantize_from_ranges_json_and_cache(demo_onnx, demo_stats, tmp_path, run_cli):
    ranges = demo_stats.compute("minmax")
    rj, cache = tmp_path / "r.json", tmp_path / "c.cache"
    ranges.save_json(rj, demo_stats)
    ranges.write_cache(cache)
    for flag, path, target in (("--ranges", rj, "onnxruntime"), ("--cache", cache, "tensorrt")):
        out = tmp_path / f"q.{target}.onnx"
        res = run_cli("quantize", demo_onnx, flag, path, "--target", target, "-o", out)
        assert res.exit_code == 0, res.output
        qm = onnx.load(out)
        onnx.checker.check_model(qm)
        dq = [n for n in qm.graph.node if n.op_type == "DequantizeLinear"]
        assert dq
        if target == "tensorrt":  # cache scale round-trips
            s, z = q_params(qm, input_producer(qm, "/features/features.0/features.0.0/Conv", 0))
            assert z.dtype == np.int8 and np.isclose(float(s), ranges["input"] / 127, rtol=1e-6)
        else:  # the ranges JSON carries min/max: a signed conv output gets [min, max] in uint8
            name = "/features/features.1/conv2/conv2.0/Conv_output_0"
            q = next(n for n in qm.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name)
            s, z = init(qm, q.input[1]), init(qm, q.input[2])
            lo, hi = demo_stats[name].min, demo_stats[name].max
            assert lo < 0 < hi and z.dtype == np.uint8
            assert np.isclose(float(s), (hi - lo) / 255, rtol=1e-5) and int(z) == round(-lo / float(s))


def test_cli_reduce_range(demo_onnx, demo_stats, tmp_path, run_cli):
    rj = tmp_path / "r.json"
    demo_stats.compute("minmax").save_json(rj, demo_stats)
    out = tmp_path / "q.onnx"
    res = run_cli("quantize", demo_onnx, "--ranges", rj, "--target", "onnxruntime", "--reduce-range", "-o", out,
                  "--report", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    qm = onnx.load(out)
    weights = [init(qm, n.input[0]) for n in qm.graph.node if n.op_type == "DequantizeLinear"
               and any(t.name == n.input[0] for t in qm.graph.initializer)]
    weights = [w for w in weights if w.dtype == np.int8]  # (biases are int32)
    assert len(weights) == 9 and all(np.abs(w.astype(np.int32)).max() == 64 for w in weights)
    assert json.loads((tmp_path / "rep" / "quantize.json").read_text())["reduce_range"] is True
    res = run_cli("quantize", demo_onnx, "--ranges", rj, "--target", "tensorrt", "--reduce-range", "-o", tmp_path / "t.onnx")
    assert res.exit_code == 2 and "--reduce-range" in res.stderr and not (tmp_path / "t.onnx").exists()


def test_cli_bad_options(demo_onnx, tmp_path, run_cli):
    out = tmp_path / "q.onnx"
    res = run_cli("quantize", demo_onnx, "-o", out)
    assert res.exit_code == 2 and "--ranges" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--cache", tmp_path / "none.cache")
    assert res.exit_code == 2 and "none.cache" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--data", "demo:calib", "--accuracy-target", "top1-drop")
    assert res.exit_code == 2 and "--accuracy-target" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--cache", tmp_path / "c", "--method", "auto")
    assert res.exit_code == 2 and "--method auto" in res.stderr
    rj = tmp_path / "r.json"
    rj.write_text('{"tensors": {"input": {"amax": 1.0}}}')
    res = run_cli("quantize", demo_onnx, "-o", out, "--ranges", rj, "--method", "minmax")
    assert res.exit_code == 2 and f"--method minmax calibrates on --data; it cannot be combined with the ranges given in {rj}" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--ranges", rj, "--cache", tmp_path / "c")
    assert res.exit_code == 2 and "--ranges and --cache exclude each other" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--ranges", rj, "--smooth-quant", "0.8")
    assert res.exit_code == 2 and f"--smooth-quant 0.8: SmoothQuant needs calibration on --data, not the ranges given in {rj}" in res.stderr
    res = run_cli("quantize", demo_onnx, "-o", out, "--ranges", tmp_path / "absent.json")
    assert res.exit_code == 2 and "Invalid value for '--ranges'" in res.stderr and "absent.json: ranges file not found" in res.stderr
    before = demo_onnx.read_bytes()
    res = run_cli("quantize", demo_onnx, "-o", demo_onnx, "--data", "demo:calib")
    assert res.exit_code == 2 and "which this command reads; it would be overwritten" in res.stderr and demo_onnx.read_bytes() == before
    assert not out.exists()


def test_unreachable_accuracy_target_writes_nothing(demo_onnx, tmp_path, run_cli):
    out, rep = tmp_path / "q.onnx", tmp_path / "rep"
    res = run_cli("quantize", demo_onnx, "-o", out, "--data", "demo:calib", "--limit", "64", "--eval-data", "demo:val",
                  "--accuracy-target", "top1=100", "--report", rep, "--no-progress")
    assert res.exit_code == 2
    assert "cannot be met even with every layer in float" in res.stderr
    assert not out.exists() and not rep.exists()


def test_quantize_request_is_checked_before_any_file_is_read(tmp_path):
    from trtrepo.qdq import RangesFile
    from trtrepo.quantize import QuantizeRequest

    absent, out = tmp_path / "absent.onnx", tmp_path / "q.onnx"
    given_ranges = RangesFile(tmp_path / "r.json", {})
    with pytest.raises(UsageError, match="the ranges file and the calibration cache exclude each other"):
        QuantizeRequest.of(absent, out, ranges=given_ranges, cache="c.cache")
    with pytest.raises(UsageError, match="the calibration method minmax calibrates on calibration data; .*r.json"):
        QuantizeRequest.of(absent, out, ranges=given_ranges, method="minmax")
    with pytest.raises(UsageError, match="no ranges: give a ranges file, a calibration cache or calibration data"):
        QuantizeRequest(absent, out)
    with pytest.raises(UsageError, match="the calibration method 'nope'"):
        QuantizeRequest.of(absent, out, data="demo:calib", method="nope")
    with pytest.raises(UsageError, match="would overwrite the input model"):
        QuantizeRequest(absent, absent, data="demo:calib")
    with pytest.raises(UsageError, match="SmoothQuant needs calibration on calibration data, not the ranges given in c.cache"):
        QuantizeRequest.of(absent, out, cache="c.cache", smooth_quant=0.5)
    given = QuantizeRequest.of(absent, out, cache="c.cache")  # smooth_quant "auto" means none with a cache
    assert given.resolved_method == "entropy" and given.smooth_request() is None
    here = QuantizeRequest(absent, out, data="demo:calib")
    assert here.resolved_method == "auto" and here.smooth_request() == "auto"


def test_quantize_report_file_is_the_report_the_run_returns(demo_onnx, tmp_path):
    """quantize.json is QuantizeReport.to_dict() and quantize.md its markdown: the file a user reads
    and the object the commands read cannot disagree; summary_lines() names the chosen method, the
    exclusion and where the report went."""
    from trtrepo.fsutil import report_json
    from trtrepo.quantize import report_markdown, run_quantize

    rep = tmp_path / "rep"
    res = run_quantize(demo_onnx, tmp_path / "q.onnx", data="demo:calib", data_args={"limit": 120, "seed": 0},
                       options=QuantizeOptions(target="onnxruntime", exclude_ops=("Add",)), weight_rounding="nearest",
                       report_dir=rep)
    written = json.loads((rep / "quantize.json").read_text())
    assert written == json.loads(report_json(res.report.to_dict()))
    assert list(written) == list(res.report.to_dict())  # same key order
    assert written["integer_kernels"]["exclusion_costs"][0]["exclusion"] == "--exclude-op Add"
    assert written["accuracy_check"]["ok"] is True and written["input_methods"] == {"input": res.method}
    assert (rep / "quantize.md").read_text() == report_markdown(res.report)
    lines = res.report.summary_lines()
    chosen = [line for line in lines if line.endswith("<- chosen")]
    assert len(chosen) == 1 and chosen[0].split()[0] == res.method == written["method"]
    assert len([line for line in lines if "cosine" in line and line.startswith("  ") and "<-" not in line
                and line.split()[0] in {"entropy", "minmax", "percentile", "mse"}]) == 3
    assert f"wrote {rep / 'quantize.json'} and quantize.md" in lines
    assert "  kept in float: 1: Add (excluded by the user)" in lines
    assert any(line.startswith("  gate passed: output 'logits'") for line in lines)
    # the weight-rounding rows say when AdaRound's budget cut layers or shortened their steps
    rows = [{"step": "nearest", "metrics": {"cosine_mean": 0.99}},
            {"step": "adaround", "seconds": 31.0, "budget_s": 30.0, "budget_cut": 2, "budget_short": 5,
             "metrics": {"cosine_mean": 0.995}}]
    wr = dataclasses.replace(res.report, weight_rounding={"requested": "auto", "chosen": "adaround", "candidates": rows})
    line = next(line for line in wr.summary_lines() if line.startswith("  weights adaround"))
    assert "(2 layer(s) left at nearest: the 30s budget was spent)" in line
    assert "(5 layer(s) ran fewer steps than the cap: the 30s budget; the file depends on this machine's speed and load)" in line
    assert not any("fewer steps" in line for line in res.report.summary_lines())


@pytest.mark.slow
def test_auto_selects_best_method_on_held_out_split(demo_onnx, tmp_path, run_cli):
    out, rep = tmp_path / "q.onnx", tmp_path / "rep"
    res = run_cli("quantize", demo_onnx, "-o", out, "--data", "demo:calib", "--limit", "400", "--method", "auto",
                  "--target", "onnxruntime", "--report", rep, "--no-progress", "--weight-rounding", "nearest")
    assert res.exit_code == 0, res.output
    report = json.loads((rep / "quantize.json").read_text())
    assert report["evaluation_data"]["samples"] == 80 and report["calibration_samples"] == 320
    rows = {r["label"]: r["outputs"]["logits"] for r in report["methods"]}
    assert set(rows) == {"entropy", "minmax", "percentile", "mse"}
    key = {k: (v["candidate_accuracy"], v["cosine_mean"]) for k, v in rows.items()}
    assert report["method"] == max(key, key=lambda k: key[k])
    assert "(chosen)" in (rep / "quantize.md").read_text()
    onnx.checker.check_model(onnx.load(out))


@pytest.mark.slow
def test_fallback_leaves_sensitive_layers_in_float_until_target_holds(demo_onnx, tmp_path):
    from trtrepo.data import open_data
    from trtrepo.evaluate import evaluate
    from trtrepo.quantize import run_quantize

    held_out = open_data("demo:val").subset(200, seed=0)
    common = dict(data="demo:calib", eval_data=held_out, method="entropy", data_args={"limit": 256, "seed": 0},
                  options=QuantizeOptions(target="onnxruntime"), weight_rounding="nearest")
    base = run_quantize(demo_onnx, tmp_path / "base.onnx", **common)
    baseline = base.report.metrics["logits"].cosine_mean
    assert baseline < 0.99999
    goal = baseline + (1.0 - baseline) * 0.5  # stricter than plain INT8 reaches
    out = tmp_path / "fb.onnx"
    res = run_quantize(demo_onnx, out, accuracy_target=f"cosine={goal}", report_dir=tmp_path / "rep", **common)
    steps = res.report.steps
    assert not steps[0].met and any(s.met for s in steps) and len(steps) >= 2
    # groups (roles, blocks) are tried before single layers, each step with its speed vs FP32
    assert any(s.label.startswith(("role ", "block ")) for s in steps[1:])
    assert all(s.speed is not None and s.speed > 0 for s in steps)
    smallest = min((s for s in steps if s.met), key=lambda s: len(s.layers_in_float))
    assert res.layers_in_float and sorted(res.layers_in_float) == sorted(smallest.layers_in_float)
    assert len(res.layers_in_float) < len(base.layers)
    fb = res.report.fallback
    assert 0 < fb["weighted_in_float"] <= fb["weighted_layers"] and fb["evaluations"] == len(steps)
    # the written model really meets the target on the evaluation data, and keeps INT8 layers
    rep = evaluate(demo_onnx, out, held_out)
    assert rep.outputs["logits"].cosine_mean >= goal - 1e-6
    qm = onnx.load(out)
    assert any(n.op_type == "DequantizeLinear" for n in qm.graph.node)
    for name in res.layers_in_float:
        node = next(n for n in qm.graph.node if n.name == name)
        assert not any((p := producers(qm).get(i)) is not None and p.op_type == "DequantizeLinear" for i in node.input)
    assert "Layers left in float" in (tmp_path / "rep" / "quantize.md").read_text()


def test_quantize_for_deploy(demo_onnx, tmp_path):
    from trtrepo.data import open_data
    from trtrepo.quantize import QuantizeRequest, quantize_for_deploy

    source = open_data("demo:calib").subset(90, 0)  # below AUTO_MIN_SAMPLES: entropy, no split
    res = quantize_for_deploy(QuantizeRequest.of(demo_onnx, tmp_path / "d.onnx", data=source, method="auto",
                                                 options=QuantizeOptions(target="onnxruntime"), weight_rounding="nearest",
                                                 accept_accuracy_loss=True))
    assert res.method == "entropy" and Path(res.path).is_file()
    ops = integer_kernels(res.path, tmp_path)
    assert "QLinearConv" in ops


def test_cli_exclusions_and_missing_ranges(demo_onnx, demo_stats, tmp_path, run_cli):
    ranges = demo_stats.compute("entropy")
    cache = tmp_path / "c.cache"
    ranges.write_cache(cache)
    out = tmp_path / "q.onnx"
    res = run_cli("quantize", demo_onnx, "--cache", cache, "-o", out, "--exclude-node", r"/features/features\.1/.*",
                  "--exclude-op", "Gemm")
    assert res.exit_code == 0, res.output
    qm = onnx.load(out)
    for node in qm.graph.node:
        if node.name.startswith("/features/features.1/") or node.op_type == "Gemm":
            assert not any((p := producers(qm).get(i)) is not None and p.op_type == "DequantizeLinear" for i in node.input), node.name
    assert input_producer(qm, "/features/features.3/conv1/conv1.0/Conv", 0).op_type == "DequantizeLinear"
    # a ranges file that lacks a tensor the placement needs: exit 2, the tensor named, nothing written
    partial = {k: v for k, v in ranges.items() if k != "/features/features.3/relu/Relu_output_0"}
    from trtrepo.calibrate import Ranges

    Ranges(partial, method="entropy").save_json(tmp_path / "partial.json")
    out2 = tmp_path / "q2.onnx"
    res = run_cli("quantize", demo_onnx, "--ranges", tmp_path / "partial.json", "-o", out2)
    assert res.exit_code == 2 and "'/features/features.3/relu/Relu_output_0'" in res.stderr
    assert not out2.exists()


def test_onnxruntime_unit_extras_without_ranges_run_float(caplog):
    model = residual_model(tail=True)
    ranges, feed = amax_all(model)
    del ranges["c"]  # conv2's output: only the Add unit needs it
    with caplog.at_level("WARNING", logger="trtrepo.qdq"):
        qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    assert "node units" in caplog.text and "'c'" in caplog.text
    add = next(n for n in qm.graph.node if n.name == "add")
    assert "c" in add.input and producers(qm)[add.input[1 - list(add.input).index("c")]].op_type == "DequantizeLinear"
    assert np.isfinite(run(qm, feed)[0]).all()
    del ranges["r1"]  # conv2's input is required
    with pytest.raises(UsageError, match="no range for tensor 'r1'"):
        insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime"))


# --------------------------------------------------------------------------------------------
# Exact integer kernels on x86 CPUs without VNNI (U8S8 saturation)


def _saturating_block():
    """The residual block with inputs of a wide asymmetric range, and its ranges: large uint8
    activations against full-range int8 weights, the case VPMADDUBSW saturates on."""
    rng = np.random.default_rng(7)
    model = residual_model(rng=rng)
    x = rng.uniform(-1.0, 3.0, (2, 3, 8, 8)).astype(np.float32)
    x.flat[:2] = (-1.0, 3.0)
    ranges, feed = amax_all(model, {"x": x})
    return model, ranges, feed


def _unfused(model, feed):
    """The Q/DQ model as written (DQ -> float op -> Q, no integer kernels): the exact reference."""
    return make_session(model, optimization="disable").run(None, feed)[0]


def test_trtrepo_sessions_run_integer_kernels_exactly_on_this_cpu():
    model, ranges, feed = _saturating_block()
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    ref = _unfused(qm, feed)
    got = make_session(qm).run(None, feed)[0]  # fused: QLinearConv units
    step = float(np.abs(ref).max()) / 255  # about one output quantization step
    assert np.abs(got - ref).max() <= 2 * step


def test_without_vnni_plain_sessions_saturate_and_the_session_option_fixes_it():
    from trtrepo.cpu import X64_QUANT_PRECISION, cpu_int8

    if not cpu_int8().saturates:
        pytest.skip(f"U8S8 saturation happens only on x86 without VNNI; this CPU: {cpu_int8().describe()}")
    model, ranges, feed = _saturating_block()
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime")).model
    ref = _unfused(qm, feed)
    plain = ort.InferenceSession(qm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    fixed = make_session(qm, config={X64_QUANT_PRECISION: "1"}).run(None, feed)[0]
    step = float(np.abs(ref).max()) / 255
    assert np.abs(plain - ref).max() > 10 * step  # the hazard is real here
    assert np.abs(fixed - ref).max() <= 2 * step


def test_reduce_range_weights_are_7_bit_and_exact_without_the_session_option():
    model, ranges, feed = _saturating_block()
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime", reduce_range=True)).model
    for conv in ("conv0", "conv1", "conv2"):
        dq = input_producer(qm, conv, 1)
        wq, scale = init(qm, dq.input[0]), init(qm, dq.input[1])
        assert wq.dtype == np.int8 and np.abs(wq).max() == 64  # the largest weight of a channel maps to 64
        w = init(model, {"conv0": "w0", "conv1": "w1", "conv2": "w2"}[conv])
        assert np.allclose(scale, np.abs(w).reshape(len(w), -1).max(axis=1) / 64)
    ref = _unfused(qm, feed)
    # a plain session (as Triton's onnxruntime backend opens it): no saturation with 7-bit weights
    plain = ort.InferenceSession(qm.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.abs(plain - ref).max() <= 2 * float(np.abs(ref).max()) / 255
    # still close to FP32
    (fp32,) = run(model, feed)
    assert np.abs(plain - fp32).max() < 0.05 * np.abs(fp32).max()


def test_reduce_range_is_refused_for_the_tensorrt_target():
    with pytest.raises(UsageError, match=r"7-bit weights \(reduce range\) is for the ONNX Runtime target \(TensorRT"):
        QuantizeOptions(target="tensorrt", reduce_range=True)


@pytest.mark.parametrize("target", ["onnxruntime", "tensorrt"])
def test_a_float_layer_never_reads_a_dequantized_activation(demo_onnx, demo_ranges, tmp_path, target):
    """A Conv/Gemm left in float (``--exclude-node``, the fallback, a tiny reduction) reads the
    float tensor, not the output of a DequantizeLinear: ONNX Runtime 1.32 quantizes the float
    weights of such a node itself, per tensor, at its basic optimization level (on the trained
    MobileNetV2's first depthwise convolution the logit MSE went from 0.089 to 0.44 that way)."""
    out = tmp_path / "q.onnx"
    quantize_model(demo_onnx, demo_ranges, out, QuantizeOptions(target=target, exclude_nodes=("/features/features.3/.*",)))
    model = onnx.load(out)
    made = producers(model)
    weighted = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    in_float = [n.name for n in weighted if getattr(made.get(n.input[1]), "op_type", None) != "DequantizeLinear"]
    assert "/features/features.3/conv1/conv1.0/Conv" in in_float, in_float
    for node in weighted:
        if node.name in in_float:
            assert getattr(made.get(node.input[0]), "op_type", None) != "DequantizeLinear", node.name
