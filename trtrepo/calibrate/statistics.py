"""What a calibration learnt (:class:`Statistics`) and the ranges computed from it (:class:`Ranges`),
with their files: statistics as ``.npz``, ranges as JSON, a TensorRT calibration cache or
sampleINT8API's dynamic-range text."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import rangemath as H
from ..cache import check_range, read_cache, scale_of, write_cache, write_dynamic_range
from ..errors import OptionError, TrtrepoError, UsageError
from ..fsutil import atomic_path, atomic_write_text


def _cache_algorithm(method: str) -> str:
    entry = H.METHODS.get(method)
    return entry.cache_algorithm if entry is not None else "EntropyCalibration2"


@dataclass
class TensorStatistics:
    """What the two passes learnt about one tensor."""

    name: str
    max_abs: float
    min: float
    max: float
    counts: np.ndarray  # int64, num_bins: histogram of |x| on [0, max_abs]

    @property
    def edges(self) -> np.ndarray:
        return H.histogram_edges(self.max_abs, len(self.counts))

    @property
    def num_values(self) -> int:
        return int(self.counts.sum())

    def amax(self, method: str, **options: float) -> float:
        return H.compute_amax(method, self.counts, self.edges, self.max_abs, **options)


@dataclass
class Statistics:
    """Per-tensor max and histogram from one :meth:`Calibrator.collect`; serves every method."""

    tensors: dict[str, TensorStatistics]
    num_samples: int
    num_bins: int
    model: str = ""
    # Per-channel (last axis) signed min and max of the ``channel_tensors`` (SmoothQuant's statistics).
    channels: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> TensorStatistics:
        return self.tensors[name]

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    @property
    def unbounded(self) -> list[str]:
        """Tensors that held infinite values: :meth:`compute` gives them no range."""
        return [n for n, t in self.tensors.items() if not math.isfinite(t.max_abs)]

    def compute(self, method: str, *, percentile: float = H.DEFAULT_PERCENTILE, **options: float) -> Ranges:
        """Ranges (tensor -> amax) with a registered ``method`` (:data:`trtrepo.rangemath.METHODS`)."""
        if method not in H.METHODS:
            raise OptionError("method", f"'{method}': expected one of {', '.join(H.METHODS)}", concept="the calibration method")
        if not 0.0 < percentile <= 100.0:
            raise OptionError("percentile", f"{percentile}: expected a value in (0, 100]")
        opts = dict(options)
        if "percentile" in H.METHODS[method].options:
            opts["percentile"] = percentile
        # Tensors with infinite values have no range (see unbounded); they are left out.
        amax = {name: t.amax(method, **opts) for name, t in self.tensors.items() if math.isfinite(t.max_abs)}
        return Ranges(amax, method=method, options=opts, num_samples=self.num_samples, num_bins=self.num_bins)

    def save_npz(self, path: str | Path) -> Path:
        """Save the statistics (to compute other methods later without the data)."""
        names = self.names
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(
                    f,
                    names=np.asarray(names),
                    max_abs=np.asarray([self.tensors[n].max_abs for n in names], np.float64),
                    min=np.asarray([self.tensors[n].min for n in names], np.float64),
                    max=np.asarray([self.tensors[n].max for n in names], np.float64),
                    counts=np.stack([self.tensors[n].counts for n in names]) if names else np.zeros((0, self.num_bins)),
                    meta=np.asarray(json.dumps({"num_samples": self.num_samples, "num_bins": self.num_bins, "model": self.model})),
                )
        return Path(path)

    @classmethod
    def load_npz(cls, path: str | Path) -> Statistics:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"{p}: statistics file not found")
        with np.load(p, allow_pickle=False) as f:
            meta = json.loads(str(f["meta"]))
            tensors = {
                str(n): TensorStatistics(str(n), float(a), float(lo), float(hi), c.astype(np.int64))
                for n, a, lo, hi, c in zip(f["names"], f["max_abs"], f["min"], f["max"], f["counts"], strict=True)
            }
        return cls(tensors, int(meta["num_samples"]), int(meta["num_bins"]), meta.get("model", ""))


class Ranges(Mapping[str, float]):
    """Tensor name -> amax (the symmetric range ``[-amax, amax]``), plus how it was computed."""

    def __init__(self, amax: Mapping[str, float], *, method: str = "", options: Mapping[str, Any] | None = None,
                 num_samples: int | None = None, num_bins: int | None = None) -> None:
        self._amax = {str(k): float(v) for k, v in amax.items()}
        for name, value in self._amax.items():
            if not math.isfinite(value) or value < 0:
                raise TrtrepoError(f"tensor '{name}': invalid range amax={value!r}")
        self.method = method
        self.options = dict(options or {})
        self.num_samples = num_samples
        self.num_bins = num_bins

    def __getitem__(self, name: str) -> float:
        return self._amax[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amax)

    def __len__(self) -> int:
        return len(self._amax)

    def __repr__(self) -> str:
        return f"Ranges(method={self.method!r}, {len(self)} tensors)"

    def scales(self) -> dict[str, float]:
        """``{name: amax / 127}`` as float32 values (what TensorRT stores), floored above 0."""
        return {name: scale_of(a) for name, a in self._amax.items()}

    # --- files -----------------------------------------------------------------------------
    def to_dict(self, statistics: Statistics | None = None) -> dict[str, Any]:
        scales = self.scales()
        tensors: dict[str, Any] = {}
        for name, amax in self._amax.items():
            # a tensor that was 0 on every sample: the smallest range a file holds (as in the cache)
            entry: dict[str, Any] = {"amax": amax or scales[name] * 127.0, "scale": scales[name]}
            if statistics is not None and name in statistics:
                t = statistics[name]
                entry["min"] = t.min
                entry["max"] = t.max
                entry["histogram"] = H.summarize(t.counts, t.edges, amax)
            tensors[name] = entry
        return {"format": "trtrepo-ranges-1", "method": self.method, "options": self.options,
                "num_samples": self.num_samples, "num_bins": self.num_bins, "tensors": tensors}

    def save_json(self, path: str | Path, statistics: Statistics | None = None) -> Path:
        return atomic_write_text(path, json.dumps(self.to_dict(statistics), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "ranges") -> Ranges:
        tensors = data.get("tensors") if isinstance(data, Mapping) else None
        if not isinstance(tensors, Mapping):
            raise UsageError(f"{source}: not a trtrepo ranges file (no 'tensors' mapping)")

        try:
            amax = {name: check_range(str(name), float(entry["amax"]), source) for name, entry in tensors.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{source}: every tensor needs a numeric 'amax' ({exc})") from exc
        return cls(amax, method=str(data.get("method", "")), options=data.get("options") or {},
                   num_samples=data.get("num_samples"), num_bins=data.get("num_bins"))

    @classmethod
    def load_json(cls, path: str | Path) -> Ranges:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"{p}: ranges file not found")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{p}: not valid JSON ({exc})") from exc
        return cls.from_dict(data, source=str(p))

    def write_cache(self, path: str | Path, trt_version: str | int = "10.13.0", algorithm: str | None = None) -> Path:
        return write_cache(path, self, trt_version, algorithm or _cache_algorithm(self.method))

    def write_dynamic_range(self, path: str | Path) -> Path:
        return write_dynamic_range(path, self)

    @classmethod
    def from_cache(cls, path: str | Path) -> Ranges:
        header, scales = read_cache(path)
        amax = {n: float(np.float32(s)) * 127.0 for n, s in scales.items()}
        return cls(amax, method="cache", options={"header": header.text})
