"""Safe defaults (issue 13): every quantize/deploy run ends with a held-out check against FP32.
A model whose INT8 version really loses accuracy (a MatMul input with one +-1000 channel that
the weights ignore, so one per-tensor 8-bit scale rounds every useful channel to zero) makes
``quantize`` warn loudly and record it, and ``deploy`` ship FP32 unless --accept-accuracy-loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.autoquant import AccuracyCheck, run_quantize
from trtrepo.evaluate import OutputMetrics
from trtrepo.quantize import QuantizeOptions

K, C, N = 8, 16, 300


@pytest.fixture(scope="module")
def hard_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (K, C)).astype(np.float32)
    w[0] = 0.0  # the outlier channel carries no information
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc")], "hard",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", K])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", C])], [numpy_helper.from_array(w, "w")])
    folder = tmp_path_factory.mktemp("hard")
    model = folder / "hard.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    x = rng.normal(0, 0.05, (N, K)).astype(np.float32)
    x[:, 0] = rng.choice([-1000.0, 1000.0], N)
    data = folder / "x.npz"
    np.savez(data, x=x)
    return model, data


def test_quantize_warns_and_reports_a_failed_check(hard_case, tmp_path, caplog):
    model, data = hard_case
    with caplog.at_level("WARNING", logger="trtrepo.autoquant"):
        res = run_quantize(model, tmp_path / "q.onnx", data=str(data), method="auto",
                           options=QuantizeOptions(target="onnxruntime"))
    check = res.report.accuracy_check
    # 16 near-uniform classes: no FP32 top-1 is confident, so the cosine decides (INT8 zeroes the output)
    assert check.measured and check.ok is False and "cosine" in check.failures[0]
    assert check.verdict["rule"] == "mean cosine" and check.verdict["value"] < 0.5
    assert any("INT8 ACCURACY LOSS" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "q.onnx").is_file()  # quantize writes it anyway, and says so


def test_cli_quantize_exits_1_and_writes_nothing_when_the_check_fails(hard_case, tmp_path, run_cli):
    model, data = hard_case
    result = run_cli("quantize", model, "--data", data, "--target", "onnxruntime", "-o", tmp_path / "q.onnx")
    assert result.exit_code == 1
    assert "fails the held-out check" in result.stderr and "cosine" in result.stderr
    assert "--accept-accuracy-loss" in result.stderr  # the command names the flag
    assert not (tmp_path / "q.onnx").exists()
    accepted = run_cli("quantize", model, "--data", data, "--target", "onnxruntime", "-o", tmp_path / "q.onnx",
                       "--accept-accuracy-loss", "--json")
    assert accepted.exit_code == 0 and (tmp_path / "q.onnx").is_file()
    assert "INT8 ACCURACY LOSS" in accepted.stderr
    import json

    acc = json.loads(accepted.stdout)["accuracy"]  # the same summary as deploy's
    assert acc["gate"]["passed"] is False and acc["outputs"][acc["gate"]["output"]]["cosine_mean"] < 0.5
    assert acc["speed"]["int8_vs_fp32"] > 0


@pytest.mark.parametrize("accept", [False, True])
def test_deploy_ships_fp32_unless_accuracy_loss_is_accepted(hard_case, tmp_path, accept):
    from trtrepo.deploy import DeployOptions, deploy

    model, data = hard_case
    report = deploy(DeployOptions(source=str(model), data=str(data), backend="onnxruntime", repo=str(tmp_path / "repo"),
                                  workdir=str(tmp_path / "work"), accept_accuracy_loss=accept))
    (deployed,) = report.models
    step = next(s for s in report.steps if s.step == "int8")
    if accept:
        assert deployed.precision == "int8" and any("--accept-accuracy-loss" in n for n in report.notes)
    else:
        assert deployed.precision == "fp32" and step.status == "fallback" and "FAILED the held-out check" in step.detail
        assert any("INT8 not shipped" in n for n in report.notes)


def test_a_good_int8_model_passes_the_check(demo_onnx, tmp_path):
    res = run_quantize(demo_onnx, tmp_path / "d.onnx", data="demo:calib", data_args={"limit": 300, "seed": 0},
                       options=QuantizeOptions(target="tensorrt"), weight_rounding="nearest")
    assert res.report.accuracy_check.ok is True
    assert res.report.input_methods == {"input": res.method}


def test_labels_change_the_rule(demo_onnx, tmp_path):
    """With labelled evaluation data the gate is the label accuracy drop (the user's metric)."""
    res = run_quantize(demo_onnx, tmp_path / "d.onnx", data="demo:calib", data_args={"limit": 300, "seed": 0},
                       eval_data="demo:val", options=QuantizeOptions(target="onnxruntime"), weight_rounding="nearest")
    verdict = res.report.accuracy_check.verdict
    assert verdict["rule"] == "label accuracy drop" and verdict["samples"] == 597
    assert verdict["reference_accuracy"] > 0.97 and verdict["ok"] is True
    assert "label accuracy" in verdict["message"]


def metrics(conf: float | None, cosine: float, *, n_conf: int = 200, top1: float | None = 0.5,
            acc: tuple[float, float] | None = None) -> dict[str, OutputMetrics]:
    m = OutputMetrics("y", 300, 0.1, 0.01, cosine, cosine, top1_agreement=top1 if conf is not None else None,
                      confident_samples=n_conf if conf is not None else None, confident_agreement=conf)
    if acc is not None:
        m.reference_accuracy, m.candidate_accuracy = acc
    return {"y": m}


@pytest.mark.parametrize("conf,cosine,acc,fails", [
    (0.995, 0.5, None, False),  # confident samples agree: overall agreement and cosine are not gated
    (0.985, 0.999, None, True),  # 3 flips in 200 confident samples
    (None, 0.995, None, False), (None, 0.985, None, True),  # no classes: cosine
    (0.5, 0.5, (0.80, 0.795), False),  # labels decide: half a point lost
    (1.0, 1.0, (0.80, 0.78), True),  # labels decide: two points lost although every confident top-1 agrees
])
def test_check_rules(conf, cosine, acc, fails):
    assert bool(AccuracyCheck().failures(metrics(conf, cosine, acc=acc))) == fails


def test_a_failure_too_small_to_resolve_is_marked_inconclusive_and_still_fails():
    v = AccuracyCheck().judge(metrics(34 / 35, 1.0, n_conf=35)["y"])  # one flip in 35
    assert v["ok"] is False and v["inconclusive"] is True and "too few" in v["message"]
    v = AccuracyCheck().judge(metrics(0.90, 1.0, n_conf=400)["y"])  # 40 flips in 400: decided
    assert v["ok"] is False and v["inconclusive"] is False and v["interval"][1] < 0.99


def test_a_pass_on_few_samples_says_it_is_not_settled():
    few = AccuracyCheck().judge(metrics(1.0, 1.0, n_conf=40)["y"])
    assert few["ok"] is True and few["inconclusive"] is True and "settle it" in few["message"]
    many = AccuracyCheck().judge(metrics(1.0, 1.0, n_conf=500)["y"])
    assert many["ok"] is True and many["inconclusive"] is False and many["interval"][0] >= 0.99


def test_deploy_json_and_console_say_what_int8_cost(demo_onnx, tmp_path, run_cli):
    """Issue 27: deploy's console and ``--json`` carry the held-out figures, the choices, the layers
    kept in float (with the reason) and the INT8/FP32 speed ratio, all from one summary."""
    import json

    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "256", "--backend", "onnxruntime",
                  "--repo", tmp_path / "repo", "--name", "d", "--method", "minmax",
                  "--exclude-node", "/head/Gemm", "--weight-rounding", "nearest", "--json")
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["accuracy"]
    assert acc["shipped"] == "int8" and acc["method"] == "minmax" and acc["target"] == "onnxruntime"
    logits = acc["outputs"]["logits"]
    assert logits["samples"] == acc["held_out"]["samples"] == 51
    assert 0.9 <= logits["top1_agreement"] <= 1.0 and 0.99 < logits["cosine_mean"] <= 1.0 + 1e-6
    assert acc["gate"]["passed"] is True and acc["gate"]["output"] == "logits"
    assert {"name": "/head/Gemm", "reason": "excluded by the user"} in acc["kept_float"]
    assert acc["speed"]["int8_vs_fp32"] > 0 and acc["speed"]["batch_size"] == 32
    console = res.stderr  # under --json the console lines go to stderr
    assert "INT8 vs FP32 (onnxruntime target; shipped INT8)" in console
    assert "held-out 'logits' (51 held-out samples): " in console and "top-1 agreement" in console
    assert "speed INT8/FP32 on the held-out data: " in console and "kept in float: 1: /head/Gemm (excluded by the user)" in console


def test_deploy_that_falls_back_says_fp32_was_shipped_and_why(hard_case, tmp_path, run_cli):
    import json

    model, data = hard_case
    res = run_cli("deploy", model, "--data", data, "--backend", "onnxruntime", "--repo", tmp_path / "repo", "--json")
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["accuracy"]
    assert acc["shipped"] == "fp32" and acc["gate"]["passed"] is False and "cosine" in acc["gate"]["failures"][0]
    assert acc["outputs"][acc["gate"]["output"]]["cosine_mean"] < 0.5


def test_deploy_eval_data_is_the_set_the_check_runs_on(tmp_path):
    """--eval-data: the INT8 choices and the check run on the given set (labelled demo:val, 597
    samples: the label rule), not on a fifth of --data."""
    from trtrepo.deploy import DeployOptions, deploy

    report = deploy(DeployOptions(source="demo", data="demo:calib", limit=300, eval_data="demo:val", backend="onnxruntime",
                                  repo=str(tmp_path / "repo"), workdir=str(tmp_path / "work"), method="minmax",
                                  weight_rounding="nearest", smooth_quant=None))
    (deployed,) = report.models
    step = next(s for s in report.steps if s.step == "int8")
    assert deployed.precision == "int8" and "passed" in step.detail
    assert "label accuracy" in step.detail and "597 samples" in step.detail
    assert "(300 samples" in step.detail  # all of --data calibrates


def test_deploy_eval_data_without_data_is_refused(run_cli, tmp_path, demo_onnx):
    result = run_cli("deploy", demo_onnx, "--eval-data", "demo:val", "--backend", "onnxruntime",
                     "--repo", tmp_path / "repo")
    assert result.exit_code == 2
    assert "--eval-data demo:val" in result.stderr and "--data" in result.stderr
    assert not (tmp_path / "repo").exists()
