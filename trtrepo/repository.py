"""Triton model repositories: the only module that knows ``REPO/NAME/VERSION/model.<ext>``.

:func:`add_model` renders a :class:`~trtrepo.tritonconfig.ModelConfig`, validates the text
(protobuf schema + Triton's load-time rules, against the model file's IO) and only then writes;
a new version number is allocated unless ``version`` is given (1 .. 2**63-1, Triton's int64);
an existing version is never replaced without ``force``; a file lock (``REPO/.trtrepo.lock``)
serialises concurrent writers.

Commit protocol: every intermediate state of a write is a repository Triton serves.

1. Under the lock, leftovers of interrupted writes are recovered first (:func:`recover`).
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

A new config whose IO (names, data types, dims, batching on/off) differs from the live one is
refused while its version policy would serve an old version under it.

Helpers build the usual models from an ONNX file (:func:`add_onnx_model`: ONNX Runtime or the
Python backend running ONNX Runtime; external data files travel with it), from a TensorRT plan
(:func:`add_plan_model`, reading the builder's ``model.plan.json``) and the image ensemble
(:func:`add_image_ensemble`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contracts import backends
from .contracts.plan import GPUInfo, PlanMetadata, check_plan_compatibility, plan_metadata_path, read_plan_metadata
from .errors import UsageError
from .modelio import ModelIO
from .tritonconfig import (
    MODEL_DIRECTORY,
    ModelConfig,
    ModelOptions,
    check_model_name,
    check_rendered,
    config_from_io,
    ensemble_config,
    execution_env_files,
    parse_config_text,
    preprocess_config,
    render_config,
    template_file,
    validate_config_text,
)

log = logging.getLogger(__name__)

LOCK_NAME = ".trtrepo.lock"
STAGING_NAME = ".trtrepo-staging"  # inside REPO: only leftovers of older trtrepo versions (recovered)
LOCK_TIMEOUT_S = 120.0
MAX_VERSION = 2**63 - 1  # Triton's version numbers are int64

# Source of a file to write: a path (file or folder, copied) or the bytes themselves.
FileSource = Path | str | bytes

# Test hook: called with the name of each commit step (COMMIT_STEPS); an exception (or a
# SIGKILL) there simulates a crash at that point.
_commit_hook: Callable[[str], None] | None = None
COMMIT_STEPS = ("staging", "staged", "live")  # "swapping" too where the exchange is not supported


@dataclass
class WriteResult:
    name: str
    version: int
    model_dir: Path
    config_text: str
    files: list[str]
    warnings: list[str] = field(default_factory=list)
    replaced: bool = False

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)


# --------------------------------------------------------------------------------------------
# Reading


def versions_of(model_dir: Path) -> list[int]:
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))


def read_config(model_dir: Path) -> Any:
    p = model_dir / "config.pbtxt"
    if not p.is_file():
        raise UsageError(f"{p}: config.pbtxt not found")
    return parse_config_text(p.read_text(), str(p))


@dataclass
class ModelEntry:
    name: str
    kind: str
    max_batch_size: int | None
    versions: dict[int, list[str]]
    problem: str | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def list_repository(repo: str | Path) -> list[ModelEntry]:
    """Models in ``repo`` with their versions and what each version folder holds."""
    repo = Path(repo)
    if not repo.is_dir():
        raise UsageError(f"{repo}: model repository not found")
    entries = []
    for d in sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions = {v: sorted(str(f.relative_to(d / str(v))) for f in (d / str(v)).iterdir()) for v in versions_of(d)}
        try:
            msg = read_config(d)
            kind = msg.platform or msg.backend or "?"
            entries.append(ModelEntry(d.name, kind, msg.max_batch_size, versions, None,
                                      [t.name for t in msg.input], [t.name for t in msg.output]))
        except UsageError as exc:
            entries.append(ModelEntry(d.name, "?", None, versions, exc.message))
    return entries


# --------------------------------------------------------------------------------------------
# Plan metadata (written by the build stage beside the plan)


def check_plan_target(meta: PlanMetadata | None, *, tensorrt_version: str | None = None,
                      compute_capability: str | None = None) -> list[str]:
    """Warnings when a plan was built for another TensorRT version or GPU than the target.

    A plan only loads under the exact TensorRT version that built it and (without hardware
    compatibility) on the GPU architecture it was built on (spec section 6, pain points 1-2).
    The check is :func:`trtrepo.contracts.plan.check_plan_compatibility`'s.
    """
    gpu = GPUInfo(name="", compute_capability=str(compute_capability)) if compute_capability else None
    return check_plan_compatibility(meta, tensorrt_version, gpu, target=True)


# --------------------------------------------------------------------------------------------
# Writing


@contextlib.contextmanager
def repository_lock(repo: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    import filelock

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


def _check_relpath(rel: str, what: str) -> str:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel.startswith("."):
        raise UsageError(f"{what} '{rel}': must be a relative path inside the model folder")
    return rel


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


def _known_models(repo: Path, pending: Mapping[str, Any] | None) -> dict[str, Any]:
    known: dict[str, Any] = {}
    if repo.is_dir():
        for d in repo.iterdir():
            if d.is_dir() and not d.name.startswith(".") and (d / "config.pbtxt").is_file():
                with contextlib.suppress(UsageError):
                    known[d.name] = read_config(d)
    known.update(pending or {})
    return known


def add_model(
    repo: str | Path,
    config: ModelConfig,
    version_files: Mapping[str, FileSource],
    *,
    model_files: Mapping[str, FileSource] | None = None,
    version: int | None = None,
    force: bool = False,
    io: ModelIO | None = None,
    plan: PlanMetadata | None = None,
    template_dir: str | Path | None = None,
    warnings: Sequence[str] = (),
) -> WriteResult:
    """Render, validate and write one model. Nothing is written when anything fails."""
    repo = Path(repo)
    name = check_model_name(config.name)
    if version is not None and version < 1:
        raise UsageError(f"--version {version}: versions are integers >= 1")
    model_files = dict(model_files or {})
    for rel in (*version_files, *model_files):
        _check_relpath(rel, "file")
    for reserved in ("config.pbtxt",):
        if reserved in model_files:
            raise UsageError(f"model file '{reserved}' is written by trtrepo itself")
    expected = [config.model_filename] if config.model_filename else []
    expected += [f for _, f in config.cc_model_filenames]
    missing = [f for f in expected if f not in version_files]
    if missing:
        raise UsageError(f"model '{name}': the version folder needs {', '.join(missing)}")
    for rel, src in (*version_files.items(), *model_files.items()):
        if not isinstance(src, bytes) and not Path(src).exists():
            raise UsageError(f"{src}: file not found (for {name}/{rel})")

    text = render_config(config, template_dir)
    where = f"{name}/config.pbtxt"
    known = _known_models(repo, None) if config.kind == "ensemble" else None
    msg = validate_config_text(text, where, io=io, plan=plan, model_dir_name=name, known_models=known,
                               model_files=sorted(model_files))
    check_rendered(msg, config, where, template_dir)

    with repository_lock(repo):
        recover(repo)
        model_dir = repo / name
        existing = versions_of(model_dir)
        if version is None:
            version = (max(existing) + 1) if existing else 1
            if version > MAX_VERSION:
                raise UsageError(f"{model_dir}: no version number left after {max(existing)} (Triton's versions are "
                                 f"int64); give --version")
        elif version > MAX_VERSION:
            raise UsageError(f"--version {version}: beyond Triton's largest version number {MAX_VERSION}")
        replaced = version in existing
        if replaced and not force:
            raise UsageError(f"{model_dir / str(version)}: version {version} already exists (use --force to replace it, "
                             f"or leave --version out to add version {max(existing) + 1})")
        if existing:
            _check_kept_versions(model_dir, text, existing, version)
        _write(repo, model_dir, version, text, version_files, model_files)
    files = sorted(str(p.relative_to(model_dir / str(version))) for p in (model_dir / str(version)).rglob("*") if p.is_file())
    for w in warnings:
        log.warning("%s: %s", name, w)
    return WriteResult(name, version, model_dir, text, files, list(warnings), replaced)


def replace_config(repo: str | Path, name: str, text: str) -> Path:
    """Write ``text`` as model ``name``'s ``config.pbtxt`` (``trtrepo tune --apply``): checked like
    every config trtrepo writes, the same inputs and outputs as the live one, versions still
    served, then one atomic rename under the repository lock -- a server polling the repository
    reads the old file or the new one, never a mix."""
    from .fsutil import atomic_write_text

    repo = Path(repo)
    model_dir = repo / check_model_name(name)
    where = f"{name}/config.pbtxt"
    live = read_config(model_dir)
    msg = validate_config_text(text, where, model_dir_name=name)
    if _io_of(msg) != _io_of(live):
        raise UsageError(f"{model_dir / 'config.pbtxt'}: the new config changes the model's inputs or outputs; "
                         f"not written")
    with repository_lock(repo):
        recover(repo)
        existing = versions_of(model_dir)
        if existing:
            _check_kept_versions(model_dir, text, existing, max(existing))
        return Path(atomic_write_text(model_dir / "config.pbtxt", text))


def _io_of(msg: Any) -> tuple[Any, ...]:
    def tensors(ts: Any) -> tuple[tuple[str, int, tuple[int, ...]], ...]:
        return tuple(sorted((t.name, int(t.data_type), tuple(int(d) for d in t.dims)) for t in ts))

    return int(msg.max_batch_size) > 0, tensors(msg.input), tensors(msg.output)  # batching on/off changes dims' meaning


def served_versions(msg: Any, versions: Sequence[int]) -> list[int]:
    """The versions Triton loads under a config's ``version_policy`` (default: the latest one)."""
    ordered = sorted(versions)
    which = msg.version_policy.WhichOneof("policy_choice") if msg.HasField("version_policy") else None
    if which == "all":
        return ordered
    if which == "specific":
        return [v for v in ordered if v in set(int(x) for x in msg.version_policy.specific.versions)]
    n = int(msg.version_policy.latest.num_versions) if which == "latest" else 1
    return ordered[-max(n, 1):]


def _check_kept_versions(model_dir: Path, text: str, existing: Sequence[int], version: int) -> None:
    """Refuse a config whose IO differs from the live config's while its version policy would
    serve an old version under it (Triton would fail to load that version)."""
    try:
        live = read_config(model_dir)
    except UsageError:
        return  # no readable live config: nothing is served from this folder now
    new = parse_config_text(text, f"{model_dir.name}/config.pbtxt")
    if _io_of(live) == _io_of(new):
        return
    old = [v for v in served_versions(new, sorted({*existing, version})) if v != version]
    if old:
        raise UsageError(f"model '{model_dir.name}': the new version's IO (input/output names, data types, dims, batching) differs from "
                         f"the live config.pbtxt's, and its version policy would serve the older version(s) "
                         f"{', '.join(map(str, old))} under the new config; use another --name, or --version-policy latest:1")


def _staging_parent(repo: Path) -> Path | None:
    """``PARENT/.REPO.trtrepo-staging`` when the repository's parent is writable and on the same
    filesystem (renames and exchanges need that), else None."""
    parent = repo.resolve().parent
    try:
        if not os.access(parent, os.W_OK) or parent.stat().st_dev != repo.stat().st_dev:
            return None
    except OSError:
        return None
    return parent / f".{repo.resolve().name}.trtrepo-staging"


def _hook(step: str) -> None:
    if _commit_hook is not None:
        _commit_hook(step)


def _write(repo: Path, model_dir: Path, version: int, text: str, version_files: Mapping[str, FileSource],
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


def files_needed(msg: Any) -> list[str]:
    """The files Triton needs in each served version folder of a model with this config: the
    backend's model file (or ``default_model_filename``) and, for the Python backend running ONNX
    Runtime, the ONNX file its ``onnx_filename`` parameter names. Empty for an ensemble and where
    per-GPU plan names (``cc_model_filenames``) decide."""
    if msg.platform == "ensemble" or len(msg.cc_model_filenames):
        return []
    name = msg.default_model_filename
    if not name:
        spec = backends.for_config(msg.platform, msg.backend)
        name = spec.model_file if spec else None
    files = [name] if name else []
    if "onnx_filename" in msg.parameters and msg.parameters["onnx_filename"].string_value:
        files.append(msg.parameters["onnx_filename"].string_value)
    return files


def incomplete_versions(msg: Any, files: Mapping[int, Sequence[str]]) -> list[tuple[int, str]]:
    """``(version, why)`` for each version the config serves among ``files`` (version -> the
    file names in its folder) that lacks a file Triton needs (:func:`files_needed`); the one rule
    for a local and an object-storage repository."""
    out = []
    for v in served_versions(msg, list(files)):
        missing = [f for f in files_needed(msg) if f not in files[v]]
        if missing:
            out.append((v, f"version {v} lacks {', '.join(missing)}: Triton fails to load it"))
    return out


def load_problems(repo: str | Path) -> list[tuple[Path, str]]:
    """Folders at the top of ``repo`` that tritonserver would fail to load (it tries every folder,
    hidden ones too, and does not start while one fails): no ``config.pbtxt``, a config that does
    not parse, no version its policy serves, a served version without a file Triton needs.
    Staging leftovers are not repeated here."""
    repo = Path(repo)
    found: list[tuple[Path, str]] = []
    if not repo.is_dir():
        return found
    for d in sorted(p for p in repo.iterdir() if p.is_dir() and p.name != STAGING_NAME):
        if not (d / "config.pbtxt").is_file():
            found.append((d, "no config.pbtxt: Triton fails to load this folder (unless its backend can auto-complete "
                             "a config), and tritonserver does not start while it is here"))
            continue
        try:
            msg = read_config(d)
        except UsageError as exc:
            found.append((d, f"config.pbtxt does not parse ({exc.message}): Triton fails to load it"))
            continue
        files = {v: [p.name for p in (d / str(v)).iterdir()] for v in versions_of(d)}
        if not served_versions(msg, list(files)):
            found.append((d, "no version folder its version policy serves: Triton fails to load it "
                             "(at least one version must be available)"))
        found += [(d / str(v), why) for v, why in incomplete_versions(msg, files)]
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
    import ctypes
    import errno
    import sys

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


# --------------------------------------------------------------------------------------------
# Model helpers


def labels_bytes(labels: Sequence[str] | str | Path) -> bytes:
    if isinstance(labels, (str, Path)):
        p = Path(labels)
        if not p.is_file():
            raise UsageError(f"{p}: labels file not found")
        data = p.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = "\0"
        if "\0" in text or any(not line.isprintable() for line in text.splitlines()):
            raise UsageError(f"{p}: not a labels file (expected UTF-8 text, one class name per line)")
        return data
    return ("\n".join(str(x) for x in labels) + "\n").encode()


def add_onnx_model(
    repo: str | Path,
    name: str,
    onnx_path: str | Path,
    *,
    backend: str = "onnxruntime",
    options: ModelOptions | None = None,
    labels: Sequence[str] | str | Path | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, ModelConfig]:
    """An ONNX model for a backend that runs ONNX files (:func:`trtrepo.contracts.backends.options`
    ``("onnx")``: the ONNX Runtime backend, the Python backend running ONNX Runtime, ...)."""
    spec = backends.for_option(backend)
    if spec is None or spec.source != "onnx":
        raise UsageError(f"--backend {backend!r}: an ONNX model deploys to {' or '.join(map(repr, backends.options('onnx')))}")
    onnx_path = Path(onnx_path)
    io = ModelIO.from_onnx(onnx_path)
    options = options or ModelOptions()
    if labels is not None:
        from dataclasses import replace

        options = replace(options, has_labels=True)
    config = config_from_io(name, io, spec, options)
    files: dict[str, FileSource] = {"model.onnx": onnx_path}
    files.update(external_data_files(onnx_path))
    for dst, src in spec.extra_files:
        files[dst] = template_file(src, template_dir)
    model_files: dict[str, FileSource] = {options.label_filename: labels_bytes(labels)} if labels is not None else {}
    if spec.runs_python:
        model_files.update(execution_env_files(options))
    result = add_model(repo, config, files, model_files=model_files, version=version, force=force, io=io,
                       template_dir=template_dir)
    return result, config


def external_data_files(onnx_path: Path) -> dict[str, FileSource]:
    """The external data files an ONNX model names (every model over 2 GB has them), keyed by
    their location relative to the model, which they keep beside ``model.onnx``; each must exist
    and hold the bytes the model reads from it."""
    import onnx

    from .modelio import load_onnx

    model = load_onnx(onnx_path, load_weights=False)
    need: dict[str, int] = {}
    tensors = [*model.graph.initializer, *(t for n in model.graph.node for a in n.attribute
                                            if a.type == onnx.AttributeProto.TENSOR for t in (a.t,))]
    for t in tensors:
        if not onnx.external_data_helper.uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        rel = info.get("location", "")
        try:
            _check_relpath(rel, f"{onnx_path}: tensor '{t.name}' external data location")
        except UsageError as exc:
            raise UsageError(exc.message) from None
        end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        need[rel] = max(need.get(rel, 0), end)
    files: dict[str, FileSource] = {}
    for rel, end in need.items():
        src = onnx_path.parent / rel
        if not src.is_file():
            raise UsageError(f"{onnx_path}: its external data file {src} is missing")
        if src.stat().st_size < end:
            raise UsageError(f"{src}: {src.stat().st_size} bytes, but {onnx_path.name} reads up to byte {end} of it")
        files[rel] = src
    return files


def add_plan_model(
    repo: str | Path,
    name: str,
    plan: str | Path,
    *,
    io: ModelIO | None = None,
    options: ModelOptions | None = None,
    labels: Sequence[str] | str | Path | None = None,
    target_tensorrt: str | None = None,
    target_compute_capability: str | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, ModelConfig]:
    """A TensorRT plan; its IO (unless given) and optimization profiles come from ``model.plan.json``."""
    plan = Path(plan)
    if not plan.is_file():
        raise UsageError(f"{plan}: plan file not found")
    meta = read_plan_metadata(plan, missing_ok=True)
    if io is None:
        if meta is None:
            raise UsageError(f"{plan}: no IO description: give the ONNX model (--onnx) or keep "
                             f"{plan_metadata_path(plan).name} beside it")
        io = meta.io
    options = options or ModelOptions()
    if labels is not None:
        from dataclasses import replace

        options = replace(options, has_labels=True)
    config = config_from_io(name, io, backends.BACKENDS["tensorrt_plan"], options, plan=meta)
    files: dict[str, FileSource] = {"model.plan": plan}
    for _, fname in config.cc_model_filenames:
        files.setdefault(fname, plan.parent / fname)
    if meta is not None:
        files[plan_metadata_path("model.plan").name] = meta.portable().to_json().encode()
    warnings = check_plan_target(meta, tensorrt_version=target_tensorrt, compute_capability=target_compute_capability)
    model_files = {options.label_filename: labels_bytes(labels)} if labels is not None else {}
    result = add_model(repo, config, files, model_files=model_files, version=version, force=force, io=io,
                       plan=meta, template_dir=template_dir, warnings=warnings)
    return result, config


def preprocess_package_files() -> dict[str, FileSource]:
    """trtrepo's own preprocessing code, copied into the preprocessing model's version folder so
    the server runs exactly ``Preprocess.apply`` (data.py plus the modules it imports)."""
    pkg = Path(__file__).parent
    files: dict[str, FileSource] = {"trtrepo_preprocess/__init__.py": b'"""Copy of trtrepo preprocessing (written by trtrepo)."""\n'}
    for rel in _module_closure(pkg, "data.py"):
        files[f"trtrepo_preprocess/{rel}"] = pkg / rel
    return files


def _module_closure(pkg: Path, start: str) -> list[str]:
    """``start`` and every module of the package it imports at module level, transitively (relative
    imports; a subpackage brings its ``__init__.py``), as paths relative to ``pkg``: what a copy of
    ``start`` needs to import on its own. Function-level imports are not followed (they load
    optional parts the preprocessing never calls)."""
    import ast

    todo, seen = [start], set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        here = Path(rel).parent
        for node in ast.parse((pkg / rel).read_text()).body:
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            names = [node.module] if node.module else [a.name for a in node.names]
            for name in names:
                target = base.joinpath(*name.split("."))
                if (pkg / target / "__init__.py").is_file():
                    parts = target.parts
                    todo += [str(Path(*parts[:i], "__init__.py")) for i in range(1, len(parts) + 1)]
                    todo += [str(target / f"{a.name}.py") for a in node.names if (pkg / target / f"{a.name}.py").is_file()]
                elif (pkg / f"{target}.py").is_file():
                    todo.append(f"{target}.py")
                    todo += [str(Path(*target.parts[:i], "__init__.py")) for i in range(1, len(target.parts))]
    return sorted(seen)


def add_image_ensemble(
    repo: str | Path,
    model: ModelConfig,
    preprocess: Any,
    *,
    name: str | None = None,
    image_input: str = "IMAGE",
    options: ModelOptions | None = None,
    version: int | None = None,
    force: bool = False,
    template_dir: str | Path | None = None,
) -> tuple[WriteResult, WriteResult]:
    """``<model>_preprocess`` (Python: image bytes -> input tensor) and ``<model>_ensemble``."""
    name = name or f"{model.name}_ensemble"
    pre_name = f"{model.name}_preprocess"
    if len(model.inputs) != 1:
        raise UsageError(f"ensemble '{name}': model '{model.name}' has {len(model.inputs)} inputs; an image ensemble needs one")
    tensor = model.inputs[0]
    from .modelio import TensorSpec

    dtype = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_UINT8": "uint8", "TYPE_INT8": "int8"}.get(tensor.data_type)
    if dtype is None or dtype != preprocess.dtype:
        raise UsageError(f"ensemble '{name}': preprocessing produces {preprocess.dtype} but input '{tensor.name}' is {tensor.data_type}")
    spec = TensorSpec(tensor.name, dtype, ((-1,) if model.max_batch_size > 0 else ()) + tuple(tensor.dims),
                      0 if model.max_batch_size > 0 else None)
    pre_cfg = preprocess_config(pre_name, image_input, spec, model.max_batch_size, options)
    ens_cfg = ensemble_config(name, image_input, pre_cfg, model)
    pre_spec = json.dumps(preprocess.to_dict(), indent=2).encode() + b"\n"
    files: dict[str, FileSource] = {"model.py": template_file("preprocess_model.py", template_dir), "preprocess.json": pre_spec}
    files.update(preprocess_package_files())
    # Render and validate the ensemble before writing anything (its steps must resolve).
    ens_text = render_config(ens_cfg, template_dir)
    known = _known_models(Path(repo), {pre_name: parse_config_text(render_config(pre_cfg, template_dir), pre_name)})
    validate_config_text(ens_text, f"{name}/config.pbtxt", model_dir_name=name, known_models=known)
    pre = add_model(repo, pre_cfg, files, model_files=execution_env_files(options or ModelOptions()), version=version,
                    force=force, template_dir=template_dir)
    ens = add_model(repo, ens_cfg, {}, version=version, force=force, template_dir=template_dir)
    return pre, ens


# --------------------------------------------------------------------------------------------
# Portability (trtrepo repo check)


@dataclass(frozen=True)
class Finding:
    """Something in a repository tied to this machine (``host``), a folder Triton fails to load
    (``broken``) or a GPU/TensorRT fact (``note``)."""

    path: str  # relative to the repository
    kind: str  # "host" | "broken" | "note"
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "kind": self.kind, "message": self.message}


_QUOTED_ABS = re.compile(r"""["'](/[^"'\s]+)["']""")
_SYSTEM_ROOTS = ("proc", "sys", "dev")


def _text_of(path: Path, limit: int = 4 << 20) -> str | None:
    try:
        if path.stat().st_size > limit:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _host_path(value: str, structured: bool) -> bool:
    """An absolute path that ties a file to this machine: in a config or JSON value always; in
    code (model.py) when it names an existing place here other than /proc, /sys, /dev."""
    parts = Path(value).parts
    if len(parts) < 2:
        return False
    if structured:
        return True
    return parts[1] not in _SYSTEM_ROOTS and os.path.exists(value)


def host_specific(repo: str | Path) -> list[Finding]:
    """What keeps ``repo`` from being copied to another machine or container: symlinks, absolute
    paths in its text files, an ``EXECUTION_ENV_PATH`` outside ``$$TRITON_MODEL_DIRECTORY`` (or
    an archive missing there); as notes, the TensorRT version and GPU each plan is tied to."""
    repo = Path(repo)
    if not repo.is_dir():
        raise UsageError(f"{repo}: model repository not found")
    found: list[Finding] = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and d != STAGING_NAME)
        for name in sorted(dirs + files):
            path = Path(root) / name
            rel = str(path.relative_to(repo))
            if path.is_symlink():
                found.append(Finding(rel, "host", f"symlink to {os.readlink(path)} (copy the file in instead)"))
                continue
            if name not in files or name == LOCK_NAME:
                continue
            text = _text_of(path)
            if text is None:
                continue
            structured = name == "config.pbtxt" or name.endswith(".json")
            for m in dict.fromkeys(_QUOTED_ABS.findall(text)):
                if _host_path(m, structured):
                    found.append(Finding(rel, "host", f"absolute path {m}"))
    for model_dir in sorted(d for d in repo.iterdir() if d.is_dir() and (d / "config.pbtxt").is_file()):
        found += _env_findings(repo, model_dir)
        found += _plan_notes(repo, model_dir)
    return found


def _env_findings(repo: Path, model_dir: Path) -> list[Finding]:
    try:
        cfg = read_config(model_dir)
    except UsageError as exc:
        return [Finding(str((model_dir / "config.pbtxt").relative_to(repo)), "host", f"unreadable config ({exc})")]
    if "EXECUTION_ENV_PATH" not in cfg.parameters:
        return []
    rel = str((model_dir / "config.pbtxt").relative_to(repo))
    value = cfg.parameters["EXECUTION_ENV_PATH"].string_value
    prefix = MODEL_DIRECTORY + "/"
    if not value.startswith(prefix):
        return [Finding(rel, "host", f"EXECUTION_ENV_PATH {value} is not under {MODEL_DIRECTORY} (ship a packed "
                                     f"environment in the model folder: --python-env ENV.tar.gz)")]
    if not (model_dir / value[len(prefix):]).is_file():
        return [Finding(rel, "host", f"EXECUTION_ENV_PATH {value}: {model_dir.name}/{value[len(prefix):]} is missing")]
    return []


def _plan_notes(repo: Path, model_dir: Path) -> list[Finding]:
    notes = []
    for plan in sorted(model_dir.glob("*/*.plan")):
        rel = str(plan.relative_to(repo))
        try:
            meta = read_plan_metadata(plan, missing_ok=True)
        except UsageError as exc:
            notes.append(Finding(rel, "note", f"TensorRT plan; its metadata is unreadable ({exc})"))
            continue
        if meta is None:
            notes.append(Finding(rel, "note", "TensorRT plan without model.plan.json: the TensorRT version and GPU it "
                                              "needs are unknown"))
            continue
        gpu = (f"GPUs of compute capability {meta.gpu.compute_capability} ({meta.gpu.name})" if meta.gpu else "an unknown GPU")
        if meta.hardware_compatibility:
            gpu = "GPUs of other architectures too (hardware compatibility)"
        notes.append(Finding(rel, "note", f"TensorRT plan: loads only with TensorRT {meta.tensorrt_version} on {gpu}"))
    return notes
