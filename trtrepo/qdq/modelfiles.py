"""The quantize stage's files: ranges from JSON or a TensorRT cache in, the Q/DQ model out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..cache import read_cache
from ..errors import UsageError
from ..fsutil import atomic_path
from .graph import load_model, model_tensor_names
from .insert import QuantizedModel, insert_qdq
from .options import INT8_MAX, ActivationRange, QuantizeOptions, RangeLike


@dataclass(frozen=True)
class RangesFile:
    """Ranges given in a ranges JSON (``trtrepo calibrate --ranges``, or written by hand: per
    tensor an ``amax``, optionally ``min``/``max``): ``--ranges FILE`` read once at the edge,
    the path kept for messages and the report."""

    path: Path
    ranges: dict[str, ActivationRange]

    @classmethod
    def read(cls, path: str | Path) -> RangesFile:
        return cls(Path(path), ranges_from_json(path))

    def __str__(self) -> str:  # messages and the commands' input protection name the file
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)


def ranges_from_json(path: str | Path) -> dict[str, ActivationRange]:
    """Ranges per tensor from a ranges JSON (:meth:`trtrepo.calibrate.Ranges.save_json`): amax,
    plus the signed min/max where the file holds them (written with the statistics)."""
    from ..calibrate import Ranges  # noqa: PLC0415  # deferred: trtrepo --help imports trtrepo.qdq (the --target choices); calibrate and data load when ranges are read

    ranges = Ranges.load_json(path)
    tensors = json.loads(Path(path).read_text()).get("tensors") or {}
    out = {}
    for name, amax in ranges.items():
        entry = tensors.get(name)
        if isinstance(entry, Mapping) and "min" in entry and "max" in entry:
            out[name] = ActivationRange(float(amax), float(entry["min"]), float(entry["max"]))
        else:
            out[name] = ActivationRange(float(amax))
    return out


def ranges_from_cache(path: str | Path, model: Any | None = None) -> dict[str, float]:
    """Amax per tensor (``scale * 127``) from a TensorRT calibration cache. With ``model``, a
    cache whose names are not tensors of that model is refused (made for another model)."""

    _header, scales = read_cache(path)
    if model is not None:
        known = model_tensor_names(model)
        foreign = [n for n in scales if n not in known and not n.startswith("(Unnamed Layer")]
        if foreign:
            more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
            raise UsageError(f"{path}: calibration cache was made for another model: tensor '{foreign[0]}'{more} "
                             "is not in this model")
    return {name: float(np.float32(scale) * np.float32(INT8_MAX)) for name, scale in scales.items()}


# --------------------------------------------------------------------------------------------
# File-level API


@dataclass
class QuantizeResult:
    """What :func:`quantize_model` wrote (:func:`trtrepo.quantize.run_quantize` adds its report:
    :class:`trtrepo.quantize.QuantizeRunResult`)."""

    path: Path
    target: str
    method: str | None = None
    layers: list[str] = field(default_factory=list)
    layers_in_float: list[str] = field(default_factory=list)
    kept_float: dict[str, str] = field(default_factory=dict)  # node -> reason (transformer-aware exclusions)
    float_tensors: dict[str, str] = field(default_factory=dict)  # unquantizable tensor -> reason
    activations: int = 0
    weights: int = 0


def save_model(model: Any, out_path: str | Path, *, force: bool = True) -> Path:
    """Write an ONNX model atomically (temporary file in the folder, then rename)."""
    import onnx

    out = Path(out_path)
    with atomic_path(out, force=force) as tmp:
        onnx.save(model, str(tmp))
    return out


def quantize_model(onnx_path: str | Path, ranges: Mapping[str, RangeLike], out_path: str | Path,
                   options: QuantizeOptions | None = None, *, method: str | None = None, force: bool = True,
                   source: str = "ranges") -> QuantizeResult:
    """Quantize ``onnx_path`` with ``ranges`` and write the Q/DQ model to ``out_path`` atomically."""
    options = options or QuantizeOptions()
    model = load_model(onnx_path)
    qm = insert_qdq(model, ranges, options, source=source)
    path = save_model(qm.model, out_path, force=force)
    return quantize_result(qm, path, options, method)


def quantize_result(qm: QuantizedModel, path: Path, options: QuantizeOptions, method: str | None) -> QuantizeResult:
    return QuantizeResult(
        path=path,
        target=options.target.name,
        method=method,
        layers=list(qm.plan.layers),
        layers_in_float=list(qm.plan.excluded),
        kept_float=dict(qm.plan.auto_float),
        float_tensors=dict(qm.plan.float_tensors),
        activations=len(qm.activation_qparams),
        weights=len({(p.tensor, p.axis) for p in qm.plan.points if p.kind == "weight"}),
    )
