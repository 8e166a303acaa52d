"""``model.plan.json``, the metadata ``trtrepo build`` writes beside a TensorRT plan: where and
how the plan was built (TensorRT version, GPU, precision route, profiles, IO). :class:`PlanMetadata`
is its only reader (:func:`read_plan_metadata`) and writer (:meth:`PlanMetadata.write`); the
build stage, the repository writer, the server command and the compatibility check all go
through it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..fsutil import atomic_write_bytes
from ..modelio import ModelIO
from .profile import ShapeRange

PLAN_METADATA_FORMAT = "trtrepo.plan-metadata/1"
PLAN_METADATA_SUFFIX = ".json"  # model.plan -> model.plan.json


def plan_metadata_path(plan: str | Path) -> Path:
    plan = Path(plan)
    return plan.with_name(plan.name + PLAN_METADATA_SUFFIX)


@dataclass(frozen=True)
class GPUInfo:
    """The GPU a plan was built on (or the one present now)."""

    name: str
    compute_capability: str
    driver_version: str | None = None
    cuda_runtime_version: str | None = None
    index: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "compute_capability": self.compute_capability,
            "driver_version": self.driver_version,
            "cuda_runtime_version": self.cuda_runtime_version,
            "index": self.index,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPUInfo:
        return cls(
            name=str(data.get("name") or ""),
            compute_capability=str(data["compute_capability"]),
            driver_version=data.get("driver_version"),
            cuda_runtime_version=data.get("cuda_runtime_version"),
            index=int(data.get("index", 0)),
        )


@dataclass(frozen=True)
class IOTensor:
    """One IO tensor as the engine reports it."""

    name: str
    dtype: str  # numpy name
    shape: tuple[int, ...]  # -1 for dynamic
    mode: str  # "INPUT" | "OUTPUT"
    trt_dtype: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "trt_dtype": self.trt_dtype, "shape": list(self.shape), "mode": self.mode}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IOTensor:
        return cls(d["name"], d["dtype"], tuple(d["shape"]), d["mode"], d.get("trt_dtype", ""))


def profile_axes(io: ModelIO, profile: Mapping[str, ShapeRange]) -> dict[str, list[dict[str, Any]]]:
    """The profile per dynamic axis: ``{input: [{axis, name, min, opt, max}, ...]}`` (for model.plan.json)."""
    out: dict[str, list[dict[str, Any]]] = {}
    specs = {s.name: s for s in io.inputs}
    for name, r in profile.items():
        spec = specs.get(name)
        axes = spec.dynamic_axes if spec is not None else tuple(
            a for a in range(len(r.min)) if not r.min[a] == r.opt[a] == r.max[a])
        out[name] = [{"axis": a,
                      "name": (spec.dim_names[a] if spec is not None and spec.dim_names else None),
                      "min": r.min[a], "opt": r.opt[a], "max": r.max[a]} for a in axes]
    return out


@dataclass(frozen=True)
class PlanMetadata:
    """What ``model.plan.json`` holds. ``profiles``: every optimization profile of the engine
    (``{input: ShapeRange}`` each); ``hardware_compatibility``: the plan runs on other GPU
    architectures (TensorRT's hardware compatibility), which lifts the compute capability check."""

    tensorrt_version: str
    io: ModelIO
    gpu: GPUInfo | None = None
    precision_route: str = ""
    calibration_method: str | None = None
    source_onnx: str = ""
    source_sha256: str = ""
    profiles: tuple[Mapping[str, ShapeRange], ...] = ()
    io_tensors: tuple[IOTensor, ...] = ()
    trtexec: str = ""
    build: Mapping[str, Any] = field(default_factory=dict)
    plan_sha256: str = ""
    created: str = ""
    trtrepo_version: str = ""
    precision: Mapping[str, Any] = field(default_factory=dict)  # {"mode": "int8"|"int8+fp16", "fp16": {...}|None}
    hardware_compatibility: bool = False

    @property
    def profile(self) -> Mapping[str, ShapeRange]:
        """Profile 0 (the one trtrepo builds)."""
        return self.profiles[0] if self.profiles else {}

    @property
    def max_batch_size(self) -> int:
        """Triton's max_batch_size for this plan with no profile selected (:meth:`triton_max_batch`);
        0 when the model has no batch axis."""
        if not self.io.has_batch_axis:
            return 0
        return self.triton_max_batch() or 0

    def profile_named(self, name: str) -> Mapping[str, ShapeRange]:
        """The optimization profile that Triton's ``instance_group.profile`` calls ``name`` (its index)."""
        if not (str(name).isdigit() and int(name) < len(self.profiles)):
            have = ", ".join(str(i) for i in range(len(self.profiles))) or "none"
            raise UsageError(f"instance_group.profile: the plan has no optimization profile '{name}' (has {have})")
        return self.profiles[int(name)]

    def triton_max_batch(self, selected: Sequence[str] = ()) -> int | None:
        """Triton's rule for a plan's max batch: per optimization profile, the smallest largest
        batch (axis 0 of kMAX) over its inputs; then the largest over the profiles the instance
        groups select (profile "0" when none is). None when the plan has no profile."""
        if not self.profiles:
            return None
        best = 0
        for name in list(selected) or ["0"]:
            per_input = [r.max[0] for r in self.profile_named(name).values() if r.max]
            if per_input:
                best = max(best, min(per_input))
        return best

    def portable(self) -> PlanMetadata:
        """This metadata as a repository carries it: the absolute paths of the build machine in the
        fields that hold paths (the source ONNX, the trtexec command, the build's cache files, where
        the FP16 ONNX model was saved) cut to their file names. Other strings (tensor and layer
        names, which may start with "/") stay."""
        precision = dict(self.precision)
        fp16 = precision.get("fp16")
        if isinstance(fp16, Mapping) and fp16.get("saved_to"):
            precision["fp16"] = {**fp16, "saved_to": _strip_paths(fp16["saved_to"])}
        return replace(self, source_onnx=_strip_paths(self.source_onnx), trtexec=_strip_paths(self.trtexec),
                       build=_strip_paths(dict(self.build)), precision=precision)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_METADATA_FORMAT,
            "tensorrt_version": self.tensorrt_version,
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "precision_route": self.precision_route,
            "calibration_method": self.calibration_method,
            "source_onnx": {"path": self.source_onnx, "sha256": self.source_sha256},
            "plan_sha256": self.plan_sha256,
            "precision": dict(self.precision),
            "profiles": [{name: r.to_dict() for name, r in p.items()} for p in self.profiles],
            "profile_axes": [profile_axes(self.io, p) for p in self.profiles],
            "max_batch_size": self.max_batch_size,
            "io_tensors": [t.to_dict() for t in self.io_tensors],
            "io": self.io.to_dict(),
            "trtexec": self.trtexec,
            "build": dict(self.build),
            "created": self.created,
            "trtrepo_version": self.trtrepo_version,
            **({"hardware_compatibility": True} if self.hardware_compatibility else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write(self, plan: str | Path) -> Path:
        """Write ``model.plan.json`` beside ``plan`` (atomically); returns its path."""
        return atomic_write_bytes(plan_metadata_path(plan), self.to_json().encode())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "") -> PlanMetadata:
        where = source or "plan metadata"
        if d.get("format") != PLAN_METADATA_FORMAT:
            raise UsageError(f"{where}: unknown format {d.get('format')!r} (expected {PLAN_METADATA_FORMAT})")
        try:
            profiles = d.get("profiles") or []
            if isinstance(profiles, Mapping):  # {"0": {...}, "1": {...}}
                profiles = [profiles[k] for k in sorted(profiles, key=lambda k: int(k))]
            source_onnx = d.get("source_onnx") or {}
            return cls(
                tensorrt_version=str(d["tensorrt_version"]),
                io=ModelIO.from_dict(d["io"], source=source),
                gpu=GPUInfo.from_dict(d["gpu"]) if d.get("gpu") else None,
                precision_route=d.get("precision_route", ""),
                calibration_method=d.get("calibration_method"),
                source_onnx=source_onnx.get("path", ""),
                source_sha256=source_onnx.get("sha256", ""),
                profiles=tuple({name: ShapeRange.from_dict(r) for name, r in p.items()} for p in profiles),
                io_tensors=tuple(IOTensor.from_dict(t) for t in d.get("io_tensors", ())),
                trtexec=d.get("trtexec", ""),
                build=d.get("build", {}),
                plan_sha256=d.get("plan_sha256", ""),
                created=d.get("created", ""),
                trtrepo_version=d.get("trtrepo_version", ""),
                precision=d.get("precision") or {},
                hardware_compatibility=bool(d.get("hardware_compatibility")),
            )
        except KeyError as exc:
            raise UsageError(f"{where}: incomplete plan metadata (missing {exc})") from exc
        except (TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{where}: malformed plan metadata ({exc})") from exc


_ABS_PATH = re.compile(r"(?<![\w.~$])/(?:[^\s/'\"=,;:]+/)*([^\s/'\"=,;:]+)")


def _strip_paths(value: Any) -> Any:
    """Every absolute path in the strings of ``value`` (nested lists and dicts too) cut to its file name."""
    if isinstance(value, str):
        return _ABS_PATH.sub(lambda m: m.group(1), value)
    if isinstance(value, list):
        return [_strip_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: _strip_paths(v) for k, v in value.items()}
    return value


def read_plan_metadata(path: str | Path, *, missing_ok: bool = False) -> PlanMetadata | None:
    """Read ``model.plan.json`` (give the plan or the JSON path); None when it is missing and
    ``missing_ok``. The one reader of the file."""
    path = Path(path)
    meta = path if path.suffix == ".json" else plan_metadata_path(path)
    if not meta.is_file():
        if missing_ok:
            return None
        raise UsageError(f"{meta}: plan metadata not found (written by 'trtrepo build' beside the plan)")
    try:
        text = meta.read_text()
    except OSError as exc:
        raise UsageError(f"{meta}: unreadable plan metadata ({exc})") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{meta}: plan metadata is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{meta}: plan metadata must be a JSON object")
    return PlanMetadata.from_dict(data, source=str(meta))


def check_plan_compatibility(meta: PlanMetadata | None, tensorrt_version: str | None, gpu: GPUInfo | None, *,
                             target: bool = False) -> list[str]:
    """Reasons the plan may not load or run well with this TensorRT/GPU (empty: matches). A plan is
    tied to the exact TensorRT version and to the GPU's compute capability it was built for (unless
    built hardware-compatible). ``target``: the TensorRT/GPU are those of a target server rather
    than this machine (wording only); a GPU given without a name is compared by compute capability only."""
    if meta is None:
        return []
    built_trt, built_gpu = meta.tensorrt_version, meta.gpu
    problems = []
    if tensorrt_version and built_trt and str(tensorrt_version) != str(built_trt):
        have = f"the target server has TensorRT {tensorrt_version}" if target else f"TensorRT {tensorrt_version} is installed"
        problems.append(f"plan was built with TensorRT {built_trt} but {have} "
                        "(plans only load in the TensorRT version that built them; rebuild it)")
    if gpu is not None and built_gpu is not None and not meta.hardware_compatibility:
        this_gpu = "the target GPU" if target else "this GPU"
        if gpu.compute_capability != built_gpu.compute_capability:
            built_on = f"{built_gpu.compute_capability} ({built_gpu.name})" if built_gpu.name else built_gpu.compute_capability
            now = f"is {gpu.name} with compute capability" if gpu.name else "has compute capability"
            problems.append(f"plan was built for compute capability {built_on} but {this_gpu} {now} "
                            f"{gpu.compute_capability}; it will not load, rebuild it")
        elif gpu.name and built_gpu.name and gpu.name != built_gpu.name:
            problems.append(f"plan was built on {built_gpu.name}, {this_gpu} is {gpu.name} (same compute capability "
                            f"{gpu.compute_capability}: it loads, but tactics were timed on the other GPU)")
    return problems
