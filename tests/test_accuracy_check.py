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

from trtrepo.data import DataOptions
from trtrepo.evaluate import ExpectedDrop, OutputMetrics
from trtrepo.qdq import QuantizeOptions
from trtrepo.quantize import AccuracyCheck, QuantizeSettings, run_quantize

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
    with caplog.at_level("WARNING", logger="trtrepo.quantize"):
        res = run_quantize(model, tmp_path / "q.onnx", data=str(data), method="auto",
                           options=QuantizeOptions(target="onnxruntime"))
    check = res.report.accuracy_check
    # 16 near-uniform classes, INT8 zeroes the output: each flip costs FP32's small margin, and
    # the flips on most samples add up to more than the 1-point limit (the estimate itself fails)
    assert check.measured and check.ok is False and "expected top-1 drop" in check.failures[0]
    assert check.verdict["rule"] == "expected top-1 drop" and check.verdict["value"] > 1.0
    assert not check.verdict["inconclusive"] and len(check.failures) == 1
    assert not any("not gated" in r.getMessage() for r in caplog.records)  # the gated output is not named twice
    assert any("INT8 ACCURACY LOSS" in r.getMessage() for r in caplog.records)
    assert (tmp_path / "q.onnx").is_file()  # quantize writes it anyway, and says so


def test_cli_quantize_exits_1_and_writes_nothing_when_the_check_fails(hard_case, tmp_path, run_cli):
    model, data = hard_case
    result = run_cli("quantize", model, "--data", data, "--target", "onnxruntime", "-o", tmp_path / "q.onnx")
    assert result.exit_code == 1
    assert "fails the held-out check" in result.stderr and "expected top-1 drop" in result.stderr
    assert "--accept-accuracy-loss" in result.stderr  # the command names the flag
    assert not (tmp_path / "q.onnx").exists()
    accepted = run_cli("quantize", model, "--data", data, "--target", "onnxruntime", "-o", tmp_path / "q.onnx",
                       "--accept-accuracy-loss", "--json")
    assert accepted.exit_code == 0 and (tmp_path / "q.onnx").is_file()
    assert "INT8 ACCURACY LOSS" in accepted.stderr
    import json

    acc = json.loads(accepted.stdout)["accuracy"]  # the same summary as deploy's
    assert acc["gate"]["passed"] is False and acc["outputs"][acc["gate"]["output"]]["cosine_mean"] < 0.5
    assert acc["outputs"][acc["gate"]["output"]]["expected_drop_points"] > 1.0
    assert acc["speed"]["int8_vs_fp32"] > 0


@pytest.mark.parametrize("accept", [False, True])
def test_deploy_ships_fp32_unless_accuracy_loss_is_accepted(hard_case, tmp_path, accept):
    from trtrepo.deploy import DeployOptions, deploy

    model, data = hard_case
    report = deploy(DeployOptions(source=str(model), data=DataOptions(str(data)), backend="onnxruntime",
                                  repo=str(tmp_path / "repo"), workdir=str(tmp_path / "work"),
                                  int8=QuantizeSettings(accept_accuracy_loss=accept, target_from_backend=True)))
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


def metrics(terms: list[float] | None, cosine: float, *, flip_cost: float = 0.9, top1: float | None = 0.5,
            acc: tuple[float, float] | None = None) -> dict[str, OutputMetrics]:
    """One output's metrics; ``terms``: the per-sample expected-drop terms (None: no classes)."""
    n = 300 if terms is None else len(terms)
    m = OutputMetrics("y", n, 0.1, 0.01, cosine, cosine, top1_agreement=top1 if terms is not None else None,
                      expected_drop=None if terms is None else ExpectedDrop.of(np.asarray(terms), flip_cost))
    if acc is not None:
        m.reference_accuracy, m.candidate_accuracy = acc
    return {"y": m}


@pytest.mark.parametrize("terms,cosine,acc,fails", [
    ([0.05] * 20 + [0.0] * 980, 0.5, None, False),  # 20 near-tie flips: 0.1 point; agreement and cosine not gated
    ([0.9] * 20 + [0.0] * 980, 0.999, None, True),  # 20 confident flips in 1000: 1.8 points
    (None, 0.995, None, False), (None, 0.985, None, True),  # no classes: cosine
    ([0.9] * 30 + [0.0] * 270, 0.5, (0.80, 0.795), False),  # labels decide: half a point lost
    ([0.0] * 300, 1.0, (0.80, 0.78), True),  # labels decide: two points lost although no top-1 changed
])
def test_check_rules(terms, cosine, acc, fails):
    assert bool(AccuracyCheck().failures(metrics(terms, cosine, acc=acc))) == fails


def test_the_expected_drop_verdicts_pass_fail_and_cannot_decide():
    check = AccuracyCheck()
    ok = check.judge(metrics([0.05] * 20 + [0.0] * 980, 0.99)["y"])
    assert ok["rule"] == "expected top-1 drop" and ok["ok"] is True and ok["inconclusive"] is False
    assert ok["value"] == pytest.approx(0.1) and ok["interval"][1] < 1.0 and ok["limit"] == 1.0
    assert "expected top-1 drop 0.10 points" in ok["message"] and "1000 samples" in ok["message"]
    bad = check.judge(metrics([0.9] * 20 + [0.0] * 980, 0.99)["y"])
    assert bad["ok"] is False and bad["inconclusive"] is False and bad["value"] == pytest.approx(1.8)
    # one flip of cost 0.33 in 60: 0.55 points, but the interval reaches over the limit
    few = check.judge(metrics([0.33] + [0.0] * 59, 1.0)["y"])
    assert few["ok"] is False and few["inconclusive"] is True and few["value"] < 1.0 < few["interval"][1]
    need = few["samples_to_decide"]
    assert f"cannot decide on 60 samples: about {need} would decide" in few["message"]
    assert 60 < need < 10_000
    # no flip at all: below MIN_PLAIN_SAMPLES the unseen flip keeps it open, from there on it passes
    from trtrepo.evaluate import MIN_PLAIN_SAMPLES

    tiny = check.judge(metrics([0.0] * (MIN_PLAIN_SAMPLES - 1), 1.0)["y"])
    assert tiny["inconclusive"] is True and tiny["samples_to_decide"] == MIN_PLAIN_SAMPLES
    assert check.judge(metrics([0.0] * MIN_PLAIN_SAMPLES, 1.0)["y"])["ok"] is True


def test_with_labels_the_expected_drop_is_printed_beside_the_label_drop():
    v = AccuracyCheck().judge(metrics([0.9] * 30 + [0.0] * 270, 0.5, acc=(0.80, 0.795))["y"])
    assert v["rule"] == "label accuracy drop" and v["ok"] is True
    assert "expected top-1 drop 9.00 points" in v["message"] and v["expected_drop"]["estimate"] == pytest.approx(9.0)


def test_a_label_failure_too_small_to_resolve_is_marked_inconclusive_and_still_fails():
    v = AccuracyCheck().judge(metrics([0.0] * 50, 1.0, acc=(1.0, 0.98))["y"])  # one sample in 50
    assert v["ok"] is False and v["inconclusive"] is True and "too few" in v["message"]


@pytest.fixture(scope="module")
def demo_outputs(demo_onnx):
    """FP32, its FP16 copy, a damaged copy (noise of twice the weights' spread on the last layer's
    weights) and a mildly damaged one (noise of their spread) of the demo CNN on the 597 demo:val
    images, with ONNX Runtime."""
    from trtrepo.data import open_data
    from trtrepo.evaluate import run_onnx
    from trtrepo.fp16 import convert_to_fp16

    model = onnx.load(str(demo_onnx))
    src = open_data("demo:val")

    def noisy(amplitude: float) -> onnx.ModelProto:
        out = onnx.load(str(demo_onnx))
        w = next(i for i in out.graph.initializer if i.name == "head.weight")
        a = numpy_helper.to_array(w)
        noise = np.random.default_rng(0).normal(0, amplitude * a.std(), a.shape)
        w.CopyFrom(numpy_helper.from_array((a + noise).astype(a.dtype), w.name))
        return out

    return {name: run_onnx(m, src).outputs for name, m in
            (("fp32", model), ("fp16", convert_to_fp16(model)), ("damaged", noisy(2.0)), ("mild", noisy(1.0)))}


def _judge(outputs, candidate, n=None, rows=None):
    from trtrepo.evaluate import compare_outputs

    cut = rows if rows is not None else slice(None, n)
    return AccuracyCheck().judge(compare_outputs({k: v[cut] for k, v in outputs["fp32"].items()},
                                                 {k: v[cut] for k, v in outputs[candidate].items()})["logits"])


def test_the_gate_passes_an_fp16_copy_on_enough_samples(demo_outputs):
    v = _judge(demo_outputs, "fp16")
    assert v["rule"] == "expected top-1 drop" and v["ok"] is True and v["samples"] == 597, v
    assert "top-1 agreement 100.0% on all" in v["message"]


def test_the_gate_fails_a_damaged_model(demo_outputs):
    v = _judge(demo_outputs, "damaged")
    assert v["ok"] is False and v["inconclusive"] is False and v["value"] > 2.0, v  # the estimate itself is over


def test_the_gate_cannot_decide_on_too_few_samples_and_names_the_size_that_would(demo_outputs):
    """The mildly damaged demo on 60 images, one of them flipped: an estimate under the limit
    whose interval reaches over it; on all 597 images the same model passes."""
    fp32, mild = demo_outputs["fp32"]["logits"], demo_outputs["mild"]["logits"]
    flipped = np.flatnonzero(fp32.argmax(1) != mild.argmax(1))
    assert len(flipped) >= 1
    kept = np.flatnonzero(fp32.argmax(1) == mild.argmax(1))[:59]
    few = _judge(demo_outputs, "mild", rows=np.sort(np.concatenate([flipped[:1], kept])))
    assert few["ok"] is False and few["inconclusive"] is True and few["value"] < 1.0, few
    need = few["samples_to_decide"]
    assert f"cannot decide on 60 samples: about {need} would decide" in few["message"]
    everything = _judge(demo_outputs, "mild")
    assert everything["ok"] is True and everything["samples"] == 597, everything


def test_quantize_without_labels_on_a_small_hold_out_cannot_decide(demo_onnx, demo_outputs, tmp_path):
    """The gate through ``quantize`` on unlabelled data: a hold-out below MIN_PLAIN_SAMPLES (a
    fifth of 100 images) cannot settle a 1-point limit even without a flip; the verdict does not
    pass, names the size that would decide, and shows the FP16 copy's expected drop on the same
    samples."""
    from trtrepo.data import open_data
    from trtrepo.evaluate import MIN_PLAIN_SAMPLES, run_onnx
    from trtrepo.quantize import AccuracyLoss

    src = open_data("demo:calib", limit=100, seed=0)
    x = np.concatenate([b.inputs["input"] for b in _iter(src)])
    np.savez(tmp_path / "x.npz", input=x)
    common = dict(data=str(tmp_path / "x.npz"), method="minmax", options=QuantizeOptions(target="onnxruntime"),
                  weight_rounding="nearest", smooth_quant=None, equalize=False)
    with pytest.raises(AccuracyLoss, match="cannot decide on 20 samples: about"):
        run_quantize(demo_onnx, tmp_path / "refused.onnx", accept_accuracy_loss=False, **common)
    assert not (tmp_path / "refused.onnx").exists()
    res = run_quantize(demo_onnx, tmp_path / "q.onnx", **common)  # the library default: write it, say so
    v = res.report.accuracy_check.verdict
    assert v["rule"] == "expected top-1 drop" and v["inconclusive"] is True and v["samples"] == 20
    assert v["samples_to_decide"] >= MIN_PLAIN_SAMPLES
    assert v["fp16_noise_floor"]["expected_drop"]["samples"] == 20
    assert "the FP16 copy on the same samples: expected top-1 drop" in v["message"]
    summary = res.report.accuracy_summary()
    assert summary.gate["passed"] is False and summary.gate["inconclusive"] is True
    assert any(line.startswith("gate NOT PASSED (too few samples to decide): ") and "would decide" in line
               for line in summary.summary_lines())
    assert any(line.startswith("FP16 noise floor") and "expected top-1 drop" in line for line in summary.summary_lines())
    # the INT8 model it wrote passes on all 597 demo:val images
    int8 = run_onnx(tmp_path / "q.onnx", open_data("demo:val")).outputs
    assert _judge({**demo_outputs, "int8": int8}, "int8")["ok"] is True


def _iter(src):
    from trtrepo.data import iter_batches

    return iter_batches(src, 64)


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
    assert acc["shipped"] == "fp32" and acc["gate"]["passed"] is False
    assert "expected top-1 drop" in acc["gate"]["failures"][0]
    assert acc["outputs"][acc["gate"]["output"]]["cosine_mean"] < 0.5


def test_deploy_eval_data_is_the_set_the_check_runs_on(tmp_path):
    """--eval-data: the INT8 choices and the check run on the given set (labelled demo:val, 597
    samples: the label rule), not on a fifth of --data."""
    from trtrepo.deploy import DeployOptions, deploy

    report = deploy(DeployOptions(source="demo", data=DataOptions("demo:calib", limit=300), backend="onnxruntime",
                                  repo=str(tmp_path / "repo"), workdir=str(tmp_path / "work"),
                                  int8=QuantizeSettings(eval_data="demo:val", method="minmax", weight_rounding="nearest",
                                                        smooth_quant=None, target_from_backend=True)))
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


def test_labels_outside_the_estimates_labelled_interval_are_flagged_as_miscalibration():
    """Labels that disagree with the estimate (a calibrated FP32 would have predicted a label drop
    near 0 where 5 points were lost) are named: the label-free gate would mislead on such data."""
    from trtrepo.evaluate import expected_top1_drop

    ref = np.log(np.tile([[0.55, 0.45]], (200, 1)))
    cand = ref.copy()
    cand[:10] = ref[:10, ::-1]  # 10 near-tie flips in 200: expected drop 0.5 points, spread about 1.6
    m = OutputMetrics("y", 200, 0.1, 0.01, 0.99, 0.9, top1_agreement=0.95,
                      expected_drop=expected_top1_drop(ref, cand))
    m.reference_accuracy, m.candidate_accuracy = 0.60, 0.55  # the labels: 10 flips, each one lost
    v = AccuracyCheck(max_top1_drop=10.0).judge(m)
    lo, hi = v["expected_drop"]["label_interval"]
    assert v["ok"] is True and v["estimate_holds"] is False and hi < 5.0
    assert f"predicts a label drop of {lo:.2f} to {hi:.2f} points" in v["message"] and "miscalibrated" in v["message"]
    m.candidate_accuracy = 0.595  # one of the ten lost: inside
    v = AccuracyCheck(max_top1_drop=10.0).judge(m)
    assert v["estimate_holds"] is True and "miscalibrated" not in v["message"]
