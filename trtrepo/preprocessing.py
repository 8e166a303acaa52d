"""Declared image preprocessing (:class:`Preprocess`: resize, centre crop or letterbox, layout,
scaling, mean/std) shared by image-folder data, the ensemble's preprocessing model and ``trtrepo
preprocess``; with the bounds that keep one decoded image within a memory budget."""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from .detect import letterbox_params
from .errors import UsageError, one_line
from .fsutil import atomic_write_text
from .modelio import load_onnx

MAX_IMAGE_SIDE = 16384  # resize / center_crop sides (a 16384 x 16384 RGB float image is 3 GiB)
MAX_IMAGE_PIXELS_ENV = "TRTREPO_MAX_IMAGE_PIXELS"
MAX_IMAGE_PIXELS = 4096 * 4096  # per resized image: 192 MiB as RGB float32 (--resize 16384 of a 4:3 photo: 4.3 GiB)


def _pixel_budget() -> int:
    """Pixels one resized image may hold: ``$TRTREPO_MAX_IMAGE_PIXELS`` or :data:`MAX_IMAGE_PIXELS`."""
    text = os.environ.get(MAX_IMAGE_PIXELS_ENV)
    if not text:
        return MAX_IMAGE_PIXELS
    if not text.isdigit() or int(text) <= 0:
        raise UsageError(f"{MAX_IMAGE_PIXELS_ENV}={text!r}: expected a positive whole number of pixels")
    return int(text)


def _positive_ints(value: Any, what: str, n: tuple[int, ...]) -> tuple[int, ...] | None:
    """A size option as ``len in n`` positive ints of at most MAX_IMAGE_SIDE (an int alone is
    one); None stays None."""
    if value is None:
        return None
    try:
        vals = (int(value),) if isinstance(value, (int, float)) else tuple(int(v) for v in value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"preprocess option '{what}': expected positive ints, got {value!r}") from None
    if len(vals) not in n or any(v <= 0 for v in vals):
        raise UsageError(f"preprocess option '{what}': expected {' or '.join(map(str, n))} positive ints, got {value!r}")
    if any(v > MAX_IMAGE_SIDE for v in vals):
        raise UsageError(f"preprocess option '{what}': {value!r} is larger than {MAX_IMAGE_SIDE} pixels per side")
    return vals


def _square(vals: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """One side given for a box: the square."""
    return (vals[0], vals[0]) if vals is not None and len(vals) == 1 else vals


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes an input tensor. Saved to and loaded from JSON or YAML.

    Steps, in order: convert to ``color`` (rgb, bgr or gray), resize (``resize`` = shorter side
    when one int, or ``[height, width]``), center crop, to float, multiply by ``scale``,
    subtract ``mean`` and divide by ``std`` per channel, lay out as ``NCHW`` or ``NHWC``
    (``CHW``/``HWC`` per sample) and cast to ``dtype``.

    ``letterbox`` (``[height, width]``, or one int for a square) replaces resize and crop, as a
    detector's input wants it (Ultralytics' ``LetterBox(auto=False)``): the image scaled by ``r =
    min(H / h, W / w)`` (up or down, aspect ratio kept) to ``round(h r) x round(w r)`` with
    ``interpolation``, centred on an ``H x W`` canvas filled with ``pad_value`` (raw pixel units,
    before ``scale``: 114 is Ultralytics' grey). The placement is
    :func:`trtrepo.detect.letterbox_params`, which :meth:`letterbox_geometry` returns so that boxes
    map back to the original image (:func:`trtrepo.detect.unletterbox`). PIL resizes here where
    Ultralytics calls OpenCV: the geometry is the same, the interpolated pixels differ slightly.
    """

    resize: tuple[int, ...] | None = None
    center_crop: tuple[int, int] | None = None
    interpolation: str = "bilinear"
    color: str = "rgb"
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    layout: str = "NCHW"
    dtype: str = "float32"
    input_name: str | None = None
    letterbox: tuple[int, int] | None = None
    pad_value: int = 114

    _INTERP = ("nearest", "bilinear", "bicubic", "lanczos")

    def __post_init__(self) -> None:
        self._check_types()
        object.__setattr__(self, "resize", _positive_ints(self.resize, "resize", (1, 2)))
        object.__setattr__(self, "center_crop", _square(_positive_ints(self.center_crop, "center_crop", (1, 2))))
        box = _square(_positive_ints(self.letterbox, "letterbox", (1, 2)))
        object.__setattr__(self, "letterbox", box)
        if box is not None and (self.resize is not None or self.center_crop is not None):
            raise UsageError("preprocess option 'letterbox': excludes 'resize' and 'center_crop' (it resizes and pads "
                             "the image itself)")
        if isinstance(self.pad_value, bool) or not isinstance(self.pad_value, numbers.Integral) or not 0 <= self.pad_value <= 255:
            raise UsageError(f"preprocess option 'pad_value': expected a whole number 0..255, got {self.pad_value!r}")
        object.__setattr__(self, "pad_value", int(self.pad_value))
        object.__setattr__(self, "mean", tuple(float(v) for v in np.atleast_1d(self.mean)))
        object.__setattr__(self, "std", tuple(float(v) for v in np.atleast_1d(self.std)))
        self._check_choices()

    def _check_types(self) -> None:
        """Each option of the right type: a finite real scale, strings, finite mean/std numbers."""
        if isinstance(self.scale, bool) or not isinstance(self.scale, numbers.Real) or not np.isfinite(self.scale):
            raise UsageError(f"preprocess option 'scale': expected a finite number, got {self.scale!r}")
        for what in ("interpolation", "color", "layout", "dtype"):
            if not isinstance(getattr(self, what), str):
                raise UsageError(f"preprocess option '{what}': expected a string, got {getattr(self, what)!r}")
        if self.input_name is not None and not isinstance(self.input_name, str):
            raise UsageError(f"preprocess option 'input_name': expected a string, got {self.input_name!r}")
        for what in ("mean", "std"):
            values = getattr(self, what)
            flat = list(values) if isinstance(values, (list, tuple, np.ndarray)) else [values]
            if not flat or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) for v in flat):
                raise UsageError(f"preprocess option '{what}': expected finite numbers, got {values!r}")

    def _check_choices(self) -> None:
        """Each named choice one of its values; std non-zero; 1 or one-per-channel mean/std values."""
        if self.interpolation not in self._INTERP:
            raise UsageError(f"preprocess option 'interpolation': '{self.interpolation}' is not one of {', '.join(self._INTERP)}")
        if self.color not in ("rgb", "bgr", "gray"):
            raise UsageError(f"preprocess option 'color': '{self.color}' is not one of rgb, bgr, gray")
        if self.layout not in ("NCHW", "NHWC"):
            raise UsageError(f"preprocess option 'layout': '{self.layout}' is not one of NCHW, NHWC")
        if self.dtype not in ("float32", "float16", "uint8", "int8"):
            raise UsageError(f"preprocess option 'dtype': '{self.dtype}' is not one of float32, float16, uint8, int8")
        if any(s == 0 for s in self.std):
            raise UsageError("preprocess option 'std': values must be non-zero")
        channels = self.channels
        for what in ("mean", "std"):
            if len(getattr(self, what)) not in (1, channels):
                raise UsageError(f"preprocess option '{what}': expected 1 or {channels} values for color '{self.color}'")

    @property
    def channels(self) -> int:
        return 1 if self.color == "gray" else 3

    def letterbox_geometry(self, image_hw: tuple[int, int]) -> tuple[float, float, float]:
        """``(scale, pad_x, pad_y)`` of an ``image_hw = (height, width)`` image under
        ``letterbox`` (:func:`trtrepo.detect.letterbox_params`); a UsageError without it."""
        if self.letterbox is None:
            raise UsageError("preprocess option 'letterbox': not set, so there is no letterbox geometry")
        return letterbox_params(image_hw, self.letterbox)

    def _check_budget(self, image: Any, what: str, size: tuple[int, ...], h: int, w: int) -> None:
        budget = _pixel_budget()
        if w * h > budget:
            name = getattr(image, "filename", "") or "an image"
            raise UsageError(f"preprocess option '{what}': {list(size)} makes {name} {h}x{w} "
                             f"({w * h / 1e6:.1f} M pixels), over the budget of {budget / 1e6:.1f} M pixels per "
                             f"image (set {MAX_IMAGE_PIXELS_ENV} to raise it)")

    def _letterboxed(self, image: Any, img: Any, resample: Any, size: tuple[int, int]) -> Any:
        """``img`` (``image`` converted) scaled and centred on a ``size`` canvas (class docstring)."""
        from PIL import Image

        out_h, out_w = size
        w0, h0 = img.size
        self._check_budget(image, "letterbox", size, out_h, out_w)
        r, pad_x, pad_y = letterbox_params((h0, w0), size)
        new_w, new_h = max(1, round(w0 * r)), max(1, round(h0 * r))
        if (new_w, new_h) != (w0, h0):
            img = img.resize((new_w, new_h), resample=resample)
        fill = self.pad_value if img.mode == "L" else (self.pad_value,) * len(img.getbands())
        canvas = Image.new(img.mode, (out_w, out_h), fill)
        canvas.paste(img, (int(pad_x), int(pad_y)))
        return canvas

    def apply(self, image: Any) -> np.ndarray:
        """PIL image -> array laid out per sample (``CHW`` or ``HWC``)."""
        from PIL import Image

        img = image.convert("L" if self.color == "gray" else "RGB")
        resample = getattr(Image.Resampling, self.interpolation.upper())
        if self.letterbox is not None:
            img = self._letterboxed(image, img, resample, self.letterbox)
        if self.resize is not None:
            if len(self.resize) == 2:
                h, w = self.resize
            else:
                short = self.resize[0]
                w0, h0 = img.size
                if w0 <= h0:
                    w, h = short, max(1, round(h0 * short / w0))
                else:
                    h, w = short, max(1, round(w0 * short / h0))
            self._check_budget(image, "resize", self.resize, h, w)
            img = img.resize((w, h), resample=resample)
        if self.center_crop is not None:
            ch, cw = self.center_crop
            w0, h0 = img.size
            if ch > h0 or cw > w0:
                raise UsageError(f"preprocess option 'center_crop': {ch}x{cw} is larger than the resized image {h0}x{w0}")
            left, top = (w0 - cw) // 2, (h0 - ch) // 2
            img = img.crop((left, top, left + cw, top + ch))
        arr: np.ndarray = np.asarray(img, dtype=np.float32)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if self.color == "bgr":
            arr = arr[:, :, ::-1]
        arr = arr * np.float32(self.scale)
        arr = (arr - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "NCHW":
            arr = arr.transpose(2, 0, 1)
        if self.dtype in ("uint8", "int8"):
            info = np.iinfo(self.dtype)
            arr = np.clip(np.rint(arr), info.min, info.max)
        return np.ascontiguousarray(arr.astype(self.dtype))

    # --- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "preprocess") -> Preprocess:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{source}: unknown preprocess option(s): {', '.join(unknown)}")
        return cls(**dict(data))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        if p.suffix.lower() in (".yaml", ".yml"):
            import yaml

            text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        else:
            text = json.dumps(self.to_dict(), indent=2) + "\n"
        atomic_write_text(p, text)
        return p

    @classmethod
    def load(cls, path: str | Path) -> Preprocess:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"{p}: preprocessing file not found")
        kind = "YAML" if p.suffix.lower() in (".yaml", ".yml") else "JSON"
        try:
            text = p.read_text()
            if kind == "YAML":
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except Exception as exc:  # not UTF-8, not JSON / YAML, unreadable: one line, no exception name
            raise UsageError(f"{p}: cannot parse preprocessing file (not {kind}: {one_line(exc)})") from exc
        if not isinstance(data, dict):
            raise UsageError(f"{p}: preprocessing file must hold a mapping of options")
        return cls.from_dict(data, source=str(p))


# --------------------------------------------------------------------------------------------
# Samples and sources


def exporter_preprocess(source: str | Path) -> Preprocess | None:
    """The preprocessing an ONNX file's exporter declares: a detector exported by Ultralytics
    (metadata ``task`` detect/segment/pose and ``imgsz``) takes RGB images letterboxed to ``imgsz``
    (gray 114 padding) over 255, NCHW -- what its own predictor does. None for other sources.
    ``deploy`` writes a detector's ensemble with it and ``validate`` runs the reference with it,
    when no spec is given."""
    path = Path(source)
    if path.suffix.lower() != ".onnx" or not path.is_file():
        return None
    meta = {p.key: p.value for p in load_onnx(path, load_weights=False).metadata_props}
    if meta.get("task") not in ("detect", "segment", "pose") or "imgsz" not in meta:
        return None
    try:
        size = [int(v) for v in meta["imgsz"].strip("[]() ").split(",")]
    except ValueError:
        return None
    return Preprocess(letterbox=(size[0], size[-1]), scale=1.0 / 255.0, color="rgb", layout="NCHW")
