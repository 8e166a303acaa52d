"""Issue 42 item 4: the ONNX adapter floor. ``trtrepo.onnxgraph`` owns GraphView, the producer and
consumer maps and the ONNX Runtime CPU session factory; no other module opens an
``InferenceSession`` itself except the two that need what the factory does not give (the
calibrator: providers, memory pattern, optimized-model files; the load probe: a child-process
script that imports nothing from trtrepo), and no module outside it builds a name -> node producer map."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from trtrepo.onnxgraph import GraphView, consumer_map, make_session, producer_map

PACKAGE = Path(__file__).resolve().parents[1] / "trtrepo"
OWN_SESSIONS = {"onnxgraph.py", "calibrate/calibrator.py", "repository/loadprobe.py"}


def session_openers(source: str) -> list[int]:
    """Lines that call ``<anything>.InferenceSession(...)``."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "InferenceSession"]


def test_one_session_factory() -> None:
    hits = {str(p.relative_to(PACKAGE)): session_openers(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    hits = {k: v for k, v in hits.items() if v and k not in OWN_SESSIONS}
    assert hits == {}, hits
    assert session_openers("import onnxruntime as ort\ns = ort.InferenceSession('m.onnx')\n") == [2]


def test_no_module_rebuilds_the_producer_map() -> None:
    """``{o: n for n in nodes for o in n.output}`` (the map's shape) appears only in onnxgraph."""
    def builds(source: str) -> bool:
        return any(isinstance(c, ast.DictComp) and len(c.generators) == 2
                   and isinstance(c.generators[1].iter, ast.Attribute) and c.generators[1].iter.attr == "output"
                   and isinstance(c.value, ast.Name) and isinstance(c.generators[0].target, ast.Name)
                   and c.value.id == c.generators[0].target.id
                   for c in ast.walk(ast.parse(source)))
    assert builds("p = {o: n for n in graph.node for o in n.output}\n")
    found = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py")) if builds(p.read_text())]
    assert found == ["onnxgraph.py"]


def test_maps_and_session_on_a_real_graph() -> None:
    """x -> Relu -> Mul(r, r) -> y: the maps name each use (twice for Mul's two reads), GraphView
    sees the same, and the factory's session runs it."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Mul", ["r", "r"], ["y"], name="mul")]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", [vi[0]], [vi[1]]), opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    assert {k: v.name for k, v in producer_map(model.graph.node).items()} == {"r": "relu", "y": "mul"}
    assert {k: [(n.name, i) for n, i in v] for k, v in consumer_map(model.graph.node).items()} == {
        "x": [("relu", 0)], "r": [("mul", 0), ("mul", 1)]}
    view = GraphView(model)
    assert view.producer["y"].name == "mul" and [i for _, i in view.consumers["r"]] == [0, 1]
    assert view.non_negative("y") and view.shape["y"] == [2]
    (out,) = make_session(model, threads=1).run(None, {"x": np.array([-2.0, 3.0], np.float32)})
    np.testing.assert_array_equal(out, np.array([0.0, 9.0], np.float32))
