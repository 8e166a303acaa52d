"""Issue 28 item 7: unclear or silent cases get a one-line message naming the file or option
(real CLI, in-process)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def empty_onnx(tmp_path_factory):
    import onnx
    from onnx import helper

    path = tmp_path_factory.mktemp("empty") / "empty.onnx"
    onnx.save(helper.make_model(helper.make_graph([], "empty", [], []), opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("command", ["calibrate", "quantize", "deploy"])
def test_a_model_without_inputs_is_named_by_its_file(run_cli, empty_onnx, tmp_path, command):
    args = {"calibrate": ["--data", "demo:calib"], "quantize": ["--data", "demo:calib", "-o", tmp_path / "q.onnx"],
            "deploy": ["--repo", tmp_path / "repo"]}[command]
    r = run_cli(command, empty_onnx, *args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and lines == [f"error: {empty_onnx}: the model has no inputs"], r.stderr
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "repo").exists()


@pytest.mark.parametrize("bins", ["1", "127"])
def test_too_few_histogram_bins_are_refused_not_silently_minmax(run_cli, demo_onnx, bins):
    r = run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--num-bins", bins)
    assert r.exit_code == 2 and "--num-bins" in r.stderr and "128<=x<=65536" in r.stderr, r.stderr


def test_a_limit_beyond_the_data_says_how_many_samples_were_used(run_cli, demo_onnx, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="trtrepo.data"):
        r = run_cli("calibrate", demo_onnx, "--data", "demo:val", "--limit", "100000", "--method", "minmax",
                    "--num-bins", "128", "--cache", tmp_path / "cache.bin")
    assert r.exit_code == 0, r.output
    assert any("--limit 100000: demo:val holds 597 samples; all of them are used" in m for m in caplog.messages), \
        caplog.messages
    assert "on 597 samples" in r.output


def test_an_image_resize_beyond_the_pixel_budget_is_refused_before_it_is_made(demo_onnx, tmp_path):
    """Issue 28 items 5 and 7: ``--resize 16384`` on 12 photos took 4.5 GB of RSS. The resized
    size is checked against a pixel budget per image before PIL allocates it: exit 2, one line
    naming the option, the file and the budget, and little memory."""
    import subprocess
    import sys

    import numpy as np
    from PIL import Image

    from trtrepo.data import Preprocess

    imgs = tmp_path / "imgs"
    imgs.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (48, 64), dtype=np.uint8)).save(imgs / f"{i:02d}.png")
    Preprocess(resize=(16384,), center_crop=(32, 32), color="gray").save(tmp_path / "pre.json")
    # the peak of this process's own memory (VmHWM: ru_maxrss would carry a forked parent's peak over exec)
    code = ("import sys; from trtrepo.cli import main; sys.argv = ['trtrepo'] + sys.argv[1:]\n"
            "try:\n    main()\nfinally:\n"
            "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1]\n"
            "    print('peak', hwm, file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code, "calibrate", str(demo_onnx), "--data", str(imgs), "--preprocess",
                          str(tmp_path / "pre.json")], capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith("peak")]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "preprocess option 'resize': [16384]" in lines[0] and "00.png" in lines[0] and "budget" in lines[0], lines
    peak_mb = int(res.stderr.rsplit("peak", 1)[1].split()[0]) / 1024
    assert peak_mb < 600, peak_mb


def test_a_sequence_longer_than_the_model_supports_is_one_line_naming_the_table(run_cli, tmp_path):
    """60,000 tokens into a text model with 128 positions: a raw ONNX Runtime Gather error before;
    now exit 2, one line with the input shapes, the node and its table's rows."""
    import numpy as np

    from trtrepo.export import export_onnx

    model = export_onnx("demo-text", tmp_path / "t.onnx").path
    long = np.ones((2, 60000), np.int64)
    np.savez(tmp_path / "long.npz", input_ids=long, attention_mask=long)
    r = run_cli("calibrate", model, "--data", tmp_path / "long.npz", "--cache", tmp_path / "c.bin")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, r.stderr
    assert "'input_ids' [" in lines[0] and "60000]" in lines[0] and "table of 128 rows" in lines[0], lines[0]
    assert not (tmp_path / "c.bin").exists()


def test_a_binary_labels_file_is_refused(run_cli, demo_onnx, tmp_path):
    (tmp_path / "labels.bin").write_bytes(bytes(range(256)) * 4)
    r = run_cli("repo", "add", demo_onnx, "--repo", tmp_path / "repo", "--name", "d", "--labels-file",
                tmp_path / "labels.bin")
    assert r.exit_code == 2 and "labels.bin: not a labels file" in r.stderr and not (tmp_path / "repo" / "d").exists()


def test_an_npz_key_that_names_no_input_is_said(run_cli, demo_onnx, tmp_path, caplog):
    import logging

    import numpy as np

    np.savez(tmp_path / "x.npz", pixels=np.zeros((4, 1, 32, 32), np.float32))
    with caplog.at_level(logging.WARNING, logger="trtrepo.data"):
        r = run_cli("calibrate", demo_onnx, "--data", tmp_path / "x.npz", "--cache", tmp_path / "c.bin")
    assert r.exit_code == 0, r.output
    assert any("key 'pixels' is not an input name; its array feeds the model's only input 'input'" in m
               for m in caplog.messages), caplog.messages


@pytest.mark.parametrize("case", ["missing", "outside the folder"])
def test_export_of_a_model_whose_external_data_cannot_be_read_is_one_line_exit_2(run_cli, tmp_path, case):
    import os

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])], [w])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path, save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    if case == "missing":
        os.remove(tmp_path / "m.data")
    else:
        model = onnx.load(path, load_external_data=False)
        for e in model.graph.initializer[0].external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
        onnx.save(model, path)
    r = run_cli("export", path, "-o", tmp_path / "out.onnx")
    lines = r.stderr.strip().splitlines()
    want = {"missing": f"error: {path}: its external data file {tmp_path / 'm.data'} is missing",
            "outside the folder": f"error: {path}: its external data location '../../etc/passwd' is outside the model's folder"}
    assert r.exit_code == 2 and lines == [want[case]], r.stderr  # the check repo add makes (modelio.external_data_path)
    assert not (tmp_path / "out.onnx").exists()
