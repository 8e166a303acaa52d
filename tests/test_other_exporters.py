"""Issue 43 item 5 (models from other exporters) and item 1's ``--task detect``.

* Weights as ``Constant`` nodes (paddle2onnx's layout) and initializers also listed as graph inputs
  (old PyTorch exports, ``keep_initializers_as_inputs=True``) quantize through the real CLI: the
  INT8 model keeps the original's data inputs and stays close to FP32 on ONNX Runtime.
* ``--task detect`` makes a detector of a model whose decode head the graph walk does not
  recognise (class scores through HardSigmoid, not Sigmoid) and whose exporter left no metadata:
  it is judged in boxes; a model without a YOLO-layout output is refused with one line.
* ``--ranges FILE`` (dynamic ranges by hand, no calibration) on such a model, and the example of
  docs/cli.md read as it says.

Models are built here from small torch modules; ONNX Runtime runs them for real."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import helper
from test_detector_head import SIZE, AnchorFree, _export
from torch import nn

from trtrepo.modelio import ModelIO, normalize_weights
from trtrepo.qdq import RangesFile, detector_outputs, find_decode_heads
from trtrepo.qdq.graph import GraphView


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)).eval()


def _export_cnn(path, **kw) -> None:
    torch.onnx.export(_cnn(), (torch.zeros(1, 3, 32, 32),), str(path), input_names=["image"], output_names=["logits"],
                      dynamo=False, opset_version=17, dynamic_axes={"image": {0: "n"}, "logits": {0: "n"}}, **kw)


def _constant_weights(path) -> None:
    """Every initializer made a Constant node, as paddle2onnx lays weights out."""
    _export_cnn(path)
    model = onnx.load(str(path))
    consts = [helper.make_node("Constant", [], [t.name], name=f"w{i}", value=t) for i, t in enumerate(model.graph.initializer)]
    nodes = consts + list(model.graph.node)
    del model.graph.initializer[:]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _initializers_as_inputs(path) -> None:
    _export_cnn(path, keep_initializers_as_inputs=True)


EXPORTERS = {"constant_nodes": _constant_weights, "initializers_as_inputs": _initializers_as_inputs}


def _run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x})[0]


@pytest.mark.parametrize("kind", sorted(EXPORTERS))
def test_other_exporters_weight_layouts_are_normalized_without_changing_outputs(tmp_path, kind):
    path = tmp_path / "m.onnx"
    EXPORTERS[kind](path)
    model = onnx.load(str(path))
    assert kind != "constant_nodes" or not model.graph.initializer
    assert kind != "initializers_as_inputs" or len(model.graph.input) > 1
    assert ModelIO.from_onnx(model).input_names == ["image"]  # the data input only, before normalizing too
    notes = normalize_weights(model)
    assert len(notes) == 1 and ("Constant" if kind == "constant_nodes" else "graph inputs") in notes[0]
    assert [i.name for i in model.graph.input] == ["image"]
    assert not [n for n in model.graph.node if n.op_type == "Constant"]
    assert len(model.graph.initializer) == 6  # 2 Conv (BN folded) + Gemm, weight and bias each
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "n.onnx"))
    x = np.random.default_rng(1).standard_normal((4, 3, 32, 32)).astype(np.float32)
    # the same model: ONNX Runtime now folds the weights as constants, which reorders float sums only
    np.testing.assert_allclose(_run(tmp_path / "n.onnx", x), _run(path, x), rtol=1e-5, atol=1e-6)
    assert normalize_weights(model) == []  # once is enough


@pytest.mark.parametrize("kind", sorted(EXPORTERS))
def test_other_exporters_models_quantize_through_the_cli(tmp_path, run_cli, kind):
    """The onnxruntime target with the default weight rounding: the passes that look weights up
    among the initializers (bias correction, AdaRound) and run the model on its data inputs only."""
    path = tmp_path / "m.onnx"
    EXPORTERS[kind](path)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", image=rng.standard_normal((96, 3, 32, 32)).astype(np.float32))
    res = run_cli("quantize", path, "-o", tmp_path / "q.onnx", "--data", tmp_path / "calib.npz", "--method", "minmax",
                  "--target", "onnxruntime", "--smooth-quant", "none")
    assert res.exit_code == 0, res.output + res.stderr
    q = onnx.load(str(tmp_path / "q.onnx"))
    assert [i.name for i in q.graph.input] == ["image"]
    # the Conv weights are INT8 initializers read through DequantizeLinear
    inits = {t.name: t for t in q.graph.initializer}
    producer = {o: n for n in q.graph.node for o in n.output}
    for conv in (n for n in q.graph.node if n.op_type == "Conv"):
        dq = producer[conv.input[1]]
        assert dq.op_type == "DequantizeLinear" and inits[dq.input[0]].data_type == onnx.TensorProto.INT8
    x = rng.standard_normal((64, 3, 32, 32)).astype(np.float32)
    fp32, int8 = _run(path, x), _run(tmp_path / "q.onnx", x)
    cos = np.sum(fp32 * int8, 1) / (np.linalg.norm(fp32, axis=1) * np.linalg.norm(int8, axis=1))
    assert cos.mean() > 0.99 and np.mean(fp32.argmax(1) == int8.argmax(1)) >= 0.9


class HardSigmoidHead(AnchorFree):
    """YOLOv8's head with its class scores through HardSigmoid: the graph walk looks for a Sigmoid
    and does not recognise it (an exporter's or a user's variant)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        xs = [torch.cat((self.cv2[i](f), self.cv3[i](f)), 1) for i, f in enumerate(feats)]
        y = torch.cat([t.view(t.shape[0], 4 * self.reg + 3, -1) for t in xs], 2)
        box, cls = y.split((4 * self.reg, 3), 1)
        b, _, a = box.shape
        dist = self.dfl(box.view(b, 4, self.reg, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        return torch.cat((dbox, nn.functional.hardsigmoid(cls)), 1)


def test_task_detect_judges_an_unrecognised_detector_in_boxes(tmp_path, run_cli):
    path = tmp_path / "det.onnx"
    model = _export(HardSigmoidHead(), path)
    assert find_decode_heads(GraphView(model)) == [] and detector_outputs(model) == {}
    assert detector_outputs(model, "detect") == {"output0": None}
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", images=rng.uniform(0, 1, (48, 3, SIZE, SIZE)).astype(np.float32))
    common = ("--data", tmp_path / "calib.npz", "--method", "minmax", "--weight-rounding", "nearest", "--smooth-quant",
              "none", "--target", "onnxruntime", "--accept-accuracy-loss")
    res = run_cli("quantize", path, "-o", tmp_path / "q.onnx", *common, "--task", "detect")
    assert res.exit_code == 0, res.output + res.stderr
    assert "mAP50-95 vs FP32" in res.output  # judged in boxes
    res = run_cli("quantize", path, "-o", tmp_path / "q_auto.onnx", *common)
    assert res.exit_code == 0, res.output + res.stderr
    assert "mAP50-95" not in res.output  # without the word, a tensor like any other


def test_exporter_metadata_makes_an_unrecognised_detector_one(tmp_path):
    model = _export(HardSigmoidHead(), tmp_path / "det.onnx")
    for key, value in (("task", "detect"), ("names", "{0: 'a', 1: 'b', 2: 'c'}")):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    assert detector_outputs(model) == {"output0": 3}


def test_task_detect_without_a_yolo_layout_output_is_refused_in_one_line(tmp_path, run_cli):
    path = tmp_path / "m.onnx"
    _export_cnn(path)
    np.savez(tmp_path / "calib.npz", image=np.zeros((8, 3, 32, 32), np.float32))
    for argv in (("quantize", path, "-o", tmp_path / "q.onnx"),
                 ("deploy", path, "--repo", tmp_path / "repo", "--backend", "onnxruntime")):
        res = run_cli(*argv, "--data", tmp_path / "calib.npz", "--task", "detect")
        assert res.exit_code == 2, res.output + res.stderr
        assert res.stderr.strip().splitlines() == [
            "error: --task detect: no output has a YOLO-style layout ([batch, 4 + classes, anchors] or [batch, "
            "anchors, 5 + classes]; outputs: 'logits' [None, 10]): leave it auto for a model that is not a detector"]
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "repo").exists()


def test_the_ranges_example_of_docs_cli_md_reads_as_documented(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    example = text.split("cat > ranges.json <<'JSON'\n", 1)[1].split("\nJSON\n", 1)[0]
    (tmp_path / "ranges.json").write_text(example)
    ranges = RangesFile.read(tmp_path / "ranges.json").ranges
    assert (ranges["images"].amax, ranges["images"].lo, ranges["images"].hi) == (1.0, 0.0, 1.0)
    assert ranges["/model.0/conv/Conv_output_0"].amax == 11.5 and ranges["/model.0/conv/Conv_output_0"].lo is None


def test_hand_written_ranges_quantize_an_other_exporters_model_without_calibration(tmp_path, run_cli):
    """``--ranges FILE`` with amax only per tensor (the TensorRT user's dynamic ranges), on a
    Constant-node-weights model: no calibration; a tensor the file leaves out is named."""
    path = tmp_path / "m.onnx"
    _constant_weights(path)
    np.savez(tmp_path / "calib.npz", image=np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32))
    res = run_cli("calibrate", path, "--data", tmp_path / "calib.npz", "--method", "minmax", "--ranges",
                  tmp_path / "calibrated.json")
    assert res.exit_code == 0, res.output + res.stderr
    tensors = json.loads((tmp_path / "calibrated.json").read_text())["tensors"]
    by_hand = {name: {"amax": round(t["amax"], 2)} for name, t in tensors.items()}
    (tmp_path / "r.json").write_text(json.dumps({"tensors": by_hand}))
    res = run_cli("quantize", path, "-o", tmp_path / "q.onnx", "--ranges", tmp_path / "r.json")
    assert res.exit_code == 0, res.output + res.stderr
    assert "(ranges)" in res.output and "NOT measured" in res.output + res.stderr
    assert [i.name for i in onnx.load(str(tmp_path / "q.onnx")).graph.input] == ["image"]
    left_out = "/6/Flatten_output_0"  # the Gemm's input
    (tmp_path / "r.json").write_text(json.dumps({"tensors": {k: v for k, v in by_hand.items() if k != left_out}}))
    res = run_cli("quantize", path, "-o", tmp_path / "q2.onnx", "--ranges", tmp_path / "r.json")
    assert res.exit_code == 2 and f"no range for tensor '{left_out}'" in res.stderr
    assert not (tmp_path / "q2.onnx").exists()
