"""Issue 42 item 2: the library names concepts, the command line names flags. An
:class:`~trtrepo.errors.OptionError` reads "the accuracy target 'x': ..." from the library and
"--accuracy-target 'x': ..." from the CLI, which maps the setting (the library's field name, the
click parameter's name) to the running command's flag."""

from __future__ import annotations

import re

from trtrepo.errors import OptionError, UsageError

LIBRARY_FLAG_LINES_MAX = 20  # issue 42: library raise lines that name a --flag


def test_option_error_names_the_concept_and_maps_to_flags():
    e = OptionError("accuracy_target", "'x': expected KIND=VALUE")
    assert isinstance(e, UsageError) and e.exit_code == 2
    assert str(e) == "the accuracy target 'x': expected KIND=VALUE"
    assert e.with_flags({"accuracy_target": "--accuracy-target"}) == "--accuracy-target 'x': expected KIND=VALUE"
    assert e.with_flags({}) == str(e)  # a command without that flag: the concept
    two = OptionError("ranges", "and {cache} exclude each other", concept="the ranges file",
                      others={"cache": "the calibration cache"})
    assert str(two) == "the ranges file and the calibration cache exclude each other"
    assert two.with_flags({"ranges": "--ranges", "cache": "--cache"}) == "--ranges and --cache exclude each other"
    assert OptionError("metric_output", ": no such output").with_flags({"metric_output": "--metric-output"}) == \
        "--metric-output: no such output"
    # a user's value that looks like a placeholder is left alone
    assert str(OptionError("name", "'{model}' is not a model name")) == "the name '{model}' is not a model name"


def test_the_cli_names_the_flag_of_the_running_command(run_cli, tmp_path, demo_onnx):
    """A value the library refuses (an output the model lacks) is named by the running command's
    flag; a value the edge parses (click ParamType) by click's own one line."""
    r = run_cli("quantize", demo_onnx, "-o", tmp_path / "q.onnx", "--data", "demo:calib", "--limit", "64",
                "--metric-output", "nope")
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: --metric-output 'nope': demo.onnx has no such output (outputs: logits)"
    r = run_cli("quantize", demo_onnx, "-o", tmp_path / "q.onnx", "--data", "demo:calib",
                "--accuracy-target", "top1-drop=abc")
    assert r.exit_code == 2 and r.stderr.strip().startswith(
        "error: Invalid value for '--accuracy-target': 'top1-drop=abc': 'abc' is not a number")
    assert not (tmp_path / "q.onnx").exists()


def _flag_raise_lines() -> list[str]:
    """Library ``raise`` statements (outside trtrepo/commands and cli.py) whose text names a flag."""
    from test_architecture_requests import raise_segments

    return [f"{rel}:{line}" for rel, line, seg in raise_segments() if re.search(r"(?<![\w-])--[a-z][a-z0-9-]+", seg)]


def test_few_library_raise_lines_name_a_flag():
    found = _flag_raise_lines()
    assert len(found) <= LIBRARY_FLAG_LINES_MAX, f"{len(found)} library raise lines name a --flag: {found}"


def test_a_message_about_a_file_names_settings_in_its_advice():
    e = OptionError("", "out.onnx: already exists (use {force} to overwrite)", others={"force": "force=True"})
    assert str(e) == "out.onnx: already exists (use force=True to overwrite)"
    assert e.with_flags({"force": "--force"}) == "out.onnx: already exists (use --force to overwrite)"
