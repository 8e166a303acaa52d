"""Status lines and progress bars, one switch for the run: ``-q`` silences both, ``-v`` shows the
status lines (and INFO logs) also when stderr is not a terminal; by default they appear on a
terminal only, so pipes and CI logs get the results and errors alone."""

from __future__ import annotations

import logging
import sys

STATUS = logging.getLogger("trtrepo.status")
_state = {"quiet": False, "verbose": 0}


def configure(verbose: int = 0, quiet: bool = False) -> None:
    """Called by the CLI once per command (group and command flags combined)."""
    _state["quiet"], _state["verbose"] = quiet, verbose
    shown = not quiet and (verbose > 0 or sys.stderr.isatty())
    STATUS.setLevel(logging.INFO if shown else logging.WARNING)
    STATUS.propagate = False
    if not STATUS.handlers:
        STATUS.addHandler(_StderrHandler())


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a line is emitted (never a stream kept from an
    earlier command run in the same process)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(record.getMessage() + "\n")
            sys.stderr.flush()
        except Exception:  # a closed stderr must not break the run
            self.handleError(record)


def status(message: str, *args: object) -> None:
    """One status line on stderr (see the module docstring for when it shows)."""
    STATUS.info(message, *args)


def bar_disabled(enabled: bool | None) -> bool | None:
    """tqdm's ``disable``: off under ``-q`` or ``--no-progress``, else tqdm's own choice (a terminal)."""
    return True if _state["quiet"] or enabled is False else None
