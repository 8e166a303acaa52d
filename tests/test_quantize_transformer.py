"""Transformer-aware quantization (issue 8): the additive-mask path, Softmax, LayerNorm and the
attention MatMuls stay float on both targets; tiny attention graphs built in code, calibration
through infinite masks, demo-text end to end (API and CLI, --method auto, cosine targets on a
selectable output, variable sequence lengths)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.evaluate import make_session
from trtrepo.qdq import QuantizeOptions, insert_qdq, plan_qdq, prepare_model, unquantizable_ranges

RNG = np.random.default_rng(0)
D, S = 8, 6
FMIN = float(np.finfo(np.float32).min)


def attention_model(mask_fill: str = "finfo") -> onnx.ModelProto:
    """x [B,S,D] float, mask [B,S] int64 -> one attention head with an additive mask, LayerNorm,
    an output projection (``y``) and a GEMV head (``score``, one output column).

    ``mask_fill``: ``finfo`` builds ``(1 - mask) * finfo.min`` (the BERT export);
    ``-inf`` builds ``Where(mask, 0, -inf)`` (masked_fill style, non-finite range)."""
    w = {n: (RNG.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    w["wg"] = RNG.standard_normal((D, 1)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"], name="qk"),
        helper.make_node("Div", ["s", "sqrt_d"], ["sd"], name="scale"),
        helper.make_node("Unsqueeze", ["mask", "axis1"], ["mask3"], name="mask_unsq"),
    ]
    inits = {"sqrt_d": np.asarray(np.sqrt(D), np.float32), "axis1": np.asarray([1], np.int64)}
    if mask_fill == "finfo":
        nodes += [helper.make_node("Cast", ["mask3"], ["maskf"], name="mask_cast", to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["one", "maskf"], ["inv"], name="mask_inv"),
                  helper.make_node("Mul", ["inv", "fmin"], ["additive"], name="mask_mul")]
        inits.update(one=np.asarray(1.0, np.float32), fmin=np.asarray(FMIN, np.float32))
    else:
        nodes += [helper.make_node("Cast", ["mask3"], ["maskb"], name="mask_cast", to=TensorProto.BOOL),
                  helper.make_node("Where", ["maskb", "zero", "neginf"], ["additive"], name="mask_where")]
        inits.update(zero=np.asarray(0.0, np.float32), neginf=np.asarray(-np.inf, np.float32))
    nodes += [
        helper.make_node("Add", ["sd", "additive"], ["scores"], name="mask_add"),
        helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["ctx"], name="pv"),
        helper.make_node("Add", ["x", "ctx"], ["res"], name="residual"),
        helper.make_node("LayerNormalization", ["res", "gamma", "beta"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "wo"], ["y"], name="out_proj"),
        helper.make_node("MatMul", ["ln", "wg"], ["score"], name="gemv"),
    ]
    inits.update(gamma=np.ones(D, np.float32), beta=np.zeros(D, np.float32), **w)
    graph = helper.make_graph(
        nodes, "attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", D]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", D]),
         helper.make_tensor_value_info("score", TensorProto.FLOAT, ["B", "S", 1])],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def feeds(n: int = 16) -> dict[str, np.ndarray]:
    x = RNG.standard_normal((n, S, D)).astype(np.float32)
    mask = np.ones((n, S), np.int64)
    for i in range(n):
        mask[i, 2 + i % (S - 2):] = 0  # variable lengths, at least two tokens attended
    return {"x": x, "mask": mask}


def exact_ranges(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """(min, max) of every float tensor from one ONNX Runtime run."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inferred = onnx.shape_inference.infer_shapes(m)
    floats = [vi.name for vi in inferred.graph.value_info if vi.type.tensor_type.elem_type == TensorProto.FLOAT]
    for name in floats:
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(names, feed), strict=True))
    ranges = {"x": (float(feed["x"].min()), float(feed["x"].max()))}
    ranges.update({n: (float(v.min()), float(v.max())) for n, v in out.items() if n in floats or n in ("y", "score")})
    return ranges


def q_inputs(model: onnx.ModelProto) -> set[str]:
    """Tensors that feed a QuantizeLinear (what got quantized)."""
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}


def dq_fed(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes with at least one input coming from a DequantizeLinear."""
    dq_out = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.name for n in model.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
            and any(i in dq_out for i in n.input)}


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return make_session(model).run(None, feed)


# --------------------------------------------------------------------------------------------
# Pure range checks


def test_unquantizable_ranges_flags_non_finite_and_outliers_only():
    ranges = {"a": 1.0, "b": 2.0, "c": 4.0, "mask": 3.4e38, "inf": float("inf"), "lo_inf": (-float("inf"), 1.0)}
    flagged = unquantizable_ranges(ranges)
    assert set(flagged) == {"mask", "inf", "lo_inf"}
    assert flagged["inf"] == "non-finite range" and "median" in flagged["mask"]
    # a large ratio with small absolute values is not an outlier (floor), nor 500x the median
    assert unquantizable_ranges({"a": 1e-4, "b": 1e-4, "c": 5.0}) == {}
    assert unquantizable_ranges({"a": 1.0, "b": 1.0, "c": 500.0, "d": 2.0}) == {}
    assert set(unquantizable_ranges({"a": 1.0, "b": 1.0, "c": 5e4})) == {"c"}


# --------------------------------------------------------------------------------------------
# Tiny attention graph


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime"])
def test_attention_graph_keeps_mask_softmax_layernorm_and_attention_matmuls_float(target, caplog):
    model = attention_model()
    feed = feeds()
    ranges = exact_ranges(model, feed)
    assert max(abs(ranges["additive"][0]), abs(ranges["scores"][0])) > 1e38  # the mask really is finfo.min
    with caplog.at_level(logging.WARNING, logger="trtrepo.qdq"):
        qm = insert_qdq(model, ranges, QuantizeOptions(target=target))
    plan = qm.plan
    # the mask path and its reasons
    assert {"additive", "scores"} <= set(plan.float_tensors)
    for node in ("mask_mul", "mask_add", "softmax", "qk", "pv", "scale", "ln", "gemv"):
        assert node in plan.auto_float, node
    assert "Q.K^T" in plan.auto_float["qk"] and "--quantize-attention" in plan.auto_float["pv"]
    assert "GEMV" in plan.auto_float["gemv"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "'scores'" in warned and "'additive'" in warned and "mask_add" in warned
    # nothing on the mask/score path or around the attention MatMuls is quantized
    quantized = q_inputs(qm.model)
    assert not quantized & {"s", "sd", "additive", "scores", "p", "score"}
    fed = dq_fed(qm.model)
    assert not fed & {"mask_add", "softmax", "scale", "gemv", "mask_mul"}
    if target == "tensorrt":
        assert not quantized & {"q", "kt", "v", "ctx", "res"} and not fed & {"qk", "pv", "ln"}
    else:
        # transformer-safe placement: q, k, v feed float ops (the attention MatMuls), so the projections
        # keep float outputs (MatMulIntegerToFloat, no requantization); the residual Add in front of
        # the LayerNorm stays float with its reason
        assert not quantized & {"q", "k", "v", "res"} and not fed & {"residual", "ln"}
        assert "residual-stream" in plan.auto_float["residual"]
    # the projections are quantized: input per tensor, weight per output channel (last axis of [K, N])
    assert {"q_proj", "k_proj", "v_proj", "out_proj"} <= fed
    assert {"x", "ln"} <= quantized
    for w in ("wq", "wo"):
        dq = next(n for n in qm.model.graph.node if n.op_type == "DequantizeLinear"
                  and any(i.startswith(w) for i in n.input[:1]))
        assert helper.get_attribute_value(next(a for a in dq.attribute if a.name == "axis")) == 1
        scale = next(numpy_helper.to_array(t) for t in qm.model.graph.initializer if t.name == dq.input[1])
        assert scale.shape == (D,)
    onnx.checker.check_model(qm.model, full_check=True)
    # it runs, and stays close to FP32 (a quantized mask would turn the softmax into noise)
    (ref_y, _), (got_y, _) = run(model, feed), run(qm.model, feed)
    assert np.all(np.isfinite(got_y))
    cos = np.sum(ref_y * got_y) / (np.linalg.norm(ref_y) * np.linalg.norm(got_y))
    assert cos > 0.995, cos


def test_quantize_attention_quantizes_qk_and_pv_but_not_the_mask():
    model = attention_model()
    ranges = exact_ranges(model, feeds())
    qm = insert_qdq(model, ranges, QuantizeOptions(quantize_attention=True))
    fed = dq_fed(qm.model)
    assert {"qk", "pv"} <= fed
    assert "qk" not in qm.plan.auto_float and "pv" not in qm.plan.auto_float
    # the score path's scale op is no longer kept for attention, but the mask path still is
    assert {"mask_add", "softmax"} <= set(qm.plan.auto_float)
    assert not q_inputs(qm.model) & {"additive", "scores"}


def test_mask_constant_is_found_without_ranges():
    """A finfo.min (or -inf) fill constant marks the mask path structurally: what calibration
    selects for a cache (no range for the mask) still keeps it float."""
    for fill in ("finfo", "-inf"):
        plan = plan_qdq(prepare_model(attention_model(fill)))
        assert "additive" in plan.float_tensors and "scores" in plan.float_tensors, fill
        assert "mask_add" in plan.auto_float and "softmax" in plan.auto_float


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime"])
def test_infinite_mask_calibrates_and_quantizes_without_crashing(target, tmp_path):
    """Where(mask, 0, -inf): calibration records the infinite tensors without a range (no crash),
    quantization keeps them float with the reason, and the Q/DQ model runs finite."""
    from trtrepo.calibrate import Calibrator
    from trtrepo.quantize import run_quantize

    model = attention_model("-inf")
    src = tmp_path / "attn.onnx"
    onnx.save(model, str(src))
    data = tmp_path / "calib.npz"
    feed = feeds(64)
    np.savez(data, **feed)
    stats = Calibrator(src, str(data), progress=False, batch_size=16).collect()
    assert {"additive", "scores"} <= set(stats.unbounded)
    assert "scores" not in stats.compute("entropy")  # no range rather than an invalid one
    res = run_quantize(src, tmp_path / "q.onnx", data=str(data), method="minmax", options=QuantizeOptions(target=target))
    # quantize calibrates only what its placement quantizes; the scores are kept float either for
    # their own non-finite range or as downstream of the mask
    assert res.float_tensors["scores"] in ("non-finite range", "downstream of the mask tensor 'additive'")
    assert res.report.float_tensors and "mask_add" in res.report.kept_float
    (y, _s) = run(onnx.load(str(res.path)), feed)
    assert np.all(np.isfinite(y))


# --------------------------------------------------------------------------------------------
# demo-text


@pytest.fixture(scope="module")
def text_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtrepo.export import export_onnx

    path = tmp_path_factory.mktemp("text") / "text.onnx"
    export_onnx("demo-text", path)
    return path


@pytest.mark.parametrize("target", ["tensorrt", "onnxruntime"])
def test_demo_text_mask_path_stays_float_and_accuracy_holds(text_onnx, tmp_path, target):
    from trtrepo.data import open_data
    from trtrepo.evaluate import evaluate
    from trtrepo.quantize import run_quantize

    res = run_quantize(text_onnx, tmp_path / "q.onnx", data="demo-text:calib", method="entropy",
                       options=QuantizeOptions(target=target), data_args={"limit": 256}, report_dir=tmp_path / "r")
    assert "/Mul_output_0" in res.float_tensors  # (1 - mask) * finfo.min
    assert {"/blocks.0/attn/Add_output_0", "/blocks.1/attn/Add_output_0"} <= set(res.float_tensors)
    assert {"/blocks.0/attn/Softmax", "/blocks.0/attn/MatMul", "/blocks.0/attn/MatMul_1",
            "/blocks.1/ln1/LayerNormalization"} <= set(res.kept_float)
    q = onnx.load(str(res.path))
    assert not q_inputs(q) & set(res.float_tensors)
    # weights per output channel on the right axis: MatMul [K, N] -> 1, the head Gemm (transB=1) -> 0
    axes = {n.input[0]: helper.get_attribute_value(a) for n in q.graph.node if n.op_type == "DequantizeLinear"
            for a in n.attribute if a.name == "axis"}
    matmul_w = [k for k in axes if k.startswith("onnx::MatMul")]
    assert matmul_w and all(axes[k] == 1 for k in matmul_w)
    head = [k for k in axes if k.startswith("head.weight")]
    assert head and all(axes[k] == 0 for k in head)
    md = (tmp_path / "r" / "quantize.md").read_text()
    assert "Kept in float automatically" in md and "/Mul_output_0" in md
    report = evaluate(text_onnx, res.path, open_data("demo-text:val", limit=128))
    assert report.outputs["embedding"].cosine_mean > 0.999
    assert report.outputs["logits"].top1_agreement >= 0.98
    assert report.outputs["embedding"].top1_agreement is None  # not a classifier: cosine/abs errors only


def test_demo_text_auto_with_cosine_target_on_embedding_cli(text_onnx, tmp_path, run_cli):
    out, rep = tmp_path / "q.onnx", tmp_path / "rep"
    r = run_cli("quantize", text_onnx, "-o", out, "--data", "demo-text:calib", "--limit", "400", "--method", "auto",
                "--accuracy-target", "cosine=0.99", "--metric-output", "embedding", "--report", rep, "--no-progress")
    assert r.exit_code == 0, r.output
    report = json.loads((rep / "quantize.json").read_text())
    assert report["metric_output"] == "embedding" and report["accuracy_target"] == "cosine=0.99 on 'embedding'"
    assert len(report["methods"]) == 4 and report["steps"][-1]["met"]
    best = next(m for m in report["methods"] if m["label"] == report["method"])
    assert best["outputs"]["embedding"]["cosine_mean"] == max(m["outputs"]["embedding"]["cosine_mean"] for m in report["methods"])
    assert report["metrics"]["embedding"]["cosine_mean"] >= 0.99
    emb = report["metrics"]["embedding"]  # keys stay, top-k does not apply to an embedding
    assert "top1_agreement" in emb and emb["top1_agreement"] is None and emb["top5_agreement"] is None
    assert report["metrics"]["logits"]["top1_agreement"] is not None
    assert "kept in float: 3 tensor(s)" in r.output and "/Mul_output_0" in r.output
    assert out.is_file()


def test_demo_text_cosine_target_api_onnxruntime_and_bad_metric_output(text_onnx, tmp_path, run_cli):
    from trtrepo.errors import UsageError
    from trtrepo.quantize import run_quantize

    res = run_quantize(text_onnx, tmp_path / "q.onnx", data="demo-text:calib", method="minmax",
                       options=QuantizeOptions(target="onnxruntime"), accuracy_target="cosine=0.999",
                       metric_output="embedding", data_args={"limit": 300})
    assert res.report.steps[-1].met and res.report.metrics["embedding"].cosine_mean >= 0.999
    with pytest.raises(UsageError, match="the metric output 'pooled'.*outputs: logits, embedding"):
        run_quantize(text_onnx, tmp_path / "x.onnx", data="demo-text:calib", method="minmax", metric_output="pooled")
    r = run_cli("quantize", text_onnx, "-o", tmp_path / "y.onnx", "--data", "demo-text:calib", "--metric-output", "pooled",
                "--accuracy-target", "cosine=0.99")
    assert r.exit_code == 2 and "pooled" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "y.onnx").exists()
