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
(docs/benchmarks.md, "what the every-class figure measures") the second figure varied less between
crop sets than the strict one, and real damage still shows in it (NNCF's defaults, FP16 beside
them). The verdict stays on the strict figure.

With ground-truth labels (:class:`~trtrepo.detect.labels.BoxLabels`, from COCO JSON or YOLO txt),
:func:`labelled_figures` measures what the user's own metric loses: FP32's and the candidate's
mAP50-95 against the labels on the same images, both at validation settings, and the drop in
points with a *paired* bootstrap interval (the same image draws for both, so what the images
share cancels). Where labels exist, that drop is the figure the gate judges
(:class:`trtrepo.quantize.AccuracyCheck`); the figure against FP32 stays beside it.

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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from .decode import Detections, YoloLayout
from .labels import BoxLabels
from .metrics import count_agreement, draws_difference, map_result, match, mean_ap, pooled_draws
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
class LabelFigures:
    """mAP50-95 and mAP50 against ground-truth labels of FP32 (``fp32_*``) and of the candidate on
    the same ``images`` (``decided`` of them hold labelled objects: ``boxes`` in ``classes``;
    ``crowd`` ignore regions), and ``drop`` = FP32 minus candidate mAP50-95 in points, with its
    paired 95 % bootstrap interval ``lower``..``upper`` (points) and ``sd``, the bootstrap spread
    scaled to one image."""

    images: int
    decided: int
    boxes: int
    classes: int
    fp32_map50_95: float
    map50_95: float
    fp32_map50: float
    map50: float
    drop: float
    lower: float
    upper: float
    sd: float
    crowd: int = 0
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)  # the candidate's pooled_draws, for decisive_difference

    def verdict(self, limit: float) -> str:
        """``pass`` when the interval's upper end is at or under ``limit`` points, ``fail`` when
        the drop itself is over it (or nothing could be measured), else ``undecided``."""
        if not self.decided or not math.isfinite(self.drop):
            return "fail"
        if self.upper <= limit + 1e-9:
            return "pass"
        return "fail" if self.drop > limit + 1e-9 else "undecided"

    def images_to_decide(self, limit: float) -> int | None:
        """The labelled images at which this drop and spread would pass."""
        gap = limit - self.drop
        if gap <= 0 or not math.isfinite(gap) or self.sd <= 0:
            return None
        n = math.ceil((Z * self.sd / gap) ** 2)
        return n if n <= MAX_IMAGES_TO_DECIDE else None

    def describe(self) -> str:
        """``mAP50-95 vs labels 0.372 against FP32's 0.381: drop 0.90 points (95% interval ...)``."""
        crowd = f", {self.crowd} crowd regions ignored" if self.crowd else ""
        return (f"mAP50-95 vs labels {self.map50_95:.3f} against FP32's {self.fp32_map50_95:.3f}: drop "
                f"{self.drop:.2f} points (95% interval {self.lower:.2f} to {self.upper:.2f}), mAP50 {self.map50:.3f} "
                f"against {self.fp32_map50:.3f} ({self.boxes} labelled boxes in {self.classes} classes on "
                f"{self.decided} of {self.images} images{crowd})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, draws=None))
        d.pop("draws")
        return {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LabelFigures:
        values: dict[str, Any] = {k: (math.nan if d[k] is None else d[k]) for k in cls.__dataclass_fields__ if k in d}
        return cls(**values)


def _interval(boot: np.ndarray, value: float, decided: int, whole: tuple[float, float]) -> tuple[float, float, float]:
    """(lower, upper, sd) of a figure ``value`` on ``decided`` images from its bootstrap draws
    ``boot``: the 2.5 and 97.5 percentiles, widened to hold the figure itself, and the draws' spread
    scaled to one image; on fewer than two decided images no spread is measured and the interval is
    ``whole``, every value the figure can take."""
    if decided < 2 or not len(boot):
        return whole[0], whole[1], 0.0
    lower, upper = float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))
    if math.isfinite(value):
        lower, upper = min(lower, value), max(upper, value)
    sd = float(np.std(boot, ddof=1)) * math.sqrt(decided) if len(boot) > 1 else 0.0
    return lower, upper, sd


def labelled_figures(truth: Sequence[BoxLabels], fp32: Sequence[Detections], candidate: Sequence[Detections],
                     seed: int = 0) -> LabelFigures:
    """FP32's detections and the candidate's (both at validation settings) against the labels,
    image by image in the same order (module doc)."""
    references = [t.objects for t in truth]
    crowd = sum(len(t.crowd) for t in truth)
    ignore = [t.crowd for t in truth] if crowd else None
    fp32 = [t.clip(d) for t, d in zip(truth, fp32, strict=True)]
    candidate = [t.clip(d) for t, d in zip(truth, candidate, strict=True)]
    ma, mb = match(fp32, references, ignore), match(candidate, references, ignore)
    ra, rb, draws = map_result(ma, fp32, references), map_result(mb, candidate, references), pooled_draws(mb, RESAMPLES, seed)
    diff = draws_difference(pooled_draws(ma, RESAMPLES, seed), draws)
    decided = sum(1 for r in references if len(r))
    drop = 100.0 * (ra.map50_95 - rb.map50_95) if decided else math.nan
    # one labelled image has no spread to measure: the interval is every drop there can be (undecided)
    lower, upper, sd = _interval(100.0 * diff, drop, decided, (-100.0, 100.0))
    return LabelFigures(images=len(truth), decided=decided, boxes=int(sum(len(r) for r in references)),
                        classes=ra.classes, fp32_map50_95=float(ra.map50_95), map50_95=float(rb.map50_95),
                        fp32_map50=float(ra.map50), map50=float(rb.map50), drop=drop, lower=lower, upper=upper,
                        sd=sd, crowd=crowd, draws=draws)


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
    labels: LabelFigures | None = None  # against ground-truth labels, where the images have them
    draws: np.ndarray | None = field(default=None, repr=False, compare=False)  # pooled_draws against the reference, for decisive_difference

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
        d = asdict(replace(self, draws=None, labels=None))
        d.pop("draws")
        d["worst"] = [list(w) for w in self.worst]
        d["map_borderline_ignored"] = self.map_borderline_ignored if math.isfinite(self.map_borderline_ignored) else None
        d["labels"] = None if self.labels is None else self.labels.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectionFigures:
        values = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        values["worst"] = tuple(tuple(w) for w in d.get("worst", ()))
        if values.get("map_borderline_ignored") is None:
            values.pop("map_borderline_ignored", None)
        labels = d.get("labels")
        values["labels"] = LabelFigures.from_dict(labels) if isinstance(labels, Mapping) else None
        return cls(**values)


def candidate_detections(output: np.ndarray, layout: YoloLayout) -> list[Detections]:
    """A raw head output's detections at validation settings (:data:`CANDIDATE_CONF`)."""
    return postprocess(output, layout, conf=CANDIDATE_CONF, iou=IOU)


def detection_figures(reference: Sequence[Detections], candidate_output: np.ndarray, layout: YoloLayout,
                      worst: int = 5, borderline: Sequence[Detections] | None = None,
                      truth: tuple[Sequence[BoxLabels], Sequence[Detections]] | None = None) -> DetectionFigures:
    """The candidate's raw head output judged against the reference detections (see the module
    doc); with ``borderline`` (:func:`borderline_detections`), the second figure too; with
    ``truth`` (the labels and FP32's :func:`candidate_detections` on the same images), the
    figures against the labels (:func:`labelled_figures`)."""
    candidate = candidate_detections(candidate_output, layout)
    at_reference = [d.take(np.flatnonzero(d.scores > REFERENCE_CONF)) for d in candidate]
    figures = compare_detections(reference, candidate, at_reference, worst, borderline)
    if truth is None:
        return figures
    return replace(figures, labels=labelled_figures(truth[0], truth[1], candidate))


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
    matching = match(candidate, reference)  # one matching for the figure and its interval
    result, draws = map_result(matching, candidate, reference), pooled_draws(matching, RESAMPLES)
    boot = draws[np.isfinite(draws)]
    per_image = np.asarray(result.per_image, np.float64)
    valid = np.flatnonzero(np.isfinite(per_image))
    n = len(valid)
    m = float(result.map50_95) if n else float("nan")
    lower, upper, sd = _interval(boot, m, n, (0.0, 1.0))
    order = valid[np.argsort(per_image[valid], kind="stable")][:worst]
    return DetectionFigures(
        images=len(reference), decided=n, reference_boxes=int(sum(len(d) for d in reference)),
        candidate_boxes=int(sum(len(d) for d in at_reference)), map50_95=m, map50=float(result.map50),
        lower=lower, upper=upper, sd=sd,
        count_agreement=count_agreement(at_reference, reference), classes=result.classes,
        thin_classes=_thin_classes(reference),
        map_borderline_ignored=float(mean_ap(candidate, reference, ignore=borderline).map50_95)
        if borderline is not None and n else math.nan,
        worst=tuple((int(i), float(per_image[i])) for i in order), draws=draws)


def decisive_difference(a: DetectionFigures, b: DetectionFigures) -> int:
    """+1 when ``a``'s mAP50-95 is above ``b``'s beyond chance, -1 when below, 0 when the held-out
    images cannot tell (or either carries no draws): against the labels where both were judged
    against them, else against the reference's detections; the paired 95 % bootstrap interval of the
    difference excludes 0. Both candidates' :func:`~trtrepo.detect.metrics.pooled_draws` were taken
    with the same seed over the same images, so their difference is the paired bootstrap, kept from
    judging each candidate rather than matched again. Used to rank candidates
    (:func:`trtrepo.evaluate.detection_preference`, which says why)."""
    both = a.labels is not None and b.labels is not None
    da, db = (a.labels.draws, b.labels.draws) if both else (a.draws, b.draws)  # type: ignore[union-attr]
    if da is None or db is None or len(da) != len(db):
        return 0
    diff = draws_difference(da, db)
    if len(diff) < 2:
        return 0
    lower, upper = np.percentile(diff, [2.5, 97.5])
    return 1 if lower > 0 else -1 if upper < 0 else 0
