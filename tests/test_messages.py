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
