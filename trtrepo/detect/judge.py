"""A detector judged in boxes: a candidate's detections against FP32's as pseudo ground truth.

The reference is what a served FP32 model returns: its detections at Ultralytics' predict
settings (:data:`REFERENCE_CONF` 0.25, IoU 0.7). The candidate (INT8, FP16) is scored the COCO
way: its detections at validation settings (:data:`CANDIDATE_CONF` 0.001), ranked by score, so
that mAP integrates over its ranking instead of counting a box that scores 0.24 instead of 0.26
as missed. mAP50-95 (:func:`~trtrepo.detect.metrics.mean_ap`) is the figure the gate judges;
mAP50 and the box counts at the reference's threshold are information.

Beside it, as information: the same mAP with FP32's *borderline* boxes (scores in
:data:`BORDERLINE_CONF` 0.10 .. 0.25) as ignore regions (:func:`~trtrepo.detect.metrics.mean_ap`'s
``ignore``): a candidate box on one of them counts neither way. Decision: a box FP32 scores 0.24
is not in the reference, so the candidate's 0.26 on it is a false positive that ranks above real
finds; over crops of a few photographs one borderline object recurs in dozens of crops, and a class
with one reference box then reads AP 0.1 for a shift of a hair in score. On the trained YOLO11n
(docs/benchmarks.md, "Issue 43") the deployed INT8 reads 0.756 strict and 0.949 with them
ignored, FP16 0.999 both ways, NNCF's defaults 0.663 and 0.766:
real damage still shows. The verdict stays on the strict figure.

The interval: the 2.5 and 97.5 percentiles of the data set's mAP50-95 over :data:`RESAMPLES`
bootstrap samples of the images (:func:`~trtrepo.detect.metrics.bootstrap_map`, seeded:
deterministic). Decision: mAP averages over classes, and a class with one FP32 box in the whole
hold-out weighs as much as one with hundreds, so the figure moves far more from one sample of
images to another than the spread of per-image figures says (an earlier interval from that
spread, ``mean -+ 1.96 sd / sqrt(n)``, was too narrow: the gate passed a detector whose mAP on
other photographs was 17 points lower; docs/benchmarks.md). Images are resampled as units, so
crops of one photograph still count as independent: the interval is a lower bound on the
uncertainty when the hold-out holds few photographs. A verdict like the classifier's
(:class:`trtrepo.evaluate.ExpectedDrop`): pass when the interval's lower end clears the limit,
fail when the figure itself is below it, else the number of images that would decide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .decode import Detections, YoloLayout
from .metrics import count_agreement, mean_ap, mean_ap_with_bootstrap
from .nms import postprocess

REFERENCE_CONF = 0.25  # FP32's boxes at Ultralytics' predict settings are the reference
BORDERLINE_CONF = 0.10  # FP32's boxes from here to REFERENCE_CONF: ignore regions for the second figure
CANDIDATE_CONF = 0.001  # the candidate's at validation settings: mAP integrates over its ranking (COCO)
IOU = 0.7  # Ultralytics' NMS IoU for both
Z = 1.96
RESAMPLES = 400
THIN_CLASS_BOXES = 3  # a class this thin moves mAP as much as a class of hundreds of boxes
MAX_IMAGES_TO_DECIDE = 10**7


def reference_detections(output: np.ndarray, layout: YoloLayout) -> list[Detections]:
    """FP32's detections, the pseudo ground truth."""
    return postprocess(output, layout, conf=REFERENCE_CONF, iou=IOU)


def borderline_detections(output: np.ndarray, layout: YoloLayout) -> list[Detections]:
    """FP32's boxes scoring above :data:`BORDERLINE_CONF` and at most :data:`REFERENCE_CONF`
    (after NMS at the lower threshold): the ignore regions of the second figure."""
    return [d.take(np.flatnonzero(d.scores <= REFERENCE_CONF))
            for d in postprocess(output, layout, conf=BORDERLINE_CONF, iou=IOU)]


@dataclass(frozen=True)
class DetectionFigures:
    """mAP50-95 of a candidate's detections against the reference's (``map50_95``, with its 95 %
    bootstrap interval ``lower``..``upper``; ``sd``: the bootstrap spread scaled to one image,
    ``sd_boot * sqrt(decided)``, over the ``decided`` images that hold reference boxes), ``map50``, the boxes, and the box-count agreement at the
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
    classes: int = 0  # classes among the reference boxes: each weighs the same in mAP
    thin_classes: int = 0  # of those, the classes with at most THIN_CLASS_BOXES reference boxes
    map_borderline_ignored: float = math.nan  # mAP50-95 with FP32's borderline boxes ignored (module doc)

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
                f"({self.reference_boxes} FP32 boxes{f' in {self.classes} classes' if self.classes else ''})"
                + (f"; {self.map_borderline_ignored:.3f} with FP32's {BORDERLINE_CONF:.2f}-{REFERENCE_CONF:.2f} boxes ignored"
                   if math.isfinite(self.map_borderline_ignored) else "")
                + (f"; {self.thin_classes} of the {self.classes} classes hold {THIN_CLASS_BOXES} boxes or fewer and weigh "
                   "as much as the largest: held-out images of other scenes judge more surely"
                   if self.classes and 2 * self.thin_classes > self.classes else ""))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["worst"] = [list(w) for w in self.worst]
        d["map_borderline_ignored"] = self.map_borderline_ignored if math.isfinite(self.map_borderline_ignored) else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectionFigures:
        values = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        values["worst"] = tuple(tuple(w) for w in d.get("worst", ()))
        if values.get("map_borderline_ignored") is None:
            values.pop("map_borderline_ignored", None)
        return cls(**values)


def detection_figures(reference: Sequence[Detections], candidate_output: np.ndarray, layout: YoloLayout,
                      worst: int = 5, borderline: Sequence[Detections] | None = None) -> DetectionFigures:
    """The candidate's raw head output judged against the reference detections (see the module
    doc); with ``borderline`` (:func:`borderline_detections`), the second figure too."""
    candidate = postprocess(candidate_output, layout, conf=CANDIDATE_CONF, iou=IOU)
    at_reference = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in candidate]
    return compare_detections(reference, candidate, at_reference, worst, borderline)


def _thin_classes(reference: Sequence[Detections]) -> int:
    """The classes with at most :data:`THIN_CLASS_BOXES` reference boxes."""
    labels = [np.asarray(d.classes, np.int64) for d in reference]
    classes = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    _, counts = np.unique(classes, return_counts=True)
    return int(np.sum(counts <= THIN_CLASS_BOXES))


def compare_detections(reference: Sequence[Detections], candidate: Sequence[Detections],
                       counted: Sequence[Detections] | None = None, worst: int = 5,
                       borderline: Sequence[Detections] | None = None) -> DetectionFigures:
    """Detections judged against the reference detections, image by image: mAP of ``candidate``,
    its interval (module doc), and the box counts of ``counted`` (the candidate's boxes at the
    reference's threshold; default ``candidate`` itself, for detections postprocessed with the
    reference's settings, e.g. a served detector's); with ``borderline``, the mAP with those
    boxes ignored beside it."""
    at_reference = list(candidate if counted is None else counted)
    result, boot = mean_ap_with_bootstrap(candidate, reference, RESAMPLES)  # one matching for both
    per_image = np.asarray(result.per_image, np.float64)
    valid = np.flatnonzero(np.isfinite(per_image))
    n = len(valid)
    m = float(result.map50_95) if n else float("nan")
    boot = boot if n > 1 else np.zeros(0)
    lower, upper = (float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))) if len(boot) else (0.0, 1.0)
    lower, upper = min(lower, m) if n else 0.0, max(upper, m) if n else 1.0  # the figure inside its interval
    sd = float(np.std(boot, ddof=1)) * math.sqrt(n) if len(boot) > 1 else 0.0
    order = valid[np.argsort(per_image[valid], kind="stable")][:worst]
    return DetectionFigures(
        images=len(reference), decided=n, reference_boxes=int(sum(len(d) for d in reference)),
        candidate_boxes=int(sum(len(d) for d in at_reference)), map50_95=m, map50=float(result.map50),
        lower=lower, upper=upper, sd=sd,
        count_agreement=count_agreement(at_reference, reference), classes=result.classes,
        thin_classes=_thin_classes(reference),
        map_borderline_ignored=float(mean_ap(candidate, reference, ignore=borderline).map50_95)
        if borderline is not None and n else math.nan,
        worst=tuple((int(i), float(per_image[i])) for i in order))
