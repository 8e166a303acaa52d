"""``@io_paths``: the files a command reads are never written, and an image folder it reads is
made of images.

Each command names its input and output parameters with their flags. Before the command runs, an
output equal to an input, or inside an input folder, is refused (exit 2, naming both); while it
runs, every atomic write (:func:`trtrepo.fsutil.atomic_path`) and repository write checks the
same, so a path computed later (a report file, a work folder) is covered too.

An image folder given as ``--data`` or ``--eval-data`` is checked file by file (each header,
:func:`trtrepo.data.scan_image_folder`) before the command runs: a file that is not an image is
named (exit 2) before an export, a calibration or a server is started, and nothing is written;
with ``--skip-non-images`` it is skipped and named in a warning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..fsutil import check_not_input, protected_inputs

F = TypeVar("F", bound=Callable[..., Any])
DATA_FLAGS = ("--data", "--eval-data")  # the inputs that may be image folders


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
                folders = [kw[name] for name, flag in inputs.items() if flag in DATA_FLAGS and kw.get(name)]
                if folders:
                    from ..data import check_image_folder  # noqa: PLC0415  # deferred: --help imports every command module; the stage loads only when the command runs

                    for folder in folders:
                        check_image_folder(folder, skip_non_images=bool(kw.get("skip_non_images")), preprocess=kw.get("preprocess"))
                return f(*args, **kw)

        wrapper.output_flags = dict(outputs)  # type: ignore[attr-defined]  # what the command writes (tests/test_gitignore.py)
        return wrapper  # type: ignore[return-value]

    return deco
