"""trtrepo.detect's COCO mAP and count agreement (issue 43): hand-computed cases, the edge cases
(no references, no predictions), pycocotools when importable, and two properties on seeded random
boxes (identical detections score 1.0; jitter lowers the score)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trtrepo.detect import (
    COCO_IOU_THRESHOLDS,
    Detections,
    box_iou,
    count_agreement,
    count_difference,
    mean_ap,
)


def _det(boxes, classes, scores=None) -> Detections:
    n = len(boxes)
    return Detections(np.asarray(boxes, np.float32).reshape(-1, 4),
                      np.linspace(0.9, 0.5, n) if scores is None else scores, classes)


def test_box_iou_known_values() -> None:
    a = np.array([[0, 0, 10, 10], [5, 5, 5, 5]], np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [5, 5, 5, 5]], np.float32)
    expected = [[1.0, 50 / 150, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]   # zero-area boxes overlap nothing
    np.testing.assert_allclose(box_iou(a, b), expected)
    assert box_iou(np.zeros((0, 4)), b).shape == (0, 4)


def test_default_thresholds_are_cocos() -> None:
    np.testing.assert_array_equal(COCO_IOU_THRESHOLDS, np.linspace(0.5, 0.95, 10))
    np.testing.assert_allclose(COCO_IOU_THRESHOLDS, np.arange(0.5, 0.96, 0.05), rtol=0, atol=1e-12)


def test_perfect_predictions_score_one() -> None:
    refs = [_det([[0, 0, 10, 10], [20, 20, 40, 50]], [0, 1]), _det([[5, 5, 15, 15]], [0])]
    result = mean_ap(refs, refs)
    assert (result.map50_95, result.map50) == (1.0, 1.0)
    assert (result.classes, result.images, result.reference_boxes, result.predicted_boxes) == (2, 2, 3, 3)
    assert result.per_image == [1.0, 1.0] and result.per_class == {0: 1.0, 1: 1.0} and result.note == ""


def test_one_missed_box_of_two_caps_recall_at_half() -> None:
    refs = [_det([[0, 0, 10, 10], [20, 20, 30, 30]], [0, 0])]
    preds = [_det([[0, 0, 10, 10]], [0])]
    # precision 1 up to recall 0.5: 51 of the 101 recall points
    assert mean_ap(preds, refs).map50_95 == pytest.approx(51 / 101)


def test_a_shifted_box_counts_only_up_to_its_iou() -> None:
    refs = [_det([[0, 0, 10, 10]], [0])]
    preds = [_det([[0, 0, 10, 16]], [0])]             # IoU 100 / 160 = 0.625
    result = mean_ap(preds, refs)
    assert result.map50 == 1.0
    assert result.map50_95 == pytest.approx(0.3)      # AP 1 at 0.5, 0.55, 0.6; 0 at the other 7


def test_a_wrong_class_scores_zero_and_its_class_is_not_evaluated() -> None:
    refs = [_det([[0, 0, 10, 10]], [0])]
    preds = [_det([[0, 0, 10, 10]], [3])]
    result = mean_ap(preds, refs)
    assert (result.map50_95, result.map50, result.classes) == (0.0, 0.0, 1)
    assert result.per_class == {0: 0.0}


def test_a_duplicate_prediction_lowers_precision() -> None:
    refs = [_det([[0, 0, 10, 10], [20, 20, 30, 30]], [0, 0])]
    preds = [_det([[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30]], [0, 0, 0], scores=[0.9, 0.8, 0.7])]
    # tp, fp, tp: precision 1 up to recall 0.5 (51 points), then 2/3 up to recall 1 (50 points)
    assert mean_ap(preds, refs).map50_95 == pytest.approx((51 + 50 * 2 / 3) / 101)
    # the same duplicate ranked last costs nothing: recall 1 is reached before it
    preds_last = [_det(preds[0].boxes, [0, 0, 0], scores=[0.9, 0.6, 0.7])]
    assert mean_ap(preds_last, refs).map50_95 == pytest.approx(1.0)


def test_matching_prefers_the_highest_iou_reference() -> None:
    refs = [_det([[0, 0, 10, 10], [0, 0, 10, 12]], [0, 0])]
    # the first prediction overlaps both; it takes the better one (IoU 1), leaving the other for
    # the second prediction
    preds = [_det([[0, 0, 10, 12], [0, 0, 10, 10]], [0, 0])]
    assert mean_ap(preds, refs).map50_95 == 1.0


def test_no_references_is_undefined_and_no_predictions_is_zero() -> None:
    empty = Detections.empty()
    undefined = mean_ap([_det([[0, 0, 1, 1]], [0])], [empty])
    assert math.isnan(undefined.map50_95) and math.isnan(undefined.map50)
    assert undefined.note == "no reference boxes: mAP is undefined" and undefined.classes == 0
    assert undefined.to_dict()["map50_95"] is None
    zero = mean_ap([empty], [_det([[0, 0, 1, 1]], [0])])
    assert (zero.map50_95, zero.map50, zero.note) == (0.0, 0.0, "")
    assert mean_ap([], []).note == "no reference boxes: mAP is undefined"
    with pytest.raises(ValueError, match="1 images of predictions against 2"):
        mean_ap([empty], [empty, empty])


def test_per_image_scores_and_worst_images() -> None:
    refs = [_det([[0, 0, 10, 10]], [0]), _det([[0, 0, 10, 10], [20, 20, 30, 30]], [0, 1]), Detections.empty(),
            _det([[0, 0, 10, 10]], [2])]
    preds = [refs[0], _det([[0, 0, 10, 10]], [0]), _det([[1, 1, 2, 2]], [0]), _det([[0, 0, 10, 16]], [2])]
    result = mean_ap(preds, refs)
    assert result.per_image[0] == 1.0
    assert result.per_image[1] == pytest.approx(0.5)       # class 0 perfect, class 1 missed
    assert math.isnan(result.per_image[2])                  # no reference box
    assert result.per_image[3] == pytest.approx(0.3)
    assert result.worst_images(2) == [3, 1]
    assert result.worst_images() == [3, 1, 0]
    data = json.loads(json.dumps(result.to_dict()))
    assert data["per_image"][2] is None and data["per_class"] == {"0": 1.0, "1": 0.0, "2": pytest.approx(0.3)}


def test_max_dets_keeps_the_best_scored_predictions_per_image_and_class() -> None:
    refs = [_det([[0, 0, 10, 10]], [0])]
    preds = [_det([[50, 50, 60, 60], [0, 0, 10, 10]], [0, 0], scores=[0.9, 0.8])]
    assert mean_ap(preds, refs, max_dets=1).map50_95 == 0.0
    assert mean_ap(preds, refs, max_dets=None).map50_95 == pytest.approx(0.5)   # precision 1/2 at recall 1


def test_thresholds_without_half_still_give_map50() -> None:
    refs = [_det([[0, 0, 10, 10]], [0])]
    preds = [_det([[0, 0, 10, 16]], [0])]
    result = mean_ap(preds, refs, iou_thresholds=[0.7, 0.9])
    assert (result.map50_95, result.map50) == (0.0, 1.0)


def test_count_agreement_and_difference() -> None:
    one, two = _det([[0, 0, 1, 1]], [0]), _det([[0, 0, 1, 1], [2, 2, 3, 3]], [0, 0])
    preds, refs = [one, two, one, Detections.empty()], [one, one, two, Detections.empty()]
    assert count_agreement(preds, refs) == 0.5
    assert count_difference(preds, refs) == 0.5
    assert math.isnan(count_agreement([], []))
    with pytest.raises(ValueError):
        count_difference([one], [])


def _random_references(seed: int, images: int = 12, classes: int = 5) -> list[Detections]:
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(images):
        n = int(rng.integers(0, 15))
        xy = rng.uniform(0, 600, (n, 2))
        wh = rng.uniform(8, 120, (n, 2))
        result.append(Detections(np.concatenate([xy, xy + wh], axis=1), rng.random(n), rng.integers(0, classes, n)))
    return result


def _jittered(refs: list[Detections], scale: float, seed: int) -> list[Detections]:
    rng = np.random.default_rng(seed)
    out = []
    for r in refs:
        wh = np.tile(r.boxes[:, 2:4] - r.boxes[:, 0:2], 2)                 # w, h, w, h
        out.append(Detections(r.boxes + rng.normal(0, scale, r.boxes.shape) * wh, rng.random(len(r)), r.classes))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_identical_detections_score_one(seed: int) -> None:
    refs = _random_references(seed)
    result = mean_ap(refs, refs)
    assert (result.map50_95, result.map50) == (1.0, 1.0)
    assert count_agreement(refs, refs) == 1.0


def test_jitter_lowers_map_monotonically_on_average() -> None:
    scales = [0.0, 0.02, 0.05, 0.1, 0.2, 0.4]
    means = []
    for scale in scales:
        values = [mean_ap(_jittered(refs, scale, seed + 100), refs).map50_95
                  for seed in range(8) for refs in [_random_references(seed)]]
        means.append(float(np.mean(values)))
    assert means[0] == 1.0
    assert all(a > b for a, b in zip(means, means[1:], strict=False)), means
    assert means[-1] < 0.2, means


@pytest.mark.parametrize("seed", range(3))
def test_matches_pycocotools(seed: int) -> None:
    coco_module = pytest.importorskip("pycocotools.coco", reason="pycocotools is not installed in .venv (not a dependency)")
    cocoeval = pytest.importorskip("pycocotools.cocoeval", reason="pycocotools is not installed in .venv (not a dependency)")
    refs = _random_references(seed)
    preds = _jittered(refs, 0.08, seed + 1)
    preds[0] = Detections(np.concatenate([preds[0].boxes, refs[1].boxes]),
                          np.concatenate([preds[0].scores, refs[1].scores]), np.concatenate([preds[0].classes, refs[1].classes]))

    def xywh(b):
        return [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]

    gt = coco_module.COCO()
    gt.dataset = {
        "info": {}, "licenses": [], "images": [{"id": i} for i in range(len(refs))],
        "categories": [{"id": c} for c in range(5)],
        "annotations": [{"id": k + 1, "image_id": i, "category_id": int(c), "bbox": xywh(b), "area": xywh(b)[2] * xywh(b)[3],
                         "iscrowd": 0}
                        for k, (i, b, c) in enumerate((i, b, c) for i, r in enumerate(refs) for b, c in zip(r.boxes, r.classes, strict=True))],
    }
    gt.createIndex()
    dt = gt.loadRes([{"image_id": i, "category_id": int(c), "bbox": xywh(b), "score": float(s)}
                     for i, p in enumerate(preds) for b, c, s in zip(p.boxes, p.classes, p.scores, strict=True)])
    ev = cocoeval.COCOeval(gt, dt, "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    result = mean_ap(preds, refs)
    assert result.map50_95 == pytest.approx(ev.stats[0], abs=1e-6)
    assert result.map50 == pytest.approx(ev.stats[1], abs=1e-6)


def test_bootstrap_resamples_whole_images_and_sees_a_rare_class() -> None:
    """49 images hold one class-0 box each, found; one image also holds the only class-1 box, missed:
    mAP 0.5. A resample without that image has no class 1 (mAP 1.0), one with it 0.5: the bootstrap
    spans both, where the spread of the per-image figures (49 x 1.0, one 0.5) is tiny."""
    from trtrepo.detect import bootstrap_map
    from trtrepo.detect.judge import compare_detections

    box = [[10, 10, 50, 50]]
    refs = [_det(box, [0]) for _ in range(49)] + [_det(box + [[60, 60, 90, 90]], [0, 1])]
    preds = [_det(box, [0]) for _ in range(50)]
    assert mean_ap(preds, refs).map50_95 == pytest.approx(0.5)
    boot = bootstrap_map(preds, refs, resamples=300, seed=1)
    assert len(boot) == 300 and set(np.round(boot, 9)) == {0.5, 1.0}
    assert 0.2 < np.mean(boot == 1.0) < 0.5  # P(the image is not drawn) = (49/50)^50 = 0.36
    np.testing.assert_array_equal(boot, bootstrap_map(preds, refs, resamples=300, seed=1))  # seeded
    fig = compare_detections(refs, preds)
    assert fig.lower == pytest.approx(0.5) and fig.upper == pytest.approx(1.0)
    assert fig.verdict(0.9) == "fail"  # the figure itself is below the limit
    per_image = np.asarray(mean_ap(preds, refs).per_image)
    assert 1.96 * per_image.std(ddof=1) / math.sqrt(len(per_image)) < 0.05  # what the old interval used


def test_the_verdict_says_when_most_classes_rest_on_a_few_boxes() -> None:
    """Three classes, two of them with one box each: the figure rests on two boxes, and the text says so;
    with every class holding more than three boxes it does not."""
    from trtrepo.detect.judge import compare_detections

    box = [[10, 10, 50, 50]]
    thin = [_det(box, [0]) for _ in range(20)] + [_det(box, [1]), _det(box, [2])]
    fig = compare_detections(thin, thin)
    assert (fig.classes, fig.thin_classes) == (3, 2)
    assert "2 of the 3 classes hold 3 boxes or fewer" in fig.describe()
    full = [_det(box, [i % 3]) for i in range(30)]
    fig = compare_detections(full, full)
    assert (fig.classes, fig.thin_classes) == (3, 0) and "boxes or fewer" not in fig.describe()


def test_an_ignore_box_absorbs_one_prediction_per_threshold_and_is_never_a_reference() -> None:
    """COCO's ignore flag, one to one: a false positive on an ignore box counts neither way (up to
    that box's IoU), a second one on the same box and one elsewhere still count as false positives,
    and a class with ignore boxes only is not evaluated."""
    refs = [_det([[0, 0, 10, 10]], [0], [0.9])]
    ignore = [_det([[20, 0, 30, 10], [40, 40, 60, 60]], [0, 1], [0.2, 0.2])]
    on_it = [_det([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 0], [0.5, 0.8])]  # the FP outranks the find
    assert mean_ap(on_it, refs).map50_95 == pytest.approx(0.5)
    assert mean_ap(on_it, refs, ignore=ignore).map50_95 == pytest.approx(1.0)
    twice = [_det([[0, 0, 10, 10], [20, 0, 30, 10], [20, 0, 30, 10]], [0, 0, 0], [0.5, 0.8, 0.7])]
    assert mean_ap(twice, refs, ignore=ignore).map50_95 == pytest.approx(0.5)   # one of the two ignored
    elsewhere = [_det([[0, 0, 10, 10], [70, 70, 80, 80]], [0, 0], [0.5, 0.8])]
    assert mean_ap(elsewhere, refs, ignore=ignore).map50_95 == pytest.approx(0.5)
    shifted = [_det([[0, 0, 10, 10], [20, 0, 30, 16]], [0, 0], [0.5, 0.8])]    # IoU 0.625 with the ignore box
    assert mean_ap(shifted, refs, ignore=ignore).map50_95 == pytest.approx((3 * 1.0 + 7 * 0.5) / 10)
    other_class = [_det([[0, 0, 10, 10], [40, 40, 60, 60]], [0, 1], [0.5, 0.8])]
    result = mean_ap(other_class, refs, ignore=ignore)
    assert result.classes == 1 and result.per_class == {0: 1.0}
    with pytest.raises(ValueError, match="2 images"):
        mean_ap(on_it, refs, ignore=ignore * 2)


def test_ignore_boxes_leave_identical_detections_at_one_and_an_ignored_lead_at_zero_precision() -> None:
    """Ignored predictions ranked before any counted one give precision 0 there (COCO's eps), not NaN."""
    refs = [_det([[0, 0, 10, 10]], [0], [0.9])]
    ignore = [_det([[20, 0, 30, 10]], [0], [0.2])]
    assert mean_ap(refs, refs, ignore=ignore).map50_95 == 1.0
    lead = [_det([[20, 0, 30, 10], [0, 0, 10, 10]], [0, 0], [0.9, 0.5])]
    assert mean_ap(lead, refs, ignore=ignore).map50_95 == pytest.approx(1.0)


def test_the_judge_reports_the_figure_with_fp32s_borderline_boxes_ignored() -> None:
    """From a raw YOLO head: FP32's boxes at 0.10-0.25 are the borderline ones; a candidate that
    lifts one of them over the reference's own box loses on the strict figure only."""
    from trtrepo.detect import YoloLayout, borderline_detections, detection_figures, reference_detections

    layout = YoloLayout.from_shape((1, 6, 8), num_classes=2)
    fp32 = np.zeros((1, 6, 8), np.float32)   # cx, cy, w, h, then the two classes' probabilities
    fp32[0, :4] = [[100 + 50 * a for a in range(8)], [100] * 8, [40] * 8, [40] * 8]  # boxes apart
    for anchor, score in ((0, 0.9), (1, 0.2), (2, 0.05)):
        fp32[0, 4, anchor] = score
    reference, borderline = reference_detections(fp32, layout), borderline_detections(fp32, layout)
    assert len(reference[0]) == 1 and reference[0].scores[0] == pytest.approx(0.9)
    assert len(borderline[0]) == 1 and borderline[0].scores[0] == pytest.approx(0.2)
    cand = fp32.copy()
    cand[0, 4, 1] = 0.95
    fig = detection_figures(reference, cand, layout, borderline=borderline)
    assert fig.map50_95 == pytest.approx(0.5) and fig.map_borderline_ignored == pytest.approx(1.0)
    assert "1.000 with FP32's 0.10-0.25 boxes ignored" in fig.describe()
    assert fig.to_dict()["map_borderline_ignored"] == pytest.approx(1.0)
    assert math.isnan(detection_figures(reference, cand, layout).map_borderline_ignored)
    assert "ignored" not in detection_figures(reference, cand, layout).describe()
