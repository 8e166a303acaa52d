"""Issue 39 items 1, 3 (S3), 8 (S3 messages): a repository in a bucket nobody can poison.

Against moto's S3 server on loopback (the fixture of ``tests/test_objectstore.py``), no mocks:

- object keys that are no path inside the repository (``PREFIX//abs/...``: absolute below the
  prefix; ``..`` segments) are refused by ``repo check``, ``manifests`` and ``serve
  --print-command`` with exit 2 and one line naming the key, and nothing is written outside their
  temporary folder (an unrelated local repository's ``config.pbtxt`` is untouched); a symlink
  planted in the folder a snapshot or checkout writes into is not followed;
- two writers of one s3:// model race on its IO: the second publish re-checks against the
  config the first one made live, under the writer lock, and refuses what Triton could not load;
- ``TRTREPO_S3_TIMEOUT`` values that are no sane number of seconds are refused naming the
  variable, and the client makes the attempts its message states (connections counted).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _servers import silent_tcp_server
from test_objectstore import _client, _config, _keys, _tiny_onnx, s3  # noqa: F401  # s3: the moto fixture

from trtrepo.errors import UsageError
from trtrepo.fsutil import mkdir_inside, unsafe_relpath, write_inside
from trtrepo.objectstore import S3_ATTEMPTS, checkout, open_store, snapshot

# --- pure: the rule for a name from outside -------------------------------------------------------


def test_unsafe_relpath_names_each_kind_of_bad_key():
    assert unsafe_relpath("m/1/model.plan.json") is None and unsafe_relpath(".hidden/config.pbtxt") is None
    bad = {"": "empty", "/etc/x": "absolute", "m//config.pbtxt": "empty segment", "m/": "empty segment",
           "m/../x": "'..' segment", "..": "'..' segment", "./m": "'.' segment", "m\\..\\x": "backslash",
           "m/\0x": "NUL"}
    for rel, words in bad.items():
        assert words in (unsafe_relpath(rel) or ""), rel


def test_write_inside_refuses_bad_names_symlinks_and_existing_files(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    assert write_inside(root, "m/1/x.plan.json", b"{}") == root / "m/1/x.plan.json"
    assert (root / "m/1/x.plan.json").read_bytes() == b"{}"
    for rel in ("../outside/x", f"/{outside}/x", "m/./x"):
        with pytest.raises(UsageError, match="not a path inside"):
            write_inside(root, rel, b"!")
    (root / "link").symlink_to(outside)  # a folder symlink: not followed
    with pytest.raises(UsageError, match="symlink"):
        write_inside(root, "link/config.pbtxt", b"!")
    with pytest.raises(UsageError, match="symlink"):
        mkdir_inside(root, "link/1")
    (root / "m" / "file").symlink_to(outside / "target")  # a dangling file symlink: not written through
    with pytest.raises(UsageError, match="already exists"):
        write_inside(root, "m/file", b"!")
    with pytest.raises(UsageError, match="already exists"):
        write_inside(root, "m/1/x.plan.json", b"!")
    assert list(outside.iterdir()) == []


# --- hostile keys against the real S3 API -------------------------------------------------------

_CONFIG = 'name: "good"\nbackend: "python"\nmax_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' \
          'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'


def _victim(tmp_path: Path) -> tuple[Path, bytes, Path]:
    """An unrelated local repository (its config.pbtxt) and an empty folder outside everything."""
    victim = tmp_path / "victim" / "m"
    victim.mkdir(parents=True)
    (victim / "config.pbtxt").write_bytes(b'name: "m"\n# the victim\n')
    outside = tmp_path / "outside"
    outside.mkdir()
    return victim, (victim / "config.pbtxt").read_bytes(), outside


@pytest.mark.parametrize("kind", ["absolute", "dotdot"])
def test_hostile_keys_are_refused_and_nothing_is_written_outside(s3, tmp_path, run_cli, kind):  # noqa: F811
    """Before issue 39, ``repo check``/``manifests``/``serve --print-command`` wrote ``dest / key``
    for every listed key: the victim's config.pbtxt was overwritten and x.plan.json appeared in
    ``outside``."""
    victim, before, outside = _victim(tmp_path)
    prefix = f"evil-{kind}"
    if kind == "absolute":  # PREFIX//tmp/...: "/tmp/..." below the prefix, which pathlib makes absolute
        hostile = [f"{prefix}/{victim}/config.pbtxt", f"{prefix}/{outside}/x.plan.json"]
    else:  # enough '..' to climb from any temporary folder to '/', then down
        up = "../" * 40
        hostile = [f"{prefix}/good/{up}{str(victim)[1:]}/config.pbtxt", f"{prefix}/good/{up}{str(outside)[1:]}/x.plan.json"]
    c = _client(s3)
    c.put_object(Bucket="models", Key=f"{prefix}/good/config.pbtxt", Body=_CONFIG.encode())
    for key in hostile:
        c.put_object(Bucket="models", Key=key, Body=b'name: "m"\n# poisoned\n')
    listed = [o["Key"] for o in c.list_objects_v2(Bucket="models", Prefix=prefix)["Contents"]]
    assert sorted(listed) == sorted([f"{prefix}/good/config.pbtxt", *hostile])  # the S3 API keeps the keys as given
    url = f"s3://{s3}/models/{prefix}"
    runs = {"repo check": ("repo", "check", url), "manifests": ("manifests", url, "-o", tmp_path / "k8s"),
            "serve --print-command": ("serve", url, "--print-command"), "repo list": ("repo", "list", url)}
    for what, args in runs.items():
        res = run_cli(*args)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert res.exit_code == 2, (what, res.output)
        assert any("object key" in ln and "refuses a repository" in ln and f"'{prefix}/" in ln for ln in lines), \
            (what, res.output)
        assert (victim / "config.pbtxt").read_bytes() == before, what
        assert list(outside.iterdir()) == [] and sorted(p.name for p in victim.iterdir()) == ["config.pbtxt"], what
    assert not (tmp_path / "k8s").exists()


def test_a_hostile_key_in_the_staging_area_refuses_check(s3, run_cli):  # noqa: F811
    """Staged keys become repository keys when ``repo check --fix`` finishes an upload: the same
    rule applies to them."""
    c = _client(s3)
    c.put_object(Bucket="models", Key="stg/good/config.pbtxt", Body=_CONFIG.encode())
    c.put_object(Bucket="models", Key="stg.trtrepo-staging/t1/good/../../../x/config.pbtxt", Body=_CONFIG.encode())
    for args in (("repo", "check"), ("repo", "check", "--fix")):
        res = run_cli(*args, f"s3://{s3}/models/stg")
        assert res.exit_code == 2 and "object key 'stg.trtrepo-staging/t1/good/../../../x/config.pbtxt'" in res.output, \
            res.output
    assert _keys(s3, "stg") == [".trtrepo-staging/t1/good/../../../x/config.pbtxt", "/good/config.pbtxt"]  # nothing fixed


def test_a_planted_symlink_is_not_followed_by_snapshot_or_checkout(s3, tmp_path):  # noqa: F811
    """The folder a snapshot or checkout writes into holds a symlink (another local user racing
    on a shared temporary folder): before issue 39 both wrote through it into the victim."""
    victim, before, _outside = _victim(tmp_path)
    _client(s3).put_object(Bucket="models", Key="trap/good/config.pbtxt", Body=_CONFIG.encode())
    url = f"s3://{s3}/models/trap"
    for make in ("snapshot", "checkout"):
        dest = tmp_path / make
        dest.mkdir()
        (dest / "good").symlink_to(victim, target_is_directory=True)
        with pytest.raises(UsageError, match="symlink"):
            if make == "snapshot":
                snapshot(url, dest)
            else:
                checkout(open_store(url), dest)
        assert (victim / "config.pbtxt").read_bytes() == before, make


def test_a_clean_repository_with_folder_markers_still_reads(s3, tmp_path, run_cli):  # noqa: F811
    """Folder markers ("NAME/", as consoles make them) are no hostile keys."""
    c = _client(s3)
    c.put_object(Bucket="models", Key="markers/good/config.pbtxt", Body=_CONFIG.encode())
    c.put_object(Bucket="models", Key="markers/good/", Body=b"")
    c.put_object(Bucket="models", Key="markers/", Body=b"")
    dest = snapshot(f"s3://{s3}/models/markers", tmp_path / "snap")
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["good", "good/config.pbtxt"]


def test_hostile_contents_are_one_line_errors_not_tracebacks(s3, tmp_path, run_cli, monkeypatch):  # noqa: F811
    """A config that is not UTF-8, one larger than a config can be, a version folder named with a
    non-ASCII digit ("²".isdigit() is true) and a lock object that is not a writer's JSON: before
    issue 39 each was a traceback (or a read of the whole object into memory)."""
    from trtrepo import objectstore

    c = _client(s3)
    c.put_object(Bucket="models", Key="binary/m/config.pbtxt", Body=b"\xff\xfe name")
    res = run_cli("repo", "list", f"s3://{s3}/models/binary")  # listed, with the model's problem
    assert res.exit_code == 0 and "problem: " in res.output and "binary/m/config.pbtxt: not UTF-8 text" in res.output, \
        res.output
    res = run_cli("repo", "check", f"s3://{s3}/models/binary")
    assert res.exit_code == 2 and "binary/m/config.pbtxt: not UTF-8 text" in res.output, res.output
    monkeypatch.setattr(objectstore, "MAX_CONFIG_BYTES", 1024)
    c.put_object(Bucket="models", Key="huge/m/config.pbtxt", Body=(_CONFIG + "# " + "x" * 2048 + "\n").encode())
    for args, code in ((("repo", "list"), 0), (("repo", "check"), 2)):
        res = run_cli(*args, f"s3://{s3}/models/huge")
        assert res.exit_code == code and "huge/m/config.pbtxt: " in res.output and "at most 1024 bytes" in res.output, \
            res.output
    monkeypatch.undo()
    c.put_object(Bucket="models", Key="odd/m/config.pbtxt", Body=_CONFIG.replace('"good"', '"m"').encode())
    c.put_object(Bucket="models", Key="odd/m/\u00b2/model.onnx", Body=b"x")
    res = run_cli("repo", "list", f"s3://{s3}/models/odd")
    assert res.exit_code == 0 and "m  [python" in res.output, res.output
    c.put_object(Bucket="models", Key="lockjunk.trtrepo-lock", Body=b"[1]")  # not a writer's lock: taken over
    res = run_cli("repo", "add", _tiny_onnx(tmp_path / "s.onnx"), "--repo", f"s3://{s3}/models/lockjunk", "--name", "m",
                  "--backend", "python")
    assert res.exit_code == 0 and "added m version 1" in res.output, res.output


# --- two writers racing on a model's IO ------------------------------------------------------------


def _wide_onnx(path: Path) -> Path:
    """Other IO than :func:`_tiny_onnx`: input ``x`` of 2 values, output ``z``."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "wide", [x], [z])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _interleaved_add(run_cli, monkeypatch, url: str, mine: tuple[str, ...], theirs: tuple[str, ...]):
    """``repo add *mine`` in this process; between its checkout (and local write, with its checks)
    and its publish, a whole ``repo add *theirs`` in another process publishes first. The real
    code path of both, in the one order that races."""
    from trtrepo import objectstore

    real = objectstore.publish
    other: list[subprocess.CompletedProcess[str]] = []

    def publish_after_the_other_writer(*a, **kw):
        other.append(subprocess.run([sys.executable, "-m", "trtrepo.cli", "repo", "add", *theirs, "--repo", url],
                                    capture_output=True, text=True, timeout=120))
        return real(*a, **kw)

    monkeypatch.setattr(objectstore, "publish", publish_after_the_other_writer)
    res = run_cli("repo", "add", *mine, "--repo", url)
    monkeypatch.setattr(objectstore, "publish", real)
    assert len(other) == 1 and other[0].returncode == 0, other
    return res, other[0]


def test_s3_writers_racing_on_io_end_loadable_or_refused(s3, tmp_path, run_cli, monkeypatch):  # noqa: F811
    """Issue 39 item 3: version 1 serves IO A. One writer adds IO B (default policy: only the
    new version is served); the other adds IO A with ``--version-policy all``, its checkout taken
    before the first published. Before issue 39 both exited 0 and the config served versions 1-3
    with IO A, version 2 being IO B: tritonserver refused the model. Now the second publish
    re-checks against the live config under the lock: refused, and the first change stands. The
    other order is no conflict and both publish."""
    small, wide = _tiny_onnx(tmp_path / "small.onnx"), _wide_onnx(tmp_path / "wide.onnx")
    base = ("--name", "m", "--backend", "python")
    url = f"s3://{s3}/models/race"
    assert run_cli("repo", "add", small, "--repo", url, *base).exit_code == 0
    res, _ = _interleaved_add(run_cli, monkeypatch, url, (str(small), *base, "--version-policy", "all"),
                              (str(wide), *base))
    assert res.exit_code == 2, res.output
    assert "differs from the live config.pbtxt's" in res.output and "older version(s) 1, 2" in res.output, res.output
    live = _config(s3, "race/m/config.pbtxt")  # the other writer's change, loadable: only its version 2 served
    assert [t.name for t in live.output] == ["z"] and list(live.version_policy.specific.versions) == [2]
    assert sorted({k.split("/")[0] for k in _keys(s3, "race/m/")}) == ["1", "2", "config.pbtxt"]
    check = subprocess.run([sys.executable, "-m", "trtrepo.cli", "repo", "check", url], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # no conflict: the other writer makes IO A live again (version 3, the default policy), then this one's IO B
    # (default policy: only its own version served) publishes as version 4
    res, _ = _interleaved_add(run_cli, monkeypatch, url, (str(wide), *base), (str(small), *base))
    assert res.exit_code == 0 and "written as version 4" in res.output, res.output
    live = _config(s3, "race/m/config.pbtxt")
    assert [t.name for t in live.output] == ["z"] and list(live.version_policy.specific.versions) == [4]


# --- TRTREPO_S3_TIMEOUT and the attempts the client makes -------------------------------------------


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-3", "1e9"])
def test_a_timeout_that_is_no_sane_number_of_seconds_is_refused_naming_it(run_cli, monkeypatch, value):
    pytest.importorskip("boto3")
    monkeypatch.setenv("TRTREPO_S3_TIMEOUT", value)
    res = run_cli("repo", "list", "s3://models/x", "--s3-endpoint", "http://127.0.0.1:9")
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"TRTREPO_S3_TIMEOUT={value!r}: expected a positive number of seconds" in lines[0], \
        res.output


def test_the_client_makes_the_attempts_its_message_states(monkeypatch):
    """An endpoint that accepts and never answers: each attempt is one connection. Before issue
    39 botocore's ``max_attempts`` (retries, not attempts) made 3 connections where the message
    said 2."""
    pytest.importorskip("boto3")
    monkeypatch.setenv("TRTREPO_S3_TIMEOUT", "0.5")
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with silent_tcp_server() as (endpoint, held), pytest.raises(UsageError) as err:
        open_store("s3://models/x", endpoint).keys()
    assert len(held) == S3_ATTEMPTS, len(held)
    assert f"did not answer within 0.5 s ({S3_ATTEMPTS} attempts, about {S3_ATTEMPTS * 0.5:g} s in all)" in str(err.value)
