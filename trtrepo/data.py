"""Data sources shared by calibration, evaluation, the PyTorch reference and the harness.

A data source is a re-iterable of :class:`Sample` (a dict ``{input name: array without batch
axis}`` plus an optional integer label). Sources come from a spec string:

* ``demo:calib`` / ``demo:val`` -- the embedded demo data (see :mod:`trtrepo.demo`);
* a folder of images (JPEG/PNG/BMP/WebP), read through a declared :class:`Preprocess`;
  images in class sub-folders get labels by sorted folder name; every file's header is checked
  when the folder is opened (:func:`scan_image_folder`), so a file that is no image is named
  before any work;
* ``file.npy`` (one array, first axis = samples) or ``file.npz`` (one key per input name,
  labels under ``labels``); loaded with ``allow_pickle=False``;
* ``package.module:callable`` -- the callable returns an iterable of arrays, dicts or
  ``(x, label)`` tuples, or a torch ``Dataset``.

Each kind is a :class:`DataSourceKind` record in the :data:`DATA_SOURCES` registry (a plug-in
adds one through the ``trtrepo.data_sources`` entry points); :func:`open_data` opens the spec
with the first kind that recognises it, binds unnamed arrays to the model's input names, applies
the deterministic subset (``limit``/``seed``) and :func:`iter_batches` stacks samples into
batches (a batch is cut where the sample shape changes, so variable sequence lengths batch
without padding).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import plugins
from .arrayfile import ArrayHeader, Pick, data_budget, npy_header, npz_headers, read_npy, read_npz, subset_rows
from .boxlabels import BoxLabelSet, is_box_labels, read_box_labels
from .contracts import builtin
from .detect import BoxLabels
from .errors import OptionError, UsageError, one_line
from .modelio import ModelIO, TensorSpec
from .plugins import Registry
from .preprocessing import Preprocess

log = logging.getLogger(__name__)
_SKIP_WARNED: set[tuple[str, str]] = set()

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
LABEL_KEYS = ("labels", "label", "y")
MAX_ITERABLE_SAMPLES = 1_000_000  # samples read from an iterable callable without --limit (and arrayfile.data_budget() bytes)
MAX_LABEL = 2**31 - 1  # the largest class index when the model does not say how many classes it has
# how errors name the settings (the command line shows the flags: --limit, --skip-non-images)
_LIMIT = "the sample limit"
_SKIP = {"skip_non_images": "skip_non_images=True"}

# --------------------------------------------------------------------------------------------
# Preprocessing


@dataclass
class Sample:
    inputs: dict[str, np.ndarray]
    label: int | None = None


@dataclass
class Batch:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    indices: np.ndarray

    @property
    def size(self) -> int:
        return len(self.indices)


class DataSource:
    """A re-iterable, sized collection of samples. Subclasses implement ``_load(i)``."""

    def __init__(self, name: str, count: int, has_labels: bool) -> None:
        self.name = name
        self._count = count
        self.has_labels = has_labels
        self._indices: np.ndarray = np.arange(count)

    def __len__(self) -> int:
        return len(self._indices)

    def __iter__(self) -> Iterator[Sample]:
        for i in self._indices:
            yield self._load(int(i))

    def _load(self, i: int) -> Sample:  # pragma: no cover - abstract
        raise NotImplementedError

    def subset(self, limit: int | None = None, seed: int | None = None) -> DataSource:
        """Deterministic subset: ``limit`` samples drawn without replacement with ``seed``
        (original order kept); the first ``limit`` when ``seed`` is None."""
        if limit is not None and limit <= 0:
            raise OptionError("limit", f"must be positive, got {limit}", concept=_LIMIT)
        n = len(self._indices)
        rows = subset_rows(n, limit, seed)
        return self.take(np.arange(n) if rows is None else rows)

    def take(self, positions: Sequence[int] | np.ndarray) -> DataSource:
        """A source of the same kind holding the samples at ``positions`` (indices into this
        source's samples, in that order); this source is unchanged."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        n = len(self._indices)
        if pos.size and (pos.min() < -n or pos.max() >= n):
            raise UsageError(f"{self.name}: sample positions out of range (the source has {n} samples)")
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone._indices = np.asarray(self._indices[pos])
        return clone

    @property
    def indices(self) -> np.ndarray:
        """Where this source's samples sit in the collection it was opened on (after ``subset``
        / ``take``), in iteration order; a copy."""
        return self._indices.copy()

    def labels(self) -> np.ndarray | None:
        if not self.has_labels:
            return None
        return np.asarray([s.label for s in self], dtype=np.int64)

    def box_labels(self) -> list[BoxLabels] | None:
        """A detector's ground-truth boxes per sample, in iteration order (``--labels`` a COCO JSON
        file or a YOLO txt folder, :mod:`trtrepo.boxlabels`); None when the data has none."""
        return None

    def sample_files(self) -> list[Path] | None:
        """The file each sample was read from, in iteration order; ``None`` when the samples do
        not come one per file (arrays, callables)."""
        return None

    def sample_names(self) -> list[str] | None:
        """Names of the samples in reports: file paths relative to the data folder."""
        files = self.sample_files()
        if files is None:
            return None
        root = Path(self.name)
        return [str(f.relative_to(root)) if f.is_relative_to(root) else str(f) for f in files]


class ArraySource(DataSource):
    """Arrays with the samples on axis 0, one per input name."""

    def __init__(self, name: str, arrays: Mapping[str | None, np.ndarray], labels: np.ndarray | None = None) -> None:
        counts = {k: len(v) for k, v in arrays.items()}
        if len(set(counts.values())) != 1:
            raise UsageError(f"{name}: arrays have different numbers of samples: {counts}")
        n = next(iter(counts.values()))
        if labels is not None:
            labels = np.asarray(labels).reshape(-1)
            if len(labels) != n:
                raise UsageError(f"{name}: {len(labels)} labels for {n} samples")
        super().__init__(name, n, labels is not None)
        self.arrays = dict(arrays)
        self._labels = labels

    def _load(self, i: int) -> Sample:
        label = None if self._labels is None else int(self._labels[i])
        return Sample({k: v[i] for k, v in self.arrays.items()}, label)  # type: ignore[misc]


def image_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as an image, from its header alone; None when it can be.

    PIL identifies the format and reads the size without decoding pixels; ``verify()`` then
    checks what the format allows without decoding (a PNG's chunk checksums). A text file named
    ``.png`` fails here, when the folder is opened, rather than when its sample is first decoded
    (which may be after an export or an hour of calibration). Damage inside the compressed pixels
    of a JPEG still shows at decoding, where :meth:`ImageFolderSource._load` names the file."""
    from PIL import Image, UnidentifiedImageError

    shown = (repr(str(path)), str(path))
    try:
        with Image.open(path) as img:
            img.verify()
    except Image.DecompressionBombError as exc:
        return f"image too large to decode safely ({one_line(exc)})"
    except UnidentifiedImageError:
        return "not an image (cannot identify image file)"
    except OSError as exc:
        if exc.errno is not None:  # the file itself: permissions, a vanished file, an I/O error
            return f"cannot read it ({exc.strerror or one_line(exc)})"
        return f"a damaged image ({_without(one_line(exc), shown)})"
    except Exception as exc:  # verify() raises what the format's parser raises (SyntaxError, struct.error, ...)
        return f"a damaged image ({_without(one_line(exc), shown)})"
    return None


def _without(text: str, shown: Sequence[str]) -> str:
    """``text`` without the file's path (the message names the file once, first)."""
    for s in shown:
        text = text.replace(f" {s}", "").replace(s, "")
    return text.strip() or "unreadable"


_CHECKED: dict[tuple[str, int, int], str | None] = {}  # (path, size, mtime_ns) -> image_problem(path)
_CHECKED_MAX = 1_000_000  # entries kept (a command opens a folder two or three times; a long session many)


def _checked_problem(path: Path) -> str | None:
    """:func:`image_problem`, once per file version in this process (a command opens its folder
    more than once: for the export's shapes, then bound to the model's inputs)."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot read it ({exc.strerror or one_line(exc)})"
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = image_problem(path)
    return _CHECKED[key]


def _skipped_names(folder: Path, bad: Sequence[tuple[Path, str | None]]) -> str:
    names = [str(p.relative_to(folder)) + (f" [{why}]" if why else "") for p, why in bad[:5]]
    return ", ".join(names) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")


def scan_image_folder(folder: Path, skip_non_images: bool = False) -> tuple[list[Path], list[Path]]:
    """The image files of ``folder`` (all levels, sorted, hidden files left out) and the files
    skipped. A file whose extension is not an image's, or whose header does not read as an image
    (:func:`image_problem`), is refused naming it (:class:`UsageError`), or with
    ``skip_non_images`` skipped and named in one warning. Every file is checked, not only those a
    ``--limit`` subset will read: the subset is drawn over the files that are images."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise UsageError(f"{folder}: image folder is empty")
    bad = _non_images(folder, files, skip_non_images)
    if not bad:
        return files, []
    skipped = {p for p, _ in bad}
    files = [p for p in files if p not in skipped]
    names = _skipped_names(folder, bad)
    if (str(folder), names) not in _SKIP_WARNED:  # a command may open the folder twice: one warning
        _SKIP_WARNED.add((str(folder), names))
        log.warning("%s: skipped %d file(s) that are not images (--skip-non-images): %s", folder, len(bad), names)
    if not files:
        raise UsageError(f"{folder}: no image file left after skipping {len(bad)} non-image file(s)")
    return files, [p for p, _ in bad]


def _non_images(folder: Path, files: list[Path], skip_non_images: bool) -> list[tuple[Path, str | None]]:
    """The files that are not images, sorted, with why (None: the extension). Decision: without
    ``skip_non_images`` the first one is an error: a wrong extension first, then a header that
    does not read as an image (the count of the others said)."""
    bad: list[tuple[Path, str | None]] = [(p, None) for p in files if p.suffix.lower() not in IMAGE_EXTENSIONS]
    if bad and not skip_non_images:
        raise OptionError("", f"{bad[0][0]}: not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)}; "
                          f"{{skip_non_images}} skips such files)", others=_SKIP)
    unreadable: list[tuple[Path, str | None]] = []
    for p in files:
        why = _checked_problem(p) if p.suffix.lower() in IMAGE_EXTENSIONS else None
        if why is not None:
            unreadable.append((p, why))
    if unreadable and not skip_non_images:
        path, why = unreadable[0]
        more = f" ({len(unreadable) - 1} more file(s) of {folder} as well)" if len(unreadable) > 1 else ""
        raise OptionError("", f"{path}: {why}{more}; {{skip_non_images}} skips such files", others=_SKIP)
    return sorted(bad + unreadable)


def check_image_folder(spec: str | Path | None, skip_non_images: bool = False,
                       preprocess: str | Path | None = None) -> list[Path]:
    """``--data`` checked before a command does any work: when ``spec`` is an image folder, every
    file is an image (:func:`scan_image_folder`); returns the files skipped. Other specs (arrays,
    callables, demo splits) are checked when they are opened. A ``preprocess`` file is read first,
    so its errors come first, in :func:`open_data`'s order."""
    if spec is None or isinstance(spec, DataSource) or not str(spec).strip() or builtin.data_spec(str(spec)) is not None:
        return []
    if not Path(spec).is_dir():
        return []
    if preprocess is not None:
        Preprocess.load(preprocess)
    return scan_image_folder(Path(spec), skip_non_images)[1]


class ImageFolderSource(DataSource):
    """Images under a folder; sub-folders are classes (labels by sorted folder name). Every file
    is checked when the folder is opened (:func:`scan_image_folder`)."""

    def __init__(self, folder: Path, preprocess: Preprocess, labels: np.ndarray | None = None,
                 skip_non_images: bool = False) -> None:
        files, self.skipped = scan_image_folder(folder, skip_non_images)
        classes = sorted({p.parent for p in files} - {folder})
        if labels is None and classes and all(p.parent != folder for p in files):
            index = {c: i for i, c in enumerate(classes)}
            labels = np.asarray([index[p.parent] for p in files], dtype=np.int64)
            self.class_names = [c.name for c in classes]
        else:
            self.class_names = []
        if labels is not None and len(labels) != len(files):
            raise UsageError(f"{folder}: {len(labels)} labels for {len(files)} images")
        super().__init__(str(folder), len(files), labels is not None)
        self.files = files
        self.preprocess = preprocess
        self._labels = labels
        self.boxes: BoxLabelSet | None = None

    def with_boxes(self, boxes: BoxLabelSet) -> ImageFolderSource:
        """This folder with ground-truth boxes per file (in the folder's file order) instead of
        class labels."""
        self.boxes, self._labels, self.has_labels, self.class_names = boxes, None, False, []
        return self

    def box_labels(self) -> list[BoxLabels] | None:
        return None if self.boxes is None else [self.boxes.labels[int(i)] for i in self._indices]

    def _load(self, i: int) -> Sample:
        from PIL import Image, UnidentifiedImageError

        path = self.files[i]
        try:
            with Image.open(path) as img:
                img.load()
                arr = self.preprocess.apply(img)
        except Image.DecompressionBombError as exc:
            raise UsageError(f"{path}: image too large to decode safely ({one_line(exc)})") from exc
        except (UnidentifiedImageError, OSError, SyntaxError) as exc:
            raise UsageError(f"{path}: cannot read image ({one_line(exc)})") from exc
        label = None if self._labels is None else int(self._labels[i])
        return Sample({self.preprocess.input_name: arr}, label)  # type: ignore[dict-item]

    def sample_files(self) -> list[Path] | None:
        return [self.files[int(i)] for i in self._indices]


class ListSource(DataSource):
    """Samples materialised from a user callable's iterable or a torch Dataset."""

    def __init__(self, name: str, items: Sequence[Sample]) -> None:
        if not items:
            raise UsageError(f"{name}: the data source yielded no samples")
        has = [s.label is not None for s in items]
        super().__init__(name, len(items), all(has))
        self.items = list(items)

    def _load(self, i: int) -> Sample:
        return self.items[i]


class DatasetSource(DataSource):
    """A map-style dataset (``__len__`` + ``__getitem__``), e.g. a torch Dataset; read lazily."""

    def __init__(self, name: str, dataset: Any) -> None:
        n = len(dataset)
        if n == 0:
            raise UsageError(f"{name}: the dataset is empty")
        first = _to_sample(dataset[0], name)
        super().__init__(name, n, first.label is not None)
        self.dataset = dataset

    def _load(self, i: int) -> Sample:
        return _to_sample(self.dataset[i], self.name)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _to_sample(item: Any, name: str) -> Sample:
    label = None
    if isinstance(item, Sample):
        return item
    if isinstance(item, tuple) and len(item) == 2:
        item, label = item
        label = int(_to_numpy(label).reshape(()))
    if isinstance(item, Mapping):
        return Sample({str(k): _to_numpy(v) for k, v in item.items()}, label)
    try:
        return Sample({None: _to_numpy(item)}, label)  # type: ignore[dict-item]
    except Exception as exc:
        raise UsageError(f"{name}: cannot turn a {type(item).__name__} into an array") from exc


# --------------------------------------------------------------------------------------------
# Resolving a spec


def _first(labels: np.ndarray | None, declared: int, pick: Pick, path: Path) -> np.ndarray | None:
    """``--labels`` for a file read as ``pick``'s rows: checked against the count the file
    declares, then cut like the arrays."""
    if labels is None:
        return None
    if len(labels) != declared:
        raise UsageError(f"{path}: {len(labels)} labels for {declared} samples")
    rows = pick(declared)
    return labels if rows is None else labels[rows]


def _class_count(io: ModelIO | None) -> int | None:
    """How many classes the model tells apart, where its outputs say it unambiguously: its only
    output is ``[batch, C]`` with a fixed ``C`` of at least 2. None otherwise."""
    if io is None or len(io.outputs) != 1:
        return None
    shape = io.outputs[0].shape
    return shape[1] if len(shape) == 2 and shape[1] >= 2 else None


def _label_error(where: str, value: object, row: int, classes: int | None) -> UsageError:
    top = classes if classes is not None else MAX_LABEL + 1
    known = f" (the model's {classes} classes)" if classes is not None else ""
    return UsageError(f"{where}: label {value} of sample {row} is not a class index: labels are whole numbers "
                      f"from 0 to {top - 1}{known}")


def _checked_labels(values: np.ndarray, where: str, classes: int | None, rows: np.ndarray | None = None) -> np.ndarray:
    """``values`` as int64 class indices: whole numbers from 0 to ``classes - 1`` (to
    :data:`MAX_LABEL` when the model does not say). ``rows``: the file's row of each value (for the
    message), when they are a subset of the file's."""
    values = np.asarray(values).reshape(-1)
    top = classes if classes is not None else MAX_LABEL + 1
    with np.errstate(invalid="ignore"):
        bad = (values < 0) | (values >= top)
        if values.dtype.kind == "f":
            bad |= ~np.isfinite(values) | (np.round(values) != values)
    if bad.any():
        i = int(np.argmax(bad))
        value = values[i].item()
        shown = int(value) if isinstance(value, float) and value.is_integer() else value
        raise _label_error(where, shown, i if rows is None else int(rows[i]), classes)
    return values.astype(np.int64)


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a folder, else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def _load_labels(path: str | Path, classes: int | None) -> np.ndarray:
    """``--labels``: an ``.npy`` array or a text file of whole numbers, checked as class indices."""
    p = Path(path)
    kind = _not_regular(p)
    if kind is not None:
        raise UsageError(f"{p}: the labels file is {kind}, not a regular file")
    if not p.is_file():
        raise UsageError(f"{p}: labels file not found")
    if p.suffix == ".npy":
        return _checked_labels(read_npy(p), str(p), classes)
    try:
        ints = [int(line) for line in p.read_text().split()]
    except ValueError as exc:
        raise UsageError(f"{p}: labels must be integers, one per sample ({one_line(exc)})") from exc
    top = classes if classes is not None else MAX_LABEL + 1
    bad = next((i for i, v in enumerate(ints) if not 0 <= v < top), None)
    if bad is not None:
        raise _label_error(str(p), ints[bad], bad, classes)
    return np.asarray(ints, dtype=np.int64)


def import_callable(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(f"'{spec}': expected 'package.module:callable'")
    if "" not in sys.path and "." not in sys.path and os.getcwd() not in sys.path:
        # the user's working directory, last: its files never shadow installed modules
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"'{spec}': cannot import module '{module_name}' ({type(exc).__name__}: {exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"'{spec}': module '{module_name}' has no attribute '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"'{spec}': '{attr}' is not callable")
    return obj  # type: ignore[no-any-return]


def _looks_like_entry_point(spec: str) -> bool:
    mod, sep, attr = spec.partition(":")
    return bool(sep) and bool(attr) and "/" not in mod and "\\" not in mod and all(
        p.isidentifier() for p in mod.split(".")
    )


# --------------------------------------------------------------------------------------------
# Data source kinds: a registry, like calibration methods and backends (trtrepo.plugins)


@dataclass(frozen=True)
class DataRequest:
    """What opening a data spec is given: the spec (and the path it names), the settings of
    :func:`open_data`, the labels file (as given and as read) and the model's class count."""

    spec: str
    path: Path
    preprocess: Preprocess | None
    labels: str | Path | None
    label_array: np.ndarray | None
    io: ModelIO | None
    classes: int | None
    limit: int | None
    seed: int | None
    skip_non_images: bool


@dataclass(frozen=True)
class DataSourceKind:
    """A kind of data spec. ``recognises(request)``: whether the spec is of this kind (kinds are
    tried in registration order: trtrepo's own, then the plug-ins'; the first that recognises
    opens); ``open(request)``: its :class:`DataSource` (:func:`open_data` then binds the model's
    input names and takes the subset). ``reads_path``: the kind reads the file system (a path that
    is not a regular file or a folder is refused before such a kind is tried). ``catch_all``: the
    kind takes any spec of a broad form (``module:callable`` takes every ``word:rest`` that is no
    file), so it is tried after every other kind, plug-ins' included (a plug-in's ``s3://`` is
    not taken for a module)."""

    name: str
    recognises: Callable[[DataRequest], bool]
    open: Callable[[DataRequest], DataSource]
    reads_path: bool = True
    catch_all: bool = False


DATA_SOURCES: Registry[DataSourceKind] = Registry(plugins.DATA_SOURCES, "data source kind", DataSourceKind,
                                                  lambda k: k.name)


def open_data(
    spec: str | DataSource,
    *,
    io: ModelIO | None = None,
    preprocess: Preprocess | str | Path | None = None,
    labels: str | Path | None = None,
    limit: int | None = None,
    seed: int | None = None,
    skip_non_images: bool = False,
) -> DataSource:
    """Resolve a data spec into a :class:`DataSource` bound to ``io``'s input names.
    ``skip_non_images``: an image folder's files without an image extension are skipped (and
    named in a warning) instead of refused."""
    if isinstance(spec, DataSource):
        source = spec
    else:
        if isinstance(preprocess, (str, Path)):
            preprocess = Preprocess.load(preprocess)
        if limit is not None and limit <= 0:
            raise OptionError("limit", f"must be positive, got {limit}", concept=_LIMIT)
        source = _open_spec(str(spec), preprocess, labels, io, limit, skip_non_images, seed)
    if labels is not None and isinstance(spec, DataSource):
        raise OptionError("labels", "cannot be combined with an in-memory data source")
    source = _bind_names(source, io)
    if limit is not None and limit > len(source):
        log.warning("--limit %d: %s holds %d samples; all of them are used", limit, source.name, len(source))
    return source.subset(limit, seed)


def _open_spec(spec: str, preprocess: Preprocess | None, labels: str | Path | None, io: ModelIO | None,
               limit: int | None = None, skip_non_images: bool = False, seed: int | None = None) -> DataSource:
    """The source of the first registered kind (:data:`DATA_SOURCES`) that recognises ``spec``."""
    if not spec.strip():
        raise UsageError("an empty data spec (expected a folder, .npy, .npz, 'module:callable' or demo:SPLIT)")
    classes = _class_count(io)
    boxes = labels is not None and is_box_labels(labels)
    label_array = _load_labels(labels, classes) if labels is not None and not boxes else None
    request = DataRequest(spec, Path(spec), preprocess, labels, label_array, io, classes, limit, seed, skip_non_images)
    kind = data_source_kind(request)
    if boxes and kind is not IMAGE_FOLDER:
        raise OptionError("labels", f"{labels}: boxes (a COCO JSON file or a YOLO txt folder) go with an image folder "
                                    f"as the data, not '{spec}'")
    if kind is not None:
        return kind.open(request)
    if not request.path.exists():
        raise UsageError(f"{spec}: data not found (expected a folder, .npy, .npz, 'module:callable' or demo:SPLIT)")
    raise UsageError(f"{spec}: unsupported data file type '{request.path.suffix}' (expected a folder, .npy or .npz)")


def data_source_kind(request: DataRequest) -> DataSourceKind | None:
    """The first registered kind that recognises the request's spec, or None. Decision: before the
    first kind that reads the file system, a path that exists but is neither a regular file nor a
    folder (a FIFO, a device) is refused, so no kind ever blocks reading one."""
    guarded = False
    for kind in sorted(DATA_SOURCES.values(), key=lambda k: k.catch_all):  # stable: registration order
        if kind.reads_path and not guarded:
            what = _not_regular(request.path)
            if what is not None:
                raise UsageError(f"{request.path}: {what}, not a regular file or a folder (the data is a folder, .npy, "
                                 f".npz, 'module:callable' or demo:SPLIT)")
            guarded = True
        if kind.recognises(request):
            return kind
    return None


def _open_builtin(request: DataRequest) -> DataSource:
    found = builtin.data_spec(request.spec)
    if found is None:  # only when called for a spec this kind did not recognise
        raise UsageError(f"{request.spec}: not a built-in model's data (expected NAME or NAME:SPLIT)")
    plugin, split = found
    if request.label_array is not None:
        raise OptionError("labels", f"cannot be combined with the {plugin.name} data (it has its own labels)")
    return plugin.open_data(split)


def _is_array_file(request: DataRequest) -> bool:
    return request.path.suffix.lower() in (".npy", ".npz")


def _is_entry_point(request: DataRequest) -> bool:
    return _looks_like_entry_point(request.spec) and not request.path.exists()


def _open_labelled_entry_point(request: DataRequest) -> DataSource:
    """A ``module:callable``'s data, with the labels file's labels when one is given."""
    src = _open_entry_point(request.spec, request.limit)
    labels = request.label_array
    if labels is None:
        return src
    if len(labels) != len(src):
        raise UsageError(f"{request.labels}: {len(labels)} labels for {len(src)} samples")
    return ListSource(request.spec, [Sample(s.inputs, int(lab)) for s, lab in zip(src, labels, strict=True)])


def _open_image_folder(request: DataRequest) -> DataSource:
    """An image folder, read through ``preprocess`` (required). Decision: a spec that names no
    input feeds the model's only one (a model with several is refused)."""
    path, preprocess, io = request.path, request.preprocess, request.io
    if preprocess is None:
        raise OptionError("", f"{path}: an image folder needs a preprocessing spec ({{preprocess}} FILE)",
                          others={"preprocess": "preprocess"})
    if preprocess.input_name is None and io is not None:
        if len(io.inputs) != 1:
            raise UsageError(f"{path}: the model has several inputs; set 'input_name' in the preprocessing spec")
        preprocess = Preprocess(**{**preprocess.__dict__, "input_name": io.inputs[0].name})
    source = ImageFolderSource(path, preprocess, request.label_array, request.skip_non_images)
    if request.labels is not None and is_box_labels(request.labels):
        boxes = read_box_labels(request.labels, path, source.files, preprocess,
                                io.class_names if io is not None else ())
        log.info("box labels: %s", boxes.describe())
        return source.with_boxes(boxes)
    return source


def _open_array_file(request: DataRequest) -> DataSource:
    """A .npy or .npz file, only the rows of the subset (the request's limit and seed) read."""
    path, io, label_array = request.path, request.io, request.label_array
    if not path.is_file():
        raise UsageError(f"{path}: data file not found")

    def pick(n: int) -> np.ndarray | None:
        return subset_rows(n, request.limit, request.seed)

    if path.suffix.lower() == ".npy":
        return _open_npy(path, io, pick, label_array)
    return _open_npz(path, io, pick, label_array, request.classes)


def _open_entry_point(spec: str, limit: int | None) -> DataSource:
    """The data a ``module:callable`` returns. Decision: a sized, indexable result (not a list or
    tuple) is a dataset read by index; any other iterable is read lazily up to ``limit`` (no
    random access), or up to the sample and byte budgets without one."""
    fn = import_callable(spec)
    try:
        result = fn()
    except Exception as exc:
        raise UsageError(f"'{spec}': calling the data callable failed ({type(exc).__name__}: {exc})") from exc
    if hasattr(result, "__len__") and hasattr(result, "__getitem__") and not isinstance(result, (list, tuple)):
        return DatasetSource(spec, result)
    if not isinstance(result, Iterable):
        raise UsageError(f"'{spec}': the callable returned a {type(result).__name__}, not an iterable or dataset")
    cap = limit if limit is not None else MAX_ITERABLE_SAMPLES + 1
    items, total = [], 0
    for item in itertools.islice(result, cap):
        items.append(_to_sample(item, spec))
        total += sum(int(np.asarray(v).nbytes) for v in items[-1].inputs.values())
        if limit is None and (len(items) > MAX_ITERABLE_SAMPLES or total > data_budget()):
            raise OptionError("", f"'{spec}': the callable yields more than "
                              f"{min(len(items) - 1, MAX_ITERABLE_SAMPLES)} samples "
                              f"({total / 2**30:.1f} GiB so far); give {{limit}} (an iterable is read up to "
                              f"{{limit}}, first samples first)", others={"limit": _LIMIT})
    return ListSource(spec, items)


BUILTIN_DATA = DATA_SOURCES.register(DataSourceKind(
    "builtin", lambda r: builtin.data_spec(r.spec) is not None, _open_builtin, reads_path=False))  # NAME[:SPLIT]
IMAGE_FOLDER = DATA_SOURCES.register(DataSourceKind(
    "image_folder", lambda r: r.path.is_dir(), _open_image_folder))
ARRAY_FILE = DATA_SOURCES.register(DataSourceKind(
    "array_file", _is_array_file, _open_array_file))
ENTRY_POINT = DATA_SOURCES.register(DataSourceKind(
    "entry_point", _is_entry_point, _open_labelled_entry_point, catch_all=True))


def _check_rows(h: ArrayHeader, spec: TensorSpec) -> None:
    """Samples of ``h``'s shape fit ``spec`` (its axes after the first; -1 takes any size): checked
    on the header, before a byte of the array is read (:meth:`ModelIO.check_feed` checks batches
    the same way)."""
    got, want = h.shape[1:], spec.shape[1:]
    if h.shape and (len(got) != len(want) or any(w != -1 and g != w for g, w in zip(got, want, strict=True))):
        raise UsageError(f"{h.where}: samples of shape {list(got)} do not fit input '{spec.name}' of the model, "
                         f"whose samples are {list(want)} (-1: any size)")


def _open_npy(path: Path, io: ModelIO | None, pick: Pick, labels: np.ndarray | None) -> ArraySource:
    """One array, the samples of the model's only input."""
    header = npy_header(path)
    if io is not None and len(io.inputs) == 1:
        _check_rows(header, io.inputs[0])
    array = read_npy(path, pick)
    labels = _first(labels, header.samples or 0, pick, path)
    return ArraySource(str(path), {None: array}, labels)  # type: ignore[dict-item]


def _npz_keys(path: Path, headers: Mapping[str, ArrayHeader], io: ModelIO | None) -> tuple[dict[str, str | None], str | None]:
    """Which model input each key of an npz feeds (None: the only input, bound later) and its
    labels key; decided on the headers, so a key that feeds nothing is refused before it is inflated."""
    label_key = next((k for k in LABEL_KEYS if k in headers and (io is None or k not in io.input_names)), None)
    keys = [k for k in headers if k != label_key]
    if not keys:
        raise UsageError(f"{path}: the npz file holds no input arrays")
    if io is None:
        return {k: k for k in keys}, label_key
    if len(keys) == 1 and keys[0] not in io.input_names and len(io.inputs) == 1:
        log.warning("%s: key '%s' is not an input name; its array feeds the model's only input '%s'", path, keys[0],
                    io.input_names[0])
        _check_rows(headers[keys[0]], io.inputs[0])
        return {keys[0]: None}, label_key
    unknown = [k for k in keys if k not in io.input_names]
    if unknown:
        raise UsageError(f"{path}: key '{unknown[0]}' is not an input of the model (inputs: "
                         f"{', '.join(io.input_names)}; labels go under one of {', '.join(LABEL_KEYS)})")
    for k in keys:
        _check_rows(headers[k], io.input(k))
    return {k: k for k in keys}, label_key


def _open_npz(path: Path, io: ModelIO | None, pick: Pick, labels: np.ndarray | None,
              classes: int | None) -> ArraySource:
    """One array per input (keys named after the inputs) and labels under one of :data:`LABEL_KEYS`."""
    headers = npz_headers(path)
    inputs, label_key = _npz_keys(path, headers, io)
    keys = [*inputs, *([label_key] if label_key is not None and labels is None else [])]
    arrays, declared = read_npz(path, pick, keys)
    labels = _first(labels, declared, pick, path)
    if labels is None and label_key is not None:
        labels = _checked_labels(arrays[label_key], headers[label_key].where, classes, pick(declared))
    return ArraySource(str(path), {name: arrays[k] for k, name in inputs.items()}, labels)  # type: ignore[misc]


class _BoundSource(DataSource):
    """Renames unnamed (``None``) sample inputs to the model's single input name."""

    def __init__(self, inner: DataSource, name: str) -> None:
        super().__init__(inner.name, len(inner), inner.has_labels)
        self.inner = inner
        self.input_name = name
        self.preprocess = getattr(inner, "preprocess", None)

    def _load(self, i: int) -> Sample:
        s = self.inner._load(int(self.inner._indices[i]))
        return Sample({self.input_name if k is None else k: v for k, v in s.inputs.items()}, s.label)

    def sample_files(self) -> list[Path] | None:
        files = self.inner.sample_files()
        return None if files is None else [files[int(i)] for i in self._indices]

    def box_labels(self) -> list[BoxLabels] | None:
        boxes = self.inner.box_labels()
        return None if boxes is None else [boxes[int(i)] for i in self._indices]


def _bind_names(source: DataSource, io: ModelIO | None) -> DataSource:
    if len(source) == 0:
        raise UsageError(f"{source.name}: the data source is empty")
    first = next(iter(source))
    if None not in first.inputs:
        return source
    if io is None:
        return _BoundSource(source, "input")
    if len(io.inputs) != 1:
        raise UsageError(
            f"{source.name}: unnamed data but the model has {len(io.inputs)} inputs "
            f"({', '.join(io.input_names)}); use an npz with one key per input"
        )
    return _BoundSource(source, io.inputs[0].name)


# --------------------------------------------------------------------------------------------
# Batching


def iter_batches(source: Iterable[Sample], batch_size: int, io: ModelIO | None = None) -> Iterator[Batch]:
    """Stack samples into batches of up to ``batch_size``. A batch is cut early where a sample's
    shapes differ from the batch's (variable sequence lengths). When ``io`` is given, each batch
    is checked against it and cast to the model's input dtypes; errors name the tensor.

    A model whose batch is fixed (``io.fixed_batch``: an export with a static axis 0) gets batches
    of exactly that size whatever ``batch_size`` says, so that calibration, the held-out checks,
    weight rounding and the speed figure all run it; samples left over that cannot fill a batch are
    skipped, with a warning (none at batch 1)."""
    if batch_size <= 0:
        raise OptionError("batch_size", f"must be positive, got {batch_size}")
    fixed = io.fixed_batch if io is not None else None
    batch_size = fixed or batch_size
    skipped = 0
    pending: list[Sample] = []
    indices: list[int] = []
    key: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    position = 0

    def flush() -> Batch:
        inputs = {name: np.stack([s.inputs[name] for s in pending]) for name in pending[0].inputs}
        for name, arr in inputs.items():  # Inf/NaN would turn into NaN ranges far downstream
            if arr.dtype.kind not in "biuf":  # a complex cast to the model's dtype would drop its imaginary part
                raise UsageError(f"input '{name}' of sample {indices[0]}: the data is of dtype {arr.dtype}, not "
                                 f"real numbers (bool, integer or floating point)")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                bad = int(np.argwhere(~np.isfinite(arr).reshape(len(arr), -1).all(axis=1))[0][0])
                raise UsageError(f"input '{name}' of sample {indices[bad]}: holds Inf or NaN values")
        if io is not None:
            io.check_feed(inputs, where=f"samples {indices[0]}..{indices[-1]}")
            inputs = {name: arr.astype(io.input(name).dtype, copy=False) for name, arr in inputs.items()}
        labels = None
        if all(s.label is not None for s in pending):
            labels = np.asarray([s.label for s in pending], dtype=np.int64)
        return Batch(inputs, labels, np.asarray(indices))

    for sample in source:
        k = tuple(sorted((name, np.shape(a)) for name, a in sample.inputs.items()))
        if pending and (k != key or len(pending) == batch_size):
            if fixed is None or len(pending) == fixed:
                yield flush()
            else:
                skipped += len(pending)
            pending, indices = [], []
        key = k
        pending.append(sample)
        indices.append(position)
        position += 1
    if pending and (fixed is None or len(pending) == fixed):
        yield flush()
    elif pending:
        skipped += len(pending)
    if skipped:
        log.warning("%s: the model's batch is fixed at %d: %d of %d samples that cannot fill a batch are not used",
                    getattr(source, "name", "data"), fixed, skipped, position)


def collect(source: DataSource, batch_size: int = 64, io: ModelIO | None = None) -> dict[str, np.ndarray]:
    """All samples as arrays (small data sets only: tests, evaluation of a validation split)."""
    parts: dict[str, list[np.ndarray]] = {}
    for batch in iter_batches(source, batch_size, io):
        for k, v in batch.inputs.items():
            parts.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in parts.items()}


@dataclass
class DataOptions:
    """The data options every command shares (``--data --preprocess --labels --limit --seed``)."""

    spec: str
    preprocess: str | Preprocess | None = None  # a spec file, or the spec itself (an exporter's letterbox)
    labels: str | None = None
    limit: int | None = None
    seed: int | None = 0
    batch_size: int = 32
    extra: dict[str, Any] = field(default_factory=dict)
    skip_non_images: bool = False

    def open(self, io: ModelIO | None = None) -> DataSource:
        return open_data(self.spec, io=io, preprocess=self.preprocess, labels=self.labels, limit=self.limit, seed=self.seed,
                         skip_non_images=self.skip_non_images)

    def labels_beside(self, eval_data: Any) -> tuple[DataOptions, str | None]:
        """(these options for the calibration data, the labels the evaluation data takes).
        Decision: box labels (a COCO JSON file or a YOLO txt folder) describe the images that are
        judged, so with separate evaluation data (a spec) they go with it; a classifier's integer
        labels, one per sample of this data, stay here."""
        if not isinstance(eval_data, str) or self.labels is None or not is_box_labels(self.labels):
            return self, None
        return replace(self, labels=None), str(self.labels)
