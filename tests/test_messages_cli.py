"""Issue 39 items 6 and 8: odd values given to the CLI, the way a careless colleague or an
attacker gives them, are one line naming the option, file or variable at fault, with the
documented exit code and no Python exception name: no host in ``--url``, one port for two
listeners, a ``$TRTREPO_TRITONSERVER`` that is no program, names longer than the filesystem
takes, an output below a regular file, a full disk, empty paths, ... (real CLI, in-process; each
case printed a traceback, an exception name or did something else before)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

# what a message must not show: a traceback, a Python exception name, an errno
PYTHON_NAMES = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception)\b|Errno|\bKeyboardInterrupt\b")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """y = x @ W (x: [batch, 4]) and 16 samples of x."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder = tmp_path_factory.mktemp("tiny")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                              [numpy_helper.from_array(np.eye(4, dtype=np.float32), "W")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "tiny.onnx"))
    np.savez(folder / "x.npz", x=np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    return folder / "tiny.onnx", folder / "x.npz"


def _program(path: Path, text: str = "#!/bin/sh\nexit 3\n", mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _free_port() -> int:
    from trtrepo.server import free_port

    return free_port()


@contextlib.contextmanager
def _full_disk(tmp_path: Path):
    """A folder on a 4 KiB tmpfs, filled up: a real full disk under the real write path (mounting
    needs root, as in .ci/run)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)],
                                           capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with open(mnt / ".filler", "wb", buffering=0) as f, contextlib.suppress(OSError):  # every block taken
            while True:
                f.write(b"\0" * 512)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _name_max(folder: Path) -> int:
    return int(os.pathconf(folder, "PC_NAME_MAX"))


# Each case: (tmp_path, tiny model, its samples, monkeypatch) -> (argv, exit code, the things the
# one line names); a case may also return a check run after the command (nothing written, ...).
def _url_without_host(t, model, data, mp):
    return ["validate", "--url", "http://", "--model", "m", "--reference", model, "--data", data], 2, \
        ["--url 'http://'", "no host"]


def _blank_url(t, model, data, mp):
    return ["validate", "--url", "  ", "--model", "m", "--reference", model, "--data", data], 2, ["--url '  '", "no host"]


def _one_port_twice(t, model, data, mp):
    (t / "repo").mkdir()
    port = _free_port()
    return ["serve", t / "repo", "--server-binary", _program(t / "fake-tritonserver"), "--http-port", port,
            "--grpc-port", port], 2, [f"--http-port and --grpc-port are both {port}"]


def _server_variable_not_a_program(t, model, data, mp):
    (t / "repo").mkdir()
    not_a_program = _program(t / "passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
    mp.setenv("TRTREPO_TRITONSERVER", str(not_a_program))
    return ["serve", t / "repo"], 2, [f"$TRTREPO_TRITONSERVER {not_a_program}", "not an executable file"]


def _server_binary_of_another_format(t, model, data, mp):
    (t / "repo").mkdir()
    text = _program(t / "text", "this is no program\n")  # executable bit, but the kernel cannot run it
    return ["serve", t / "repo", "--server-binary", text], 2, [f"tritonserver {text}: cannot be run"]


def _host_not_here(t, model, data, mp):
    (t / "repo").mkdir()
    return ["serve", t / "repo", "--server-binary", _program(t / "fake-tritonserver"), "--host", "192.0.2.1"], 2, \
        ["--host 192.0.2.1: cannot listen there"]


def _serve_timeout_nan(t, model, data, mp):
    (t / "repo").mkdir()
    return ["serve", t / "repo", "--server-binary", _program(t / "fake-tritonserver"), "--timeout", "nan"], 2, \
        ["--timeout nan"]


def _long_repository_name(t, model, data, mp):
    repo = t / ("a" * 240)
    limit = _name_max(t) - len("..trtrepo-staging")

    def nothing_made():
        assert not repo.exists()

    return ["repo", "add", model, "--repo", repo, "--name", "m"], 2, \
        [f"repository {repo}", "is 240 bytes long", f"at most {limit} bytes"], nothing_made


def _long_output_name(t, model, data, mp):
    out = t / ("b" * (_name_max(t) + 1) + ".onnx")
    return ["export", model, "-o", out], 2, [f"is {_name_max(t) + 6} bytes long", f"at most {_name_max(t)} bytes"]


def _output_below_a_file(t, model, data, mp):
    (t / "afile").write_text("x\n")
    return ["export", model, "-o", t / "afile" / "x.onnx"], 2, [f"{t / 'afile' / 'x.onnx'}: cannot write it",
                                                               f"{t / 'afile'} is a file, not a folder"]


def _workdir_below_a_file(t, model, data, mp):
    (t / "afile").write_text("x\n")
    return ["deploy", model, "--repo", t / "repo", "--precision", "fp32", "--backend", "onnxruntime", "--workdir",
            t / "afile" / "sub"], 2, [f"{t / 'afile' / 'sub'}: Not a directory"]


def _empty_repo(t, model, data, mp):
    mp.chdir(t)

    def nothing_made():
        assert sorted(p.name for p in t.iterdir()) == []

    return ["repo", "add", model, "--repo", "", "--name", "m"], 2, ["--repo ''", "an empty path"], nothing_made


def _empty_output(t, model, data, mp):
    mp.chdir(t)
    return ["export", model, "-o", ""], 2, ["--output ''", "an empty path"]


def _repository_path_not_utf8(t, model, data, mp):
    repo = t / os.fsdecode(b"r\xff")
    return ["repo", "add", model, "--repo", repo, "--name", "m"], 2, ["repository", "not valid UTF-8"]


def _preprocessing_not_json(t, model, data, mp):
    (t / "pre.json").write_bytes(b"\xff\xfe{")
    return ["deploy", model, "--repo", t / "repo", "--ensemble", "--preprocess", t / "pre.json"], 2, \
        [f"{t / 'pre.json'}: cannot parse preprocessing file (not JSON"]


def _model_not_onnx(t, model, data, mp):
    (t / "m.onnx").write_bytes(b"\x0a\xff\xff\xff\xff")
    return ["calibrate", t / "m.onnx", "--data", data], 2, [f"{t / 'm.onnx'}: not a readable ONNX model"]


def _huge_input_shape(t, model, data, mp):
    return ["export", "demo", "-o", t / "d.onnx", "--input-shape", "input:99999999999x1x32x32"], 2, \
        ["--input-shape 'input:99999999999x1x32x32'", "at most 134217728"]


CASES = {
    "validate --url without a host": _url_without_host,
    "validate --url of blanks": _blank_url,
    "serve with one port twice": _one_port_twice,
    "TRTREPO_TRITONSERVER not executable": _server_variable_not_a_program,
    "--server-binary the kernel cannot run": _server_binary_of_another_format,
    "serve --host not of this machine": _host_not_here,
    "serve --timeout nan": _serve_timeout_nan,
    "repository name beyond the filesystem's limit": _long_repository_name,
    "output name beyond the filesystem's limit": _long_output_name,
    "-o below a regular file": _output_below_a_file,
    "--workdir below a regular file": _workdir_below_a_file,
    "empty --repo": _empty_repo,
    "empty -o": _empty_output,
    "repository path not UTF-8": _repository_path_not_utf8,
    "preprocessing file not JSON": _preprocessing_not_json,
    "a model file that is not ONNX": _model_not_onnx,
    "export --input-shape beyond memory": _huge_input_shape,
}


def _one_line(res, code: int, needles) -> str:
    out = (res.stdout + res.stderr).strip()
    assert not PYTHON_NAMES.search(out), out
    lines = out.splitlines()
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("error: "), (res.exit_code, out)
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_an_odd_value_is_one_line_naming_what_is_at_fault(tmp_path, tiny, run_cli, monkeypatch, case):
    args, code, needles, *after = CASES[case](tmp_path, *tiny, monkeypatch)
    _one_line(run_cli(*args), code, needles)
    for check in after:
        check()


def test_a_full_disk_while_writing_ranges_names_the_file(tmp_path, tiny, run_cli):
    """ENOSPC during the --ranges write: exit 1, the path named, no partial file, nothing else touched."""
    model, data = tiny
    with _full_disk(tmp_path) as full:
        res = run_cli("calibrate", model, "--data", data, "--method", "minmax", "--ranges", full / "ranges.json")
        left = sorted(p.name for p in full.iterdir() if p.name != ".filler")
    _one_line(res, 1, [f"{full / 'ranges.json'}: cannot write it (No space left on device)"])
    assert left == []
