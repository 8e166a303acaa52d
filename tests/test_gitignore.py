"""What the CLI writes into the working folder when run as the README says is git-ignored (issue 41
item 7): after the README journey in a clone, ``git status`` shows nothing new.

The paths are read off the CLI, not listed here: every path option or argument with a default
(``--repo model_repository``), every output a README command names (the outputs each command
declares with ``@io_paths``, e.g. ``validate --report validate-report``), and the folder deploy
derives from its repository (``deploy-NAME``, :func:`trtrepo.deploy.front_options`)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from trtrepo.cli import cli
from trtrepo.deploy import DeployOptions, front_options

ROOT = Path(__file__).resolve().parents[1]


def _commands(tree: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in tree.list_commands(ctx):
        cmd = tree.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, ctx, (*path, name))
        elif cmd is not None:
            yield (*path, name), cmd


def _readme_commands() -> list[list[str]]:
    """The ``trtrepo ...`` lines of README.md's bash blocks, as argv (continuations joined)."""
    text = (ROOT / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;", line):
                argv = shlex.split(part.strip().rstrip("&").strip())
                if argv[:1] == ["trtrepo"]:
                    out.append(argv[1:])
    return out


def _resolve(argv: list[str], ctx: click.Context) -> tuple[click.Command, list[str], dict]:
    cmd: click.Command = cli
    args = list(argv)
    while isinstance(cmd, click.Group):
        cmd = cmd.get_command(ctx, args.pop(0))
    params = cmd.make_context(cmd.name, args, resilient_parsing=True).params
    return cmd, args, params


def _ignored(relative: str) -> bool:
    """git would ignore a file at ``relative`` (tracked or not: --no-index)."""
    res = subprocess.run(["git", "check-ignore", "-q", "--no-index", relative], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode in (0, 1), res.stderr
    return res.returncode == 0


def _inside(value: str) -> str:
    """A file the command would write at or under ``value`` (a folder: a file in it)."""
    return f"{value.rstrip('/')}/written-by-trtrepo"


def default_output_paths() -> dict[str, str]:
    """Working-folder paths the CLI writes as the README runs it: ``what -> relative path``."""
    ctx = click.Context(cli)
    found: dict[str, str] = {}
    for path, cmd in _commands(cli, ctx):
        for p in cmd.params:
            if isinstance(p.type, click.Path) and isinstance(p.default, str) and p.default:
                found[f"trtrepo {' '.join(path)} {p.name} (default)"] = p.default
    for argv in _readme_commands():
        cmd, _, params = _resolve(argv, ctx)
        flags = getattr(cmd.callback, "output_flags", {})
        for name, flag in flags.items():
            values = params.get(name)
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if value and not Path(value).is_absolute() and "://" not in value:
                    found[f"README: trtrepo {cmd.name} {flag}"] = value
        if cmd.name == "deploy":
            repo = ROOT / params["repo"]
            opts = DeployOptions(source=params["source"], repo=str(repo), name=params.get("name"))
            front = front_options(opts, opts.int8)
            if front is not None and front.report_dir is not None:
                found["README: trtrepo deploy, the front's report folder"] = str(Path(front.report_dir).relative_to(ROOT))
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_what_the_cli_writes_into_the_working_folder_is_git_ignored():
    found = default_output_paths()
    # the walk found what it must (else it checks nothing): the default repository, a README report
    assert "model_repository" in found.values() and "validate-report" in found.values(), found
    assert any(v.startswith("deploy-") for v in found.values()), found
    not_ignored = {what: value for what, value in found.items() if not _ignored(_inside(value))}
    assert not not_ignored, f"add to .gitignore: {not_ignored}"


def test_the_check_tells_an_ignored_path_from_one_that_is_not():
    assert _ignored(_inside("validate-report"))
    assert not _ignored("trtrepo/data.py")
    assert not _ignored(_inside("some-new-report"))
