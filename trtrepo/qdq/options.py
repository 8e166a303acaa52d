"""The quantize stage's options and inputs: the Q/DQ targets (:class:`QdqTarget`, the registry
:data:`QDQ_TARGETS`), :class:`QuantizeOptions`, activation ranges and the points where a Q/DQ pair
goes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import OptionError, UsageError
from ..plugins import QDQ_TARGETS as _GROUP
from ..plugins import Registry

WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ONNX Runtime node units with CPU integer kernels (QLinearConv, QGemm, QLinearMatMul, QLinearAdd, ...).
ORT_UNIT_OPS = WEIGHTED_OPS + ("Add", "Mul", "AveragePool", "GlobalAveragePool")
# Activations ONNX Runtime removes in front of a Q whose zero point is the type minimum.
ORT_FUSED_ACTIVATIONS = ("Relu", "Clip")
MIN_OPSET = 13
INT8_MAX = 127.0
INT8_REDUCED_MAX = 64.0  # ONNX Runtime's reduce_range for symmetric int8 weights
CHECK_FULL_BYTES = 64 * 2**20  # insert_qdq: onnx.checker on the whole model below this size


# --------------------------------------------------------------------------------------------
# Q/DQ targets


ACTIVATION_SCHEMES = ("symmetric", "asymmetric")
WEIGHT_FORMS = ("qdq", "int8")


@dataclass(frozen=True)
class QdqTarget:
    """A runtime a Q/DQ model is placed for (``--target``): everything ``qdq``, ``quantize``,
    ``weightsteps`` and ``deploy`` decide by target is read from here.

    * ``rules``: the placement rules (``rule(view, node, options) -> [QuantPoint]``, see
      :mod:`trtrepo.qdq.rules`), applied to every node that is not excluded;
    * ``activations``: ``symmetric`` (int8, ``scale = amax / 127``, zero point 0) or ``asymmetric``
      (uint8 over the measured ``[lo, hi]`` clipped to ``amax``);
    * ``weights``: ``qdq`` (FP32 weights behind Q -> DQ: the runtime quantizes them at build time)
      or ``int8`` (int8 initializers behind a DQ);
    * ``integer_kernels``: the runtime executes integer kernels (QLinearConv, QLinearAdd, ...),
      which differ from the Q/DQ graph run in float: the report counts them and AdaRound fits
      each layer on its locally fake-quantized FP32 input; False: the float simulation is what
      the runtime computes, and AdaRound takes inputs from the Q/DQ network (sequential);
    * ``small_conv_float``: a dense Conv with a reduction below ``ort_min_reduction`` stays float;
    * ``transformer_safe``: ``QuantizeOptions.transformer_safe`` applies (residual-stream Adds and
      gating products float, float MatMul outputs);
    * ``reduce_range``: 7-bit weights (``--reduce-range``) are possible;
    * ``check``: further option checks, raising :class:`~trtrepo.errors.UsageError`;
    * ``label``: how messages name the runtime; ``help``: one line for ``--target``.

    Its name is the name of the backend whose INT8 model it places (``BackendSpec.quantize_target``)."""

    name: str
    rules: tuple[Callable[..., list[Any]], ...]
    activations: str = "symmetric"
    weights: str = "qdq"
    integer_kernels: bool = False
    small_conv_float: bool = False
    transformer_safe: bool = False
    reduce_range: bool = False
    check: Callable[[Any], None] | None = field(default=None, compare=False)
    label: str = ""
    help: str = ""

    def __post_init__(self) -> None:
        if self.activations not in ACTIVATION_SCHEMES:
            raise ValueError(f"Q/DQ target '{self.name}': activations {self.activations!r}, one of {ACTIVATION_SCHEMES}")
        if self.weights not in WEIGHT_FORMS:
            raise ValueError(f"Q/DQ target '{self.name}': weights {self.weights!r}, one of {WEIGHT_FORMS}")
        if not self.rules:
            raise ValueError(f"Q/DQ target '{self.name}': no placement rules")

    @property
    def display(self) -> str:
        return self.label or self.name


# The registry: tensorrt and onnxruntime (registered with their rules in rules.py), then the
# ``trtrepo.qdq_targets`` entry points (trtrepo.plugins).
QDQ_TARGETS: Registry[QdqTarget] = Registry(_GROUP, "Q/DQ target", QdqTarget, lambda t: t.name)


def register_target(target: QdqTarget) -> QdqTarget:
    return QDQ_TARGETS.register(target)


def target_names() -> tuple[str, ...]:
    """The registered targets' names: the ``--target`` choices."""
    return tuple(QDQ_TARGETS)


def qdq_target(name: str) -> QdqTarget:
    """The registered target ``name``; a :class:`UsageError` naming the choices otherwise. The one
    name lookup: the CLI's ``--target`` and the backend's ``quantize_target`` come here once, and
    the library passes the record on (``QuantizeOptions.target``)."""
    target = QDQ_TARGETS.get(name)
    if target is None:
        raise OptionError("target", f"'{name}' is not one of {', '.join(QDQ_TARGETS)}", concept="the Q/DQ target")
    return target


def backend_target(spec: Any) -> QdqTarget:
    """The target a backend's INT8 model is placed for (``BackendSpec.quantize_target``, a name a
    plug-in backend may give for a target that is not registered: refused here)."""
    return qdq_target(spec.quantize_target)


def default_target() -> QdqTarget:
    """``QuantizeOptions.target`` when none is given: TensorRT's placement."""
    return qdq_target("tensorrt")


# --------------------------------------------------------------------------------------------
# Options and inputs


@dataclass(frozen=True)
class QuantizeOptions:
    """Where Q/DQ go: for ``target`` (the :class:`QdqTarget` record; a registered name is accepted
    from scripts and turned into its record here, once). ``exclude_nodes`` are node names or
    regular expressions (full match); ``exclude_ops`` op types. Excluded nodes keep float inputs,
    weights and outputs."""

    target: QdqTarget = field(default_factory=default_target)
    exclude_ops: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    per_channel: bool = True
    # onnxruntime target: a Conv whose reduction (Cin/group * kernel size) is below this stays
    # float (see keep_float_small_conv); 0 disables.
    ort_min_reduction: int = 16
    # Transformer-aware exclusions (see find_float_nodes): quantize the activation-activation
    # MatMuls of attention (Q.K^T, P.V) too; a range larger than ``outlier_ratio`` times the
    # median range (and above OUTLIER_FLOOR) marks a tensor unquantizable (an additive mask).
    quantize_attention: bool = False
    outlier_ratio: float = 1000.0
    # onnxruntime target: 7-bit weights ([-64, 64], ONNX Runtime's ``reduce_range``) so that U8S8
    # kernels cannot saturate on x86 CPUs without VNNI even where the session option that avoids it
    # (trtrepo.cpu.X64_QUANT_PRECISION) cannot be set, e.g. Triton's onnxruntime backend.
    reduce_range: bool = False
    # onnxruntime target, transformer-safe placement (see find_float_nodes): residual-stream Adds
    # (activation + activation Adds in front of a LayerNorm) and gating products inside activation
    # functions (GELU's x * (1 + erf), SiLU's x * sigmoid) stay float, and a MatMul/Gemm whose output
    # feeds no quantized unit keeps a float output (ONNX Runtime's MatMulIntegerToFloat) instead of
    # being requantized. False restores full node units everywhere.
    transformer_safe: bool = True
    # Both targets: the decode head of a YOLO-style detector stays float (trtrepo.qdq.detector);
    # True quantizes it too, with Q/DQ on the box/score concat's output although it is a graph output
    # (the naive placement, measured in docs/benchmarks.md "Issue 43").
    quantize_detector_head: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.target, str):
            object.__setattr__(self, "target", qdq_target(self.target))
        target = self.target
        object.__setattr__(self, "exclude_ops", tuple(self.exclude_ops))
        object.__setattr__(self, "exclude_nodes", tuple(self.exclude_nodes))
        if self.reduce_range and not target.reduce_range:  # the one reduce-range check (quantize and deploy)
            able = " or ".join(t.display for t in QDQ_TARGETS.values() if t.reduce_range)
            raise OptionError("reduce_range", f"is for the {able} target ({target.display} quantizes weights to 8 "
                              "bits)", concept="7-bit weights (reduce range)")
        if target.check is not None:
            target.check(self)
        if not self.outlier_ratio > 1.0:
            raise UsageError(f"outlier ratio {self.outlier_ratio}: expected a number above 1")
        for pattern in self.exclude_nodes:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise OptionError("exclude_nodes", f"'{pattern}': not a valid regular expression ({exc})",
                                  concept="the node pattern") from exc

    def with_excluded_nodes(self, names: Iterable[str]) -> QuantizeOptions:
        """A copy that also excludes the given exact node names."""
        extra = tuple(re.escape(n) for n in names)
        return replace(self, exclude_nodes=self.exclude_nodes + extra)

    def excludes(self, node_name: str, op_type: str) -> bool:
        if op_type in self.exclude_ops:
            return True
        return any(node_name == p or re.fullmatch(p, node_name) for p in self.exclude_nodes)


@dataclass(frozen=True)
class ActivationRange:
    """Calibrated range of one activation: ``amax`` (the method's |x| threshold) and, when
    measured, the signed ``lo``/``hi`` (min and max seen). The onnxruntime target quantizes
    over ``[max(lo, -amax), min(hi, amax)]``; the tensorrt target uses ``amax`` only."""

    amax: float
    lo: float | None = None
    hi: float | None = None


RangeLike = float | ActivationRange


def as_range(value: RangeLike | Sequence[float]) -> ActivationRange:
    if isinstance(value, ActivationRange):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
        return ActivationRange(max(abs(lo), abs(hi)), lo, hi)
    return ActivationRange(float(value))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Graph view and placement rules


@dataclass(frozen=True)
class QuantPoint:
    """One tensor to quantize for one consumer.

    ``consumer`` is the node name reading the tensor at ``input_index``; ``None`` (onnxruntime
    output Q) means every consumer that is not excluded. ``kind`` is ``activation``, ``weight``
    or ``bias``; ``axis`` the per-channel axis of a weight; ``node`` the node whose rule placed
    the point (the layer to exclude to undo it)."""

    tensor: str
    consumer: str | None
    input_index: int | None
    kind: str
    rule: str
    axis: int | None = None
    node: str = ""  # the node whose rule placed it (the "layer" excluded to undo it)
