"""The held-out accuracy gate against FP32 (:class:`AccuracyCheck`): the rule per output kind,
the verdict with its sample count and interval, and the FP16 noise floor beside it."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import TrtrepoError
from ..evaluate import (
    OutputMetrics,
    wilson_interval,
)
from ..fp16 import convert_to_fp16
from .select import MAX_TOP1_DROP_POINTS, MIN_COSINE, Evaluator

log = logging.getLogger(__name__)
MIN_CONFIDENT_AGREEMENT = 0.99  # without labels: top-1 agreement on the confident samples


@dataclass(frozen=True)
class AccuracyCheck:
    """The check every quantize/deploy run ends with, on ``output`` (default: every output).

    One rule per kind of output, the first that applies:

    * **labels** (the held-out data has labels): the label accuracy may drop by at most
      ``max_top1_drop`` points (the user's metric, measured directly);
    * **classifier without labels**: top-1 agreement with FP32 on the *confident* samples
      (FP32's top-1/top-2 probability margin >= :data:`trtrepo.evaluate.CONFIDENT_MARGIN`) at
      least ``min_confident_agreement``. Overall agreement is reported beside it, not gated: on
      near-ties (a fifth of natural-image crops for an ImageNet model) any change of the
      arithmetic, FP16 included, flips the top-1, so "agreement >= 99 %" over all samples would
      refuse every INT8 model however good;
    * **no classes** (an embedding): mean cosine at least ``min_cosine``.

    Each verdict carries its sample count and a 95 % Wilson interval; a failure that the
    interval cannot separate from the limit (too few samples) is marked ``inconclusive`` and
    still fails (no silent loss), with the number of samples that would decide it."""

    max_top1_drop: float = MAX_TOP1_DROP_POINTS
    min_confident_agreement: float = MIN_CONFIDENT_AGREEMENT
    min_cosine: float = MIN_COSINE

    def judge(self, m: OutputMetrics) -> dict[str, Any]:
        """The verdict on one output: rule, value, limit, ok, samples, interval, message."""

        v: dict[str, Any] = {"output": m.name, "samples": m.samples, "overall_top1_agreement": m.top1_agreement,
                             "inconclusive": False}
        if m.accuracy_drop_points is not None:
            drop = m.accuracy_drop_points
            per_sample = 100.0 / max(m.samples, 1)
            v.update(rule="label accuracy drop", value=drop, limit=self.max_top1_drop, ok=drop <= self.max_top1_drop + 1e-9,
                     reference_accuracy=m.reference_accuracy, candidate_accuracy=m.candidate_accuracy,
                     points_per_sample=per_sample)
            v["message"] = (f"output '{m.name}': label accuracy {100 * m.candidate_accuracy:.2f}% vs FP32 "  # type: ignore[operator]
                            f"{100 * m.reference_accuracy:.2f}% (drop {drop:.2f} points, limit {self.max_top1_drop:g}; "  # type: ignore[operator]
                            f"{m.samples} samples)")
            if not v["ok"] and drop <= 2 * per_sample + 1e-9:
                v["inconclusive"] = True
                need = int(math.ceil(200.0 / max(self.max_top1_drop, 1e-9)))
                v["message"] += (f"; one sample is {per_sample:.2f} points: too few samples to decide, give an "
                                 f"evaluation set of >= {need} labelled samples")
            return v
        if m.confident_agreement is not None and m.confident_samples:
            n = m.confident_samples
            flips = int(round((1.0 - m.confident_agreement) * n))
            lo, hi = wilson_interval(n - flips, n)
            v.update(rule="confident top-1 agreement", value=m.confident_agreement, limit=self.min_confident_agreement,
                     ok=m.confident_agreement >= self.min_confident_agreement - 1e-12, confident_samples=n,
                     interval=[lo, hi])
            overall = "" if m.top1_agreement is None else f"; all {m.samples}: {100 * m.top1_agreement:.1f}%"
            v["message"] = (f"output '{m.name}': top-1 agreement {100 * m.confident_agreement:.1f}% on the {n} confident "
                            f"samples (limit {100 * self.min_confident_agreement:g}%, 95% interval "
                            f"{100 * lo:.1f}-{100 * hi:.1f}%){overall}")
            if not v["ok"] and hi >= self.min_confident_agreement:
                v["inconclusive"] = True
                v["message"] += f"; {flips} flip(s) in {n}: too few confident samples to decide, give more evaluation data"
            elif v["ok"] and lo < self.min_confident_agreement:
                # passed on its point estimate; the sample cannot exclude a model below the limit
                v["inconclusive"] = True
                v["message"] += (f"; passed on {n} samples, whose interval reaches below the limit: about "
                                 f"{_samples_to_settle(self.min_confident_agreement)} confident samples settle it "
                                 "(give more evaluation data)")
            return v
        if m.top1_agreement is not None:  # a classifier with no confident sample: nothing decides top-1
            v["note"] = "no held-out sample has a confident FP32 top-1: judged on cosine"
        v.update(rule="mean cosine", value=m.cosine_mean, limit=self.min_cosine, ok=m.cosine_mean >= self.min_cosine)
        v["message"] = f"output '{m.name}': mean cosine vs FP32 {m.cosine_mean:.4f} (limit {self.min_cosine:g}; {m.samples} samples)"
        return v

    def failures(self, metrics: Mapping[str, OutputMetrics], output: str | None = None) -> list[str]:
        names = [output] if output else list(metrics)
        return [v["message"] for v in (self.judge(metrics[n]) for n in names) if not v["ok"]]


def _samples_to_settle(limit: float) -> int:
    """The fewest samples whose 95 % Wilson interval with no flip lies above ``limit``."""

    n = 1
    while wilson_interval(n, n)[0] < limit and n < 10**6:
        n = int(n * 1.1) + 1
    return n


class AccuracyLoss(TrtrepoError):
    """The held-out check against FP32 failed and the loss was not accepted (exit code 1)."""


def _fp16_floor(model: Any, evaluator: Evaluator, output: str) -> dict[str, Any] | None:
    """The FP32 model cast to FP16 on the same held-out samples: the agreement that a change of
    arithmetic alone costs (the noise floor beside INT8's figures)."""

    try:
        m = evaluator(convert_to_fp16(model))[output]
    except Exception as exc:  # the floor is information, not a requirement
        log.info("FP16 noise floor not measured: %s", exc)
        return None
    return {"top1_agreement": m.top1_agreement, "confident_agreement": m.confident_agreement,
            "confident_samples": m.confident_samples, "cosine_mean": m.cosine_mean}
