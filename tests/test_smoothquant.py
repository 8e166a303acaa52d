"""SmoothQuant (trtrepo.smoothquant): the smoothed FP32 model computes the same function, the
smoothed tensors' ranges are exact, outlier channels shrink, and smoothing makes INT8 of an
outlier-heavy MatMul input accurate where plain per-tensor INT8 is not."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.errors import UsageError
from trtrepo.qdq import ActivationRange, QuantizeOptions, insert_qdq, prepare_model
from trtrepo.smoothquant import apply_smoothquant, parse_alpha, smooth_candidates, smooth_scales

D, H = 32, 64


def block_model(pre_ln: bool, seed: int = 0) -> onnx.ModelProto:
    """x -> LayerNorm -> (two MatMuls sharing the LN output) -> Gelu-like Relu -> MatMul -> y.
    ``pre_ln``: the LN output feeds only the MatMuls (foldable); else it also feeds a residual Add."""
    rng = np.random.default_rng(seed)
    gamma = np.ones(D, np.float32)
    gamma[3] = 40.0  # an outlier channel, as trained LayerNorms have
    inits = [
        numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(np.zeros(D, np.float32), "beta"),
        numpy_helper.from_array(rng.normal(0, 0.2, (D, H)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.2, (D, H)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.2, (H, D)).astype(np.float32), "w3"),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "w1"], ["a"], name="mm1"),
        helper.make_node("MatMul", ["ln", "w2"], ["b"], name="mm2"),
        helper.make_node("Add", ["a", "b"], ["ab"], name="add"),
        helper.make_node("Relu", ["ab"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w3"], ["m3"], name="mm3"),
    ]
    if pre_ln:
        nodes.append(helper.make_node("Identity", ["m3"], ["y"], name="out"))
    else:
        nodes.append(helper.make_node("Add", ["m3", "ln"], ["y"], name="residual"))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, x: np.ndarray, names: list[str] | None = None) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(names, {"x": x})


def tensors(model: onnx.ModelProto, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
    """Values of intermediate tensors (added as graph outputs of a copy)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    outputs = {o.name for o in m.graph.output}
    for n in names:
        if n not in outputs:
            m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    return run(m, x, names)


def channel_stats(model: onnx.ModelProto, x: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    names = list(smooth_candidates(model))
    values = tensors(model, x, names)
    return {n: (v.min(axis=0).astype(np.float64), v.max(axis=0).astype(np.float64)) for n, v in zip(names, values, strict=True)}


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(1).normal(0, 1, (256, D)).astype(np.float32)


def test_smooth_scales_formula_and_guards():
    s = smooth_scales(np.array([4.0, 1.0, 0.0]), np.array([1.0, 4.0, 2.0]), 0.5)
    assert s[0] == pytest.approx(2.0) and s[1] == pytest.approx(0.5) and s[2] == 1.0  # zero channel untouched
    assert np.all(smooth_scales(np.array([1e9]), np.array([1e-9]), 1.0) <= 1e4)  # clipped
    with pytest.raises(ValueError):
        smooth_scales(np.ones(3), np.ones(4), 0.5)


@pytest.mark.parametrize("value,expected", [("off", None), ("auto", "auto"), ("0.8", 0.8), (None, None), (0.5, 0.5)])
def test_parse_alpha(value, expected):
    assert parse_alpha(value) == expected


@pytest.mark.parametrize("bad", ["1.5", "-0.1", "often"])
def test_parse_alpha_refuses_bad_values(bad):
    with pytest.raises(UsageError, match="the SmoothQuant alpha"):
        parse_alpha(bad)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_smoothed_model_is_the_same_function_with_exact_ranges(pre_ln, data):
    model = prepare_model(block_model(pre_ln))
    assert smooth_candidates(model) == {"ln": ["mm1", "mm2"], "r": ["mm3"]}
    channels = channel_stats(model, data)
    sm = apply_smoothquant(model, channels, 0.8)
    onnx.checker.check_model(sm.model)
    (ref,), (got,) = run(model, data), run(sm.model, data)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    folded = {g["input"]: g["folded_into"] for g in sm.groups}
    # pre-LN: 1/s goes into gamma/beta; post-LN (LN output also feeds the residual): an explicit Mul
    assert folded["ln"] == "ln" if pre_ln else folded["ln"].endswith("SmoothQuant")
    assert folded["r"].endswith("SmoothQuant")
    for tensor, (lo, hi) in sm.ranges.items():
        (v,) = tensors(sm.model, data, [tensor])
        assert (lo, hi) == pytest.approx((float(v.min()), float(v.max())), rel=1e-5, abs=1e-6)
    ln_group = next(g for g in sm.groups if g["input"] == "ln")
    assert ln_group["outlier_ratio"] > 10 and ln_group["smoothed_ratio"] < ln_group["outlier_ratio"] / 3


def test_smoothing_makes_int8_of_an_outlier_input_accurate(data):
    model = prepare_model(block_model(pre_ln=True))
    channels = channel_stats(model, data)
    names = [n for node in model.graph.node for n in node.output]
    plain_ranges = {n: ActivationRange(float(np.abs(v).max()), float(v.min()), float(v.max()))
                    for n, v in zip(names, tensors(model, data, names), strict=True)}
    (ref,) = run(model, data)

    def cosine(q: onnx.ModelProto) -> float:
        (got,) = run(q, data)
        return float(np.mean(np.sum(ref * got, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))))

    options = QuantizeOptions(target="onnxruntime")
    plain = cosine(insert_qdq(model, plain_ranges, options, warn=False).model)
    sm = apply_smoothquant(model, channels, 0.8)
    ranges = dict(plain_ranges)
    ranges.update({t: ActivationRange(max(abs(lo), abs(hi)), lo, hi) for t, (lo, hi) in sm.ranges.items()})
    smoothed = cosine(insert_qdq(sm.model, ranges, options, warn=False).model)
    assert smoothed > plain and 1 - smoothed < (1 - plain) / 3, (plain, smoothed)


def test_skip_leaves_named_nodes_alone(data):
    model = prepare_model(block_model(pre_ln=True))
    sm = apply_smoothquant(model, channel_stats(model, data), 0.8, skip={"mm3"})
    assert [g["input"] for g in sm.groups] == ["ln"]
