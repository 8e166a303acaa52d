"""The quantize stage's options and inputs: the Q/DQ targets, :class:`QuantizeOptions`, activation
ranges and the points where a Q/DQ pair goes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..errors import UsageError

TARGETS = ("tensorrt", "onnxruntime")
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# ONNX Runtime node units with CPU integer kernels (QLinearConv, QGemm, QLinearMatMul, QLinearAdd, ...).
ORT_UNIT_OPS = WEIGHTED_OPS + ("Add", "Mul", "AveragePool", "GlobalAveragePool")
# Activations ONNX Runtime removes in front of a Q whose zero point is the type minimum.
ORT_FUSED_ACTIVATIONS = ("Relu", "Clip")
MIN_OPSET = 13
_FLOAT = 1  # onnx.TensorProto.FLOAT
_INT8_MAX = 127.0
_INT8_REDUCED_MAX = 64.0  # ONNX Runtime's reduce_range for symmetric int8 weights
CHECK_FULL_BYTES = 64 * 2**20  # insert_qdq: onnx.checker on the whole model below this size


# --------------------------------------------------------------------------------------------
# Options and inputs


@dataclass(frozen=True)
class QuantizeOptions:
    """Where Q/DQ go. ``exclude_nodes`` are node names or regular expressions (full match);
    ``exclude_ops`` op types. Excluded nodes keep float inputs, weights and outputs."""

    target: str = "tensorrt"
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

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise UsageError(f"--target '{self.target}' is not one of {', '.join(TARGETS)}")
        object.__setattr__(self, "exclude_ops", tuple(self.exclude_ops))
        object.__setattr__(self, "exclude_nodes", tuple(self.exclude_nodes))
        if self.reduce_range and self.target != "onnxruntime":
            raise UsageError("--reduce-range is for --target onnxruntime (TensorRT quantizes weights to 8 bits)")
        if not self.outlier_ratio > 1.0:
            raise UsageError(f"outlier ratio {self.outlier_ratio}: expected a number above 1")
        for pattern in self.exclude_nodes:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise UsageError(f"--exclude-node '{pattern}': not a valid regular expression ({exc})") from exc

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


def _as_range(value: RangeLike | Sequence[float]) -> ActivationRange:
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
