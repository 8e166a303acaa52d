"""Issue 40 item 3: when INT8 everywhere fails the gate, deploy searches the accuracy/speed front
(INT8 with the k most sensitive layers in float) and ships the fastest candidate that passes, or
FP32 saying why. The failing models are the demo CNN with calibration ranges damaged on purpose:
one Conv's input range clipped to 5 % (only that Conv in float fixes it), or every range clipped
(no candidate passes). Real ONNX Runtime, real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtrepo.cli import cli
from trtrepo.data import DataOptions
from trtrepo.qdq import QuantizeOptions
from trtrepo.quantize import QuantizeSettings
from trtrepo.quantize.front import MAX_ROWS, FrontRow, QualityFront

DAMAGED_CONV = "/features/features.4/features.4.0/Conv"
DAMAGED_INPUT = "/features/features.3/relu/Relu_output_0"  # that Conv's only input


def _clip(ranges: dict, names: list[str], factor: float = 0.05) -> dict:
    for name in names:
        entry = ranges["tensors"][name]
        for key in ("amax", "max", "min", "scale"):
            entry[key] *= factor
        entry.pop("histogram", None)
    return ranges


@pytest.fixture(scope="module")
def damaged(demo_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(one Conv's input clipped, every activation range clipped): ranges JSON files of the demo."""
    folder = tmp_path_factory.mktemp("front")
    good = folder / "ranges.json"
    res = CliRunner().invoke(cli, ["calibrate", str(demo_onnx), "--data", "demo:calib", "--limit", "128",
                                   "--method", "minmax", "--ranges", str(good), "-q"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    one, every = folder / "one.json", folder / "every.json"
    one.write_text(json.dumps(_clip(json.loads(good.read_text()), [DAMAGED_INPUT])))
    data = json.loads(good.read_text())
    every.write_text(json.dumps(_clip(data, [n for n in data["tensors"] if n != "input"])))
    return one, every


def test_deploy_ships_int8_with_the_damaged_layer_in_float_and_prints_the_front(demo_onnx, damaged, tmp_path, run_cli):
    one, _ = damaged
    res = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "128", "--ranges", one,
                  "--backend", "onnxruntime", "--target", "tensorrt", "--repo", tmp_path / "repo", "--name", "d",
                  "--workdir", tmp_path / "work", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["precision"] == "int8"
    front = out["front"]
    assert front["shipped"] == "int8" and front["shipped_layers_in_float"] == [DAMAGED_CONV]
    rows = front["rows"]
    assert rows[0]["label"] == "all INT8" and rows[0]["verdict"] == "fail" and rows[-1]["label"] == "FP32"
    assert rows[front["chosen"]]["verdict"] == "pass" and rows[front["chosen"]]["upper"] < 1.0
    assert front["sensitivity"][0]["layer"] == DAMAGED_CONV  # ranked first
    # the ranges are given: every --data sample is held out, so the ranking had only those (and says so)
    assert front["ranked_on"] == "held-out"
    assert any("ranked on the held-out data" in line for line in res.stderr.splitlines())
    assert out["accuracy"]["shipped"] == "int8" and out["accuracy"]["gate"]["passed"] is True
    assert {"name": DAMAGED_CONV, "reason": "sensitive: INT8 everywhere failed the gate (the accuracy/speed front)"} \
        in out["accuracy"]["kept_float"]
    # the console: the front with at most 5 rows, the speed left to TensorRT on the tensorrt target
    console = res.stderr.splitlines()
    start = next(i for i, line in enumerate(console) if line.startswith("accuracy/speed front"))
    table = console[start + 2:]
    table = table[:next(i for i, line in enumerate(table) if not line.strip()[:1].isdigit() and
                        not line.strip().startswith("all"))]
    assert 3 <= len(table) <= MAX_ROWS and "<- shipped" in table[1] and "TensorRT's to measure" in table[1]
    png = tmp_path / "work" / "front.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "work" / "quantize.json").read_text())
    assert report["front"]["rows"] == rows and report["front"]["shipped_layers_in_float"] == [DAMAGED_CONV]


def test_deploy_ships_fp32_saying_why_when_no_candidate_passes(demo_onnx, damaged, tmp_path):
    from trtrepo.deploy import DeployOptions, deploy

    _, every = damaged
    report = deploy(DeployOptions(source=str(demo_onnx), data=DataOptions("demo:calib", limit=128), backend="onnxruntime",
                                  int8=QuantizeSettings(ranges=str(every), placement=QuantizeOptions(target="tensorrt")),
                                  repo=str(tmp_path / "repo"), workdir=str(tmp_path / "work")))
    assert report.models[0].precision == "fp32"
    front = report.front
    assert front is not None and front.shipped is None and front.reason.startswith("no candidate passed; best: ")
    assert all(r.verdict != "pass" for r in front.rows[:-1]) and len(front.rows) >= 4  # k = 1, 2, 4, 8 tried
    assert any(n.startswith("no candidate passed; best: ") for n in report.notes)
    step = next(s for s in report.steps if s.step == "int8")
    assert step.status == "fallback" and "no candidate passed" in step.detail
    lines = report.summary_lines()
    start = lines.index(front.summary_lines()[0])
    assert sum("<- shipped" in line for line in lines[start:]) == 1 and len(front.shown()) <= MAX_ROWS
    assert (tmp_path / "work" / "front.png").is_file()


def test_the_front_prints_at_most_five_rows_keeping_the_chosen_all_int8_and_fp32():
    rows = [FrontRow(tuple(f"l{i}" for i in range(k)), "fail", "expected top-1 drop", 5.0 - k / 10, 6.0, label=f"{k}")
            for k in (0, 1, 2, 4, 8, 16)]
    rows[5] = FrontRow(rows[5].layers_in_float, "pass", "expected top-1 drop", 0.2, 0.6, 1.3, True, 2.0, True, "16")
    rows.append(FrontRow(tuple(f"l{i}" for i in range(30)), "pass", "expected top-1 drop", 0.0, 0.0, 1.0, True,
                         label="FP32"))
    front = QualityFront(tuple(rows), 5, "shipped", True)
    shown = front.shown()
    assert len(shown) == MAX_ROWS and {0, 5, 6} <= set(shown)
    table = front.summary_lines()[2:-1]
    assert len(table) == MAX_ROWS and "<- shipped" in table[3] and "1.30x +-2%" in table[3]


def test_a_model_is_never_told_faster_than_itself(demo_onnx):
    """The stable-window timing against FP32: the same model on both sides gives a ratio near 1."""
    from trtrepo.data import open_data
    from trtrepo.measure import Stability
    from trtrepo.qdq import load_model
    from trtrepo.quantize import Evaluator

    model = load_model(demo_onnx)
    ev = Evaluator(model, open_data("demo:calib", limit=64), batch_size=32)
    timed = ev.stable_ratio(model, model, Stability(interval_s=0.1, pct=10.0, max_trials=5))
    assert timed is not None and 0.5 < timed["ratio"] < 2.0 and 3 <= timed["windows"] <= 5
    assert isinstance(timed["stable"], bool) and timed["faster"] == (timed["stable"] and timed["ratio"] > 1 + timed["noise_pct"] / 100)


def test_the_layers_are_ranked_on_calibration_samples_never_on_the_held_out_ones_that_judge(demo_onnx, tmp_path):
    """With calibration data the ranking runs on RANK_SAMPLES calibration samples (ranked and judged
    on the same held-out crops, the front kept in float the layers that repaired those crops). A
    limit no model can meet (a negative drop) makes every row fail, so the whole front runs."""
    from trtrepo.data import open_data
    from trtrepo.quantize import QuantizeRequest, quantize_request
    from trtrepo.quantize.front import RANK_SAMPLES, FrontOptions
    from trtrepo.quantize.gate import AccuracyCheck

    req = QuantizeRequest.of(str(demo_onnx), str(tmp_path / "m.onnx"), data=open_data("demo:calib", limit=200), method="minmax",
                          check=AccuracyCheck(max_top1_drop=-1.0), accept_accuracy_loss=True,
                          front=FrontOptions(ks=(1, 2), measure_speed=False))
    report = quantize_request(req).report.to_dict()
    front = report["front"]
    assert front["ranked_on"] == "calibration" and front["ranked_samples"] == min(RANK_SAMPLES, 160)
    assert front["shipped"] == "fp32" and len(front["sensitivity"]) > 2
    judged = front["rows"][:-1]  # all INT8, k = 1, 2: judged on the 40 held out
    assert len(judged) == 3 and all(r["verdict"] != "pass" for r in judged)


@pytest.mark.long
def test_on_the_onnxruntime_target_every_row_is_timed_and_a_slower_candidate_never_ships(demo_onnx, damaged, tmp_path):
    """The CPU target: each row timed against FP32 with stable windows; the candidate that passes
    ships only when faster beyond the noise, or, when the windows never agreed, on accuracy with
    the speed said to be unknown (unless every window says slower); otherwise FP32 ships saying it
    was not faster."""
    from trtrepo.deploy import DeployOptions, deploy

    one, _ = damaged
    report = deploy(DeployOptions(source=str(demo_onnx), data=DataOptions("demo:calib", limit=128), backend="onnxruntime",
                                  int8=QuantizeSettings(ranges=str(one), target_from_backend=True),
                                  repo=str(tmp_path / "repo"), workdir=str(tmp_path / "work")))
    front = report.front
    assert front is not None and front.speed_measured
    assert all(r.speed is not None and r.speed_stable is not None for r in front.rows)
    passing = next(r for r in front.rows if r.verdict == "pass")
    assert passing.layers_in_float == (DAMAGED_CONV,)
    if front.shipped is not None:
        assert report.models[0].precision == "int8"
        assert front.shipped.faster or (front.shipped.speed_stable is False and "could not be told" in front.reason)
    else:
        assert report.models[0].precision == "fp32" and "not faster" in front.reason
        assert passing.speed_stable or "in every timing window" in front.reason  # busy: slower beyond the noise


@pytest.mark.parametrize(("ratio", "noise", "ships"), [(0.55, 8.0, "fp32"), (0.97, 15.0, "int8")])
def test_on_a_busy_machine_a_candidate_slower_in_every_window_does_not_ship(demo_onnx, damaged, tmp_path, monkeypatch,
                                                                           ratio, noise, ships):
    """Windows whose throughputs never agree (a busy machine; the timing is the one thing set here:
    ONNX Runtime, the models and the gate are real): the passing candidate ships on accuracy unless
    the windows' side-by-side ratios say slower than FP32 beyond their noise; then FP32 ships."""
    from trtrepo.data import open_data
    from trtrepo.quantize import Evaluator, QuantizeRequest, quantize_request
    from trtrepo.quantize.front import FrontOptions, clearly_slower

    busy = {"ratio": ratio, "noise_pct": noise, "stable": False, "windows": 6, "faster": False}
    monkeypatch.setattr(Evaluator, "stable_ratio", lambda self, fp32, model, stability=None: dict(busy))
    one, _ = damaged
    req = QuantizeRequest.of(str(demo_onnx), str(tmp_path / "m.onnx"), data=open_data("demo:calib", limit=128),
                             ranges=str(one), options=QuantizeOptions(target="onnxruntime"), accept_accuracy_loss=True,
                             front=FrontOptions(ks=(1, 2), measure_speed=True))
    front = quantize_request(req).report.to_dict()["front"]
    assert front["shipped"] == ships and clearly_slower(busy) == (ships == "fp32")
    if ships == "fp32":
        assert "in every timing window" in front["reason"] and "not faster" in front["reason"]
    else:
        assert front["shipped_layers_in_float"] == [DAMAGED_CONV] and "could not be told" in front["reason"]
