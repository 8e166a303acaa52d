"""PyTorch reference runner: the source model's outputs on a data source, and the reference's
export, cached.

The reference is what served models are compared against (evaluation, ``trtrepo validate``).
It runs on the CPU by default and on CUDA when asked for (``device="auto"`` picks CUDA when
available).

**The reference's export cache.** ``trtrepo validate`` reads a PyTorch reference's IO contract
(names, dtypes, dims) off its ONNX export (:func:`export_reference`). The export is done once and
kept in ``$TRTREPO_CACHE_DIR/reference`` (default ``$XDG_CACHE_HOME/trtrepo/reference``, else
``~/.cache/trtrepo/reference``) as ``<source>-<key>.onnx`` with a ``.json`` beside it (what the key
was made of and the export's notes). The key (:func:`reference_key`) is a SHA-256 over what
determines the export: the source's files (an entry point's package: its ``.py`` and weights files;
a top-level module: the ``.py`` and weights files beside it; a TorchScript file; a built-in model's
folder), the ``--weights`` file, the export inputs, dynamic axes, output names and opset, the torch
and onnx versions and trtrepo's exporter source. Editing any of them exports again; files the
factory reads from elsewhere are not in the key (``--no-cache`` exports afresh). A new entry
replaces the older ones of the same source, so the cache holds one export per source. An entry is
written atomically; one that cannot be read is exported again, and a cache folder that cannot be
written only costs the reuse (a warning).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, export, modelsource
from ..data import DataSource, iter_batches
from ..errors import OptionError, TrtrepoError, UsageError, one_line
from ..export import DEFAULT_OPSET, InputShape, export_onnx
from ..fsutil import atomic_path, atomic_write_text, temp_dir
from ..modelio import ModelIO
from ..modelsource import ModelSource, file_digest, import_torch, load_torch_model, resolve_source, source_files_key

log = logging.getLogger(__name__)


@dataclass
class ReferenceResult:
    outputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    device: str


def resolve_device(device: str) -> str:
    torch = import_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionError("reference_device", f"{device}: CUDA is not available to torch on this machine")
    if device != "cpu" and not device.startswith("cuda"):
        raise OptionError("reference_device", f"{device}: expected cpu, cuda, cuda:N or auto")
    return device


class Reference:
    """A loaded PyTorch model plus the input/output names it is called with."""

    def __init__(
        self,
        source: ModelSource | str,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        weights: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.torch = import_torch()
        self.source = resolve_source(source, weights) if isinstance(source, str) else source
        self.device = resolve_device(device)
        self.model = load_torch_model(self.source).to(self.device)
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    @classmethod
    def for_io(cls, source: ModelSource | str, io: ModelIO, **kw: Any) -> Reference:
        return cls(source, input_names=io.input_names, output_names=io.output_names, **kw)

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        args = [torch.from_numpy(np.ascontiguousarray(feed[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            out = self.model(*args)
        if isinstance(out, dict):
            out = list(out.values())
        if not isinstance(out, (list, tuple)):
            out = [out]
        if len(out) != len(self.output_names):
            raise UsageError(
                f"{self.source.location}: the PyTorch model returns {len(out)} outputs but the deployed model has "
                f"{len(self.output_names)} ({', '.join(self.output_names)})"
            )
        return {n: o.detach().float().cpu().numpy() for n, o in zip(self.output_names, out, strict=True)}

    def run(
        self,
        data: DataSource,
        *,
        batch_size: int = 32,
        io: ModelIO | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ReferenceResult:
        parts: dict[str, list[np.ndarray]] = {n: [] for n in self.output_names}
        labels: list[np.ndarray] = []
        for batch in iter_batches(data, batch_size, io):
            for k, v in self(batch.inputs).items():
                parts[k].append(v)
            if batch.labels is not None:
                labels.append(batch.labels)
            if progress:
                progress(batch.size)
        outputs = {k: _concat(v) for k, v in parts.items()}
        return ReferenceResult(outputs, np.concatenate(labels) if labels and data.has_labels else None, self.device)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate on the batch axis; variable trailing shapes (sequence outputs) become an object array."""
    if len({p.shape[1:] for p in parts}) <= 1:
        return np.concatenate(parts)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    i = 0
    for p in parts:
        for row in p:
            out[i] = row
            i += 1
    return out


def run_reference(
    source: ModelSource | str,
    data: DataSource,
    io: ModelIO,
    *,
    weights: str | None = None,
    device: str = "cpu",
    batch_size: int = 32,
) -> ReferenceResult:
    """Run the PyTorch source model over ``data``; outputs are keyed by ``io``'s output names."""
    return Reference.for_io(source, io, weights=weights, device=device).run(data, batch_size=batch_size, io=io)


# --------------------------------------------------------------------------------------------
# The reference's export, cached

CACHE_ENV = "TRTREPO_CACHE_DIR"
CACHE_FORMAT = 1


def cache_dir() -> Path:
    """Where reference exports are kept: ``$TRTREPO_CACHE_DIR/reference``, else
    ``$XDG_CACHE_HOME/trtrepo/reference`` (an absolute ``XDG_CACHE_HOME`` only, as the XDG spec
    says), else ``~/.cache/trtrepo/reference``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root).expanduser() / "reference"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "trtrepo" / "reference"


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def reference_key(source: ModelSource, *, inputs: Sequence[InputShape] | None,
                  dynamic_axes: Mapping[str, Mapping[int, str]] | None, output_names: Sequence[str] | None,
                  opset: int = DEFAULT_OPSET) -> tuple[str, dict[str, Any]] | None:
    """``(key, parts)``: the SHA-256 (hex) of what determines the reference's export and the
    parts it was made of (JSON-ready), or None when the source's files cannot be found or read
    (the export then happens as if there were no cache, and reports its own errors)."""

    try:
        files = source_files_key(source)
        weights = None
        if files is not None and source.weights is not None:
            h = hashlib.sha256()
            file_digest(Path(source.weights), h)
            weights = h.hexdigest()
    except OSError as exc:
        log.info("%s: cannot read its files for the cache key (%s)", source.location, one_line(exc))
        return None
    if files is None:
        return None
    exporter = hashlib.sha256()
    file_digest(Path(export.__file__), exporter)
    file_digest(Path(modelsource.__file__), exporter)  # the source kinds' loaders shape the export too
    parts = {
        "format": CACHE_FORMAT,
        "source": {"kind": source.kind, "location": source.location},
        "source_files": files,
        "weights": weights,
        "inputs": None if inputs is None else [[i.name, list(i.shape), i.dtype, i.given] for i in inputs],
        "dynamic_axes": {k: {str(a): str(n) for a, n in sorted(v.items())} for k, v in sorted((dynamic_axes or {}).items())},
        "output_names": None if output_names is None else list(output_names),
        "opset": opset,
        "versions": {"trtrepo": __version__, "torch": _version("torch"), "onnx": _version("onnx")},
        "exporter": exporter.hexdigest(),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest(), parts


def _entry_stem(source: ModelSource, key: str) -> tuple[str, str]:
    """(prefix shared by every entry of this source, this entry's file stem)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source.location).name if source.kind == "torchscript"
                      else source.location)[:48]
    ident = hashlib.sha256(f"{source.kind}\0{source.location}\0{source.weights or ''}".encode()).hexdigest()[:8]
    prefix = f"{readable}-{ident}-"
    return prefix, prefix + key[:32]


@dataclass
class ExportedReference:
    """The reference's IO as read off its export; ``path`` is the cache entry (None when not
    cached), ``from_cache`` whether this run reused it."""

    io: ModelIO
    notes: list[str] = field(default_factory=list)
    path: Path | None = None
    from_cache: bool = False


def export_reference(source: ModelSource, *, inputs: Sequence[InputShape] | None = None,
                     dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
                     output_names: Sequence[str] | None = None, workdir: str | Path | None = None,
                     cache: bool = True) -> ExportedReference:
    """The PyTorch ``source`` exported to ONNX (:func:`trtrepo.export.export_onnx`) for its IO:
    from the cache when an entry of the same key is there (no export, no exporter warnings),
    else exported in a temporary folder and then copied into the cache. ``cache=False``
    (``--no-cache``) neither reads nor writes the cache."""

    keyed = reference_key(source, inputs=inputs, dynamic_axes=dynamic_axes, output_names=output_names) if cache else None
    if cache and keyed is None:
        log.info("%s: its files cannot be located, so its export is not cached", source.location)
    entry = meta = None
    if keyed is not None:
        prefix, stem = _entry_stem(source, keyed[0])
        entry, meta = cache_dir() / f"{stem}.onnx", cache_dir() / f"{stem}.json"
        if entry.is_file():
            try:
                io = ModelIO.from_onnx(entry)
            except UsageError as exc:
                log.warning("%s: unreadable reference cache entry, exported again (%s)", entry, exc.message)
            else:
                notes: list[str] = []
                try:
                    notes = [str(n) for n in json.loads(meta.read_text()).get("notes", [])]
                except (OSError, ValueError, AttributeError):
                    pass
                log.info("%s: reference export from the cache (%s)", source.location, entry)
                return ExportedReference(io, notes, entry, True)
    with temp_dir("reference", dir=workdir) as tmp:
        result = export_onnx(source, Path(tmp) / "reference.onnx", inputs=inputs, dynamic_axes=dynamic_axes,
                             output_names=output_names)
        if entry is None or meta is None or keyed is None:
            return ExportedReference(result.io, list(result.notes))
        try:
            _store(result.path, entry, meta, {"key": keyed[0], "parts": keyed[1], "notes": result.notes})
        except (OSError, TrtrepoError) as exc:  # atomic writes name the file in a TrtrepoError; the cache is best effort
            log.warning("%s: cannot write the reference cache (%s); the export is not kept", cache_dir(), one_line(exc))
            return ExportedReference(result.io, list(result.notes))
    _prune(entry.parent, prefix, keep=entry.stem)
    log.info("%s: reference exported into the cache (%s)", source.location, entry)
    return ExportedReference(ModelIO(result.io.inputs, result.io.outputs, source=str(entry)), list(result.notes), entry)


def _store(model: Path, entry: Path, meta: Path, record: Mapping[str, Any]) -> None:
    """The model copied to ``entry`` and ``record`` to ``meta``, each written atomically (the
    model last: an entry is there only once complete)."""

    atomic_write_text(meta, json.dumps(record, indent=2, sort_keys=True) + "\n")
    with atomic_path(entry) as tmp:
        shutil.copyfile(model, tmp)


def _prune(folder: Path, prefix: str, keep: str) -> None:
    """Remove the older entries of one source (``prefix``), keeping ``keep``."""
    for p in folder.glob(f"{prefix}*"):
        if p.stem != keep and p.suffix in (".onnx", ".json"):
            try:
                p.unlink()
            except OSError:
                pass
