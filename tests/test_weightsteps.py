"""Weight steps of quantize (issue 26): bias correction and AdaRound (trtrepo.weightmath, pure
numpy) and their ONNX adapter (trtrepo.weightsteps), checked on synthetic layers and on the
trained demo CNN with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from trtrepo import weightmath as W


def _layer(seed: int = 0, groups: int = 2, og: int = 6, k: int = 12, n: int = 4000):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (groups, og, k)).astype(np.float32)
    x = (rng.normal(0.5, 1.0, (n, groups, k)) * rng.uniform(0.2, 2.0, k)).astype(np.float32)
    scale = (np.abs(w).max(axis=2) / 127.0).astype(np.float32)
    return w, x, scale


def _moments(x: np.ndarray, xq: np.ndarray | None = None) -> W.InputMoments:
    m = W.InputMoments(x.shape[1], x.shape[2])
    m.add(x, x if xq is None else xq)
    return m


def test_moments_give_the_exact_reconstruction_loss():
    w, x, scale = _layer()
    m = _moments(x)
    ws = W.round_nearest(w, scale, 127) * scale[..., None]
    x64, w64, ws64 = x.astype(np.float64), w.astype(np.float64), ws.astype(np.float64)
    direct = np.mean(np.sum((np.einsum("ngk,gok->ngo", x64, w64 - ws64)) ** 2, axis=2), axis=0)
    # the moments are float32 sums: the loss is a small difference of large terms, good to ~1 %
    np.testing.assert_allclose(W.reconstruction_loss(w, ws, m), direct, rtol=2e-2)


def test_bias_correction_removes_the_mean_output_error_also_of_a_quantized_input():
    w, x, scale = _layer(1)
    xq = np.round(x * 4) / 4  # a coarse input grid with a mean shift of its own
    m = _moments(x, xq)
    ws = (W.round_nearest(w, scale, 127) * scale[..., None]).astype(np.float32)
    err = np.einsum("ngk,gok->ngo", xq, ws) - np.einsum("ngk,gok->ngo", x, w)
    shift = W.bias_shift(w, ws, m)
    assert np.abs(err.mean(axis=0)).max() > 1e-3  # there is a mean error to correct
    np.testing.assert_allclose(err.mean(axis=0), shift, atol=1e-4)
    assert np.abs((err - shift).mean(axis=0)).max() < 1e-4


def test_adaround_beats_nearest_on_the_loss_keeps_the_grid_and_is_never_worse():
    w, x, scale = _layer(2)
    m = _moments(x)
    res = W.adaround(w, scale, m, iterations=300)
    assert not res.kept_nearest and res.loss_adaround < 0.8 * res.loss_nearest
    near = W.round_nearest(w, scale, 127)
    assert np.all(np.abs(res.q - w / scale[..., None]) < 1.0 + 1e-6)  # only floor or ceil
    # each channel's largest weight keeps +-127, so the writer derives the same scale
    np.testing.assert_array_equal(np.abs(res.q).max(axis=2), 127)
    assert (res.q != near).mean() > 0.01
    # a layer whose inputs are all zero gains nothing: nearest is kept
    zero = _moments(np.zeros_like(x))
    assert W.adaround(w, scale, zero, iterations=50).kept_nearest


@pytest.fixture(scope="module")
def demo_parts(demo_onnx):
    from trtrepo import weightsteps as WS
    from trtrepo.calibrate import Calibrator
    from trtrepo.data import open_data
    from trtrepo.modelio import ModelIO
    from trtrepo.qdq import QuantizeOptions, load_model, prepare_model
    from trtrepo.quantize import activation_ranges, calibration_tensors

    model = prepare_model(load_model(demo_onnx))
    options = QuantizeOptions(target="onnxruntime")
    calib = open_data("demo:calib", limit=256, seed=0)
    stats = Calibrator(demo_onnx, calib, tensors=calibration_tensors(model, options)).collect()
    ranges = activation_ranges(stats.compute("minmax"), stats)
    layers = WS.find_layers(model, options, ranges)
    batches = WS.cached_batches(calib, ModelIO.from_onnx(model))
    moments = WS.collect_moments(model, layers, batches, WS.activation_qparams_for(model, layers, ranges, options))
    return model, options, ranges, layers, moments


def test_weight_steps_put_weights_on_the_writers_grid(demo_parts):
    from onnx import numpy_helper

    from trtrepo import weightsteps as WS
    from trtrepo.qdq import insert_qdq, quantize_weight, weight_qparams

    model, options, ranges, layers, moments = demo_parts
    assert {la.op for la in layers} == {"Conv", "Gemm"} and len(layers) >= 8
    res = WS.round_weights(model, layers, moments, "adaround", options, budget_s=5)
    inits = {t.name: numpy_helper.to_array(t) for t in res.model.graph.initializer}
    orig = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for la in layers:
        ws = inits[la.weight]
        qp_new, qp_old = weight_qparams(ws, la.axis), weight_qparams(orig[la.weight], la.axis)
        np.testing.assert_allclose(qp_new.scale, qp_old.scale, rtol=1e-6)
        q = quantize_weight(ws, qp_new)
        shape = [1] * ws.ndim
        shape[la.axis] = -1
        np.testing.assert_allclose(q * qp_new.scale.reshape(shape), ws, rtol=1e-5, atol=1e-12)
    qm = insert_qdq(res.model, ranges, options, warn=False)  # the writer accepts it as any model
    assert sum(n.op_type == "DequantizeLinear" for n in qm.model.graph.node) > len(layers)


@pytest.mark.parametrize("step", ["bias_correction", "adaround"])
def test_each_step_lowers_the_held_out_error_of_the_trained_demo_cnn(demo_parts, step):
    """Held-out: demo:val (597 digits the calibration never saw), full INT8 Q/DQ model vs FP32."""
    from trtrepo import weightsteps as WS
    from trtrepo.data import open_data
    from trtrepo.evaluate import run_onnx
    from trtrepo.qdq import insert_qdq

    model, options, ranges, layers, moments = demo_parts
    val = open_data("demo:val")
    fp32 = run_onnx(model, val).outputs
    name = next(iter(fp32))

    def error(m) -> float:
        q = insert_qdq(m, ranges, options, warn=False).model
        return float(np.mean((run_onnx(q, val).outputs[name] - fp32[name]) ** 2))

    nearest = error(model)
    after = error(WS.round_weights(model, layers, moments, step, options, budget_s=5).model)
    assert after < 0.95 * nearest, (step, after, nearest)


def test_clip_safe_amplification_lifts_small_channels_within_the_clip():
    m = np.array([0.05, 0.5, 1.0, 5.0, 8.0, -1.0])
    s = W.clip_safe_amplification(m, clip=6.0, quantile=50.0, margin=4.0)
    assert s[5] == 1.0 and s[4] == 1.0 and s[3] == 1.0  # dead, clipping and large channels stay
    assert np.all(s <= 1.0) and np.all((m / s)[:3] <= 6.0 / 4.0 + 1e-9)  # amplified values keep the margin
    assert s[0] < s[1] < 1.0
    relu = W.clip_safe_amplification(np.array([0.1, 1.0, 2.0]), clip=None, quantile=100.0)
    np.testing.assert_allclose(relu, [0.05, 0.5, 1.0])  # ReLU: every channel lifted to the largest


def test_equalization_keeps_the_function_and_narrows_the_activation_range(tmp_path):
    """A Conv -> ReLU6 -> depthwise Conv chain with channels of very different scales: the
    equalized model computes the same outputs (< 1e-4 relative) while the activation that gets
    one per-tensor INT8 scale has its small channels lifted."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtrepo import equalize as EQ
    from trtrepo.data import ArraySource, iter_batches
    from trtrepo.evaluate import make_session
    from trtrepo.modelio import with_outputs

    rng = np.random.default_rng(0)
    c = 8
    w1 = (rng.normal(0, 1, (c, 3, 1, 1)) * np.logspace(-2, 0, c)[:, None, None, None]).astype(np.float32)
    w2 = rng.normal(0, 1, (c, 1, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(c, np.float32), "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.float32(0), "lo"),
             numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], name="expand"),
             helper.make_node("Clip", ["y1", "lo", "hi"], ["a1"], name="relu6"),
             helper.make_node("Conv", ["a1", "w2"], ["y"], name="dw", group=c, pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", c, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(0, 1, (64, 3, 8, 8)).astype(np.float32)
    batches = list(iter_batches(ArraySource("x", {"x": x[:48]}), 16))
    eq = EQ.equalize(model, batches)
    assert len(eq.chains) == 1 and eq.channels_scaled >= c // 2
    held = x[48:] * 1.5  # unseen and larger than calibration
    before = make_session(model).run(None, {"x": held})[0]
    after = make_session(eq.model).run(None, {"x": held})[0]
    assert np.max(np.abs(after - before)) / np.max(np.abs(before)) < 1e-4
    ranges = []
    for m in (model, eq.model):
        a = make_session(with_outputs(m, ["a1"])).run(["a1"], {"x": held})[0]
        per_channel = a.max(axis=(0, 2, 3))
        ranges.append(per_channel.min() / per_channel.max())
    assert ranges[1] > 5 * ranges[0]  # the smallest channel's range relative to the largest grew
    onnx.checker.check_model(eq.model)


def test_adaround_keeps_to_its_wall_time_budget(demo_parts):
    """Issue 40 item 4: the budget is wall time, measured as the layers run, not an iteration
    count: a budget that runs out leaves the remaining layers at nearest rounding (named in the
    report), and the iterations' time stays near the budget; a budget of 0 learns nothing."""
    from trtrepo import weightsteps as WS

    model, options, ranges, layers, moments = demo_parts
    ample = WS.round_weights(model, layers, moments, "adaround", options, budget_s=30)
    assert ample.budget_cut == 0 and sum(r.adaround == "learned" for r in ample.layers) >= len(layers) // 2
    assert ample.budget_short == 0  # every layer that learned ran its cap of steps
    per_layer = [r.iterations for r in ample.layers if r.iterations]
    assert per_layer and max(per_layer) <= WS.ADAROUND_ITERATIONS
    none = WS.round_weights(model, layers, moments, "adaround", options, budget_s=0)
    assert none.budget_cut == len([la for la in layers if moments[la.node].count >= 2 * la.k]) > 0
    assert all(r.adaround.startswith("nearest") and r.iterations == 0 for r in none.layers)
    # a budget of a small part of what the ample run spent: some layers learn, the rest are cut
    spent = sum(r.iterations for r in ample.layers)
    tight = WS.round_weights(model, layers, moments, "adaround", options, budget_s=ample.seconds / 8)
    assert 0 < sum(r.iterations for r in tight.layers) < spent
    assert tight.budget_cut > 0 and any(r.adaround == "nearest (time budget spent)" for r in tight.layers)


def test_the_budget_shares_the_time_left_by_cost_at_the_measured_speed():
    from trtrepo import weightsteps as WS

    small = WS.Layer("a", "Conv", "x", "w", None, 1, (8, 8, 1, 1))
    big = WS.Layer("b", "Conv", "y", "v", None, 1, (64, 64, 3, 3))
    budget = WS.AdaRoundBudget([small, big], budget_s=1.0, cap=10**9)
    first = budget.iterations(small)
    assert first >= WS.MIN_ITERATIONS  # the first layer measures the speed
    # it ran at 1e9 cost units a second: the 1 s budget is spent after it, the big layer is cut
    budget.done(small, first, WS._cost(small) * first / 1e9 + 1.0)
    assert budget.iterations(big) == 0 and budget.cut == 1


def test_layers_the_budget_shortens_below_the_cap_are_counted_and_named():
    """A layer that learns with fewer steps than the cap for lack of time is counted (``short``)
    and named in the note, beside the layers cut to nearest rounding: either makes the file depend
    on the machine's speed."""
    from trtrepo import weightsteps as WS

    layers = [WS.Layer(n, "Conv", "x", "w", None, 1, (16, 16, 3, 3)) for n in "abc"]
    budget = WS.AdaRoundBudget(layers, budget_s=10.0, cap=300)
    first = budget.iterations(layers[0])  # at the guessed speed 10 s hold the cap for all three
    assert first == 300 and budget.short == 0
    budget.done(layers[0], first, 4.0)  # but the first ran at 75 steps a second
    # 6 s left at 75 steps a second over two layers: 225 steps each, fewer than the cap of 300
    second = budget.iterations(layers[1])
    assert second == 225 and budget.short == 1
    budget.done(layers[1], second, 3.0)
    assert budget.iterations(layers[2]) == 225 and budget.short == 2 and budget.cut == 0
    assert "2 layer(s) ran fewer than 300 steps for lack of time" in budget.note()
