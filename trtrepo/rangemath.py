"""Histograms of |x| and the four INT8 range calibrators, as pure numpy functions (no I/O).

The range arithmetic; ``trtrepo calibrate``'s flow (the ONNX Runtime passes that fill the
histograms) is :mod:`trtrepo.calibrate`.

Everything here works on a *fixed-range* histogram of absolute values: ``counts`` (integer
counts, ``num_bins`` long) over ``edges = histogram_edges(max_abs, num_bins)``, i.e. equal bins
on ``[0, max_abs]`` where ``max_abs`` is the exact maximum of ``|x|`` over all the data (found in
a first pass). Because the range is fixed before any value is binned, the histogram is a plain
sum over samples: it does not depend on batch size or the order of the data (unlike TensorRT's
own calibrator, whose range doubles as larger values arrive, and pytorch-quantization's, whose
bin width is set by the first batch).

Stable API (used by :mod:`trtrepo.calibrate` and later stages)::

    histogram_edges(max_abs, num_bins) -> edges            # float64, num_bins + 1
    accumulate(counts, x, max_abs) -> counts               # adds |x| into counts in place
    amax_minmax(max_abs) -> float
    amax_entropy(counts, edges, *, num_levels=128, start_bin=128, stride=1) -> float
    amax_percentile(counts, edges, percentile=99.99) -> float
    amax_mse(counts, edges, *, start_bin=128, num_bits=8) -> float
    compute_amax(method, counts, edges, max_abs, **options) -> float
    METHODS: Registry[CalibrationMethod]   # the registry: entropy, minmax, percentile, mse, plug-ins

Conventions:

* ``entropy`` is TensorRT's EntropyCalibrator2 as published in pytorch-quantization / ModelOpt
  (``_compute_amax_entropy``): ``bins[0] = bins[1]`` to drop the zero spike, candidates
  ``i = start_bin .. num_bins``, reference P = ``bins[:i]`` with the tail folded into its last
  bin, Q = ``bins[:i]`` merged into ``num_levels`` chunks (chunk of bin ``j`` is
  ``floor(num_levels * j / i)``, exactly what ``np.digitize`` over ``linspace(0, i, levels+1)``
  gives) and spread back over the chunk's *non-zero* bins only, KL(P||Q) without smoothing,
  the **last** minimum wins and ``amax = edges[i]``.
* ``percentile`` returns the *upper* edge of the bin where the cumulative count first reaches
  the percentile (the reference returns that bin's lower edge, one bin lower), so
  ``percentile=100`` gives the exact maximum.
* ``mse`` minimises the expected squared error of symmetric narrow-range quantization
  (``round(x / s)`` clipped to ``[-(2^(b-1)-1), 2^(b-1)-1]``, ``s = amax / 127`` for 8 bits),
  with every bin represented by its center, over candidates ``amax = edges[i]``,
  ``i >= start_bin``; the first minimum wins.
* A tensor whose values are all zero has ``max_abs == 0`` and every method returns 0.0; a
  constant tensor returns its constant. Nothing here raises on degenerate data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .plugins import CALIBRATION_METHODS, Registry

DEFAULT_NUM_BINS = 2048
DEFAULT_PERCENTILE = 99.99

# Candidate rows evaluated at once by the vectorised searches (rows x num_bins float64 arrays).
_BLOCK = 128


def histogram_edges(max_abs: float, num_bins: int = DEFAULT_NUM_BINS) -> np.ndarray:
    """Bin edges of the fixed-range histogram: ``num_bins`` equal bins on ``[0, max_abs]``."""
    if num_bins < 1:
        raise ValueError(f"num_bins must be positive, got {num_bins}")
    return np.linspace(0.0, float(max_abs), num_bins + 1)


def _scaled_abs(x: np.ndarray, max_abs: float, num_bins: int) -> np.ndarray:
    """``|x| * (num_bins / max_abs)`` in a fresh array (float32 for float16/float32 input)."""
    x = np.asarray(x)
    factor = num_bins / float(max_abs)
    # float32 is exact enough and twice as fast; float64 for float64 data and for ranges so
    # small (below ~1e-34) that the factor would overflow float32.
    dtype = np.float64 if x.dtype == np.float64 or factor > 1e36 else np.float32
    a = np.abs(x.reshape(-1), dtype=dtype)
    np.multiply(a, dtype(factor), out=a)
    return a


def bin_index(abs_x: np.ndarray, max_abs: float, num_bins: int) -> np.ndarray:
    """Bin of each value of ``|abs_x|`` (flattened, ``<= max_abs``) as an int array.

    Bin ``k`` holds ``[k w, (k+1) w)`` with ``w = max_abs / num_bins``, up to the rounding of
    one float32 (float64 for float64 tensors) multiplication; ``max_abs`` itself goes to the
    last bin. The bin of a value depends only on the value and ``max_abs``, never on the batch
    it arrives in.
    """
    if max_abs <= 0:
        return np.zeros(np.size(abs_x), dtype=np.intp)
    scaled = _scaled_abs(abs_x, max_abs, num_bins)
    if num_bins <= 2**16:
        # Clip in float, then truncate to uint16: the same bins as truncating to intp and
        # clipping there (both floor non-negative values and cap at num_bins - 1), at a quarter
        # of the index memory, and faster.
        np.minimum(scaled, scaled.dtype.type(num_bins - 1), out=scaled)
        return scaled.astype(np.uint16)
    idx = scaled.astype(np.intp)
    np.minimum(idx, num_bins - 1, out=idx)
    return idx


# Values binned per step of :func:`accumulate`: small enough that the float buffer, its uint16
# indices and bincount's intp copy stay in cache, large enough that the Python loop is noise.
_CHUNK = 1 << 16


def accumulate(counts: np.ndarray, x: np.ndarray, max_abs: float) -> np.ndarray:
    """Add the histogram of ``|x|`` over ``[0, max_abs]`` to ``counts`` (int64, in place).

    Values above ``max_abs`` (which a correct first pass never produces) are counted in the
    last bin. Non-finite values must be rejected by the caller beforehand.

    The same bins as ``np.bincount(bin_index(x, max_abs, num_bins))``, computed in chunks of
    ``_CHUNK`` values into one reused buffer: 3.4x faster on a 38 M-value activation batch
    (the whole-array form spends most of its time in memory traffic, bincount's cast of the
    indices to intp included).
    """
    num_bins = len(counts)
    flat = np.asarray(x).reshape(-1)
    if flat.size == 0:
        return counts
    if max_abs <= 0 or num_bins > 2**16 or flat.size <= _CHUNK:
        counts += np.bincount(bin_index(flat, max_abs, num_bins), minlength=num_bins)
        return counts
    factor = num_bins / float(max_abs)
    dtype = np.float64 if flat.dtype == np.float64 or factor > 1e36 else np.float32
    scale, top = dtype(factor), dtype(num_bins - 1)
    buf = np.empty(_CHUNK, dtype)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start:start + _CHUNK]
        b = buf[:part.size]
        np.abs(part, out=b, casting="unsafe")  # the same rounding as _scaled_abs's abs(x, dtype)
        np.multiply(b, scale, out=b)
        np.minimum(b, top, out=b)
        counts += np.bincount(b.astype(np.uint16), minlength=num_bins)
    return counts


def _as_counts(counts: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(counts, dtype=np.float64).reshape(-1)
    e = np.asarray(edges, dtype=np.float64).reshape(-1)
    if len(e) != len(c) + 1:
        raise ValueError(f"edges must have len(counts) + 1 = {len(c) + 1} values, got {len(e)}")
    if np.any(c < 0):
        raise ValueError("histogram counts must be non-negative")
    return c, e


def amax_minmax(max_abs: float) -> float:
    """TensorRT MinMax semantics: the maximum of ``|x|`` over all calibration data."""
    return float(max_abs)


def amax_percentile(counts: np.ndarray, edges: np.ndarray, percentile: float = DEFAULT_PERCENTILE) -> float:
    """Upper edge of the bin in which the cumulative count reaches ``percentile`` % of all values."""
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    c, e = _as_counts(counts, edges)
    total = c.sum()
    if total <= 0 or e[-1] <= 0:
        return float(e[-1]) if total > 0 else 0.0
    cum = np.cumsum(c)  # exact: integer counts below 2**53
    # The count to reach, exactly: the percentile read as the decimal it was written as.
    target = math.ceil(Fraction(int(total)) * Fraction(repr(float(percentile))) / 100) if total == int(total) \
        else total * percentile / 100.0
    idx = int(np.searchsorted(cum, target, side="left"))
    idx = min(idx, len(c) - 1)
    return float(e[idx + 1])


def amax_entropy(
    counts: np.ndarray,
    edges: np.ndarray,
    *,
    num_levels: int = 128,
    start_bin: int = 128,
    stride: int = 1,
) -> float:
    """TensorRT EntropyCalibrator2 threshold (the pytorch-quantization algorithm, vectorised).

    Returns ``edges[i]`` for the candidate ``i`` with the smallest KL divergence (the last one
    on ties). With fewer than ``start_bin`` bins the only candidate is the full range.
    """
    c, e = _as_counts(counts, edges)
    n = len(c)
    if e[-1] <= 0:
        return 0.0
    bins = c.copy()
    if n > 1:
        bins[0] = bins[1]
    total = bins.sum()
    start = min(start_bin, n)
    candidates = np.arange(start, n + 1, stride)
    if total <= 0 or len(candidates) == 0:
        return float(e[-1])

    divergences = _entropy_divergences(bins, candidates, num_levels)
    best = len(divergences) - 1 - int(np.argmin(divergences[::-1]))
    return float(e[candidates[best]])


def _entropy_divergences(bins: np.ndarray, candidates: np.ndarray, num_levels: int) -> np.ndarray:
    """KL(P_i || Q_i) for every candidate ``i``, in closed form from cumulative sums.

    With ``b`` the bins, ``T`` their total, ``S_i = sum(b[:i])`` and ``a_c`` the mean of the
    non-zero bins of chunk ``c``, the non-zero bins ``j < i`` contribute
    ``(b_j / T) log((b_j / T) / (a_c / S_i))``; summed per chunk that is
    ``(sum b log b - sum_c s_c log a_c + S_i log(S_i / T)) / T``. The last kept bin then swaps its
    own term for the one with the outliers folded in (infinite when it is empty but the tail is
    not). O(candidates x levels) instead of O(candidates x bins); equal to the direct
    evaluation (``_entropy_divergences_direct``) to rounding.
    """
    total = bins.sum()
    nonzero = bins > 0
    blogb = np.where(nonzero, bins * np.log(np.where(nonzero, bins, 1.0)), 0.0)
    cum = np.concatenate(([0.0], np.cumsum(bins)))
    cum_nz = np.concatenate(([0], np.cumsum(nonzero)))
    cum_blogb = np.concatenate(([0.0], np.cumsum(blogb)))
    ii = candidates.astype(np.int64)
    levels = np.arange(num_levels + 1)
    bounds = -((-levels[None, :] * ii[:, None]) // num_levels)  # chunk k = [ceil(k i/L), ceil((k+1) i/L))
    chunk_sum = cum[bounds[:, 1:]] - cum[bounds[:, :-1]]
    chunk_nz = cum_nz[bounds[:, 1:]] - cum_nz[bounds[:, :-1]]
    has = chunk_nz > 0
    avg = np.where(has, chunk_sum / np.where(has, chunk_nz, 1), 1.0)
    s_i = cum[ii]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.where(s_i > 0, np.log(s_i / total), 0.0)
        kl = cum_blogb[ii] - (chunk_sum * np.log(avg)).sum(axis=1) + s_i * log_ratio
        last = bins[ii - 1]
        tail = total - s_i
        log_avg_last = np.log(avg[:, -1])
        folded = last + tail
        own = np.where(last > 0, last * (np.log(np.where(last > 0, last, 1.0)) - log_avg_last + log_ratio), 0.0)
        new = np.where(folded > 0, folded * (np.log(np.where(folded > 0, folded, 1.0)) - log_avg_last + log_ratio), 0.0)
        kl = (kl - own + new) / total
    kl = np.where((last == 0) & (tail > 0), np.inf, kl)
    return np.where(s_i > 0, kl, np.inf)


def _entropy_divergences_direct(bins: np.ndarray, candidates: np.ndarray, num_levels: int) -> np.ndarray:
    """The same divergences evaluated term by term as pytorch-quantization does (tests only)."""
    total = bins.sum()
    out = np.empty(len(candidates))
    for k, i in enumerate(candidates):
        p = bins[:i].copy()
        p[-1] += total - bins[:i].sum()
        chunk = (num_levels * np.arange(i)) // i
        nz = bins[:i] > 0
        sums = np.bincount(chunk[nz], weights=bins[:i][nz], minlength=num_levels)
        cnt = np.bincount(chunk[nz], minlength=num_levels)
        q = np.where(nz, sums[chunk] / np.maximum(cnt[chunk], 1), 0.0)
        pn, qn = p / p.sum(), q / q.sum() if q.sum() > 0 else q
        with np.errstate(divide="ignore", invalid="ignore"):
            out[k] = np.sum(np.where(pn > 0, np.where(qn > 0, pn * np.log(pn / qn), np.inf), 0.0))
    return out


def quantization_mse(
    counts: np.ndarray, edges: np.ndarray, amax: np.ndarray | float, *, num_bits: int = 8
) -> np.ndarray:
    """Expected squared error of symmetric narrow-range quantization with the given ``amax``
    (scalar or 1-d array of candidates), each bin represented by its center."""
    c, e = _as_counts(counts, edges)
    amaxes = np.atleast_1d(np.asarray(amax, dtype=np.float64))
    centers = (e[1:] + e[:-1]) / 2
    qmax = float(2 ** (num_bits - 1) - 1)
    total = c.sum()
    keep = c > 0  # empty bins add nothing
    c, centers = c[keep], centers[keep]
    out = np.empty(len(amaxes))
    for lo in range(0, len(amaxes), _BLOCK):
        a = amaxes[lo : lo + _BLOCK, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(a > 0, a / qmax, 1.0)
            q = np.clip(np.round(centers[None, :] / scale), -qmax, qmax) * scale
        q = np.where(a > 0, q, 0.0)
        out[lo : lo + len(a)] = ((q - centers[None, :]) ** 2 * c[None, :]).sum(axis=1) / max(total, 1.0)
    return out


def amax_mse(counts: np.ndarray, edges: np.ndarray, *, start_bin: int = 128, num_bits: int = 8) -> float:
    """The candidate ``amax = edges[i]`` (``i >= start_bin``) with the smallest expected squared
    quantization error over the histogram (first minimum on ties)."""
    c, e = _as_counts(counts, edges)
    n = len(c)
    if e[-1] <= 0 or c.sum() <= 0:
        return float(max(e[-1], 0.0)) if c.sum() > 0 else 0.0
    candidates = e[min(start_bin, n) :]
    errors = quantization_mse(c, e, candidates, num_bits=num_bits)
    return float(candidates[int(np.argmin(errors))])


@dataclass(frozen=True)
class CalibrationMethod:
    """One range calibrator of the registry :data:`METHODS`.

    ``amax(counts, edges, max_abs, **options)``: the range from the fixed-range histogram;
    ``options``: the option names it accepts (others are ignored), each converted with its type;
    ``cache_algorithm``: the algorithm name a TensorRT calibration cache of its ranges carries;
    ``help``: one line for the CLI. Registering a method (:func:`register`) is the only step a new
    method needs: ``trtrepo calibrate/quantize/deploy --method`` and ``--method auto`` iterate
    :data:`METHODS`."""

    name: str
    amax: Callable[..., float]
    options: dict[str, type] = field(default_factory=dict)
    cache_algorithm: str = "EntropyCalibration2"
    help: str = ""

    def compute(self, counts: np.ndarray, edges: np.ndarray, max_abs: float, **options: float) -> float:
        kw = {k: self.options[k](v) for k, v in options.items() if k in self.options}
        return float(self.amax(counts, edges, max_abs, **kw))


def _check(methods: Mapping[str, CalibrationMethod], method: CalibrationMethod) -> None:
    if method.name == "auto":
        raise ValueError("calibration method 'auto' is reserved: it names trying every registered method")


# The registry: the four below, then the ``trtrepo.calibration_methods`` entry points (trtrepo.plugins).
METHODS: Registry[CalibrationMethod] = Registry(CALIBRATION_METHODS, "calibration method", CalibrationMethod,
                                                lambda m: m.name, _check)


def register(method: CalibrationMethod) -> CalibrationMethod:
    """Add ``method`` to :data:`METHODS` (the order of registration is the order ``auto`` tries)."""
    return METHODS.register(method)


ENTROPY = register(CalibrationMethod(
    "entropy", lambda c, e, m, **o: amax_entropy(c, e, **o), {"num_levels": int, "start_bin": int, "stride": int},
    help="TensorRT's EntropyCalibrator2: the range whose 128-level histogram is closest (KL) to the data's"))
MINMAX = register(CalibrationMethod(
    "minmax", lambda c, e, m, **o: amax_minmax(m), cache_algorithm="MinMaxCalibration",
    help="max |x|: nothing clipped"))
PERCENTILE = register(CalibrationMethod(
    "percentile", lambda c, e, m, **o: amax_percentile(c, e, **o), {"percentile": float},
    help=f"the given percentile of |x| (default {DEFAULT_PERCENTILE})"))
MSE = register(CalibrationMethod(
    "mse", lambda c, e, m, **o: amax_mse(c, e, **o), {"start_bin": int, "num_bits": int},
    help="the range with the least expected squared quantization error"))


def method_names(*, auto: bool = False) -> tuple[str, ...]:
    """The registered method names (plus ``auto`` when asked): the CLI's ``--method`` choices."""
    return (*METHODS, *(("auto",) if auto else ()))


def compute_amax(method: str, counts: np.ndarray, edges: np.ndarray, max_abs: float, **options: float) -> float:
    """Dispatch to one registered calibrator. ``options``: ``percentile`` (percentile),
    ``start_bin``, ``num_levels``, ``stride`` (entropy), ``start_bin``, ``num_bits`` (mse)."""
    entry = METHODS.get(method)
    if entry is None:
        raise ValueError(f"unknown calibration method '{method}' (expected one of {', '.join(METHODS)})")
    return entry.compute(counts, edges, max_abs, **options)


def summarize(counts: np.ndarray, edges: np.ndarray, amax: float | None = None) -> dict[str, float | int]:
    """A small JSON-able summary of a histogram: totals, zero fraction, a few percentiles and,
    when ``amax`` is given, the fraction of values above it (clipped by quantization)."""
    c, e = _as_counts(counts, edges)
    total = float(c.sum())
    out: dict[str, float | int] = {
        "num_values": int(total),
        "num_bins": len(c),
        "max_abs": float(e[-1]),
        "bin_width": float(e[1] - e[0]) if len(e) > 1 else 0.0,
        "first_bin_fraction": float(c[0] / total) if total else 0.0,
    }
    for p in (99.0, 99.9, 99.99):
        out[f"p{p:g}"] = amax_percentile(c, e, p)
    if amax is not None and total:
        cum = np.cumsum(c)
        k = int(np.searchsorted(e, amax, side="left"))  # bins fully at or above amax start here
        out["clipped_fraction"] = float((total - (cum[k - 1] if k > 0 else 0.0)) / total) if k < len(c) else 0.0
    return out
