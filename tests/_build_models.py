"""Small ONNX models for the build tests: the demo CNN (FP32) and a Q/DQ variant of it.

The Q/DQ variant is made here by a plain graph edit (a symmetric int8 QuantizeLinear -> DequantizeLinear
pair on the input), so the build tests do not depend on the quantize stage; it runs in ONNX Runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def add_input_qdq(src: str | Path, dst: str | Path, scale: float = 1.0 / 127) -> Path:
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    name = graph.input[0].name
    graph.initializer.extend([
        numpy_helper.from_array(np.array(scale, np.float32), f"{name}_scale"),
        numpy_helper.from_array(np.array(0, np.int8), f"{name}_zero_point"),
    ])
    for node in graph.node:
        for i, x in enumerate(node.input):
            if x == name:
                node.input[i] = f"{name}_dq"
    graph.node.insert(0, helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero_point"], [f"{name}_dq"]))
    graph.node.insert(0, helper.make_node("QuantizeLinear", [name, f"{name}_scale", f"{name}_zero_point"], [f"{name}_q"]))
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return Path(dst)


def demo_models(folder: str | Path) -> tuple[Path, Path]:
    """``folder/demo.onnx`` and ``folder/demo.qdq.onnx`` (made once, reused)."""
    from trtrepo.export import export_onnx

    folder = Path(folder)
    fp32, qdq = folder / "demo.onnx", folder / "demo.qdq.onnx"
    if not fp32.exists():
        export_onnx("demo", fp32)
    if not qdq.exists():
        add_input_qdq(fp32, qdq)
    return fp32, qdq


def add_matmul_qdq(src: str | Path, dst: str | Path, scale: float = 0.05) -> Path:
    """A Q/DQ pair on the activation input of every MatMul whose other input is a weight (a minimal Q/DQ
    transformer for the build tests; runs in ONNX Runtime)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    graph.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), "qdq_scale"),
                              numpy_helper.from_array(np.array(0, np.int8), "qdq_zero_point")])
    nodes = []
    for i, node in enumerate(graph.node):
        if node.op_type == "MatMul" and node.input[1] in inits and node.input[0] not in inits:
            x = node.input[0]
            nodes.append(helper.make_node("QuantizeLinear", [x, "qdq_scale", "qdq_zero_point"], [f"{x}_q{i}"]))
            nodes.append(helper.make_node("DequantizeLinear", [f"{x}_q{i}", "qdq_scale", "qdq_zero_point"], [f"{x}_dq{i}"]))
            node.input[0] = f"{x}_dq{i}"
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return Path(dst)


def demo_text_models(folder: str | Path) -> tuple[Path, Path]:
    """``folder/text.onnx`` (the demo-text encoder: input_ids and attention_mask, dynamic batch and sequence)
    and ``folder/text.qdq.onnx`` (made once, reused)."""
    from trtrepo.export import export_onnx

    folder = Path(folder)
    fp32, qdq = folder / "text.onnx", folder / "text.qdq.onnx"
    if not fp32.exists():
        export_onnx("demo-text", fp32)
    if not qdq.exists():
        add_matmul_qdq(fp32, qdq)
    return fp32, qdq
