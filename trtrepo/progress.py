"""Status lines and progress bars, one switch for the run: ``-q`` silences both, ``-v`` shows the
status lines (and INFO logs) also when stderr is not a terminal; by default they appear on a
terminal only, so pipes and CI logs get the results and errors alone."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Iterator

STATUS = logging.getLogger("trtrepo.status")
_state = {"quiet": False, "verbose": 0, "phases": True}


def configure(verbose: int = 0, quiet: bool = False) -> None:
    """Called by the CLI once per command (group and command flags combined)."""
    _state["quiet"], _state["verbose"], _state["phases"] = quiet, verbose, True
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


# --- a long step in phases (issue 41 item 6) ---------------------------------------------------
# The INT8 step of deploy/quantize runs minutes on a trained model: calibration, the methods the
# auto choice tries, each weight-rounding step, the held-out gate, the accuracy/speed front. A
# :func:`task` block names the step; each stage inside it opens a :func:`phase` (with a count when
# it has one) and advances it. What reaches stderr is bounded both ways:
#
# * every phase's start is a line (a handful per step), so each phase shows even when it is quick;
# * within a phase, an update is a line only :data:`MIN_GAP_S` after the previous line (no flood
#   from a loop over 53 layers or 64 batches);
# * after :data:`HEARTBEAT_S` without a line, a background thread repeats the current state with
#   fresh times, so a single long call (one ONNX Runtime pass over the held-out data, one
#   AdaRound layer) is never a silent stretch of more than about that long.
#
# Lines read ``  int8 [41.3 s] weight rounding (AdaRound): 12/53 layers, 18.2 s``: the step's
# elapsed time, the phase (a label without a colon), its count, what it is at, and the phase's own
# elapsed time. They are status lines (the switch above:
# on a terminal, with -v in pipes, never under -q); the heartbeat thread runs only when they show.
# Outside a task (a library call) :func:`phase` hands back a handle that does nothing.

MIN_GAP_S = 1.0  # an update within a phase comes at least this long after the previous line
HEARTBEAT_S = 5.0  # without a line for this long, the current state is repeated


class Task:
    """The state of one :func:`task` block: the current phase and when the last line was written.
    Written from the run's thread, read by the heartbeat thread (under ``lock``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = self.last_line = time.monotonic()
        self.lock = threading.Lock()
        self.stack: list[Phase] = []
        self.lines = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # the line of the current phase (called under the lock)
    def _line(self, now: float) -> str:
        ph = self.stack[-1] if self.stack else None
        head = f"  {self.name} [{now - self.start:.1f} s]"
        if ph is None:
            return f"{head} working: {now - self.start:.1f} s"
        return f"{head} {ph.text(now)}"

    def write(self, force: bool, now: float | None = None) -> None:
        if not _state["phases"]:
            return
        now = time.monotonic() if now is None else now
        with self.lock:
            if not force and now - self.last_line < MIN_GAP_S:
                return
            line = self._line(now)
            self.last_line = now
            self.lines += 1
        status("%s", line)

    def _beat(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self.lock:
                due = now - self.last_line >= HEARTBEAT_S
            if due:
                self.write(force=True, now=now)

    def begin(self) -> None:
        if STATUS.isEnabledFor(logging.INFO) and _state["phases"]:
            self._thread = threading.Thread(target=self._beat, name=f"trtrepo-progress-{self.name}", daemon=True)
            self._thread.start()

    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class Phase:
    """One phase of a :class:`Task` (see the comment above :data:`MIN_GAP_S`). ``total``: how many
    ``unit`` the phase does (None: no count); :meth:`advance` counts them, ``note`` names the one
    under way (the method tried, the layer rounded)."""

    def __init__(self, task: Task | None, label: str, total: int | None = None, unit: str = "") -> None:
        self.task, self.label, self.total, self.unit = task, label, total, unit
        self.done = 0
        self.note = ""
        self.start = time.monotonic()

    def text(self, now: float) -> str:
        count = "" if self.total is None else f"{self.done}/{self.total}{' ' + self.unit if self.unit else ''}"
        state = f"{count} ({self.note})" if count and self.note else (count or self.note)
        return f"{self.label}: {state + ', ' if state else ''}{now - self.start:.1f} s"

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """``n`` more done; ``note``: what comes next (kept until the next note)."""
        if self.task is None:
            return
        with self.task.lock:
            self.done += n
            if note is not None:
                self.note = note
        self.task.write(force=False)

    def set_note(self, note: str) -> None:
        """What the phase is doing now, shown on its next line (no line of its own)."""
        if self.task is not None:
            with self.task.lock:
                self.note = note


_TASK: contextvars.ContextVar[Task | None] = contextvars.ContextVar("trtrepo_progress_task", default=None)


@contextlib.contextmanager
def task(name: str) -> Iterator[Task]:
    """A long step named ``name`` (e.g. ``int8``); inside a block already running a task, that one
    (deploy's INT8 step and the quantize run it calls are one step)."""
    outer = _TASK.get()
    if outer is not None:
        yield outer
        return
    t = Task(name)
    token = _TASK.set(t)
    t.begin()
    try:
        yield t
    finally:
        t.end()
        _TASK.reset(token)


@contextlib.contextmanager
def phase(label: str, total: int | None = None, unit: str = "", note: str = "") -> Iterator[Phase]:
    """A phase of the running task: its first line now, then throttled updates (module comment).
    Nested phases show the inner one until it ends. Outside a task: a handle that does nothing."""
    t = _TASK.get()
    ph = Phase(t, label, total, unit)
    ph.note = note
    if t is None:
        yield ph
        return
    with t.lock:
        t.stack.append(ph)
    t.write(force=True)
    try:
        yield ph
    finally:
        with t.lock:
            t.stack.remove(ph)


def hide_phases() -> None:
    """No phase lines in this command (``quantize --no-progress``: no bar, no phases); the other
    status lines keep the switch of :func:`configure`, which shows the phases again."""
    _state["phases"] = False


def active() -> bool:
    """Whether a task is running (a stage then reports through :func:`phase` rather than a bar)."""
    return _TASK.get() is not None


def update(note: str) -> None:
    """The innermost phase of the running task is now at ``note`` (a line when the throttle allows;
    nothing outside a task): for a loop that has no count of its own."""
    t = _TASK.get()
    if t is None or not t.stack:
        return
    with t.lock:
        t.stack[-1].note = note
    t.write(force=False)
