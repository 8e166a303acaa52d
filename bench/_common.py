"""Helpers shared by the benchmark scripts (run as ``python bench/NAME.py``: this folder is on sys.path)."""

from __future__ import annotations

from pathlib import Path


def status_mb(key: str) -> float:
    """A memory figure of this process from /proc/self/status (``VmRSS``, ``VmHWM``, ...) in MiB; NaN when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" when there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def publish(section: str, heading: str, docs: Path | None = None) -> None:
    """Print a results section and, with ``docs``, put it into that Markdown file (:func:`update_docs`)."""
    print(section)
    if docs is not None:
        update_docs(docs, heading, section)


def update_docs(path: Path, heading: str, section: str) -> None:
    """Replace the ``heading`` section of the Markdown file ``path`` (up to the next ``## ``) by
    ``section``, or append it; written atomically."""
    from trtrepo.fsutil import atomic_write_text

    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(heading)
    if start >= 0:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + section + ("\n" + text[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(path, text)
