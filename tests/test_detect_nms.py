"""trtrepo.detect's decode, NMS, postprocessing and letterbox geometry (issue 43): NMS equals the
most obvious per-class greedy loop on random boxes (ties, zero-area boxes, many classes), decode
reads both YOLO layouts exactly, the layout is inferred from a shape, and the letterbox mapping
round-trips."""

from __future__ import annotations

import numpy as np
import pytest

from trtrepo.detect import (
    Detections,
    YoloLayout,
    batched_nms,
    decode,
    letterbox_params,
    nms,
    postprocess,
    unletterbox,
)


def _iou_py(a, b) -> float:
    """One pair's IoU in Python floats, the same arithmetic as box_iou (so thresholds compare
    identically)."""
    ax1, ay1, ax2, ay2 = (float(v) for v in a)
    bx1, by1, bx2, by2 = (float(v) for v in b)
    area_a = max(ax2 - ax1, 0.0) * max(ay2 - ay1, 0.0)
    area_b = max(bx2 - bx1, 0.0) * max(by2 - by1, 0.0)
    inter = max(min(ax2, bx2) - max(ax1, bx1), 0.0) * max(min(ay2, by2) - max(ay1, by1), 0.0)
    union = area_a + area_b - inter
    return inter / union if union > 0 else 0.0


def _reference_nms(boxes, scores, classes, thr) -> list[int]:
    """Per class: visit by score (ties by index), keep a box unless a kept box of its class
    overlaps it by more than thr; all kept, merged by score then index."""
    order = sorted(range(len(boxes)), key=lambda i: (-float(scores[i]), i))
    kept: list[int] = []
    for c in sorted(set(int(v) for v in classes)):
        kept_c: list[int] = []
        for i in (j for j in order if int(classes[j]) == c):
            if all(_iou_py(boxes[i], boxes[k]) <= thr for k in kept_c):
                kept_c.append(i)
        kept += kept_c
    return sorted(kept, key=lambda i: (-float(scores[i]), i))


def _random_case(seed: int, n: int = 300, num_classes: int = 20):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 200, (n, 2))
    wh = rng.uniform(0, 60, (n, 2))
    wh[rng.random(n) < 0.1] = 0.0                                  # degenerate zero-area boxes
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    boxes[rng.integers(0, n, 20)] = boxes[rng.integers(0, n, 20)]  # exact duplicate boxes
    scores = (rng.integers(0, 12, n) / 12).astype(np.float32)      # many equal scores
    classes = rng.integers(0, num_classes, n)
    return boxes, scores, classes


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("thr", [0.3, 0.5, 0.7])
def test_batched_nms_equals_per_class_greedy_reference(seed: int, thr: float) -> None:
    boxes, scores, classes = _random_case(seed, num_classes=[1, 3, 80][seed % 3])
    expected = _reference_nms(boxes, scores, classes, thr)
    got = batched_nms(boxes, scores, classes, thr, max_det=None)
    assert got.dtype == np.int64
    assert got.tolist() == expected
    # max_det stops the visit early: exactly the first max_det of the full result
    assert batched_nms(boxes, scores, classes, thr, max_det=7).tolist() == expected[:7]


@pytest.mark.parametrize("seed", range(4))
def test_nms_ignores_classes_and_equals_the_single_class_reference(seed: int) -> None:
    boxes, scores, _ = _random_case(seed)
    expected = _reference_nms(boxes, scores, np.zeros(len(boxes), np.int64), 0.45)
    assert nms(boxes, scores, 0.45).tolist() == expected
    assert nms(boxes, scores, 0.45, max_det=3).tolist() == expected[:3]


def test_nms_ties_go_in_index_order_and_iou_at_threshold_is_kept() -> None:
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 5], [50, 50, 60, 60]], np.float32)
    scores = np.array([0.5, 0.5, 0.9, 0.5], np.float32)
    # box 2 (best) overlaps 0 and 1 by exactly 0.5: not above the threshold, so they survive it;
    # then 0 (lower index of the tie) suppresses its duplicate 1
    assert nms(boxes, scores, 0.5).tolist() == [2, 0, 3]
    assert nms(boxes, scores, 0.49).tolist() == [2, 3]


def test_nms_handles_empty_and_zero_area_input() -> None:
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5).tolist() == []
    assert batched_nms(np.zeros((0, 4)), np.zeros(0), np.zeros(0), 0.5).tolist() == []
    points = np.array([[5, 5, 5, 5], [5, 5, 5, 5]], np.float32)    # zero-area: IoU 0, both kept
    assert nms(points, np.array([0.9, 0.8]), 0.1).tolist() == [0, 1]
    with pytest.raises(ValueError, match="3 boxes and 2 scores"):
        nms(np.zeros((3, 4)), np.zeros(2), 0.5)


@pytest.mark.torchvision
@pytest.mark.parametrize("seed", range(3))
def test_batched_nms_matches_torchvision(seed: int) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    ops = pytest.importorskip("torchvision.ops", reason="torchvision is not installed in .venv (not importable beside torch 2.13 CPU)")
    boxes, _, classes = _random_case(seed)
    boxes = boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]
    classes = classes[:len(boxes)]
    scores = np.random.default_rng(seed).permutation(len(boxes)).astype(np.float32) / len(boxes)  # no ties
    expected = ops.batched_nms(torch.from_numpy(boxes), torch.from_numpy(scores), torch.from_numpy(classes), 0.5)
    assert batched_nms(boxes, scores, classes, 0.5, max_det=None).tolist() == expected.tolist()


# ---- decode ----------------------------------------------------------------------------------

def test_decode_anchor_free_reads_channels_first_boxes_and_best_class() -> None:
    nc, anchors = 3, 4
    out = np.zeros((2, 4 + nc + 2, anchors), np.float32)          # 2 mask rows, ignored
    out[0, 0:4, 1] = [100, 50, 20, 10]                            # cx cy w h
    out[0, 4:7, 1] = [0.1, 0.8, 0.3]
    out[0, 4:7, 3] = [0.2, 0.2, 0.2]                              # at 0.2: not above conf 0.2
    out[0, 7:9, :] = 99.0                                         # mask coefficients
    out[1, 0:4, 0] = [10, 10, 4, 6]
    out[1, 4:7, 0] = [0.6, 0.0, 0.6]                              # tie: the first class wins
    out[1, 0:4, 2] = [0, 0, 4, 6]
    out[1, 4:7, 2] = [0.0, 0.0, 0.25]
    layout = YoloLayout("anchor_free", nc, num_masks=2)
    first, second = decode(out, layout, conf=0.2)
    np.testing.assert_array_equal(first.boxes, [[90, 45, 110, 55]])
    np.testing.assert_array_equal(first.scores, np.float32([0.8]))
    assert first.classes.tolist() == [1] and first.classes.dtype == np.int64
    np.testing.assert_array_equal(second.boxes, [[8, 7, 12, 13], [-2, -3, 2, 3]])
    np.testing.assert_array_equal(second.scores, np.float32([0.6, 0.25]))
    assert second.classes.tolist() == [0, 2]
    # the same output transposed, read channels last
    again = decode(out.transpose(0, 2, 1), YoloLayout("anchor_free", nc, 2, channels_last=True), conf=0.2)
    np.testing.assert_array_equal(again[1].boxes, second.boxes)


def test_decode_anchor_based_scores_objectness_times_class() -> None:
    nc = 2
    out = np.zeros((1, 3, 5 + nc), np.float32)
    out[0, 0] = [320, 320, 64, 32, 0.5, 0.9, 0.4]     # 0.45 for class 0
    out[0, 1] = [10, 20, 2, 2, 0.2, 0.5, 1.0]         # 0.2: below conf 0.25
    out[0, 2] = [0, 0, 8, 8, 1.0, 0.3, 0.6]           # 0.6 for class 1
    (det,) = decode(out, YoloLayout("anchor_based", nc), conf=0.25)   # 3 anchors < 7 channels: from_shape cannot tell
    np.testing.assert_array_equal(det.boxes, [[288, 304, 352, 336], [-4, -4, 4, 4]])
    np.testing.assert_allclose(det.scores, [0.45, 0.6], rtol=1e-6)
    assert det.classes.tolist() == [0, 1]


def test_decode_rejects_an_output_that_does_not_fit_the_layout() -> None:
    with pytest.raises(ValueError, match=r"axis 1 has 84 channels.*needs 85"):
        decode(np.zeros((1, 84, 10)), YoloLayout("anchor_free", 81))
    with pytest.raises(ValueError, match="expected 3 dimensions"):
        decode(np.zeros((84, 10)), YoloLayout("anchor_free", 80))


@pytest.mark.parametrize(("shape", "classes", "expected"), [
    ((1, 84, 8400), 80, YoloLayout("anchor_free", 80, 0, False)),
    ((1, 25200, 85), 80, YoloLayout("anchor_based", 80, 0, True)),
    ((1, 116, 8400), 80, YoloLayout("anchor_free", 80, 32, False)),
    ((1, 25200, 117), 80, YoloLayout("anchor_based", 80, 32, True)),
    ((-1, 84, -1), 80, YoloLayout("anchor_free", 80, 0, False)),
    ((None, None, 6), 1, YoloLayout("anchor_based", 1, 0, True)),
])
def test_layout_from_shape(shape, classes: int, expected: YoloLayout) -> None:
    assert YoloLayout.from_shape(shape, classes) == expected


def test_layout_from_shape_with_a_kind_reads_a_transposed_anchor_free_head() -> None:
    assert YoloLayout.from_shape((1, 8400, 84), 80, kind="anchor_free") == YoloLayout("anchor_free", 80, 0, True)


@pytest.mark.parametrize(("shape", "classes", "message"), [
    ((1, 8400, 84), 80, r"84 channels \(axis 2\) are too few for an anchor-based head with 80 classes"),
    ((1, 3, 7), 2, r"3 channels \(axis 1\) are too few for an anchor-free head"),
    ((1, 84, 84), 80, "equal sizes"),
    ((1, -1, -1), 80, "both non-batch dimensions are dynamic"),
    ((84, 8400), 80, "expected 3 dimensions"),
])
def test_layout_from_shape_refuses_what_it_cannot_tell(shape, classes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        YoloLayout.from_shape(shape, classes)
    assert "\n" not in str(info.value)


def test_layout_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="kind 'ssd'"):
        YoloLayout("ssd", 80)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="class count"):
        YoloLayout("anchor_free", 0)


def test_detections_checks_lengths() -> None:
    assert len(Detections([], [], [])) == 0
    with pytest.raises(ValueError, match="2 boxes, 1 scores and 2 classes"):
        Detections(np.zeros((2, 4)), [0.5], [1, 2])


# ---- postprocess ------------------------------------------------------------------------------

def _anchor_free(rows: list[tuple[float, float, float, float, int, float]], nc: int = 3) -> np.ndarray:
    out = np.zeros((1, 4 + nc, len(rows)), np.float32)
    for a, (cx, cy, w, h, c, p) in enumerate(rows):
        out[0, 0:4, a] = [cx, cy, w, h]
        out[0, 4 + c, a] = p
    return out


def test_postprocess_suppresses_within_a_class_only() -> None:
    out = _anchor_free([(50, 50, 20, 20, 0, 0.9), (51, 50, 20, 20, 0, 0.8), (51, 50, 20, 20, 1, 0.7),
                        (150, 50, 20, 20, 0, 0.6), (0, 0, 4, 4, 2, 0.1)])
    (det,) = postprocess(out, YoloLayout("anchor_free", 3))
    np.testing.assert_allclose(det.scores, [0.9, 0.7, 0.6])
    assert det.classes.tolist() == [0, 1, 0]
    np.testing.assert_array_equal(det.boxes[0], [40, 40, 60, 60])
    (top,) = postprocess(out, YoloLayout("anchor_free", 3), max_det=2)
    assert top.classes.tolist() == [0, 1]


def test_postprocess_caps_candidates_at_max_nms_by_score() -> None:
    rows = [(10.0 * a, 0, 4, 4, 0, 0.3 + 0.01 * a) for a in range(10)]   # disjoint boxes
    (det,) = postprocess(_anchor_free(rows), YoloLayout("anchor_free", 3), max_nms=4)
    np.testing.assert_allclose(det.scores, [0.39, 0.38, 0.37, 0.36], rtol=1e-6)


# ---- letterbox --------------------------------------------------------------------------------

@pytest.mark.parametrize(("image_hw", "size", "expected"), [
    ((480, 640), 640, (1.0, 0.0, 80.0)),
    ((720, 1280), 640, (0.5, 0.0, 140.0)),
    ((100, 50), (320, 320), (3.2, 80.0, 0.0)),
    ((333, 500), 640, (1.28, 0.0, 107.0)),        # 640 - round(426.24) = 214 -> round(106.9) = 107
])
def test_letterbox_params(image_hw, size, expected) -> None:
    assert letterbox_params(image_hw, size) == pytest.approx(expected)


@pytest.mark.parametrize("image_hw", [(480, 640), (720, 1280), (333, 500), (640, 427), (1, 900)])
def test_unletterbox_round_trips_and_clips(image_hw) -> None:
    h, w = image_hw
    rng = np.random.default_rng(h * w)
    xy = rng.uniform(0, 1, (50, 2)) * [w, h]
    wh = rng.uniform(0, 1, (50, 2)) * [w, h]
    boxes = np.concatenate([xy, np.minimum(xy + wh, [w, h])], axis=1).astype(np.float32)
    params = letterbox_params(image_hw, 640)
    scale, px, py = params
    on_input = boxes * scale + np.float32([px, py, px, py])
    np.testing.assert_allclose(unletterbox(on_input, params, image_hw), boxes, rtol=1e-5, atol=1e-3)
    outside = np.array([[-20, -20, 700, 700]], np.float32)
    np.testing.assert_array_equal(unletterbox(outside, params, image_hw), [[0, 0, w, h]])


# ---- imports ----------------------------------------------------------------------------------

def test_detect_imports_numpy_only_and_runs_as_a_copied_folder(tmp_path) -> None:
    """The Triton postprocessing model imports this package: it must load nothing but numpy,
    and work as a plain folder copied next to a model.py (relative imports only)."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    source = Path(__file__).resolve().parents[1] / "trtrepo" / "detect"
    shutil.copytree(source, tmp_path / "detect", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import json, sys\nsys.path.insert(0, '.')\nimport numpy as np, detect\n"
            "out = np.zeros((1, 6, 2), np.float32); out[0, :, 0] = [5, 5, 2, 2, 0.9, 0.1]\n"
            "(d,) = detect.postprocess(out, detect.YoloLayout('anchor_free', 2))\n"
            "assert d.boxes.tolist() == [[4, 4, 6, 6]], d\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] not in sys.stdlib_module_names)))\n")
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    site_hooks = {"__main__", "_distutils_hack"}   # and the editable install's finder, loaded by its .pth
    loaded = {m.split(".")[0] for m in json.loads(proc.stdout) if not m.startswith("__editable__")} - site_hooks
    assert loaded == {"numpy", "detect"}, loaded
