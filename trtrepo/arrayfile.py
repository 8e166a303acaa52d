"""Bounded reads of ``.npy`` and ``.npz`` files (the data given with ``--data``/``--labels``).

Decisions:

* **The header decides before any data is read.** Each array's shape and dtype come from its
  ``.npy`` header; an array whose rows to be read declare more than :data:`MAX_ARRAY_BYTES`, an
  object dtype (a pickle) or a header that cannot be parsed is refused with the file and key
  named, before a byte of it is decompressed. A 1 MB zip that inflates to gigabytes is refused or
  read only as far as needed, never inflated in full.
* **Only the rows asked for are held.** ``pick`` maps the declared sample count to the sorted
  rows to keep (``--limit``'s subset) or None (all). A C-order array is streamed in chunks of about
  :data:`CHUNK_BYTES` up to its last picked row (``zipfile`` inflates a member as a stream), keeping
  only the picked rows: the first ``--limit`` rows inflate nothing beyond them; a random subset
  inflates up to its last row but holds ``--limit`` rows. A Fortran-order array is read whole (its
  rows are not contiguous), within the same bound.
* All arrays of one file must declare the same number of samples (axis 0); that is checked on the
  headers, so a prefix read cannot hide a mismatch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from .errors import UsageError

MAX_ARRAY_BYTES = 4 * 2**30  # bytes one array may bring into memory (its picked rows)
_PICKLE = "an object array (a pickle); trtrepo reads plain numeric arrays, never pickles"
CHUNK_BYTES = 16 * 2**20  # bytes streamed at a time while picking rows

Pick = Callable[[int], "np.ndarray | None"]  # declared samples -> sorted rows to keep, None: all


def subset_rows(n: int, limit: int | None, seed: int | None) -> np.ndarray | None:
    """The rows of ``--limit``'s subset of ``n`` samples (sorted), None for all: ``limit`` drawn
    without replacement with ``seed``, the first ``limit`` when ``seed`` is None. One rule for
    sources in memory and for array files read row by row."""
    if limit is None or limit >= n:
        return None
    if seed is None:
        return np.arange(limit)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))


def _header(f: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            return fmt.read_array_header_1_0(f)  # type: ignore[no-any-return]
        if version == (2, 0):
            return fmt.read_array_header_2_0(f)  # type: ignore[no-any-return]
    except Exception as exc:  # not an .npy stream, a damaged header
        raise UsageError(f"{where}: not a readable .npy array ({type(exc).__name__}: {exc})") from exc
    raise UsageError(f"{where}: .npy format version {version[0]}.{version[1]} is not read here (1.0 and 2.0 are)")


def _all(n: int) -> np.ndarray | None:
    return None


def _read(f: IO[bytes], where: str, pick: Pick = _all) -> np.ndarray:
    shape, fortran, dtype = _header(f, where)
    if dtype.hasobject:
        raise UsageError(f"{where}: {_PICKLE}")
    if not shape:
        raise UsageError(f"{where}: expected an array with samples on axis 0, got a scalar")
    rows = pick(shape[0])
    n = shape[0] if rows is None or fortran else len(rows)
    row_bytes = (int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1) * dtype.itemsize
    if n * row_bytes > MAX_ARRAY_BYTES:
        raise UsageError(f"{where}: {n} samples of shape {list(shape[1:])} {dtype} are {n * row_bytes / 2**30:.1f} GiB, "
                         f"more than the {MAX_ARRAY_BYTES / 2**30:.0f} GiB trtrepo reads from one array (give fewer "
                         f"samples, or --limit)")
    if fortran or rows is None:
        arr = np.frombuffer(_exactly(f, shape[0] * row_bytes, where), dtype=dtype)
        arr = arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)
        return arr if rows is None else arr[rows]
    out = np.empty((n, *shape[1:]), dtype)
    flat = out.reshape(n, -1).view(np.uint8) if n else out
    step = max(1, CHUNK_BYTES // max(row_bytes, 1))
    at, done = 0, 0  # first row of the next chunk; rows of `out` filled
    while done < n:
        k = min(step, int(rows[-1]) + 1 - at)
        chunk = np.frombuffer(_exactly(f, k * row_bytes, where), np.uint8).reshape(k, row_bytes)
        sel = rows[(rows >= at) & (rows < at + k)] - at
        flat[done:done + len(sel)] = chunk[sel]
        done, at = done + len(sel), at + k
    return out


def _exactly(f: IO[bytes], size: int, where: str) -> bytearray:
    data = bytearray(f.read(size))
    if len(data) != size:
        raise UsageError(f"{where}: the file ends before the {size} bytes its header declares")
    return data


def declared_samples(path: Path) -> int:
    """Axis 0 of an ``.npy`` file's array, from its header."""
    with open(path, "rb") as f:
        shape, _, _ = _header(f, str(path))
    return shape[0] if shape else 0


def read_npy(path: Path, pick: Pick = _all) -> np.ndarray:
    with open(path, "rb") as f:
        return _read(f, str(path), pick)


def read_npz(path: Path, pick: Pick = _all) -> tuple[dict[str, np.ndarray], int]:
    """The arrays of an ``.npz`` file by key, each cut to the rows ``pick`` keeps, and the number
    of samples the file declares."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UsageError(f"{path}: not a readable .npz file ({exc})") from exc
    with zf:
        names = [n for n in zf.namelist() if n.endswith(".npy")]
        counts = {}
        for name in names:  # the headers first: nothing is inflated before all are known
            with zf.open(name) as f:
                shape, _, dtype = _header(f, f"{path}: key '{name[:-4]}'")
            if dtype.hasobject:
                raise UsageError(f"{path}: key '{name[:-4]}': {_PICKLE}")
            counts[name[:-4]] = shape[0] if shape else None
        if len({c for c in counts.values() if c is not None}) > 1:
            raise UsageError(f"{path}: arrays have different numbers of samples: {counts}")
        declared = next((c for c in counts.values() if c is not None), 0)
        out = {}
        for name in names:
            with zf.open(name) as f:
                try:
                    out[name[:-4]] = _read(f, f"{path}: key '{name[:-4]}'", pick)
                except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:  # a damaged member
                    raise UsageError(f"{path}: key '{name[:-4]}': cannot read it ({exc})") from exc
    return out, declared
