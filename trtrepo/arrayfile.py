"""Bounded reads of ``.npy`` and ``.npz`` files (the data given with ``--data``/``--labels``).

Decisions:

* **The headers decide before any data is read.** Each array's shape and dtype come from its
  ``.npy`` header (in an ``.npz``, inflated from the start of its zip member and no further):
  :func:`npz_headers` gives every key's :class:`ArrayHeader`, so the caller can refuse a key that
  is not one of the model's inputs, or rows of a shape the model cannot take, before a byte of
  data is inflated. An object dtype (a pickle), a dtype that is not a real number (strings,
  records, complex numbers, dates) or a header that cannot be parsed is refused with the file and
  key named.
* **One byte budget per file.** What reading holds at its peak (each key's picked rows; a whole
  Fortran-order array and the rows cut from it) is added up over every key read and checked
  against :func:`data_budget` (2 GiB, ``$TRTREPO_MAX_DATA_MIB``) before anything is inflated, the
  bound that ``--data module:callable`` samples are held to as well. A 4 MB zip whose keys or rows
  inflate to gigabytes is refused from its headers; one within the budget that this machine still
  cannot hold is a ``MemoryError`` turned into a line naming the file and key.
* **Only the rows asked for are held.** ``pick`` maps the declared sample count to the sorted
  rows to keep (``--limit``'s subset) or None (all). A C-order array is streamed up to its last
  picked row (``zipfile`` inflates a member as a stream) in pieces of at most :data:`CHUNK_BYTES`,
  written straight into the rows kept (a row larger than a piece is filled piece by piece, an
  unpicked one read and dropped piece by piece): the first ``--limit`` rows inflate nothing beyond
  them; a random subset inflates up to its last row but holds ``--limit`` rows. A Fortran-order
  array is read whole (its rows are not contiguous), within the same budget.
* **A long read says so.** Streaming that goes on past :data:`PROGRESS_AFTER_S` seconds writes a
  status line (:func:`trtrepo.progress.status`) every :data:`PROGRESS_EVERY_S` seconds: the file,
  the megabytes read and the total to read.
* All arrays of one file must declare the same number of samples (axis 0); that is checked on the
  headers, so a prefix read cannot hide a mismatch.
"""

from __future__ import annotations

import math
import os
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from .errors import OptionError, UsageError, one_line
from .progress import status

MAX_DATA_BYTES = 2 * 2**30  # bytes one data file may bring into memory: every key's picked rows together
MAX_DATA_ENV = "TRTREPO_MAX_DATA_MIB"
CHUNK_BYTES = 16 * 2**20  # bytes of rows streamed at a time while picking rows ...
READ_BYTES = 2**20  # ... in reads of this size (zipfile joins what it inflates: a read costs about 3 times its size)
PROGRESS_AFTER_S = 3.0  # a read still going after this many seconds writes a status line ...
PROGRESS_EVERY_S = 5.0  # ... and another one this often
_PICKLE = "an object array (a pickle); trtrepo reads plain numeric arrays, never pickles"
_NOT_REAL = {"c": "complex numbers", "U": "strings", "S": "byte strings", "V": "records", "M": "dates", "m": "time spans"}
# what zipfile and zlib raise on a damaged, encrypted or oddly compressed member
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError)

Pick = Callable[[int], "np.ndarray | None"]  # declared samples -> sorted rows to keep, None: all


def data_budget() -> int:
    """Bytes one data file (or a callable's samples) may bring into memory: ``$TRTREPO_MAX_DATA_MIB``
    MiB, else :data:`MAX_DATA_BYTES`."""
    text = os.environ.get(MAX_DATA_ENV)
    if not text:
        return MAX_DATA_BYTES
    if not text.isdigit() or int(text) <= 0:
        raise UsageError(f"{MAX_DATA_ENV}={text!r}: expected a positive whole number of MiB")
    return int(text) * 2**20


def subset_rows(n: int, limit: int | None, seed: int | None) -> np.ndarray | None:
    """The rows of ``--limit``'s subset of ``n`` samples (sorted), None for all: ``limit`` drawn
    without replacement with ``seed``, the first ``limit`` when ``seed`` is None. One rule for
    sources in memory and for array files read row by row."""
    if limit is None or limit >= n:
        return None
    if seed is None:
        return np.arange(limit)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))


def _all(n: int) -> np.ndarray | None:
    return None


@dataclass(frozen=True)
class ArrayHeader:
    """One array's ``.npy`` header: what reading it holds, known before its data is read.
    ``file`` and ``key`` (None for an ``.npy`` file) name it in messages."""

    file: str
    key: str | None
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype

    @property
    def where(self) -> str:
        return _where(self.file, self.key)

    @property
    def samples(self) -> int | None:
        """Axis 0, None for a scalar."""
        return self.shape[0] if self.shape else None

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize  # Python integers: no overflow

    def held_rows(self, rows: np.ndarray | None) -> int:
        """Rows that reading ``rows`` of it holds at its peak: the whole array when it is read
        whole (all rows, Fortran order), plus the rows cut from a whole Fortran-order array."""
        n = self.shape[0] if self.shape else 1
        if rows is None:
            return n
        return n + len(rows) if self.fortran else len(rows)

    def streamed_bytes(self, rows: np.ndarray | None) -> int:
        """Bytes read from the file (inflated from a zip) to get ``rows``: up to the last one."""
        n = self.shape[0] if self.shape else 1
        return (n if rows is None or self.fortran or not len(rows) else int(rows[-1]) + 1) * self.row_bytes

    def describe(self, n: int) -> str:
        return f"{n} samples of shape {list(self.shape[1:])} {self.dtype}"


def _where(file: str, key: str | None) -> str:
    return file if key is None else f"{file}: key '{key}'"


def _header(f: IO[bytes], file: str, key: str | None = None) -> ArrayHeader:
    where = _where(file, key)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise UsageError(f"{where}: .npy format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")
    except UsageError:
        raise
    except Exception as exc:  # not an .npy stream, a damaged header
        raise UsageError(f"{where}: not a readable .npy array ({type(exc).__name__}: {one_line(exc)})") from exc
    if any(d < 0 for d in shape):
        raise UsageError(f"{where}: not a readable .npy array (its header declares the shape {list(shape)})")
    if dtype.hasobject:
        raise UsageError(f"{where}: {_PICKLE}")
    if dtype.kind not in "biuf":
        raise UsageError(f"{where}: the array holds {_NOT_REAL.get(dtype.kind, 'values')} (dtype {dtype.str}), not "
                         f"real numbers; trtrepo reads bool, integer and floating-point arrays")
    return ArrayHeader(file, key, tuple(shape), bool(fortran), dtype)


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


_LIMIT = {"limit": "a sample limit"}  # the setting the advice names (the command line shows --limit)


def check_budget(parts: Sequence[tuple[ArrayHeader, np.ndarray | None]], name: str) -> None:
    """Refuse reading ``parts`` (each header with the rows to read of it) of the file ``name``
    when what they hold together exceeds :func:`data_budget`; the message names the largest."""
    budget = data_budget()
    sizes = sorted(((h.held_rows(rows) * h.row_bytes, h, h.held_rows(rows)) for h, rows in parts),
                   key=lambda s: -s[0])
    total = sum(s[0] for s in sizes)
    if total <= budget:
        return
    bound = f"{budget / 2**30:g} GiB" if budget >= 2**30 else f"{budget / 2**20:g} MiB"
    limit = f"more than the {bound} trtrepo reads from one data file (give fewer samples, {{limit}}, or ${MAX_DATA_ENV})"
    if len(sizes) == 1 or sizes[0][0] > budget:
        size, h, n = sizes[0]
        raise OptionError("", f"{h.where}: {h.describe(n)} are {_size(size)}, {limit}", others=_LIMIT)
    keys = ", ".join(f"'{h.key}' {_size(s)}" for s, h, _ in sizes[:3])
    more = f" and {len(sizes) - 3} more" if len(sizes) > 3 else ""
    raise OptionError("", f"{name}: its arrays ({keys}{more}) are {_size(total)} together, {limit}", others=_LIMIT)


class _Progress:
    """Status lines for a read that takes a while (see the module docstring)."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total, self.done = name, total, 0
        self.start = self.last = time.monotonic()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.start >= PROGRESS_AFTER_S and (self.last == self.start or now - self.last >= PROGRESS_EVERY_S):
            self.last = now
            status("reading %s: %.0f of %.0f MiB (%.0f%%, %.0f s)", self.name, self.done / 2**20, self.total / 2**20,
                   100 * self.done / max(self.total, 1), now - self.start)


def _fill(f: IO[bytes], dest: np.ndarray, where: str, progress: _Progress) -> None:
    """Read ``len(dest)`` bytes into the uint8 array ``dest``, at most :data:`READ_BYTES` at a time."""
    at = 0
    while at < len(dest):
        data = f.read(min(CHUNK_BYTES, READ_BYTES, len(dest) - at))
        if not data:
            raise UsageError(f"{where}: the file ends before the bytes its header declares")
        dest[at:at + len(data)] = np.frombuffer(data, np.uint8)
        at += len(data)
        progress.add(len(data))


def _skip(f: IO[bytes], size: int, where: str, progress: _Progress) -> None:
    while size > 0:
        data = f.read(min(CHUNK_BYTES, READ_BYTES, size))
        if not data:
            raise UsageError(f"{where}: the file ends before the bytes its header declares")
        size -= len(data)
        progress.add(len(data))


def _read(f: IO[bytes], h: ArrayHeader, rows: np.ndarray | None, progress: _Progress) -> np.ndarray:
    """The rows ``rows`` (all when None) of the array whose header ``h`` was just read from ``f``."""
    if not h.shape:
        raise UsageError(f"{h.where}: expected an array with samples on axis 0, got a scalar")
    if h.fortran or rows is None:
        whole = np.empty(h.shape[0] * h.row_bytes, np.uint8)
        _fill(f, whole, h.where, progress)
        flat_arr: np.ndarray = whole.view(h.dtype)
        arr: np.ndarray = flat_arr.reshape(h.shape[::-1]).transpose() if h.fortran else flat_arr.reshape(h.shape)
        return arr if rows is None else arr[rows]
    n, size = len(rows), h.row_bytes
    out = np.empty((n, *h.shape[1:]), h.dtype)
    flat = out.reshape(n, -1).view(np.uint8) if n and size else np.empty((n, 0), np.uint8)
    step = max(1, CHUNK_BYTES // max(size, 1))  # rows per piece; one row (filled piecewise) when rows are large
    at, done = 0, 0  # first row of the next piece; rows of `out` filled
    while done < n:
        k = min(step, int(rows[-1]) + 1 - at)
        picked = rows[done:done + k]
        sel = picked[picked < at + k] - at
        if k == 1:
            if len(sel):
                _fill(f, flat[done], h.where, progress)
            else:
                _skip(f, size, h.where, progress)
        else:
            piece = np.empty(k * size, np.uint8)
            _fill(f, piece, h.where, progress)
            flat[done:done + len(sel)] = piece.reshape(k, size)[sel]
        done, at = done + len(sel), at + k
    return out


def _out_of_memory(h: ArrayHeader, rows: np.ndarray | None) -> UsageError:
    n = h.held_rows(rows)
    return OptionError("", f"{h.where}: not enough memory to read {h.describe(n)} ({_size(n * h.row_bytes)}) "
                       f"on this machine (give fewer samples, or {{limit}})", others=_LIMIT)


def npy_header(path: Path) -> ArrayHeader:
    """The header of an ``.npy`` file (nothing else of it is read)."""
    with open(path, "rb") as f:
        return _header(f, str(path))


def read_npy(path: Path, pick: Pick = _all) -> np.ndarray:
    with open(path, "rb") as f:
        h = _header(f, str(path))
        rows = pick(h.samples) if h.samples is not None else None
        check_budget([(h, rows)], str(path))
        try:
            return _read(f, h, rows, _Progress(str(path), h.streamed_bytes(rows)))
        except MemoryError:
            raise _out_of_memory(h, rows) from None


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except UnicodeDecodeError as exc:  # a member name flagged UTF-8 that is not
        name = exc.object.decode("utf-8", "backslashreplace") if isinstance(exc.object, bytes) else "?"
        raise UsageError(f"{path}: not a readable .npz file (the member name '{name}' is not valid UTF-8)") from exc
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
        raise UsageError(f"{path}: not a readable .npz file ({one_line(exc)})") from exc


def _members(zf: zipfile.ZipFile) -> dict[str, str]:
    """``{key: member name}`` of the ``.npy`` members."""
    return {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}


def _member_header(zf: zipfile.ZipFile, path: Path, key: str, member: str) -> ArrayHeader:
    try:
        with zf.open(member) as f:
            return _header(f, str(path), key)
    except _MEMBER_ERRORS as exc:
        raise UsageError(f"{path}: key '{key}': cannot read it ({one_line(exc)})") from exc


def npz_headers(path: Path) -> dict[str, ArrayHeader]:
    """Every key's header (inflated from the start of its member, no further): dtypes checked, all
    arrays checked to declare one number of samples."""
    with _open_zip(path) as zf:
        headers = {key: _member_header(zf, path, key, member) for key, member in _members(zf).items()}
    counts = {key: h.samples for key, h in headers.items()}
    if len({c for c in counts.values() if c is not None}) > 1:
        raise UsageError(f"{path}: arrays have different numbers of samples: {counts}")
    return headers


def read_npz(path: Path, pick: Pick = _all, keys: Iterable[str] | None = None) -> tuple[dict[str, np.ndarray], int]:
    """The arrays of an ``.npz`` file by key (``keys``, all when None; the others are not
    inflated), each cut to the rows ``pick`` keeps, and the number of samples the file declares."""
    headers = npz_headers(path)
    declared = next((h.samples for h in headers.values() if h.samples is not None), 0)
    wanted = list(headers) if keys is None else list(keys)
    rows = pick(declared)
    check_budget([(headers[k], rows) for k in wanted], str(path))
    progress = _Progress(str(path), sum(headers[k].streamed_bytes(rows) for k in wanted))
    out = {}
    with _open_zip(path) as zf:
        members = _members(zf)
        for key in wanted:
            h = headers[key]
            try:
                with zf.open(members[key]) as f:
                    if _header(f, h.file, key) != h:
                        raise UsageError(f"{h.where}: the file changed while it was read")
                    out[key] = _read(f, h, rows, progress)
            except MemoryError:
                raise _out_of_memory(h, rows) from None
            except _MEMBER_ERRORS as exc:  # a damaged member
                raise UsageError(f"{h.where}: cannot read it ({one_line(exc)})") from exc
    return out, declared
