"""trtrepo validate, issue 41: the time budget of the reference-speed phase, what a speed row
compares, and the plausibility of its rows -- the pure parts and the timing loop against a
sleeping function (no server). The runs against the real tritonserver are in
tests/test_validate_speed.py (they reuse its server)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trtrepo.errors import UsageError
from trtrepo.measure import Stability
from trtrepo.validate import ValidateOptions
from trtrepo.validate.speed import (
    IMPLAUSIBLE_MARGIN,
    MIN_CALLS,
    calls_per_window,
    implausible_rows,
    plot_speed,
    reference_estimate_s,
    slow_reference_message,
    speed_console_lines,
    speed_markdown,
    speed_row,
    time_stable,
    withheld,
)


def _side(ms: float, stable: bool = True, cut: bool = False) -> dict:
    return {"iterations": 24, "median_ms": ms, "p99_ms": 1.1 * ms, "mean_ms": ms, "min_ms": 0.9 * ms, "max_ms": 1.2 * ms,
            "throughput": 1000.0 / ms,
            "stability": {"stable": stable, "windows": 3, "cut": cut,
                          "spread_pct": {"throughput_pct": 1.0, "latency_pct": 2.0}}}


def _rows(ref_ms, served_ms, onnx_ms=None, sizes=(1, 8, 32)):
    rows = [speed_row(b, _side(r), _side(s), None if onnx_ms is None else _side(o))
            for b, r, s, o in zip(sizes, ref_ms, served_ms, onnx_ms or [None] * len(sizes), strict=True)]
    flags = implausible_rows(rows)
    for row in rows:
        row["implausible"] = flags.get(row["batch_size"])
    return rows


def test_a_larger_batch_faster_than_a_smaller_one_flags_both_rows():
    # The README's sample (issue 41): batch 8 at 428 ms, batch 32 at 9.5 ms on the reference side.
    flags = implausible_rows(_rows([6.37, 427.97, 9.54], [0.89, 1.86, 3.10]))
    assert set(flags) == {8, 32}
    assert flags[8] == flags[32] == {"sides": ["reference"],
                                     "reason": "reference takes longer at batch 8 (427.97 ms) than at batch 32 (9.54 ms)"}
    # Plausible: total time grows with the batch; equal times within the margin are noise, not a flag.
    assert implausible_rows(_rows([6.0, 20.0, 60.0], [1.0, 1.0 * (1 + IMPLAUSIBLE_MARGIN / 2), 3.0])) == {}
    # Just beyond the margin, on the served side.
    flags = implausible_rows(_rows([6.0, 20.0, 60.0], [1.0, 0.99 / (1 + IMPLAUSIBLE_MARGIN), 3.0]))
    assert set(flags) == {1, 8} and flags[1]["sides"] == ["served"]
    # The ONNX side is checked too; a flag there names its side.
    flags = implausible_rows(_rows([6.0, 20.0, 60.0], [1.0, 2.0, 3.0], [5.0, 30.0, 9.0]))
    assert set(flags) == {8, 32} and flags[8]["sides"] == ["onnx"]


def test_a_flagged_row_is_withheld_alike_on_console_markdown_and_plot():
    """One truth (issue 41, items 4 and 5): a row the console gives no speedup has none in
    validate.md and none annotated on the plot, with the same mark; its ONNX comparison is
    withheld only when the flag concerns the served or ONNX side."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    rows = _rows([6.37, 427.97, 9.54], [0.89, 1.86, 3.10], [2.0, 4.0, 8.0])
    rows[0]["served"]["stability"].update(stable=False, cut=True)  # batch 1: served not settled in the budget
    assert withheld(rows[0]) == "served timing not settled in the time budget"
    assert withheld(rows[1]).startswith("implausible: reference takes longer at batch 8")
    console = speed_console_lines(rows, "ONNX Runtime FP32")
    assert console[0].startswith("batch 1*: ") and "not settled in the time budget" in console[0]
    assert console[1].startswith("batch 8!: ") and "speedup not computed (implausible: reference takes longer" in console[1]
    assert "served vs it 2.15x" in console[1]  # the ONNX comparison does not involve the implausible side
    assert console[-1] == "0 of 3 batch size(s) stable on both sides and plausible; * and ! rows are not figures to quote"
    speed = {"reference": {"label": "PyTorch eager FP32", "engine": "torch", "device": "cpu", "threads": 2},
             "served": {"model": "m", "version": "1", "protocol": "grpc", "backend": "python", "server_version": "2.51.0"},
             "onnx": {"label": "ONNX Runtime FP32", "path": "/x/model.onnx", "threads": 2},
             "iterations": 8, "warmup": 2, "measurement": {"stability_percentage": 10}, "input_shapes": {"input": [1, 32, 32]},
             "samples_of_shape": 64, "samples_total": 64, "rows": rows, "skipped_batch_sizes": [], "accuracy_kept": None,
             "budget": {"time_budget_s": 90.0, "phase_s": 20.0, "cut": [{"batch_size": 1, "side": "served",
                                                                          "what": "served not settled (3 window(s) of 3 calls)"}],
                        "full_estimate_s": 41.0}}
    md = "\n".join(speed_markdown(speed))
    assert "Compared: PyTorch eager FP32 (cpu, torch threads 2) vs served m v1 (Triton 2.51.0, python backend); and " \
           "ONNX Runtime FP32 (model.onnx, onnxruntime threads 2)." in md
    for row in rows:
        mark = "*" if row["batch_size"] == 1 else "!"
        (line,) = [ln for ln in md.splitlines() if ln.startswith(f"| {row['batch_size']}{mark} |")]
        assert "not computed | not computed | not computed" in line and "x |" not in line.split("not computed")[0]
        assert f"- batch {row['batch_size']}{mark}: speedup not computed ({withheld(row)})" in md
    assert "time budget (90 s for validate, 20 s for this phase): batch 1 served not settled" in md and "--thorough" in md
    fig, ax = plt.subplots()
    try:
        drawn = plot_speed(ax, speed)
        texts = [t.get_text() for t in ax.texts]
    finally:
        plt.close(fig)
    assert [(d["batch_size"], d["mark"], d["speedup"]) for d in drawn] == [(1, "*", None), (8, "!", None), (32, "!", None)]
    assert [d["withheld"] for d in drawn] == [withheld(r) for r in rows]
    assert not any(t.endswith("x") for t in texts)  # no speedup drawn for any of them
    assert texts.count("! implausible") == 2 and texts.count("* not settled") == 1


def test_calls_per_window_fit_the_share_and_the_estimates():
    assert calls_per_window(float("inf"), 1.0, 20) == 20  # no deadline: the full window
    assert calls_per_window(100.0, 0.01, 20) == 20  # plenty of time
    assert calls_per_window(10.0, 0.2, 20) == 10  # 5 windows of 10 calls of 0.2 s fill 10 s
    assert calls_per_window(1.0, 0.5, 20) == MIN_CALLS  # never fewer
    assert calls_per_window(1.0, 0.5, 2) == 2  # nor more than asked for
    assert reference_estimate_s(1.0, (1, 8), iterations=20, warmup=5) == pytest.approx((5 + 60) * 9)
    msg = slow_reference_message("PyTorch eager FP32", "cpu", 1.02, (1, 8, 32), 2860, 90.0)
    assert msg.startswith("PyTorch eager FP32 takes 1.02 s a call at batch 1 on the cpu; timing it at batch sizes 1, 8, "
                          "32 takes about 2860 s") and msg.endswith("--no-reference-speed skips this")
    with pytest.raises(UsageError, match="the time budget 0: a positive number of seconds"):
        ValidateOptions(model="m", time_budget=0)
    assert ValidateOptions(model="m", time_budget=None).time_budget is None


def test_time_stable_stops_at_the_deadline_and_says_it_was_cut():
    calls = []

    def slow(_feed):
        calls.append(1)
        time.sleep(0.05)

    batches = [{"x": np.zeros((1, 2), np.float32)}]
    stab = Stability(requests=4, pct=0.001, max_trials=10)  # a rule no real timing meets: only the deadline ends it
    start = time.perf_counter()
    lat, wall, rec = time_stable(slow, batches, stab, warmup=0, batch_size=1, deadline=start + 0.5)
    took = time.perf_counter() - start
    assert took < 0.5 + 2 * 0.05 + 0.1, took  # one call past the deadline at most (plus scheduling)
    assert rec["cut"] is True and rec["stable"] is False and rec["attempts"] == 1  # no retry series after a cut
    assert 1 <= rec["windows"] <= 3 and rec["calls_per_window"] == 4
    assert 0 < len(lat) <= len(calls) and wall > 0
    # Without a deadline the same rule runs every window of both series.
    calls.clear()
    _, _, rec = time_stable(slow, batches, Stability(requests=2, pct=0.001, max_trials=3), warmup=0, batch_size=1)
    assert rec["cut"] is False and rec["attempts"] == 2 and len(calls) == 2 * 3 * 2


def test_the_cli_default_budget_is_the_library_default():
    """The command module does not import trtrepo.validate.speed (``--help`` stays light), so its default
    is written there again: it must be the library's."""
    from trtrepo.commands.validate import command
    from trtrepo.validate.speed import DEFAULT_TIME_BUDGET_S

    (opt,) = [p for p in command.params if p.name == "time_budget"]
    assert opt.default == DEFAULT_TIME_BUDGET_S == ValidateOptions(model="m").time_budget
