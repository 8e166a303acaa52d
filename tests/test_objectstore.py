"""Issue 18 item 1: model repositories on S3-compatible object storage.

The S3 API is real: moto's standalone server (``moto_server``) on loopback, which boto3 (trtrepo)
and tritonserver (its own S3 client) both talk to over HTTP, as they would to any S3-compatible
service. What is checked: the URL forms, version pinning, ``deploy``/``repo add``/``repo list``/
``repo check`` on ``s3://``, tritonserver loading and serving the repository from there, and a
kill -9 during the upload of a large model.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _servers import live_server
from conftest import requires_tritonserver

from trtrepo.errors import UsageError
from trtrepo.objectstore import S3Location, complete_versions, parse_url, pin_versions
from trtrepo.server import ServerError
from trtrepo.tritonconfig import parse_config_text

# --- pure ------------------------------------------------------------------------------------


def test_urls_in_trtreps_and_tritons_forms(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert parse_url("s3://models/repo/a/") == S3Location("models", "repo/a", None)
    assert parse_url("s3://models") == S3Location("models", "", None)
    loc = parse_url("s3://models/repo", "http://127.0.0.1:9000/")
    assert loc == S3Location("models", "repo", "http://127.0.0.1:9000")
    assert loc.url == "s3://http://127.0.0.1:9000/models/repo"  # the form tritonserver takes
    assert parse_url(loc.url) == loc and parse_url(loc.url, "http://127.0.0.1:9000") == loc
    assert parse_url("s3://models/repo").url == "s3://models/repo"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://s3.example.com")
    assert parse_url("s3://models/repo").endpoint == "https://s3.example.com:443"
    assert parse_url("s3://models/repo").url == "s3://https://s3.example.com:443/models/repo"  # Triton needs the port
    with pytest.raises(UsageError, match="with a custom S3 endpoint Triton needs a bucket"):
        parse_url("s3://models/my repo")
    bad = [("s3://http://127.0.0.1:9000/models/repo", "http://127.0.0.1:9001", "the S3 endpoint http://127.0.0.1:9001"),
           ("s3://models/repo", "127.0.0.1:9000", "the S3 endpoint 127.0.0.1:9000"),
           ("s3:///repo", None, "expected s3://BUCKET"), ("s3://Models/repo", None, "no valid bucket"),
           ("s3://models/a/../b", None, "'..'"), ("gs://models/repo", None, "s3:// repositories only")]
    for url, endpoint, words in bad:
        with pytest.raises(UsageError, match=words.replace(".", r"\.").replace("/", "/")):
            parse_url(url, endpoint)


def test_pinning_replaces_or_adds_the_version_policy_and_parses():
    text = 'name: "m"\nbackend: "python"\nmax_batch_size: 8\nversion_policy: { latest: { num_versions: 2 } }\ninput [ ]\n'
    pinned = pin_versions(text, [3, 1])
    msg = parse_config_text(pinned, "m/config.pbtxt")
    assert list(msg.version_policy.specific.versions) == [1, 3] and msg.max_batch_size == 8
    assert pinned.count("version_policy") == 1
    plain = pin_versions('name: "m"\nbackend: "python"\n', [2])
    assert list(parse_config_text(plain, "m").version_policy.specific.versions) == [2]
    multi = 'name: "m"\nversion_policy {\n  specific {\n    versions: [1, 2]\n  }\n}\nbackend: "python"\n'
    again = parse_config_text(pin_versions(multi, [5]), "m")
    assert list(again.version_policy.specific.versions) == [5] and again.backend == "python"
    # which remote versions are whole: up to the newest pinned one; all under another policy; none without config
    assert complete_versions(parse_config_text(pinned, "m"), [1, 2, 3, 4]) == [1, 2, 3]
    assert complete_versions(parse_config_text(text, "m"), [1, 2, 4]) == [1, 2, 4]
    assert complete_versions(None, [1]) == []


# --- against an S3 API on loopback ------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free loopback port, with a bucket "models"; yields its endpoint URL.
    Credentials are moto's test ones, in the environment for boto3 and tritonserver alike."""
    pytest.importorskip("boto3")
    server = Path(sys.executable).parent / "moto_server"
    if not server.exists():
        pytest.skip("moto_server not installed (pip install 'moto[server]')")
    from trtrepo.server import free_port

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115 - closed below
    # moto's server with its conditional writes atomic, as S3's are (tests/_moto_server.py says why)
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_moto_server.py")), "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in (*env, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    os.environ.update(env)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(k, None)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"moto_server did not start on {endpoint}")
                time.sleep(0.2)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="models")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _client(endpoint):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


def _keys(endpoint, prefix):
    pages = _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket="models", Prefix=prefix)
    return sorted(o["Key"][len(prefix):] for p in pages for o in p.get("Contents", []))


def _config(endpoint, key):
    body = _client(endpoint).get_object(Bucket="models", Key=key)["Body"].read().decode()
    return parse_config_text(body, key)


def _tiny_onnx(path: Path, extra_mib: int = 0) -> Path:
    """y = x + sum(w): ``w`` of ``extra_mib`` MiB of ones makes the file large (0: y = x)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])
    if extra_mib:
        w = numpy_helper.from_array(np.ones((extra_mib, 256, 1024), np.float32), "w")
        nodes = [helper.make_node("ReduceSum", ["w"], ["s"], keepdims=0), helper.make_node("Add", ["x", "s"], ["y"])]
        graph = helper.make_graph(nodes, "big", [x], [y], [w])
    else:
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "small", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_repo_add_list_and_versions_on_s3(s3, tmp_path, run_cli):
    small = _tiny_onnx(tmp_path / "small.onnx")
    url = "s3://models/add"
    res = run_cli("repo", "add", small, "--repo", url, "--s3-endpoint", s3, "--name", "m", "--backend", "python")
    assert res.exit_code == 0, res.output
    assert f"added m version 1: s3://{s3}/models/add/m/1" in res.output
    assert _keys(s3, "add/m/") == ["1/model.onnx", "1/model.py", "config.pbtxt"]
    assert list(_config(s3, "add/m/config.pbtxt").version_policy.specific.versions) == [1]
    res = run_cli("repo", "add", small, "--repo", f"s3://{s3}/models/add", "--name", "m", "--backend", "python")
    assert res.exit_code == 0, res.output  # Triton's URL form works as well
    assert list(_config(s3, "add/m/config.pbtxt").version_policy.specific.versions) == [2]
    # --force on an existing number: object storage has no rename, so a new number, the old one retired
    res = run_cli("repo", "add", small, "--repo", url, "--s3-endpoint", s3, "--name", "m", "--backend", "python",
                  "--version", "2", "--force")
    assert res.exit_code == 0, res.output
    assert "written as version 3, version 2 retired" in res.output
    assert sorted({k.split("/")[0] for k in _keys(s3, "add/m/")}) == ["1", "3", "config.pbtxt"]
    assert list(_config(s3, "add/m/config.pbtxt").version_policy.specific.versions) == [3]
    res = run_cli("repo", "add", small, "--repo", url, "--s3-endpoint", s3, "--name", "m", "--backend", "python",
                  "--version", "3")
    assert res.exit_code == 2 and "version 3 already exists" in res.output
    res = run_cli("repo", "list", url, "--s3-endpoint", s3)
    assert res.exit_code == 0 and "m  [python" in res.output and "1/  model.onnx, model.py" in res.output, res.output
    assert "3/  model.onnx, model.py" in res.output and "problem" not in res.output
    res = run_cli("repo", "list", "s3://nosuchbucket/x", "--s3-endpoint", s3)
    assert res.exit_code == 2 and "bucket nosuchbucket not found" in res.output


@requires_tritonserver
@pytest.mark.triton
def test_deploy_to_s3_then_tritonserver_serves_it_and_validate_passes(s3, tmp_path, run_cli):

    url = f"s3://{s3}/models/deployed"
    res = run_cli("deploy", "demo", "--repo", "s3://models/deployed", "--s3-endpoint", s3, "--precision", "fp32",
                  "--backend", "python", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{"):])
    assert report["models"][0]["path"] == f"{url}/demo/1"
    assert list(_config(s3, "deployed/demo/config.pbtxt").version_policy.specific.versions) == [1]
    with live_server(url, timeout=120) as server:  # tritonserver reads the bucket itself
        assert server.model_ready("demo")
        # its copy of the bucket's model sits in the server's own folder (not /tmp/folderXXXXXX)
        own = Path(server._tmp.name) if server._tmp is not None else None
        assert own is not None and [p.name for p in own.glob("folder*/*.pbtxt")] == ["config.pbtxt"]
        res = run_cli("validate", "--url", server.grpc_url, "--model", "demo", "--reference", "demo", "--data",
                      "demo:val", "--limit", "64", "--concurrency", "1", "--measurement-interval", "0.3",
                      "--max-top1-drop", "1.0")
        assert res.exit_code == 0, res.output
    assert not own.exists()  # removed with the server
    res = run_cli("serve", "s3://models/deployed", "--s3-endpoint", s3, "--print-command")
    assert res.exit_code == 0 and f"--model-repository={url}" in res.output and "-e AWS_ACCESS_KEY_ID" in res.output
    # Kubernetes manifests from what the bucket holds (issue 18 item 2; the rendering is tested in test_manifests.py)
    res = run_cli("manifests", "s3://models/deployed", "--s3-endpoint", s3, "-o", tmp_path / "k8s")
    assert res.exit_code == 0, res.output
    deployment = (tmp_path / "k8s" / "deployment.yaml").read_text()
    assert f"--model-repository={url}" in deployment and "nvidia.com/gpu" not in deployment


def _upload_killed(url: str, endpoint: str, onnx: str, name: str) -> None:
    """The ten-instant test's child (forked, so that its instants are spread over the upload itself
    rather than an interpreter's start-up)."""
    from click.testing import CliRunner

    from trtrepo.cli import cli

    CliRunner().invoke(cli, ["repo", "add", onnx, "--repo", url, "--s3-endpoint", endpoint, "--name", name,
                             "--backend", "python"], catch_exceptions=False)


def _kill_mid_upload(s3: str, url: str, onnx: Path, name: str, version: int, key_prefix: str) -> None:
    """Start ``repo add`` in a child process and kill -9 it once the version's small object is up
    and the large one is half-way (a multipart upload in progress). A process of its own, not a
    fork of this multi-threaded pytest worker (a forked child can crash in the threads' state)."""
    proc = subprocess.Popen([sys.executable, "-m", "trtrepo.cli", "repo", "add", str(onnx), "--repo", url, "--s3-endpoint", s3,
                             "--name", name, "--backend", "python"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s3c = _client(s3)
    deadline, seen = time.monotonic() + 120, False
    while time.monotonic() < deadline and not seen and proc.poll() is None:
        uploads = s3c.list_multipart_uploads(Bucket="models", Prefix=key_prefix).get("Uploads", [])
        seen = any(f"{name}/{version}/model.onnx" in u["Key"] for u in uploads) and \
            any(k.endswith(f"{name}/{version}/model.py") for k in _keys(s3, key_prefix))
        time.sleep(0.01)
    proc.kill()
    proc.wait(30)
    assert seen, "the upload was never seen half-done"


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_kill_9_during_the_upload_of_a_large_model_leaves_a_loadable_repository(s3, tmp_path, run_cli):

    url = f"s3://{s3}/models/killed"
    small, big = _tiny_onnx(tmp_path / "small.onnx"), _tiny_onnx(tmp_path / "big.onnx", extra_mib=192)
    res = run_cli("repo", "add", small, "--repo", url, "--name", "big", "--backend", "python")
    assert res.exit_code == 0, res.output
    before = _config(s3, "killed/big/config.pbtxt")
    _kill_mid_upload(s3, url, big, "big", 2, "killed/")
    # the live config is untouched and names version 1 only; version 2 is a leftover, not served
    assert _config(s3, "killed/big/config.pbtxt") == before
    assert "2/model.py" in _keys(s3, "killed/big/")
    res = run_cli("repo", "list", url)
    assert "version(s) 2 left by an interrupted upload" in res.output, res.output
    with live_server(url, timeout=120) as server:
        assert server.model_ready("big")
        status, body = server._get("/v2/models/big/versions/2/ready")
        assert status != 200, "the partial version must not be served"
        index = {m["name"]: m for m in server.repository_index()}
        assert index["big"]["version"] == "1" and index["big"]["state"] == "READY", index
    res = run_cli("repo", "check", url)
    assert res.exit_code == 1 and "left by an interrupted upload" in res.output, res.output
    res = run_cli("repo", "check", url, "--fix")
    assert "fixed: removed big/2/" in res.output, res.output
    assert sorted({k.split("/")[0] for k in _keys(s3, "killed/big/")}) == ["1", "config.pbtxt"]
    assert run_cli("repo", "check", url).exit_code == 0
    res = run_cli("repo", "add", small, "--repo", url, "--name", "big", "--backend", "python")
    assert res.exit_code == 0 and "added big version 2" in res.output, res.output


@pytest.mark.long
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_kill_9_during_a_models_first_upload_leaves_the_other_models_served(s3, tmp_path, run_cli):
    """A model's first upload killed half-way. Without the staging area the kill left a folder
    without config.pbtxt, which tritonserver filled a config in for, failed to load, and so
    refused to start (measured): the upload goes beside the repository, so the server starts and
    serves the other models; repo check names the staged objects and --fix removes them. In the
    long tier beside ``test_sigkill_at_ten_instants_of_a_first_upload``, which checks the same
    state (a kill during the staged upload) among its ten."""

    url = f"s3://{s3}/models/first"
    small, big = _tiny_onnx(tmp_path / "small.onnx"), _tiny_onnx(tmp_path / "big.onnx", extra_mib=192)
    assert run_cli("repo", "add", small, "--repo", url, "--name", "kept", "--backend", "python").exit_code == 0
    _kill_mid_upload(s3, url, big, "fresh", 1, "first.trtrepo-staging/")
    assert _keys(s3, "first/fresh/") == [] and any(k.endswith("fresh/1/model.py") for k in _keys(s3, "first.trtrepo-staging/"))
    res = run_cli("repo", "list", url)
    assert "fresh" not in res.output and "kept  [python" in res.output, res.output
    with live_server(url, timeout=120) as server:
        assert server.model_ready("kept")
        assert [m["name"] for m in server.repository_index()] == ["kept"]
    res = run_cli("repo", "check", url)
    assert res.exit_code == 1 and "first.trtrepo-staging/ (staged uploads)" in res.output, res.output
    res = run_cli("repo", "check", url, "--fix")
    assert "fixed: removed" in res.output and "staged uploads" in res.output, res.output
    assert _keys(s3, "first.trtrepo-staging/") == []
    res = run_cli("repo", "add", small, "--repo", url, "--name", "fresh", "--backend", "python")
    assert res.exit_code == 0 and "added fresh version 1" in res.output, res.output


# --- several servers (issue 18 item 3) ---------------------------------------------------------


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@requires_tritonserver
@pytest.mark.triton
def test_two_servers_of_one_s3_repository_validated_together(s3, tmp_path, demo_onnx, run_cli):
    """Two tritonservers read the same s3:// repository; ``validate --url a,b`` sends every
    accuracy request to both (outputs compared) and each level to both at once."""
    from trtrepo.modelio import ModelIO

    url = f"s3://{s3}/models/fleet"
    res = run_cli("deploy", "demo", "--repo", url, "--precision", "fp32", "--backend", "python")
    assert res.exit_code == 0, res.output
    with live_server(url, timeout=120) as a, live_server(url, timeout=120) as b:
        report = tmp_path / "report"
        res = run_cli("validate", "--url", f"{a.grpc_url},{b.grpc_url}", "--model", "demo", "--reference", "demo",
                      "--data", "demo:val", "--limit", "64", "--concurrency", "1,4", "--measurement-interval", "0.3",
                      "--max-top1-drop", "1.0", "--report", report, "--no-reference-speed", "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.output[res.output.index("{"):])
        assert out["server"]["servers"] == [a.grpc_url, b.grpc_url]
        agree = out["fleet"]["agreement"]
        assert agree["identical"] and agree["requests"] > 0
        outputs = ModelIO.from_onnx(demo_onnx).output_names
        assert [(r["server"], r["output"]) for r in agree["outputs"]] == [(b.grpc_url, n) for n in outputs]
        for level in out["latency"]["levels"]:
            per = level["servers"]
            assert [s["url"] for s in per] == [a.grpc_url, b.grpc_url]
            assert all(s["throughput"] > 0 and s["requests"] > 0 for s in per)
            assert level["throughput"] == pytest.approx(sum(s["throughput"] for s in per))
            assert level["requests"] == sum(s["requests"] for s in per)
            # each server's own statistics count the requests it answered
            assert all(s["server"]["request_count"] >= s["requests"] for s in per)
        md = (report / "validate.md").read_text()
        assert "## Servers (2:" in md and f"| 4 | {b.grpc_url} |" in md
        gates = {t["name"]: t["passed"] for t in out["thresholds"] if t["name"].startswith("server_diff")}
        assert gates == {f"server_diff[{b.grpc_url}:{n}]": True for n in outputs}


@requires_tritonserver
@pytest.mark.triton
def test_servers_that_disagree_fail_validate_naming_server_and_output(tmp_path, demo_onnx, run_cli):
    """Two servers that claim to serve one model but do not (FP32 on one, the same graph with
    other weights on the other): exit 1, naming the server and the output."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from trtrepo.repository import add_onnx_model
    from trtrepo.tritonconfig import ModelOptions

    changed = onnx.load(str(demo_onnx))
    init = changed.graph.initializer[-1]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.01), init.name))
    other = tmp_path / "other.onnx"
    onnx.save(changed, str(other))
    add_onnx_model(tmp_path / "a", "demo", demo_onnx, backend="python", options=ModelOptions(max_batch_size=32))
    add_onnx_model(tmp_path / "b", "demo", other, backend="python", options=ModelOptions(max_batch_size=32))
    with live_server(tmp_path / "a", timeout=120) as a, live_server(tmp_path / "b", timeout=120) as b:
        res = run_cli("validate", "--url", f"{a.grpc_url},{b.grpc_url}", "--model", "demo", "--reference", "demo",
                      "--data", "demo:val", "--limit", "32", "--no-latency", "--min-embedding-cosine", "-1")
        assert res.exit_code == 1, res.output
        assert f"server_diff[{b.grpc_url}:logits]" in res.output and "validation failed" in res.output
    res = run_cli("validate", "--url", "127.0.0.1:1,,127.0.0.1:2", "--model", "demo", "--reference", "demo",
                  "--data", "demo:val")
    assert res.exit_code == 2 and "an empty address" in res.output
    res = run_cli("validate", "--url", "127.0.0.1:5,127.0.0.1:5", "--model", "demo", "--reference", "demo",
                  "--data", "demo:val")
    assert res.exit_code == 2 and "127.0.0.1:5 given twice" in res.output


@pytest.mark.long
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_sigkill_at_ten_instants_of_a_first_upload(s3, tmp_path, run_cli):
    """Issue 28 acceptance (b): kill -9 at 10 evenly spaced instants of a large model's first
    upload beside a served model. A kill during the upload to the staging area leaves the
    repository as it was (the server starts and serves the other model; --fix removes the staged
    objects). A kill during the server-side copies into place (one CopyObject per object, the
    config last) leaves the model's folder without config.pbtxt, on which tritonserver 2.51 does
    not start (no layout avoids it: a config without its version fails the same way, measured in
    test_mountpoint.py): ``repo check`` names it as not loadable, and ``--fix`` finishes the upload
    from the complete staged copy, after which the server serves both. The model is 256 MiB with
    TRTREPO_TEST_FIRST_UPLOAD_MIB=256 (the issue's case), 64 MiB by default. A server is started
    once per distinct repository state (the keys under the prefix and the config), which is all
    Triton reads."""
    mib = int(os.environ.get("TRTREPO_TEST_FIRST_UPLOAD_MIB", "64"))
    url = f"s3://{s3}/models/tenkills"
    small, big = _tiny_onnx(tmp_path / "small.onnx"), _tiny_onnx(tmp_path / "big.onnx", extra_mib=mib)
    assert run_cli("repo", "add", small, "--repo", url, "--name", "kept", "--backend", "python").exit_code == 0
    t0 = time.monotonic()
    assert run_cli("repo", "add", big, "--repo", url, "--name", "big", "--backend", "python").exit_code == 0
    duration = time.monotonic() - t0
    _client(s3).delete_objects(Bucket="models", Delete={"Objects": [{"Key": f"tenkills/big/{k}"}
                                                                    for k in _keys(s3, "tenkills/big/")]})
    states = []
    served: set[tuple[str, ...]] = set()  # repository states a server was started on (Triton sees only these keys)

    def fresh() -> bool:
        state = tuple(_keys(s3, "tenkills/")) + (_client(s3).get_object(Bucket="models", Key="tenkills/big/config.pbtxt")
                                                 ["Body"].read().decode() if "config.pbtxt" in _keys(s3, "tenkills/big/")
                                                 else "",)
        new = state not in served
        served.add(state)
        return new

    for i in range(10):
        proc = mp.get_context("fork").Process(target=_upload_killed, args=(url, s3, str(big), "big"))
        proc.start()
        time.sleep(duration * (i + 0.5) / 10)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
        time.sleep(0.5)  # a copy request the kill left in flight completes on the service
        live = _keys(s3, "tenkills/big/")
        state = "complete" if "config.pbtxt" in live else "copying" if live else "staging"
        states.append(state)
        code, out = _check_json(run_cli, url)
        broken = [f for f in out["findings"] if f["kind"] == "broken"]
        if state == "copying":
            assert code == 1 and len(broken) == 1 and broken[0]["path"].endswith("/big/"), out
            assert "finishes the upload" in broken[0]["message"], broken
            with pytest.raises(ServerError, match="failed to load"):  # the window the protocol leaves
                with live_server(url, timeout=60):
                    pass
        elif fresh():  # a state already served needs no second server: Triton reads only these objects
            assert broken == [], out
            with live_server(url, timeout=120) as server:
                assert server.model_ready("kept") and server.model_ready("big") == (state == "complete"), (i, state)
        else:
            assert broken == [], out
        code, out = _check_json(run_cli, url, "--fix")
        assert code == 0 and out["findings"] == [], (i, state, out)
        assert ("completed big/" in " ".join(out["fixed"])) == (state == "copying"), out["fixed"]
        if state == "copying" and fresh():
            with live_server(url, timeout=120) as server:
                assert server.model_ready("kept") and server.model_ready("big")
        if "config.pbtxt" in _keys(s3, "tenkills/big/"):
            _client(s3).delete_objects(Bucket="models", Delete={"Objects": [{"Key": f"tenkills/big/{k}"}
                                                                            for k in _keys(s3, "tenkills/big/")]})
    print(f"first upload of {mib} MiB, {duration:.1f} s uninterrupted; the 10 kills found: {states}")
    assert "staging" in states, states


def _check_json(run_cli, url: str, *args: str) -> tuple[int, dict]:
    import json

    res = run_cli("repo", "check", url, "--json", *args)
    return res.exit_code, json.loads(res.output[res.output.index("{"):])


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
def test_three_concurrent_adds_to_one_s3_model_get_distinct_versions_and_lose_nothing(s3, tmp_path):
    """Issue 28 acceptance: three ``repo add`` of one model at once. The writer lock beside the
    repository serialises their uploads; each gets its own version (a number another writer took
    meanwhile moves on), every version is complete, and ``repo check`` passes."""
    small = _tiny_onnx(tmp_path / "small.onnx")
    url = f"s3://{s3}/models/concurrent"
    cmd = [sys.executable, "-m", "trtrepo.cli", "repo", "add", str(small), "--repo", url, "--name", "m", "--backend", "python"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [(p.wait(180), *p.communicate()) for p in procs]
    assert all(code == 0 for code, _, _ in outs), outs
    added = sorted(int(out.split("added m version ")[1].split(":")[0]) for _, out, _ in outs)
    assert added == [1, 2, 3], outs
    keys = _keys(s3, "concurrent/m/")
    assert keys == [f"{v}/{f}" for v in (1, 2, 3) for f in ("model.onnx", "model.py")] + ["config.pbtxt"], keys
    assert list(_config(s3, "concurrent/m/config.pbtxt").version_policy.specific.versions) == [3]
    assert _keys(s3, "concurrent.trtrepo-staging/") == [] and _keys(s3, "concurrent.trtrepo-lock") == []
    res = subprocess.run([sys.executable, "-m", "trtrepo.cli", "repo", "check", url], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_writer_gives_up_on_a_lock_held_by_another_host_naming_it(s3, tmp_path, run_cli, monkeypatch):
    """A lock held by a live writer elsewhere (another host, lease running): the writer waits its
    bounded time, then exits 1 naming the holder; nothing is uploaded."""
    import json as _json

    from trtrepo import objectstore

    monkeypatch.setattr(objectstore, "LOCK_WAIT_S", 1.0)
    holder = {"token": "x", "host": "builder-7", "pid": 4242, "lease_until": time.time() + 600}
    _client(s3).put_object(Bucket="models", Key="busy.trtrepo-lock", Body=_json.dumps(holder).encode())
    res = run_cli("repo", "add", _tiny_onnx(tmp_path / "s.onnx"), "--repo", f"s3://{s3}/models/busy", "--name", "m",
                  "--backend", "python")
    assert res.exit_code == 1 and "another trtrepo is writing" in res.output and "builder-7 pid 4242" in res.output, \
        res.output
    assert _keys(s3, "busy/") == []
    holder["lease_until"] = time.time() - 1  # its lease ended: the next writer takes the lock over
    _client(s3).put_object(Bucket="models", Key="busy.trtrepo-lock", Body=_json.dumps(holder).encode())
    res = run_cli("repo", "add", _tiny_onnx(tmp_path / "s.onnx"), "--repo", f"s3://{s3}/models/busy", "--name", "m",
                  "--backend", "python")
    assert res.exit_code == 0 and "added m version 1" in res.output, res.output
    assert _keys(s3, "busy.trtrepo-lock") == []


@requires_tritonserver
@pytest.mark.triton
def test_repo_check_names_what_triton_fails_to_load_on_s3(s3, tmp_path, run_cli):
    """A hidden folder under the prefix (tritonserver 2.51 loads it too: the server below does
    not start) and a served version without its model file are named as not loadable."""
    url = f"s3://{s3}/models/loadable"
    small = _tiny_onnx(tmp_path / "small.onnx")
    assert run_cli("repo", "add", small, "--repo", url, "--name", "m", "--backend", "python").exit_code == 0
    assert _check_json(run_cli, url) == (0, {"repo": url, "portable": True, "loadable": True, "fixed": [], "findings": []})
    _client(s3).put_object(Bucket="models", Key="loadable/.hidden/1/model.onnx", Body=small.read_bytes())
    _client(s3).delete_object(Bucket="models", Key="loadable/m/1/model.onnx")
    code, out = _check_json(run_cli, url)
    broken = {f["path"].rsplit("/models/loadable/", 1)[1]: f["message"] for f in out["findings"] if f["kind"] == "broken"}
    assert code == 1 and set(broken) == {".hidden/", "m/1/"}, out
    assert "lacks model.onnx" in broken["m/1/"] and "hidden folder" in broken[".hidden/"], broken
    with pytest.raises(ServerError, match="failed to load"):
        with live_server(url, timeout=60):
            pass
