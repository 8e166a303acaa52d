"""Atomic file writes: outputs go to a temporary file in the target folder, then ``os.replace``;
names from outside this machine (object keys) written below a local folder only when they are
relative paths inside it (:func:`unsafe_relpath`, :func:`write_inside`)."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OptionError, TrtrepoError, UsageError

# The files and folders the running command reads (set by trtrepo.commands._inputs): no write may
# replace one of them or land inside one of the folders (an image folder would gain a file).
_INPUTS: contextvars.ContextVar[tuple[tuple[Path, str, bool], ...]] = contextvars.ContextVar("trtrepo_inputs",
                                                                                             default=())


@contextlib.contextmanager
def protected_inputs(named: Mapping[str, str | Path | None]) -> Iterator[None]:
    """While active, :func:`check_not_input` (and every :func:`atomic_path` write) refuses the
    existing paths among ``named`` (label -> path; values that are not paths are ignored)."""
    entries = []
    for label, value in named.items():
        if value is None or value == "":
            continue
        p = Path(str(value))
        with contextlib.suppress(OSError):
            if p.exists():
                entries.append((p.resolve(), label, p.is_dir()))
    token = _INPUTS.set(_INPUTS.get() + tuple(entries))
    try:
        yield
    finally:
        _INPUTS.reset(token)


def check_not_input(target: str | Path, option: str = "") -> None:
    """Refuse ``target`` when it is, or lies inside, an input of the running command."""
    t = Path(target).resolve()
    for p, label, is_dir in _INPUTS.get():
        if t == p:
            raise UsageError(f"{(option + ' ') if option else ''}{target}: is {label}, which this command reads; "
                             f"it would be overwritten")
        if is_dir and p in t.parents:
            raise UsageError(f"{(option + ' ') if option else ''}{target}: lies inside {label} ({p}), which this command "
                             f"reads; write it elsewhere")


@contextlib.contextmanager
def atomic_path(target: str | Path, *, force: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success it is renamed onto ``target``.

    On any exception the temporary file is removed and ``target`` is left as it was. With
    ``force=False`` an existing ``target`` is refused before anything is written.
    """
    if Path(target).name in ("", ".."):  # "" is "." (os.replace then fails with EBUSY)
        raise UsageError(f"{str(target)!r}: names a folder, not a file to write")
    target = Path(target)
    check_name_lengths(target)
    check_not_input(target)
    if target.exists() and not force:
        raise OptionError("", f"{target}: already exists (use {{force}} to overwrite)", others={"force": "force=True"})
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        # the target's name, shortened where it is long: the temporary name stays within the
        # filesystem's limit for every target name that is within it
        short = target.name if len(os.fsencode(target.name)) <= 128 else target.name[:32]
        fd, tmp_name = tempfile.mkstemp(prefix=f".{short}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise write_error(target, exc) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if tmp.is_file():
            # mkstemp creates 0600; outputs are shared (a Triton container may run as another user)
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            if tmp.is_dir():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
        if isinstance(exc, OSError) and exc.errno in _WRITE_ERRNOS and exc.filename in (None, str(tmp), str(target)):
            raise write_error(target, exc) from exc  # the write itself failed (a full disk, ...): name the file
        raise


# What writing a file can fail with: said as one line naming the file (:func:`write_error`).
# A full disk or a failing device is a failure (exit 1); the others are the path's (exit 2).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                 errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP, errno.EXDEV}
_FAILURE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG}


def write_error(target: str | Path, exc: OSError) -> TrtrepoError:
    """The one-line error for ``exc``, raised while writing ``target`` (or making its folder):
    it names ``target``, and the part of its path at fault where that is what failed."""
    target = Path(target)
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):  # a file where a folder of the path should be
        blocker = next((a for a in reversed(target.parents) if a.exists() and not a.is_dir()), None)
        if blocker is not None:
            return UsageError(f"{target}: cannot write it: {blocker} is a file, not a folder")
    if exc.errno == errno.EISDIR and target.is_dir():
        return UsageError(f"{target}: is a folder; give a file name")
    if exc.errno in _FAILURE_ERRNOS:
        return TrtrepoError(f"{target}: cannot write it ({reason}); nothing was written there")
    return UsageError(f"{target}: cannot write it ({reason})")


def _name_max(path: Path) -> int:
    """The longest file name (bytes) the filesystem of ``path`` (or its nearest existing folder) allows."""
    for folder in (path, *path.parents):
        with contextlib.suppress(OSError, ValueError):
            if folder.is_dir():
                return int(os.pathconf(folder, "PC_NAME_MAX"))
    return 255


def check_name_lengths(path: str | Path, what: str = "", extra: int = 0) -> None:
    """Refuse ``path`` when one of its names is longer than its filesystem allows (``OSError:
    [Errno 36]`` otherwise, from wherever it is first used). ``extra``: the bytes trtrepo adds to
    the last name for a folder beside it (a staging folder). ``what`` (an option) starts the line."""
    path = Path(path)
    limit = _name_max(path)
    parts = path.parts
    for i, part in enumerate(parts):
        room = limit - (extra if i == len(parts) - 1 else 0)
        size = len(os.fsencode(part))
        if size > room:
            shown = part if len(part) <= 40 else f"{part[:40]}..."
            beside = f" ({limit} on this filesystem, less {extra} for the staging folder beside it)" if extra and \
                i == len(parts) - 1 else ""
            raise UsageError(f"{what + ' ' if what else ''}{path}: the name '{shown}' is {size} bytes long; "
                             f"names here are at most {room} bytes{beside}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(target: str | Path, data: bytes, *, force: bool = True) -> Path:
    with atomic_path(target, force=force) as tmp:
        tmp.write_bytes(data)
    return Path(target)


def atomic_write_text(target: str | Path, text: str, *, force: bool = True) -> Path:
    return atomic_write_bytes(target, text.encode(), force=force)


# --------------------------------------------------------------------------------------------
# Names from outside this machine (object keys, archive members) made into local paths


def unsafe_relpath(rel: str) -> str | None:
    """Why ``rel``, a ``/``-separated name that came from outside this machine (an object key
    below a repository's prefix), cannot be a path below a local folder; None when it can. The
    rule: relative, no empty, ``.`` or ``..`` segment, no backslash (a separator elsewhere), no
    NUL. Pure."""
    if not rel:
        return "is empty"
    if "\0" in rel:
        return "holds a NUL character"
    if "\\" in rel:
        return "holds a backslash"
    if rel.startswith("/"):
        return "is absolute (it starts with '/')"
    for seg in rel.split("/"):
        if seg == "":
            return "has an empty segment ('//' or a trailing '/')"
        if seg in (".", ".."):
            return f"has a '{seg}' segment"
    return None


def _open_inside(root: Path, parts: Sequence[str], what: str, *, create: bool) -> int:
    """A descriptor of the folder ``root/parts...``, each segment opened relative to its parent's
    descriptor with ``O_NOFOLLOW`` (created first with ``create``): a symlink anywhere below
    ``root`` is refused, never followed. The caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for seg in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(seg, 0o777, dir_fd=fd)
            try:
                nxt = os.open(seg, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                raise UsageError(f"{what}: {root}/.../{seg} is a symlink or not a folder; not written through") from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def mkdir_inside(root: str | Path, rel: str, what: str | None = None) -> Path:
    """The folder ``root/rel`` (and its parents), ``rel`` a name from outside checked by
    :func:`unsafe_relpath`; no symlink below ``root`` is followed. :class:`UsageError` naming
    ``what`` (default ``rel``) otherwise."""
    what = what or repr(rel)
    why = unsafe_relpath(rel)
    if why:
        raise UsageError(f"{what} {why}: not a path inside {root}; nothing written there")
    os.close(_open_inside(Path(root), rel.split("/"), what, create=True))
    return Path(root, rel)


def write_inside(root: str | Path, rel: str, data: bytes, what: str | None = None) -> Path:
    """Write ``data`` as the new file ``root/rel``, ``rel`` a name from outside checked by
    :func:`unsafe_relpath`: its folders are created or opened without following a symlink, and
    the file is created new (``O_CREAT | O_EXCL | O_NOFOLLOW``: never through a symlink, never
    over an existing file). :class:`UsageError` naming ``what`` (default ``rel``) otherwise."""
    what = what or repr(rel)
    why = unsafe_relpath(rel)
    if why:
        raise UsageError(f"{what} {why}: not a path inside {root}; nothing written there")
    *folders, name = rel.split("/")
    fd = _open_inside(Path(root), folders, what, create=True)
    try:
        try:
            out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=fd)
        except FileExistsError:
            raise UsageError(f"{what}: {Path(root, rel)} already exists (or is a symlink); not written over") from None
    finally:
        os.close(fd)
    with os.fdopen(out, "wb") as f:
        f.write(data)
    return Path(root, rel)


# --------------------------------------------------------------------------------------------
# Reports (JSON + Markdown pairs of the evaluate, quantize and validate stages)


def json_default(o: Any) -> Any:
    """``json.dumps`` default for reports: numpy scalars as numbers, paths as strings."""
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def report_json(data: Any, *, allow_nan: bool = True) -> str:
    """A report as JSON text (indented, newline-terminated)."""
    return json.dumps(data, indent=2, default=json_default, allow_nan=allow_nan) + "\n"


def write_report(folder: str | Path, stem: str, json_text: str, markdown: str) -> tuple[Path, Path]:
    """``STEM.json`` and ``STEM.md`` in ``folder``, each written atomically."""
    folder = Path(folder)
    return atomic_write_text(folder / f"{stem}.json", json_text), atomic_write_text(folder / f"{stem}.md", markdown)


# --------------------------------------------------------------------------------------------
# Temporary folders that outlive a killed process are found and removed by the next one


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def reap_stale(prefix: str, root: str | Path | None = None) -> list[Path]:
    """Remove ``ROOT/{prefix}{pid}-*`` entries whose process is gone (a SIGKILL runs no cleanup);
    returns what was removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for p in root.glob(f"{prefix}*"):
        pid_text = p.name[len(prefix):].split("-", 1)[0].split("_", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or pid_alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
    return removed


def temp_dir(kind: str, dir: str | Path | None = None) -> tempfile.TemporaryDirectory[str]:
    """``TemporaryDirectory`` named ``trtrepo-{kind}-{pid}-*``; the ones of killed processes are
    removed first."""
    prefix = f"trtrepo-{kind}-"
    reap_stale(prefix, dir)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-", dir=dir, ignore_cleanup_errors=True)
