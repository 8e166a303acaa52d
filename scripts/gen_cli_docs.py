"""Write docs/cli.md: the ``--help`` text of ``trtrepo`` and of every command and subcommand.

    python scripts/gen_cli_docs.py            # rewrite docs/cli.md
    python scripts/gen_cli_docs.py --check    # exit 1 when docs/cli.md differs from the CLI

The text is click's own help, rendered at a fixed width (100 columns) so that the file does not
depend on the terminal it was generated from; tests/test_cli_docs.py fails when the file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "cli.md"
WIDTH = 100

HEADER = """\
# Command-line reference

Generated from the click commands by `python scripts/gen_cli_docs.py`; do not edit by hand.
`tests/test_cli_docs.py` fails when this file differs from the CLI's `--help`. The same text is
printed by `trtrepo --help` and `trtrepo COMMAND [SUBCOMMAND] --help` (here at {width} columns).
Prose about the commands: [README](../README.md), [quantization](quantization.md),
[serving](serving.md), [fleet](fleet.md).
"""


def _walk(command: click.Command, ctx: click.Context):
    """(path, help text) for ``command`` and everything under it, in the CLI's own order."""
    yield ctx.command_path, command.get_help(ctx).rstrip() + "\n"
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))


def render() -> str:
    """docs/cli.md's text for the CLI as it is now."""
    sys.path.insert(0, str(ROOT))
    from trtrepo.cli import cli

    # the contexts click builds for `--help` (context_settings included: -h, --help)
    root = click.Context(cli, info_name="trtrepo", terminal_width=WIDTH, max_content_width=WIDTH,
                         **cli.context_settings)
    pages = list(_walk(cli, root))
    lines = [HEADER.format(width=WIDTH), "## Commands\n"]
    for path, _ in pages:
        anchor = path.replace(" ", "-")
        lines.append(f"- [`{path}`](#{anchor})")
    lines.append("")
    for path, text in pages:
        lines += [f"## {path}\n", "```text", text.rstrip("\n"), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale; write nothing")
    ap.add_argument("-o", "--output", type=Path, default=DOCS, help="where to write (default docs/cli.md)")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run python scripts/gen_cli_docs.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
