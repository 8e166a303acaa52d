"""A detector judged in boxes: a candidate's detections against FP32's as pseudo ground truth.

The reference is what a served FP32 model returns: its detections at Ultralytics' predict
settings (:data:`REFERENCE_CONF` 0.25, IoU 0.7). The candidate (INT8, FP16) is scored the COCO
way: its detections at validation settings (:data:`CANDIDATE_CONF` 0.001), ranked by score, so
that mAP integrates over its ranking instead of counting a box that scores 0.24 instead of 0.26
as missed. mAP50-95 (:func:`~trtrepo.detect.metrics.mean_ap`) is the figure the gate judges;
mAP50 and the box counts at the reference's threshold are information.

The interval: the normal interval over the per-image mAP50-95 of the images that hold reference
boxes (``mean -+ 1.96 sd / sqrt(n)``, centred on the data set's figure). The data set's mAP is
not the mean of the per-image figures (classes pool across images), but its spread over image
samples is what the per-image spread measures; deterministic, no resampling. A verdict like the
classifier's (:class:`trtrepo.evaluate.ExpectedDrop`): pass when the interval's lower end clears the
limit, fail when the figure itself is below it, else the number of images that would decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .decode import Detections, YoloLayout
from .metrics import count_agreement, mean_ap
from .nms import postprocess

REFERENCE_CONF = 0.25  # FP32's boxes at Ultralytics' predict settings are the reference
CANDIDATE_CONF = 0.001  # the candidate's at validation settings: mAP integrates over its ranking (COCO)
IOU = 0.7  # Ultralytics' NMS IoU for both
Z = 1.96
MAX_IMAGES_TO_DECIDE = 10**7


def reference_detections(output: np.ndarray, layout: YoloLayout) -> list[Detections]:
    """FP32's detections, the pseudo ground truth."""
    return postprocess(output, layout, conf=REFERENCE_CONF, iou=IOU)


@dataclass(frozen=True)
class DetectionFigures:
    """mAP50-95 of a candidate's detections against the reference's (``map50_95``, with its 95 %
    interval ``lower``..``upper`` and the spread ``sd`` of the per-image figures over ``decided``
    images that hold reference boxes), ``map50``, the boxes, and the box-count agreement at the
    reference's threshold; ``worst``: (image index, per-image mAP50-95) of the worst images."""

    images: int
    decided: int
    reference_boxes: int
    candidate_boxes: int
    map50_95: float
    map50: float
    lower: float
    upper: float
    sd: float
    count_agreement: float
    worst: tuple[tuple[int, float], ...] = ()

    def verdict(self, limit: float) -> str:
        """``pass`` when the interval's lower end is at or above ``limit``, ``fail`` when the
        figure itself is below it (or nothing could be measured), else ``undecided``."""
        if not self.decided or not math.isfinite(self.map50_95):
            return "fail"
        if self.lower >= limit - 1e-12:
            return "pass"
        return "fail" if self.map50_95 < limit - 1e-12 else "undecided"

    def images_to_decide(self, limit: float) -> int | None:
        """The images (holding reference boxes) at which this figure and spread would pass."""
        gap = self.map50_95 - limit
        if gap <= 0 or not math.isfinite(gap):
            return None
        n = math.ceil((Z * self.sd / gap) ** 2)
        return n if n <= MAX_IMAGES_TO_DECIDE else None

    def describe(self) -> str:
        """``mAP50-95 vs FP32 0.931 (95% interval 0.912-0.950), mAP50 0.975, box counts agree on 88%``."""
        return (f"mAP50-95 vs FP32 {self.map50_95:.3f} (95% interval {self.lower:.3f}-{self.upper:.3f}), mAP50 "
                f"{self.map50:.3f}, box counts agree on {100 * self.count_agreement:.0f}% of {self.images} images "
                f"({self.reference_boxes} FP32 boxes)")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst"] = [list(w) for w in self.worst]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectionFigures:
        values = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        values["worst"] = tuple(tuple(w) for w in d.get("worst", ()))
        return cls(**values)


def detection_figures(reference: Sequence[Detections], candidate_output: np.ndarray, layout: YoloLayout,
                      worst: int = 5) -> DetectionFigures:
    """The candidate's raw head output judged against the reference detections (see the module doc)."""
    candidate = postprocess(candidate_output, layout, conf=CANDIDATE_CONF, iou=IOU)
    at_reference = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in candidate]
    return compare_detections(reference, candidate, at_reference, worst)


def compare_detections(reference: Sequence[Detections], candidate: Sequence[Detections],
                       counted: Sequence[Detections] | None = None, worst: int = 5) -> DetectionFigures:
    """Detections judged against the reference detections, image by image: mAP of ``candidate``,
    its interval (module doc), and the box counts of ``counted`` (the candidate's boxes at the
    reference's threshold; default ``candidate`` itself, for detections postprocessed with the
    reference's settings, e.g. a served detector's)."""
    at_reference = list(candidate if counted is None else counted)
    result = mean_ap(candidate, reference)
    per_image = np.asarray(result.per_image, np.float64)
    valid = np.flatnonzero(np.isfinite(per_image))
    n = len(valid)
    sd = float(np.std(per_image[valid], ddof=1)) if n > 1 else 0.0
    half = Z * sd / math.sqrt(n) if n else 1.0
    m = float(result.map50_95) if n else float("nan")
    order = valid[np.argsort(per_image[valid], kind="stable")][:worst]
    return DetectionFigures(
        images=len(reference), decided=n, reference_boxes=int(sum(len(d) for d in reference)),
        candidate_boxes=int(sum(len(d) for d in at_reference)), map50_95=m, map50=float(result.map50),
        lower=max(0.0, m - half) if n else 0.0, upper=min(1.0, m + half) if n else 1.0, sd=sd,
        count_agreement=count_agreement(at_reference, reference),
        worst=tuple((int(i), float(per_image[i])) for i in order))
