"""TensorRT's usual detector route: NMS inside the plan, as the ``EfficientNMS_TRT`` plugin.

A pure ONNX graph transform (no TensorRT needed): :func:`add_efficient_nms` appends to a YOLO
detector the decode into the plugin's two inputs and one ``EfficientNMS_TRT`` node, whose four
outputs become the graph's; the plan built from it (``trtrepo build``, or trtexec) returns boxes.
:func:`efficient_nms_inputs` is the same graph cut before the plugin, which ONNX Runtime runs (the
tests compare it with :func:`trtrepo.detect.decode`). :func:`plugin_requirements` lists the
plugins a graph needs; the builder registers TensorRT's standard plugins for them
(:func:`trtrepo.engine.routes.register_plugins`).

The plugin, as NVIDIA documents it (TensorRT repository, ``plugin/efficientNMSPlugin/README.md``
and ``EfficientNMSPlugin_PluginConfig.yaml``, plugin version "1"):

* inputs ``boxes [N, A, 4]`` and ``scores [N, A, C]`` (float32 or float16);
* attributes ``score_threshold`` (float32), ``iou_threshold`` (float32), ``max_output_boxes``,
  ``background_class`` (-1: none), ``score_activation`` (0/1: sigmoid applied inside),
  ``class_agnostic`` (0/1), ``box_coding`` (0: corners ``x1, y1, x2, y2``; 1: centre/size);
* outputs ``num_detections [N, 1]`` int32, ``detection_boxes [N, max_output_boxes, 4]`` (corners,
  whatever the coding), ``detection_scores [N, max_output_boxes]``, ``detection_classes [N,
  max_output_boxes]`` int32; only the first ``num_detections[i]`` rows of image ``i`` are valid;
* a score is kept when ``score >= score_threshold`` (``efficientNMSInference.cu``: ``gte_mp``),
  at most the 4096 best-scored candidates reach the NMS kernel.

How TensorRT's ONNX parser finds it (onnx-tensorrt, ``ModelImporter.cpp`` / ``onnxOpImporters.cpp``
``FallbackPluginImporter``): a node whose ``op_type`` has no built-in importer is looked up in the
builder's plugin registry by name ``op_type``, attribute ``plugin_version`` (default "1") and
``plugin_namespace`` (default ""); the node's domain is not consulted, the other attributes become
the plugin's fields. The node is written in the default domain with ``plugin_version`` "1" and
``plugin_namespace`` "", as NVIDIA's own EfficientDet sample writes it
(``samples/python/efficientdet/create_onnx.py``); the standard plugins are in the registry once
``init_libnvinfer_plugins(logger, "")`` has run (``samples/python/efficientdet/build_engine.py``).

Decisions, so that the plugin's candidates are exactly :func:`trtrepo.detect.decode`'s:

* boxes are decoded in the graph to corners (``x1 = cx - w / 2`` ...; ``box_coding`` 0), in
  float32 (a float16 head is cast first), the same arithmetic as :func:`~trtrepo.detect.xywh_to_xyxy`;
* scores are the best class only (Ultralytics' ``multi_label=False``): per anchor the ArgMax
  class keeps its probability (times the objectness for anchor-based heads), every other class
  gets 0; the plugin would otherwise keep an anchor once per class above the threshold;
* ``score_threshold`` is the float32 number just above ``conf``: ``score >= next(conf)`` is
  ``score > conf`` for float32 scores, :func:`~trtrepo.detect.decode`'s rule;
* class-aware NMS (``class_agnostic`` 0), no background class, no sigmoid inside (the YOLO heads
  export probabilities), ``max_output_boxes`` = ``max_det``, ``iou_threshold`` = ``iou``.

What still differs from :func:`trtrepo.detect.postprocess`: the plugin's IoU arithmetic and
tie-breaking are its own, its 4096-candidate cap replaces Ultralytics' ``max_nms`` of 30000, the
boxes are in the model's input pixels (the letterboxed image; no ``unletterbox``), and mask
coefficients and any other output of the model are dropped (the plan returns the four outputs).
Nothing here was run against a real TensorRT: the graph up to the plugin runs on ONNX Runtime,
and the builder's plugin calls are checked against the real 10.13 / 11.4 bindings' signatures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.backends import TENSORRT
from ..contracts.plan import PlanMetadata
from ..detect import YoloLayout
from ..errors import UsageError
from ..fsutil import atomic_path
from ..modelio import ModelIO, load_onnx
from ..tritonconfig import ModelConfig, ModelOptions, NmsSettings, config_from_io

EFFICIENT_NMS = "EfficientNMS_TRT"
EFFICIENT_NMS_VERSION = "1"
NMS_OUTPUTS = ("num_detections", "detection_boxes", "detection_scores", "detection_classes")
PLUGIN_INPUTS = ("nms_boxes", "nms_scores")  # the plugin's inputs: boxes [N, A, 4] xyxy, scores [N, A, C]
MIN_OPSET = 11  # Slice with inputs, GatherElements, ArgMax keepdims
_PREFIX = "trtrepo_nms/"


@dataclass(frozen=True)
class PluginRef:
    """One plugin node of a graph: the registry key TensorRT's parser looks up, and the node."""

    name: str
    version: str
    namespace: str
    node: str


def plugin_requirements(model: Any) -> tuple[PluginRef, ...]:
    """The plugin nodes of ``model`` (a ``ModelProto`` or a path): those that carry a
    ``plugin_version`` attribute, the parser's plugin key (module docstring)."""
    import onnx

    if isinstance(model, (str, Path)):
        model = load_onnx(model, load_weights=False)
    refs = []
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
                 if a.name in ("plugin_version", "plugin_namespace")}
        if "plugin_version" in attrs:
            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)
            refs.append(PluginRef(node.op_type, text(attrs["plugin_version"]), text(attrs.get("plugin_namespace", "")),
                                  node.name or node.op_type))
    return tuple(refs)


def efficient_nms_attributes(nms: NmsSettings) -> dict[str, Any]:
    """The plugin node's attributes for ``nms`` (module docstring: the threshold is the float32
    number just above ``conf``)."""
    threshold = float(np.nextafter(np.float32(nms.conf), np.float32(np.inf)))
    return {"plugin_version": EFFICIENT_NMS_VERSION, "plugin_namespace": "", "score_threshold": threshold,
            "iou_threshold": float(nms.iou), "max_output_boxes": int(nms.max_det), "background_class": -1,
            "score_activation": 0, "class_agnostic": 0, "box_coding": 0}


def _default_opset(model: Any) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return max(versions) if versions else 0


def _raw_output(model: Any, output: str | None, layout: YoloLayout) -> Any:
    """The detector output's ValueInfo, checked against ``layout`` where its dims are static."""
    import onnx

    outs = {o.name: o for o in model.graph.output}
    if output is None:
        if len(outs) != 1:
            raise UsageError(f"the model has {len(outs)} outputs ({', '.join(outs)}); name the detector output")
        output = next(iter(outs))
    if output not in outs:
        raise UsageError(f"output '{output}': not an output of the model (outputs: {', '.join(outs)})")
    vi = outs[output]
    tt = vi.type.tensor_type
    if tt.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        raise UsageError(f"output '{output}': {onnx.TensorProto.DataType.Name(tt.elem_type)}, expected float32 or float16 "
                         f"(EfficientNMS takes float boxes and scores)")
    dims = _dims(vi)
    if len(dims) == 3 and None in dims[1:]:
        dims = _inferred_dims(model, output) or dims
    if len(dims) != 3:
        raise UsageError(f"output '{output}': rank {len(dims)}, a YOLO head output is [batch, ., .]")
    channels = dims[layout.channel_axis]
    if channels is not None and channels != layout.channels:
        raise UsageError(f"output '{output}': axis {layout.channel_axis} has {channels} channels, the "
                         f"{layout.kind.replace('_', '-')} layout with {layout.num_classes} classes needs {layout.channels}")
    return vi


def _dims(vi: Any) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]


def _inferred_dims(model: Any, output: str) -> list[int | None] | None:
    """``output``'s dims by ONNX shape inference with data propagation (exporters leave the channel
    axis of a Concat symbolic); None when inference fails or does not reach it."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - a model inference cannot follow keeps its declared dims
        return None
    for o in inferred.graph.output:
        if o.name == output and len(o.type.tensor_type.shape.dim) == 3:
            return _dims(o)
    return None


def _check_names(model: Any, names: tuple[str, ...]) -> None:
    taken = {t for n in model.graph.node for t in (*n.input, *n.output)} | {v.name for v in model.graph.input}
    taken |= {i.name for i in model.graph.initializer}
    clash = [n for n in names if n in taken]
    if clash:
        raise UsageError(f"tensor '{clash[0]}' already exists in the model; the NMS route names its tensors "
                         f"{', '.join(names)}")


def _decode_nodes(model: Any, raw: Any, layout: YoloLayout) -> None:
    """Append to ``model`` (in place) the nodes that turn ``raw`` into :data:`PLUGIN_INPUTS`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    p = _PREFIX

    def const(name: str, value: np.ndarray) -> str:
        g.initializer.append(numpy_helper.from_array(value, p + name))
        return p + name

    def node(op: str, inputs: list[str], out: str, **attrs: Any) -> str:
        g.node.append(helper.make_node(op, inputs, [out if out in PLUGIN_INPUTS else p + out], name=p + out, **attrs))
        return out if out in PLUGIN_INPUTS else p + out

    def cut(src: str, start: int, stop: int, out: str) -> str:
        return node("Slice", [src, const(f"{out}_start", np.array([start], np.int64)),
                              const(f"{out}_stop", np.array([stop], np.int64)), const(f"{out}_axis", np.array([2], np.int64))], out)

    x = raw.name
    if raw.type.tensor_type.elem_type != TensorProto.FLOAT:
        x = node("Cast", [x], "float32", to=onnx.TensorProto.FLOAT)
    if not layout.channels_last:
        x = node("Transpose", [x], "anchors_last", perm=[0, 2, 1])          # [N, A, channels]
    rows, nc = layout.box_rows, layout.num_classes
    xy, wh = cut(x, 0, 2, "xy"), cut(x, 2, 4, "wh")
    cls = cut(x, rows, rows + nc, "class_prob")
    if layout.kind == "anchor_based":
        cls = node("Mul", [cls, cut(x, 4, 5, "objectness")], "score_all")   # class probability * objectness
    half = node("Div", [wh, const("two", np.array(2, np.float32))], "half_wh")
    corners = [node("Sub", [xy, half], "x1y1"), node("Add", [xy, half], "x2y2")]
    node("Concat", corners, PLUGIN_INPUTS[0], axis=2)                        # [N, A, 4] x1 y1 x2 y2
    best = node("ArgMax", [cls], "best_class", axis=2, keepdims=1)          # [N, A, 1], ties: lowest index
    top = node("GatherElements", [cls, best], "best_score", axis=2)          # [N, A, 1]
    onehot = node("Equal", [best, const("classes", np.arange(nc, dtype=np.int64))], "is_best")
    node("Where", [onehot, top, const("zero", np.array(0, np.float32))], PLUGIN_INPUTS[1])  # [N, A, C]


def _batch_dim(raw: Any) -> Any:
    dim = raw.type.tensor_type.shape.dim[0]
    return dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else "batch")


def efficient_nms_inputs(model: Any, layout: YoloLayout, output: str | None = None) -> Any:
    """A copy of ``model`` whose outputs are the plugin's inputs: ``nms_boxes [N, A, 4]`` (corners,
    float32, input pixels) and ``nms_scores [N, A, C]`` (the best class's score, 0 elsewhere), from
    the detector output ``output`` (the only output when None) laid out as ``layout``."""
    import onnx
    from onnx import TensorProto, helper

    if _default_opset(model) < MIN_OPSET:
        raise UsageError(f"the model's opset is {_default_opset(model)}; the EfficientNMS route needs opset {MIN_OPSET} or later")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    raw = _raw_output(m, output, layout)
    _check_names(m, (*PLUGIN_INPUTS, *NMS_OUTPUTS))
    _decode_nodes(m, raw, layout)
    n = _batch_dim(raw)
    del m.graph.output[:]
    m.graph.output.extend([helper.make_tensor_value_info(PLUGIN_INPUTS[0], TensorProto.FLOAT, [n, None, 4]),
                           helper.make_tensor_value_info(PLUGIN_INPUTS[1], TensorProto.FLOAT, [n, None, layout.num_classes])])
    return m


def add_efficient_nms(model: Any, layout: YoloLayout, nms: NmsSettings | None = None, output: str | None = None) -> Any:
    """A copy of ``model`` with NMS in the graph: :func:`efficient_nms_inputs` plus one
    ``EfficientNMS_TRT`` node (:func:`efficient_nms_attributes`) whose four outputs
    (:data:`NMS_OUTPUTS`) replace the model's outputs. ONNX Runtime cannot run it (the op is
    TensorRT's); TensorRT's parser imports the node as the plugin."""
    from onnx import TensorProto, helper

    nms = nms or NmsSettings()
    m = efficient_nms_inputs(model, layout, output)
    n = m.graph.output[0].type.tensor_type.shape.dim[0]
    batch = n.dim_param or (n.dim_value if n.HasField("dim_value") else "batch")
    m.graph.node.append(helper.make_node(EFFICIENT_NMS, list(PLUGIN_INPUTS), list(NMS_OUTPUTS), name=_PREFIX + "efficient_nms",
                                         **efficient_nms_attributes(nms)))
    k = nms.max_det
    del m.graph.output[:]
    m.graph.output.extend([
        helper.make_tensor_value_info(NMS_OUTPUTS[0], TensorProto.INT32, [batch, 1]),
        helper.make_tensor_value_info(NMS_OUTPUTS[1], TensorProto.FLOAT, [batch, k, 4]),
        helper.make_tensor_value_info(NMS_OUTPUTS[2], TensorProto.FLOAT, [batch, k]),
        helper.make_tensor_value_info(NMS_OUTPUTS[3], TensorProto.INT32, [batch, k]),
    ])
    return m


def write_efficient_nms(src: str | Path, dst: str | Path, layout: YoloLayout, nms: NmsSettings | None = None,
                        output: str | None = None) -> Path:
    """``src`` with :func:`add_efficient_nms` applied, written to ``dst`` (atomically; nothing is
    written when the transform fails). Returns ``dst``."""
    import onnx

    model = add_efficient_nms(load_onnx(src), layout, nms, output)
    dst = Path(dst)
    with atomic_path(dst) as tmp:
        onnx.save(model, str(tmp))
    return dst


def nms_model_config(name: str, model: Any, options: ModelOptions | None = None, plan: PlanMetadata | None = None) -> ModelConfig:
    """The Triton config of the plan built from ``model`` (a graph from :func:`add_efficient_nms`,
    or its path): a ``tensorrt_plan`` model whose outputs are the plugin's four, by
    :func:`~trtrepo.tritonconfig.config_from_io` like any plan (``plan``: the built engine's
    metadata, whose profiles bound ``max_batch_size``). Raises UsageError when ``model`` does not
    end in the plugin's outputs."""
    io = ModelIO.from_onnx(model)
    names = tuple(o.name for o in io.outputs)
    if names != NMS_OUTPUTS:
        raise UsageError(f"model '{name}': outputs {', '.join(names)}; the EfficientNMS route ends in {', '.join(NMS_OUTPUTS)}")
    return config_from_io(name, io, TENSORRT, options, plan=plan)
