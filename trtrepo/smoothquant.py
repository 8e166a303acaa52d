"""SmoothQuant: migrate activation outliers of MatMul/Gemm inputs into the weights.

A trained transformer's MatMul inputs (LayerNorm outputs, the GELU output in front of the MLP's
down projection) carry a few channels 10-100x larger than the rest; one per-tensor 8-bit scale
then rounds every ordinary channel to a handful of levels. SmoothQuant (Xiao et al., 2023) scales
input channel ``k`` by ``1 / s_k`` and the matching weight row by ``s_k``, which leaves the product
unchanged in exact arithmetic::

    s_k = max|X_k| ** alpha / max|W_k| ** (1 - alpha)        (W_k: row k of every weight fed by X)

``alpha`` trades activation range for weight range (0: nothing moves; NNCF uses 0.95 for
transformers, the paper 0.5-0.85). Every MatMul/Gemm that reads ``X`` with a constant weight is
smoothed with the same ``s`` (Q, K and V share one input).

Where ``1 / s`` goes: folded into the scale and bias of the LayerNormalization producing ``X``
when the MatMuls are its only consumers (pre-LN blocks), otherwise an explicit ``Mul`` by a
constant feeds the MatMuls only (post-LN blocks, whose LayerNorm output also feeds the residual;
the GELU output). The smoothed tensor's range is exact without recalibrating: its min/max are
``min_k(min X_k / s_k)`` and ``max_k(max X_k / s_k)`` from the per-channel statistics of the
calibration's first pass (:attr:`trtrepo.calibrate.Statistics.channels`).

Pure functions on ONNX protos and numpy arrays; no ONNX Runtime here.

Stable API::

    smooth_candidates(model) -> dict[tensor, list[node name]]   # what can be smoothed
    smooth_scales(act_absmax, weight_absmax, alpha) -> s
    apply_smoothquant(model, channels, alpha) -> SmoothResult(model, ranges, groups)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import OptionError
from .onnxgraph import consumer_map, producer_map

SCALE_CLIP = (1e-4, 1e4)
EPS = 1e-5
AUTO_ALPHAS = (0.5, 0.65, 0.8, 0.95)


def parse_alpha(value: str | float | None) -> float | str | None:
    """``None``/"off" -> None, "auto" -> "auto", else a float in [0, 1] (the CLI's --smooth-quant)."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("off", "none", "no", "0"):
            return None
        if v == "auto":
            return "auto"
        try:
            value = float(v)
        except ValueError as exc:
            raise OptionError("smooth_quant", f"'{value}': expected off, auto or a number in (0, 1]", concept="the SmoothQuant alpha") from exc
    alpha = float(value)
    if not 0.0 < alpha <= 1.0:
        raise OptionError("smooth_quant", f"{alpha}: alpha must be in (0, 1]", concept="the SmoothQuant alpha")
    return alpha


def smooth_scales(act_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """Per-channel smoothing factors ``s`` (float64, clipped to :data:`SCALE_CLIP`); a channel
    that is zero in the activations or the weights keeps ``s = 1``."""
    a = np.asarray(act_absmax, np.float64)
    w = np.asarray(weight_absmax, np.float64)
    if a.shape != w.shape:
        raise ValueError(f"activation channels {a.shape} do not match weight rows {w.shape}")
    s = np.power(np.maximum(a, EPS), alpha) / np.power(np.maximum(w, EPS), 1.0 - alpha)
    s = np.where((a > 0) & (w > 0), s, 1.0)
    return np.clip(s, *SCALE_CLIP)


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _weight_rows(node: Any, w: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(per-input-channel |W| max, axis of the input channels)`` of a MatMul/Gemm weight, or None
    when the node cannot be smoothed (batched weights, transposed A, scaled Gemm)."""
    if w.ndim != 2:
        return None
    if node.op_type == "Gemm":
        if _attr(node, "transA", 0):
            return None
        axis = 1 if _attr(node, "transB", 0) else 0
    else:
        axis = 0
    return np.max(np.abs(w.astype(np.float64)), axis=1 - axis), axis


def smooth_candidates(model: Any) -> dict[str, list[str]]:
    """Activation tensor -> the MatMul/Gemm nodes that read it as input A with a constant 2-D
    weight B (the groups :func:`apply_smoothquant` smooths). Node names must be unique."""
    inits = {t.name for t in model.graph.initializer}
    groups: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        a, b = node.input[0], node.input[1]
        if not a or a in inits or b not in inits:
            continue
        if node.op_type == "Gemm" and _attr(node, "transA", 0):
            continue
        groups.setdefault(a, []).append(node.name)
    return groups


@dataclass
class SmoothResult:
    model: Any  # the smoothed FP32 model (a new ModelProto)
    ranges: dict[str, tuple[float, float]]  # smoothed tensor -> exact (min, max)
    groups: list[dict[str, Any]] = field(default_factory=list)  # per input: nodes, where 1/s went, ratio
    alpha: float = 0.0


def apply_smoothquant(model: Any, channels: Mapping[str, tuple[np.ndarray, np.ndarray]], alpha: float,
                      *, skip: set[str] | None = None) -> SmoothResult:
    """A smoothed copy of ``model`` (node names unique, see :func:`trtrepo.qdq.prepare_model`).
    ``channels``: per-channel (min, max) of each candidate input, last axis. Inputs without
    statistics, or whose channel count does not match the weights, are left alone; so are the
    nodes named in ``skip`` (kept float by the placement: smoothing them buys nothing)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = _SmoothGraph(out.graph)
    ranges: dict[str, tuple[float, float]] = {}
    groups: list[dict[str, Any]] = []
    for x, names in smooth_candidates(model).items():
        names = [n for n in names if not (skip and n in skip)]
        if not names or x not in channels:
            continue
        cmin, cmax = (np.asarray(v, np.float64) for v in channels[x])
        rows = _group_rows(g, names, cmin)
        if not rows:
            continue
        act = np.maximum(np.abs(cmin), np.abs(cmax))
        s = smooth_scales(act, np.max([r[3] for r in rows], axis=0), alpha)
        _scale_weights(g, rows, s)
        lo, hi = float(np.min(cmin / s)), float(np.max(cmax / s))
        prod = g.producer.get(x)
        if prod is not None and _folds_into_layernorm(g, x, prod, rows, s):
            _fold_into_layernorm(g, prod, s)
            smoothed, folded_into = x, prod.name
        else:
            smoothed, folded_into = _insert_scale_mul(g, x, prod, rows, s)
        ranges[smoothed] = (lo, hi)
        groups.append({"input": x, "nodes": [r[0].name for r in rows], "folded_into": folded_into,
                       "outlier_ratio": _ratio(act), "smoothed_ratio": _ratio(act / s)})
    _drop_unread_initializers(g)
    _place_inserted_muls(g)
    return SmoothResult(out, ranges, groups, float(alpha))


class _SmoothGraph:
    """The graph being smoothed with the lookups every group needs: initializers, nodes,
    producers, consumers, names in use, and the Mul nodes inserted so far (by producer node
    name, '' for a graph input), placed in topological order at the end."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        self.nodes = {n.name: n for n in graph.node}
        self.producer = producer_map(graph.node)
        self.consumers = consumer_map(graph.node)  # name -> (node, input index) of each use
        self.outputs = {o.name for o in graph.output}
        self.used = ({t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
                     | {i.name for i in graph.input})
        self.inserted: dict[str, list[Any]] = {}

    def fresh(self, base: str) -> str:
        """``base``, or ``base_<k>`` for the first k that no tensor or node uses yet."""
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    def add_initializer(self, array: np.ndarray, base: str) -> str:
        """Add ``array`` as a new initializer named after ``base``; returns its name."""
        from onnx import numpy_helper

        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name


def _group_rows(g: _SmoothGraph, names: list[str], cmin: np.ndarray) -> list[tuple[Any, np.ndarray, int, np.ndarray]]:
    """Decision: a group is smoothed only as a whole. Each node's (node, weight, channel axis,
    per-channel |W| max), or [] when any node's weight cannot be smoothed or its channel count
    differs from the statistics'."""
    from onnx import numpy_helper

    rows: list[tuple[Any, np.ndarray, int, np.ndarray]] = []
    for n in names:
        node = g.nodes[n]
        w = numpy_helper.to_array(g.inits[node.input[1]])
        r = _weight_rows(node, w)
        if r is None or r[0].shape != cmin.shape:
            return []
        rows.append((node, w, r[1], r[0]))
    return rows


def _scale_weights(g: _SmoothGraph, rows: list[tuple[Any, np.ndarray, int, np.ndarray]], s: np.ndarray) -> None:
    """Each weight's input-channel rows times ``s`` (in float64, stored in the weight's dtype) as a
    new initializer: the originals stay untouched for other readers."""
    for node, w, axis, _ in rows:
        shape = [1, 1]
        shape[axis] = -1
        scaled = (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype)
        node.input[1] = g.add_initializer(scaled, f"{node.input[1]}_smoothed")


def _folds_into_layernorm(g: _SmoothGraph, x: str, prod: Any, rows: list[tuple[Any, np.ndarray, int, np.ndarray]],
                          s: np.ndarray) -> bool:
    """Decision: ``1 / s`` folds into the LayerNormalization producing ``x`` only when the smoothed
    nodes are ``x``'s sole readers (not a graph output), the LayerNorm's scale (and bias, if any)
    are constants read by it alone, and the scale has one entry per channel. Otherwise a Mul."""
    from onnx import numpy_helper

    sole = {c.name for c, _ in g.consumers.get(x, [])} == {r[0].name for r in rows} and x not in g.outputs
    if not (prod.op_type == "LayerNormalization" and sole and len(prod.input) >= 2
            and prod.input[1] in g.inits and (len(prod.input) < 3 or not prod.input[2] or prod.input[2] in g.inits)
            and len(g.consumers.get(prod.input[1], [])) == 1):
        return False
    return bool(numpy_helper.to_array(g.inits[prod.input[1]]).shape == s.shape)


def _fold_into_layernorm(g: _SmoothGraph, prod: Any, s: np.ndarray) -> None:
    """The LayerNorm's scale (and bias) divided by ``s``, as new float32 initializers."""
    from onnx import numpy_helper

    gamma = numpy_helper.to_array(g.inits[prod.input[1]]).astype(np.float64)
    prod.input[1] = g.add_initializer((gamma / s).astype(np.float32), f"{prod.input[1]}_smoothed")
    if len(prod.input) >= 3 and prod.input[2]:
        beta = numpy_helper.to_array(g.inits[prod.input[2]]).astype(np.float64)
        prod.input[2] = g.add_initializer((beta / s).astype(np.float32), f"{prod.input[2]}_smoothed")


def _insert_scale_mul(g: _SmoothGraph, x: str, prod: Any, rows: list[tuple[Any, np.ndarray, int, np.ndarray]],
                      s: np.ndarray) -> tuple[str, str]:
    """A ``Mul`` by ``1 / s`` after ``x`` that feeds the smoothed nodes only (other readers keep
    ``x``); returns (smoothed tensor, Mul node name)."""
    from onnx import helper

    inv = g.add_initializer((1.0 / s).astype(np.float32), f"{x}_smooth_scale")
    xs = g.fresh(f"{x}_smoothed")
    mul = helper.make_node("Mul", [x, inv], [xs], name=g.fresh(f"{x}_SmoothQuant"))
    g.inserted.setdefault(prod.name if prod is not None else "", []).append(mul)
    for node, *_ in rows:
        node.input[0] = xs
    return xs, mul.name


def _drop_unread_initializers(g: _SmoothGraph) -> None:
    """The original weights (and LayerNorm scales) now read by nobody: dropped, not carried twice."""
    graph = g.graph
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    used |= {i for muls in g.inserted.values() for n in muls for i in n.input}
    if any(t.name not in used for t in graph.initializer):
        keep = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _place_inserted_muls(g: _SmoothGraph) -> None:
    """Each inserted Mul right after its producer (graph-input Muls first): topological order kept."""
    if not g.inserted:
        return
    graph = g.graph
    order = list(g.inserted.get("", []))
    for n in graph.node:
        order.append(n)
        order.extend(g.inserted.get(n.name, []))
    del graph.node[:]
    graph.node.extend(order)


def _ratio(absmax: np.ndarray) -> float:
    """Largest channel range over the median channel range: how outlier-heavy an input is."""
    med = float(np.median(absmax))
    return float(np.max(absmax) / med) if med > 0 else float("inf")
