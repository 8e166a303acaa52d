"""Issue 27 item 6: ``validate --reference pkg.mod:build`` exports the reference once. The export
(which gives the reference's IO contract) is cached under ``$TRTREPO_CACHE_DIR/reference`` by the
content of the source's files and weights; a changed module or weights file exports again,
``--no-cache`` bypasses the cache. The factory counts its calls in a file beside it, so each test
sees how many times the model was built (one build per export, one per accuracy reference)."""

from __future__ import annotations

import importlib
import json
import logging
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from trtrepo.export import resolve_source
from trtrepo.validate import reference_io
from trtrepo.validate.reference import cache_dir, export_reference, reference_key

MODULE = textwrap.dedent("""
    from pathlib import Path

    import torch
    from torch import nn

    WIDTH = {width}

    def build():
        with open(Path(__file__).with_name("builds.txt"), "a") as f:
            f.write("build\\n")
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, WIDTH))
""")


def _write_module(folder: Path, width: int) -> None:
    (folder / "refcache_model.py").write_text(MODULE.format(width=width))
    sys.modules.pop("refcache_model", None)  # what a new trtrepo process would import
    importlib.invalidate_caches()


def _builds(folder: Path) -> int:
    f = folder / "builds.txt"
    return len(f.read_text().splitlines()) if f.is_file() else 0


def _entries() -> list[Path]:
    return sorted(cache_dir().glob("*.onnx")) if cache_dir().is_dir() else []


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    folder = tmp_path / "src"
    folder.mkdir()
    _write_module(folder, 3)
    monkeypatch.setenv("TRTREPO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    # The module is rewritten within the same second at the same size: a cached .pyc would still
    # pass Python's mtime-and-size check and bring back the old content.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    yield folder
    sys.modules.pop("refcache_model", None)


def test_cache_dir_follows_the_documented_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("TRTREPO_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c" / "reference"
    monkeypatch.delenv("TRTREPO_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "trtrepo" / "reference"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "trtrepo" / "reference"


def test_second_export_comes_from_the_cache_and_a_changed_module_exports_again(model_dir, caplog):
    caplog.set_level(logging.INFO, logger="trtrepo")
    io = reference_io("refcache_model:build", input_shapes=("6",))
    assert [t.shape for t in io.outputs] == [(-1, 3)] and _builds(model_dir) == 1
    [entry] = _entries()
    meta = json.loads(entry.with_suffix(".json").read_text())
    assert meta["parts"]["source"] == {"kind": "entry_point", "location": "refcache_model:build"}
    stamp = entry.stat().st_mtime_ns

    # again: no build, no export; the same IO from the same, untouched entry
    caplog.clear()
    again = reference_io("refcache_model:build", input_shapes=("6",))
    assert again.to_dict() == io.to_dict() and _builds(model_dir) == 1
    assert _entries() == [entry] and entry.stat().st_mtime_ns == stamp
    assert "reference export from the cache" in caplog.text

    # --no-cache: exported afresh, the cache neither read nor written
    reference_io("refcache_model:build", input_shapes=("6",), cache=False)
    assert _builds(model_dir) == 2 and _entries() == [entry] and entry.stat().st_mtime_ns == stamp

    # other export inputs are another key
    other = reference_io("refcache_model:build", input_shapes=("input:6",), output_names=("scores",))
    assert other.output_names == ["scores"] and _builds(model_dir) == 3

    # the module's content changed (4 outputs now): exported again, the IO is the new one, and the
    # source's older entries are gone
    _write_module(model_dir, 4)
    io4 = reference_io("refcache_model:build", input_shapes=("6",))
    assert [t.shape for t in io4.outputs] == [(-1, 4)] and _builds(model_dir) == 4
    [new_entry] = _entries()
    assert new_entry != entry and not entry.exists() and not entry.with_suffix(".json").exists()
    reference_io("refcache_model:build", input_shapes=("6",))
    assert _builds(model_dir) == 4  # and that one is reused in turn


def test_changed_weights_export_again(model_dir):
    torch.manual_seed(1)
    state = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).state_dict()
    torch.save(state, model_dir / "w.pt")
    src = resolve_source("refcache_model:build", model_dir / "w.pt")
    first = export_reference(src, inputs=_inputs())
    assert not first.from_cache and first.path is not None and _builds(model_dir) == 1
    assert export_reference(src, inputs=_inputs()).from_cache and _builds(model_dir) == 1
    state["0.weight"] += 1.0
    torch.save(state, model_dir / "w.pt")
    assert not export_reference(src, inputs=_inputs()).from_cache and _builds(model_dir) == 2


def test_key_covers_sibling_files_but_not_other_data(model_dir):
    src = resolve_source("refcache_model:build")
    key = reference_key(src, inputs=_inputs(), dynamic_axes=None, output_names=None)
    assert key is not None
    (model_dir / "notes.txt").write_text("not part of the model")
    np.save(model_dir / "data.npy", np.zeros(3))
    assert reference_key(src, inputs=_inputs(), dynamic_axes=None, output_names=None)[0] == key[0]
    (model_dir / "layers.py").write_text("# a helper module the factory may import\n")
    assert reference_key(src, inputs=_inputs(), dynamic_axes=None, output_names=None)[0] != key[0]


def test_unreadable_entry_is_exported_again(model_dir):
    src = resolve_source("refcache_model:build")
    entry = export_reference(src, inputs=_inputs()).path
    entry.write_bytes(b"not an onnx model")
    again = export_reference(src, inputs=_inputs())
    assert not again.from_cache and _builds(model_dir) == 2
    assert [t.shape for t in again.io.outputs] == [(-1, 3)]
    assert export_reference(src, inputs=_inputs()).from_cache  # the entry was rewritten


def test_unwritable_cache_only_costs_the_reuse(model_dir, monkeypatch, caplog):
    blocker = model_dir / "blocker"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("TRTREPO_CACHE_DIR", str(blocker))
    caplog.set_level(logging.WARNING, logger="trtrepo")
    res = export_reference(resolve_source("refcache_model:build"), inputs=_inputs())
    assert [t.shape for t in res.io.outputs] == [(-1, 3)] and res.path is None
    assert "cannot write the reference cache" in caplog.text


def _inputs():
    from trtrepo.export import InputShape

    return [InputShape("input", (6,))]


# --------------------------------------------------------------------------------------------
# The CLI


def test_cli_no_server_still_caches_the_reference(run_cli, model_dir):
    """The reference's IO comes before the server is reached: the run fails (exit 2, no server)
    after caching the export, and the next one reuses it; --no-cache leaves the entry alone."""
    from trtrepo.server import free_port

    args = ("validate", "--url", f"127.0.0.1:{free_port()}", "--model", "m", "--reference", "refcache_model:build",
            "--input-shape", "6", "--data", _data(model_dir), "--ready-timeout", "0.5", "--no-progress")
    r = run_cli(*args)
    assert r.exit_code == 2 and "cannot reach Triton" in r.stderr
    [entry] = _entries()
    stamp, builds = entry.stat().st_mtime_ns, _builds(model_dir)
    assert builds == 1
    assert run_cli(*args).exit_code == 2 and _builds(model_dir) == builds and entry.stat().st_mtime_ns == stamp
    assert run_cli(*args, "--no-cache").exit_code == 2 and _builds(model_dir) == builds + 1
    assert _entries() == [entry] and entry.stat().st_mtime_ns == stamp


def _data(folder: Path) -> Path:
    path = folder / "x.npy"
    if not path.is_file():
        np.save(path, np.random.default_rng(0).standard_normal((24, 6)).astype(np.float32))
    return path


@pytest.mark.triton
def test_validate_against_a_real_server_exports_the_reference_once(run_cli, model_dir, triton_server, caplog):
    from trtrepo.export import export_onnx
    from trtrepo.repository import add_onnx_model
    from trtrepo.server import find_python_env
    from trtrepo.tritonconfig import ModelOptions

    env = find_python_env()
    if env is None:
        pytest.skip("no numpy<2 environment for the Python backend (run scripts/install_tritonserver.sh)")
    served = export_onnx("refcache_model:build", model_dir.parent / "served.onnx", inputs=_inputs()).path
    repo = model_dir.parent / "repo"
    add_onnx_model(repo, "refcache", served, backend="python", options=ModelOptions(execution_env=str(env)))
    server = triton_server(repo)
    args = ("-v", "validate", "--url", server.grpc_url, "--model", "refcache", "--reference", "refcache_model:build",
            "--data", _data(model_dir), "--no-latency", "--no-progress", "--min-cosine", "0.9999")

    def validate(*extra):
        before = _builds(model_dir)
        caplog.clear()
        r = run_cli(*args, *extra)
        assert r.exit_code == 0, r.output + r.stderr
        assert "contract ok" in r.output
        return _builds(model_dir) - before

    assert validate() == 2  # exported (inputs read off the data), then built again as the accuracy reference
    [entry] = _entries()
    stamp = entry.stat().st_mtime_ns
    assert validate() == 1  # the accuracy reference only: the export came from the cache
    assert "reference export from the cache" in caplog.text and entry.stat().st_mtime_ns == stamp
    assert validate("--no-cache") == 2 and "from the cache" not in caplog.text
    assert _entries() == [entry] and entry.stat().st_mtime_ns == stamp
