"""A YOLO head's raw output decoded into per-image candidate boxes, as pure numpy (no I/O).

Two layouts (:class:`YoloLayout`), the two that Ultralytics' and the YOLOv5/YOLOv7 exports write:

* ``anchor_free`` (YOLOv8, YOLO11): ``[N, 4 + nc + nm, A]``, channels first. Rows 0..3 are the box
  centre and size ``cx, cy, w, h`` in input pixels, the next ``nc`` rows the class probabilities
  (already through a sigmoid), the last ``nm`` rows mask coefficients (segmentation heads; ignored).
  A candidate's score is its best class probability.
* ``anchor_based`` (YOLOv5, YOLOv7): ``[N, A, 5 + nc + nm]``, channels last. Per anchor ``cx, cy,
  w, h``, the objectness, ``nc`` class probabilities, ``nm`` mask coefficients. A candidate's score
  is ``objectness * class probability`` for its best class.

``channels_last`` overrides the position of the channel axis for exports that transpose the head
(an anchor-free ``[N, A, 84]``).

:func:`decode` keeps, per anchor, the best class only (Ultralytics' ``non_max_suppression`` with
``multi_label=False``; ties go to the lowest class index, numpy's ``argmax``) and the anchors whose
score is strictly above ``conf`` (Ultralytics compares with ``>`` too). Boxes come out as ``x1, y1,
x2, y2`` float32 in input pixels, in anchor order; NMS is :mod:`trtrepo.detect.nms`.

Stable API::

    YoloLayout(kind, num_classes, num_masks=0, channels_last=None)
    YoloLayout.from_shape(shape, num_classes, kind=None) -> YoloLayout
    Detections(boxes [K, 4] float32 xyxy, scores [K] float32, classes [K] int64)
    decode(output, layout, conf=0.25) -> list[Detections]      # one per image
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["anchor_free", "anchor_based"]
KINDS: tuple[Kind, ...] = ("anchor_free", "anchor_based")


@dataclass(frozen=True)
class YoloLayout:
    """How one YOLO head output is laid out (module docstring).

    ``kind``: ``"anchor_free"`` or ``"anchor_based"``. ``num_classes``: the class count ``nc``.
    ``num_masks``: the mask coefficients per anchor (32 for the Ultralytics segmentation heads, 0
    for detection). ``channels_last``: where the ``box + classes (+ masks)`` axis sits; ``None``
    means the kind's convention (anchor-free channels first, anchor-based channels last).
    """

    kind: Kind
    num_classes: int
    num_masks: int = 0
    channels_last: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"YOLO layout kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.num_classes < 1:
            raise ValueError(f"YOLO layout: the class count must be at least 1, got {self.num_classes}")
        if self.num_masks < 0:
            raise ValueError(f"YOLO layout: the mask count must be at least 0, got {self.num_masks}")
        if self.channels_last is None:
            object.__setattr__(self, "channels_last", self.kind == "anchor_based")

    @property
    def box_rows(self) -> int:
        """Rows before the class probabilities: 4 (box) or 5 (box and objectness)."""
        return 4 if self.kind == "anchor_free" else 5

    @property
    def channels(self) -> int:
        """The size of the channel axis: box rows + classes + masks."""
        return self.box_rows + self.num_classes + self.num_masks

    @property
    def channel_axis(self) -> int:
        """The channel axis in an ``[N, ., .]`` output: 2 when channels last, else 1."""
        return 2 if self.channels_last else 1

    @classmethod
    def from_shape(cls, shape: Sequence[int | None], num_classes: int, kind: Kind | None = None) -> YoloLayout:
        """The layout of an output of ``shape`` (``[N, ., .]``; a dynamic dimension may be -1, 0
        or None) for ``num_classes`` classes.

        The channel axis is the shorter of the two (every YOLO head at its usual input sizes has
        more anchors than channels: 8400 or 25200 at 640 pixels), or the static one when the other
        is dynamic. Without ``kind``, its position names the kind, by the exporters' conventions:
        channels first is anchor-free (Ultralytics), channels last anchor-based (YOLOv5/YOLOv7).
        What is left of the channels after the box rows and the classes are mask coefficients.
        Raises ValueError when the shape does not decide (two equal static axes, both dynamic) or
        leaves a negative mask count; pass the layout explicitly then.
        """
        dims = tuple(shape)
        if len(dims) != 3:
            raise ValueError(f"YOLO output shape {list(dims)}: expected 3 dimensions [batch, ., .]")
        a, b = (d if d is not None and d > 0 else None for d in dims[1:])
        if a is None and b is None:
            raise ValueError(f"YOLO output shape {list(dims)}: both non-batch dimensions are dynamic; give the layout explicitly")
        if a is not None and b is not None and a == b:
            raise ValueError(f"YOLO output shape {list(dims)}: cannot tell channels from anchors (equal sizes); give the layout explicitly")
        channels_last = a is None or (b is not None and b < a)
        channels = (b if channels_last else a) or 0  # the static one of the two, chosen above
        chosen: Kind = kind if kind is not None else ("anchor_based" if channels_last else "anchor_free")
        masks = channels - (4 if chosen == "anchor_free" else 5) - num_classes
        if masks < 0:
            raise ValueError(
                f"YOLO output shape {list(dims)}: {channels} channels (axis {2 if channels_last else 1}) are too few for an {chosen.replace('_', '-')} head "
                f"with {num_classes} classes; give the layout explicitly")
        return cls(chosen, num_classes, masks, channels_last)


@dataclass
class Detections:
    """One image's boxes: ``boxes`` ``[K, 4]`` float32 ``x1, y1, x2, y2`` in pixels, ``scores``
    ``[K]`` float32, ``classes`` ``[K]`` int64. Construction converts array-likes to these dtypes
    (an empty list gives ``K = 0``) and checks that the three agree on ``K``."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def __post_init__(self) -> None:
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        self.scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        self.classes = np.asarray(self.classes, dtype=np.int64).reshape(-1)
        k = len(self.boxes)
        if len(self.scores) != k or len(self.classes) != k:
            raise ValueError(f"detections: {k} boxes, {len(self.scores)} scores and {len(self.classes)} classes")

    def __len__(self) -> int:
        return len(self.boxes)

    def take(self, indices: np.ndarray) -> Detections:
        """The detections at ``indices``, in that order."""
        return Detections(self.boxes[indices], self.scores[indices], self.classes[indices])

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))


def _check_output(output: np.ndarray, layout: YoloLayout) -> np.ndarray:
    x = np.asarray(output)
    if x.ndim != 3:
        raise ValueError(f"YOLO output of shape {list(x.shape)}: expected 3 dimensions [batch, ., .]")
    if x.shape[layout.channel_axis] != layout.channels:
        raise ValueError(
            f"YOLO output of shape {list(x.shape)}: axis {layout.channel_axis} has {x.shape[layout.channel_axis]} channels, "
            f"the {layout.kind.replace('_', '-')} layout with {layout.num_classes} classes and {layout.num_masks} masks needs {layout.channels}")
    return x


def xywh_to_xyxy(xywh: np.ndarray) -> np.ndarray:
    """``[K, 4]`` centre/size boxes as corners, float32 (``x1 = cx - w / 2`` ...)."""
    b = np.asarray(xywh, dtype=np.float32)
    half = b[:, 2:4] / np.float32(2)
    return np.concatenate([b[:, 0:2] - half, b[:, 0:2] + half], axis=1)


def decode(output: np.ndarray, layout: YoloLayout, conf: float = 0.25) -> list[Detections]:
    """Per image of ``output`` (``[N, ., .]`` as ``layout`` says), the anchors whose best-class
    score is above ``conf``, in anchor order: boxes xyxy float32 in input pixels, the score, the
    class. Raises ValueError when the output's shape does not fit the layout."""
    x = _check_output(output, layout)
    # Work on [N, C, A] views: the class reductions then run over the contiguous anchor axis of a
    # channels-first output without copying it.
    chw = np.swapaxes(x, 1, 2) if layout.channels_last else x
    rows = layout.box_rows
    cls_prob = chw[:, rows:rows + layout.num_classes, :]
    if layout.kind == "anchor_based":
        cls_prob = cls_prob * chw[:, 4:5, :]          # objectness * class probability
    best = cls_prob.argmax(axis=1)                                              # [N, A]
    scores = np.take_along_axis(cls_prob, best[:, None, :], axis=1)[:, 0, :]    # [N, A]
    keep = scores > conf
    result = []
    for n in range(chw.shape[0]):
        idx = np.flatnonzero(keep[n])
        boxes = xywh_to_xyxy(chw[n, 0:4][:, idx].T)
        result.append(Detections(boxes, scores[n, idx], best[n, idx]))
    return result
