"""Issue 16: a property-based suite of bad inputs over the commands' options, data files, caches,
templates and model names. For every generated case: exit code 0 or the documented 2 (never 1
from an unexpected exception, never a traceback), a non-zero exit prints one line starting with
``error:``, and no input file changes. The number of cases run is printed at the end of the test
session (``bad-input cases``); CI runs at least 1,000."""

from __future__ import annotations

import hashlib
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtrepo.cli import cli

COUNTS = {"cases": 0, "tracebacks": 0, "wrong_exit": 0, "modified": 0}
def fast(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                    database=None)


@pytest.fixture(scope="module")
def world(tmp_path_factory, demo_onnx):
    """Valid inputs every case starts from (and must leave unchanged)."""
    from click.testing import CliRunner

    root = tmp_path_factory.mktemp("fuzz")
    shutil.copy(demo_onnx, root / "model.onnx")
    np.save(root / "x.npy", np.random.default_rng(0).standard_normal((4, 1, 32, 32)).astype(np.float32))
    res = CliRunner().invoke(cli, ["calibrate", str(root / "model.onnx"), "--data", str(root / "x.npy"),
                                   "--ranges", str(root / "r.json"), "--cache", str(root / "c.cache"), "--no-progress"])
    assert res.exit_code == 0, res.output
    (root / "pre.json").write_text('{"resize": [32, 32], "color": "gray"}\n')
    (root / "labels.txt").write_text("\n".join(str(i) for i in range(10)) + "\n")
    return root


def fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.iterdir()) if p.is_file()}


def run_case(world: Path, args: list[str]) -> None:
    from click.testing import CliRunner

    before = fingerprint(world)
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    COUNTS["cases"] += 1
    err = res.stderr.strip()
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        COUNTS["tracebacks"] += 1
        raise AssertionError(f"{args}: uncaught {type(res.exception).__name__}: {res.exception}")
    if res.exit_code not in (0, 2) or "--debug for the traceback" in err:
        COUNTS["wrong_exit"] += 1
        raise AssertionError(f"{args}: exit {res.exit_code}: {err[-500:]}")
    if res.exit_code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    after = fingerprint(world)
    if after != before:
        COUNTS["modified"] += 1
        raise AssertionError(f"{args}: changed inputs {sorted(k for k in before if before[k] != after.get(k))}")


# --------------------------------------------------------------------------------------------
# Options

JUNK = st.one_of(
    st.text(alphabet=string.printable, max_size=24),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "-1", "0", "1e400", "nan", "inf", "x", "1x0x3", "a:b:c", "../../etc/passwd", "latest:0",
                     "specific:", "top1=200", "cosine=2", "9223372036854775808", "1,,2", ":", "NAME:", "0x3x3"]),
)

OPTIONS = {  # command line (before the fuzzed option) -> options to fuzz
    "quantize": (["quantize", "{w}/model.onnx", "--ranges", "{w}/r.json", "-o", "{o}/q.onnx"],
                 ["--target", "--exclude-op", "--exclude-node", "--smooth-quant", "--metric-output", "--batch-size",
                  "--threads"]),
    "calibrate": (["calibrate", "{w}/model.onnx", "--data", "{w}/x.npy", "--ranges", "{o}/r.json", "--no-progress"],
                  ["--method", "--percentile", "--num-bins", "--limit", "--seed", "--batch-size", "--trt-version",
                   "--memory-budget-mb", "--cache-algorithm"]),
    "repo add": (["repo", "add", "{w}/model.onnx", "--repo", "{o}/repo", "--name", "m"],
                 ["--max-batch-size", "--preferred-batch-size", "--max-queue-delay", "--instance-kind", "--instance-count",
                  "--gpus", "--version-policy", "--parameter", "--version", "--intra-op-threads", "--backend",
                  "--label-output", "--target-tensorrt", "--target-cc"]),
    "preprocess": (["preprocess", "-o", "{o}/p.json"],
                   ["--resize", "--center-crop", "--interpolation", "--color", "--scale", "--mean", "--std", "--layout",
                    "--dtype", "--input-name"]),
    "validate": (["validate", "--model", "m", "--reference", "{w}/model.onnx", "--data", "{w}/x.npy", "--report",
                  "{o}/rep", "--url", "127.0.0.1:9", "--ready-timeout", "0.2"],
                 ["--url", "--protocol", "--concurrency", "--requests", "--duration", "--batch-size", "--shared-memory",
                  "--max-top1-drop", "--min-cosine", "--max-p99-ms", "--timeout", "--limit"]),
}


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@fast(450)
@given(data=st.data())
def test_fuzzed_options(world, tmp_path_factory, data):
    command = data.draw(st.sampled_from(sorted(OPTIONS)))
    base, options = OPTIONS[command]
    option = data.draw(st.sampled_from(options))
    value = data.draw(JUNK)
    out = tmp_path_factory.mktemp("o")
    run_case(world, [a.format(w=world, o=out) for a in base] + [option, value])


# --------------------------------------------------------------------------------------------
# Data files, preprocessing files, labels


@fast(200)
@given(data=st.data())
def test_fuzzed_data_and_preprocessing_files(world, tmp_path_factory, data):
    out = tmp_path_factory.mktemp("d")
    kind = data.draw(st.sampled_from(["npy-bytes", "npz-bytes", "npy-array", "npz-keys", "pre-json", "pre-yaml",
                                      "labels"]))
    args = ["calibrate", world / "model.onnx", "--ranges", out / "r.json", "--no-progress", "--limit", "4"]
    if kind in ("npy-bytes", "npz-bytes"):
        f = out / f"x.{kind[:3]}"
        f.write_bytes(data.draw(st.binary(max_size=256)))
        args += ["--data", f]
    elif kind == "npy-array":
        dtype = data.draw(st.sampled_from(["float32", "float64", "int8", "uint8", "bool", "float16", "complex64"]))
        shape = data.draw(st.lists(st.integers(0, 40), min_size=0, max_size=5))
        arr = np.zeros(shape, dtype=dtype)
        if arr.size and dtype.startswith("float"):
            arr.flat[data.draw(st.integers(0, arr.size - 1))] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e30]))
        np.save(out / "x.npy", arr)
        args += ["--data", out / "x.npy"]
    elif kind == "npz-keys":
        keys = data.draw(st.lists(st.text(alphabet=string.ascii_letters + "_/.", min_size=1, max_size=8), min_size=1,
                                  max_size=3, unique=True))
        arrays = {k.replace("/", "_"): np.zeros((2, 1, 32, 32), np.float32) for k in keys}
        np.savez(out / "x.npz", **arrays)
        args += ["--data", out / "x.npz"]
    elif kind in ("pre-json", "pre-yaml"):
        suffix = ".json" if kind == "pre-json" else ".yaml"
        text = data.draw(st.one_of(st.text(max_size=120), st.builds(
            lambda k, v: f'{{"{k}": {v}}}',
            st.sampled_from(["resize", "center_crop", "mean", "std", "scale", "color", "layout", "dtype", "bogus",
                             "interpolation"]),
            st.sampled_from(["[100000, 100000]", "0", "-1", "[]", "null", '"x"', "[1, 2, 3, 4]", "1e999", '"gray"',
                             "{}", "[0.5]"]))))
        (out / f"pre{suffix}").write_text(text)
        folder = out / "imgs"
        folder.mkdir()
        from PIL import Image

        Image.new("L", (8, 8)).save(folder / "a.png")
        args += ["--data", folder, "--preprocess", out / f"pre{suffix}"]
    else:
        (out / "labels.txt").write_text(data.draw(st.text(max_size=60)))
        args += ["--data", world / "x.npy", "--labels", out / "labels.txt"]
    run_case(world, args)


# --------------------------------------------------------------------------------------------
# Calibration caches and ranges files


@fast(150)
@given(data=st.data())
def test_fuzzed_caches_and_ranges(world, tmp_path_factory, data):
    out = tmp_path_factory.mktemp("c")
    lines = (world / "c.cache").read_text().splitlines()
    kind = data.draw(st.sampled_from(["header", "line", "value", "ranges"]))
    if kind == "header":
        lines[0] = data.draw(st.one_of(st.text(max_size=40), st.sampled_from(
            ["TRT-0-EntropyCalibration2", "TRT-99999999999-X", "TRT-8600-", "TRT-8600-MinMaxCalibration extra"])))
    elif kind == "line":
        lines.insert(data.draw(st.integers(1, len(lines))), data.draw(st.text(max_size=40)))
    elif kind == "value":
        i = data.draw(st.integers(1, len(lines) - 1))
        name = lines[i].split(":")[0]
        lines[i] = f"{name}: {data.draw(st.text(alphabet='0123456789abcdefABCDEFxg', min_size=0, max_size=10))}"
    if kind == "ranges":
        import json

        r = json.loads((world / "r.json").read_text())
        name = data.draw(st.sampled_from(sorted(r["tensors"])))
        r["tensors"][name]["amax"] = data.draw(st.one_of(st.floats(allow_nan=True), st.text(max_size=5), st.none(),
                                                         st.integers(-5, 5)))
        (out / "r.json").write_text(json.dumps(r, allow_nan=True))
        args = ["quantize", world / "model.onnx", "--ranges", out / "r.json", "-o", out / "q.onnx"]
    else:
        (out / "c.cache").write_text("\n".join(lines) + "\n")
        args = ["quantize", world / "model.onnx", "--cache", out / "c.cache", "-o", out / "q.onnx"]
    run_case(world, args)


# --------------------------------------------------------------------------------------------
# Templates and model names


@pytest.mark.long  # the README command's 6-minute budget; .ci/run runs the long tier
@fast(100)
@given(data=st.data())
def test_fuzzed_templates(world, tmp_path_factory, data):
    from trtrepo.tritonconfig import shipped_templates_dir

    out = tmp_path_factory.mktemp("t")
    (out / "tpl").mkdir()
    text = (shipped_templates_dir() / "onnxruntime.pbtxt.j2").read_text()
    snippet = data.draw(st.one_of(
        st.text(alphabet=string.printable, max_size=60),
        st.sampled_from(["{{ m.__class__ }}", "{{ m._secret }}", "{% for x in range(10**9) %}{% endfor %}",
                         "{{ m.name | pbstr }}\ninput [ ]", "{{ undefined_var }}", "{% include '/etc/passwd' %}",
                         "max_batch_size: 1", "name: \"x\"", "{{ m.inputs[0].name }}", "{{ lipsum.__globals__ }}",
                         "\nresponse_cache { enable: true }", "\ninstance_group [ { count: 64 kind: KIND_CPU } ]",
                         '\n{% for k, v in m.parameters %}parameters { key: "{{ k }}" value: { string_value: "{{ v }}" } }'
                         "{% endfor %}", "{% include 'link.j2' %}"])))
    # issue 28 item 6: a --parameter value that tries to close the string and add fields
    value = data.draw(st.one_of(st.text(alphabet=string.printable, max_size=30),
                                st.just('y" } } response_cache { enable: true } parameters { key: "z" value: { '
                                        'string_value: "w')))
    pos = data.draw(st.integers(0, len(text)))
    (out / "tpl" / "onnxruntime.pbtxt.j2").write_text(text[:pos] + snippet + text[pos:])
    (out / "tpl" / "link.j2").symlink_to(world / "model.onnx")  # a link out of the folder: never read
    args = ["--parameter", f"x={value}"]
    run_case(world, ["repo", "add", world / "model.onnx", "--repo", out / "repo", "--name", "m", "--template-dir",
                     out / "tpl", *args])
    repo = out / "repo"
    if (repo / "m").exists():  # written only when the rendered config says, field by field, what trtrepo decided
        from click.testing import CliRunner

        from trtrepo.cli import cli
        from trtrepo.repository import read_config
        from trtrepo.tritonconfig import config_to_dict

        assert (repo / "m" / "1" / "model.onnx").is_file() and (repo / "m" / "config.pbtxt").is_file()
        ref = CliRunner().invoke(cli, ["repo", "add", str(world / "model.onnx"), "--repo", str(out / "ref"), "--name", "m",
                                       *args])
        assert ref.exit_code == 0, ref.output
        assert config_to_dict(read_config(repo / "m")) == config_to_dict(read_config(out / "ref" / "m"))


@fast(100)
@given(name=st.text(alphabet=string.printable + "é/\\.", min_size=0, max_size=30))
def test_fuzzed_model_names(world, tmp_path_factory, name):
    out = tmp_path_factory.mktemp("n")
    run_case(world, ["repo", "add", world / "model.onnx", "--repo", out / "repo", "--name", name])
    outside = [p for p in out.rglob("*") if p.is_file() and not str(p).startswith(str(out / "repo"))]
    assert outside == [], outside  # nothing written outside the repository
