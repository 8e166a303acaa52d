"""``--labels`` for a detector: the ground-truth boxes of an image folder's files, from a COCO
JSON file or a folder of YOLO txt files, in the letterboxed input's pixels (the file reading
around :mod:`trtrepo.detect.labels`, which holds the formats and the decisions).

Decisions:

* A ``--labels`` path that is a folder or ends in ``.json`` holds boxes; any other is the
  classifier's integer labels (:mod:`trtrepo.data`). Boxes go with an image folder (``--data``)
  read through a letterbox preprocessing (an Ultralytics export's own, or ``letterbox`` in the
  spec): the boxes follow the image into the input's frame; other data is refused in one line.
* An image is found in a COCO file by its path relative to the data folder (``a/b.jpg``), else by
  its file name when exactly one entry has it. An image of the folder without an entry is an error
  (an image without objects is an entry without annotations), as is an entry whose width and
  height differ from the image's. In a YOLO folder, ``a/b.jpg``'s labels are ``a/b.txt``, else
  ``b.txt`` (Ultralytics' ``labels/`` beside ``images/``); an image without one holds no objects,
  but a folder without any ``.txt`` is refused (the wrong folder, most likely).
* The JSON file is read whole, up to :data:`MAX_JSON_BYTES` (COCO's train2017 instances are 448 MB).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .detect import BoxLabels, CocoIndex, coco_index, image_region, in_input_frame, yolo_txt_boxes
from .errors import OptionError, UsageError, one_line
from .preprocessing import Preprocess

MAX_JSON_BYTES = 1 << 30


def is_box_labels(spec: str | Path) -> bool:
    """Whether a ``--labels`` path names boxes (a folder, or a ``.json`` file)."""
    p = Path(spec)
    return p.is_dir() or p.suffix.lower() == ".json"


@dataclass(frozen=True)
class BoxLabelSet:
    """The labels of an image folder's files (in the folder's file order) and where they came
    from: ``kind`` ``"COCO JSON"`` or ``"YOLO txt"``, ``mapping`` how COCO categories became
    class indices (``""`` for YOLO)."""

    labels: list[BoxLabels]
    path: Path
    kind: str
    mapping: str = ""

    def describe(self) -> str:
        boxes = sum(len(b.objects) for b in self.labels)
        how = f", categories {self.mapping}" if self.mapping else ""
        return f"{self.path} ({self.kind}{how}): {boxes} boxes on {len(self.labels)} images"


def image_hw(path: Path) -> tuple[int, int]:
    """An image file's (height, width) as trtrepo's preprocessing and the served one read it (no
    EXIF rotation); a file PIL cannot read is a one-line error naming it."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            return int(img.size[1]), int(img.size[0])
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise UsageError(f"{path}: cannot read image ({one_line(exc)})") from exc


def read_box_labels(spec: str | Path, folder: Path, files: Sequence[Path], preprocess: Preprocess,
                    class_names: Sequence[str] = (), num_classes: int | None = None) -> BoxLabelSet:
    """The boxes of ``files`` (images under ``folder``) from ``spec`` (module docstring), each
    mapped into the input frame of ``preprocess``'s letterbox."""
    path = Path(spec)
    if preprocess.letterbox is None:
        raise OptionError("labels", f"{path}: boxes need the letterbox preprocessing (set 'letterbox' in the "
                                    "preprocessing spec, or give an Ultralytics export, whose metadata sets it)")
    if not path.exists():
        raise UsageError(f"{path}: labels not found")
    names = tuple(class_names)
    classes = len(names) if names else num_classes
    sizes = [(w, h) for h, w in map(image_hw, files)]  # (width, height), as COCO and YOLO files count
    if path.is_dir():
        raw = _yolo(path, folder, files, sizes, classes)
        kind, mapping = "YOLO txt", ""
    else:
        index = _coco(path, names, classes)
        raw = _coco_rows(index, path, folder, files, sizes)
        kind, mapping = "COCO JSON", index.mapping
    out = []
    for (cls, boxes, crowd), size in zip(raw, sizes, strict=True):
        geometry = preprocess.letterbox_geometry((size[1], size[0]))
        out.append(BoxLabels.of(cls, in_input_frame(boxes, geometry), crowd, image_region(size, geometry)))
    return BoxLabelSet(out, path, kind, mapping)


def _relative(file: Path, folder: Path) -> Path:
    """An image's path under the data folder, by which its labels are found."""
    return file.relative_to(folder) if file.is_relative_to(folder) else Path(file.name)


_Rows = list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]  # per image: classes, xyxy boxes, crowd flags


def _yolo(path: Path, folder: Path, files: Sequence[Path], sizes: Sequence[tuple[int, int]],
          classes: int | None) -> _Rows:
    if not any(path.rglob("*.txt")):
        raise UsageError(f"{path}: no .txt label files (a YOLO labels folder holds one 'class cx cy w h' file per image)")
    out: _Rows = []
    for f, size in zip(files, sizes, strict=True):
        rel = _relative(f, folder)
        txt = next((c for c in (path / rel.with_suffix(".txt"), path / f"{f.stem}.txt") if c.is_file()), None)
        if txt is None:
            out.append((np.zeros(0, np.int64), np.zeros((0, 4), np.float32), None))
            continue
        try:
            cls, boxes = yolo_txt_boxes(txt.read_text(encoding="utf-8"), size, classes)
        except UnicodeDecodeError as exc:
            raise UsageError(f"{txt}: not UTF-8 text ({one_line(exc)})") from exc
        except ValueError as exc:
            raise UsageError(f"{txt}: {exc}") from exc
        out.append((cls, boxes, None))
    return out


def _coco(path: Path, names: tuple[str, ...], classes: int | None) -> CocoIndex:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise UsageError(f"{path}: {size / 2**20:.0f} MiB, over the {MAX_JSON_BYTES >> 20} MiB a labels file may hold")
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON file ({one_line(exc)})") from exc
    try:
        return coco_index(obj, names or None, classes)
    except ValueError as exc:
        raise UsageError(f"{path}: {exc}") from exc


def _coco_rows(index: CocoIndex, path: Path, folder: Path, files: Sequence[Path],
               sizes: Sequence[tuple[int, int]]) -> _Rows:
    by_name: dict[str, list[str]] = {}
    for name in index.images:
        by_name.setdefault(Path(name).name, []).append(name)
    out: _Rows = []
    for f, size in zip(files, sizes, strict=True):
        rel = _relative(f, folder).as_posix()
        entry = index.images.get(rel)
        if entry is None and len(by_name.get(f.name, [])) == 1:
            entry = index.images[by_name[f.name][0]]
        if entry is None:
            raise UsageError(f"{path}: no entry for image '{rel}' of {folder} (every image needs one; an image "
                             "without objects is an entry without annotations)")
        if entry.size != size:
            raise UsageError(f"{path}: image '{rel}' is {entry.size[0]}x{entry.size[1]} in the labels but "
                             f"{size[0]}x{size[1]} in {folder}")
        out.append((entry.classes, entry.boxes, entry.crowd))
    return out
