"""Ground-truth boxes of a detector's images, from the two formats users hold them in, as pure
functions on what the files say (the file reading is :mod:`trtrepo.boxlabels`'s):

    yolo_txt_boxes(text, image_wh, num_classes=None) -> (classes [K], boxes [K, 4] xyxy)
    coco_index(obj, class_names=None, num_classes=None) -> CocoIndex
    in_input_frame(boxes, letterbox_params) -> boxes in the letterboxed input's pixels
    image_region(image_wh, letterbox_params) -> the image's extent in the input, xyxy
    class_names(metadata_text) -> names in index order       # Ultralytics' ``names`` metadata
    BoxLabels(objects, crowd)                       # one image's truth, in the input's pixels

Decisions:

* **YOLO txt** (Ultralytics' dataset format): one file per image, one line per object,
  ``class cx cy w h`` normalized to the image's width and height; a line of ``class x1 y1 x2 y2
  x3 y3 ...`` (a segmentation polygon, also normalized) gives the polygon's bounding box, as
  Ultralytics' own loader does for a detection model. Blank lines are skipped; a line of any other
  form, a class that is not a whole number from 0 to ``num_classes - 1`` or a coordinate that is not
  a finite number is an error naming its line (``ValueError``; the adapter adds the file).
  An image without a file holds no objects (Ultralytics' "background" images).
* **COCO JSON** (instances): ``images`` (``id``, ``file_name``, ``width``, ``height``),
  ``annotations`` (``image_id``, ``category_id``, ``bbox`` ``[x, y, w, h]`` in pixels,
  ``iscrowd``) and ``categories`` (``id``, ``name``). Categories become the model's class indices
  **by name** when the model names its classes (Ultralytics' ``names`` metadata) and every listed
  category's name is among them; otherwise **by sorted id** (the listed categories sorted by id
  are classes 0, 1, ...: COCO's 80 categories, ids 1..90 with gaps, become 0..79, the mapping
  Ultralytics and detectron2 use), which needs as many categories as the model has classes when
  the count is known. A crowd annotation (``iscrowd`` 1) is an ignore region: a detection on it
  counts neither way (:func:`trtrepo.detect.metrics.mean_ap`'s ``ignore``; pycocotools matches a
  crowd region by intersection over the detection's area and lets it absorb any number of
  detections, this by IoU and one detection each). An image listed without annotations holds no
  objects.
* Boxes are mapped into the letterboxed input's pixels (``x * scale + pad``, the inverse of
  :func:`~trtrepo.detect.nms.unletterbox`), where the model's detections are, so that mAP against
  them is COCO's mAP on the original image up to the letterbox's scale (IoU does not change
  under a common scale and shift); detections are clipped to the image's region first
  (:meth:`BoxLabels.clip`), as Ultralytics clips them to the image before validation.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .decode import Detections


@dataclass(frozen=True)
class BoxLabels:
    """One image's ground truth in the letterboxed input's pixels: ``objects`` (scores 1) and
    ``crowd``, the ignore regions (COCO's crowd annotations)."""

    objects: Detections
    crowd: Detections = field(default_factory=Detections.empty)
    region: tuple[float, float, float, float] | None = None  # the image's extent in the input, xyxy

    @classmethod
    def of(cls, classes: np.ndarray, boxes: np.ndarray, crowd: np.ndarray | None = None,
           region: tuple[float, float, float, float] | None = None) -> BoxLabels:
        """From class indices and xyxy boxes; ``crowd``: a boolean per box (default none);
        ``region``: where the image lies in the input (:func:`image_region`)."""
        classes = np.asarray(classes, np.int64).reshape(-1)
        boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
        is_crowd = np.zeros(len(classes), bool) if crowd is None else np.asarray(crowd, bool).reshape(-1)
        keep, ig = np.flatnonzero(~is_crowd), np.flatnonzero(is_crowd)
        return cls(Detections(boxes[keep], np.ones(len(keep), np.float32), classes[keep]),
                   Detections(boxes[ig], np.ones(len(ig), np.float32), classes[ig]), region)

    def clip(self, detections: Detections) -> Detections:
        """``detections`` with their boxes clipped to the image's region, as Ultralytics clips
        predictions to the image before judging them against labels (no region: unchanged)."""
        if self.region is None or not len(detections):
            return detections
        x1, y1, x2, y2 = self.region
        b = detections.boxes.copy()
        b[:, [0, 2]] = b[:, [0, 2]].clip(x1, x2)
        b[:, [1, 3]] = b[:, [1, 3]].clip(y1, y2)
        return Detections(b, detections.scores, detections.classes)


def _number(token: str, line: int, what: str) -> float:
    try:
        v = float(token)
    except ValueError:
        raise ValueError(f"line {line}: {what} {token!r} is not a number") from None
    if not math.isfinite(v):
        raise ValueError(f"line {line}: {what} {token!r} is not a finite number")
    return v


def _class_index(token: str, line: int, num_classes: int | None) -> int:
    v = _number(token, line, "class")
    top = num_classes
    if v != int(v) or v < 0 or (top is not None and v >= top):
        known = f"from 0 to {top - 1} (the model's {top} classes)" if top is not None else "a whole number from 0"
        raise ValueError(f"line {line}: class {token!r} is not a class index: expected {known}")
    return int(v)


def yolo_txt_boxes(text: str, image_wh: Sequence[int], num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(classes [K] int64, boxes [K, 4] float32 xyxy in the image's pixels)`` of one YOLO txt
    label file's ``text`` for an image of ``image_wh = (width, height)`` (module docstring)."""
    w, h = float(image_wh[0]), float(image_wh[1])
    classes: list[int] = []
    boxes: list[list[float]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        tokens = raw.split()
        if not tokens:
            continue
        values = tokens[1:]
        if len(values) != 4 and (len(values) < 6 or len(values) % 2):
            raise ValueError(f"line {n}: {len(tokens)} values; expected 'class cx cy w h' or a polygon "
                             "'class x1 y1 x2 y2 x3 y3 ...' (normalized)")
        c = _class_index(tokens[0], n, num_classes)
        xy = np.asarray([_number(t, n, "coordinate") for t in values], np.float64)
        if len(values) == 4:
            cx, cy, bw, bh = xy
            if bw < 0 or bh < 0:
                raise ValueError(f"line {n}: a negative width or height")
            box = [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]
        else:
            px, py = xy[0::2], xy[1::2]
            box = [px.min(), py.min(), px.max(), py.max()]
        classes.append(c)
        boxes.append([box[0] * w, box[1] * h, box[2] * w, box[3] * h])
    return np.asarray(classes, np.int64), np.asarray(boxes, np.float32).reshape(-1, 4)


@dataclass(frozen=True)
class CocoImage:
    """One ``images`` entry of a COCO file with its annotations: ``size`` ``(width, height)``,
    ``classes`` (the model's indices), ``boxes`` xyxy in the image's pixels, ``crowd`` flags."""

    size: tuple[int, int]
    classes: np.ndarray
    boxes: np.ndarray
    crowd: np.ndarray


@dataclass(frozen=True)
class CocoIndex:
    """A COCO file's images by ``file_name`` and how its categories became class indices
    (``mapping``: ``"by name"`` or ``"by sorted id"``)."""

    images: dict[str, CocoImage]
    mapping: str
    categories: int


def _entries(obj: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = obj.get(key)
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise ValueError(f"'{key}' is not a list of objects (a COCO instances file has images, annotations and categories)")
    return items


def _field(entry: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    value = entry.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: '{key}' is missing or not a {getattr(kind, '__name__', 'number')}")
    return value


def _category_map(categories: list[Mapping[str, Any]], class_names: Sequence[str] | None,
                  num_classes: int | None) -> tuple[dict[Any, int], str]:
    ids = [_field(c, "id", f"categories[{i}]", int) for i, c in enumerate(categories)]
    if len(set(ids)) != len(ids):
        raise ValueError("categories: an id is listed twice")
    names = [str(c.get("name", "")) for c in categories]
    if class_names and num_classes is None:
        num_classes = len(class_names)
    if class_names:
        index = {n: i for i, n in enumerate(class_names)}
        if all(n in index for n in names):
            return {cid: index[n] for cid, n in zip(ids, names, strict=True)}, "by name"
    if num_classes is not None and len(ids) != num_classes:
        unknown = [n for n in names if class_names and n not in class_names][:3]
        why = (f"names {', '.join(map(repr, unknown))} are not among the model's classes, so " if unknown else "")
        raise ValueError(f"categories: {why}{len(ids)} categories map by sorted id only onto {num_classes} classes "
                         f"(the model's); list all {num_classes} categories, sorted by id they become classes "
                         f"0..{num_classes - 1}")
    return {cid: i for i, cid in enumerate(sorted(ids))}, "by sorted id"


def coco_index(obj: Mapping[str, Any], class_names: Sequence[str] | None = None,
               num_classes: int | None = None) -> CocoIndex:
    """The images of a COCO instances file (``obj``, the parsed JSON) by ``file_name``, their
    annotations as class indices and xyxy boxes (module docstring). ``ValueError`` names the entry
    at fault."""
    if not isinstance(obj, Mapping):
        raise ValueError("not a JSON object (a COCO instances file has images, annotations and categories)")
    images, annotations, categories = (_entries(obj, k) for k in ("images", "annotations", "categories"))
    cat, mapping = _category_map(categories, class_names, num_classes)
    by_id: dict[Any, tuple[str, tuple[int, int]]] = {}
    for i, im in enumerate(images):
        where = f"images[{i}]"
        name = _field(im, "file_name", where, str)
        size = (_field(im, "width", where, int), _field(im, "height", where, int))
        if size[0] <= 0 or size[1] <= 0:
            raise ValueError(f"{where}: width and height must be positive")
        by_id[_field(im, "id", where, (int, str))] = (name, size)
    rows: dict[Any, list[tuple[int, list[float], bool]]] = {k: [] for k in by_id}
    for i, a in enumerate(annotations):
        where = f"annotations[{i}]"
        image_id = _field(a, "image_id", where, (int, str))
        if image_id not in by_id:
            raise ValueError(f"{where}: image_id {image_id!r} is not among the images")
        cid = _field(a, "category_id", where, int)
        if cid not in cat:
            raise ValueError(f"{where}: category_id {cid} is not among the categories")
        bbox = a.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox):
            raise ValueError(f"{where}: 'bbox' is not [x, y, width, height] of 4 finite numbers")
        x, y, bw, bh = (float(v) for v in bbox)
        if bw < 0 or bh < 0:
            raise ValueError(f"{where}: 'bbox' has a negative width or height")
        rows[image_id].append((cat[cid], [x, y, x + bw, y + bh], bool(a.get("iscrowd", 0))))
    out: dict[str, CocoImage] = {}
    for image_id, (name, size) in by_id.items():
        if name in out:
            raise ValueError(f"images: file_name {name!r} is listed twice")
        r = rows[image_id]
        out[name] = CocoImage(size, np.asarray([c for c, _, _ in r], np.int64),
                              np.asarray([b for _, b, _ in r], np.float32).reshape(-1, 4),
                              np.asarray([z for _, _, z in r], bool))
    return CocoIndex(out, mapping, len(categories))


def image_region(image_wh: Sequence[int], params: tuple[float, float, float]) -> tuple[float, float, float, float]:
    """Where an image of ``image_wh = (width, height)`` lies in the letterboxed input, xyxy."""
    scale, pad_x, pad_y = params
    return (pad_x, pad_y, pad_x + image_wh[0] * scale, pad_y + image_wh[1] * scale)


def in_input_frame(boxes: np.ndarray, params: tuple[float, float, float]) -> np.ndarray:
    """``[K, 4]`` xyxy boxes in the original image's pixels mapped into the letterboxed input's
    (``x * scale + pad``; ``params`` from :func:`~trtrepo.detect.nms.letterbox_params`); float32."""
    scale, pad_x, pad_y = params
    b = np.asarray(boxes, np.float64).reshape(-1, 4) * scale
    b[:, [0, 2]] += pad_x
    b[:, [1, 3]] += pad_y
    return b.astype(np.float32)


MAX_NAMES_TEXT = 1 << 20  # a names metadata value longer than this is not read


def class_names(text: str) -> tuple[str, ...]:
    """The class names of an exporter's ``names`` metadata in index order: Ultralytics writes a
    Python dict literal (``"{0: 'person', 1: 'bicycle'}"``, read with :func:`ast.literal_eval`,
    which evaluates literals only); a list of strings reads too. ``()`` for anything else (keys
    that are not 0..N-1, values that are not strings, text over :data:`MAX_NAMES_TEXT`)."""
    if not isinstance(text, str) or len(text) > MAX_NAMES_TEXT:
        return ()
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ()
    if isinstance(value, dict) and all(isinstance(k, int) and not isinstance(k, bool) for k in value) \
            and sorted(value) == list(range(len(value))):
        value = [value[i] for i in range(len(value))]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return ()
