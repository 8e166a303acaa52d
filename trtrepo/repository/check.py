"""Portability (``trtrepo repo check``): what ties a repository to this machine (:func:`host_specific`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..contracts.plan import read_plan_metadata
from ..errors import UsageError
from ..tritonconfig import MODEL_DIRECTORY
from .layout import LOCK_NAME, STAGING_NAME, read_config


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
