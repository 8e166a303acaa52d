"""The stability rule and the open-loop schedule (trtrepo.measure): pure functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtrepo.errors import UsageError
from trtrepo.measure import (
    CpuSample,
    Stability,
    deviation,
    is_stable,
    latency_ms,
    machine_usage,
    machine_warnings,
    merged,
    parse_percentiles,
    send_times,
    spread,
    window_summary,
)


def _w(throughput: float, mean_ms: float, n: int = 10) -> dict:
    lat = np.full(n, mean_ms / 1e3)
    return window_summary(lat, int(throughput), 1.0)


def test_three_windows_within_the_percentage_are_stable_two_are_not():
    assert not is_stable([_w(100, 10), _w(100, 10)], 10)
    assert is_stable([_w(95, 10), _w(100, 10), _w(105, 10)], 10)
    # the oldest window does not count once three newer ones agree
    assert is_stable([_w(10, 99), _w(95, 10), _w(100, 10), _w(105, 10)], 10)


def test_throughput_or_latency_outside_the_band_is_not_stable():
    assert not is_stable([_w(80, 10), _w(100, 10), _w(120, 10)], 10)  # 20% off the mean
    assert not is_stable([_w(100, 8), _w(100, 10), _w(100, 12)], 10)
    assert is_stable([_w(100, 8), _w(100, 10), _w(100, 12)], 25)


def test_a_chosen_percentile_replaces_the_mean_in_the_rule():
    wide = [window_summary(np.r_[np.full(98, 0.010), [0.010 * k, 0.010 * k]], 100, 1.0, (50, 99)) for k in (1, 5, 10)]
    assert is_stable(wide, 10, "p50")
    assert not is_stable(wide, 10, "p99")


def test_deviation_and_spread_are_percent_of_the_mean():
    assert deviation([90, 100, 110]) == pytest.approx(10.0)
    assert deviation([]) == math.inf and deviation([0, 0]) == math.inf
    s = spread([_w(90, 10), _w(100, 10), _w(110, 10)])
    assert s["throughput_pct"] == pytest.approx(10.0) and s["latency_pct"] == pytest.approx(0.0)


def test_the_reported_figures_are_the_last_three_windows_merged():
    lats = [np.full(5, 0.1), np.full(4, 0.002), np.full(6, 0.004), np.full(2, 0.006)]
    windows = [window_summary(x, len(x), 1.0) for x in lats]
    lat, inferences, seconds = merged(windows, lats)
    assert len(lat) == 12 and inferences == 12 and seconds == 3.0
    assert latency_ms(lat)["max"] == pytest.approx(6.0)


def test_options_name_the_option_at_fault():
    for kw, name in ((dict(interval_s=0), "the measurement interval 0"), (dict(max_trials=2), "the most windows per level 2"),
                     (dict(pct=150), "the stability percentage 150"), (dict(percentile=0), "the stability percentile 0"),
                     (dict(requests=0), "the requests per window 0")):
        with pytest.raises(UsageError, match=name):
            Stability(**kw)
    assert Stability(percentiles=(90,)).percentiles == (50, 90, 99)  # the gate and the plot need p50/p99
    assert Stability(percentile=75).percentiles == (50, 75, 90, 95, 99)
    assert parse_percentiles("95, 50") == (50, 95)
    with pytest.raises(UsageError, match="the latency percentiles '100'"):
        parse_percentiles("100")


def test_open_loop_schedules_hold_the_rate():
    t = send_times(50.0, 500)
    assert t[0] == 0 and np.allclose(np.diff(t), 0.02)
    p = send_times(50.0, 5000, "poisson", seed=1)
    assert np.all(np.diff(p) >= 0) and 5000 / p[-1] == pytest.approx(50.0, rel=0.05)
    assert np.std(np.diff(p)) > 0.5 * np.mean(np.diff(p))  # exponential gaps, not even ones
    with pytest.raises(UsageError, match="the request distribution 'burst'"):
        send_times(10, 3, "burst")


def test_machine_warnings_name_load_client_share_and_steal():
    before = CpuSample(0.0, 0.0, 0, 0, 0, 1.8)
    after = CpuSample(10.0, 8.0, 1500, 200, 2000, 1.0)
    usage = machine_usage(before, after, 2)
    assert usage["client_share"] == pytest.approx(0.4) and usage["steal_share"] == pytest.approx(0.1)
    text = " | ".join(machine_warnings(usage, server_local=True))
    assert "busy before the run (load average 1.80 on 2 cores)" in text
    assert "load generator used 40%" in text and "steal" in text
    assert not any("load generator" in w for w in machine_warnings(usage, server_local=False))
    quiet = machine_usage(CpuSample(0.0, 0.0, 0, 0, 0, 0.1), CpuSample(10.0, 1.0, 500, 0, 2000, 0.5), 2)
    assert machine_warnings(quiet, server_local=True) == []
