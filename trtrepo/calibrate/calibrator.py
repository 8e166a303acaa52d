"""The calibrator: streamed activation statistics of an ONNX model with ONNX Runtime.

:meth:`Calibrator.collect`: the selected tensors (:mod:`trtrepo.calibrate.tensors`) become extra
graph outputs of a copy of the model (:mod:`trtrepo.calibrate.weights`: without its weights in
memory) and ONNX Runtime (CUDA provider when available, else CPU) fetches only those, batch by
batch, within a memory budget (:mod:`trtrepo.calibrate.budget`). Pass 1 records the exact running
``max |x|`` of each tensor (and its signed min/max); pass 2 adds every batch into a fixed-range
histogram of ``|x|`` with ``num_bins`` bins on ``[0, max |x|]``. The histogram is kept per tensor,
never per batch: memory is bounded by bins x tensors, and no activation outlives its batch. Since
the range is fixed before binning and counts are sums, the statistics do not depend on batch size
or sample order. A NaN or Inf raises :class:`~trtrepo.errors.TrtrepoError` naming the tensor and
the samples.

A tensor with more than ``histogram_sample`` values per sample -- the early feature maps of an
image model -- goes into its histogram at an even stride within each sample (the same positions in
every sample; max and min/max still see every value): the time of binning the largest maps is
traded for a slight change of their histograms, which stays independent of batch size and sample
order (what it saves and what it moved: docs/benchmarks.md, "Calibration time and memory").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import rangemath as H
from ..cache import check_names
from ..data import DataOptions, DataSource, iter_batches, open_data
from ..errors import OptionError, TrtrepoError, UsageError, onnxruntime_run_error
from ..fsutil import temp_dir
from ..modelio import ModelIO, with_outputs
from ..progress import active as progress_active
from ..progress import bar_disabled, phase
from .budget import (
    DEFAULT_MEMORY_BUDGET_MB,
    Signature,
    input_signature,
    pack_groups,
    signature_elements,
    slice_size,
    witness_digest,
)
from .statistics import Ranges, Statistics, TensorStatistics
from .tensors import inferred_types, select_tensors, tensor_names
from .weights import gather_weights, load_graph

log = logging.getLogger(__name__)

# Values per sample and tensor that go into a histogram (pass 2): a larger activation map is read
# at an even stride (see _sample_stride). max |x| and min/max (pass 1) always see every value.
DEFAULT_HISTOGRAM_SAMPLE = 1 << 16

MIN_NUM_BINS = 128  # TensorRT's entropy calibration quantizes the histogram into 128 levels
MAX_NUM_BINS = 65536  # TensorRT's calibrators and ModelOpt use 2048


def _providers(requested: Sequence[str] | None) -> list[str]:
    import onnxruntime as ort

    available = ort.get_available_providers()
    if requested:
        missing = [p for p in requested if p not in available]
        if missing:
            raise UsageError(f"ONNX Runtime provider(s) not available: {', '.join(missing)} (available: {', '.join(available)})")
        return list(requested)
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def _sample_stride(per_sample: int, cap: int) -> int:
    """The stride that leaves at most about ``cap`` of ``per_sample`` values: at least
    ``ceil(per_sample / cap)``, and not a multiple of 2, 3 or 7, so that it does not fall in step
    with the rows of a feature map (widths like 7, 14, 28, 56, 112, 224, 384, 768)."""
    k = max(1, -(-per_sample // cap))
    while k > 1 and (k % 2 == 0 or k % 3 == 0 or k % 7 == 0):
        k += 1
    return k


@dataclass(frozen=True)
class HistogramOptions:
    """How the second pass histograms each tensor: ``num_bins`` bins on ``[0, max |x|]``, from at
    most about ``sample`` values per sample of a large tensor (None: every value; module doc)."""

    num_bins: int = H.DEFAULT_NUM_BINS
    sample: int | None = DEFAULT_HISTOGRAM_SAMPLE


def _batch_extremes(name: str, value: np.ndarray, channels: dict[str, tuple[np.ndarray, np.ndarray]] | None
                    ) -> tuple[float, float]:
    """A batch's min and max of a tensor. Decision: a tensor whose per-channel statistics are kept
    (``channels`` given; last axis) updates them, and its extremes come from its channels' (NaN
    propagates through both)."""
    if channels is None or value.ndim < 1:
        return float(value.min()), float(value.max())
    flat = value.reshape(-1, value.shape[-1])
    bmin, bmax = flat.min(axis=0).astype(np.float64), flat.max(axis=0).astype(np.float64)
    cmin, cmax = bmin, bmax
    if name in channels and channels[name][0].shape == cmin.shape:
        cmin, cmax = np.minimum(channels[name][0], cmin), np.maximum(channels[name][1], cmax)
    channels[name] = (cmin, cmax)
    return float(bmin.min()), float(bmax.max())


class Calibrator:
    """Collects activation statistics of an FP32 ONNX model over calibration data.

    ``model`` is a path to an ONNX file; ``data`` a :class:`~trtrepo.data.DataOptions` (a spec and
    how to open it: preprocess, labels, limit, seed), a bare data spec or a
    :class:`~trtrepo.data.DataSource` (optional when only :meth:`tensor_names`/cache checks are
    needed). ``histograms``: :class:`HistogramOptions`. ``tensors`` overrides
    :func:`select_tensors`; ``providers`` overrides the ONNX Runtime providers.
    ``memory_budget_mb`` bounds the activations fetched per ONNX Runtime run (micro-batches, then
    tensor groups; see :mod:`trtrepo.calibrate.budget`); ``None`` fetches whole batches.
    """

    def __init__(self, model: str | Path, data: DataOptions | DataSource | str | None = None, *, batch_size: int = 32,
                 histograms: HistogramOptions = HistogramOptions(), progress: bool = True,
                 tensors: Sequence[str] | None = None, op_types: Sequence[str] | None = None,
                 providers: Sequence[str] | None = None,
                 memory_budget_mb: float | None = DEFAULT_MEMORY_BUDGET_MB,
                 channel_tensors: Sequence[str] = ()) -> None:
        num_bins, histogram_sample = histograms.num_bins, histograms.sample
        if batch_size < 1:
            raise OptionError("batch_size", f"must be positive, got {batch_size}")
        if memory_budget_mb is not None and not (math.isfinite(memory_budget_mb) and memory_budget_mb > 0):
            raise OptionError("memory_budget_mb", f"must be a positive number, got {memory_budget_mb}",
                              concept="the memory budget (MB)")
        if not MIN_NUM_BINS <= num_bins <= MAX_NUM_BINS:
            raise OptionError("num_bins", f"{num_bins}: expected {MIN_NUM_BINS}..{MAX_NUM_BINS} (entropy compares "
                              f"quantizations into {MIN_NUM_BINS} levels, and with fewer bins every method falls back to "
                              f"the maximum; each calibrated tensor keeps one int64 count per bin)",
                              concept="the number of histogram bins")
        if histogram_sample is not None and histogram_sample < 1:
            raise UsageError(f"histogram_sample must be positive, got {histogram_sample}")
        self.histogram_sample = histogram_sample
        self.model_path = Path(model)
        # The graph; the data of its large initializers stays in the model's files (external data).
        self.model = load_graph(self.model_path)
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
        # a bare spec or source opens with the default options (no preprocess, labels or limit, seed 0)
        self._data_how = data if isinstance(data, DataOptions) else DataOptions(spec="")
        self._data_spec = data.spec if isinstance(data, DataOptions) else data
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
                raise OptionError("", "calibration needs data (give {data_spec})", others={"data_spec": "a data spec"})
            how = self._data_how
            self._source = open_data(self._data_spec, io=self.io, preprocess=how.preprocess, labels=how.labels, limit=how.limit,
                                     seed=how.seed, skip_non_images=how.skip_non_images)
        return self._source

    def _augmented_model(self) -> Any:
        """A copy of the model (without its weights) with every selected tensor as a graph output."""
        return with_outputs(self.model, self.tensors, inferred_types(self.model))

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
            gather_weights(model, self.model_path.parent, folder / "augmented.data")
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

        budget = self._budget
        groups = [list(self.tensors)]
        first = next(iter(iter_batches(self.source, 1, self.io)), None)
        if budget is not None and first is not None:
            values = self._session_run(self.session, self.tensors, first.inputs, first.indices)
            sizes = {name: float(v.nbytes) for name, v in zip(self.tensors, values, strict=True)}
            del values
            self._record(input_signature(first.inputs), sizes)
            # Room for the smallest runs of a batch: 3 samples (runs of 1 are avoided, see _run_batch).
            room = budget // min(3, self.batch_size)
            if sum(sizes.values()) > room:
                groups = pack_groups(self.tensors, sizes, room)
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
        size = signature_elements(sig)
        best: dict[str, float] | None = None
        for other, measured in self._bytes.items():
            if not all(n in measured for n in names):
                continue
            factor = max(1.0, size / max(signature_elements(other), 1)) ** 2
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

        source = self.source
        groups = [list(self.tensors)] if self._budget is None else self._output_groups()
        total = len(source) * len(groups)
        # inside a progress task (quantize, deploy) the task's phase lines replace the bar
        shown = self.progress and not progress_active()
        with tqdm(total=total, desc=desc, unit="sample", disable=bar_disabled(None if shown else False),
                  leave=False) as tq, phase(desc.replace("calibrate", "calibration", 1), total, "samples") as ph:
            bar = _Counter(tq, ph)
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
        sig = input_signature(batch.inputs)
        start = 0
        witnesses: dict[str, tuple[tuple[int, ...], bytes]] | None = None
        while start < size:
            left = size - start
            fit = self._fit(sig, names, budget)
            m = slice_size(left, left if fit is None else fit)
            classify = False
            if start == 0 and m < left and any(n not in self._independent for n in names):
                if size < 5:  # too few samples to classify: one run
                    m = left
                else:
                    m, witnesses = 2, {}
            elif witnesses is not None:
                m = slice_size(left, max(3, fit or left), avoid=2)
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
                        self._independent[name] = witnesses.pop(name) == (value.shape, witness_digest(value))
                    else:
                        witnesses[name] = (value.shape, witness_digest(value))
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
            vmin, vmax = _batch_extremes(name, value, channels if name in channel_set else None)
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
        check_names(names, self.tensors, tensor_names(self.model), source=source)

    def load_cache(self, path: str | Path) -> Ranges:
        """Read a TensorRT cache and check it against the model's tensors."""
        ranges = Ranges.from_cache(path)
        self.check_ranges(list(ranges), source=str(path))
        return ranges


class _Counter:
    """Samples done, counted on the bar and on the progress phase alike."""

    def __init__(self, bar: Any, ph: Any) -> None:
        self.bar, self.ph = bar, ph

    def update(self, n: int) -> None:
        self.bar.update(n)
        self.ph.advance(n)
