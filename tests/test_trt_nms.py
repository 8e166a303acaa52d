"""Issue 43 item 1, the TensorRT route: NMS inside the plan as TensorRT's EfficientNMS_TRT plugin
(trtrepo/engine/nms_plugin.py), on the tiny YOLO-style heads of tests/test_detector_head.py (both
generations).

No real TensorRT runs here. What is real: ONNX Runtime runs the graph up to the plugin's inputs
and must give exactly trtrepo.detect.decode's candidates; onnx's checker and schema registry judge
the graph; Triton's ModelConfig protobuf parses the plan's config. The builder's plugin calls are
our adapter code, run against the fake TensorRT (tests/_fake_tensorrt.py) for their order and
error path, and against the real 10.13 / 11.4 bindings' signatures through the conformance proxy
(tests/_trt_conformance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from _fake_tensorrt import FakeCudart, make_fake_tensorrt
from test_detector_head import NC, SIZE, AnchorBased, AnchorFree, _export

from trtrepo import engine as B
from trtrepo.contracts.profile import BatchProfile
from trtrepo.detect import decode
from trtrepo.errors import UsageError
from trtrepo.evaluate import detection_layout, make_session
from trtrepo.tritonconfig import NmsSettings, config_to_dict, render_config, validate_config_text

ROOT = Path(__file__).resolve().parents[1]
BINDINGS = Path(os.environ.get("TRT_BINDINGS_DIR", ROOT / ".trt-bindings"))
HEADS = {"anchor_free": AnchorFree, "anchor_based": AnchorBased}


@pytest.fixture(scope="module")
def detectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """kind -> (path, model, raw output of 3 random images, layout)."""
    folder = tmp_path_factory.mktemp("trt_nms")
    images = np.random.default_rng(0).random((3, 3, SIZE, SIZE), dtype=np.float32)
    out = {}
    for kind, head in HEADS.items():
        path = folder / f"{kind}.onnx"
        model = _export(head(), path)
        (raw,) = make_session(str(path)).run(None, {"images": images})
        layout = detection_layout(raw.shape, NC)
        assert layout.kind == kind
        out[kind] = (path, model, images, raw, layout)
    return out


def _plugin(model: Any) -> Any:
    (node,) = [n for n in model.graph.node if n.op_type == B.EFFICIENT_NMS]
    return node


def _attrs(node: Any) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("kind", HEADS)
def test_the_plugin_inputs_are_exactly_the_decode_candidates(detectors, kind, tmp_path) -> None:
    """ONNX Runtime runs the graph cut at the plugin's inputs; the (anchor, class) pairs the plugin
    keeps (score >= its score_threshold) are decode's candidates at conf, with bit-identical boxes
    and scores: at the served default and at a conf equal to one candidate's score (the strict
    '>' edge)."""
    path, model, images, raw, layout = detectors[kind]
    cut = B.efficient_nms_inputs(model, layout)
    onnx.save(cut, str(tmp_path / "cut.onnx"))
    boxes, scores = make_session(str(tmp_path / "cut.onnx")).run(list(B.PLUGIN_INPUTS), {"images": images})
    anchors = raw.shape[2] if kind == "anchor_free" else raw.shape[1]
    assert boxes.shape == (3, anchors, 4) and scores.shape == (3, anchors, NC)
    ranked = np.sort(decode(raw, layout, conf=0.0)[0].scores)
    edge = float(ranked[len(ranked) // 2])  # one candidate's own score
    for conf in (NmsSettings().conf, edge):
        threshold = np.float32(_attrs(_plugin(B.add_efficient_nms(model, layout, NmsSettings(conf=conf))))["score_threshold"])
        expected = decode(raw, layout, conf=conf)
        for n in range(3):
            a, c = np.nonzero(scores[n] >= threshold)  # the plugin's filter; row-major: anchor order
            want = expected[n]
            assert len(want) > 0 and (conf != edge or len(want) < anchors), (kind, conf, len(want))
            np.testing.assert_array_equal(c, want.classes)
            np.testing.assert_array_equal(boxes[n, a], want.boxes)
            np.testing.assert_array_equal(scores[n, a, c], want.scores)
        if conf == edge:
            assert edge in set(scores[0].max(axis=1).tolist())  # the edge score is there, and left out


def test_the_plugin_node_carries_the_nms_settings(detectors) -> None:
    _, model, _, _, layout = detectors["anchor_free"]
    nms = NmsSettings(conf=0.3, iou=0.6, max_det=50)
    full = B.add_efficient_nms(model, layout, nms)
    node = _plugin(full)
    attrs = _attrs(node)
    assert node.domain == "" and list(node.input) == list(B.PLUGIN_INPUTS) and list(node.output) == list(B.NMS_OUTPUTS)
    assert attrs.pop("plugin_version") == b"1" and attrs.pop("plugin_namespace") == b""
    threshold = attrs.pop("score_threshold")
    assert np.float32(threshold) == np.nextafter(np.float32(nms.conf), np.float32(np.inf))
    assert np.float32(attrs.pop("iou_threshold")) == np.float32(nms.iou)
    assert attrs == {"max_output_boxes": nms.max_det, "background_class": -1, "score_activation": 0,
                     "class_agnostic": 0, "box_coding": 0}
    assert B.plugin_requirements(full) == (B.PluginRef(B.EFFICIENT_NMS, "1", "", node.name),)
    assert B.plugin_requirements(model) == ()
    outs = {o.name: (o.type.tensor_type.elem_type,
                     [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]) for o in full.graph.output}
    batch = model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert outs == {"num_detections": (onnx.TensorProto.INT32, [batch, 1]),
                    "detection_boxes": (onnx.TensorProto.FLOAT, [batch, 50, 4]),
                    "detection_scores": (onnx.TensorProto.FLOAT, [batch, 50]),
                    "detection_classes": (onnx.TensorProto.INT32, [batch, 50])}


@pytest.mark.parametrize("kind", HEADS)
def test_the_graph_checks_except_for_the_plugin_op(detectors, kind) -> None:
    _, model, _, _, layout = detectors[kind]
    full = B.add_efficient_nms(model, layout)
    onnx.checker.check_model(B.efficient_nms_inputs(model, layout), full_check=True)
    opset = {o.domain: o.version for o in full.opset_import}
    unknown = [n.name for n in full.graph.node if not onnx.defs.has(n.op_type, opset.get(n.domain, 1), n.domain)]
    assert unknown == [_plugin(full).name]
    with pytest.raises(onnx.checker.ValidationError, match=B.EFFICIENT_NMS):
        onnx.checker.check_model(full)


def test_the_plans_config_declares_the_four_outputs(detectors, tmp_path) -> None:
    """The `_nms` plan's config, from the transformed graph's IO through the tensorrt_plan template,
    parsed by Triton's ModelConfig protobuf and checked as Triton checks it at load time."""
    path, _, _, _, layout = detectors["anchor_based"]
    dst = B.write_efficient_nms(path, tmp_path / "det_nms.onnx", layout, NmsSettings(max_det=20))
    cfg = B.nms_model_config("det_nms", dst)
    d = config_to_dict(validate_config_text(render_config(cfg), "det_nms/config.pbtxt", model_dir_name="det_nms"))
    assert d["platform"] == "tensorrt_plan" and int(d["max_batch_size"]) > 0
    assert [(t["name"], t["data_type"], [int(x) for x in t["dims"]]) for t in d["output"]] == [
        ("num_detections", "TYPE_INT32", [1]), ("detection_boxes", "TYPE_FP32", [20, 4]),
        ("detection_scores", "TYPE_FP32", [20]), ("detection_classes", "TYPE_INT32", [20])]
    assert [(t["name"], [int(x) for x in t["dims"]]) for t in d["input"]] == [("images", [3, SIZE, SIZE])]
    with pytest.raises(UsageError, match="model 'det': outputs output0; the EfficientNMS route ends in num_detections"):
        B.nms_model_config("det", path)


def test_bad_inputs_are_one_line_errors_and_write_nothing(detectors, tmp_path) -> None:
    path, model, _, _, layout = detectors["anchor_free"]
    with pytest.raises(UsageError, match="output 'boxes': not an output of the model"):
        B.add_efficient_nms(model, layout, output="boxes")
    wrong = detection_layout((1, 4 + NC + 1, 99), NC + 1)
    with pytest.raises(UsageError, match=f"output 'output0': axis 1 has {4 + NC} channels"):
        B.write_efficient_nms(path, tmp_path / "x.onnx", wrong)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------
# The builder: our adapter registers the plugins before parsing (fake TensorRT for order and errors)


class _Recorder:
    """Records the calls our adapter makes; ``creators`` says which plugins the registry has."""

    def __init__(self, trt: Any, creators: set[tuple[str, str, str]]) -> None:
        self.calls: list[tuple[Any, ...]] = []
        calls = self.calls

        class IPluginRegistry:  # named as the real class: the conformance proxy wraps it as one
            def get_creator(self, type: str, version: str, plugin_namespace: str = "") -> Any:  # noqa: A002
                calls.append(("get_creator", type, version, plugin_namespace))
                return object() if (type, version, plugin_namespace) in creators else None

        def init_libnvinfer_plugins(logger: Any, namespace: str) -> bool:
            calls.append(("init_libnvinfer_plugins", logger, namespace))
            return True

        parse = trt.OnnxParser.parse_from_file

        def parse_from_file(parser: Any, model: str) -> bool:
            calls.append(("parse",))
            return bool(parse(parser, model))

        trt.init_libnvinfer_plugins = init_libnvinfer_plugins
        trt.get_plugin_registry = IPluginRegistry
        trt.OnnxParser.parse_from_file = parse_from_file


def _build(onnx_path: Path, out: Path, creators: set[tuple[str, str, str]]) -> tuple[B.TensorRTEngineBuilder, _Recorder]:
    trt = make_fake_tensorrt("10.13.3.9")
    rec = _Recorder(trt, creators)
    builder = B.TensorRTEngineBuilder(trt, B.CudaRuntime(FakeCudart()))
    opts = B.BuildOptions(profile=BatchProfile.for_build(1, 2, 4), allow_fp32=True)
    B.build_engine(onnx_path, out, opts, builder=builder)
    return builder, rec


def test_the_builder_registers_the_standard_plugins_before_parsing(detectors, tmp_path) -> None:
    path, _, _, _, layout = detectors["anchor_free"]
    nms_onnx = B.write_efficient_nms(path, tmp_path / "det_nms.onnx", layout)
    builder, rec = _build(nms_onnx, tmp_path / "nms" / "model.plan", {(B.EFFICIENT_NMS, "1", "")})
    assert rec.calls == [("init_libnvinfer_plugins", builder.logger, ""), ("get_creator", B.EFFICIENT_NMS, "1", ""), ("parse",)]
    assert (tmp_path / "nms" / "model.plan").is_file()
    _, plain = _build(path, tmp_path / "plain" / "model.plan", set())
    assert plain.calls == [("parse",)]  # no plugin node: TensorRT's plugin library is left alone


def test_a_missing_plugin_is_named_before_parsing_and_nothing_is_written(detectors, tmp_path) -> None:
    path, _, _, _, layout = detectors["anchor_free"]
    nms_onnx = B.write_efficient_nms(path, tmp_path / "det_nms.onnx", layout)
    with pytest.raises(UsageError, match=f"node '{_plugin(onnx.load(str(nms_onnx))).name}' needs the TensorRT plugin "
                                         f"{B.EFFICIENT_NMS} version 1, which TensorRT 10.13.3.9 does not register"):
        _build(nms_onnx, tmp_path / "out" / "model.plan", set())
    assert not (tmp_path / "out").exists()


CONFORMANCE = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
import tensorrt_bindings as real
from _fake_tensorrt import FakeCudart, make_fake_tensorrt
from _trt_conformance import Checker, ConformanceError, ModuleProxy
from test_trt_nms import _Recorder
from trtrepo import engine as B
from trtrepo.contracts.profile import BatchProfile

fake = make_fake_tensorrt(real.__version__)
rec = _Recorder(fake, {{("EfficientNMS_TRT", "1", "")}})
checker = Checker(real, fake)
builder = B.TensorRTEngineBuilder(ModuleProxy(checker), B.CudaRuntime(FakeCudart()))
error = None
try:
    B.build_engine({onnx!r}, {plan!r}, B.BuildOptions(profile=BatchProfile.for_build(1, 2, 4), allow_fp32=True), builder=builder)
except ConformanceError:
    error = "conformance"
print(json.dumps({{"version": real.__version__, "violations": checker.violations, "error": error,
                  "accessed": sorted(checker.accessed), "calls": [c[0] for c in rec.calls]}}))
"""


@pytest.mark.parametrize("major", (10, 11))
def test_the_plugin_calls_fit_the_real_bindings(detectors, tmp_path, major) -> None:
    """The adapter's plugin calls (init_libnvinfer_plugins, get_plugin_registry, get_creator) checked
    against the real TensorRT 10.13 / 11.4 Python bindings' signatures (values from the fake)."""
    root = BINDINGS / str(major)
    if not (root / ".complete").is_file():
        pytest.skip(f"real TensorRT bindings not set up in {BINDINGS} (run scripts/setup_trt_bindings.sh)")
    path, _, _, _, layout = detectors["anchor_free"]
    nms_onnx = B.write_efficient_nms(path, tmp_path / "det_nms.onnx", layout)
    code = CONFORMANCE.format(tests=str(Path(__file__).parent), onnx=str(nms_onnx), plan=str(tmp_path / "m" / "model.plan"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(root / "lib"), env.get("LD_LIBRARY_PATH")]))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "site"), str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["version"].startswith(f"{major}.")
    assert result["violations"] == [] and result["error"] is None
    assert {"tensorrt.init_libnvinfer_plugins", "tensorrt.get_plugin_registry", "IPluginRegistry.get_creator",
            "OnnxParser.parse_from_file", "Builder.build_serialized_network"} <= set(result["accessed"])
    assert result["calls"] == ["init_libnvinfer_plugins", "get_creator", "parse"]


@pytest.mark.parametrize("registered", [True, False], ids=["plugin", "no-plugin"])
def test_deploy_writes_the_nms_plan_beside_a_detectors_ensemble(tmp_path, monkeypatch, run_cli, registered) -> None:
    """``deploy --backend tensorrt --ensemble`` on a detector (the real CLI; TensorRT is the fake,
    only our code around it is judged): beside the plan and the Python NMS ensemble, a
    ``det_nms`` plan built from the EfficientNMS graph, its plugin registered before parsing, its
    config parsed by Triton's protobuf with the plugin's four outputs. Without the plugin the
    deployment stands and a warning names what is missing."""
    import importlib.machinery

    from PIL import Image
    from test_deploy_detector import _ultralytics_like

    from trtrepo.tritonconfig import parse_config_text

    fake = make_fake_tensorrt("10.13.3.9")
    fake.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    rec = _Recorder(fake, {(B.EFFICIENT_NMS, "1", "")} if registered else set())
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(B.CudaRuntime, "load", classmethod(lambda cls: cls(FakeCudart())))
    monkeypatch.setattr(B.TensorRTEngineBuilder, "load", classmethod(lambda cls: cls(fake, B.CudaRuntime(FakeCudart()))))
    model = _ultralytics_like(tmp_path)
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(16):
        Image.fromarray(rng.integers(0, 255, (80, 100, 3), dtype=np.uint8)).save(photos / f"{i:02d}.jpg")
    res = run_cli("deploy", model, "--name", "det", "--repo", tmp_path / "repo", "--data", photos, "--backend", "tensorrt",
                  "--ensemble", "--method", "minmax", "--weight-rounding", "nearest", "--accept-accuracy-loss")
    assert res.exit_code == 0, res.output + res.stderr
    repo = tmp_path / "repo"
    written = sorted(p.name for p in repo.iterdir() if p.is_dir())
    if not registered:
        assert written == ["det", "det_ensemble", "det_postprocess", "det_preprocess"]
        assert "warning: det_nms (NMS in the plan) not written: " in res.output
        assert f"needs the TensorRT plugin {B.EFFICIENT_NMS} version 1, which TensorRT 10.13.3.9 does not register" in res.output
        assert [c[0] for c in rec.calls] == ["parse", "init_libnvinfer_plugins", "get_creator"]
        return
    assert written == ["det", "det_ensemble", "det_nms", "det_postprocess", "det_preprocess"]
    assert any(line.split()[:2] == ["det_nms", "1"] and "tensorrt_plan" in line for line in res.output.splitlines())
    # two builds: the detector's plan (no plugin node), then the NMS route's (plugins registered first)
    assert [c[0] for c in rec.calls] == ["parse", "init_libnvinfer_plugins", "get_creator", "parse"]
    d = config_to_dict(parse_config_text((repo / "det_nms" / "config.pbtxt").read_text(), "det_nms"))
    assert d["platform"] == "tensorrt_plan"
    assert [(t["name"], t["data_type"]) for t in d["output"]] == [
        ("num_detections", "TYPE_INT32"), ("detection_boxes", "TYPE_FP32"), ("detection_scores", "TYPE_FP32"),
        ("detection_classes", "TYPE_INT32")]
    assert (repo / "det_nms" / "1" / "model.plan").is_file()


def test_an_fp16_plan_gets_its_detector_converted_before_the_plugin_is_added(detectors, tmp_path) -> None:
    """A plan built with --fp16 (the ONNX conversion): the NMS route converts the detector part the
    same way first (the converter's checker knows no plugin op), then adds the plugin on float32
    inputs, and builds with the plan's profile."""
    path, _, _, _, layout = detectors["anchor_free"]
    trt = make_fake_tensorrt("10.13.3.9")
    _Recorder(trt, {(B.EFFICIENT_NMS, "1", "")})
    builder = B.TensorRTEngineBuilder(trt, B.CudaRuntime(FakeCudart()))
    plan = tmp_path / "det" / "model.plan"
    B.build_engine(path, plan, B.BuildOptions(profile=BatchProfile.for_build(1, 2, 4), allow_fp32=True, fp16=True), builder=builder)
    result = B.build_efficient_nms(plan, "output0", NC, NmsSettings(max_det=10), builder=builder)
    assert result.plan == tmp_path / "det" / "nms" / "model.plan" and result.plan.is_file()
    nms = onnx.load(str(tmp_path / "det" / "nms" / "model.onnx"))
    kinds = {i.data_type for i in nms.graph.initializer if not i.name.startswith("trtrepo_nms/")}
    assert onnx.TensorProto.FLOAT16 in kinds  # the detector's weights, converted
    assert [o.name for o in nms.graph.output] == list(B.NMS_OUTPUTS)
    assert _attrs(_plugin(nms))["max_output_boxes"] == 10
    assert {n: r.to_dict() for n, r in result.metadata.profile.items()} == {
        "images": {"min": [1, 3, SIZE, SIZE], "opt": [2, 3, SIZE, SIZE], "max": [4, 3, SIZE, SIZE]}}
