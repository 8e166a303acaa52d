"""trtrepo tune: the search (pure), config edits on Triton's protobuf, and a run on the real server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _servers import live_server

from trtrepo.errors import UsageError
from trtrepo.tune import (
    Candidate,
    apply_candidate,
    choose,
    combined,
    config_json,
    confirmed,
    coordinate_descent,
    grid,
    pareto_front,
    score,
    search_space,
    start_candidate,
)


def _python_config(tmp_path: Path, **kw) -> object:
    from trtrepo.contracts.backends import BACKENDS
    from trtrepo.modelio import ModelIO, TensorSpec
    from trtrepo.tritonconfig import ModelOptions, config_from_io, parse_config_text, render_config

    io = ModelIO((TensorSpec("input", "float32", (-1, 1, 32, 32)),), (TensorSpec("logits", "float32", (-1, 10)),))
    cfg = config_from_io("m", io, BACKENDS["python_onnx"], ModelOptions(**kw))
    return parse_config_text(render_config(cfg), "m/config.pbtxt")


def test_the_start_is_read_off_the_config_and_edits_land_in_the_protobuf(tmp_path):
    msg = _python_config(tmp_path, instance_count=1, intra_op_threads=2, max_batch_size=32)
    start = start_candidate(msg)
    assert start.instance_count == 1 and start.threads == 2 and start.max_batch_size == 32
    assert start.max_queue_delay_us is not None  # trtrepo turns dynamic batching on for batching models
    c = Candidate(4, 1, None, 32)
    out = apply_candidate(msg, c)
    assert out.instance_group[0].count == 4 and out.parameters["intra_op_threads"].string_value == "1"
    assert not out.HasField("dynamic_batching") and msg.HasField("dynamic_batching")  # a copy, the input untouched
    assert start_candidate(out) == c
    on = apply_candidate(msg, Candidate(2, 2, 500, 8))
    assert on.dynamic_batching.max_queue_delay_microseconds == 500 and on.max_batch_size == 8
    assert all(b <= 8 for b in on.dynamic_batching.preferred_batch_size)
    assert json.loads(config_json(on))["instance_group"][0]["count"] == 2


def test_search_space_and_grid_follow_the_model_and_the_machine():
    start = Candidate(1, 2, 100, 32)
    axes = search_space(start, cores=2, backend="python", gpu=False, batching=True)
    assert axes["instance_count"] == [1, 2, 4] and axes["threads"] == [1, 2]
    assert axes["max_queue_delay_us"] == [None, 0, 100, 500, 2000] and axes["max_batch_size"] == [8, 32]
    g = grid(axes, start)
    assert g[0] == start and len(g) == len(set(g))
    # without batching the batch limit is not a knob: 3 x 2 x (1 + 4 x 2)
    assert len(g) == 3 * 2 * (1 + 4 * 2)
    trt = search_space(Candidate(1, None, None, 0), cores=2, backend="tensorrt", gpu=True, batching=False)
    assert trt["threads"] == [None] and trt["max_queue_delay_us"] == [None] and trt["instance_count"] == [1, 2, 4]


def test_coordinate_descent_finds_a_separable_optimum_with_a_fraction_of_the_grid():
    start = Candidate(1, 2, 100, 32)
    axes = search_space(start, cores=2, backend="python", gpu=False, batching=True)
    best = Candidate(2, 1, 0, 32)

    def value(c: Candidate) -> float:  # separable: each knob's best value is independent of the others
        return (-abs(c.instance_count - 2) - abs((c.threads or 0) - 1) - (5 if c.max_queue_delay_us is None else
                abs(c.max_queue_delay_us) / 1000) - (0 if c.max_batch_size == 32 else 1))

    seen: dict[Candidate, float] = {}

    def evaluate(c: Candidate) -> float:
        seen.setdefault(c, value(c))
        return seen[c]

    assert coordinate_descent(start, axes, evaluate) == best
    assert len(seen) * 4 < len(grid(axes, start))


def test_the_choice_keeps_the_start_unless_a_finalist_beats_it_by_the_margin():
    start, a, b = Candidate(1, 2, 100, 32), Candidate(2, 1, 0, 32), Candidate(1, 1, 0, 8)
    assert choose({start: 1000.0, a: 1040.0, b: 1010.0}, start, 0.05) == start  # +4%: noise
    assert choose({start: 1000.0, a: 1060.0, b: 1010.0}, start, 0.05) == a  # +6%: a gain
    assert choose({start: 1000.0, a: 1040.0}, start, 0.0) == a
    assert choose({start: float("-inf"), a: 10.0, b: 20.0}, start, 0.05) == b  # start over the p99 budget
    assert choose({start: -12.0, a: -10.0}, start, 0.05) == a  # latency: p99 12 -> 10 ms, 17% lower
    assert choose({start: -12.0, a: -11.8}, start, 0.05) == start


def test_coordinate_descent_does_not_follow_gains_below_min_gain():
    """Noise of a few percent does not move the search off the start (nor start a second pass);
    a real gain does."""
    start = Candidate(1, 2, 100, 32)
    axes = search_space(start, cores=2, backend="python", gpu=False, batching=True)
    bumps = {Candidate(2, 2, 100, 32): 1030.0, Candidate(1, 2, 0, 32): 1040.0}  # +3%, +4%: noise

    def evaluate(c: Candidate) -> float:
        seen.append(c)
        return bumps.get(c, 1000.0)

    seen: list[Candidate] = []
    assert coordinate_descent(start, axes, evaluate, min_gain=0.05) == start
    one_pass = len(seen)
    seen.clear()
    assert coordinate_descent(start, axes, evaluate, passes=2) in bumps  # min_gain 0: follows the noise
    assert len(seen) > one_pass  # and pays a second pass for it
    seen.clear()
    coordinate_descent(start, axes, evaluate)  # the default: one sweep, each knob's values once
    assert len(set(seen)) == 1 + sum(len(v) - 1 for v in axes.values())
    bumps[Candidate(4, 2, 100, 32)] = 1200.0  # +20%: real
    assert coordinate_descent(start, axes, evaluate, min_gain=0.05) == Candidate(4, 2, 100, 32)


def test_score_respects_the_p99_budget_and_the_objective():
    r = {"throughput": 100.0, "p99_ms": 20.0}
    assert score(r, "throughput", None) == 100.0 and score(r, "latency", None) == -20.0
    assert score(r, "throughput", 10.0) == float("-inf")
    assert score({"error": "x", "throughput": None}, "throughput", None) == float("-inf")


def test_pareto_front_and_combined_rounds():
    a, b = Candidate(1, 1, None, 8), Candidate(2, 1, None, 8)
    rows = [{"candidate": a.to_dict(), "throughput": 100.0, "p99_ms": 10.0, "p50_ms": 5.0, "mean_ms": 6.0, "stable": True},
            {"candidate": b.to_dict(), "throughput": 90.0, "p99_ms": 12.0, "p50_ms": 5.0, "mean_ms": 6.0, "stable": True},
            {"candidate": a.to_dict(), "throughput": 80.0, "p99_ms": 14.0, "p50_ms": 5.0, "mean_ms": 6.0, "stable": False,
             "round": 2}]
    assert pareto_front(rows) == [0]
    m = combined(rows, a)
    assert m["throughput"] == pytest.approx(90.0) and m["p99_ms"] == pytest.approx(12.0) and m["measurements"] == 2
    assert m["stable"] is False
    assert combined(rows, Candidate(4, 1, None, 8))["error"] == "not measured"
    # the choice is made on the confirmation round alone: a's lucky first figure does not count
    assert confirmed(rows, a)["throughput"] == 80.0
    assert confirmed(rows, b)["error"] == "not confirmed"


def test_options_name_the_option_at_fault():
    from trtrepo.tune import TuneOptions

    for kw, name in ((dict(objective="fast"), "the objective 'fast'"), (dict(concurrency=0), "the concurrency 0"),
                     (dict(max_p99_ms=0), "the p99 latency limit 0"), (dict(budget_s=0), "the time budget in seconds 0"),
                     (dict(stability_pct=float("nan")), "the stability percentage nan"),
                     (dict(interval_s=float("nan")), "the measurement interval nan")):
        with pytest.raises(UsageError, match=name):
            TuneOptions(model="m", **kw)


def test_replace_config_refuses_other_inputs_and_writes_atomically(tmp_path, demo_onnx):
    from trtrepo.repository import add_onnx_model, read_config, replace_config
    from trtrepo.tune import config_text

    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    msg = read_config(repo / "demo")
    before = (repo / "demo" / "config.pbtxt").read_text()
    changed = type(msg)()
    changed.CopyFrom(msg)
    changed.input[0].dims[:] = [3, 32, 32]
    with pytest.raises(UsageError, match="changes the model's inputs or outputs; not written"):
        replace_config(repo, "demo", config_text(changed))
    assert (repo / "demo" / "config.pbtxt").read_text() == before
    text = config_text(apply_candidate(msg, Candidate(2, 1, None, msg.max_batch_size)), "tuned")
    replace_config(repo, "demo", text)
    assert read_config(repo / "demo").instance_group[0].count == 2
    assert not [p for p in (repo / "demo").iterdir() if p.name.startswith(".")]


def test_a_config_changed_while_tuning_is_merged_or_refused_never_lost(tmp_path, demo_onnx, run_cli):
    """Issue 39 item 4: a ``repo add`` during a tune (a new version with ``--version-policy all``
    and a parameter) survives ``--apply``; a change to a tuned knob refuses the write."""
    from trtrepo.repository import add_onnx_model, read_config, replace_config
    from trtrepo.tune import config_text, rebased_config

    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    started = (repo / "demo" / "config.pbtxt").read_text()
    msg = read_config(repo / "demo")
    chosen = Candidate(2, 1, None, msg.max_batch_size)
    tuned = config_text(apply_candidate(msg, chosen), "tuned")
    # another writer lands a version meanwhile (the real CLI, under the repository lock)
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--backend", "python",
                "--version-policy", "all", "--parameter", "owner=teamB")
    assert r.exit_code == 0, r.output
    # without a rebase: refused, the other writer's config kept
    live = (repo / "demo" / "config.pbtxt").read_text()
    with pytest.raises(UsageError, match="changed by another writer since it was read; not written"):
        replace_config(repo, "demo", tuned, started_from=started)
    assert (repo / "demo" / "config.pbtxt").read_text() == live
    # with the tune's rebase: both changes are in the written config
    replace_config(repo, "demo", tuned, started_from=started,
                   rebase=lambda text: rebased_config(text, msg, chosen, "tuned", where="demo/config.pbtxt"))
    out = read_config(repo / "demo")
    assert out.instance_group[0].count == 2 and not out.HasField("dynamic_batching")
    assert out.version_policy.HasField("all") and out.parameters["owner"].string_value == "teamB"
    # a tuned knob changed by the other writer: a conflict, refused naming the knob, nothing written
    r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--backend", "python",
                "--instance-count", "3", "--version-policy", "all")
    assert r.exit_code == 0, r.output
    live = (repo / "demo" / "config.pbtxt").read_text()
    with pytest.raises(UsageError, match=r"changed while tuning, and the other writer set instance_count"):
        replace_config(repo, "demo", tuned, started_from=started,
                       rebase=lambda text: rebased_config(text, msg, chosen, "tuned", where="demo/config.pbtxt"))
    assert (repo / "demo" / "config.pbtxt").read_text() == live


@pytest.mark.long
@pytest.mark.triton
def test_tune_apply_keeps_a_version_added_while_it_ran(tmp_path, run_cli, demo_onnx):
    """The race of issue 39 on the real server: ``repo add --version-policy all --parameter
    owner=teamB`` lands while ``tune --apply`` measures; afterwards both changes are in the config
    and the server loads every version under it."""
    from trtrepo.data import DataOptions
    from trtrepo.repository import add_onnx_model, read_config
    from trtrepo.server import find_python_env, find_server_binary
    from trtrepo.tune import TuneOptions, tune

    if find_server_binary(None) is None or find_python_env() is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh)")
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    added: list[int] = []
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("  [1]") and not added:  # the first candidate is measured: the tune is under way
            r = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "demo", "--backend", "python",
                        "--version-policy", "all", "--parameter", "owner=teamB")
            assert r.exit_code == 0, r.output
            added.append(1)

    options = TuneOptions("demo", concurrency=2, interval_s=0.3, max_trials=3, budget_s=6, progress=False)
    result = tune(repo, options, data=DataOptions(spec="demo:val", limit=16), apply=True, say=say)
    assert added and result.applied
    out = read_config(repo / "demo")
    assert out.version_policy.HasField("all") and out.parameters["owner"].string_value == "teamB"
    assert start_candidate(out) == result.chosen
    assert any("changed while tuning" in ln for ln in lines), lines
    with live_server(repo, timeout=120) as server:
        assert server.model_ready("demo")


@pytest.mark.long
@pytest.mark.triton
def test_tune_on_the_real_server_applies_a_config_the_server_loads(tmp_path, run_cli, demo_onnx):
    from trtrepo.repository import add_onnx_model, read_config
    from trtrepo.server import find_python_env, find_server_binary

    if find_server_binary(None) is None or find_python_env() is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh)")
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python")
    original = (repo / "demo" / "config.pbtxt").read_text()
    r = run_cli("tune", repo, "--model", "demo", "--data", "demo:val", "--limit", "32", "--concurrency", "4",
                "--measurement-interval", "0.3", "--max-trials", "4", "--budget-s", "15", "--apply",
                "--report", tmp_path / "rep", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    assert data["original_config"] == original and data["applied"].endswith("config.pbtxt")
    chosen = Candidate(**{k: data["chosen"][k] for k in ("instance_count", "threads", "max_queue_delay_us", "max_batch_size")})
    assert start_candidate(read_config(repo / "demo")) == chosen
    # every candidate was loaded through the model-control API and measured; start and chosen twice
    assert data["candidates_measured"] >= 3 and data["start_result"]["measurements"] == 2
    assert data["chosen_result"]["measurements"] == 2
    # the summary's two figures are the ones its gain is computed from (issue 28 item 7: it printed
    # the mean over every round beside the confirmation round's ratio)
    import re

    lines = {ln.split(":")[0]: ln for ln in r.stderr.splitlines() if ln.startswith(("start:", "chosen:"))}
    a, b = (float(re.search(r": ([0-9.]+) infer/s", lines[k]).group(1)) for k in ("start", "chosen"))
    gain = re.search(r"\(([0-9.]+)x the start\)", lines["chosen"])
    assert "(confirmation round)" in lines["start"] and gain is not None, lines
    assert abs(b / a - float(gain.group(1))) < 0.01 + 0.1 / a, (lines, b / a)
    assert {p.name for p in (tmp_path / "rep").iterdir()} >= {"tune.json", "tune.md", "tune.png"}
    with live_server(repo, timeout=120) as server:  # the written config serves
        assert server.model_ready("demo")
    # a budget nothing meets: exit 1 naming it, the repository left as it was
    before = (repo / "demo" / "config.pbtxt").read_text()
    r = run_cli("tune", repo, "--model", "demo", "--data", "demo:val", "--limit", "16", "--concurrency", "2",
                "--measurement-interval", "0.2", "--max-trials", "3", "--budget-s", "2", "--max-p99-ms", "0.001", "--apply")
    assert r.exit_code == 1 and "no candidate met --max-p99-ms 0.001" in r.output, r.output
    assert (repo / "demo" / "config.pbtxt").read_text() == before


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@pytest.mark.triton
def test_deploy_tune_writes_the_tuned_config(tmp_path, run_cli):
    from trtrepo.repository import read_config
    from trtrepo.server import find_python_env, find_server_binary

    if find_server_binary(None) is None or find_python_env() is None:
        pytest.skip("tritonserver not installed (run scripts/install_tritonserver.sh)")
    repo = tmp_path / "repo"
    r = run_cli("deploy", "demo", "--repo", repo, "--precision", "fp32", "--tune", "--tune-budget-s", "4", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    tuned = data["tune"]
    assert tuned["model"] == "demo" and tuned["applied"] == str(repo / "demo" / "config.pbtxt")
    text = (repo / "demo" / "config.pbtxt").read_text()
    assert text.startswith("# Tuned by trtrepo tune: ")
    chosen = Candidate(**{k: tuned["chosen"][k] for k in ("instance_count", "threads", "max_queue_delay_us", "max_batch_size")})
    assert start_candidate(read_config(repo / "demo")) == chosen
    assert (tmp_path / "tune-demo" / "tune.md").is_file()
