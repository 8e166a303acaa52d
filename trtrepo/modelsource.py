"""Model source kinds: what a ``SOURCE`` string names, how its PyTorch model is loaded and which
files stand for it in the reference cache's key.

A model source is one of (trtrepo's own kinds, tried in this order):

* ``builtin`` -- a built-in model by name (``demo``, ``demo-text``; its ``ModelSource.kind`` is
  the model's own name);
* ``onnx`` -- ``model.onnx``, passed through by export;
* ``torchscript`` -- a TorchScript file (``.pt``, ``.pth``, ``.ts``, ``.torchscript``, ``.jit``)
  loaded with ``torch.jit.load``;
* ``entry_point`` -- ``package.module:factory``, a callable returning an ``nn.Module``, with an
  optional state-dict file (``--weights``);
* ``torchvision`` -- a torchvision architecture name (``resnet18``) with a local weights file.

Each kind is a :class:`ModelSourceKind` record in the :data:`MODEL_SOURCES` registry (a plug-in
adds one through the ``trtrepo.model_sources`` entry points, see :mod:`trtrepo.plugins`):
:func:`resolve_source`, :func:`load_torch_model` and :func:`source_files_key` look the kind up
instead of branching on it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import plugins
from .contracts import builtin
from .data import import_callable
from .errors import MissingDependencyError, OptionError, UsageError, one_line
from .plugins import Registry

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript", ".jit")
# what an entry point's package or folder contributes to the cache key: its source and weights files
SOURCE_SUFFIXES = (".py",)
WEIGHTS_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")


@dataclass(frozen=True)
class ModelSource:
    """A resolved model source. ``kind`` is the kind's name (onnx, torchscript, entry_point,
    torchvision, a plug-in's), or a built-in model's own name."""

    kind: str
    location: str
    weights: str | None = None

    @property
    def is_torch(self) -> bool:
        return self.kind != "onnx"

    def describe(self) -> str:
        w = f" (weights {self.weights})" if self.weights else ""
        return f"{self.kind} {self.location}{w}"


def _no_files(source: ModelSource) -> str | None:
    return None


@dataclass(frozen=True)
class ModelSourceKind:
    """A kind of model source. ``resolve(spec, weights)``: the :class:`ModelSource` when ``spec``
    is of this kind, None when it is not (an error when it is but is wrong: a missing file, weights
    that do not apply); kinds are tried in registration order, trtrepo's own then the plug-ins',
    the ``catch_all`` ones (a broad form: any identifier, any ``a.b:c``) last. ``load(source)``:
    the PyTorch module in eval mode on the CPU (or an error naming why there is none).
    ``files_key(source)``: what stands for the source's own files in the reference cache's key
    (None: they cannot be found, and the export is not cached)."""

    name: str
    resolve: Callable[[str, str | None], ModelSource | None]
    load: Callable[[ModelSource], Any]
    files_key: Callable[[ModelSource], str | None] = _no_files
    catch_all: bool = False


MODEL_SOURCES: Registry[ModelSourceKind] = Registry(plugins.MODEL_SOURCES, "model source kind", ModelSourceKind,
                                                    lambda k: k.name)


def resolve_source(spec: str, weights: str | Path | None = None) -> ModelSource:
    """Classify a source string with the first kind that recognises it; errors name the file or
    entry point at fault."""
    w = str(weights) if weights is not None else None
    if w is not None and not Path(w).is_file():
        raise UsageError(f"{w}: weights file not found")
    for kind in sorted(MODEL_SOURCES.values(), key=lambda k: k.catch_all):  # stable: registration order
        source = kind.resolve(spec, w)
        if source is not None:
            return source
    path = Path(spec)
    if path.exists():
        raise UsageError(f"{path}: unsupported model file type '{path.suffix}' (expected .onnx or a TorchScript file)")
    raise UsageError(
        f"{spec}: model not found (expected demo, an .onnx or TorchScript file, 'package.module:factory' "
        f"or a torchvision architecture name)"
    )


def source_kind(source: ModelSource) -> ModelSourceKind | None:
    """The kind of a resolved source (a built-in model's kind is its own name), or None."""
    if builtin.module_of(source.kind) is not None:
        return BUILTIN_SOURCE
    return MODEL_SOURCES.get(source.kind)


def load_torch_model(source: ModelSource | str, weights: str | Path | None = None) -> Any:
    """Instantiate the PyTorch model of a source, in eval mode on the CPU."""
    if isinstance(source, str):
        source = resolve_source(source, weights)
    kind = source_kind(source)
    if kind is None:
        raise UsageError(f"unknown model source kind '{source.kind}'")
    return kind.load(source)


def source_files_key(source: ModelSource) -> str | None:
    """The part of the reference cache's key that stands for the source's own files, or None when
    they cannot be found (the export is then not cached): the kind's ``files_key``."""
    kind = source_kind(source)
    return kind.files_key(source) if kind is not None else None


# --------------------------------------------------------------------------------------------
# PyTorch


def import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError("torch", "for PyTorch sources and the reference", "pip install 'trtrepo[torch]'") from exc
    return torch


def _load_state_dict(torch: Any, path: str) -> Any:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"{path}: cannot read state dict ({type(exc).__name__}: {one_line(exc)})") from exc
    if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise UsageError(f"{path}: not a state dict (got {type(state).__name__})")
    return state


def _apply_weights(torch: Any, model: Any, weights: str | None) -> None:
    if weights is None:
        return
    state = _load_state_dict(torch, weights)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise UsageError(f"{weights}: state dict does not fit the model: {detail}") from exc


def _resolve_builtin(spec: str, weights: str | None) -> ModelSource | None:
    if spec not in builtin.names():
        return None
    if weights is not None:
        raise OptionError("weights", f"cannot be combined with the built-in '{spec}' model")
    return ModelSource(spec, spec)


def _load_builtin(source: ModelSource) -> Any:
    import_torch()
    plugin = builtin.builtin(source.kind)
    if plugin is None:  # only for a source of another kind
        raise UsageError(f"'{source.kind}' is not a built-in model")
    return plugin.build_model()


def _builtin_key(source: ModelSource) -> str | None:
    module = builtin.module_of(source.kind)
    return _builtin_files_key(module) if module is not None else None


def _resolve_onnx(spec: str, weights: str | None) -> ModelSource | None:
    path = Path(spec)
    if path.suffix.lower() != ".onnx":
        return None
    if not path.is_file():
        raise UsageError(f"{path}: ONNX file not found")
    if weights is not None:
        raise OptionError("weights", "does not apply to an ONNX model")
    return ModelSource("onnx", str(path))


def _load_onnx(source: ModelSource) -> Any:
    raise OptionError("", f"{source.location}: an ONNX file has no PyTorch model; give the PyTorch source as {{reference}}",
                      others={"reference": "the reference"})


def _resolve_torchscript(spec: str, weights: str | None) -> ModelSource | None:
    path = Path(spec)
    if path.suffix.lower() not in TORCHSCRIPT_SUFFIXES:
        return None
    if not path.is_file():
        raise UsageError(f"{path}: TorchScript file not found")
    return ModelSource("torchscript", str(path), weights)


def _load_torchscript(source: ModelSource) -> Any:
    torch = import_torch()
    try:
        model = torch.jit.load(source.location, map_location="cpu")
    except Exception as exc:
        raise OptionError(
            "", f"{source.location}: not a TorchScript file ({type(exc).__name__}); for a state dict use "
            f"'package.module:factory' with {{weights}}", others={"weights": "a weights file"}
        ) from exc
    _apply_weights(torch, model, source.weights)
    return model.eval()


def _torchscript_key(source: ModelSource) -> str | None:
    path = Path(source.location)
    return _files_digest(path.parent, [path])


def _is_entry_point(spec: str) -> bool:
    mod, sep, attr = spec.partition(":")
    return bool(sep and attr) and all(p.isidentifier() for p in mod.split(".")) and all(
        p.isidentifier() for p in attr.split(".")
    )


def _resolve_entry_point(spec: str, weights: str | None) -> ModelSource | None:
    return ModelSource("entry_point", spec, weights) if _is_entry_point(spec) else None


def _load_entry_point(source: ModelSource) -> Any:
    torch = import_torch()
    factory = import_callable(source.location)
    try:
        model = factory()
    except Exception as exc:
        raise UsageError(f"'{source.location}': the factory raised {type(exc).__name__}: {one_line(exc)}") from exc
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"'{source.location}': the factory returned a {type(model).__name__}, not a torch.nn.Module")
    _apply_weights(torch, model, source.weights)
    return model.eval()


def _resolve_torchvision(spec: str, weights: str | None) -> ModelSource | None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", spec):
        return None
    if weights is None:
        raise OptionError("", f"torchvision architecture '{spec}' needs a local weights file ({{weights}})",
                          others={"weights": "weights"})
    return ModelSource("torchvision", spec, weights)


def _load_torchvision(source: ModelSource) -> Any:
    torch = import_torch()
    try:
        import torchvision
    except Exception as exc:
        raise MissingDependencyError("torchvision", f"for the architecture '{source.location}'", "pip install torchvision") from exc
    if source.location not in torchvision.models.list_models():
        raise UsageError(f"'{source.location}' is not a torchvision architecture")
    model = torchvision.models.get_model(source.location, weights=None)
    _apply_weights(torch, model, source.weights)
    return model.eval()


def _torchvision_key(source: ModelSource) -> str | None:
    try:
        return f"torchvision=={md.version('torchvision')}"
    except md.PackageNotFoundError:
        return None


def _entry_point_key(source: ModelSource) -> str | None:
    return _entry_point_files_key(source.location)


# --------------------------------------------------------------------------------------------
# The files that stand for a source in the reference cache's key


def file_digest(path: Path, h: Any) -> None:
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)


def _files_digest(root: Path, files: Sequence[Path]) -> str:
    """SHA-256 over each file's path relative to ``root`` and its content, in path order."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        file_digest(f, h)
        h.update(b"\0")
    return h.hexdigest()


def _folder_files(folder: Path, suffixes: Sequence[str], recursive: bool) -> list[Path]:
    """The files of ``folder`` with one of ``suffixes`` (hidden folders and ``__pycache__``
    skipped; symlinked folders not followed)."""
    if not recursive:
        return [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes]
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        out += [Path(dirpath) / f for f in filenames if Path(f).suffix.lower() in suffixes]
    return out


def _installed_version(folder: Path, top: str) -> str | None:
    """``dist==version`` for a package installed in site-packages (its files change with its
    version only), else None."""
    if not any(part in ("site-packages", "dist-packages") for part in folder.parts):
        return None

    dists = md.packages_distributions().get(top) or []
    return f"{dists[0]}=={md.version(dists[0])}" if dists else None


def _builtin_files_key(module: str) -> str | None:
    """A built-in model: every file of its plug-in's folder."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    folder = Path(spec.origin).parent
    return _files_digest(folder, [p for p in folder.iterdir() if p.is_file()])


def _entry_point_files_key(location: str) -> str | None:
    """An entry point's top-level package or module, imported from where the factory is
    (trtrepo.data.import_callable). Decision: an installed one stands for its version; a
    package for every source and weights file under it (namespace packages: each folder); a
    module for those beside it; a built-in or frozen module, or one not found, for nothing."""
    suffixes = SOURCE_SUFFIXES + WEIGHTS_SUFFIXES
    top = location.partition(":")[0].split(".")[0]
    if "" not in sys.path and "." not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # where the factory is imported from (trtrepo.data.import_callable)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (namespace packages have several folders)
        folders = [Path(p) for p in spec.submodule_search_locations if Path(p).is_dir()]
        if not folders:
            return None
        installed = _installed_version(folders[0], top)
        if installed is not None:
            return installed
        return "+".join(_files_digest(f, _folder_files(f, suffixes, recursive=True)) for f in folders)
    if not spec.origin or not Path(spec.origin).is_file():
        return None  # built-in or frozen modules
    folder = Path(spec.origin).parent
    installed = _installed_version(folder, top)
    if installed is not None:
        return installed
    return _files_digest(folder, _folder_files(folder, suffixes, recursive=False))


BUILTIN_SOURCE = MODEL_SOURCES.register(ModelSourceKind("builtin", _resolve_builtin, _load_builtin, _builtin_key))
ONNX_SOURCE = MODEL_SOURCES.register(ModelSourceKind("onnx", _resolve_onnx, _load_onnx))
TORCHSCRIPT_SOURCE = MODEL_SOURCES.register(ModelSourceKind("torchscript", _resolve_torchscript, _load_torchscript,
                                                            _torchscript_key))
ENTRY_POINT_SOURCE = MODEL_SOURCES.register(ModelSourceKind("entry_point", _resolve_entry_point, _load_entry_point,
                                                            _entry_point_key, catch_all=True))
TORCHVISION_SOURCE = MODEL_SOURCES.register(ModelSourceKind("torchvision", _resolve_torchvision, _load_torchvision,
                                                            _torchvision_key, catch_all=True))
