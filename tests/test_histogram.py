"""The calibrators of trtrepo.rangemath: against ModelOpt's HistogramCalibrator (the public
pytorch-quantization / TensorRT EntropyCalibrator2 algorithm), against a brute-force MSE search,
and as properties (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from trtrepo import rangemath as H

NUM_BINS = 2048


def hist_of(x: np.ndarray, num_bins: int = NUM_BINS) -> tuple[np.ndarray, np.ndarray, float]:
    m = float(np.abs(x).max()) if x.size else 0.0
    counts = H.accumulate(np.zeros(num_bins, np.int64), x, m)
    return counts, H.histogram_edges(m, num_bins), m


def distributions() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "normal": rng.standard_normal(100_000).astype(np.float32),
        "relu-normal": np.maximum(rng.standard_normal(100_000), 0).astype(np.float32),
        "laplace-outliers": np.concatenate([rng.laplace(size=50_000), [40.0, -55.0]]).astype(np.float32),
        "few-samples": rng.standard_normal(300).astype(np.float32),  # a sparse histogram with many empty bins
    }


def modelopt_amax(counts: np.ndarray, edges: np.ndarray, method: str, **kw: float) -> float:
    mo = pytest.importorskip(
        "modelopt.torch.quantization.calib.histogram",
        reason="nvidia-modelopt (test extra) is not installed: pip install nvidia-modelopt==0.47.0",
    )
    cal = mo.HistogramCalibrator(num_bits=8, axis=None, unsigned=False, num_bins=len(counts))
    # Inject the very same histogram. A fresh copy each time: the reference's entropy writes
    # bins[0] = bins[1] into the array it is given (a numpy view), which would change later calls.
    cal._calib_hist = np.array(counts, dtype=np.int64, copy=True)
    cal._calib_bin_edges = np.array(edges, dtype=np.float64, copy=True)
    return float(cal.compute_amax(method, **kw))


# --------------------------------------------------------------------------------------------
# Against the reference


# TensorRT's 2048 bins, and 512 for one distribution: the reference's search is quadratic in the
# bins (15 s of the test run at 2048 for "normal", 12 s at 1024, 10 s at 512, most of it ModelOpt's first
# import), and the comparison holds at any bin count.
@pytest.mark.parametrize("name,bins", [("normal", 512), ("relu-normal", NUM_BINS), ("laplace-outliers", NUM_BINS),
                                       ("few-samples", NUM_BINS)])
def test_entropy_matches_modelopt_within_one_bin(name: str, bins: int) -> None:
    counts, edges, _ = hist_of(distributions()[name], bins)
    ours = H.amax_entropy(counts, edges)
    ref = modelopt_amax(counts, edges, "entropy")
    width = edges[1] - edges[0]
    # Same candidate set and the same KL; the reference returns a float32 tensor, hence the rtol.
    assert abs(ours - ref) <= width + 1e-6 * ref, (ours, ref, width)
    assert ours < edges[-1]  # these distributions all have a tail worth clipping


@pytest.mark.parametrize("percentile", [99.0, 99.9, 99.99])
@pytest.mark.parametrize("name", ["normal", "relu-normal", "laplace-outliers"])
def test_percentile_matches_modelopt_within_one_bin(name: str, percentile: float) -> None:
    counts, edges, _ = hist_of(distributions()[name])
    ours = H.amax_percentile(counts, edges, percentile)
    ref = modelopt_amax(counts, edges, "percentile", percentile=percentile)
    # k: the first bin whose cumulative count reaches the percentile, in exact arithmetic.
    cum = np.cumsum(counts)
    k = int(np.argmax(cum * 100 * 10**6 >= counts.sum() * round(percentile * 10**6)))
    assert ours == edges[k + 1]
    # The reference returns the lower edge of that bin (edges[k], one bin below trtrepo, which
    # returns the upper edge so that percentile 100 gives the max). When the percentile falls
    # exactly on a cumulative count (99.99% of 100000 values = 99990), its float cdf
    # (cumsum(hist / total)) rounds just below p/100 and it moves on to the next non-empty bin.
    next_nonempty = k + 1 + int(np.argmax(counts[k + 1 :] > 0))
    assert np.float32(ref) in (np.float32(edges[k]), np.float32(edges[next_nonempty])), (ref, edges[k], k)


def test_percentile_agrees_with_numpy_within_one_bin() -> None:
    x = distributions()["normal"]
    counts, edges, _ = hist_of(x)
    for p in (50.0, 99.0, 99.99):
        exact = float(np.percentile(np.abs(x), p))
        ours = H.amax_percentile(counts, edges, p)
        assert exact <= ours + 1e-6 <= exact + (edges[1] - edges[0]) + 2e-6
    assert H.amax_percentile(counts, edges, 100.0) == pytest.approx(edges[-1])


def brute_force_mse(x: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Mean squared error of symmetric narrow-range int8 fake quantization on the raw values."""
    out = []
    for a in candidates:
        s = a / 127.0
        q = np.clip(np.round(x / s), -127, 127) * s
        out.append(float(np.mean((q - x) ** 2)))
    return np.asarray(out)


@pytest.mark.parametrize("name", ["normal", "relu-normal", "laplace-outliers"])
def test_mse_matches_brute_force_search(name: str) -> None:
    x = distributions()[name].astype(np.float64)[:30_000]
    counts, edges, m = hist_of(x)
    ours = H.amax_mse(counts, edges)
    grid = np.linspace(m / 64, m, 600)
    errors = brute_force_mse(x, grid)
    best = float(grid[np.argmin(errors)])
    ours_error = float(brute_force_mse(x, np.asarray([ours]))[0])
    # The objective is flat near its minimum: the amax agrees to a few percent and its error is
    # within 1% of the brute-force optimum on the raw data.
    assert ours_error <= errors.min() * 1.01, (ours, best)
    assert ours == pytest.approx(best, rel=0.05)
    assert ours < m  # clipping pays off for all three


@pytest.mark.parametrize("name", ["normal", "relu-normal", "laplace-outliers", "few-samples"])
@pytest.mark.parametrize("num_bins", [2048, 300])
def test_closed_form_entropy_equals_direct_evaluation(name: str, num_bins: int) -> None:
    counts, _, _ = hist_of(distributions()[name], num_bins)
    bins = counts.astype(np.float64)
    bins[0] = bins[1]
    candidates = np.arange(128, num_bins + 1)
    fast = H._entropy_divergences(bins, candidates, 128)
    direct = H._entropy_divergences_direct(bins, candidates, 128)
    assert np.array_equal(np.isfinite(fast), np.isfinite(direct))
    finite = np.isfinite(direct)
    np.testing.assert_allclose(fast[finite], direct[finite], rtol=1e-8)
    # and the same last minimum
    assert np.argmin(fast[::-1]) == np.argmin(direct[::-1])


def test_mse_beats_minmax_and_far_clipping() -> None:
    counts, edges, m = hist_of(distributions()["laplace-outliers"])
    amax = H.amax_mse(counts, edges)
    err = H.quantization_mse(counts, edges, np.asarray([amax, m, amax / 4]))
    assert err[0] < err[1] and err[0] < err[2]


# --------------------------------------------------------------------------------------------
# Streaming and degenerate inputs


def test_histogram_is_independent_of_split_and_order() -> None:
    x = distributions()["laplace-outliers"]
    m = float(np.abs(x).max())
    whole = H.accumulate(np.zeros(NUM_BINS, np.int64), x, m)
    rng = np.random.default_rng(1)
    parts = np.zeros(NUM_BINS, np.int64)
    for chunk in np.array_split(rng.permutation(x), 37):
        H.accumulate(parts, chunk, m)
    assert np.array_equal(whole, parts)
    assert whole.sum() == x.size


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("size", [H._CHUNK - 1, H._CHUNK, 3 * H._CHUNK + 5])
def test_chunked_accumulate_bins_like_bin_index(dtype: type, size: int) -> None:
    """accumulate bins big tensors chunk by chunk; every value must land where bin_index puts
    it, across chunk boundaries, with values above max_abs in the last bin."""
    rng = np.random.default_rng(size)
    x = (rng.laplace(size=size) * 3).astype(dtype).reshape(-1, 5) if size % 5 == 0 else \
        (rng.laplace(size=size) * 3).astype(dtype)
    m = float(np.abs(x).max())
    for top in (m, m / 3):
        counts = H.accumulate(np.zeros(NUM_BINS, np.int64), x, top)
        expected = np.bincount(H.bin_index(x, top, NUM_BINS), minlength=NUM_BINS)
        assert np.array_equal(counts, expected)
        assert counts.sum() == x.size


def test_max_value_lands_in_last_bin_and_zero_in_first() -> None:
    counts = H.accumulate(np.zeros(16, np.int64), np.asarray([0.0, -2.0, 2.0, 1.0], np.float32), 2.0)
    assert counts[0] == 1 and counts[-1] == 2 and counts[8] == 1


@pytest.mark.parametrize("method", H.METHODS)
def test_all_zero_tensor_gives_zero(method: str) -> None:
    counts, edges, m = hist_of(np.zeros(1000, np.float32))
    assert m == 0.0 and counts[0] == 1000
    assert H.compute_amax(method, counts, edges, m) == 0.0


@pytest.mark.parametrize("method", H.METHODS)
@pytest.mark.parametrize("value", [1e-20, 0.75, -3.0, 1e30])
def test_constant_tensor(method: str, value: float) -> None:
    counts, edges, m = hist_of(np.full(500, value, np.float32))
    amax = H.compute_amax(method, counts, edges, m)
    assert np.isfinite(amax) and 0 < amax <= m
    if method in ("minmax", "entropy", "percentile"):
        assert amax == pytest.approx(abs(value), rel=1e-6)


def test_entropy_with_fewer_bins_than_start_bin_uses_full_range() -> None:
    counts, edges, m = hist_of(distributions()["normal"], num_bins=64)
    assert H.amax_entropy(counts, edges) == pytest.approx(m)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="edges"):
        H.amax_entropy(np.ones(4), np.linspace(0, 1, 4))
    with pytest.raises(ValueError, match="percentile"):
        H.amax_percentile(np.ones(4), np.linspace(0, 1, 5), 101)
    with pytest.raises(ValueError, match="unknown calibration method"):
        H.compute_amax("kl", np.ones(4), np.linspace(0, 1, 5), 1.0)


# --------------------------------------------------------------------------------------------
# Properties

samples = st.lists(
    st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False, width=32),
    min_size=1, max_size=400,
).map(lambda v: np.asarray(v, dtype=np.float32))
BINS = 256  # small histograms keep the property tests fast; the algorithms do not depend on 2048


def all_amax(x: np.ndarray, **kw: float) -> dict[str, float]:
    counts, edges, m = hist_of(x, BINS)
    return {method: H.compute_amax(method, counts, edges, m, **kw) for method in H.METHODS}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples, st.floats(min_value=50.0, max_value=100.0))
def test_ordering_minmax_is_the_largest(x: np.ndarray, percentile: float) -> None:
    r = all_amax(x, percentile=percentile)
    assert r["minmax"] == pytest.approx(float(np.abs(x).max()))
    for method in ("entropy", "percentile", "mse"):
        assert 0.0 <= r[method] <= r["minmax"], (method, r)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples, st.integers(min_value=-20, max_value=20))
def test_amax_scales_exactly_with_powers_of_two(x: np.ndarray, exponent: int) -> None:
    factor = 2.0**exponent
    scaled_x = (x * factor).astype(np.float32)
    # exact only while the scaled values stay normal float32 numbers (a subnormal loses mantissa bits)
    nonzero = np.abs(np.concatenate([x.ravel(), scaled_x.ravel()]))
    assume(bool(np.all((nonzero == 0) | (nonzero >= np.finfo(np.float32).tiny))))
    base, scaled = all_amax(x), all_amax(scaled_x)
    for method in H.METHODS:
        assert scaled[method] == pytest.approx(base[method] * factor, rel=1e-9, abs=0.0), method


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples, st.floats(min_value=0.01, max_value=100.0))
def test_amax_scales_linearly_with_any_factor(x: np.ndarray, factor: float) -> None:
    counts, edges, m = hist_of(x, BINS)
    scaled_x = x.astype(np.float64) * factor
    counts2, edges2, m2 = hist_of(scaled_x, BINS)
    assert m2 == pytest.approx(m * factor, rel=1e-9)
    width = edges2[1] - edges2[0]
    # Rounding may move a value across a bin edge, so percentile agrees within one bin.
    p1 = H.amax_percentile(counts, edges, 99.0) * factor
    assert abs(H.amax_percentile(counts2, edges2, 99.0) - p1) <= width * (1 + 1e-6)


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32), st.integers(min_value=1, max_value=300))
def test_constant_and_zero_tensors_never_crash(value: float, n: int) -> None:
    r = all_amax(np.full(n, value, np.float32))
    for method, amax in r.items():
        assert np.isfinite(amax) and 0.0 <= amax <= abs(value) * (1 + 1e-6), method
        if value == 0:
            assert amax == 0.0
