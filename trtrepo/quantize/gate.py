"""The held-out accuracy gate against FP32 (:class:`AccuracyCheck`): the rule per output kind
(labels: the label accuracy drop; a classifier without labels: the expected top-1 drop under
FP32's softmax; an embedding: the mean cosine), the verdict (pass, fail, or cannot decide on
these samples, which does not pass) with its sample count and interval, and the FP16 noise
floor beside it."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..detect import DetectionFigures, LabelFigures
from ..errors import TrtrepoError
from ..evaluate import ExpectedDrop, OutputMetrics
from ..fp16 import convert_to_fp16
from .select import MAX_TOP1_DROP_POINTS, MIN_COSINE, Evaluator

log = logging.getLogger(__name__)
EXPECTED_DROP_RULE = "expected top-1 drop"
DETECTION_RULE = "detection mAP50-95 vs FP32"
LABELLED_DETECTION_RULE = "detection mAP50-95 drop vs labels"
# The detection limit: the FP16 copy of the trained YOLO11n keeps mAP50-95 0.999 against FP32 on 320
# held-out crops (docs/benchmarks.md, "Issue 43"); the limit leaves INT8 a margin of 10 points below it.
MIN_MAP = 0.90
# With labels: the mAP50-95 drop in points, the same points as the classifier's top-1 drop (the FP16
# copy's drop is printed beside it). Published INT8 recipes for YOLO report drops of about this size
# (NNCF's YOLOv8n with the head kept float: about 1 point), so a recipe at that level sits at the edge.
MAX_MAP_DROP = 1.0


@dataclass(frozen=True)
class AccuracyCheck:
    """The check every quantize/deploy run ends with, on ``output`` (default: every output).

    One rule per kind of output, the first that applies:

    * **labels** (the held-out data has labels): the label accuracy may drop by at most
      ``max_top1_drop`` points (the user's metric, measured directly); the expected drop below is
      printed beside it;
    * **classifier without labels**: the *expected* top-1 drop under FP32's own softmax
      (:func:`trtrepo.evaluate.expected_top1_drop`: per sample, FP32's probability of its top-1
      minus its probability of INT8's top-1) against the same ``max_top1_drop`` points. It
      *passes* when the upper end of its 95 % interval is under the limit, *fails* when the
      estimate itself is over it, and otherwise *cannot decide* on these samples: it says how
      many would decide (:meth:`~trtrepo.evaluate.ExpectedDrop.samples_to_decide`) and, like
      any failure, does not pass (``inconclusive``, no silent loss). A flip between near-tied
      classes costs ~0 (on near-ties any change of arithmetic, FP16 included, flips the top-1),
      a flip away from a confident class ~1; if FP32 is calibrated the estimate is the label
      accuracy drop. The top-1 agreement on all samples and on the confident ones
      (:func:`trtrepo.evaluate.confident_mask`) is printed as information: on a small hold-out
      it cannot tell a good model from one 10 points worse (docs/quantization.md, "Defaults
      that hold on trained models");
    * **a detector's output with labelled images** (``--labels``: COCO JSON or YOLO txt boxes,
      :mod:`trtrepo.boxlabels`): the mAP50-95 drop against the labels, FP32's minus INT8's on the
      same images, at most ``max_map_drop`` points (the user's metric, measured directly):
      *passes* when the upper end of its paired 95 % interval is at or under the limit, *fails*
      when the drop itself is over it, else cannot decide, with the number of labelled images that
      would (:class:`trtrepo.detect.LabelFigures`); the figure against FP32 is printed beside it;
    * **a detector's output** (its decode head found in the graph, :mod:`trtrepo.qdq.detector`):
      mAP50-95 of its detections against FP32's as pseudo ground truth
      (:class:`trtrepo.detect.DetectionFigures`) at least ``min_map``: *passes* when the lower end
      of its 95 % interval over the images is at or above the limit, *fails* when the figure is
      below it, else cannot decide, with the number of images that would;
    * **no classes** (an embedding): mean cosine at least ``min_cosine``.

    Each verdict carries its sample count; a failure of the label rule that one or two samples
    make is marked ``inconclusive`` and still fails, with the number of samples that would
    decide it."""

    max_top1_drop: float = MAX_TOP1_DROP_POINTS
    min_cosine: float = MIN_COSINE
    min_map: float = MIN_MAP
    max_map_drop: float = MAX_MAP_DROP

    def judge(self, m: OutputMetrics) -> dict[str, Any]:
        """The verdict on one output: rule, value, limit, ok, inconclusive, samples, message."""

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
            if m.expected_drop is not None and m.expected_drop.samples:
                v["expected_drop"] = _points(m.expected_drop)
                v["message"] += f"; {m.expected_drop.describe()} under FP32's softmax"
                lo, hi = (100 * x for x in m.expected_drop.label_interval())
                v["expected_drop"]["label_interval"] = [lo, hi]
                v["estimate_holds"] = lo - 1e-9 <= drop <= hi + 1e-9
                if not v["estimate_holds"]:
                    v["message"] += (f"; the labels disagree with that estimate (a calibrated FP32 predicts a label drop "
                                     f"of {lo:.2f} to {hi:.2f} points here): FP32's probabilities look miscalibrated "
                                     "on this data, so the label-free gate would mislead without labels")
            if not v["ok"] and drop <= 2 * per_sample + 1e-9:
                v["inconclusive"] = True
                need = int(math.ceil(200.0 / max(self.max_top1_drop, 1e-9)))
                v["message"] += (f"; one sample is {per_sample:.2f} points: too few samples to decide, give an "
                                 f"evaluation set of >= {need} labelled samples")
            return v
        if m.detection is not None:
            return self._judge_detection(m, m.detection, v)
        ed = m.expected_drop
        if ed is not None and ed.samples:
            return self._judge_expected_drop(m, ed, v)
        v.update(rule="mean cosine", value=m.cosine_mean, limit=self.min_cosine, ok=m.cosine_mean >= self.min_cosine)
        v["message"] = f"output '{m.name}': mean cosine vs FP32 {m.cosine_mean:.4f} (limit {self.min_cosine:g}; {m.samples} samples)"
        return v

    def _judge_expected_drop(self, m: OutputMetrics, ed: ExpectedDrop, v: dict[str, Any]) -> dict[str, Any]:
        verdict = ed.verdict(self.max_top1_drop)
        figures = _points(ed)
        v.update(rule=EXPECTED_DROP_RULE, value=figures["estimate"], limit=self.max_top1_drop, ok=verdict == "pass",
                 inconclusive=verdict == "undecided", interval=[figures["lower"], figures["upper"]],
                 expected_drop=figures, confident_samples=m.confident_samples,
                 confident_agreement=m.confident_agreement)
        agreement = [] if m.top1_agreement is None else [f"{100 * m.top1_agreement:.1f}% on all"]
        if m.confident_agreement is not None:
            agreement.append(f"{100 * m.confident_agreement:.1f}% on the {m.confident_samples} confident")
        info = f"; top-1 agreement {', '.join(agreement)}" if agreement else ""
        v["message"] = (f"output '{m.name}': {ed.describe()} under FP32's softmax (limit {self.max_top1_drop:g}; "
                        f"{ed.samples} samples{info})")
        if verdict == "undecided":
            _cannot_decide(v, ed.samples_to_decide(self.max_top1_drop), f"{ed.samples} samples", "evaluation data",
                           ": the estimate is at the limit")
        return v

    def _judge_labelled(self, m: OutputMetrics, d: DetectionFigures, lab: LabelFigures,
                        v: dict[str, Any]) -> dict[str, Any]:
        verdict = lab.verdict(self.max_map_drop)
        v.update(rule=LABELLED_DETECTION_RULE, value=lab.drop, limit=self.max_map_drop, ok=verdict == "pass",
                 inconclusive=verdict == "undecided", interval=[lab.lower, lab.upper], detection=d.to_dict(),
                 samples=lab.images)
        unit = "point" if self.max_map_drop == 1 else "points"
        v["message"] = (f"output '{m.name}': {lab.describe()} (limit {self.max_map_drop:g} {unit}); against FP32's "
                        f"detections: mAP50-95 {d.map50_95:.3f} (95% interval {d.lower:.3f}-{d.upper:.3f})")
        if verdict == "undecided":
            _cannot_decide(v, lab.images_to_decide(self.max_map_drop), f"{lab.decided} labelled images",
                           "labelled evaluation data")
        return v

    def _judge_detection(self, m: OutputMetrics, d: DetectionFigures, v: dict[str, Any]) -> dict[str, Any]:
        if d.labels is not None:
            return self._judge_labelled(m, d, d.labels, v)
        verdict = d.verdict(self.min_map)
        v.update(rule=DETECTION_RULE, value=d.map50_95, limit=self.min_map, ok=verdict == "pass",
                 inconclusive=verdict == "undecided", interval=[d.lower, d.upper], detection=d.to_dict(),
                 samples=d.images)
        v["message"] = (f"output '{m.name}': {d.describe()} (limit {self.min_map:g}; {d.decided} of {d.images} "
                        "images hold FP32 boxes)")
        if verdict == "undecided":
            _cannot_decide(v, d.images_to_decide(self.min_map), f"{d.decided} images", "evaluation data")
        return v

    def failures(self, metrics: Mapping[str, OutputMetrics], output: str | None = None) -> list[str]:
        names = [output] if output else list(metrics)
        return [v["message"] for v in (self.judge(metrics[n]) for n in names) if not v["ok"]]


def _cannot_decide(v: dict[str, Any], need: int | None, on: str, more: str, at_limit: str = "") -> None:
    """An undecided verdict's ``samples_to_decide`` and the end of its message."""
    v["samples_to_decide"] = need
    v["message"] += (f"; cannot decide on {on}: about {need} would decide (give more {more})" if need is not None
                     else f"; cannot decide on {on}{at_limit}")


def _points(ed: ExpectedDrop) -> dict[str, Any]:
    """The verdict's figures of an expected drop, in points."""
    return {"estimate": 100 * ed.estimate, "lower": 100 * ed.lower, "upper": 100 * ed.upper,
            "samples": ed.samples, "changed": ed.changed, "unseen_flip_cost": ed.flip_cost, "label_sd": 100 * ed.label_sd}


class AccuracyLoss(TrtrepoError):
    """The held-out check against FP32 failed and the loss was not accepted (exit code 1)."""


def fp16_floor(model: Any, evaluator: Evaluator, output: str) -> dict[str, Any] | None:
    """The FP32 model cast to FP16 on the same held-out samples: the agreement and the expected
    top-1 drop that a change of arithmetic alone costs (the noise floor beside INT8's figures)."""

    try:
        m = evaluator(convert_to_fp16(model))[output]
    except Exception as exc:  # the floor is information, not a requirement
        log.info("FP16 noise floor not measured: %s", exc)
        return None
    if m.detection is not None:
        return {"detection": m.detection.to_dict()}
    return {"top1_agreement": m.top1_agreement, "confident_agreement": m.confident_agreement,
            "confident_samples": m.confident_samples, "cosine_mean": m.cosine_mean,
            "expected_drop": None if m.expected_drop is None else _points(m.expected_drop)}


def with_fp16_floor(verdict: dict[str, Any], floor: Mapping[str, Any] | None) -> dict[str, Any]:
    """``verdict`` with the FP16 copy's figures (:func:`fp16_floor`) under ``fp16_noise_floor``
    and its expected drop printed beside INT8's in the message."""

    verdict["fp16_noise_floor"] = floor
    det = (floor or {}).get("detection")
    lab = (det or {}).get("labels")
    if lab is not None and verdict.get("message") and verdict.get("rule") == LABELLED_DETECTION_RULE:
        verdict["message"] += (f"; the FP16 copy on the same images: drop vs labels {lab['drop']:.2f} points (95% "
                               f"interval {lab['lower']:.2f} to {lab['upper']:.2f})")
    elif det is not None and verdict.get("message"):
        verdict["message"] += (f"; the FP16 copy on the same images: mAP50-95 vs FP32 {det['map50_95']:.3f} (95% interval "
                               f"{det['lower']:.3f}-{det['upper']:.3f})")
    ed = (floor or {}).get("expected_drop")
    if ed is not None and verdict.get("message"):
        verdict["message"] += (f"; the FP16 copy on the same samples: expected top-1 drop {ed['estimate']:.2f} points "
                               f"(95% interval {ed['lower']:.2f}-{ed['upper']:.2f})")
    return verdict
