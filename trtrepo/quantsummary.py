"""What a quantization shipped and what it cost, in one object: the held-out figures per output
(label accuracy, top-1 agreement overall and on confident samples, the expected top-1 drop, cosine),
the gate's verdict and the FP16 noise floor beside it, the method and the steps chosen, the layers
kept in float and why, and the INT8/FP32 speed ratio on the held-out data.

``trtrepo quantize`` and ``trtrepo deploy`` print :meth:`QuantizeSummary.summary_lines` and put
:meth:`QuantizeSummary.to_dict` under ``accuracy`` in ``--json``. It is built from the quantize
report (:meth:`trtrepo.quantize.QuantizeReport.accuracy_summary`), so the console, the JSON and
``quantize.json`` cannot disagree. The speed ratio is ONNX Runtime on this CPU at the held-out batch size: a hint of
what INT8 buys, not the served latency (``trtrepo validate`` measures that)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class OutputFigures:
    """Held-out figures of one output, INT8 against FP32. Fractions in [0, 1]; None: not applicable."""

    output: str
    samples: int
    cosine_mean: float
    top1_agreement: float | None = None
    confident_agreement: float | None = None
    confident_samples: int | None = None
    fp32_accuracy: float | None = None
    int8_accuracy: float | None = None
    expected_drop_points: float | None = None  # the expected top-1 drop under FP32's softmax

    def line(self) -> str:
        bits = []
        if self.fp32_accuracy is not None and self.int8_accuracy is not None:
            bits.append(f"label accuracy {100 * self.fp32_accuracy:.2f}% -> {100 * self.int8_accuracy:.2f}%")
        if self.top1_agreement is not None:
            bits.append(f"top-1 agreement {100 * self.top1_agreement:.1f}%")
        if self.confident_agreement is not None:
            bits.append(f"{100 * self.confident_agreement:.1f}% on {self.confident_samples} confident")
        if self.expected_drop_points is not None:
            bits.append(f"expected top-1 drop {self.expected_drop_points:.2f} points")
        bits.append(f"cosine {self.cosine_mean:.5f}")
        return f"'{self.output}' ({self.samples} held-out samples): " + ", ".join(bits)


@dataclass(frozen=True)
class QuantizeSummary:
    target: str
    method: str
    shipped: str = "int8"  # int8 | fp32 (deploy fell back) | none (quantize refused to write)
    outputs: tuple[OutputFigures, ...] = ()
    gate: Mapping[str, Any] | None = None  # output, rule, passed, inconclusive, message
    fp16_noise_floor: Mapping[str, Any] | None = None
    steps: Mapping[str, Any] = field(default_factory=dict)  # smooth_quant, weight_rounding, equalization
    kept_float: tuple[Mapping[str, str], ...] = ()  # {"name", "reason"}
    speed: Mapping[str, Any] | None = None  # {"int8_vs_fp32", "batch_size", "engine"}
    held_out: Mapping[str, Any] | None = None  # {"name", "samples"}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outputs"] = {o.output: {k: v for k, v in asdict(o).items() if k != "output"} for o in self.outputs}
        d["kept_float"] = [dict(k) for k in self.kept_float]
        return d

    def summary_lines(self) -> list[str]:
        """Console lines (no leading indent)."""
        lines = self._gate_lines()
        for o in self.outputs:
            lines.append("held-out " + o.line())
        lines += self._noise_floor_lines()
        lines.append("chosen: " + ", ".join(self._chosen_steps()))
        if self.kept_float:
            shown = ", ".join(f"{k['name']} ({k['reason']})" for k in self.kept_float[:5])
            more = f" and {len(self.kept_float) - 5} more (see the report)" if len(self.kept_float) > 5 else ""
            lines.append(f"kept in float: {len(self.kept_float)}: {shown}{more}")
        else:
            lines.append("kept in float: none")
        if self.speed and self.speed.get("int8_vs_fp32") is not None:
            lines.append(f"speed INT8/FP32 on the held-out data: {self.speed['int8_vs_fp32']:.2f}x "
                         f"({self.speed['engine']}, batch {self.speed['batch_size']}; a CPU hint, not the served latency)")
        return lines

    def _gate_lines(self) -> list[str]:
        """The gate's verdict. Decision: an inconclusive gate (too few samples to decide) is not a
        pass; a gate not measured (or no outputs compared) says accuracy was not measured."""
        if self.gate and self.gate.get("measured") is not False and self.gate.get("passed") is not None:
            word = "passed" if self.gate["passed"] else "FAILED"
            if self.gate.get("inconclusive"):  # too few samples to decide: not passed either
                word = "NOT PASSED (too few samples to decide)" if not self.gate["passed"] else word + " (inconclusive)"
            return [f"gate {word}: {self.gate.get('message') or ''}".rstrip()]
        if self.gate is not None or not self.outputs:
            return ["gate: accuracy vs FP32 NOT measured (no held-out data)"]
        return []

    def _noise_floor_lines(self) -> list[str]:
        """The FP16 noise floor on the same samples, when measured."""
        floor = self.fp16_noise_floor or {}
        if floor.get("top1_agreement") is None:
            return []
        conf = (f", {100 * floor['confident_agreement']:.1f}% on the confident ones"
                if floor.get("confident_agreement") is not None else "")
        ed = floor.get("expected_drop")
        drop = (f", expected top-1 drop {ed['estimate']:.2f} points (95% interval {ed['lower']:.2f}-{ed['upper']:.2f})"
                if ed else "")
        return [f"FP16 noise floor on the same samples: top-1 agreement {100 * floor['top1_agreement']:.1f}%{conf}{drop}"]

    def _chosen_steps(self) -> list[str]:
        """The method and the steps it took (smooth-quant alpha, equalization, weight rounding)."""
        steps = [f"method {self.method}"]
        if self.steps.get("smooth_quant") is not None:
            steps.append(f"smooth-quant alpha {self.steps['smooth_quant']}")
        if self.steps.get("equalization"):
            steps.append(f"equalization on {self.steps['equalization']['chains']} chain(s)")
        if self.steps.get("weight_rounding"):
            steps.append(f"weights {self.steps['weight_rounding']}")
        return steps
