"""Shared fixtures. Other test modules append their own fixtures below; keep sections separate."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from trtrepo.cli import cli


@pytest.fixture(scope="session")
def demo_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo CNN exported once per test session (FP32, dynamic batch)."""
    from trtrepo.export import export_onnx

    path = tmp_path_factory.mktemp("demo") / "demo.onnx"
    export_onnx("demo", path)
    return path


@pytest.fixture
def run_cli():
    """Run the trtrepo CLI in-process; returns click's Result (exit_code, output, stderr)."""
    runner = CliRunner()

    def run(*args: str, **kw):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=False, **kw)

    return run
