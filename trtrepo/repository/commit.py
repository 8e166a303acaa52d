"""How a repository changes on disk: the commit protocol, its lock and its recovery.

Every intermediate state of a write is a repository Triton serves.

1. Under the lock (:func:`repository_lock`, ``REPO/.trtrepo.lock``), leftovers of interrupted
   writes are recovered first (:func:`recover`).
2. The whole new model folder is staged where Triton does not look: beside the repository, in
   ``PARENT/.REPO.trtrepo-staging/<id>/model`` (Triton loads every folder of ``REPO``, hidden
   ones too). The versions that stay are hard links of the live files (copies where links are
   not possible); then the new version, the model-level files and ``config.pbtxt``.
3. One step makes it live: ``rename`` for a new model, an atomic exchange of the live and the
   staged folder (``renameat2(RENAME_EXCHANGE)``) for an existing one, so the old folder (old
   config, a version being replaced) stays served until the new one is in place.
4. The staging folder (after an exchange: the old model folder) is removed.

A kill before step 3 leaves the old model and a staging folder; after it, the new model and a
staging folder: either way a complete model, and the staging folder is removed by the next
write (or ``trtrepo repo check --fix``). Where the exchange is not supported, the live folder
is moved into the staging folder and the staged one into place (two renames); a kill between
them leaves the model missing until recovery moves the old folder back (``phase`` file).
Where the repository's parent is not writable or on another filesystem (the repository is a
mount point: a Kubernetes volume, a docker bind mount), the staging folder goes inside another
model's folder (``REPO/OTHER/.trtrepo-staging-<name>-<id>``): on the repository's filesystem,
and ignored by Triton there (versions are numeric folders), so steps 3-4 stay one rename or one
exchange. Every folder at the repository's top level is not an option: tritonserver 2.51 tries
to load each one as a model, hidden ones too, and refuses to start when one fails (measured,
``tests/test_commit_protocol.py``). Only where no other model exists is the model written in
place (``REPO/NAME/.trtrepo-staging-<id>``, per-file renames, config last, logged as not
atomic): for a new model there, a kill can leave a folder without ``config.pbtxt``, which
``repo check`` names and ``--fix`` removes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ..errors import UsageError
from ..fsutil import check_name_lengths
from .layout import LOCK_NAME, STAGING_NAME, FileSource, versions_of

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 120.0
_BESIDE = ".{}.trtrepo-staging"  # the staging folder beside the repository REPO (see the steps above)

# Test hook: called with the name of each commit step (COMMIT_STEPS); an exception (or a
# SIGKILL) there simulates a crash at that point.
_commit_hook: Callable[[str], None] | None = None
COMMIT_STEPS = ("staging", "staged", "live")  # "swapping" too where the exchange is not supported


@contextlib.contextmanager
def repository_lock(repo: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    import filelock  # deferred: only writers take the lock; readers (repo list, serve) need not import it

    # the staging folder beside it (_staging_parent) adds to its name: a name the filesystem takes
    # but the staging folder's it does not is refused here, before anything is made
    check_name_lengths(repo, "repository", extra=len(_BESIDE.format("")))
    try:  # the commit records hold the path as text, as configs and reports do
        str(repo.resolve()).encode()
    except UnicodeEncodeError:
        raise UsageError(f"repository {str(repo)!r}: its path is not valid UTF-8; give a UTF-8 name") from None
    try:
        repo.mkdir(parents=True, exist_ok=True)
    except (NotADirectoryError, FileExistsError) as exc:
        raise UsageError(f"{repo}: not a folder (a file is in its path: {exc.filename})") from exc
    lock = filelock.FileLock(str(repo / LOCK_NAME), timeout=timeout)
    try:
        with lock:
            yield
    except filelock.Timeout as exc:
        raise UsageError(f"{repo}: another writer holds {LOCK_NAME} (waited {timeout:.0f}s)") from exc


def _place(source: FileSource, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        dest.write_bytes(source)
        return
    src = Path(source)
    if src.is_dir():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    elif src.is_file():
        shutil.copyfile(src, dest)
    else:
        raise UsageError(f"{src}: file not found")


def _staging_parent(repo: Path) -> Path | None:
    """``PARENT/.REPO.trtrepo-staging`` when the repository's parent is writable and on the same
    filesystem (renames and exchanges need that), else None."""
    parent = repo.resolve().parent
    try:
        if not os.access(parent, os.W_OK) or parent.stat().st_dev != repo.stat().st_dev:
            return None
    except OSError:
        return None
    return parent / _BESIDE.format(repo.resolve().name)


def _hook(step: str) -> None:
    if _commit_hook is not None:
        _commit_hook(step)


def write_version(repo: Path, model_dir: Path, version: int, text: str, version_files: Mapping[str, FileSource],
           model_files: Mapping[str, FileSource]) -> None:
    root = _staging_parent(repo)
    tag = f"{model_dir.name}-{uuid.uuid4().hex[:12]}"
    if root is not None:
        stage = root / tag
    else:
        host = _host_folder(repo, model_dir)
        if host is None:
            log.warning("%s: the repository's parent is not writable on the same filesystem and no other model folder "
                        "can hold the staging folder: writing %s with per-file renames (not atomic for a server "
                        "polling the repository)", repo, model_dir.name)
            _write_in_place(model_dir, version, text, version_files, model_files)
            return
        stage = host / f"{STAGING_NAME}-{tag}"
    stage.mkdir(parents=True)
    (stage / "target").write_text(str(model_dir.resolve()))
    try:
        _hook("staging")
        new_model = stage / "model"
        new_model.mkdir()
        if model_dir.is_dir():  # everything that stays: hard links of the live files
            replacing = {str(version), "config.pbtxt", *model_files}
            for item in model_dir.iterdir():
                if item.name in replacing or item.name.startswith("."):
                    continue
                _link_tree(item, new_model / item.name)
        _stage_files(new_model, version, text, version_files, model_files)
        _fsync_tree(new_model)
        _hook("staged")
        if not model_dir.exists():
            os.rename(new_model, model_dir)  # the commit point of a new model
        elif not _exchange(new_model, model_dir):  # the commit point of an existing one
            (stage / "phase").write_text("swapping")
            os.rename(model_dir, stage / "old")
            _hook("swapping")
            os.rename(new_model, model_dir)
        _hook("live")
    finally:
        _remove_stage(stage)
        if root is not None:
            with contextlib.suppress(OSError):
                root.rmdir()  # only when empty


def _host_folder(repo: Path, model_dir: Path) -> Path | None:
    """Another model's folder on the repository's filesystem, to hold a staging folder where the
    repository's parent cannot (Triton ignores a non-numeric folder inside a model folder)."""
    try:
        dev = repo.stat().st_dev
        for d in sorted(repo.iterdir()):
            if (d.is_dir() and not d.is_symlink() and not d.name.startswith(".") and d.name != model_dir.name
                    and (d / "config.pbtxt").is_file() and d.stat().st_dev == dev):
                return d
    except OSError:
        pass
    return None


def _stage_files(folder: Path, version: int, text: str, version_files: Mapping[str, FileSource],
                 model_files: Mapping[str, FileSource]) -> None:
    """The new version folder, the model-level files and ``config.pbtxt`` under ``folder``."""
    (folder / str(version)).mkdir()
    for rel, src in version_files.items():
        _place(src, folder / str(version) / rel)
    for rel, src in model_files.items():
        _place(src, folder / rel)
    (folder / "config.pbtxt").write_text(text)


def _remove_stage(stage: Path) -> None:
    """Remove a staging folder, unless it holds the only copy of a model (a two-rename swap
    interrupted between its renames): that one goes back first."""
    old, target_file = stage / "old", stage / "target"
    if old.is_dir() and target_file.is_file():
        target = Path(target_file.read_text())
        if not target.exists():
            os.rename(old, target)
    shutil.rmtree(stage, ignore_errors=True)


def recover(repo: Path) -> list[str]:
    """Finish or undo interrupted writes (call under the repository lock): a model moved aside by
    an interrupted two-rename swap goes back; staging folders (beside the repository, inside
    model folders, and the in-repository folder of older trtrepo versions) are removed, and a model
    folder that held nothing else (a new model written in place) too. Returns what was done, one
    line each."""
    done = []
    for stage in _leftover_paths(repo):
        target = (stage / "target").read_text() if (stage / "target").is_file() else None
        if target and (stage / "old").is_dir() and not Path(target).exists():
            done.append(f"{target}: restored from an interrupted write")
        holder = stage.parent
        if (holder.parent == repo and not holder.name.startswith(".") and not (holder / "config.pbtxt").exists()
                and (stage / "config.pbtxt").is_file() and versions_of(holder)):
            # a write in place was killed after its version went live, before its config: finish it
            rest = sorted((p for p in stage.iterdir() if not p.name.isdigit() and p.name != "old-version"),
                          key=lambda p: p.name == "config.pbtxt")
            for item in rest:
                os.replace(item, holder / item.name)
            done.append(f"{holder}: completed (an interrupted write had made its version live, not yet its config)")
        done.append(f"{stage}: removed (left by an interrupted write)")
        _remove_stage(stage)
        if holder.parent == repo and not holder.name.startswith(".") and not any(holder.iterdir()):
            holder.rmdir()
            done.append(f"{holder}: removed (an empty model folder: Triton fails to load it)")
    return done


def leftovers(repo: str | Path) -> list[Path]:
    """Staging folders of interrupted writes (what :func:`recover` removes)."""
    return _leftover_paths(Path(repo))


def leftover_note(repo: str | Path, stage: Path) -> str:
    """What Triton makes of a leftover staging folder, for ``repo check``."""
    if stage == Path(repo) / STAGING_NAME:
        return "Triton tries to load this top-level folder as a model and fails"
    if stage.parent.parent == Path(repo):
        return "inside a model folder: Triton ignores it (not a version folder)"
    return "outside the repository: Triton does not see it"


def _leftover_paths(repo: Path) -> list[Path]:
    found = []
    root = _staging_parent(repo) if repo.is_dir() else None
    if root is not None and root.is_dir():
        found += sorted(p for p in root.iterdir() if p.is_dir())  # the folder is named after this repository
    if (repo / STAGING_NAME).is_dir():
        found.append(repo / STAGING_NAME)
    if repo.is_dir():
        found += sorted(p for d in repo.iterdir() if d.is_dir() and not d.name.startswith(".")
                        for p in d.glob(f"{STAGING_NAME}-*") if p.is_dir())
    return found


def _link_tree(src: Path, dest: Path) -> None:
    """``dest`` as hard links of ``src``'s files (copies where a link fails)."""
    if src.is_dir() and not src.is_symlink():
        dest.mkdir()
        for child in src.iterdir():
            _link_tree(child, dest / child.name)
        return
    if src.is_symlink():
        os.symlink(os.readlink(src), dest)
        return
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _fsync_tree(root: Path) -> None:
    """Flush the staged files before they go live (a power loss must not make a live empty file)."""
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        with contextlib.suppress(OSError):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or filesystem does not support it."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _write_in_place(model_dir: Path, version: int, text: str, version_files: Mapping[str, FileSource],
                    model_files: Mapping[str, FileSource]) -> None:
    """Fallback without a usable parent folder: stage inside the model folder (Triton ignores
    non-numeric folders there) and move each part into place; a new model is staged as a
    version-less folder first."""
    model_dir.mkdir(exist_ok=True)
    stage = model_dir / f"{STAGING_NAME}-{uuid.uuid4().hex[:12]}"
    stage.mkdir()
    try:
        _hook("staging")
        _stage_files(stage, version, text, version_files, model_files)
        _hook("staged")
        vdir = model_dir / str(version)
        if vdir.exists() and not _exchange(stage / str(version), vdir):
            os.rename(vdir, stage / "old-version")
            os.rename(stage / str(version), vdir)
        elif not vdir.exists():
            os.rename(stage / str(version), vdir)
        for rel in [*model_files, "config.pbtxt"]:
            (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, model_dir / rel)
        _hook("live")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
