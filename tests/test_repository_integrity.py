"""Issue 16 items 3-5: external data travels with the model, a new version cannot break the
versions Triton keeps serving, version numbers stay within Triton's int64."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_tritonserver

from trtrepo import repository
from trtrepo.errors import UsageError
from trtrepo.repository import MAX_VERSION, add_onnx_model, versions_of
from trtrepo.tritonconfig import ModelOptions


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != repository.LOCK_NAME} if root.exists() else {}


def external_data_model(folder: Path, outputs: tuple[str, ...] = ("y",)) -> Path:
    """y = x @ W (+ a second output) with W (64x8) in weights.bin beside the model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 512
    nodes = [helper.make_node("MatMul", ["x", "W"], [outputs[0]])]
    nodes += [helper.make_node("Relu", [outputs[0]], [o]) for o in outputs[1:]]
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["batch", 8]) for o in outputs],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=0)
    assert (folder / "weights.bin").stat().st_size == w.nbytes
    return path


@requires_tritonserver
@pytest.mark.triton
def test_repo_add_copies_external_data_and_the_real_server_runs_it(tmp_path, run_cli, triton_server):
    """Issue 16 item 3: the data file was left behind (a broken version, exit 0)."""
    import tritonclient.http as httpclient

    from trtrepo.server import find_python_env

    model = external_data_model(tmp_path / "src")
    repo = tmp_path / "repo"
    env = find_python_env()
    res = run_cli("repo", "add", model, "--repo", repo, "--name", "ext", "--backend", "python",
                  *(["--python-env", env] if env else []))
    assert res.exit_code == 0, res.output + res.stderr
    version = repo / "ext" / "1"
    assert (version / "weights.bin").read_bytes() == (tmp_path / "src" / "weights.bin").read_bytes()
    server = triton_server(repo)
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    inp = httpclient.InferInput("x", [3, 64], "FP32")
    inp.set_data_from_numpy(x)
    y = client.infer("ext", [inp]).as_numpy("y")
    w = np.arange(64 * 8, dtype=np.float32).reshape(64, 8) / 512
    np.testing.assert_allclose(y, x @ w, rtol=1e-5, atol=1e-5)


def test_a_missing_or_short_external_data_file_is_refused_and_nothing_is_written(tmp_path, run_cli):
    model = external_data_model(tmp_path / "src")
    data = tmp_path / "src" / "weights.bin"
    full = data.read_bytes()
    data.write_bytes(full[:100])
    res = run_cli("repo", "add", model, "--repo", tmp_path / "repo", "--name", "ext")
    assert res.exit_code == 2 and f"{data}: 100 bytes, but model.onnx reads up to byte {len(full)}" in res.stderr
    data.unlink()
    res = run_cli("repo", "add", model, "--repo", tmp_path / "repo", "--name", "ext")
    assert res.exit_code == 2 and f"{model}: its external data file {data} is missing" in res.stderr
    assert tree(tmp_path / "repo") == {}


def test_a_new_version_whose_io_breaks_the_kept_versions_is_refused(tmp_path, run_cli):
    """Issue 16 item 4: with --version-policy all, a new version with other output names rewrote
    the shared config.pbtxt and Triton failed to load the older versions ("no tensor(s) y1, y2")."""
    repo = tmp_path / "repo"
    one = external_data_model(tmp_path / "one", ("y",))
    two = external_data_model(tmp_path / "two", ("y1", "y2"))
    res = run_cli("repo", "add", one, "--repo", repo, "--name", "m", "--version-policy", "all")
    assert res.exit_code == 0, res.stderr
    before = tree(repo)
    res = run_cli("repo", "add", two, "--repo", repo, "--name", "m", "--version-policy", "all")
    assert res.exit_code == 2 and "would serve the older version(s) 1 under the new config" in res.stderr
    assert tree(repo) == before
    # the policy that serves only the new version takes it; so does another name
    res = run_cli("repo", "add", two, "--repo", repo, "--name", "m", "--version-policy", "latest:1")
    assert res.exit_code == 0, res.stderr
    assert versions_of(repo / "m") == [1, 2] and "y2" in (repo / "m" / "config.pbtxt").read_text()
    res = run_cli("repo", "add", one, "--repo", repo, "--name", "m", "--version-policy", "all")
    assert res.exit_code == 2 and "older version(s) 1, 2 under" in res.stderr  # the other way round too


def test_version_numbers_stay_within_int64(tmp_path, demo_onnx, run_cli):
    """Issue 16 item 5: Triton aborted (exit -6) on a version beyond int64, and automatic
    numbering after 2**63-1 overflowed."""
    repo = tmp_path / "repo"
    res = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "d", "--version", str(MAX_VERSION + 1))
    assert res.exit_code == 2 and "--version" in res.stderr and not (repo / "d").exists()
    add_onnx_model(repo, "d", demo_onnx, version=MAX_VERSION)
    before = tree(repo)
    with pytest.raises(UsageError, match=f"no version number left after {MAX_VERSION}"):
        add_onnx_model(repo, "d", demo_onnx)
    assert tree(repo) == before
    assert add_onnx_model(repo, "d", demo_onnx, version=7, options=ModelOptions())[0].version == 7
