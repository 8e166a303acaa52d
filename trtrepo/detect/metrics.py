"""Box IoU, COCO mAP and box-count agreement between two sets of detections, as pure numpy
(no I/O).

Stable API::

    box_iou(a [K, 4], b [M, 4]) -> [K, M] float64
    mean_ap(predictions, references, iou_thresholds=COCO_IOU_THRESHOLDS, max_dets=100, ignore=None) -> MapResult
    bootstrap_map(predictions, references, resamples=400, seed=0) -> [resamples] mAP50-95
    mean_ap_with_bootstrap(predictions, references, resamples=400, seed=0) -> (MapResult, [resamples])
    paired_map_bootstrap(first, second, references, resamples=400, seed=0, ignore=None) -> (MapResult, MapResult, [resamples])
    match(predictions, references, ignore=None) -> Matching   # COCO thresholds and max_dets; pooled again by:
    map_result(matching, predictions, references) -> MapResult
    pooled_draws(matching, resamples=400, seed=0) -> [resamples] mAP50-95 per draw, NaN without references
    paired_difference(first: Matching, second: Matching, resamples=400, seed=0) -> [resamples]
    draws_difference(first_draws, second_draws) -> [draws]   # the same, from two pooled_draws
    count_agreement(predictions, references) -> float    # images whose box count matches
    count_difference(predictions, references) -> float   # mean |count - reference count|

:func:`mean_ap` is pycocotools' ``COCOeval`` (bbox, area range "all", no crowd boxes) over
in-memory :class:`~trtrepo.detect.decode.Detections`; the references are the ground truth (when
judging an INT8 model they are the FP32 model's detections, pseudo ground truth; their scores are
ignored). Step by step, as ``evaluateImg`` and ``accumulate`` do it:

* per image and class, the predictions sorted by score (stable), at most ``max_dets`` of them
  (COCO's 100; ``None``: all);
* greedy matching at each IoU threshold ``t``: in that order, a prediction matches the still
  unmatched reference of its class with the highest IoU ``>= t`` (``t`` capped at ``1 - 1e-10``;
  equal IoUs go to the later reference, as COCO's loop does); unmatched predictions are false
  positives;
* per class, the predictions of all images merged by score (stable, image order first), cumulative
  precision ``tp / (tp + fp)`` (COCO adds ``eps`` to the denominator, which is never 0 here: without
  it, perfect predictions score exactly 1.0 rather than ``1 - 2e-16``) and recall ``tp / references``, precision made monotone
  (running maximum from the end), read at the 101 recalls ``0, 0.01, .., 1`` (the first point
  reaching each; 0 past the last recall reached); AP is their mean;
* classes without reference boxes are skipped (AP undefined; their predictions count nowhere), a
  class with references but no predictions has AP 0; mAP is the mean over classes and thresholds.
  ``map50`` is the mean over classes at IoU 0.5 (computed even when 0.5 is not among the
  thresholds). With no reference box at all, mAP is undefined: NaN, and ``MapResult.note`` says so.

``ignore`` (one :class:`Detections` per image, optional) holds regions that are neither to be
found nor to be missed, COCO's ``ignore`` flag on a non-crowd box: at each threshold, after the
matching above, a prediction left unmatched takes the still unused ignore box of its class with the
highest IoU ``>= t`` (in score order, one prediction per box) and then counts neither as a true nor
as a false positive; ignore boxes never count as references. (pycocotools sets that flag only from
``iscrowd``, whose boxes match any number of predictions by the area of the prediction; a one-to-one
IoU match is the stricter form.) The gate passes FP32's borderline boxes here
(:mod:`trtrepo.detect.judge`).

``MapResult.per_image`` is, for each image, the same mAP computed on that image alone (the classes
with a reference box in it, all thresholds); NaN for an image without reference boxes, whose extra
predictions :func:`count_agreement` catches instead. ``worst_images`` ranks by it.

The default thresholds are COCO's ``np.linspace(0.5, 0.95, 10)`` (``np.arange(0.5, 0.96, 0.05)``
differs from it in the last bits of some values, which matters only to an IoU exactly on one). Matching loops over predictions that overlap a reference
at the lowest threshold, vectorised over thresholds and references.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .decode import Detections

COCO_IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
COCO_MAX_DETS = 100


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` ``[K, 4]`` with every box of ``b`` ``[M, 4]`` (xyxy), ``[K, M]``
    float64. Widths and heights below zero count as zero; a pair whose union is empty (two
    zero-area boxes) has IoU 0."""
    p = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    q = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    area_p = np.clip(p[:, 2] - p[:, 0], 0, None) * np.clip(p[:, 3] - p[:, 1], 0, None)
    area_q = np.clip(q[:, 2] - q[:, 0], 0, None) * np.clip(q[:, 3] - q[:, 1], 0, None)
    iw = np.clip(np.minimum(p[:, None, 2], q[None, :, 2]) - np.maximum(p[:, None, 0], q[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(p[:, None, 3], q[None, :, 3]) - np.maximum(p[:, None, 1], q[None, :, 1]), 0, None)
    inter = iw * ih
    union = area_p[:, None] + area_q[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


@dataclass(frozen=True)
class MapResult:
    """What :func:`mean_ap` measured (module docstring for the definitions).

    ``map50_95`` / ``map50``: mAP over the thresholds / at IoU 0.5 (NaN when undefined);
    ``classes``: the classes evaluated (those with reference boxes); ``images``; ``reference_boxes``
    and ``predicted_boxes``: all boxes given (before the ``max_dets`` cap); ``per_image``: each
    image's own mAP50-95 (NaN without reference boxes); ``per_class``: AP50-95 per evaluated class;
    ``note``: why the mAP is undefined, "" when it is not."""

    map50_95: float
    map50: float
    classes: int
    images: int
    reference_boxes: int
    predicted_boxes: int
    per_image: list[float]
    per_class: dict[int, float] = field(default_factory=dict)
    note: str = ""

    def worst_images(self, count: int = 10) -> list[int]:
        """Indices of the ``count`` images with the lowest per-image mAP, lowest first (images
        without reference boxes left out; equal values in index order)."""
        scored = [(v, i) for i, v in enumerate(self.per_image) if not math.isnan(v)]
        return [i for _, i in sorted(scored)[:max(count, 0)]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN becomes None, class ids become strings."""
        def num(v: float) -> float | None:
            return None if math.isnan(v) else float(v)
        return {
            "map50_95": num(self.map50_95), "map50": num(self.map50), "classes": self.classes,
            "images": self.images, "reference_boxes": self.reference_boxes, "predicted_boxes": self.predicted_boxes,
            "per_image": [num(v) for v in self.per_image],
            "per_class": {str(c): num(v) for c, v in sorted(self.per_class.items())},
            "note": self.note,
        }


def _match(pred: np.ndarray, ref: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """True positives ``[T, K]`` of the predictions ``pred`` (already in score order) against
    ``ref`` at each threshold, COCO's greedy matching."""
    nt, k, m = len(thresholds), len(pred), len(ref)
    tp = np.zeros((nt, k), dtype=bool)
    if k == 0 or m == 0:
        return tp
    ious = box_iou(pred, ref)
    thr = np.minimum(thresholds, 1 - 1e-10)[:, None]
    lowest = float(thr.min())
    matched = np.zeros((nt, m), dtype=bool)
    rows = np.arange(nt)
    for d in np.flatnonzero(ious.max(axis=1) >= lowest):
        row = ious[d][None, :]
        cand = ~matched & (row >= thr)
        best = m - 1 - np.argmax(np.where(cand, row, -1.0)[:, ::-1], axis=1)   # ties: the last
        ok = cand[rows, best]
        matched[rows[ok], best[ok]] = True
        tp[ok, d] = True
    return tp


def _ignored(pred: np.ndarray, ignore: np.ndarray, tp: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Ignored predictions ``[T, K]``: at each threshold, each prediction (in score order) that is
    not a true positive takes the unused ``ignore`` box of highest IoU ``>= t``."""
    ig = np.zeros_like(tp)
    if len(pred) == 0 or len(ignore) == 0:
        return ig
    ious = box_iou(pred, ignore)
    thr = np.minimum(thresholds, 1 - 1e-10)
    for t in range(len(thr)):
        used = np.zeros(len(ignore), dtype=bool)
        for d in np.flatnonzero(~tp[t] & (ious.max(axis=1) >= thr[t])):
            cand = np.where(~used & (ious[d] >= thr[t]), ious[d], -1.0)
            j = int(np.argmax(cand))
            if cand[j] >= 0:
                used[j] = ig[t, d] = True
    return ig


def _average_precision(tp: np.ndarray, references: int, ignored: np.ndarray | None = None) -> np.ndarray:
    """AP ``[T]`` of predictions in score order with true positives ``tp`` ``[T, K]``, against
    ``references`` boxes: COCO's 101-point interpolation of the monotone precision; ``ignored``
    predictions count neither way."""
    nt, k = tp.shape
    if k == 0:
        return np.zeros(nt)
    counted = np.ones_like(tp) if ignored is None else ~ignored
    tps = np.cumsum(tp & counted, axis=1).astype(np.float64)
    fps = np.cumsum(~tp & counted, axis=1).astype(np.float64)
    recall = tps / references
    total = fps + tps
    precision = np.divide(tps, total, out=np.zeros_like(tps), where=total > 0)  # COCO's eps: 0 before any counted one
    precision = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    ap = np.zeros(nt)
    for t in range(nt):
        at = np.searchsorted(recall[t], RECALL_POINTS, side="left")
        q = np.zeros(len(RECALL_POINTS))
        valid = at < k
        q[valid] = precision[t, at[valid]]
        ap[t] = q.mean()
    return ap


def _check_pairs(predictions: Sequence[Detections], references: Sequence[Detections]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} images of predictions against {len(references)} of references")


@dataclass
class _Matched:
    """The per-image matching :func:`mean_ap` pools: per class, each image's prediction scores and
    true positives ``[T, K]`` (``None`` where the image holds neither), and its reference count."""

    classes: list[int]
    scores: dict[int, list[np.ndarray | None]]
    tp: dict[int, list[np.ndarray | None]]
    references: dict[int, np.ndarray]  # class -> reference boxes per image [images]
    ignored: dict[int, list[np.ndarray | None]]
    per_image: list[float]
    main: slice
    index50: int
    thresholds: int  # rows of each tp (the asked thresholds, plus 0.5 where it was not one)


Matching = _Matched  # the public name of one prediction set's matching (:func:`match`)


def _match_images(predictions: Sequence[Detections], references: Sequence[Detections],
                  iou_thresholds: Sequence[float] | np.ndarray, max_dets: int | None,
                  ignore: Sequence[Detections] | None = None) -> _Matched:
    _check_pairs(predictions, references)
    if ignore is not None:
        _check_pairs(ignore, references)
    thresholds = np.asarray(iou_thresholds, dtype=np.float64).reshape(-1)
    if thresholds.size == 0:
        raise ValueError("mAP: no IoU threshold given")
    main = slice(0, thresholds.size)   # the thresholds asked for; 0.5 may be appended after them
    at50 = np.flatnonzero(np.isclose(thresholds, 0.5))
    if at50.size:
        index50 = int(at50[0])
    else:
        thresholds = np.append(thresholds, 0.5)
        index50 = len(thresholds) - 1
    n = len(references)
    classes = sorted(set(np.concatenate([np.asarray(d.classes) for d in (*predictions, *references)] or
                                        [np.zeros(0)]).astype(int).tolist()))
    scores: dict[int, list[np.ndarray | None]] = {c: [None] * n for c in classes}
    tps: dict[int, list[np.ndarray | None]] = {c: [None] * n for c in classes}
    counts: dict[int, np.ndarray] = {c: np.zeros(n, np.int64) for c in classes}
    igs: dict[int, list[np.ndarray | None]] = {c: [None] * n for c in classes}
    per_image: list[float] = []
    for k, (pred, ref) in enumerate(zip(predictions, references, strict=True)):
        image_aps = []
        for c in np.union1d(pred.classes, ref.classes).astype(int).tolist():
            pi = np.flatnonzero(pred.classes == c)
            pi = pi[np.argsort(-pred.scores[pi], kind="mergesort")][:max_dets]
            ri = np.flatnonzero(ref.classes == c)
            tp = _match(pred.boxes[pi], ref.boxes[ri], thresholds)
            ig = None if ignore is None else _ignored(pred.boxes[pi], ignore[k].boxes[ignore[k].classes == c], tp, thresholds)
            scores[c][k], tps[c][k], counts[c][k], igs[c][k] = pred.scores[pi], tp, len(ri), ig
            if len(ri):
                image_aps.append(_average_precision(tp, len(ri), ig)[main])
        per_image.append(float(np.mean(image_aps)) if image_aps else math.nan)
    return _Matched(classes, scores, tps, counts, igs, per_image, main, index50, thresholds.size)


def _class_aps(m: _Matched, images: Sequence[int]) -> dict[int, np.ndarray]:
    """AP ``[T]`` per class with reference boxes, pooling the given images (repeats count again)."""
    out: dict[int, np.ndarray] = {}
    for c in m.classes:
        refs = int(m.references[c][list(images)].sum()) if len(images) else 0
        if refs == 0:
            continue
        held = [k for k in images if m.scores[c][k] is not None]
        scores = np.concatenate([m.scores[c][k] for k in held]) if held else np.zeros(0)  # type: ignore[misc]
        tp = np.concatenate([m.tp[c][k] for k in held], axis=1) if held else np.zeros((m.thresholds, 0), bool)  # type: ignore[misc]
        order = np.argsort(-scores, kind="mergesort")
        ig = [x for x in (m.ignored[c][k] for k in held) if x is not None]
        ignored = np.concatenate(ig, axis=1)[:, order] if held and len(ig) == len(held) else None
        out[c] = _average_precision(tp[:, order], refs, ignored)
    return out


def mean_ap(predictions: Sequence[Detections], references: Sequence[Detections],
            iou_thresholds: Sequence[float] | np.ndarray = COCO_IOU_THRESHOLDS,
            max_dets: int | None = COCO_MAX_DETS, ignore: Sequence[Detections] | None = None) -> MapResult:
    """COCO mAP of ``predictions`` against ``references`` (one :class:`Detections` per image,
    in the same image order; module docstring for the definition, and for ``ignore``). Raises
    ValueError when they differ in image count or no threshold is given."""
    return map_result(_match_images(predictions, references, iou_thresholds, max_dets, ignore), predictions, references)


def map_result(m: _Matched, predictions: Sequence[Detections], references: Sequence[Detections]) -> MapResult:
    class_aps = _class_aps(m, range(len(references)))
    images, reference_boxes = len(references), sum(len(r) for r in references)
    predicted_boxes = sum(len(p) for p in predictions)
    if not class_aps:
        return MapResult(math.nan, math.nan, 0, images, reference_boxes, predicted_boxes, m.per_image,
                         note="no reference boxes: mAP is undefined")
    table = np.stack(list(class_aps.values()))   # [classes, T]
    return MapResult(float(table[:, m.main].mean()), float(table[:, m.index50].mean()), len(class_aps), images,
                     reference_boxes, predicted_boxes, m.per_image,
                     per_class={c: float(v[m.main].mean()) for c, v in class_aps.items()})


def bootstrap_map(predictions: Sequence[Detections], references: Sequence[Detections], resamples: int = 400,
                  seed: int = 0) -> np.ndarray:
    """mAP50-95 of ``resamples`` bootstrap samples of the images (drawn with replacement, as many as
    there are; a draw without reference boxes is skipped): the spread of the data set's figure itself.

    Decision: mAP pools its classes across images and averages over classes, so a class with one or
    two reference boxes in the whole set moves it as much as a class with hundreds; the spread of
    per-image figures misses that. The matching is done once; each sample re-pools it."""
    return mean_ap_with_bootstrap(predictions, references, resamples, seed)[1]


def mean_ap_with_bootstrap(predictions: Sequence[Detections], references: Sequence[Detections], resamples: int = 400,
                           seed: int = 0) -> tuple[MapResult, np.ndarray]:
    """:func:`mean_ap` (COCO thresholds and ``max_dets``) and :func:`bootstrap_map` from one matching."""
    m = match(predictions, references)
    boot = pooled_draws(m, resamples, seed)
    return map_result(m, predictions, references), boot[np.isfinite(boot)]


def pooled_draws(m: Matching, resamples: int = 400, seed: int = 0) -> np.ndarray:
    """mAP50-95 of ``m`` pooled over each of ``resamples`` bootstrap samples of its images (seeded:
    two matchings against the same references get the same draws), NaN where a draw holds no
    reference box; the difference of two such arrays is :func:`paired_difference`."""
    rng = np.random.default_rng(seed)
    n = len(m.per_image)
    boot = [_pooled(m, draw) for draw in (rng.integers(0, n, n).tolist() for _ in range(resamples if n else 0))]
    return np.asarray([math.nan if b is None else b for b in boot], np.float64)


def _pooled(m: _Matched, images: Sequence[int]) -> float | None:
    """mAP50-95 of the matching ``m`` pooled over ``images`` (one bootstrap draw; repeats count
    again); None when the draw holds no reference box."""
    aps = _class_aps(m, images)
    return float(np.stack(list(aps.values()))[:, m.main].mean()) if aps else None


def paired_map_bootstrap(first: Sequence[Detections], second: Sequence[Detections], references: Sequence[Detections],
                         resamples: int = 400, seed: int = 0,
                         ignore: Sequence[Detections] | None = None) -> tuple[MapResult, MapResult, np.ndarray]:
    """:func:`mean_ap` of two prediction sets against the same ``references`` (and ``ignore``
    regions), and the first's mAP50-95 minus the second's over ``resamples`` bootstrap samples of
    the images, the same draws for both (a paired interval: what the images share cancels)."""
    a, b = match(first, references, ignore), match(second, references, ignore)
    return map_result(a, first, references), map_result(b, second, references), paired_difference(a, b, resamples, seed)


def match(predictions: Sequence[Detections], references: Sequence[Detections],
          ignore: Sequence[Detections] | None = None) -> Matching:
    """The per-image matching at COCO's thresholds and ``max_dets`` that :func:`mean_ap` pools."""
    return _match_images(predictions, references, COCO_IOU_THRESHOLDS, COCO_MAX_DETS, ignore)


def paired_difference(first: Matching, second: Matching, resamples: int = 400, seed: int = 0) -> np.ndarray:
    """mAP50-95 of ``first`` minus ``second`` (two matchings against the same references, image by
    image) over ``resamples`` bootstrap samples of the images, the same draws for both; a draw
    without reference boxes is skipped."""
    n = len(first.per_image)
    if len(second.per_image) != n:
        raise ValueError(f"paired mAP: {n} images against {len(second.per_image)}")
    return draws_difference(pooled_draws(first, resamples, seed), pooled_draws(second, resamples, seed))


def draws_difference(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The paired bootstrap of two :func:`pooled_draws` arrays of one seed over the same images:
    their difference draw by draw, without the draws that hold no reference box."""
    diff = first - second
    return diff[np.isfinite(diff)]


def count_agreement(predictions: Sequence[Detections], references: Sequence[Detections]) -> float:
    """The fraction of images whose prediction count equals the reference's (NaN for no image).
    Counts depend on ``conf``: compare detections postprocessed with the same settings."""
    _check_pairs(predictions, references)
    if not references:
        return math.nan
    return sum(len(p) == len(r) for p, r in zip(predictions, references, strict=True)) / len(references)


def count_difference(predictions: Sequence[Detections], references: Sequence[Detections]) -> float:
    """The mean over images of ``|prediction count - reference count|`` (NaN for no image)."""
    _check_pairs(predictions, references)
    if not references:
        return math.nan
    return sum(abs(len(p) - len(r)) for p, r in zip(predictions, references, strict=True)) / len(references)
