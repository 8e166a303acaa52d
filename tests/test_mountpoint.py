"""Issue 28 item 1: the commit protocol on a repository that is a mount point (a Kubernetes
volume, a docker bind mount), where nothing beside the repository is on its filesystem.

What tritonserver 2.51 does with the places a writer could stage in, measured here with the real
server: it loads every top-level folder as a model, hidden ones too, and does not start while one
fails (so no staging folder may sit at the top level); it ignores non-numeric folders inside a
model folder. trtrepo therefore stages inside another model's folder and makes the model live by
one rename. The kill test runs on a real tmpfs mounted over the repository (root only)."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _servers import live_server
from conftest import requires_tritonserver

from trtrepo.repository import add_onnx_model, leftovers, versions_of
from trtrepo.server import ServerError
from trtrepo.tritonconfig import ModelOptions

pytestmark = [requires_tritonserver, pytest.mark.triton]


def _options() -> ModelOptions:
    from trtrepo.server import find_python_env

    env = find_python_env()
    return ModelOptions(execution_env=str(env) if env else None)


def _tiny(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "s",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _big(path: Path) -> Path:
    """A 256 MiB ONNX model (a constant summed and added to the input)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0),
                               helper.make_node("Add", ["x", "s"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                              [numpy_helper.from_array(np.ones((64, 1024, 1024), np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@pytest.mark.parametrize("layout", ["hidden top-level folder", "model folder without config"])
def test_tritonserver_refuses_to_start_on_a_top_level_staging_folder(tmp_path, layout):
    """The measurement behind the protocol: a top-level folder Triton cannot load stops the whole
    server, whether its name starts with a dot or not."""
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", _tiny(tmp_path / "tiny.onnx"), backend="python", options=_options())
    half = repo / (".trtrepo-staging/big-0123/model/1" if layout.startswith("hidden") else "big/1")
    half.mkdir(parents=True)
    (half / "model.onnx").write_bytes(b"\x08\x07half")
    with pytest.raises(ServerError, match="failed to load"):
        with live_server(repo, copy=False, timeout=60):
            pass


def _add(repo: str, name: str, model: str) -> None:
    add_onnx_model(Path(repo), name, Path(model), backend="python", options=_options())


def _check(repo: Path, *args: str) -> tuple[int, list[dict], str]:
    """``repo check --json``: exit code, the findings other than the test's execution env (an
    absolute path: host-specific by design here), and what --fix did."""
    import json
    import sys

    res = subprocess.run([sys.executable, "-m", "trtrepo.cli", "repo", "check", str(repo), "--json", *args],
                         capture_output=True, text=True, timeout=120)
    text = res.stdout[res.stdout.index("{"):]
    findings = [f for f in json.loads(text)["findings"] if "EXECUTION_ENV" not in f["message"]
                and "absolute path" not in f["message"]]
    return res.returncode, findings, "\n".join(json.loads(text)["fixed"])


@pytest.fixture
def mounted_repo(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs over the repository needs root (the test makes the repository a real mount point)")
    repo = tmp_path / "repo"
    repo.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200m", "tmpfs", str(repo)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        assert repo.stat().st_dev != repo.parent.stat().st_dev
        yield repo
    finally:
        subprocess.run(["umount", "-l", str(repo)], check=False)


@pytest.mark.long
@pytest.mark.slow
def test_sigkill_at_ten_instants_of_adding_a_large_model_to_a_mount_point_repository(tmp_path, mounted_repo):
    """Acceptance (a) of issue 28: kill -9 at 10 evenly spaced instants of adding a 268 MB model
    to a repository that is a mount point. After each kill the real server starts on the
    repository and serves every complete model; ``repo check`` names what is left over (exit 1),
    ``--fix`` removes it, then the check passes and the server starts again. A server is started
    once per distinct repository state (the paths Triton sees and the configs)."""
    repo = mounted_repo
    big = _big(tmp_path / "big.onnx")
    _add(str(repo), "demo", str(_tiny(tmp_path / "tiny.onnx")))
    clean = [p.name for p in repo.iterdir()]

    t0 = time.monotonic()
    _add(str(repo), "big", str(big))  # an uninterrupted add: how long one takes here
    duration = time.monotonic() - t0
    shutil.rmtree(repo / "big")
    seen = set()
    served: set[tuple[str, ...]] = set()

    def fresh() -> bool:
        """A repository state not served yet: the paths Triton sees, staging folders by kind (not
        id or size: Triton ignores a non-numeric folder in a model folder whatever it holds),
        and the configs."""
        names = []
        for p in sorted(repo.rglob("*")):
            rel = p.relative_to(repo).as_posix()
            names.append(re.sub(r"\.trtrepo-staging-[^/]*", ".trtrepo-staging-*", rel))
        state = tuple(sorted(set(names))) + tuple(p.read_text() for p in sorted(repo.glob("*/config.pbtxt")))
        new = state not in served
        served.add(state)
        return new

    for i in range(10):
        proc = mp.get_context("fork").Process(target=_add, args=(str(repo), "big", str(big)))
        proc.start()
        time.sleep(duration * (i + 0.5) / 10)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        complete = (repo / "big" / "config.pbtxt").is_file()
        seen.add("complete" if complete else "not live")
        assert sorted(p.name for p in repo.iterdir() if p.name != "big") == sorted(clean), i  # nothing at the top
        if fresh():
            with live_server(repo, copy=False, timeout=120) as server:
                assert server.model_ready("demo"), i
                assert server.model_ready("big") == complete, i
        left = leftovers(repo)
        code, findings, _ = _check(repo)
        assert code == 1  # the execution env's absolute path alone makes it 1: the findings decide
        assert sorted(f["path"] for f in findings) == sorted(map(str, left)), (i, findings)
        if left:
            assert all("interrupted write" in f["message"] for f in findings), findings
            code, findings, _ = _check(repo, "--fix")
            assert findings == [] and leftovers(repo) == [], findings
            if fresh():
                with live_server(repo, copy=False, timeout=120) as server:
                    assert server.model_ready("demo") and server.model_ready("big") == complete
        if complete:
            assert versions_of(repo / "big") == [1]
            shutil.rmtree(repo / "big")
    assert "not live" in seen, "no kill landed before the model went live"


def test_a_new_model_of_a_mount_point_repository_is_staged_inside_another_model_folder(tmp_path, mounted_repo,
                                                                                      monkeypatch):
    """The staging folder of a new model never appears at the repository's top level: it sits in
    another model's folder (ignored by Triton) and the model appears by one rename, complete."""
    from trtrepo.repository import commit as repository_commit

    repo = mounted_repo
    _add(str(repo), "demo", str(_tiny(tmp_path / "tiny.onnx")))
    seen = {}

    def hook(step: str) -> None:
        seen[step] = (sorted(p.name for p in repo.iterdir()), [str(p.relative_to(repo)) for p in leftovers(repo)])

    monkeypatch.setattr(repository_commit, "_commit_hook", hook)
    _add(str(repo), "second", str(_tiny(tmp_path / "tiny2.onnx")))
    top, staged = seen["staged"]
    assert "second" not in top and not [n for n in top if n.startswith(".trtrepo-staging")], top
    assert staged and staged[0].startswith("demo/.trtrepo-staging-second-"), staged
    assert leftovers(repo) == [] and (repo / "second" / "config.pbtxt").is_file()


def _add_killed_before_its_config(repo: str, model: str) -> None:
    """The in-place write (no other model to stage in), killed after its version went live and
    before its config did."""
    from trtrepo.repository import commit as repository_commit

    real = os.replace

    def replace(src, dst):
        if Path(dst).name == "config.pbtxt":
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)

    repository_commit._staging_parent = lambda repo: None  # type: ignore[assignment]  # the forked child only
    repository_commit.os.replace = replace  # type: ignore[attr-defined]
    _add(repo, "big", model)


def test_check_names_a_config_less_folder_and_fix_finishes_the_write_in_place(tmp_path):
    """The one write that cannot be staged elsewhere: the first model of a repository whose parent
    is unusable. Killed between its version and its config, it leaves a folder Triton fails to
    load; ``repo check`` says so (exit 1) and ``--fix`` finishes the write, after which the real
    server starts and serves it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    proc = mp.get_context("fork").Process(target=_add_killed_before_its_config,
                                          args=(str(repo), str(_tiny(tmp_path / "tiny.onnx"))))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert versions_of(repo / "big") == [1] and not (repo / "big" / "config.pbtxt").exists()
    code, findings, _ = _check(repo)
    assert code == 1
    assert {f["kind"] for f in findings} == {"host", "broken"}, findings
    assert any(f["kind"] == "broken" and f["path"].endswith("big") and "no config.pbtxt" in f["message"]
               for f in findings), findings
    code, findings, fixed = _check(repo, "--fix")
    assert "completed" in fixed and findings == [], (fixed, findings)
    with live_server(repo, copy=False, timeout=120) as server:
        assert server.model_ready("big")


def test_serve_names_a_folder_triton_cannot_load_before_the_server_refuses_it(tmp_path, run_cli):
    """``trtrepo serve`` on a repository holding a folder Triton fails to load (here: a version
    without config.pbtxt) says which folder and how to repair it, then reports Triton's own error."""
    repo = tmp_path / "repo"
    add_onnx_model(repo, "demo", _tiny(tmp_path / "tiny.onnx"), backend="python", options=_options())
    (repo / "big" / "1").mkdir(parents=True)
    (repo / "big" / "1" / "model.onnx").write_bytes(_tiny(tmp_path / "t2.onnx").read_bytes())
    res = run_cli("serve", repo, "--timeout", "60")
    assert res.exit_code != 0
    assert f"warning: {repo / 'big'}: no config.pbtxt" in res.stderr and "repo check --fix" in res.stderr, res.stderr
