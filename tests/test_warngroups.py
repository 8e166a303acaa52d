"""Warnings grouped by cause (issue 40 item 5, issue 41 item 6): a conv net whose every layer has
near-dead channels with a large bias makes the onnxruntime target raise weight scales for the
int32 bias in every layer of every candidate tried. ``quantize`` and ``deploy`` print one line for
that cause with the counts of the shipped model (they printed one line per layer and candidate:
36 and 24 lines for the 8-layer net of issue 40), and the per-layer details go to the report
(quantize.json, quantize.md) and to ``--json``'s ``warnings``."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtrepo.qdq import weight_qparams
from trtrepo.warngroups import Cause, Detail, collecting, group, in_run

LAYERS, CHANNELS, DEAD = 6, 8, 3  # DEAD near-dead channels (weights ~1e-9, bias 500) per layer


def dead_channel_net(path):
    """x [N, 3, 8, 8] -> LAYERS x (Conv 3x3 -> Relu) -> GlobalAveragePool -> Gemm -> logits [N, 10].
    The first DEAD channels of every Conv have weights ~1e-9 and bias 500: their int32 bias does
    not fit at s_x * s_w for any range of the input. Returns {conv name: FP32 weight}."""
    rng = np.random.default_rng(0)
    nodes, inits, weights_of, t = [], [], {}, "x"
    for i in range(LAYERS):
        w = rng.standard_normal((CHANNELS, CHANNELS if i else 3, 3, 3)).astype(np.float32) * 0.2
        w[:DEAD] *= 5e-9
        b = (rng.standard_normal(CHANNELS) * 0.1).astype(np.float32)
        b[:DEAD] = 500.0
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("Conv", [t, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        weights_of[f"conv{i}"], t = w, f"r{i}"
    nodes += [helper.make_node("GlobalAveragePool", [t], ["p"], name="gap"),
              helper.make_node("Flatten", ["p"], ["f"], name="flat"),
              helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], name="fc", transB=1)]
    inits += [numpy_helper.from_array((rng.standard_normal((10, CHANNELS)) * 0.1).astype(np.float32), "wf"),
              numpy_helper.from_array(np.zeros(10, np.float32), "bf")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return weights_of


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    """(model path, data path, FP32 weights): 160 samples: deploy tries every method, and its hold-out of 32 can pass the gate (>= MIN_PLAIN_SAMPLES)."""
    folder = tmp_path_factory.mktemp("dead_channels")
    weights_of = dead_channel_net(folder / "m.onnx")
    x = np.random.default_rng(1).uniform(-1, 1, (160, 3, 8, 8)).astype(np.float32)
    np.savez(folder / "d.npz", x=x)
    return folder / "m.onnx", folder / "d.npz", weights_of


def raised_scales(qdq_path, weights_of):
    """{conv: weight scales above nearest rounding's} in a shipped Q/DQ model (weights rounded to
    nearest, so the FP32 weights are the original ones)."""
    model = onnx.load(qdq_path)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    by_output = {o: n for n in model.graph.node for o in n.output}
    raised = {}
    for node in model.graph.node:
        if node.name in weights_of:
            scale = inits[by_output[node.input[1]].input[1]]
            raised[node.name] = int(np.count_nonzero(scale > weight_qparams(weights_of[node.name], 0).scale))
    return raised


def console_lines(result, caplog, text):
    """The lines with ``text`` the run showed on the console: its warnings (logged) and what it
    printed on stderr (under ``--json`` stdout is the JSON object alone)."""
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("trtrepo")]
    return [line for line in logged + result.stderr.splitlines() if text in line]


def test_quantize_prints_one_line_for_the_int32_bias_and_reports_each_layer(run_cli, net, tmp_path, caplog):
    model, data, weights_of = net
    with caplog.at_level(logging.WARNING, logger="trtrepo"):
        r = run_cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", data, "--target", "onnxruntime",
                    "--weight-rounding", "nearest", "--report", tmp_path / "rep", "--json")
    assert r.exit_code == 0, r.output
    raised = raised_scales(tmp_path / "q.onnx", weights_of)
    assert raised == {f"conv{i}": DEAD for i in range(LAYERS)}  # every layer, in the model shipped
    lines = console_lines(r, caplog, "int32 bias")
    assert len(lines) == 1, lines  # was one per layer and method tried: 24 here
    assert f"raised {LAYERS * DEAD} weight scale(s) in {LAYERS} layer(s)" in lines[0], lines
    summary = json.loads(r.stdout)
    (entry,) = [w for w in summary["warnings"] if w["cause"] == "int32_bias"]
    assert entry["counts"] == {"layers": LAYERS, "weight_scales": LAYERS * DEAD} and entry["shipped"] is True
    assert {d["layers"][0]: d["weight_scales"] for d in entry["details"]} == raised
    assert all("int32 bias does not fit" in d["message"] for d in entry["details"])
    report = json.loads((tmp_path / "rep" / "quantize.json").read_text())
    assert report["warnings"] == summary["warnings"]
    md = (tmp_path / "rep" / "quantize.md").read_text()
    assert "## Warnings" in md and all(f"| `conv{i}` | {DEAD} |" in md for i in range(LAYERS))


def test_deploy_prints_one_line_for_the_int32_bias_and_json_carries_the_details(run_cli, net, tmp_path, caplog):
    model, data, weights_of = net
    with caplog.at_level(logging.WARNING, logger="trtrepo"):
        r = run_cli("deploy", model, "--data", data, "--backend", "onnxruntime", "--repo", tmp_path / "repo",
                    "--name", "m", "--weight-rounding", "nearest", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["precision"] == "int8"
    lines = console_lines(r, caplog, "int32 bias")
    assert len(lines) == 1, lines  # was one per layer and candidate tried
    assert f"raised {LAYERS * DEAD} weight scale(s) in {LAYERS} layer(s)" in lines[0], lines
    (entry,) = [w for w in summary["warnings"] if w["cause"] == "int32_bias"]  # was "warnings": []
    assert entry["counts"] == {"layers": LAYERS, "weight_scales": LAYERS * DEAD} and entry["shipped"] is True
    shipped = raised_scales(tmp_path / "repo" / "m" / "1" / "model.onnx", weights_of)
    assert {d["layers"][0]: d["weight_scales"] for d in entry["details"]} == shipped
    assert all(isinstance(w, dict) and w["cause"] and w["message"] for w in summary["warnings"])


# --------------------------------------------------------------------------------------------
# The collector itself

CAUSE = Cause("c", "thing: {count} unit(s) in {subjects} layer(s)", subject="layer", counted="units")


def detail(layer, n=1):
    return Detail(CAUSE, (layer,), n, f"{layer}: {n}")


def test_one_line_per_cause_when_the_outermost_run_ends(caplog):
    log = logging.getLogger("trtrepo.test_warngroups")
    assert not in_run()
    with caplog.at_level(logging.INFO, logger="trtrepo.test_warngroups"):
        with collecting(log, where="the report") as outer:
            with collecting(log, where="elsewhere") as inner:  # a nested run reports through the outer one
                assert inner is outer and in_run()
                inner.keep([detail("a", 2), detail("b")])
            assert not caplog.records
            outer.keep([detail("a", 2)])  # the same case again (another candidate): counted once
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["thing: 3 unit(s) in 2 layer(s); per-layer details in the report"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == ["  a: 2", "  b: 1"]
    assert not in_run()


def test_a_run_that_fails_logs_nothing_and_one_not_shipped_says_so(caplog):
    log = logging.getLogger("trtrepo.test_warngroups")
    with caplog.at_level(logging.WARNING, logger="trtrepo.test_warngroups"):
        with pytest.raises(RuntimeError), collecting(log, where="x") as run:
            run.keep([detail("a")])
            raise RuntimeError
        assert not caplog.records
        with collecting(log, where="x") as run:
            run.keep([detail("a")])
            run.not_shipped("the FP32 model was deployed")
            (g,) = run.groups()
    assert g.to_dict()["shipped"] is False
    assert caplog.messages == ["thing: 1 unit(s) in 1 layer(s) (in a model that was not shipped: the FP32 model "
                               "was deployed); per-layer details in x"]
    assert group([]) == ()
