"""The layout of a model repository, ``REPO/NAME/VERSION/model.<ext>``, read back: versions,
configs, listings, and what Triton needs to load each model folder (:func:`load_problems`; one
rule for a local and an object-storage repository, :func:`incomplete_versions`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contracts import backends
from ..contracts.plan import GPUInfo, PlanMetadata, check_plan_compatibility
from ..errors import UsageError
from ..tritonconfig import parse_config_text

LOCK_NAME = ".trtrepo.lock"
STAGING_NAME = ".trtrepo-staging"  # inside REPO: only leftovers of older trtrepo versions (recovered)


MAX_VERSION = 2**63 - 1  # Triton's version numbers are int64

# Source of a file to write: a path (file or folder, copied) or the bytes themselves.
FileSource = Path | str | bytes

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


@dataclass(frozen=True)
class PlanTarget:
    """The serving machine a plan is checked against (:func:`check_plan_target`): its TensorRT
    version and its GPU's compute capability; None is not checked."""

    tensorrt: str | None = None
    compute_capability: str | None = None


def check_plan_target(meta: PlanMetadata | None, *, tensorrt_version: str | None = None,
                      compute_capability: str | None = None) -> list[str]:
    """Warnings when a plan was built for another TensorRT version or GPU than the target.

    A plan only loads under the exact TensorRT version that built it and (without hardware
    compatibility) on the GPU architecture it was built on (spec section 6, pain points 1-2).
    The check is :func:`trtrepo.contracts.plan.check_plan_compatibility`'s.
    """
    gpu = GPUInfo(name="", compute_capability=str(compute_capability)) if compute_capability else None
    return check_plan_compatibility(meta, tensorrt_version, gpu, target=True)


def check_relpath(rel: str, what: str) -> str:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel.startswith("."):
        raise UsageError(f"{what} '{rel}': must be a relative path inside the model folder")
    return rel


def config_io(msg: Any) -> tuple[Any, ...]:
    """What a config says of the model's IO (tensor names, data types, dims, batching on/off):
    two configs with different ``config_io`` cannot serve the same model file."""

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
