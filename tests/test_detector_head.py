"""Issue 43 item 2: a detector's decode head is found in the graph (not from layer names) and kept
float, on two generations of YOLO heads built here the way their exporters lay them out:

* anchor-based (YOLOv5/v7): per level a 1x1 conv to ``anchors x (5 + classes)``, a sigmoid over
  all of it, the grid/anchor arithmetic ``xy = (2 s - 0.5 + grid) stride``, ``wh = (2 s)^2 anchor``,
  a Concat of xy, wh and the scores, the levels concatenated: ``[N, A, 5 + classes]``;
* anchor-free with DFL (YOLOv8/YOLO11): per level a box branch (4 x 16 bins) and a class branch,
  the levels concatenated, the DFL (softmax over the bins, then a fixed 1x1 conv with weights
  0..15), ``dist2bbox`` against constant anchor points, times the strides, a sigmoid over the
  classes and the box/score Concat: ``[N, 4 + classes, A]``.

Real ONNX Runtime runs both; the trained YOLO11n is in the long tier (tests/test_detector_yolo.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from trtrepo.qdq import QuantizeOptions, find_decode_heads, plan_qdq, prepare_model
from trtrepo.qdq.graph import GraphView

STRIDES = (8, 16, 32)
SIZE = 64
NC = 3


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.s8 = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.SiLU(), nn.Conv2d(8, 8, 3, 2, 1), nn.SiLU(),
                                nn.Conv2d(8, 16, 3, 2, 1), nn.SiLU())
        self.s16 = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1), nn.SiLU())
        self.s32 = nn.Sequential(nn.Conv2d(16, 16, 3, 2, 1), nn.SiLU())

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        a = self.s8(x)
        b = self.s16(a)
        return [a, b, self.s32(b)]


class AnchorBased(nn.Module):
    """YOLOv5's Detect in export mode."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.na, self.no = 3, 5 + NC
        self.m = nn.ModuleList(nn.Conv2d(16, self.na * self.no, 1) for _ in STRIDES)
        self.register_buffer("anchors", torch.tensor([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119],
                                                      [116, 90, 156, 198, 373, 326]], dtype=torch.float32).view(3, 3, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = []
        for i, f in enumerate(self.backbone(x)):
            y = self.m[i](f)
            bs, _, ny, nx = y.shape
            y = y.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous().sigmoid()
            gy, gx = torch.meshgrid(torch.arange(ny, dtype=torch.float32), torch.arange(nx, dtype=torch.float32), indexing="ij")
            grid = torch.stack((gx, gy), 2).view(1, 1, ny, nx, 2) - 0.5
            anchor = self.anchors[i].view(1, self.na, 1, 1, 2)
            xy, wh, conf = y.split((2, 2, self.no - 4), 4)
            xy = (xy * 2 + grid) * STRIDES[i]
            wh = (wh * 2) ** 2 * anchor
            out.append(torch.cat((xy, wh, conf), 4).view(bs, self.na * nx * ny, self.no))
        return torch.cat(out, 1)


class AnchorFree(nn.Module):
    """YOLOv8's Detect in export mode (DFL with 16 bins)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.reg = 16
        self.cv2 = nn.ModuleList(nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.SiLU(), nn.Conv2d(16, 4 * self.reg, 1))
                                 for _ in STRIDES)
        self.cv3 = nn.ModuleList(nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1), nn.SiLU(), nn.Conv2d(16, NC, 1))
                                 for _ in STRIDES)
        self.dfl = nn.Conv2d(self.reg, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.data[:] = torch.arange(self.reg, dtype=torch.float32).view(1, self.reg, 1, 1)
        points, strides = [], []
        for s in STRIDES:
            n = SIZE // s
            sy, sx = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5, indexing="ij")
            points.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((n * n, 1), float(s)))
        self.register_buffer("anchors", torch.cat(points).T.unsqueeze(0))
        self.register_buffer("strides", torch.cat(strides).T.unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.backbone(x)
        xs = [torch.cat((self.cv2[i](f), self.cv3[i](f)), 1) for i, f in enumerate(feats)]
        y = torch.cat([t.view(t.shape[0], 4 * self.reg + NC, -1) for t in xs], 2)
        box, cls = y.split((4 * self.reg, NC), 1)
        b, _, a = box.shape
        dist = self.dfl(box.view(b, 4, self.reg, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        dbox = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        return torch.cat((dbox, cls.sigmoid()), 1)


def _export(module: nn.Module, path) -> onnx.ModelProto:
    torch.manual_seed(0)
    module.eval()
    torch.onnx.export(module, (torch.zeros(1, 3, SIZE, SIZE),), str(path), input_names=["images"], output_names=["output0"],
                      dynamo=False, opset_version=17, dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}})
    return onnx.load(str(path))


@pytest.mark.parametrize("head,ops", [(AnchorBased, {"Sigmoid", "Concat", "Mul", "Add", "Pow"}),
                                      (AnchorFree, {"Sigmoid", "Concat", "Softmax", "Conv", "Sub", "Add", "Mul"})])
def test_the_decode_head_is_found_from_the_graph_and_stays_float(tmp_path, head, ops):
    model = prepare_model(_export(head(), tmp_path / "m.onnx"))
    view = GraphView(model)
    (found,) = find_decode_heads(view)
    kinds = {n.op_type for n in view.nodes if n.name in found.nodes}
    assert found.output == "output0" and ops <= kinds, kinds
    # the head's feature convolutions stay INT8; only the DFL's fixed expectation conv is in the head
    convs = [n for n in view.nodes if n.op_type == "Conv"]
    head_convs = [n for n in convs if n.name in found.nodes]
    assert len(head_convs) == (1 if head is AnchorFree else 0)
    if head_convs:
        w = view.constant_array(head_convs[0].input[1]).reshape(-1)
        assert np.array_equal(w, np.arange(16, dtype=np.float32))
    plan = plan_qdq(model, QuantizeOptions(target="onnxruntime"))
    assert set(found.nodes) <= set(plan.auto_float) | {n.name for n in view.nodes if n.op_type not in
                                                       ("Conv", "Add", "Mul", "Sub", "Div", "Concat", "Sigmoid",
                                                        "Softmax", "Pow", "MatMul")}
    quantized_in_head = {p.node for p in plan.points} & set(found.nodes)
    assert quantized_in_head == set()
    for target in ("tensorrt", "onnxruntime"):
        naive = plan_qdq(model, QuantizeOptions(target=target, quantize_detector_head=True))
        quantized = {p.node for p in naive.points} & set(found.nodes)
        # the naive placement: the box/score concat's output (a graph output) gets Q/DQ, as ONNX Runtime's
        # quantize_static places it, and TensorRT's rules put Q/DQ on the DFL's expectation conv too
        assert found.concat in quantized and ("output0", None) in {(p.tensor, p.consumer) for p in naive.points}
        assert {n.name for n in head_convs} <= quantized


def test_the_naive_placement_quantizes_the_detector_output_and_erases_the_scores(tmp_path):
    """--quantize-detector-head: one INT8 scale over box pixels and class probabilities (the issue's
    naive INT8); the output keeps its name and the class scores round to nothing."""
    from trtrepo.evaluate import make_session
    from trtrepo.qdq import ActivationRange, insert_qdq

    model = _export(AnchorFree(), tmp_path / "m.onnx")
    x = np.random.default_rng(0).random((2, 3, SIZE, SIZE), np.float32)
    ref = make_session(model).run(None, {"images": x})[0]
    tensors = {p.tensor for p in plan_qdq(prepare_model(model), QuantizeOptions(target="onnxruntime",
                                                                                 quantize_detector_head=True)).points
               if p.kind == "activation"}
    ranges = {t: ActivationRange(amax=float(SIZE), lo=0.0, hi=float(SIZE)) if t == "output0"
              else ActivationRange(amax=8.0) for t in tensors}
    qm = insert_qdq(model, ranges, QuantizeOptions(target="onnxruntime", quantize_detector_head=True))
    producer = {o: n for n in qm.model.graph.node for o in n.output}
    assert producer["output0"].op_type == "DequantizeLinear" and [o.name for o in qm.model.graph.output] == ["output0"]
    out = make_session(qm.model).run(None, {"images": x})[0]
    scores, step = out[:, 4:], SIZE / 255
    # a probability on a grid of 0.25 (one step of the box pixels' scale): at most 5 values, no ranking left
    np.testing.assert_allclose(scores / step, np.round(scores / step), atol=1e-3)
    assert len(np.unique(np.round(scores / step))) <= 5 < len(np.unique(ref[:, 4:]))


def test_classifiers_and_encoders_have_no_decode_head(demo_onnx):
    assert find_decode_heads(GraphView(onnx.load(str(demo_onnx)))) == []


class Classifier(nn.Module):
    """The same backbone under a classification head: no decode head."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x)[-1].mean((2, 3)))


def _representable_max(model: onnx.ModelProto, tensor: str) -> float:
    """The largest value the Q/DQ pair on ``tensor`` represents (uint8: (255 - zero point) * scale)."""
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (q,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor]
    scale, zero = float(init[q.input[1]]), int(init[q.input[2]])
    return (255 - zero) * scale


def _representable_min(model: onnx.ModelProto, tensor: str) -> float:
    """The smallest value the Q/DQ pair on ``tensor`` represents (uint8: -zero point * scale)."""
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (q,) = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor]
    return -int(init[q.input[2]]) * float(init[q.input[1]])


@pytest.mark.parametrize("head", [AnchorFree, Classifier])
def test_a_detectors_activations_beyond_its_convolutions_keep_their_whole_range(tmp_path, head):
    """Issue 43: in a detector (its decode head found) the activations that no weighted op produces
    (here the SiLU outputs) take their min/max range up to the 99.999th percentile of |x|, so that
    the strongest responses are not clipped; a convolution's output keeps the method's clipped range. A classifier with the same
    backbone keeps the method's range everywhere. Checked on the written model's Q/DQ parameters
    against the activations ONNX Runtime computes on the calibration images. On the tensorrt target
    (symmetric int8) the rule stays off."""
    import onnxruntime as ort

    from trtrepo.data import ArraySource, collect
    from trtrepo.quantize import run_quantize
    from trtrepo.quantize.ranges import DETECTOR_TOP_PERCENTILE, split_holdout

    src = tmp_path / "m.onnx"
    torch.manual_seed(0)
    model = _export(head(), src)
    images = np.random.default_rng(0).random((60, 3, SIZE, SIZE), dtype=np.float32)
    images[:, :, 8:24, 8:24] *= 4  # a bright object: the tails a clipping range cuts
    np.savez(tmp_path / "calib.npz", images=images)
    res = run_quantize(src, tmp_path / "q.onnx", data=str(tmp_path / "calib.npz"), method="percentile",
                       options=QuantizeOptions(target="onnxruntime"), weight_rounding="nearest", smooth_quant=None)
    assert ("range_rule" in res.report.to_dict()) is (head is AnchorFree)  # the report says so for a detector
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    producers = {o: n for n in model.graph.node for o in n.output}
    silu = [n.output[0] for n in model.graph.node if n.op_type == "Mul" and producers.get(n.input[1]) is not None
            and producers[n.input[1]].op_type == "Sigmoid" and n.name.startswith("/backbone")]
    conv = [n.output[0] for n in model.graph.node if n.op_type == "Conv" and n.name.startswith("/backbone")]
    probe = onnx.load(str(src))
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in silu + conv)
    calibrated, _ = split_holdout(ArraySource("calib", {"images": images}))  # what quantize calibrated on
    values = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        silu + conv, collect(calibrated))
    seen = dict(zip(silu + conv, (float(v.max()) for v in values), strict=True))
    # where a detector's min/max ranges end (DETECTOR_TOP_PERCENTILE of |x|), as a fraction of the max
    top = {t: min(float(np.percentile(np.abs(v), DETECTOR_TOP_PERCENTILE)), seen[t]) / seen[t]
           for t, v in zip(silu + conv, values, strict=True)}
    kept = {t: _representable_max(quantized, t) / seen[t] for t in silu + conv if any(
        n.op_type == "QuantizeLinear" and n.input[0] == t for n in quantized.graph.node)}
    assert len([t for t in kept if t in silu]) >= 3 and len([t for t in kept if t in conv]) >= 3, kept
    clipped_convs = [t for t in conv if t in kept and kept[t] < 0.999]
    silu_ratios = [kept[t] for t in silu if t in kept]
    if head is AnchorFree:
        # the range seen in calibration up to its top 1e-5 (the histogram's bins: 1 % slack)
        assert all(kept[t] >= 0.99 * top[t] for t in silu if t in kept), (kept, top)
        # a SiLU's input (every backbone conv here): the same above, max(min, -6) below
        assert all(kept[t] >= 0.99 * top[t] for t in conv if t in kept), (kept, top)
        mins = dict(zip(silu + conv, (float(v.min()) for v in values), strict=True))
        for t in (t for t in conv if t in kept):  # within one step of the grid (the zero point rounds)
            step = (_representable_max(quantized, t) - _representable_min(quantized, t)) / 255
            assert abs(_representable_min(quantized, t) - max(mins[t], -6.0)) <= step, (t, mins[t])
        symmetric = run_quantize(src, tmp_path / "t.onnx", data=str(tmp_path / "calib.npz"), method="percentile",
                                 options=QuantizeOptions(target="tensorrt"), weight_rounding="nearest", smooth_quant=None)
        assert "range_rule" not in symmetric.report.to_dict()  # symmetric int8: the rule stays off (measured worse)
    else:
        assert clipped_convs, kept  # percentile clips the convolutions' outputs
        assert min(silu_ratios) < 0.999, kept  # a classifier: the method's clipped range there too


def test_a_silu_input_takes_the_calibration_max_above_and_stops_at_minus_six_below() -> None:
    """detector_ranges on a graph built by hand: the SiLU's input (x * Sigmoid(x), either operand
    order) gets [max(min, -6), max]; a convolution's output no SiLU reads keeps the method's range;
    the SiLU's output takes min/max; a SiLU input whose min is above -6 keeps its min; with a top
    (the percentile of |x| quantize passes), those min/max ranges end there."""
    from onnx import TensorProto, helper

    from trtrepo.qdq.options import ActivationRange
    from trtrepo.quantize.ranges import detector_ranges, silu_inputs

    w = onnx.numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("Sigmoid", ["a"], ["sa"]),
             helper.make_node("Mul", ["a", "sa"], ["ya"]), helper.make_node("Conv", ["ya", "w"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["sb"]), helper.make_node("Mul", ["sb", "b"], ["yb"]),
             helper.make_node("Conv", ["yb", "w"], ["c"])]
    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                                                [vi("c", TensorProto.FLOAT, [1, 1, 4, 4])], [w]))
    assert silu_inputs(model) == {"a", "b"}
    method = {t: ActivationRange(10.0, -30.0, 40.0) for t in ("a", "b", "c", "ya")}
    minmax = {"a": ActivationRange(40.0, -30.0, 40.0), "b": ActivationRange(12.0, -2.5, 12.0),
              "c": ActivationRange(40.0, -30.0, 40.0), "ya": ActivationRange(40.0, -0.28, 40.0)}
    out = detector_ranges(model, method, minmax)
    assert (out["a"].lo, out["a"].hi, out["a"].amax) == (-6.0, 40.0, 40.0)
    assert (out["b"].lo, out["b"].hi) == (-2.5, 12.0)
    assert out["c"] == method["c"] and out["ya"] == minmax["ya"]
    # the min/max ranges end at the given top (a percentile of |x|): above, and below where it is
    # nearer than -6; a tensor without a top, and a weighted op's output no SiLU reads, keep theirs
    topped = detector_ranges(model, method, minmax, {"a": 25.0, "b": 2.0, "c": 5.0, "ya": float("inf")})
    assert (topped["a"].lo, topped["a"].hi, topped["a"].amax) == (-6.0, 25.0, 25.0)
    assert (topped["b"].lo, topped["b"].hi, topped["b"].amax) == (-2.0, 2.0, 2.0)
    assert topped["c"] == method["c"] and topped["ya"] == minmax["ya"]
    assert detector_ranges(model, method, minmax, {"ya": 30.0})["ya"] == ActivationRange(30.0, -0.28, 30.0)
