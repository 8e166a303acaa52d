"""onnxruntime target, transformer-safe placement (issue 13), on the demo-text encoder as ONNX
Runtime actually runs it: the weighted MatMuls become integer kernels with float outputs
(MatMulIntegerToFloat), nothing on the residual stream is requantized, ``--exclude-op Add``
keeps every MatMul kernel, and the quantize report says what each exclusion costs."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from trtrepo.evaluate import integer_kernels
from trtrepo.qdq import QuantizeOptions, prepare_model
from trtrepo.quantize import run_quantize


@pytest.fixture(scope="module")
def text_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trtrepo.export import export_onnx

    path = tmp_path_factory.mktemp("text") / "demo_text.onnx"
    export_onnx("demo-text", path)
    return path


def weighted_matmuls(path: Path) -> int:
    model = prepare_model(onnx.load(str(path)))
    inits = {t.name for t in model.graph.initializer}
    return sum(1 for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits)


@pytest.fixture(scope="module")
def quantized(text_onnx: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("q") / "q.onnx"
    res = run_quantize(text_onnx, out, data="demo-text:calib", method="minmax", smooth_quant=None,
                       options=QuantizeOptions(target="onnxruntime"), data_args={"limit": 256, "seed": 0})
    return res, out


def test_weighted_matmuls_run_as_integer_kernels_with_float_outputs(text_onnx, quantized):
    res, out = quantized
    kernels = integer_kernels(out)
    n = weighted_matmuls(text_onnx)
    assert n >= 4
    # every weighted MatMul runs as an integer kernel; their outputs feed float ops (bias Add,
    # attention, residual), so they are not requantized: MatMulIntegerToFloat, not QLinearMatMul
    assert kernels.get("MatMulIntegerToFloat", 0) + kernels.get("QLinearMatMul", 0) + kernels.get("QGemm", 0) >= n - 1
    assert kernels.get("MatMulIntegerToFloat", 0) >= n // 2, kernels
    # the residual stream is float: no QLinearAdd in front of a LayerNorm
    assert kernels.get("QLinearAdd", 0) == 0, kernels
    assert any("residual-stream" in why for why in res.kept_float.values())
    assert res.report.integer_kernels["kernels"]["total"] == kernels["total"]
    # and it stays accurate on held-out data (the run's own check against FP32)
    assert res.report.accuracy_check.ok is True


def test_full_node_units_are_still_available_and_requantize(text_onnx, tmp_path):
    """transformer_safe=False restores the old placement (QLinearMatMul/QLinearAdd units)."""
    out = tmp_path / "units.onnx"
    run_quantize(text_onnx, out, data="demo-text:calib", method="minmax", smooth_quant=None, check=None,
                 options=QuantizeOptions(target="onnxruntime", transformer_safe=False), data_args={"limit": 128, "seed": 0})
    kernels = integer_kernels(out)
    assert kernels.get("QLinearMatMul", 0) > 0 and kernels.get("QLinearAdd", 0) > 0, kernels


def test_exclude_op_add_keeps_the_matmul_kernels_and_reports_its_cost(text_onnx, quantized, tmp_path):
    _, base_out = quantized
    base = integer_kernels(base_out)
    out = tmp_path / "noadd.onnx"
    res = run_quantize(text_onnx, out, data="demo-text:calib", method="minmax", smooth_quant=None,
                       options=QuantizeOptions(target="onnxruntime", exclude_ops=("Add",)),
                       data_args={"limit": 256, "seed": 0})
    kernels = integer_kernels(out)
    assert kernels.get("MatMulIntegerToFloat", 0) == base.get("MatMulIntegerToFloat", 0)
    costs = res.report.integer_kernels["exclusion_costs"]
    assert [c["exclusion"] for c in costs] == ["--exclude-op Add"]
    assert costs[0]["kernels_lost"] == base["total"] - kernels["total"] >= 0
    # excluding the MatMuls themselves does cost kernels, and the report says how many
    out2 = tmp_path / "nomm.onnx"
    res2 = run_quantize(text_onnx, out2, data="demo-text:calib", method="minmax", smooth_quant=None, check=None,
                        options=QuantizeOptions(target="onnxruntime", exclude_nodes=(".*MatMul.*",)),
                        data_args={"limit": 128, "seed": 0})
    cost = res2.report.integer_kernels["exclusion_costs"][0]
    assert cost["kernels_lost"] > 0 and cost["kernels_without_it"] >= kernels["total"] - 1


def test_smoothed_inputs_get_the_same_range_whatever_the_method_and_the_report_says_so(text_onnx, tmp_path):
    """Issue 26 item 3: a SmoothQuant input's range is the exact min/max of the smoothed
    statistics, so --method does not change it; the report (and --help) name that rule."""
    from onnx import numpy_helper

    scales = {}
    for method in ("minmax", "entropy"):
        out = tmp_path / f"{method}.onnx"
        res = run_quantize(text_onnx, out, data="demo-text:calib", method=method, smooth_quant=0.8, check=None,
                           options=QuantizeOptions(target="tensorrt"), data_args={"limit": 128, "seed": 0})
        sq = res.report.smooth_quant
        assert sq.alpha == 0.8 and sq.groups and "whatever the method" in sq.range_rule
        # the Q of a smoothed input reads the LayerNorm output (scales folded in) or the inserted Mul's output
        smoothed = {g["input"] for g in sq.groups} | {f"{g['input']}_smoothed" for g in sq.groups}
        model = onnx.load(str(out))
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        scales[method] = {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node
                          if n.op_type == "QuantizeLinear" and n.input[0] in smoothed}
    assert scales["minmax"] and scales["minmax"] == scales["entropy"]
