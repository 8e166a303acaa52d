"""One way to write a matplotlib figure as a PNG (the front, tune's candidates, validate's
latency): the Agg backend (no display), the figure closed whatever happens, a tight layout and an
atomic write (:func:`~trtrepo.fsutil.atomic_path`: a reader never sees half a PNG). matplotlib is
imported here, lazily: only a run that draws pays for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .fsutil import atomic_path


@contextlib.contextmanager
def png_figure(path: str | Path, **subplots: Any) -> Iterator[tuple[Any, Any, dict[str, str]]]:
    """``(figure, axes, metadata)`` from ``plt.subplots(**subplots)``; when the block ends without
    an error the figure is written to ``path`` with ``metadata`` (PNG text chunks the caller may
    fill inside the block, e.g. what was plotted); the figure is closed either way."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**subplots)
    metadata: dict[str, str] = {}
    try:
        yield fig, axes, metadata
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", metadata=metadata or None)
    finally:
        plt.close(fig)
