"""Writing one model: :func:`add_model` (and :func:`replace_config` for ``trtrepo tune --apply``).

:func:`add_model` renders a :class:`~trtrepo.tritonconfig.ModelConfig`, validates the text
(protobuf schema + Triton's load-time rules, against the model file's IO) and only then writes
(:mod:`trtrepo.repository.commit`); a new version number is allocated unless ``version`` is given
(1 .. 2**63-1, Triton's int64); an existing version is never replaced without ``force``; a file
lock (``REPO/.trtrepo.lock``) serialises concurrent writers.

A new config whose IO (names, data types, dims, batching on/off) differs from the live one is
refused while its version policy would serve an old version under it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..contracts.plan import PlanMetadata
from ..errors import OptionError, UsageError
from ..fsutil import atomic_write_text
from ..modelio import ModelIO
from ..tritonconfig import ModelConfig, check_model_name, check_rendered, parse_config_text, render_config, validate_config_text
from .commit import recover, repository_lock, write_version
from .layout import MAX_VERSION, FileSource, WriteResult, check_relpath, config_io, read_config, served_versions, versions_of
from .loads import check_model_loads

log = logging.getLogger(__name__)


def known_models(repo: Path, pending: Mapping[str, Any] | None) -> dict[str, Any]:
    known: dict[str, Any] = {}
    if repo.is_dir():
        for d in repo.iterdir():
            if d.is_dir() and not d.name.startswith(".") and (d / "config.pbtxt").is_file():
                with contextlib.suppress(UsageError):
                    known[d.name] = read_config(d)
    known.update(pending or {})
    return known


def _check_files(name: str, config: ModelConfig, version_files: Mapping[str, FileSource],
                 model_files: Mapping[str, FileSource]) -> None:
    """Relative paths inside the model folder, no ``config.pbtxt`` among the model files (trtrepo
    writes it), the version folder holds the files the config names, and every source exists."""
    for rel in (*version_files, *model_files):
        check_relpath(rel, "file")
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


def _version_to_write(model_dir: Path, existing: Sequence[int], version: int | None, force: bool) -> int:
    """Decision: no version given takes the next number (none left is an error); a given one
    must fit Triton's int64, and replaces an existing one only with ``force``."""
    if version is None:
        version = (max(existing) + 1) if existing else 1
        if version > MAX_VERSION:
            raise OptionError("", f"{model_dir}: no version number left after {max(existing)} (Triton's versions "
                                  f"are int64); give {{version}}", others={"version": "a version"})
    elif version > MAX_VERSION:
        raise OptionError("version", f"{version}: beyond Triton's largest version number {MAX_VERSION}", concept="the model version")
    if version in existing and not force:
        raise OptionError("", f"{model_dir / str(version)}: version {version} already exists (use {{force}} to "
                              f"replace it, or leave {{version}} out to add version {max(existing) + 1})",
                          others={"force": "force=True", "version": "the version"})
    return version


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
    """Render, validate, try loading (:func:`~trtrepo.repository.loads.check_model_loads`) and
    write one model. Nothing is written when anything fails."""
    repo = Path(repo)
    name = check_model_name(config.name)
    if version is not None and version < 1:
        raise OptionError("version", f"{version}: versions are integers >= 1", concept="the model version")
    model_files = dict(model_files or {})
    _check_files(name, config, version_files, model_files)

    text = render_config(config, template_dir)
    where = f"{name}/config.pbtxt"
    known = known_models(repo, None) if config.kind == "ensemble" else None
    msg = validate_config_text(text, where, io=io, plan=plan, model_dir_name=name, known_models=known,
                               model_files=sorted(model_files))
    check_rendered(msg, config, where, template_dir)
    warnings = [*warnings, *check_model_loads(msg, version_files, plan=plan, what=f"model '{name}' not written")]

    with repository_lock(repo):
        recover(repo)
        model_dir = repo / name
        existing = versions_of(model_dir)
        version = _version_to_write(model_dir, existing, version, force)
        replaced = version in existing
        if existing:
            _check_kept_versions(model_dir, text, existing, version)
        write_version(repo, model_dir, version, text, version_files, model_files)
    files = sorted(str(p.relative_to(model_dir / str(version))) for p in (model_dir / str(version)).rglob("*") if p.is_file())
    for w in warnings:
        log.warning("%s: %s", name, w)
    return WriteResult(name, version, model_dir, text, files, list(warnings), replaced)


def replace_config(repo: str | Path, name: str, text: str, *, started_from: str | None = None,
                   rebase: Callable[[str], str] | None = None) -> Path:
    """Write ``text`` as model ``name``'s ``config.pbtxt`` (``trtrepo tune --apply``): checked like
    every config trtrepo writes, the same inputs and outputs as the live one, versions still
    served, then one atomic rename under the repository lock -- a server polling the repository
    reads the old file or the new one, never a mix.

    A read-modify-write never loses a concurrent change: ``started_from`` is the config text the
    caller read before it began (a tune runs for minutes). Under the lock the live text is compared
    with it; when another writer changed it meanwhile (``repo add`` with a new version policy or
    parameter), ``rebase(live_text)`` computes the text anew on top of the live config (it raises
    :class:`UsageError` when the two changes touch the same fields), and without ``rebase`` the
    write is refused. The checks run on the text actually written, inside the lock."""
    repo = Path(repo)
    model_dir = repo / check_model_name(name)
    where = f"{name}/config.pbtxt"
    with repository_lock(repo):
        recover(repo)
        live_text = (model_dir / "config.pbtxt").read_text() if (model_dir / "config.pbtxt").is_file() else None
        if started_from is not None and live_text != started_from:
            if rebase is None or live_text is None:
                raise UsageError(f"{model_dir / 'config.pbtxt'}: changed by another writer since it was read; not written")
            text = rebase(live_text)
        live = read_config(model_dir)
        msg = validate_config_text(text, where, model_dir_name=name)
        if config_io(msg) != config_io(live):
            raise UsageError(f"{model_dir / 'config.pbtxt'}: the new config changes the model's inputs or outputs; "
                             f"not written")
        existing = versions_of(model_dir)
        if existing:
            _check_kept_versions(model_dir, text, existing, max(existing))
        for v in served_versions(msg, existing):  # each served model file loads under the new config
            vdir = model_dir / str(v)
            files = {str(p.relative_to(vdir)): p for p in vdir.rglob("*") if p.is_file()}
            for w in check_model_loads(msg, files, what="the new config is not written"):
                log.warning("%s: %s", name, w)
        return Path(atomic_write_text(model_dir / "config.pbtxt", text))


def _check_kept_versions(model_dir: Path, text: str, existing: Sequence[int], version: int) -> None:
    """Refuse a config whose IO differs from the live config's while its version policy would
    serve an old version under it (Triton would fail to load that version)."""
    try:
        live = read_config(model_dir)
    except UsageError:
        return  # no readable live config: nothing is served from this folder now
    new = parse_config_text(text, f"{model_dir.name}/config.pbtxt")
    if config_io(live) == config_io(new):
        return
    old = [v for v in served_versions(new, sorted({*existing, version})) if v != version]
    if old:
        raise OptionError("", f"model '{model_dir.name}': the new version's IO (input/output names, data types, dims, "
                              f"batching) differs from the live config.pbtxt's, and its version policy would serve the "
                              f"older version(s) {', '.join(map(str, old))} under the new config; use another {{name}}, "
                              f"or {{version_policy}} latest:1",
                          others={"name": "model name", "version_policy": "the version policy"})
