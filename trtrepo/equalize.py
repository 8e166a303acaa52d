"""Activation equalization of ``quantize`` (the cross-layer equalization step): the small
channels of a non-negative activation that feeds a depthwise convolution are amplified in the
producing convolution and attenuated again in the depthwise weights, so that one per-tensor INT8
scale resolves every channel.

Chains equalized: ``Conv -> (Relu | Clip[0, c]) -> depthwise Conv`` where each tensor has that one
consumer (MobileNet's expand -> depthwise links). The depthwise consumer is quantized per output
channel, which is its input channel, so the attenuated weights lose nothing. Chains into a
dense Conv would trade activation resolution for weight resolution and are left alone, as are
chains whose activation is not ReLU/ReLU6-like.

The scales come from each channel's largest pre-activation value on the calibration data
(:func:`trtrepo.weightmath.clip_safe_amplification`): exact for ReLU, exact below ``c / margin``
for a clip ``c``. The caller measures the equalized FP32 model against the original on
held-out data and keeps it only where its outputs agree (:data:`MAX_RELATIVE_CHANGE`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import weightmath as W
from .modelio import with_outputs
from .onnxgraph import GraphView, make_session

MAX_RELATIVE_CHANGE = 1e-4  # largest FP32 output change (over the output's largest value) allowed
MARGIN = 4.0


@dataclass
class Chain:
    producer: str  # the Conv whose output channels are amplified
    activation: str  # Relu or Clip node
    consumer: str  # the depthwise Conv whose weights are attenuated
    tensor: str  # the producer's output (pre-activation)
    clip: float | None


@dataclass
class Equalization:
    model: Any
    chains: list[Chain] = field(default_factory=list)
    channels_scaled: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"chains": len(self.chains), "channels_scaled": self.channels_scaled, "seconds": round(self.seconds, 3),
                "pairs": [[c.producer, c.consumer] for c in self.chains]}


def _clip_bounds(view: GraphView, node: Any) -> tuple[float | None, float | None]:
    if node.op_type == "Relu":
        return 0.0, None
    lo = node.input[1] if len(node.input) > 1 else ""
    hi = node.input[2] if len(node.input) > 2 else ""
    lo_v = float(view.constant_array(lo)) if lo and view.is_constant(lo) else view.attr(node, "min")
    hi_v = float(view.constant_array(hi)) if hi and view.is_constant(hi) else view.attr(node, "max")
    return (None if lo_v is None else float(lo_v)), (None if hi_v is None else float(hi_v))


def find_chains(model: Any, excluded: Sequence[str] = ()) -> list[Chain]:
    """Every Conv -> ReLU/Clip(0, hi) -> depthwise Conv chain whose scales can move: the three
    decisions below, and weights read by their Conv alone."""
    view = GraphView(model)
    out = []
    for node in view.nodes:
        if not _constant_conv(view, node, excluded):
            continue
        act = _relu_after(view, node)
        if act is None:
            continue
        dw = _depthwise_after(view, act, node, excluded)
        if dw is None:
            continue
        if len(view.consumers.get(node.input[1], [])) != 1 or len(view.consumers.get(dw.input[1], [])) != 1:
            continue
        out.append(Chain(node.name, act.name, dw.name, node.output[0], _clip_bounds(view, act)[1]))
    return out


def _constant_conv(view: GraphView, node: Any, excluded: Sequence[str]) -> bool:
    """Decision: a chain starts at a Conv not excluded whose weight (and bias, if any) are constants."""
    if node.op_type != "Conv" or node.name in excluded or len(node.input) < 2 or not view.is_constant(node.input[1]):
        return False
    return not (len(node.input) > 2 and node.input[2] and not view.is_constant(node.input[2]))


def _relu_after(view: GraphView, node: Any) -> Any:
    """Decision: the Conv's sole reader (its output not a graph output) is a ReLU, or a Clip from
    0 to a positive (or no) bound; that node, else None."""
    cons = view.consumers.get(node.output[0], [])
    if len(cons) != 1 or cons[0][0].op_type not in ("Relu", "Clip") or node.output[0] in view.graph_outputs:
        return None
    act = cons[0][0]
    lo, hi = _clip_bounds(view, act)
    if lo != 0.0 or (hi is not None and hi <= 0):
        return None
    return act


def _depthwise_after(view: GraphView, act: Any, node: Any, excluded: Sequence[str]) -> Any:
    """Decision: the activation's sole reader (as its data input; not a graph output) is a
    depthwise Conv, not excluded, with constant weights of one input channel per group and as many
    groups as the first Conv has output channels; that node, else None."""
    nxt = view.consumers.get(act.output[0], [])
    if len(nxt) != 1 or nxt[0][0].op_type != "Conv" or nxt[0][1] != 0 or act.output[0] in view.graph_outputs:
        return None
    dw = nxt[0][0]
    if dw.name in excluded or not view.is_constant(dw.input[1]):
        return None
    w2 = view.constant_array(dw.input[1])
    w1 = view.constant_array(node.input[1])
    if w2.ndim != 4 or w2.shape[1] != 1 or int(view.attr(dw, "group", 1)) != w2.shape[0] or w2.shape[0] != w1.shape[0]:
        return None
    return dw


def channel_maxima(model: Any, chains: Sequence[Chain], batches: Sequence[Any], threads: int | None = None) -> dict[str, np.ndarray]:
    """Each chain tensor's per-channel maximum over ``batches`` (one FP32 pass)."""

    names = [c.tensor for c in chains]
    session = make_session(with_outputs(model, names), threads=threads, arena=False, spin=False)
    out: dict[str, np.ndarray] = {}
    for batch in batches:
        for name, x in zip(names, session.run(names, batch.inputs), strict=True):
            m = x.max(axis=tuple(i for i in range(x.ndim) if i != 1))
            out[name] = m if name not in out else np.maximum(out[name], m)
    return out


def equalize(model: Any, batches: Sequence[Any], *, excluded: Sequence[str] = (), margin: float = MARGIN,
             threads: int | None = None) -> Equalization:
    """A copy of ``model`` with every chain equalized (see the module doc)."""
    import onnx
    from onnx import numpy_helper

    t0 = time.perf_counter()
    chains = find_chains(model, excluded)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if not chains:
        return Equalization(out, [], 0, time.perf_counter() - t0)
    maxima = channel_maxima(model, chains, batches, threads=threads)
    inits = {t.name: t for t in out.graph.initializer}
    nodes = {n.name: n for n in out.graph.node}
    scaled = 0
    for c in chains:
        s = W.clip_safe_amplification(maxima[c.tensor], clip=c.clip, margin=margin).astype(np.float32)
        scaled += int(np.sum(s < 1.0))
        p, d = nodes[c.producer], nodes[c.consumer]
        w1 = numpy_helper.to_array(inits[p.input[1]])
        inits[p.input[1]].CopyFrom(numpy_helper.from_array((w1 / s.reshape(-1, *([1] * (w1.ndim - 1)))).astype(np.float32), p.input[1]))
        if len(p.input) > 2 and p.input[2]:
            b1 = numpy_helper.to_array(inits[p.input[2]])
            inits[p.input[2]].CopyFrom(numpy_helper.from_array((b1 / s).astype(np.float32), p.input[2]))
        w2 = numpy_helper.to_array(inits[d.input[1]])
        inits[d.input[1]].CopyFrom(numpy_helper.from_array((w2 * s.reshape(-1, 1, 1, 1)).astype(np.float32), d.input[1]))
    return Equalization(out, chains, scaled, time.perf_counter() - t0)
