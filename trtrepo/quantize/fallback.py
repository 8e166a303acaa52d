"""The accuracy-target fallback: layers (or blocks of them) left in float, most sensitive first,
until the target holds."""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, UsageError
from ..evaluate import (
    AccuracyTarget,
    OutputMetrics,
    pick_output,
)
from ..onnxgraph import GraphView
from ..qdq import (
    ActivationRange,
    QuantizedModel,
    QuantizeOptions,
    gating_product,
    insert_qdq,
    prepare_model,
)
from .select import Candidate, Evaluator

log = logging.getLogger(__name__)
@dataclass
class FallbackStep:
    layers_in_float: list[str]
    value: float
    met: bool
    cosine: float
    label: str = ""  # what this step left in float (a role group, a block, a bisection half)
    speed: float | None = None  # FP32 time / this candidate's time on the held-out data (same process)


@dataclass
class FallbackResult:
    chosen: QuantizedModel
    metrics: dict[str, OutputMetrics]
    sensitivity: list[dict[str, Any]]
    steps: list[FallbackStep]
    weighted_layers: int = 0  # MatMul/Gemm/Conv layers quantized before the fallback
    weighted_in_float: int = 0  # ... of which the chosen model leaves in float
    seconds: float = 0.0


def _goodness(target: AccuracyTarget, metrics: Mapping[str, OutputMetrics]) -> tuple[float, float]:
    v = target.measure(metrics)
    return (-v if target.lower_is_better else v, pick_output(metrics, target.output).cosine_mean)


def check_reachable(target: AccuracyTarget, evaluator: Evaluator) -> None:
    """Refuse a target that the FP32 model (every layer in float) misses on the evaluation data."""
    fp32 = evaluator.fp32_metrics()
    if not target.met(fp32):
        raise OptionError("accuracy_target", f"{target} cannot be met even with every layer in float (the FP32 model "
                          f"itself gives {target.measure(fp32):.6g} on {evaluator.source.name})")


# Layer roles (what the fallback leaves in float as a group before single layers).
_ACT_OPS = ("Relu", "Gelu", "Erf", "Tanh", "Sigmoid", "FastGelu", "BiasGelu", "Clip", "HardSigmoid", "HardSwish", "Softplus",
            "LeakyRelu", "Elu", "Mish")
_LAYOUT_OPS = ("Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten")


def layer_roles(model: Any, layers: Sequence[str]) -> dict[str, str]:
    """Role of each quantized layer (node name) of a prepared model: ``attention`` (Q/K/V and
    output projections: a MatMul/Gemm whose output reaches, or whose input comes from, a MatMul of
    two activations), ``mlp_down`` (input from an activation function), ``mlp_up`` (other
    MatMul/Gemm), ``conv``, ``residual_add`` (Add/Mul units), ``pool``; the first and the last
    weighted layer are ``first_last``."""

    view = GraphView(model)
    by_name = {n.name: n for n in view.nodes}

    def act_matmul(node: Any) -> bool:
        return node.op_type in ("MatMul", "Gemm") and all(view.is_float_activation(i) for i in node.input[:2] if i)

    def transparent(node: Any) -> bool:
        """Reshapes, casts, and elementwise ops with one activation input (a bias Add, a scale,
        SmoothQuant's Mul, GELU's * 0.5): they do not change what a tensor is."""
        if node.op_type in _LAYOUT_OPS:
            return True
        return node.op_type in ("Add", "Sub", "Mul", "Div") and sum(view.is_float_activation(i) for i in node.input) == 1

    def source(tensor: str, depth: int = 8) -> Any:
        p = view.producer.get(tensor)
        while p is not None and depth > 0 and transparent(p):
            act = next((i for i in p.input if view.is_float_activation(i)), None)
            p, depth = (view.producer.get(act) if act else None), depth - 1
        return p

    def reaches_attention(tensor: str, depth: int = 8) -> bool:
        for c, _ in view.consumers.get(tensor, []):
            if act_matmul(c) or (depth > 0 and transparent(c) and reaches_attention(c.output[0], depth - 1)):
                return True
        return False

    def after_activation(p: Any) -> bool:
        return p is not None and (p.op_type in _ACT_OPS or (p.op_type == "Mul" and gating_product(view, p)))

    roles: dict[str, str] = {}
    weighted = []
    for name in layers:
        node = by_name.get(name)
        if node is None:
            continue
        op = node.op_type
        if op in ("Conv", "ConvTranspose"):
            roles[name] = "conv"
        elif op in ("MatMul", "Gemm"):
            src = source(node.input[0])
            if reaches_attention(node.output[0]) or (src is not None and act_matmul(src)):
                roles[name] = "attention"
            else:
                roles[name] = "mlp_down" if after_activation(src) else "mlp_up"
        elif op in ("Add", "Mul"):
            roles[name] = "residual_add"
        else:
            roles[name] = "pool"
        if op in ("Conv", "ConvTranspose", "MatMul", "Gemm"):
            weighted.append(name)
    if len(weighted) > 2:
        roles[weighted[0]] = roles[weighted[-1]] = "first_last"
    return roles


def layer_blocks(layers: Sequence[str], max_blocks: int = 8) -> dict[str, str]:
    """Block of each layer: the first ``layer.N``/``block.N``/``blocks.N``/``layers.N``-style
    index in its name, else consecutive runs of the graph order cut into ``max_blocks``."""

    pattern = re.compile(r"(?:layers?|blocks?|stages?|h|encoder)[._/](\d+)")
    found = {name: m.group(0) for name in layers if (m := pattern.search(name))}
    if len(set(found.values())) >= 2 and len(found) >= len(layers) // 2:
        return {name: found.get(name, "other") for name in layers}
    size = max(1, math.ceil(len(layers) / max_blocks))
    return {name: f"part {i // size + 1}" for i, name in enumerate(layers)}


def fallback(model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions, evaluator: Evaluator,
             target: AccuracyTarget, start: Candidate, *, budget_s: float = 900.0) -> FallbackResult:
    """Leave as few layers in float as needed for ``target``, keeping INT8 where it is harmless.

    The calibration is reused (only Q/DQ placement changes). Search, each step measured on the
    held-out data with its speed against FP32:

    1. **groups first**: each role group (:func:`layer_roles`: first/last layers, attention,
       MLP up/down projections, residual Adds, convs) alone in float, then each block
       (:func:`layer_blocks`); the group that helps most is kept in float, more groups are added
       (best first) until the target holds;
    2. **bisection** inside the groups that are float: halves are put back to INT8 while the target
       still holds, so a group shrinks to the layers that matter;
    3. only when no set of groups meets the target: single layers by sensitivity, as before.

    Bounded by ``budget_s`` (the best model meeting the target so far is returned when it runs
    out; an error when none does)."""
    t0 = time.perf_counter()
    check_reachable(target, evaluator)
    if start.quantized is None:
        raise ValueError("fallback starts from the chosen candidate, whose model is kept")
    metrics = start.metrics if start.metrics is not None else evaluator(start.quantized.model)
    search = _Search(model, ranges, options, evaluator, target, t0 + budget_s)
    search.steps.append(FallbackStep([], target.measure(metrics), target.met(metrics),
                                     pick_output(metrics, target.output).cosine_mean, "all INT8", evaluator.speed()))
    layers = list(start.quantized.plan.layers)
    roles = layer_roles(prepare_model(model), layers)
    weighted = [n for n in layers if roles.get(n) in ("conv", "attention", "mlp_up", "mlp_down", "first_last")]
    if search.steps[0].met:
        return FallbackResult(start.quantized, metrics, [], search.steps, len(weighted), 0, time.perf_counter() - t0)
    chosen = search.by_groups(roles, layers)
    if chosen is not None:
        chosen = search.bisect(chosen)
    sensitivity: list[dict[str, Any]] = []
    if chosen is None:
        chosen, sensitivity = search.by_sensitivity(layers)
    if chosen is None:
        best = max((s.value for s in search.steps), key=search._score)
        raise OptionError("accuracy_target", f"{target} is only met with every layer in float (best with INT8 left: "
                          f"{best:.6g}{'; time budget ran out' if search.out_of_time() else ''}); nothing written")
    # the smallest float set that met the target (bisection may have found several)
    met = [s for s in search.steps if s.met]
    final = min(met, key=lambda s: (len(s.layers_in_float), -(s.speed or 0.0)))
    qm, m, _ = search.cache[frozenset(final.layers_in_float)]
    assert qm is not None and m is not None
    in_float_weighted = sum(1 for n in final.layers_in_float if n in weighted)
    if weighted and in_float_weighted > len(weighted) / 2:
        log.warning("--accuracy-target %s needs %d of %d MatMul/Conv layers in float: most of the model runs in "
                    "FP32 (expect little speed-up)", target, in_float_weighted, len(weighted))
    return FallbackResult(qm, m, sensitivity, search.steps, len(weighted), in_float_weighted, time.perf_counter() - t0)


class _Search:
    """The fallback's measured steps: each float set quantized once (cached), measured on the
    held-out data, recorded in ``steps``; every stage stops at ``deadline``."""

    def __init__(self, model: Any, ranges: Mapping[str, ActivationRange], options: QuantizeOptions,
                 evaluator: Evaluator, target: AccuracyTarget, deadline: float) -> None:
        self.model, self.ranges, self.options, self.evaluator, self.target = model, ranges, options, evaluator, target
        self.deadline = deadline
        self.steps: list[FallbackStep] = []
        self.cache: dict[frozenset[str], tuple[QuantizedModel | None, dict[str, OutputMetrics] | None,
                                               FallbackStep | None]] = {}

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    def _score(self, value: float) -> float:
        return -value if self.target.lower_is_better else value

    def measure(self, in_float: Sequence[str], label: str) -> FallbackStep | None:
        key = frozenset(in_float)
        if key in self.cache:
            return self.cache[key][2]
        try:
            qm = insert_qdq(self.model, self.ranges, self.options.with_excluded_nodes(sorted(key)), warn=False)
        except UsageError:
            self.cache[key] = (None, None, None)  # nothing left to quantize
            return None
        m = self.evaluator(qm.model)
        target = self.target
        step = FallbackStep(sorted(key), target.measure(m), target.met(m), pick_output(m, target.output).cosine_mean,
                            label, self.evaluator.speed())
        self.steps.append(step)
        self.cache[key] = (qm, m, step)
        log.info("fallback %s: %d layer(s) in float: %s=%.6g%s (speed %.2fx)", label, len(key), target.kind, step.value,
                 " (met)" if step.met else "", step.speed or 0.0)
        return step

    def by_groups(self, roles: Mapping[str, str], layers: Sequence[str]) -> set[str] | None:
        """Each role group, then each block alone in float; the best groups added until the target holds."""
        groups: dict[str, list[str]] = {}
        for name, role in roles.items():
            groups.setdefault(f"role {role}", []).append(name)
        for name, block in layer_blocks(layers).items():
            groups.setdefault(f"block {block}", []).append(name)
        groups = {k: v for k, v in groups.items() if 0 < len(v) < len(layers)}
        scored: list[tuple[FallbackStep, str]] = []
        for label, members in groups.items():
            if self.out_of_time():
                break
            step = self.measure(members, label)
            if step is not None:
                scored.append((step, label))
        scored.sort(key=lambda item: (self._score(item[0].value), -len(item[0].layers_in_float)), reverse=True)
        current: set[str] = set()
        for _step, label in scored:
            if self.out_of_time():
                break
            current |= set(groups[label])
            previous = self.steps[-1].label if current != set(groups[label]) else ""
            s = self.measure(sorted(current), " + ".join(x for x in (previous, label) if x))
            if s is not None and s.met:
                return set(current)
        return None

    def bisect(self, chosen: set[str]) -> set[str]:
        """Halves of the float set put back to INT8 while the target still holds."""
        pending = [sorted(chosen)]
        while pending and not self.out_of_time():
            part = pending.pop()
            if len(part) < 2:
                continue
            half = len(part) // 2
            for back in (part[:half], part[half:]):
                trial = chosen - set(back)
                s = self.measure(sorted(trial), f"bisect: {len(back)} back to INT8") if trial else None
                if s is not None and s.met:
                    chosen = trial
                    break
            else:
                pending += [part[:half], part[half:]]
        return chosen

    def by_sensitivity(self, layers: Sequence[str]) -> tuple[set[str] | None, list[dict[str, Any]]]:
        """Single layers ranked by their effect alone in float; the k most sensitive in float."""
        sensitivity: list[dict[str, Any]] = []
        singles: list[tuple[FallbackStep, str]] = []
        for layer in layers:
            if self.out_of_time():
                break
            s = self.measure([layer], f"only {layer}")
            if s is not None:
                singles.append((s, layer))
                sensitivity.append({"layer": layer, "value": s.value, "cosine": s.cosine})
        singles.sort(key=lambda item: self._score(item[0].value), reverse=True)
        ranked = [layer for _, layer in singles]
        for k in range(1, len(ranked)):
            if self.out_of_time():
                break
            s = self.measure(ranked[:k], f"{k} most sensitive")
            if s is not None and s.met:
                return set(ranked[:k]), sensitivity
        return None, sensitivity
