"""Issue 16 items 1-2: the repository commit protocol (trtrepo.repository.commit's docstring) under faults.

A writer is stopped at every step of the protocol -- by an exception (the ``finally`` blocks run)
and by a real SIGKILL in a child process (nothing runs) -- for a new model, a new version and a
``--force`` replacement. After each, the repository is exactly the old or exactly the new one
(no version lost, every version complete), the real tritonserver starts on it in place and loads
every version (``version_policy all``), and the next write removes what the killed one left.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest
from _servers import live_server
from conftest import requires_tritonserver

from trtrepo import repository
from trtrepo.repository import COMMIT_STEPS, add_onnx_model, leftovers, versions_of
from trtrepo.repository import commit as repository_commit
from trtrepo.tritonconfig import ModelOptions

SCENARIOS = ("new-model", "new-version", "force-replace")


def snapshot(repo: Path) -> dict[str, str]:
    """Every file Triton sees (hidden entries, caches and the lock aside) with its hash."""
    if not repo.exists():
        return {}
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if p.is_file() and not any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _options(tag: int) -> ModelOptions:
    from trtrepo.server import find_python_env

    env = find_python_env()
    # version_policy all: the server loads every version (a broken one fails the start)
    return ModelOptions(version_policy="all", execution_env=str(env) if env else None,
                        parameters=(("trtrepo_test_tag", str(tag)),))


def _prepare(repo: Path, onnx: Path, scenario: str) -> dict:
    if scenario != "new-model":
        add_onnx_model(repo, "demo", onnx, backend="python", options=_options(0))
    return {"version": 1, "force": True} if scenario == "force-replace" else {}


def _write(repo: str, onnx: str, scenario: str, step: str | None, how: str) -> None:
    """The write under test; at ``step`` it raises (how='raise') or kills itself (how='kill')."""
    def hook(name: str) -> None:
        if name == step:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"simulated crash at {name}")

    repository_commit._commit_hook = hook
    kwargs = {"version": 1, "force": True} if scenario == "force-replace" else {}
    add_onnx_model(Path(repo), "demo", Path(onnx), backend="python", options=_options(1), **kwargs)


def _expected_states(tmp: Path, onnx: Path, scenario: str) -> tuple[dict, dict]:
    """(before, after) snapshots of an uninterrupted write, in a scratch repository."""
    scratch = tmp / f"scratch-{scenario}"
    _prepare(scratch, onnx, scenario)
    before = snapshot(scratch)
    _write(str(scratch), str(onnx), scenario, None, "raise")
    repository_commit._commit_hook = None
    return before, snapshot(scratch)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_an_exception_at_any_step_leaves_the_old_or_the_new_repository_and_no_leftovers(tmp_path, demo_onnx,
                                                                                        scenario, step):
    before, after = _expected_states(tmp_path, demo_onnx, scenario)
    repo = tmp_path / "repo"
    _prepare(repo, demo_onnx, scenario)
    try:
        with pytest.raises(RuntimeError, match=f"simulated crash at {step}"):
            _write(str(repo), str(demo_onnx), scenario, step, "raise")
    finally:
        repository_commit._commit_hook = None
    assert snapshot(repo) == (after if step == "live" else before)
    assert leftovers(repo) == []


def _kill_at(repo: Path, onnx: Path, scenario: str, step: str) -> None:
    proc = mp.get_context("fork").Process(target=_write, args=(str(repo), str(onnx), scenario, step, "kill"))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


@pytest.mark.long
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_sigkill_at_every_step_leaves_a_repository_the_real_server_loads_and_loses_no_version(tmp_path, demo_onnx,
                                                                                             scenario):

    before, after = _expected_states(tmp_path, demo_onnx, scenario)
    for step in COMMIT_STEPS:
        repo = tmp_path / f"repo-{step}"
        _prepare(repo, demo_onnx, scenario)
        _kill_at(repo, demo_onnx, scenario, step)
        state = snapshot(repo)
        assert state == (after if step == "live" else before), step  # old or new, complete
        assert leftovers(repo), "a killed writer leaves its staging folder (outside what Triton scans)"
        if state:  # the server starts on the repository in place and loads every version
            with live_server(repo, copy=False, timeout=120) as server:
                index = {(m["name"], m.get("version")): m.get("state") for m in server.repository_index()}
                want = {("demo", str(v)) for v in versions_of(repo / "demo")}
                assert {k for k, v in index.items() if v == "READY"} == want, (step, index)
        # the next write recovers: the leftovers go, the killed write can be redone
        add_onnx_model(repo, "demo", demo_onnx, backend="python", options=_options(2),
                       **({"version": 1, "force": True} if scenario == "force-replace" else {}))
        assert leftovers(repo) == []


def test_a_two_rename_swap_killed_between_its_renames_is_restored_by_the_next_write(tmp_path, demo_onnx, monkeypatch):
    """Where the atomic exchange is not supported the live folder is moved aside first: a kill
    between the two renames leaves the model missing until recovery moves it back."""
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python", options=_options(0))
    before = snapshot(repo)
    monkeypatch.setattr(repository_commit, "_exchange", lambda a, b: False)
    _kill_at(repo, demo_onnx, "new-version", "swapping")
    assert not (repo / "demo").exists() and leftovers(repo)
    from trtrepo.repository import recover, repository_lock

    with repository_lock(repo):
        done = recover(repo)
    assert any("restored" in line for line in done)
    assert snapshot(repo) == before and leftovers(repo) == []


def test_the_staging_folder_of_older_versions_inside_the_repository_is_removed(tmp_path, demo_onnx):
    """Issue 16 item 1: older trtrepo staged in REPO/.trtrepo-staging, which the real server
    refuses to start on once a killed write left a half-copied model there."""
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx)
    half = repo / repository.STAGING_NAME / "demo-0123456789ab" / "model" / "1"
    half.mkdir(parents=True)
    (half / "model.onnx").write_bytes(b"\x08\x07half")
    assert leftovers(repo) == [repo / repository.STAGING_NAME]
    add_onnx_model(repo, "other", demo_onnx)
    assert not (repo / repository.STAGING_NAME).exists() and leftovers(repo) == []


@pytest.mark.long
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_sigkill_during_the_copy_of_a_large_model_leaves_the_repository_servable(tmp_path):
    """A real kill -9 while a 256 MB model is being copied into the staging folder."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper


    big = np.ones((64, 1024, 1024), np.float32)  # 256 MiB, added to the input (broadcast)
    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0),
                               helper.make_node("Add", ["x", "s"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                              [numpy_helper.from_array(big, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "big.onnx"
    onnx.save(model, str(path))
    del big, model, graph
    repo = tmp_path / "repo"
    small = tmp_path / "small.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "s",
                                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])]),
                                 opset_imports=[helper.make_opsetid("", 17)]), str(small))
    add_onnx_model(repo, "big", small, backend="python", options=_options(0))
    before = snapshot(repo)
    proc = mp.get_context("fork").Process(target=add_onnx_model, args=(repo, "big", path),
                                          kwargs={"backend": "python", "options": _options(1)})
    proc.start()
    deadline = time.monotonic() + 60
    partial = None
    while time.monotonic() < deadline and partial is None:
        for stage in leftovers(repo):
            for f in stage.rglob("model.onnx"):
                if 0 < f.stat().st_size < path.stat().st_size:
                    partial = f
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    assert partial is not None, "the copy was never seen half-done"
    assert snapshot(repo) == before
    with live_server(repo, copy=False, timeout=120) as server:
        assert server.model_ready("big")
    add_onnx_model(repo, "big", small, backend="python", options=_options(2))
    assert leftovers(repo) == [] and versions_of(repo / "big") == [1, 2]


def test_repo_check_reports_the_leftovers_of_a_killed_write_and_fix_recovers(tmp_path, demo_onnx, run_cli, monkeypatch):
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", demo_onnx, backend="python", options=_options(0))
    before = snapshot(repo)
    monkeypatch.setattr(repository_commit, "_exchange", lambda a, b: False)
    _kill_at(repo, demo_onnx, "new-version", "swapping")  # the model is moved aside: missing
    res = run_cli("repo", "check", repo)
    assert res.exit_code == 1 and "left by an interrupted write" in res.output
    res = run_cli("repo", "check", repo, "--fix")
    assert "fixed:" in res.output and "restored" in res.output
    assert leftovers(repo) == [] and snapshot(repo) == before
