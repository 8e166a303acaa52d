"""One user-facing error type, caught once by the CLI.

Library code raises :class:`TrtrepoError` (a failure, exit code 1) or :class:`UsageError`
(bad input or options, exit code 2). The message is one line that names the file, tensor or
option at fault; the CLI prints it without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


class TrtrepoError(Exception):
    """A failure the user can act on. ``exit_code`` is what the CLI exits with; ``multiline``
    errors (a server's load errors) keep their line breaks, the others print as one line."""

    exit_code = 1
    multiline = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(TrtrepoError):
    """Bad input: a missing file, an unknown option value, a shape that does not fit."""

    exit_code = 2


class OptionError(UsageError):
    """A bad value of one setting. The library names the concept, the command line the flag:
    ``OptionError("accuracy_target", "'x': expected KIND=VALUE")`` reads ``the accuracy target
    'x': expected KIND=VALUE`` from the library and ``--accuracy-target 'x': expected
    KIND=VALUE`` from ``trtrepo quantize`` (the CLI maps ``setting``, the library's field name
    and the click parameter's name, to the running command's flag: :meth:`with_flags`).

    ``concept`` (default: ``the`` and the setting's words) is how the library names it;
    ``others`` names further settings that ``detail`` refers to as ``{name}`` (``"{cache}"``:
    ``the calibration cache`` / ``--cache``). An empty ``setting`` is a message about something
    else (a file) whose advice names settings: ``OptionError("", f"{path}: exists (use {{force}} to
    overwrite)", others={"force": "force=True"})``."""

    def __init__(self, setting: str, detail: str, *, concept: str | None = None,
                 others: Mapping[str, str] | None = None) -> None:
        self.setting, self.detail = setting, detail
        self.concept = concept or "the " + setting.replace("_", " ")
        self.others = dict(others or {})
        super().__init__(self._render(self._names()))

    def _names(self) -> dict[str, str]:
        return {**({self.setting: self.concept} if self.setting else {}), **self.others}

    def _render(self, names: Mapping[str, str]) -> str:
        detail = _PLACEHOLDER.sub(lambda m: names.get(m.group(1), m.group(0)), self.detail)
        if not self.setting:  # a message about something else that names settings in its advice
            return detail
        return f"{names[self.setting]}{'' if detail[:1] in (':', ',', '') else ' '}{detail}"

    def with_flags(self, flags: Mapping[str, str]) -> str:
        """The message with each setting the command has a flag for named by that flag."""
        return self._render({k: flags.get(k, v) for k, v in self._names().items()})


_PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_]*)\}")


class MissingDependencyError(UsageError):
    """An optional dependency (torch, tensorrt, cuda-python, ...) is not installed."""

    def __init__(self, package: str, purpose: str, install: str) -> None:
        super().__init__(f"{package} is required {purpose} but is not installed; install it with: {install}")
        self.package = package


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's text (its type name when empty), at most ``limit``
    characters: third-party errors (YAML, torch, protobuf) run to several lines or kilobytes."""
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else ""
    first = first or type(exc).__name__
    return first if len(first) <= limit else first[: limit - 3] + "..."


def printable(message: str) -> str:
    """``message`` on one line: control characters (a user's value may hold a newline or a
    carriage return) are shown escaped, as Python writes them."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in message)


_OUT_OF_RANGE = re.compile(r"running (\w+) node\. Name:'([^']*)'.*indices element out of data bounds, "
                           r"idx=(-?\d+) must be within the inclusive range \[(-?\d+),(-?\d+)\]")


def onnxruntime_run_error(exc: BaseException, where: str, inputs: Mapping[str, Any]) -> TrtrepoError:
    """One line for a failed ``InferenceSession.run``. An index out of a table's range (a token or
    position embedding's Gather) is bad input, not a failure: the inputs are longer (or hold larger
    ids) than the model supports, and the message says which table and how many rows it has."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    m = _OUT_OF_RANGE.search(first)
    if m is None:
        return TrtrepoError(f"{where} ({first})")
    op, node, idx, rows = m.group(1), m.group(2), int(m.group(3)), int(m.group(5)) + 1
    shapes = ", ".join(f"'{n}' {list(v.shape)}" for n, v in inputs.items() if hasattr(v, "shape"))
    return UsageError(f"{where}: the inputs ({shapes}) go beyond what the model supports: its {op} node '{node}' "
                      f"has a table of {rows} rows and was asked for row {idx} (a sequence longer than {rows} "
                      f"positions, or an id outside the vocabulary)")
