"""Calibration: streamed activation statistics with ONNX Runtime, then INT8 ranges.

Stable API (the CLI ``trtrepo calibrate`` and the quantize/deploy stages use exactly this)::

    from trtrepo.calibrate import Calibrator, Statistics, Ranges, select_tensors

    cal = Calibrator("model.onnx", "demo:calib", batch_size=32, num_bins=2048, progress=True,
                     memory_budget_mb=512)        # bound on fetched activations (None: whole batches)
    stats = cal.collect()                         # Statistics: one collection serves every method
    ranges = stats.compute("entropy")             # Ranges: Mapping[tensor name, amax]
    ranges = stats.compute("percentile", percentile=99.99)
    ranges.scales()                               # {name: amax / 127}
    ranges.save_json("ranges.json", stats)        # tensor -> amax, scale, method, histogram summary
    Ranges.load_json("ranges.json")
    ranges.write_cache("model.cache", trt_version="10.13.0")   # TensorRT calibration cache
    Ranges.from_cache("model.cache")              # amax = float32(scale) * 127
    cal.compute("mse")                            # collect() on first use, then compute

``data`` is anything :func:`trtrepo.data.open_data` accepts (a spec string or a
:class:`~trtrepo.data.DataSource`); ``preprocess``/``labels``/``limit``/``seed`` are passed on.

**Which tensors** (:func:`select_tensors`): the float network inputs and the float inputs and
outputs of Conv, ConvTranspose, Gemm, MatMul, Add, pooling and activation ops, minus
initializers and outputs of Constant nodes. These are the tensors a TensorRT calibration cache
needs for the layers that run in INT8.

**How** (:meth:`Calibrator.collect`): the selected tensors become extra graph outputs of a copy
of the model and ONNX Runtime (CUDA provider when available, else CPU) fetches only those, batch
by batch. Pass 1 records the exact running ``max |x|`` of each tensor (and
its signed min/max); pass 2 adds every batch into a fixed-range histogram of ``|x|`` with
``num_bins`` bins on ``[0, max |x|]``. A tensor with more than ``histogram_sample`` (65,536)
values per sample -- the early feature maps of an image model -- goes into its histogram at an
even stride within each sample (the same positions in every sample; max and min/max still see
every value): on MobileNetV2 this halves calibration time and moved no method's held-out result
beyond noise (docs/benchmarks.md). Memory is O(tensors x bins): no activation outlives its
batch. Since the range is fixed before binning and counts are sums, the statistics do not depend
on batch size or sample order. A NaN or Inf raises :class:`~trtrepo.errors.TrtrepoError` naming
the tensor and the samples.

**Memory budget** (``Calibrator(..., memory_budget_mb=512)``, ``--memory-budget-mb``): ONNX
Runtime allocates every extra output of a run (also those not fetched), so the activations of a
batch grow with ``batch_size``. Each batch is therefore cut into micro-batches (slices along axis
0 of every input) whose fetched bytes stay within the budget: the first sample is run once alone
to measure the bytes per sample of every tensor, and every run is measured again (the largest
bytes per sample seen for each input shape; a new shape, e.g. a longer sequence, starts from a
quadratic extrapolation). Where fewer than 3 samples' tensors fit in the budget, the tensors are
split into groups, each fetched by its own session in its own walk over the data (the data is read
once per group and pass). Group sessions load the model as ONNX Runtime optimized it with *all*
the tensors as outputs (graph optimizations off), so they run the same kernels: fetching fewer
outputs from the original model would let ONNX Runtime fuse other nodes and change the last bits.

The budget does not change the results (statistics, ranges, caches): a micro-batch is never one
sample of a larger batch (ONNX Runtime runs a one-row MatMul/Gemm through another kernel whose
last bits differ), and a tensor that does not depend on the batch (e.g. a position embedding) is
recognised on the first cut batch (runs of 2 then 3 or more samples) and counted once per batch,
as without a budget. The budget bounds the fetched activations; it is exceeded only by a tensor
larger than it (alone in its group), a cut batch of 3 or 4 samples before that classification
(run whole), a run of 3 where only 2 fit (never leaving 1 behind) and a first run on a new input
shape whose extrapolation fell short. The batch's inputs, the model, ONNX Runtime's scratch memory
and one tensor's histogram scratch come on top. ``memory_budget_mb=None`` fetches whole batches
(the behaviour before the budget).

**The model's memory**: the calibrator reads the graph without the data of its initializers of
1 KB or more (they stay in the model's file, as external data; shape inference never sees them),
and the session loads the augmented copy from a temporary folder, its weights copied into a file
beside it that ONNX Runtime maps: the weights are in memory once, as the session's (packed MatMul
and Gemm) weights, never in Python nor serialized. The peak is then about the model's weights,
the interpreter and libraries, and the budget-bounded activations with ONNX Runtime's scratch
memory, whatever the batch size, instead of several copies of the weights held by Python
(figures: docs/benchmarks.md, "Calibration memory at any batch size (issue 13)";
``bench/calib_memory.py``). The temporary folder takes the model's size on disk for the calibrator's lifetime. Prepacking stays
on: without it (``session.disable_prepacking``) the mapped weights are resident instead of the
packed ones (no saving) and the MatMul kernels compute other last bits.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import histogram as H
from .data import DataOptions
from .errors import TrtrepoError, UsageError, onnxruntime_run_error
from .fsutil import temp_dir
from .modelio import ModelIO, load_onnx, without_weights
from .progress import bar_disabled

log = logging.getLogger(__name__)

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"})
ACTIVATION_OPS = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "Tanh", "Gelu", "Elu", "Selu", "Celu", "Clip",
    "HardSwish", "Softplus", "Softsign", "Mish", "ThresholdedRelu", "Softmax", "LogSoftmax",
})
CALIBRATED_OPS = COMPUTE_OPS | POOL_OPS | ACTIVATION_OPS
# Data inputs per op (others are weights, bias, shapes or attributes-as-inputs).
_DATA_INPUTS: dict[str, tuple[int, ...]] = {"Conv": (0,), "ConvTranspose": (0,), "Gemm": (0, 1), "MatMul": (0, 1),
                                            "Add": (0, 1), "PRelu": (0,), "Clip": (0,)}
_FLOAT_TYPES = {1: np.float32, 10: np.float16, 11: np.float64}  # ONNX elem types numpy can carry

DEFAULT_MEMORY_BUDGET_MB = 512.0
# Values per sample and tensor that go into a histogram (pass 2): a larger activation map is read
# at an even stride (see _sample_stride). max |x| and min/max (pass 1) always see every value.
DEFAULT_HISTOGRAM_SAMPLE = 1 << 16

# Input shapes of one sample (axis 0 dropped), by input name: what the fetched bytes depend on.
Signature = tuple[tuple[str, tuple[int, ...]], ...]

# Tensors of this many bytes or more leave the calibration's copies of the model (ONNX's threshold
# for external data); smaller ones (shapes, scalars) stay in the graph, where shape inference reads them.
_LARGE = 1024

def _cache_algorithm(method: str) -> str:
    entry = H.METHODS.get(method)
    return entry.cache_algorithm if entry is not None else "EntropyCalibration2"


# --------------------------------------------------------------------------------------------
# Tensor selection


def _inferred_types(model: Any) -> dict[str, int]:
    """ONNX elem type of every named value, from the graph and from shape inference."""
    import onnx

    types: dict[str, int] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weights(model, _LARGE), strict_mode=False)
    except Exception as exc:  # inference is best effort; declared types still count
        log.warning("ONNX shape inference failed (%s); using declared types only", exc)
        inferred = model
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def select_tensors(model: Any, op_types: Sequence[str] | None = None) -> list[str]:
    """Names of the tensors to calibrate in ``model`` (an ONNX ModelProto), in graph order."""
    graph = model.graph
    ops = frozenset(op_types) if op_types is not None else CALIBRATED_OPS
    constant = {init.name for init in graph.initializer}
    constant |= {out for node in graph.node if node.op_type in ("Constant", "ConstantOfShape") for out in node.output}
    types = _inferred_types(model)
    chosen: dict[str, None] = {}

    def add(name: str) -> None:
        if not name or name in constant or name in chosen:
            return
        if types.get(name) in _FLOAT_TYPES:
            chosen[name] = None
        elif name not in types:
            log.info("tensor '%s' has no known type; not calibrated", name)

    for vi in graph.input:
        add(vi.name)
    for node in graph.node:
        if node.op_type not in ops:
            continue
        for i in _DATA_INPUTS.get(node.op_type, (0,)):
            if i < len(node.input):
                add(node.input[i])
        for out in node.output[:1]:
            add(out)
    return list(chosen)


def tensor_names(model: Any) -> set[str]:
    """Every named value of the graph (inputs, initializers, node outputs)."""
    graph = model.graph
    names = {vi.name for vi in graph.input} | {init.name for init in graph.initializer}
    names |= {out for node in graph.node for out in node.output}
    return names


# --------------------------------------------------------------------------------------------
# Statistics and ranges


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
        """Ranges (tensor -> amax) with a registered ``method`` (:data:`trtrepo.histogram.METHODS`)."""
        if method not in H.METHODS:
            raise UsageError(f"--method '{method}': expected one of {', '.join(H.METHODS)}")
        if not 0.0 < percentile <= 100.0:
            raise UsageError(f"--percentile {percentile}: expected a value in (0, 100]")
        opts = dict(options)
        if "percentile" in H.METHODS[method].options:
            opts["percentile"] = percentile
        # Tensors with infinite values have no range (see unbounded); they are left out.
        amax = {name: t.amax(method, **opts) for name, t in self.tensors.items() if math.isfinite(t.max_abs)}
        return Ranges(amax, method=method, options=opts, num_samples=self.num_samples, num_bins=self.num_bins)

    def save_npz(self, path: str | Path) -> Path:
        """Save the statistics (to compute other methods later without the data)."""
        from .fsutil import atomic_path

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
        from .cache import scale_of

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
        from .fsutil import atomic_write_text

        return atomic_write_text(path, json.dumps(self.to_dict(statistics), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "ranges") -> Ranges:
        tensors = data.get("tensors") if isinstance(data, Mapping) else None
        if not isinstance(tensors, Mapping):
            raise UsageError(f"{source}: not a trtrepo ranges file (no 'tensors' mapping)")
        from .cache import check_range

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
        from .cache import write_cache

        return write_cache(path, self, trt_version, algorithm or _cache_algorithm(self.method))

    def write_dynamic_range(self, path: str | Path) -> Path:
        from .cache import write_dynamic_range

        return write_dynamic_range(path, self)

    @classmethod
    def from_cache(cls, path: str | Path) -> Ranges:
        from .cache import read_cache

        header, scales = read_cache(path)
        amax = {n: float(np.float32(s)) * 127.0 for n, s in scales.items()}
        return cls(amax, method="cache", options={"header": header.text})


# --------------------------------------------------------------------------------------------
# Collection


def _providers(requested: Sequence[str] | None) -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if requested:
        missing = [p for p in requested if p not in available]
        if missing:
            raise UsageError(f"ONNX Runtime provider(s) not available: {', '.join(missing)} (available: {', '.join(available)})")
        return list(requested)
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def _signature(inputs: Mapping[str, np.ndarray]) -> Signature:
    return tuple(sorted((name, tuple(np.shape(a)[1:])) for name, a in inputs.items()))


def _elements(sig: Signature) -> int:
    return sum(math.prod(shape) for _, shape in sig)


# Elements a witness digest reads (see _digest).
_DIGEST_ELEMENTS = 1 << 16


def _digest(value: np.ndarray) -> bytes:
    """Fingerprint of a tensor's values for telling batch-independent tensors (the same values
    whatever the samples) from batch-dependent ones: the whole tensor up to ``_DIGEST_ELEMENTS``
    elements, else that many elements at an even stride. It is compared only between two runs
    whose shapes are equal (a tensor with a batch axis already differs in shape), so a
    data-dependent tensor would have to repeat bit for bit on every sampled element to pass."""
    flat = np.ascontiguousarray(value).reshape(-1)
    if flat.size > _DIGEST_ELEMENTS:
        flat = np.ascontiguousarray(flat[:: -(-flat.size // _DIGEST_ELEMENTS)])
    return hashlib.blake2b(flat.data, digest_size=16).digest()


def _sample_stride(per_sample: int, cap: int) -> int:
    """The stride that leaves at most about ``cap`` of ``per_sample`` values: at least
    ``ceil(per_sample / cap)``, and not a multiple of 2, 3 or 7, so that it does not fall in step
    with the rows of a feature map (widths like 7, 14, 28, 56, 112, 224, 384, 768)."""
    k = max(1, -(-per_sample // cap))
    while k > 1 and (k % 2 == 0 or k % 3 == 0 or k % 7 == 0):
        k += 1
    return k


def _take(left: int, most: int, avoid: int = 0) -> int:
    """Samples of the next micro-batch: ``left`` if at most ``most``, else up to ``most`` but at
    least 2, never leaving exactly 1 sample behind (nor taking ``avoid``)."""
    if left <= most and left != avoid:
        return left
    for take in (*range(min(most, left), 1, -1), *range(min(most, left) + 1, left + 1)):
        if take != avoid and left - take != 1:
            return take
    return left


def _pack(names: Sequence[str], sizes: Mapping[str, float], budget: int) -> list[list[str]]:
    """Consecutive groups of ``names`` whose ``sizes`` sum within ``budget`` (a larger tensor alone)."""
    groups: list[list[str]] = []
    total = 0.0
    for name in names:
        if groups and total + sizes[name] <= budget:
            groups[-1].append(name)
            total += sizes[name]
        else:
            groups.append([name])
            total = sizes[name]
    return groups


# --------------------------------------------------------------------------------------------
# The model without its weights in memory


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(f: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, tag offset, value offset, end offset)`` of the fields of the protobuf
    message stored at ``[start, end)`` of the binary file ``f``."""
    pos = start
    while pos < end:
        f.seek(pos)
        head = f.read(20)
        key, n = _varint(head, 0)
        wire = key & 7
        if wire == 0:
            _, stop = _varint(head, n)
            yield key >> 3, pos, pos + n, pos + stop
            pos += stop
        elif wire == 2:
            length, n2 = _varint(head, n)
            yield key >> 3, pos, pos + n2, pos + n2 + length
            pos += n2 + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            yield key >> 3, pos, pos + n, pos + n + size
            pos += n + size
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos}")
    if pos != end:
        raise ValueError(f"protobuf field overruns its message at byte {pos}")


def _read(f: Any, start: int, end: int) -> bytes:
    f.seek(start)
    data = f.read(end - start)
    if len(data) != end - start:
        raise ValueError("truncated file")
    return bytes(data)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _graph_bytes(path: Path) -> bytes:
    """The serialized ModelProto of ``path`` with the raw data of every initializer of the main
    graph of ``_LARGE`` bytes or more left in the file: such an initializer becomes external data
    whose location is the file itself (relative to its folder), at the raw data's offset.

    Reads the file field by field (ModelProto.graph = 7, GraphProto.initializer = 5,
    TensorProto.raw_data = 9, external_data = 13, data_location = 14), so that the weights are
    never in memory; everything else is copied byte for byte."""
    location = path.name.encode()
    out = bytearray()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        for number, tag, start, end in _fields(f, 0, size):
            if number != 7:
                out += _read(f, tag, end)
                continue
            graph = bytearray()
            for gfield, gtag, gstart, gend in _fields(f, start, end):
                if gfield != 5:
                    graph += _read(f, gtag, gend)
                    continue
                parts = list(_fields(f, gstart, gend))
                raw = [(s, e) for n, _, s, e in parts if n == 9]
                if len(raw) != 1 or raw[0][1] - raw[0][0] < _LARGE or any(n in (13, 14) for n, *_ in parts):
                    graph += _read(f, gtag, gend)
                    continue
                tensor = bytearray()
                for n, t, _, e in parts:
                    if n != 9:
                        tensor += _read(f, t, e)
                for key, value in ((b"location", location), (b"offset", str(raw[0][0]).encode()),
                                   (b"length", str(raw[0][1] - raw[0][0]).encode())):
                    tensor += _length_delimited(13, _length_delimited(1, key) + _length_delimited(2, value))
                tensor += _encode_varint(14 << 3) + _encode_varint(1)  # data_location = EXTERNAL
                graph += _length_delimited(5, bytes(tensor))
            out += _length_delimited(7, bytes(graph))
    return bytes(out)


def _load_graph(path: Path) -> Any:
    """The ONNX model ``path`` without the data of its large initializers (see :func:`_graph_bytes`):
    their external data is relative to the model's folder, as for a model saved with external data.

    Falls back to loading the whole model (weights in memory) where the file cannot be read
    field by field; a file that is not ONNX gets :func:`~trtrepo.modelio.load_onnx`'s error."""
    import onnx

    if path.is_file():
        try:
            model = onnx.ModelProto()
            model.ParseFromString(_graph_bytes(path))
            return model
        except Exception as exc:  # not ONNX, or a layout this reader does not know: load it all
            log.debug("%s: cannot read the graph without its weights (%s); loading the whole model", path, exc)
    return load_onnx(path)


def _external_path(folder: Path, location: str, tensor: str) -> Path:
    relative = Path(location)
    if not location or relative.is_absolute() or ".." in relative.parts:
        raise UsageError(f"initializer '{tensor}': external data location '{location}' is outside the model's folder")
    return folder / relative


def _gather_weights(model: Any, source: Path, target: Path) -> None:
    """Write the data of every initializer of ``model``'s main graph that is external (relative to
    the folder ``source``) or holds ``_LARGE`` bytes or more into the file ``target`` and point the
    initializer there (relative to ``target``'s folder), in place.

    Each tensor starts at a multiple of ``mmap.ALLOCATIONGRANULARITY``: ONNX Runtime then maps
    the file instead of reading it into memory. The data is copied in chunks, never held whole."""
    import mmap

    import onnx

    external = onnx.TensorProto.EXTERNAL
    with open(target, "wb") as out:
        for t in model.graph.initializer:
            if t.data_location == external:
                entries = {e.key: e.value for e in t.external_data}
                src = _external_path(source, entries.get("location", ""), t.name)
                try:
                    with open(src, "rb") as f:
                        offset = int(entries.get("offset") or 0)
                        available = f.seek(0, 2) - offset
                        length = int(entries["length"]) if entries.get("length") else available
                        if offset < 0 or length < 0 or length > available:
                            raise UsageError(f"initializer '{t.name}': external data beyond the end of {src}")
                        out.seek(-out.tell() % mmap.ALLOCATIONGRANULARITY, 1)
                        start = out.tell()
                        f.seek(offset)
                        left = length
                        while left:
                            chunk = f.read(min(left, 1 << 24))
                            if not chunk:
                                raise UsageError(f"initializer '{t.name}': {src} is truncated")
                            out.write(chunk)
                            left -= len(chunk)
                except OSError as exc:
                    raise UsageError(f"initializer '{t.name}': cannot read its external data ({exc})") from exc
            elif len(t.raw_data) >= _LARGE:
                out.seek(-out.tell() % mmap.ALLOCATIONGRANULARITY, 1)
                start, length = out.tell(), len(t.raw_data)
                out.write(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            t.data_location = external
            for key, value in (("location", target.name), ("offset", str(start)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value


MIN_NUM_BINS = 128  # TensorRT's entropy calibration quantizes the histogram into 128 levels
MAX_NUM_BINS = 65536  # TensorRT's calibrators and ModelOpt use 2048


class Calibrator:
    """Collects activation statistics of an FP32 ONNX model over calibration data.

    ``model`` is a path to an ONNX file; ``data`` a data spec or :class:`~trtrepo.data.DataSource`
    (optional when only :meth:`tensor_names`/cache checks are needed). ``tensors`` overrides
    :func:`select_tensors`; ``providers`` overrides the ONNX Runtime providers.
    ``memory_budget_mb`` bounds the activations fetched per ONNX Runtime run (micro-batches, then
    tensor groups; see the module docstring); ``None`` fetches whole batches.
    """

    def __init__(self, model: str | Path, data: Any = None, *, batch_size: int = 32, num_bins: int = H.DEFAULT_NUM_BINS,
                 progress: bool = True, preprocess: Any = None, labels: Any = None, limit: int | None = None,
                 seed: int | None = 0, tensors: Sequence[str] | None = None, op_types: Sequence[str] | None = None,
                 providers: Sequence[str] | None = None,
                 memory_budget_mb: float | None = DEFAULT_MEMORY_BUDGET_MB,
                 channel_tensors: Sequence[str] = (),
                 histogram_sample: int | None = DEFAULT_HISTOGRAM_SAMPLE) -> None:
        if batch_size < 1:
            raise UsageError(f"--batch-size must be positive, got {batch_size}")
        if memory_budget_mb is not None and not (math.isfinite(memory_budget_mb) and memory_budget_mb > 0):
            raise UsageError(f"--memory-budget-mb must be a positive number, got {memory_budget_mb}")
        if not MIN_NUM_BINS <= num_bins <= MAX_NUM_BINS:
            raise UsageError(f"--num-bins {num_bins}: expected {MIN_NUM_BINS}..{MAX_NUM_BINS} (entropy compares "
                             f"quantizations into {MIN_NUM_BINS} levels, and with fewer bins every method falls back to "
                             f"the maximum; each calibrated tensor keeps one int64 count per bin)")
        if histogram_sample is not None and histogram_sample < 1:
            raise UsageError(f"histogram_sample must be positive, got {histogram_sample}")
        self.histogram_sample = histogram_sample
        self.model_path = Path(model)
        # The graph; the data of its large initializers stays in the model's files (external data).
        self.model = _load_graph(self.model_path)
        self.io = ModelIO.from_onnx(self.model, source=self.model_path)
        self.batch_size = batch_size
        self.num_bins = num_bins
        self.progress = progress
        self.memory_budget_mb = memory_budget_mb
        self._providers = providers
        self.tensors = list(tensors) if tensors is not None else select_tensors(self.model, op_types)
        # Tensors whose per-channel (last axis) min/max pass 1 also records (SmoothQuant).
        self.channel_tensors = list(dict.fromkeys(channel_tensors))
        self.tensors += [t for t in self.channel_tensors if t not in self.tensors]
        if not self.tensors:
            raise UsageError(f"{self.model_path}: no float tensors to calibrate")
        known = tensor_names(self.model)
        unknown = [t for t in self.tensors if t not in known]
        if unknown:
            raise UsageError(f"{self.model_path}: no tensor named {', '.join(unknown[:5])}")
        skip = False
        if isinstance(data, DataOptions):  # the shared data options: spec and how to open it
            preprocess, labels, limit, seed = data.preprocess, data.labels, data.limit, data.seed
            skip = data.skip_non_images
            data = data.spec
        self._data_args = dict(preprocess=preprocess, labels=labels, limit=limit, seed=seed, skip_non_images=skip)
        self._data_spec = data
        self._source: Any = None
        self._session: Any = None
        self.statistics: Statistics | None = None
        # Memory budget state, kept across the two passes (see _run_batch).
        self._bytes: dict[Signature, dict[str, float]] = {}  # largest bytes per sample (per run if batch-independent)
        self._independent: dict[str, bool] = {}  # tensor -> does not depend on the batch (absent: not known yet)
        self._groups: list[list[str]] | None = None  # tensors fetched together, one session each
        self._optimized: Any = None  # TemporaryDirectory holding the ORT-optimized model of the group sessions
        self._work: Any = None  # TemporaryDirectory holding the augmented model and its weights (see _augmented_path)

    # --- data and session ---------------------------------------------------------------------
    @property
    def source(self) -> Any:
        if self._source is None:
            if self._data_spec is None:
                raise UsageError("calibration needs data (--data)")
            from .data import open_data

            self._source = open_data(self._data_spec, io=self.io, **self._data_args)
        return self._source

    def _augmented_model(self) -> Any:
        """A copy of the model (without its weights) with every selected tensor as a graph output."""
        from .modelio import with_outputs

        return with_outputs(self.model, self.tensors, _inferred_types(self.model))

    def _augmented_path(self) -> Path:
        """The augmented model saved in a temporary folder, its weights in a file beside it.

        ONNX Runtime loads it from there and maps the weights file (the packed weights of MatMul
        and Gemm are its only copy in memory): no serialized model, no second copy of the weights
        in Python. Written once per calibrator."""

        import onnx

        if self._work is None:
            work = temp_dir("calib")
            folder = Path(work.name)
            model = self._augmented_model()
            _gather_weights(model, self.model_path.parent, folder / "augmented.data")
            onnx.save(model, str(folder / "augmented.onnx"))
            self._work = work
        return Path(self._work.name) / "augmented.onnx"

    def _open_session(self, path: Path, options: Any) -> Any:
        import onnxruntime as ort

        providers = _providers(self._providers)
        try:
            return ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:
            raise TrtrepoError(f"{self.model_path}: ONNX Runtime cannot load the model ({type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from exc

    @staticmethod
    def _session_options() -> Any:
        """Options of the calibration sessions. No memory pattern: ONNX Runtime would plan one
        block of intermediates per input shape (micro-batches come in several sizes) and keep
        them in its arena (a higher peak for the same bits). The arena stays on (off, malloc's
        fragments cost more), and so does
        prepacking: the packed MatMul/Gemm weights replace the original ones in memory, and a
        session without them computes other last bits."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 4  # failures reach the user as our one-line errors
        options.enable_mem_pattern = False
        return options

    def _build_session(self) -> Any:
        return self._open_session(self._augmented_path(), self._session_options())

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = self._build_session()
        return self._session

    # --- memory budget ------------------------------------------------------------------------
    @property
    def _budget(self) -> int | None:
        return None if self.memory_budget_mb is None else int(self.memory_budget_mb * 2**20)

    def _output_groups(self) -> list[list[str]]:
        """The tensors fetched together (one group unless one sample's tensors exceed the budget).

        Measures the bytes of every tensor on the first sample, alone, with the full session."""
        if self._groups is not None:
            return self._groups
        from .data import iter_batches

        budget = self._budget
        groups = [list(self.tensors)]
        first = next(iter(iter_batches(self.source, 1, self.io)), None)
        if budget is not None and first is not None:
            values = self._session_run(self.session, self.tensors, first.inputs, first.indices)
            sizes = {name: float(v.nbytes) for name, v in zip(self.tensors, values, strict=True)}
            del values
            self._record(_signature(first.inputs), sizes)
            # Room for the smallest runs of a batch: 3 samples (runs of 1 are avoided, see _run_batch).
            room = budget // min(3, self.batch_size)
            if sum(sizes.values()) > room:
                groups = _pack(self.tensors, sizes, room)
            if len(groups) > 1:
                try:
                    self._save_optimized()
                except TrtrepoError as exc:
                    log.warning("cannot split the calibrated tensors into groups (%s); fetching all of them per "
                                "sample, over the memory budget", exc)
                    groups = [list(self.tensors)]
                else:
                    log.info("%d tensors take %.3g MB per sample: %d samples do not fit in the %.3g MB budget; "
                             "%d groups, each reading the data once per pass", len(sizes), sum(sizes.values()) / 2**20,
                             min(3, self.batch_size), budget / 2**20, len(groups))
        self._groups = groups
        return groups

    def _save_optimized(self) -> None:
        """Save the model as ONNX Runtime optimizes it with all the tensors as outputs (for group sessions)."""

        import onnx
        import onnxruntime as ort

        tmp = temp_dir("calib")
        path = Path(tmp.name) / "optimized.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 4  # failures reach the user as our one-line errors
        options.optimized_model_filepath = str(path)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        self._session = None  # one copy of the weights at a time
        self._open_session(self._augmented_path(), options)
        if not path.is_file():
            raise TrtrepoError("ONNX Runtime did not save the optimized model")
        saved = {o.name for o in onnx.load(str(path), load_external_data=False).graph.output}
        missing = [n for n in self.tensors if n not in saved]
        if missing:
            raise TrtrepoError(f"the optimized model lacks {', '.join(missing[:3])}")
        self._optimized = tmp

    def _group_session(self, names: Sequence[str]) -> Any:
        """A session over the optimized model (optimizations off) with only ``names`` as outputs."""
        import onnx
        import onnxruntime as ort

        folder = Path(self._optimized.name)
        model = onnx.load(str(folder / "optimized.onnx"), load_external_data=False)
        wanted = set(names)
        keep = [o for o in model.graph.output if o.name in wanted]
        del model.graph.output[:]
        model.graph.output.extend(keep)
        path = folder / "group.onnx"
        onnx.save(model, str(path))
        options = self._session_options()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return self._open_session(path, options)

    def _record(self, sig: Signature, measured: Mapping[str, float]) -> None:
        known = self._bytes.setdefault(sig, {})
        for name, size in measured.items():
            known[name] = max(known.get(name, 0.0), size)

    def _estimate(self, sig: Signature, names: Sequence[str]) -> dict[str, float] | None:
        """Bytes per sample (per run for batch-independent tensors) of ``names`` on inputs of shape ``sig``."""
        known = self._bytes.get(sig)
        if known is not None and all(n in known for n in names):
            return known
        # A shape not run yet: the largest extrapolation from the shapes run, quadratic in the input
        # size (attention scores), never below what a smaller input took.
        size = _elements(sig)
        best: dict[str, float] | None = None
        for other, measured in self._bytes.items():
            if not all(n in measured for n in names):
                continue
            factor = max(1.0, size / max(_elements(other), 1)) ** 2
            guess = {n: measured[n] * factor for n in names}
            if best is None or sum(guess.values()) > sum(best.values()):
                best = guess
        return best

    def _fit(self, sig: Signature, names: Sequence[str], budget: int) -> int | None:
        """Most samples per run whose fetched bytes of ``names`` stay within ``budget`` (None: any)."""
        est = self._estimate(sig, names)
        if est is None:
            return 1
        fixed = sum(est[n] for n in names if self._independent.get(n))
        per_sample = sum(est[n] for n in names if not self._independent.get(n))
        if per_sample <= 0:
            return None
        return max(1, int((budget - fixed) // per_sample))

    # --- runs ---------------------------------------------------------------------------------
    def _session_run(self, session: Any, names: Sequence[str], inputs: Mapping[str, np.ndarray],
                     indices: np.ndarray) -> list[Any]:
        try:
            return list(session.run(list(names), dict(inputs)))
        except Exception as exc:
            raise onnxruntime_run_error(exc, f"{self.model_path}: ONNX Runtime failed on samples "
                                             f"{indices[0]}..{indices[-1]}", inputs) from exc

    def _run(self, desc: str) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """Yield ``(tensor name, values, sample indices)`` for every selected tensor of every batch.

        Every tensor of every batch comes once (in pieces when the batch is cut into micro-batches;
        a batch-independent tensor whole, once per batch). Each array is dropped by this generator
        as soon as it is yielded."""
        from tqdm import tqdm

        from .data import iter_batches

        source = self.source
        groups = [list(self.tensors)] if self._budget is None else self._output_groups()
        with tqdm(total=len(source) * len(groups), desc=desc, unit="sample", disable=bar_disabled(None if self.progress else False),
                  leave=False) as bar:
            for names in groups:
                session = self.session if len(groups) == 1 else self._group_session(names)
                for batch in iter_batches(source, self.batch_size, self.io):
                    yield from self._run_batch(session, names, batch, bar)
                session = None  # free a group's session before building the next one

    def _run_batch(self, session: Any, names: list[str], batch: Any, bar: Any) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        """One batch, in micro-batches within the budget.

        A micro-batch is never one sample of a larger batch: ONNX Runtime computes a one-row
        MatMul/Gemm with another kernel (GEMV), whose last bits differ, while runs of 2 samples
        or more give every sample the bits of the whole batch.

        A tensor that does not depend on the batch (same shape and values for 2 and 3 samples,
        e.g. a position embedding) is yielded only from the batch's first micro-batch, so it counts
        once per batch as without a budget. The first batch that must be cut classifies the
        tensors: its first micro-batch is 2 samples, its second 3 or more."""
        budget = self._budget
        size = batch.size
        if budget is None:
            yield from self._yield_run(session, names, batch.inputs, batch.indices)
            bar.update(size)
            return
        sig = _signature(batch.inputs)
        start = 0
        witnesses: dict[str, tuple[tuple[int, ...], bytes]] | None = None
        while start < size:
            left = size - start
            fit = self._fit(sig, names, budget)
            m = _take(left, left if fit is None else fit)
            classify = False
            if start == 0 and m < left and any(n not in self._independent for n in names):
                if size < 5:  # too few samples to classify: one run
                    m = left
                else:
                    m, witnesses = 2, {}
            elif witnesses is not None:
                m = _take(left, max(3, fit or left), avoid=2)
                classify = True
            stop = start + m
            inputs = {k: v[start:stop] for k, v in batch.inputs.items()}
            indices = batch.indices[start:stop]
            values = self._session_run(session, names, inputs, indices)
            del inputs
            measured: dict[str, float] = {}
            for i, name in enumerate(names):
                value, values[i] = values[i], None
                if witnesses is not None and name not in self._independent:
                    if classify:
                        self._independent[name] = witnesses.pop(name) == (value.shape, _digest(value))
                    else:
                        witnesses[name] = (value.shape, _digest(value))
                independent = self._independent.get(name, False)
                measured[name] = float(value.nbytes) if independent else value.nbytes / m
                if not (independent and start > 0):
                    yield name, value, indices
                del value
            del values
            self._record(sig, measured)
            if classify:
                witnesses = None
            bar.update(m)
            start = stop

    def _yield_run(self, session: Any, names: list[str], inputs: Mapping[str, np.ndarray],
                   indices: np.ndarray) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
        values = self._session_run(session, names, inputs, indices)
        for i, name in enumerate(names):
            value, values[i] = values[i], None
            yield name, value, indices
            del value

    # --- the two passes -----------------------------------------------------------------------
    def collect(self) -> Statistics:
        """Pass 1: exact max |x| (and signed min/max) per tensor; pass 2: fixed-range histograms."""
        max_abs = dict.fromkeys(self.tensors, 0.0)
        lo = dict.fromkeys(self.tensors, math.inf)
        hi = dict.fromkeys(self.tensors, -math.inf)
        seen: set[str] = set()
        channel_set = set(self.channel_tensors)
        channels: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, value, indices in self._run("calibrate 1/2 (max)"):
            if value.size == 0:
                del value
                continue
            if name in channel_set and value.ndim >= 1:
                flat = value.reshape(-1, value.shape[-1])
                bmin, bmax = flat.min(axis=0).astype(np.float64), flat.max(axis=0).astype(np.float64)
                cmin, cmax = bmin, bmax
                if name in channels and channels[name][0].shape == cmin.shape:
                    cmin, cmax = np.minimum(channels[name][0], cmin), np.maximum(channels[name][1], cmax)
                channels[name] = (cmin, cmax)
                # the batch's extremes from its channels' (NaN propagates through both)
                vmin, vmax = float(bmin.min()), float(bmax.max())
            else:
                vmin, vmax = float(value.min()), float(value.max())
            nan = not (math.isfinite(vmin) and math.isfinite(vmax)) and bool(np.isnan(value).any())
            del value  # no reference across the next run
            if nan:
                raise TrtrepoError(f"tensor '{name}' has NaN values on samples {indices[0]}..{indices[-1]}; "
                                   "check the model and the data (preprocessing)")
            # An infinite value (e.g. an additive attention mask filled with -inf) is recorded:
            # the tensor gets no range and quantization keeps it in float.
            seen.add(name)
            lo[name], hi[name] = min(lo[name], vmin), max(hi[name], vmax)
            max_abs[name] = max(max_abs[name], abs(vmin), abs(vmax))
        counts = {name: np.zeros(self.num_bins, dtype=np.int64) for name in self.tensors}
        unbounded = [n for n in self.tensors if not math.isfinite(max_abs[n])]
        if unbounded:
            log.warning("%d tensor(s) hold infinite values and get no range (quantization keeps them in float): %s",
                        len(unbounded), ", ".join(unbounded[:5]))
        for name, value, indices in self._run("calibrate 2/2 (histograms)"):
            if math.isfinite(max_abs[name]):
                H.accumulate(counts[name], self._histogram_values(name, value, len(indices)), max_abs[name])
            del value
        empty = [n for n in self.tensors if n not in seen]
        if empty:
            log.warning("%d tensor(s) were always empty: %s", len(empty), ", ".join(empty[:5]))
        tensors = {
            n: TensorStatistics(n, max_abs[n], lo[n] if n in seen else 0.0, hi[n] if n in seen else 0.0, counts[n])
            for n in self.tensors
        }
        self.statistics = Statistics(tensors, len(self.source), self.num_bins, str(self.model_path), channels)
        return self.statistics

    def _histogram_values(self, name: str, value: np.ndarray, samples: int) -> np.ndarray:
        """What of a fetched tensor goes into its histogram: all of it, except that a tensor with one
        row per sample (axis 0 = the samples of this run) and more than ``histogram_sample`` values
        per sample contributes the values of each sample at an even stride (:func:`_sample_stride`).
        The pick depends only on a value's position within its own sample, so the histogram stays
        independent of batch size and sample order."""
        cap = self.histogram_sample
        if cap is None or value.ndim < 2 or value.shape[0] != samples or self._independent.get(name):
            return value
        per = value.size // samples
        if per <= cap:
            return value
        return value.reshape(samples, per)[:, :: _sample_stride(per, cap)]

    def compute(self, method: str, *, percentile: float = H.DEFAULT_PERCENTILE, **options: float) -> Ranges:
        """Ranges with ``method``; runs :meth:`collect` on first use."""
        stats = self.statistics if self.statistics is not None else self.collect()
        return stats.compute(method, percentile=percentile, **options)

    # --- caches -------------------------------------------------------------------------------
    def check_ranges(self, names: Sequence[str], source: str = "calibration cache") -> None:
        """Refuse ranges/caches whose tensors do not match this model (see :func:`trtrepo.cache.check_names`)."""
        from .cache import check_names

        check_names(names, self.tensors, tensor_names(self.model), source=source)

    def load_cache(self, path: str | Path) -> Ranges:
        """Read a TensorRT cache and check it against the model's tensors."""
        ranges = Ranges.from_cache(path)
        self.check_ranges(list(ranges), source=str(path))
        return ranges


# --------------------------------------------------------------------------------------------
# The stage: what ``trtrepo calibrate`` runs


@dataclass(frozen=True)
class CalibrateOptions:
    """What ``trtrepo calibrate`` takes besides the model: the data (:class:`~trtrepo.data.DataOptions`,
    whose ``batch_size`` is the ONNX Runtime batch), the method, and the outputs (None: not written): ``cache``
    (a TensorRT calibration cache; an existing one is reused, no data read, unless
    ``recalibrate``), ``ranges`` (JSON), ``dynamic_range`` (sampleINT8API text)."""

    data: DataOptions | None = None
    method: str = "entropy"
    percentile: float = H.DEFAULT_PERCENTILE
    num_bins: int = H.DEFAULT_NUM_BINS
    cache: str | None = None
    ranges: str | None = None
    dynamic_range: str | None = None
    recalibrate: bool = False
    trt_version: str = "10.13.0"
    cache_algorithm: str | None = None
    memory_budget_mb: float | None = DEFAULT_MEMORY_BUDGET_MB
    progress: bool = False

    def outputs(self) -> dict[str, str]:
        """``{parameter: path}`` of the outputs asked for."""
        return {k: v for k, v in (("cache", self.cache), ("ranges", self.ranges), ("dynamic_range", self.dynamic_range))
                if v is not None}


@dataclass
class CalibrateResult:
    ranges: Ranges
    statistics: Statistics | None  # None when a cache was reused
    reused_cache: str | None
    written: list[str]
    seconds: float


def run_calibrate(model: str | Path, options: CalibrateOptions) -> CalibrateResult:
    """Compute (or reuse) ranges and write the outputs asked for, all rendered before any is written
    so that a failure writes nothing. Refuses outputs that name the same file, a directory, or the
    model or data they are computed from."""
    from .cache import format_cache, format_dynamic_range, trt_version_int
    from .fsutil import atomic_write_text

    trt_version_int(options.trt_version)  # validate before any work
    if options.method not in H.METHODS:
        raise UsageError(f"--method '{options.method}': expected one of {', '.join(H.METHODS)}")
    _check_outputs(options.outputs(), inputs={"model": model, "data": options.data.spec if options.data else None})
    reuse = options.cache is not None and Path(options.cache).is_file() and not options.recalibrate
    if not reuse and options.data is None:
        raise UsageError("--data is required (or --cache naming an existing calibration cache to reuse)")
    started = time.perf_counter()
    cal = Calibrator(model, options.data, batch_size=options.data.batch_size if options.data else 32,
                     num_bins=options.num_bins, progress=options.progress, memory_budget_mb=options.memory_budget_mb)
    stats = None
    if reuse and options.cache is not None:
        ranges = cal.load_cache(options.cache)
    else:
        stats = cal.collect()
        ranges = stats.compute(options.method, percentile=options.percentile)
    seconds = time.perf_counter() - started
    algorithm = options.cache_algorithm or H.METHODS[options.method].cache_algorithm
    texts: list[tuple[str, str]] = []
    if options.cache is not None and not reuse:
        texts.append((options.cache, format_cache(ranges.scales(), options.trt_version, algorithm)))
    if options.ranges is not None:
        texts.append((options.ranges, json.dumps(ranges.to_dict(stats), indent=2) + "\n"))
    if options.dynamic_range is not None:
        texts.append((options.dynamic_range, format_dynamic_range(ranges)))
    for path, text in texts:
        atomic_write_text(path, text)
    return CalibrateResult(ranges, stats, options.cache if reuse else None, [p for p, _ in texts], seconds)


def _check_outputs(outputs: Mapping[str, str], inputs: Mapping[str, Any]) -> None:
    seen: dict[Path, str] = {}
    sources = {Path(str(v)).resolve(): k for k, v in inputs.items() if isinstance(v, (str, Path)) and Path(str(v)).exists()}
    for param, value in outputs.items():
        p = Path(value).resolve()
        flag = "--" + param.replace("_", "-")
        if p.is_dir():
            raise UsageError(f"{flag} {value}: is a directory")
        if p in seen:
            raise UsageError(f"{flag} and {seen[p]} name the same file {value}")
        if p in sources:
            raise UsageError(f"{flag} {value}: is the {sources[p]} being calibrated; it would be overwritten")
        seen[p] = flag
