"""Progress in the INT8 step (issue 41 item 6): ``deploy`` and ``quantize`` show each phase of the
step (calibration, the methods the auto choice tries, each weight-rounding step, the held-out
gate) as status lines with the step's elapsed time, never more than one update a second and never
a silent stretch of more than a few seconds; the warnings of the step show once per cause and are
all in ``deploy --json``'s ``warnings``.

Real runs: the demo CNN and the dead-channel net of ``test_warngroups`` through the real CLI and
ONNX Runtime; ``-v`` shows the status lines off a terminal (the CLI runner's stderr is not one)."""

from __future__ import annotations

import json
import logging
import re
import time

import numpy as np
import pytest
from test_warngroups import DEAD, LAYERS, dead_channel_net

from trtrepo import progress
from trtrepo.warngroups import collecting

LINE = re.compile(r"^  int8 \[(\d+\.\d) s\] ([^:]+): (?:(.*), )?(\d+\.\d) s$")


def progress_lines(stderr: str) -> list[tuple[float, str, str, float]]:
    """(step seconds, phase, state, phase seconds) of each progress line, in order."""
    out = []
    for line in stderr.splitlines():
        m = LINE.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2), m.group(3) or "", float(m.group(4))))
    return out


def assert_bounded(lines: list[tuple[float, str, str, float]]) -> None:
    """No flood: a line that is not a phase's first comes at least MIN_GAP_S after the one before
    (to the 0.1 s the lines print); no silent stretch longer than 10 s; times never go back."""
    assert lines
    steps = [t for t, *_ in lines]
    assert steps == sorted(steps), steps
    for (t0, *_), (t1, ph, state, ph_s) in zip(lines, lines[1:], strict=False):
        if ph_s > 0.0:  # an update or a heartbeat, not a phase's first line
            assert t1 - t0 >= progress.MIN_GAP_S - 0.1, (t0, t1, ph, state)
        assert t1 - t0 <= 10.0, (t0, t1, ph, state)
    phases = len({(ph, t - ph_s) for t, ph, _, ph_s in lines})
    assert len(lines) <= phases + steps[-1] / progress.MIN_GAP_S + 1, (len(lines), phases, steps[-1])


# --- the demo CNN through deploy ---------------------------------------------------------------


def test_deploy_shows_each_int8_phase_with_elapsed_time(run_cli, demo_onnx, tmp_path):
    r = run_cli("deploy", demo_onnx, "--data", "demo:calib", "--limit", "160", "--backend", "onnxruntime",
                "--repo", tmp_path / "repo", "--name", "d", "--workdir", tmp_path / "work", "--json", "-v")
    assert r.exit_code == 0, r.output
    lines = progress_lines(r.stderr)
    phases = [ph for _, ph, _, _ in lines]
    first = {}
    for i, ph in enumerate(phases):
        first.setdefault(ph, i)
    wanted = ("calibration 1/2 (max)", "calibration 2/2 (histograms)", "method choice",
              "weight rounding (bias correction", "weight rounding (AdaRound", "held-out gate vs FP32")
    at = [min((i for ph, i in first.items() if ph.startswith(w)), default=None) for w in wanted]
    assert None not in at, (wanted, phases)
    assert at == sorted(at), phases  # in the step's order
    text = r.stderr.splitlines()
    start = next(i for i, s in enumerate(text) if s.startswith("[2/4] int8 ..."))
    end = next(i for i, s in enumerate(text) if s.startswith("[2/4] int8 ") and i > start)
    assert all(start < i < end for i, s in enumerate(text) if LINE.match(s))
    # a count where the phase has one: the methods tried (4), the layers rounded, the samples calibrated
    assert json.loads(r.stdout)["steps"][1]["status"] in ("done", "fallback")
    methods = [s for _, ph, s, _ in lines if ph == "method choice"]
    assert methods[0] == "0/4 methods" and all(re.match(r"[0-4]/4 methods", s) for s in methods), methods
    assert all(re.match(r"\d+/\d+ samples$", s) for _, ph, s, _ in lines if ph.startswith("calibration")), lines
    assert all(re.match(r"\d+/\d+ layers", s) for _, ph, s, _ in lines if ph in ("weight rounding (AdaRound)", "weight rounding (AdaRound, sequential)")), lines
    assert_bounded(lines)


def test_quiet_and_non_terminal_runs_show_no_progress(run_cli, demo_onnx, tmp_path):
    """The status switch holds for the phases: off under -q, off a terminal without -v, and off
    with quantize --no-progress (no bar, no phases)."""
    for flags in (("-q",), (), ("-v", "--no-progress")):
        r = run_cli("quantize", demo_onnx, "-o", tmp_path / "q.onnx", "--data", "demo:calib", "--limit", "64",
                    "--method", "minmax", "--weight-rounding", "nearest", "--smooth-quant", "off", *flags)
        assert r.exit_code == 0, r.output
        assert not progress_lines(r.stderr), r.stderr


# --- the throttle and the heartbeat, on the clock ----------------------------------------------


@pytest.fixture
def shown(capsys):
    progress.configure(verbose=1)
    yield capsys
    progress.configure()


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_a_loop_gets_one_update_a_second_and_a_long_call_a_heartbeat(shown, monkeypatch):
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.6)
    with progress.task("int8"):
        with progress.phase("loop", 40, "items") as ph:
            for _ in range(40):  # 2 s of items every 50 ms: about 2 updates, not 40
                time.sleep(0.05)
                ph.advance()
        with progress.phase("one long call", note="waiting"):
            time.sleep(2.0)
        time.sleep(0.9)  # between phases: the heartbeat says the step is still working
    lines = shown.readouterr().err.splitlines()
    loop = [s for s in lines if "] loop:" in s]
    assert loop[0].endswith("loop: 0/40 items, 0.0 s")
    assert 2 <= len(loop) <= 4, loop
    long = [s for s in lines if "] one long call:" in s]
    assert len(long) >= 3 and all("one long call: waiting, " in s for s in long), long  # its first line, then heartbeats
    assert any("] working: " in s for s in lines), lines
    parsed = progress_lines("\n".join(lines))
    gaps = [b[0] - a[0] for a, b in zip(parsed, parsed[1:], strict=False)]
    assert max(gaps) <= 0.6 + 0.5, (gaps, lines)


def test_outside_a_task_a_phase_does_nothing(shown):
    with progress.phase("calibration", 10, "samples") as ph:
        ph.advance(10)
    progress.update("x")
    assert shown.readouterr().err == ""
    assert not progress.active()


# --- warnings: once per cause, all of them in --json -------------------------------------------


@pytest.fixture(scope="module")
def dead_net(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dead_channels_progress")
    dead_channel_net(folder / "m.onnx")
    x = np.random.default_rng(1).uniform(-1, 1, (160, 3, 8, 8)).astype(np.float32)
    np.savez(folder / "d.npz", x=x)
    return folder / "m.onnx", folder / "d.npz"


def test_deploy_warns_once_per_cause_and_json_holds_every_warning(run_cli, dead_net, tmp_path, caplog):
    """The int32 bias fires in every layer of every candidate the step tries (methods, weight
    rounding): one line with its counts; every warning the console showed is in --json."""
    model, data = dead_net
    with caplog.at_level(logging.WARNING, logger="trtrepo"):
        r = run_cli("-v", "deploy", model, "--data", data, "--backend", "onnxruntime", "--repo", tmp_path / "repo",
                    "--name", "m", "--json")
    assert r.exit_code == 0, r.output
    shown = [rec.getMessage() for rec in caplog.records
             if rec.levelno == logging.WARNING and rec.name.startswith("trtrepo")]
    assert len(shown) == len(set(shown)), shown  # no text twice
    bias = [m for m in shown if "int32 bias" in m]
    assert len(bias) == 1 and f"in {LAYERS} layer(s)" in bias[0], shown
    warnings = json.loads(r.stdout)["warnings"]
    (entry,) = [w for w in warnings if w["cause"] == "int32_bias"]
    assert entry["counts"]["layers"] == LAYERS and entry["counts"]["weight_scales"] >= LAYERS * DEAD
    for m in shown:  # each line the console showed: a grouped cause's line, or a logged warning's text
        assert any(m == w["message"] or m.startswith(w["message"] + "; ") for w in warnings), (m, warnings)
    assert_bounded(progress_lines(r.stderr))


def test_a_warning_logged_again_in_a_run_shows_once_with_its_count(caplog):
    log = logging.getLogger("trtrepo.test_int8_progress")
    with caplog.at_level(logging.INFO, logger="trtrepo"):
        with collecting(log, where="the report") as run:
            for layer in ("conv1", "conv2", "conv3"):
                logging.getLogger("trtrepo.some.stage").warning("ranges from a cache made for another model")
                log.info("rounded %s", layer)
            logging.getLogger("trtrepo.other").warning("too few samples to hold some out")
        logging.getLogger("trtrepo.some.stage").warning("ranges from a cache made for another model")  # after the run
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert warned == ["ranges from a cache made for another model", "too few samples to hold some out",
                      "ranges from a cache made for another model"]
    groups = {g.line(): g.to_dict() for g in run.groups()}
    assert groups["ranges from a cache made for another model"]["counts"] == {"loggers": 1, "times": 3}
    assert groups["too few samples to hold some out"]["counts"] == {"loggers": 1, "times": 1}
    assert "the warning 'ranges from a cache made for another model' came 3 times (shown once)" in caplog.messages
