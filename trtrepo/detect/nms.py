"""Greedy non-maximum suppression (plain and class-aware), YOLO postprocessing and the letterbox
geometry, as pure numpy (no I/O).

Stable API::

    nms(boxes, scores, iou, max_det=None) -> indices                     # int64, by score
    batched_nms(boxes, scores, classes, iou, max_det=300) -> indices     # class-aware
    postprocess(output, layout, conf=0.25, iou=0.45, max_det=300, max_nms=30000) -> list[Detections]
    letterbox_params(image_hw, size) -> (scale, pad_x, pad_y)
    unletterbox(boxes, params, image_hw) -> boxes                         # original image pixels

NMS conventions (those of torchvision's ``nms`` / ``batched_nms``, which Ultralytics calls):

* boxes are ``x1, y1, x2, y2``; the IoU is :func:`trtrepo.detect.metrics.box_iou` in float64
  (a box of zero area overlaps nothing: its IoU is 0, never NaN);
* candidates are visited by score, highest first; equal scores go in index order, so the result
  is deterministic (torchvision leaves ties to its sort);
* a kept box suppresses the later candidates whose IoU with it is strictly above ``iou``;
* :func:`batched_nms` suppresses only within a class: its result is exactly per-class greedy NMS,
  merged by score. Instead of torchvision's coordinate offsets (which move float coordinates
  by up to ``classes * max_coordinate`` and can flip an IoU that sits on the threshold), a kept
  box's suppression is masked to its own class;
* the kept indices come out in visiting order (score descending), and ``max_det`` stops the
  visit once that many are kept: greedy NMS decides each box from higher-scored ones only, so
  stopping early gives exactly the first ``max_det`` of the full result, at a fraction of the cost.

:func:`postprocess` is Ultralytics' ``non_max_suppression`` with ``multi_label=False``, without
masks: decode (best class per anchor, score ``> conf``), keep the ``max_nms`` best-scored
candidates, class-aware NMS, at most ``max_det`` per image. Its defaults are the predict-time
ones: ``conf=0.25`` as Ultralytics' predict and YOLOv5's ``detect.py`` use, and ``iou=0.45`` as
YOLOv5/YOLOv7's ``detect.py`` (Ultralytics' YOLOv8+ predict and val use ``iou=0.7``; its val also
``conf=0.001``). Predict-time settings because these detections are what a served model returns
and what the FP32 model's pseudo ground truth is made of; pass ``conf=0.001, iou=0.7`` to
reproduce ``yolo val``'s candidate set. ``max_nms=30000`` and ``max_det=300`` are Ultralytics'.
Measured (median of 7, one core of a shared Xeon, numpy 2.4, 2026-11-27): an ``[8, 84, 8400]``
float32 output at ``conf=0.001`` postprocesses in 0.16 s when every anchor is a candidate of a
random class with a random box (uniform values: 8400 candidates and the full 300 kept per image),
0.04 s (``iou=0.45``) to 0.10 s (``iou=0.7``) when the anchors cluster on 20 objects per image as
a trained head's do; decode alone takes 0.015 s.

Letterbox: the model's input is the image scaled by ``r = min(H / h, W / w)`` (up or down) and
centred on an ``H x W`` canvas, as Ultralytics' ``LetterBox(auto=False, center=True)`` places it:
``pad_x = round((W - round(w * r)) / 2 - 0.1)``, ``pad_y`` likewise. :func:`unletterbox` undoes
it as Ultralytics' ``scale_boxes`` does (subtract the padding, divide by ``r``, clip to the image),
with one difference: ``scale_boxes`` recomputes the padding from ``w * r`` unrounded, which can
sit one pixel off the image's real placement; here the padding is the placement itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .decode import Detections, YoloLayout, decode
from .metrics import box_iou

DEFAULT_CONF = 0.25
DEFAULT_IOU = 0.45
DEFAULT_MAX_DET = 300
DEFAULT_MAX_NMS = 30000


def _score_order(scores: np.ndarray) -> np.ndarray:
    """Indices by score descending, equal scores in index order."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    return np.lexsort((np.arange(len(s)), -s))


def _greedy(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray | None, iou: float,
            max_det: int | None) -> np.ndarray:
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    s = np.asarray(scores).reshape(-1)
    if len(s) != len(b):
        raise ValueError(f"NMS: {len(b)} boxes and {len(s)} scores")
    if classes is not None and len(classes) != len(b):
        raise ValueError(f"NMS: {len(b)} boxes and {len(classes)} classes")
    limit = len(b) if max_det is None else max(int(max_det), 0)
    order = _score_order(s)
    keep: list[int] = []
    while order.size and len(keep) < limit:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        if classes is not None:
            same = classes[rest] == classes[i]
            if not same.any():
                order = rest
                continue
            overlap = np.zeros(len(rest), dtype=bool)
            overlap[same] = box_iou(b[i:i + 1], b[rest[same]])[0] > iou
        else:
            overlap = box_iou(b[i:i + 1], b[rest])[0] > iou
        order = rest[~overlap]
    return np.asarray(keep, dtype=np.int64)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float, max_det: int | None = None) -> np.ndarray:
    """Greedy NMS over all boxes regardless of class: the indices kept, by score descending
    (module docstring for the conventions); at most ``max_det`` of them when given."""
    return _greedy(boxes, scores, None, iou, max_det)


def batched_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float,
                max_det: int | None = DEFAULT_MAX_DET) -> np.ndarray:
    """Class-aware greedy NMS: boxes suppress only boxes of their own class. The indices kept,
    by score descending, at most ``max_det`` (``None``: all)."""
    return _greedy(boxes, scores, np.asarray(classes, dtype=np.int64).reshape(-1), iou, max_det)


def postprocess(output: np.ndarray, layout: YoloLayout, conf: float = DEFAULT_CONF, iou: float = DEFAULT_IOU,
                max_det: int = DEFAULT_MAX_DET, max_nms: int = DEFAULT_MAX_NMS) -> list[Detections]:
    """Per image of a YOLO head's ``output``: :func:`~trtrepo.detect.decode.decode` at ``conf``,
    the ``max_nms`` best candidates, :func:`batched_nms` at ``iou``, at most ``max_det`` boxes,
    by score descending (defaults and timing in the module docstring)."""
    result = []
    for det in decode(output, layout, conf):
        if len(det) > max_nms:
            det = det.take(np.sort(_score_order(det.scores)[:max_nms]))
        result.append(det.take(batched_nms(det.boxes, det.scores, det.classes, iou, max_det)))
    return result


def _hw(value: int | Sequence[int], what: str) -> tuple[int, int]:
    pair = (int(value), int(value)) if isinstance(value, (int, np.integer)) else tuple(int(v) for v in value)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{what} {value!r}: expected a positive size or (height, width)")
    return pair[0], pair[1]


def letterbox_params(image_hw: Sequence[int], size: int | Sequence[int]) -> tuple[float, float, float]:
    """``(scale, pad_x, pad_y)`` of an ``image_hw = (h, w)`` image letterboxed into ``size``
    (an int for a square input, or ``(H, W)``): the resize factor and the left and top padding in
    input pixels, as Ultralytics' ``LetterBox`` places the image (module docstring)."""
    h, w = _hw(image_hw, "image size")
    out_h, out_w = _hw(size, "input size")
    r = min(out_h / h, out_w / w)
    pad_x = round((out_w - round(w * r)) / 2 - 0.1)
    pad_y = round((out_h - round(h * r)) / 2 - 0.1)
    return r, float(pad_x), float(pad_y)


def unletterbox(boxes: np.ndarray, params: tuple[float, float, float], image_hw: Sequence[int]) -> np.ndarray:
    """``[K, 4]`` xyxy boxes in the letterboxed input's pixels mapped back to the original
    image's (``(x - pad_x) / scale``), clipped to ``[0, w] x [0, h]``; float32."""
    h, w = _hw(image_hw, "image size")
    scale, pad_x, pad_y = params
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4).copy()
    b[:, [0, 2]] -= np.float32(pad_x)
    b[:, [1, 3]] -= np.float32(pad_y)
    b /= np.float32(scale)
    b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
    b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
    return b
