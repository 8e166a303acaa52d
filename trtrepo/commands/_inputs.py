"""``@io_paths``: the files a command reads are never written.

Each command names its input and output parameters with their flags. Before the command runs, an
output equal to an input, or inside an input folder, is refused (exit 2, naming both); while it
runs, every atomic write (:func:`trtrepo.fsutil.atomic_path`) and repository write checks the
same, so a path computed later (a report file, a work folder) is covered too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..fsutil import check_not_input, protected_inputs

F = TypeVar("F", bound=Callable[..., Any])


def io_paths(inputs: Mapping[str, str], outputs: Mapping[str, str] = {}) -> Callable[[F], F]:  # noqa: B006 - read only
    """``inputs`` / ``outputs``: callback parameter name -> how the user wrote it (``--data``,
    ``MODEL``). Apply below the click decorators (directly above ``def``)."""
    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kw: Any) -> Any:
            named = {f"{flag} {kw[name]}": kw.get(name) for name, flag in inputs.items() if kw.get(name)}
            with protected_inputs(named):
                for name, flag in outputs.items():
                    values = kw.get(name)
                    for value in values if isinstance(values, (list, tuple)) else [values]:
                        if value:
                            check_not_input(value, flag)
                return f(*args, **kw)

        return wrapper  # type: ignore[return-value]

    return deco
