"""Locating and starting a ``tritonserver`` binary."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def find_server_binary(explicit: str | Path | None) -> Path | None:
    """``explicit``, else ``$TRTREPO_TRITONSERVER``, else ``tritonserver`` on PATH."""
    for candidate in (explicit, os.environ.get("TRTREPO_TRITONSERVER")):
        if candidate:
            p = Path(candidate)
            return p if p.is_file() else None
    found = shutil.which("tritonserver")
    return Path(found) if found else None
