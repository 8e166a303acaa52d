"""Issue 16 items 8-9: resource limits with clear errors, and the error contract: one line naming
the file, key, tensor or option, the documented exit code (``--debug`` adds the traceback but
keeps the code), for each case the adversarial run found."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_tritonserver


def one_line_error(res, *needles: str, code: int = 2) -> str:
    assert res.exit_code == code, (res.output, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_an_npz_holding_a_pickle_names_the_file_and_key(tmp_path, demo_onnx, run_cli):
    bad = tmp_path / "bad.npz"
    np.savez(bad, input=np.zeros((4, 1, 32, 32), np.float32), meta=np.array([{"a": 1}], dtype=object))
    before = bad.read_bytes()
    one_line_error(run_cli("calibrate", demo_onnx, "--data", bad, "--ranges", tmp_path / "r.json"),
                   str(bad), "key 'meta'", "never pickles")
    assert bad.read_bytes() == before and not (tmp_path / "r.json").exists()


def test_an_npz_key_that_is_not_an_input_is_refused(tmp_path, demo_onnx, run_cli):
    data = tmp_path / "x.npz"
    np.savez(data, input=np.zeros((4, 1, 32, 32), np.float32), inptu=np.zeros((4, 1, 32, 32), np.float32))
    one_line_error(run_cli("calibrate", demo_onnx, "--data", data, "--ranges", tmp_path / "r.json"),
                   str(data), "key 'inptu' is not an input of the model (inputs: input")


def test_inf_in_an_input_sample_is_named_where_it_is(tmp_path, demo_onnx, run_cli):
    x = np.random.default_rng(0).standard_normal((16, 1, 32, 32)).astype(np.float32)
    x[5, 0, 3, 3] = np.inf
    np.save(tmp_path / "x.npy", x)
    one_line_error(run_cli("calibrate", demo_onnx, "--data", tmp_path / "x.npy", "--ranges", tmp_path / "r.json"),
                   "input 'input' of sample 5: holds Inf or NaN")


def test_a_decompression_bomb_image_names_the_file(tmp_path, demo_onnx, run_cli):
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.new("1", (15000, 13000)).save(folder / "bomb.png")  # 195 M pixels: twice PIL's limit
    (tmp_path / "pre.json").write_text('{"resize": [32, 32], "color": "gray"}')
    one_line_error(run_cli("calibrate", demo_onnx, "--data", folder, "--preprocess", tmp_path / "pre.json",
                           "--ranges", tmp_path / "r.json"), str(folder / "bomb.png"), "too large to decode safely")


def test_resource_limits_are_usage_errors(tmp_path, demo_onnx, run_cli):
    one_line_error(run_cli("preprocess", "-o", tmp_path / "p.json", "--resize", "100000x100000"),
                   "'resize'", "larger than 16384")
    (tmp_path / "p.json").write_text('{"resize": [100000, 100000]}')
    one_line_error(run_cli("calibrate", demo_onnx, "--data", tmp_path, "--preprocess", tmp_path / "p.json"),
                   "larger than 16384")
    res = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--num-bins", "1000000000")
    assert res.exit_code == 2 and "--num-bins" in res.stderr
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--instance-count", "100000")
    assert res.exit_code == 2 and "--instance-count" in res.stderr and not (tmp_path / "repo").exists()
    one_line_error(run_cli("validate", "--model", "m", "--reference", demo_onnx, "--data", "demo:val",
                           "--concurrency", "1,100000", "--report", tmp_path / "rep"), "--concurrency", "1..1024")
    one_line_error(run_cli("export", "demo", "-o", tmp_path / "d.onnx", "--opset", "999"),
                   "--opset 999", "knows opsets up to")


def test_an_iterable_callable_is_read_lazily_up_to_limit(tmp_path, demo_onnx, run_cli, monkeypatch):
    """An endless generator: --limit stops reading it (before, it was read in full first)."""
    (tmp_path / "endless_data.py").write_text(textwrap.dedent('''
        import itertools
        import numpy as np

        def samples():
            rng = np.random.default_rng(0)
            for _ in itertools.count():
                yield rng.standard_normal((1, 32, 32)).astype(np.float32)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.monotonic()
    res = run_cli("calibrate", demo_onnx, "--data", "endless_data:samples", "--limit", "16", "--ranges", tmp_path / "r.json",
                  "--no-progress")
    assert res.exit_code == 0, res.stderr
    assert "on 16 samples" in res.output and time.monotonic() - started < 60


def test_yaml_and_torch_errors_are_one_line(tmp_path, demo_onnx, run_cli):
    (tmp_path / "pre.yaml").write_text("resize: [32, 32\nmean: {a: [\n")
    one_line_error(run_cli("calibrate", demo_onnx, "--data", tmp_path, "--preprocess", tmp_path / "pre.yaml"),
                   str(tmp_path / "pre.yaml"), "cannot parse preprocessing file")
    (tmp_path / "w.pt").write_bytes(b"PK\x03\x04 this is not a torch file" * 10)
    (tmp_path / "m.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(4, 2)\n")
    res = subprocess.run([sys.executable, "-m", "trtrepo.cli", "export", "m:build", "--weights", "w.pt",
                          "--input-shape", "4", "-o", "m.onnx"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "w.pt: cannot read state dict" in res.stderr


def test_debug_adds_the_traceback_and_keeps_the_exit_code(tmp_path):
    res = subprocess.run([sys.executable, "-m", "trtrepo.cli", "--debug", "calibrate", str(tmp_path / "missing.onnx"),
                          "--data", "demo:calib"], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert "Traceback (most recent call last)" in res.stderr and "missing.onnx" in res.stderr.strip().splitlines()[-1]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@requires_tritonserver
@pytest.mark.triton
@pytest.mark.slow
def test_a_server_that_dies_during_validate_is_exit_2(tmp_path, run_cli):
    """Issue 16 item 9: a dropped connection mid-run exited 1 (documented: 2, like an unreachable server)."""
    from trtrepo.server import TritonServer

    repo = tmp_path / "repo"
    assert run_cli("deploy", "--repo", repo, "--backend", "python", "--precision", "fp32").exit_code == 0
    server = TritonServer(repo, timeout=120).start()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "trtrepo.cli", "validate", "--url", server.grpc_url, "--model", "demo",
                                 "--reference", "demo", "--data", "demo:val", "--limit", "64", "--no-accuracy",
                                 "--no-reference-speed", "--concurrency", "4", "--duration", "120", "--warmup", "0",
                                 "--no-progress", "--report", str(tmp_path / "rep")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(8)
    finally:
        server.stop(grace=0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    assert "lost the connection to the server" in err or "cannot reach" in err, err


def test_a_template_dir_template_runs_sandboxed(tmp_path, demo_onnx, run_cli):
    """Issue 16 item 10: a --template-dir template ran os.system."""
    from trtrepo.tritonconfig import shipped_templates_dir

    tdir = tmp_path / "templates"
    tdir.mkdir()
    evil = (shipped_templates_dir() / "onnxruntime.pbtxt.j2").read_text()
    marker = tmp_path / "pwned"
    evil += ("{{ m.__class__.__init__.__globals__['__builtins__']['__import__']('os').system('touch " + str(marker)
             + "') }}\n")
    (tdir / "onnxruntime.pbtxt.j2").write_text(evil)
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir)
    one_line_error(res, "refused by the sandbox")
    assert not marker.exists() and not (tmp_path / "repo" / "d").exists()


def test_a_template_that_changes_the_contract_is_caught_after_parsing(tmp_path, demo_onnx, run_cli):
    """A template that skips escaping or edits a value: the parsed config no longer says what
    Python decided, and nothing is written."""
    from trtrepo.tritonconfig import shipped_templates_dir

    tdir = tmp_path / "templates"
    tdir.mkdir()
    text = (shipped_templates_dir() / "onnxruntime.pbtxt.j2").read_text()
    (tdir / "onnxruntime.pbtxt.j2").write_text(text.replace("{{ c.header(m) }}",
                                                                  "{{ c.header(m) | replace('size: 32', 'size: 8') }}"))
    assert "size: 8" in (tdir / "onnxruntime.pbtxt.j2").read_text()
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir,
                  "--no-dynamic-batching")
    assert res.exit_code == 2, res.output
    assert "changed 'max_batch_size' to 8 (trtrepo decided 32)" in res.stderr and not (tmp_path / "repo" / "d").exists()


# --- issue 28 item 6: --template-dir reads only its own files; templates decide no value ---------


def _template_dir(tmp_path, text: str | None = None):
    from trtrepo.tritonconfig import shipped_templates_dir

    tdir = tmp_path / "templates"
    tdir.mkdir(exist_ok=True)
    shipped = (shipped_templates_dir() / "onnxruntime.pbtxt.j2").read_text()
    (tdir / "onnxruntime.pbtxt.j2").write_text(shipped if text is None else text(shipped))
    return tdir


def test_a_symlink_in_the_template_dir_is_refused_and_nothing_is_written(tmp_path, demo_onnx, run_cli):
    """A template folder whose template is a symlink to a host file wrote that file's content into
    config.pbtxt: a link (to a file or a folder) is refused, naming it."""
    secret = tmp_path / "host-secret.txt"
    secret.write_text('name: "stolen-credentials"\n')
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "onnxruntime.pbtxt.j2").symlink_to(secret)
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir)
    one_line_error(res, "onnxruntime.pbtxt.j2 is a symlink or leaves the folder")
    assert not (tmp_path / "repo" / "d").exists()
    # a macro file linked in is refused the same way; the folder's own files still work
    (tdir / "onnxruntime.pbtxt.j2").unlink()
    _template_dir(tmp_path, lambda t: t.replace("# Generated by trtrepo", "# my layout; generated by trtrepo"))
    (tdir / "_macros.j2").symlink_to(secret)
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir)
    one_line_error(res, "_macros.j2 is a symlink or leaves the folder")
    (tdir / "_macros.j2").unlink()
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "repo" / "d" / "config.pbtxt").read_text().startswith("# my layout")


@pytest.mark.parametrize("case", ["parameter injection", "dropped dynamic batching", "more instances"])
def test_a_template_that_decides_a_value_is_refused(tmp_path, demo_onnx, run_cli, case):
    """The rendered config is compared with what trtrepo decided for every field, not only IO:
    a template without escaping that lets --parameter inject fields, one that drops a section,
    one that edits an instance count."""
    args: list = []
    if case == "parameter injection":
        tdir = _template_dir(tmp_path, lambda t: t.replace("{{- c.parameters(m) }}", "{%- for k, v in m.parameters %}\n"
                                                           'parameters { key: "{{ k }}" value: { string_value: "{{ v }}" } }'
                                                           "\n{%- endfor %}"))
        args = ["--parameter", 'x=y" } } response_cache { enable: true } instance_group [ { count: 64 kind: KIND_CPU } ] '
                'parameters { key: "z" value: { string_value: "w']
        want = "changed 'instance_group' to [{'count': 1}, {'count': 64"  # the first injected field
    elif case == "dropped dynamic batching":
        tdir = _template_dir(tmp_path, lambda t: t.replace("{{- c.dynamic_batching(m) }}", ""))
        want = "dropped 'dynamic_batching'"
    else:
        tdir = _template_dir(tmp_path, lambda t: t.replace("{{- c.instance_group(m) }}",
                                                           "\ninstance_group [ { count: 64 kind: KIND_CPU } ]"))
        want = "changed 'instance_group[0].count' to 64 (trtrepo decided 1)"
    res = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--template-dir", tdir, *args)
    one_line_error(res, want)
    assert not (tmp_path / "repo" / "d").exists()
