"""docs/cli.md is generated from the click commands (scripts/gen_cli_docs.py): it must match the
CLI as it is now, and each of its pages must be what ``trtrepo ... --help`` prints."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from click.testing import CliRunner

from trtrepo.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_up_to_date():
    gen = _generator()
    expected = gen.render()
    current = gen.DOCS.read_text() if gen.DOCS.exists() else ""
    assert current == expected, "docs/cli.md is stale: run python scripts/gen_cli_docs.py"


def test_every_page_of_docs_cli_md_is_the_commands_help():
    gen = _generator()
    pages = dict(re.findall(r"^## (trtrepo[^\n]*)\n\n```text\n(.*?)\n```$", gen.render(), re.S | re.M))
    assert {"trtrepo", "trtrepo deploy", "trtrepo serve", "trtrepo validate", "trtrepo repo list"} <= set(pages)
    runner = CliRunner()
    for path, text in pages.items():
        res = runner.invoke(cli, [*path.split()[1:], "--help"], prog_name="trtrepo", terminal_width=gen.WIDTH,
                            max_content_width=gen.WIDTH)
        assert res.exit_code == 0, (path, res.output)
        assert res.output.rstrip("\n") == text, f"{path}: docs/cli.md differs from '{path} --help'"


def test_the_check_mode_names_the_command_to_run(tmp_path, capsys):
    gen = _generator()
    stale = tmp_path / "cli.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "-o", str(stale)]) == 1
    assert "is stale: run python scripts/gen_cli_docs.py" in capsys.readouterr().err
    assert gen.main(["-o", str(stale)]) == 0 and gen.main(["--check", "-o", str(stale)]) == 0
