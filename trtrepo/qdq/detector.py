"""The decode head of a YOLO-style detector, found in the graph, kept out of INT8.

A YOLO detector ends in a *decode head*: the box branch's distribution (DFL: a softmax over 16 bins
per side, then a fixed 1x1 convolution computing its expectation) or sigmoid grid offsets, the
anchor arithmetic turning them into pixel coordinates (Sub/Add/Mul/Div with constant anchor
points and strides), the sigmoid class scores, and a Concat joining box coordinates (0-640
pixels) and class probabilities (0-1) into one output. One per-tensor INT8 scale over that concat
rounds every class score to a handful of levels, and one over the softmax before the DFL
expectation does the same to the box sides; the published CPU recipes (NNCF/OpenVINO for YOLOv8)
keep that part float by a hand-written list of node names. Here it is decided from the graph:

* walk back from each graph output through every node, stopping at the *feature layers* (a Conv,
  ConvTranspose, Gemm or MatMul whose input is not a softmax distribution: the head's last
  convolutions stay INT8, only their outputs are left float) and at Shape/Size (which read a
  tensor's shape, not its values: a dynamic export's anchor computation);
* the output is a detector's when that region holds a Sigmoid and the output is made by a
  Concat (through shape-only ops): box coordinates and scores joined -- true of YOLOv5/v7 (anchor
  grids), YOLOv8 and YOLO11 (anchor-free, DFL) exports, not of a classifier (its output is a
  Gemm's) or an encoder (its output is a pooling or a LayerNorm);
* every node of that region is kept float, named with the reason.

On TensorRT the region runs in FP16 (a float layer of a strongly typed engine is what its Q/DQ
placement leaves it). Measured on the trained YOLO11n: docs/benchmarks.md, "Issue 43".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, UsageError
from ..evaluate import detection_layout
from ..onnxgraph import GraphView

FEATURE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ops that only move or reshape values (a softmax seen through them is still the DFL's input)
_SHAPE_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Split", "Gather")
TASKS = ("auto", "detect")  # what the model is: found (graph, exporter's metadata) or said to be a detector
EXPORTER_TASKS = ("detect", "segment", "pose")  # Ultralytics' metadata ``task`` of a YOLO detector head
REASON = ("decode head of a YOLO-style detector (box distribution, anchor arithmetic, sigmoid scores and the "
          "box/score concat): one INT8 scale over box pixels and class probabilities erases the scores")


@dataclass(frozen=True)
class DecodeHead:
    """A detector output and the nodes of its decode head (kept float)."""

    output: str
    nodes: tuple[str, ...]
    concat: str  # the Concat joining boxes and scores


def _through_shape_ops(view: GraphView, tensor: str, hops: int) -> Any:
    """The producer of ``tensor`` seen through at most ``hops`` shape-only ops (the first producer
    that is not one), or None."""
    for _ in range(hops + 1):
        node = view.producer.get(tensor)
        if node is None or node.op_type not in _SHAPE_OPS or not node.input:
            return node
        tensor = node.input[0]
    return None


def _fed_by_softmax(view: GraphView, tensor: str) -> bool:
    """Whether ``tensor`` is a softmax's output, seen through shape-only ops (the DFL's input)."""
    node = _through_shape_ops(view, tensor, 7)
    return node is not None and node.op_type == "Softmax"


def _region(view: GraphView, output: str) -> list[Any]:
    """The nodes from which ``output`` is reached without passing a feature layer (see the module doc)."""
    found: dict[str, Any] = {}
    stack = [output]
    while stack:
        node = view.producer.get(stack.pop())
        if node is None or node.name in found:
            continue
        if node.op_type in FEATURE_OPS and not (node.input and _fed_by_softmax(view, node.input[0])):
            continue
        found[node.name] = node
        if node.op_type in ("Shape", "Size"):  # reads its input's shape only: the walk stops here
            continue
        stack.extend(i for i in node.input if i and not view.is_constant(i))
    return list(found.values())


def _output_concat(view: GraphView, output: str) -> Any:
    """The Concat that makes ``output`` (through shape-only ops), or None."""
    node = _through_shape_ops(view, output, 3)
    return node if node is not None and node.op_type == "Concat" else None


def find_decode_heads(view: GraphView, outputs: Iterable[str] | None = None) -> list[DecodeHead]:
    """The decode heads of the graph's outputs (all, or ``outputs``) that are a detector's."""
    heads = []
    for out in outputs if outputs is not None else sorted(view.graph_outputs):
        concat = _output_concat(view, out)
        if concat is None:
            continue
        region = _region(view, out)
        if not any(n.op_type == "Sigmoid" for n in region):
            continue
        heads.append(DecodeHead(out, tuple(n.name for n in region), concat.name))
    return heads


def detector_outputs(model: Any, task: str = "auto") -> dict[str, int | None]:
    """The graph outputs that are a detector's, each with its class count when the exporter's
    metadata names the classes (Ultralytics' ``names``), else None (read off the output's shape
    when it is judged: ``trtrepo.evaluate.detection_layout``). Decided in this order:

    * the graph: the outputs of the decode heads :func:`find_decode_heads` finds;
    * else the exporter's metadata (Ultralytics' ``task`` detect, segment or pose) or ``task``
      ``"detect"`` (the user's word, :data:`TASKS`): the outputs whose declared shape has a YOLO
      layout (:func:`yolo_outputs`). With ``task`` ``"detect"`` and none, an
      :class:`~trtrepo.errors.OptionError` on ``task`` (one line, naming the outputs' shapes).

    Only the judging follows ``task``: where the graph walk finds no head, no node is kept float
    for it (name them with the placement's node exclusions)."""
    if task not in TASKS:
        raise OptionError("task", f"{task!r}: expected one of {', '.join(TASKS)}")
    heads = find_decode_heads(GraphView(model))
    meta = {prop.key: prop.value for prop in getattr(model, "metadata_props", ())}
    classes = (meta["names"].count(":") or None) if "names" in meta else None  # "{0: 'person', 1: 'bicycle', ...}"
    if heads:
        return {h.output: classes for h in heads}
    if task != "detect" and meta.get("task") not in EXPORTER_TASKS:
        return {}
    found = yolo_outputs(model, classes)
    if not found and task == "detect":
        shapes = "; ".join(f"'{name}' {shape}" for name, shape in declared_shapes(model).items())
        raise OptionError("task", f"detect: no output has a YOLO-style layout ([batch, 4 + classes, anchors] or "
                                  f"[batch, anchors, 5 + classes]; outputs: {shapes}): leave it auto for a model "
                                  f"that is not a detector", concept="the task")
    return {name: classes for name in found}


def declared_shapes(model: Any) -> dict[str, list[int | None]]:
    """Graph output -> its declared shape (None for a dynamic dimension; ``[]`` when undeclared)."""
    return {o.name: [d.dim_value if d.HasField("dim_value") else None for d in o.type.tensor_type.shape.dim]
            for o in model.graph.output}


def yolo_outputs(model: Any, classes: int | None = None) -> list[str]:
    """The graph outputs whose declared shape reads as a YOLO head's
    (:func:`trtrepo.evaluate.detection_layout`, with ``classes`` when the exporter names them)."""
    found = []
    for name, shape in declared_shapes(model).items():
        try:
            detection_layout(shape, classes)  # type: ignore[arg-type]
        except UsageError:
            continue
        found.append(name)
    return found


def decode_head_nodes(view: GraphView) -> dict[str, str]:
    """Node name -> reason, for every node of every detector decode head (:func:`find_decode_heads`)."""
    return {name: f"{REASON} (output '{head.output}')" for head in find_decode_heads(view) for name in head.nodes}
