"""Issue 43 study: can ONNX Runtime run a convolution in integers without rounding its output (the
pre-activation before a SiLU) to uint8? ONNX's ConvInteger emits int32, so the scales, the bias and
the SiLU run in float after it. Times one 32 -> 64, 3x3 convolution with its SiLU at batch 8 on
160x160 maps (2 threads, medians of 7 runs): float Conv; Q/DQ around it (ONNX Runtime fuses
QLinearConv); ConvInteger + Cast + Mul + Add. ConvInteger takes per-tensor weight zero points only.

    python convinteger.py
"""
from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

N, C, K, H = 8, 32, 64, 160
rng = np.random.default_rng(0)
W = rng.normal(size=(K, C, 3, 3)).astype(np.float32) * 0.1
B = rng.normal(size=K).astype(np.float32)
WS = (np.abs(W).max((1, 2, 3)) / 127).astype(np.float32)
WQ = np.clip(np.round(W / WS[:, None, None, None]), -127, 127).astype(np.int8)
XS = np.float32(1 / 255)


def model(kind: str) -> bytes:
    inits = [nh.from_array(WQ, "wq"), nh.from_array(WS, "ws"), nh.from_array(np.zeros(K, np.int8), "wz"),
             nh.from_array(np.array(0, np.int8), "wz0"), nh.from_array(np.array(XS, np.float32), "xs"),
             nh.from_array(np.array(0, np.uint8), "xz"), nh.from_array(B, "b"),
             nh.from_array(np.array(0.05, np.float32), "ys"), nh.from_array(np.array(10, np.uint8), "yz"),
             nh.from_array((XS * WS).reshape(1, K, 1, 1).astype(np.float32), "sc"), nh.from_array(B.reshape(1, K, 1, 1), "b4")]
    silu = [h.make_node("Sigmoid", ["c"], ["s"]), h.make_node("Mul", ["c", "s"], ["m"])]
    if kind == "float":
        nodes = [h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
                 h.make_node("Conv", ["x", "wd", "b"], ["c"], pads=[1, 1, 1, 1]), *silu,
                 h.make_node("Identity", ["m"], ["y"])]
        out_type = T.FLOAT
    else:
        nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"])]
        if kind == "qdq":
            nodes += [h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
                      h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
                      h.make_node("Conv", ["xd", "wd", "b"], ["c0"], pads=[1, 1, 1, 1]),
                      h.make_node("QuantizeLinear", ["c0", "ys", "yz"], ["cq"]),
                      h.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["c"])]
        else:
            nodes += [h.make_node("ConvInteger", ["xq", "wq", "xz", "wz0"], ["ci"], pads=[1, 1, 1, 1]),
                      h.make_node("Cast", ["ci"], ["cf"], to=T.FLOAT), h.make_node("Mul", ["cf", "sc"], ["c1"]),
                      h.make_node("Add", ["c1", "b4"], ["c"])]
        nodes += [*silu, h.make_node("QuantizeLinear", ["m", "ys", "yz"], ["y"])]
        out_type = T.UINT8
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [N, C, H, H])],
                     [h.make_tensor_value_info("y", out_type, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def main() -> None:
    x = rng.random((N, C, H, H)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    for kind in ("float", "qdq", "convinteger"):
        s = ort.InferenceSession(model(kind), so, providers=["CPUExecutionProvider"])
        s.run(None, {"x": x})
        took = []
        for _ in range(7):
            t0 = time.perf_counter()
            s.run(None, {"x": x})
            took.append(time.perf_counter() - t0)
        print(f"{kind}: {1000 * np.median(took):.1f} ms")


if __name__ == "__main__":
    main()
