"""``--json``: one JSON object with a command's summary on stdout; its human lines go to stderr
then, so ``trtrepo deploy --json ... | jq .precision`` reads the object alone."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from ..fsutil import json_default

F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the summary as one JSON object on stdout (the other lines go to stderr).")(f)


@contextlib.contextmanager
def summary_output(as_json: bool) -> Iterator[Callable[[dict[str, Any]], None]]:
    """``with summary_output(as_json) as emit: ... emit(summary)``: under ``--json`` the body's
    ``click.echo`` lines go to stderr and ``emit`` writes the summary to stdout."""
    stdout = sys.stdout

    def emit(summary: dict[str, Any]) -> None:
        if as_json:

            stdout.write(json.dumps(summary, indent=2, default=json_default, allow_nan=True) + "\n")
            stdout.flush()

    if not as_json:
        yield emit
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield emit
