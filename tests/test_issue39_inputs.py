"""Issue 39 item 4: a model folder or a template folder cannot carry what trtrepo did not decide
into a repository. External weight data reached through a link (a key beside the model) is
refused by ``repo add`` as ``export`` refuses it (one check, ``modelio.external_data_path``); a
``--template-dir`` holding only ``_macros.j2`` is held to "templates decide nothing" like one
holding the backend's template (real CLI, in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


def _external_model(folder: Path, location: str = "w.bin") -> Path:
    """y = x @ W, W's data in ``location`` beside the model."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(np.ones((16, 4), np.float32), "W")])
    (folder / location).parent.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0)
    return path


def _one_line(res, *needles: str, code: int = 2) -> str:
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, res.stderr)
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize("link", ["symlink to a file", "symlinked folder", "hard link"])
def test_repo_add_refuses_external_data_reached_through_a_link(tmp_path, run_cli, link):
    """Before: the host file a link in the model folder pointed at was copied into the version
    folder (and onto S3) as the model's weights; export refused it. Now repo add refuses it the
    same way, names the file, and writes nothing; export gives the same line."""
    secret = tmp_path / "host" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(b"TOP-SECRET-KEY-MATERIAL" * 12)  # more bytes than W needs
    src = tmp_path / "src"
    if link == "symlinked folder":
        model = _external_model(src, "weights/w.bin")
        (src / "weights" / "w.bin").unlink()
        (src / "weights").rmdir()
        (secret.parent / "w.bin").write_bytes(secret.read_bytes())
        (src / "weights").symlink_to(secret.parent)
        want = f"{src / 'weights' / 'w.bin'} is reached through the symbolic link {src / 'weights'}"
    else:
        model = _external_model(src)
        (src / "w.bin").unlink()
        if link == "hard link":
            os.link(secret, src / "w.bin")
            want = f"{src / 'w.bin'} has 2 hard links"
        else:
            (src / "w.bin").symlink_to(secret)
            want = f"{src / 'w.bin'} is a symbolic link"
    repo = tmp_path / "repo"
    line = _one_line(run_cli("repo", "add", model, "--repo", repo, "--name", "m"), f"{model}: its external data file",
                     want)
    assert not (repo / "m").exists() and not any(p.is_file() and b"SECRET" in p.read_bytes() for p in tmp_path.rglob("*")
                                                   if repo in p.parents)
    assert _one_line(run_cli("export", model, "-o", tmp_path / "out.onnx")) == line
    assert not (tmp_path / "out.onnx").exists()


def test_repo_add_still_copies_external_data_kept_in_the_model_folder(tmp_path, run_cli):
    model = _external_model(tmp_path / "src", "weights/w.bin")
    res = run_cli("repo", "add", model, "--repo", tmp_path / "repo", "--name", "m")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "repo" / "m" / "1" / "weights" / "w.bin").read_bytes() == (tmp_path / "src" / "weights" / "w.bin").read_bytes()


def _macros_only(tmp_path: Path, edit) -> Path:
    from trtrepo.tritonconfig import shipped_templates_dir

    tdir = tmp_path / "templates"
    tdir.mkdir()
    text = (shipped_templates_dir() / "_macros.j2").read_text()
    edited = edit(text)
    assert edited != text
    (tdir / "_macros.j2").write_text(edited)
    return tdir


@pytest.mark.parametrize("command", ["repo add", "deploy"])
@pytest.mark.parametrize("case", ["response cache", "instance count"])
def test_a_template_dir_holding_only_macros_decides_nothing(tmp_path, demo_onnx, run_cli, command, case):
    """Before: the "templates decide nothing" check ran only when the folder held the backend's
    template, so a folder with a lone _macros.j2 turned the response cache on or changed instance
    counts unnoticed, through repo add and deploy alike."""
    if case == "response cache":
        tdir = _macros_only(tmp_path, lambda t: t.replace("{%- macro dynamic_batching(m) %}",
                                                          "{%- macro dynamic_batching(m) %}\nresponse_cache { enable: true }", 1))
        want = "added 'response_cache' ({'enable': True})"
    else:
        tdir = _macros_only(tmp_path, lambda t: t.replace("{%- macro instance_group(m) %}",
                                                          "{%- macro instance_group(m) %}\ninstance_group [ { count: 64 "
                                                          "kind: KIND_CPU } ]\n{%- endmacro %}\n{%- macro unused(m) %}", 1))
        want = "changed 'instance_group[0].count' to 64 (trtrepo decided 1)"
    repo = tmp_path / "repo"
    if command == "repo add":
        res = run_cli("repo", "add", demo_onnx, "--repo", repo, "--name", "d", "--template-dir", tdir)
    else:
        res = run_cli("deploy", demo_onnx, "--repo", repo, "--name", "d", "--precision", "fp32", "--backend", "onnxruntime",
                      "--template-dir", tdir)
    _one_line(res, f"--template-dir {tdir}", want)
    assert not (repo / "d").exists()


def test_a_macros_only_template_dir_that_only_lays_out_is_used(tmp_path, demo_onnx, run_cli):
    tdir = _macros_only(tmp_path, lambda t: t.replace("{%- macro header(m) -%}", "{%- macro header(m) -%}\n# my layout", 1))
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir)
    assert res.exit_code == 0, res.output
    assert "# my layout" in (tmp_path / "repo" / "d" / "config.pbtxt").read_text()
