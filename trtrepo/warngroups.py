"""Warnings grouped by cause during one run: one console line per cause with its counts, the
per-layer details in the report and in ``--json`` (issue 40 item 5).

A stage that would warn once per layer, and again for every candidate model the INT8 step tries
(each method, SmoothQuant alpha, weight rounding, accuracy-target step), describes each case as a
:class:`Detail` of a registered :class:`Cause` and attaches the details to what it made (the
``warnings`` of a :class:`~trtrepo.qdq.QuantizedModel`). The run keeps the details of the
model it ships (:meth:`Collector.keep`); those of the candidates it measured and dropped are
dropped with them: they describe a model nobody receives, and the shipped one carries the same
cause wherever it still holds. When the outermost :func:`collecting` block ends without an error,
each cause is logged once as a WARNING (:meth:`WarningGroup.line`, with where the details are),
each detail at INFO (shown with ``-v``). When the run ships nothing from it (``deploy`` falling
back to FP32), :meth:`Collector.not_shipped` says so on the line instead of dropping it.

Outside a :func:`collecting` block (a library call of ``insert_qdq``) nothing is grouped: the
stage logs each case itself, as it always did (:func:`in_run` tells it which).

Every other WARNING a ``trtrepo`` logger writes during the outermost block (the gate's accuracy
loss, tensors kept in float, too few samples to hold out) is a cause of its own too, its text
the key (issue 41 item 6): it shows on the console the first time only, a verbatim repeat is
counted instead of printed (:class:`_LogWatch`), and each lands in the groups (cause ``logged``,
its count in ``counts["times"]``), so ``--json``'s ``warnings`` holds every warning the console
showed."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One reason to warn. ``template`` is the console line, formatted with ``subjects`` (how many
    distinct ``subject`` names, e.g. layers) and ``count`` (the sum of the details' counts, e.g.
    weight scales raised); ``subject`` and ``counted`` name those figures in the JSON (``counted``
    None: a detail counts nothing beyond its subjects)."""

    key: str  # the JSON's "cause"
    template: str
    subject: str  # singular noun: "layer", "tensor"
    counted: str | None = None  # JSON key of the count: "weight_scales"


@dataclass(frozen=True)
class Detail:
    """One case of a cause: the layers (or tensors) it concerns, what it counts there and the
    full sentence a per-case warning would have been."""

    cause: Cause
    subjects: tuple[str, ...]
    count: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f"{self.cause.subject}s": list(self.subjects)}
        if self.cause.counted:
            d[self.cause.counted] = self.count
        d["message"] = self.message
        return d


@dataclass(frozen=True)
class WarningGroup:
    """The details of one cause in a run; ``shipped`` False: they describe a model the run did not
    ship (``note`` says what shipped instead)."""

    cause: Cause
    details: tuple[Detail, ...]
    shipped: bool = True
    note: str = ""

    @property
    def subjects(self) -> int:
        return len({s for d in self.details for s in d.subjects})

    @property
    def count(self) -> int:
        return sum(d.count for d in self.details)

    def line(self) -> str:
        """The one console line: the cause with its counts (a logged warning: its text)."""
        if self.cause is LOGGED:
            return self.details[0].message
        text = self.cause.template.format(subjects=self.subjects, count=self.count)
        return text if self.shipped else f"{text} (in a model that was not shipped: {self.note})"

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {f"{self.cause.subject}s": self.subjects}
        if self.cause.counted:
            counts[self.cause.counted] = self.count
        return {"cause": self.cause.key, "message": self.line(), "counts": counts, "shipped": self.shipped,
                "details": [d.to_dict() for d in self.details]}


def group(details: Iterable[Detail]) -> tuple[WarningGroup, ...]:
    """The details by cause, in the order each cause first appears; a detail repeated verbatim
    (the same case met twice) counts once."""
    by_cause: dict[str, list[Detail]] = {}
    causes: dict[str, Cause] = {}
    for d in details:
        rows = by_cause.setdefault(d.cause.key, [])
        causes[d.cause.key] = d.cause
        if d not in rows:
            rows.append(d)
    return tuple(WarningGroup(causes[k], tuple(rows)) for k, rows in by_cause.items())


LOGGED = Cause("logged", "{message}", subject="logger", counted="times")  # a WARNING logged during the run


@dataclass
class Collector:
    """The details a run keeps (see the module doc); ``where`` ends each console line. ``logged``:
    the WARNING lines logged during the run, by text: [logger names, times]."""

    where: str
    kept: list[Detail] = field(default_factory=list)
    shipped: bool = True
    note: str = ""
    logged: dict[str, list[Any]] = field(default_factory=dict)

    def keep(self, details: Iterable[Detail]) -> None:
        self.kept.extend(details)

    def not_shipped(self, note: str) -> None:
        """The kept details describe a model the run did not ship; ``note``: what it shipped instead."""
        self.shipped, self.note = False, note

    def groups(self) -> tuple[WarningGroup, ...]:
        """The grouped causes (of the shipped model), then the logged warnings (module doc)."""
        grouped = tuple(replace(g, shipped=self.shipped, note=self.note) for g in group(self.kept))
        return grouped + tuple(WarningGroup(LOGGED, (Detail(LOGGED, tuple(names), times, text),))
                               for text, (names, times) in self.logged.items())

    def emit(self, log: logging.Logger) -> None:
        """One WARNING per grouped cause, its details at INFO; a logged warning was shown when it
        came: its repeats are counted at INFO."""
        for g in self.groups():
            if g.cause is LOGGED:
                if g.count > 1:
                    log.info("the warning '%s' came %d times (shown once)", g.details[0].message, g.count)
                continue
            log.warning("%s; per-%s details in %s", g.line(), g.cause.subject, self.where)
            for d in g.details:
                log.info("  %s", d.message)

    def record(self, name: str, text: str) -> int:
        """One WARNING logged by ``name``; how many times its text has come in this run."""
        entry = self.logged.setdefault(text, [[], 0])
        if name not in entry[0]:
            entry[0].append(name)
        entry[1] += 1
        return int(entry[1])


_RUN: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("trtrepo_warning_run", default=None)


@contextlib.contextmanager
def collecting(log: logging.Logger, where: str) -> Iterator[Collector]:
    """The run's :class:`Collector`. Inside a block already collecting, the outer run's (which
    reports for both); the outermost block logs the groups when it ends without an error (a run
    that fails ships nothing, and its error says why)."""
    outer = _RUN.get()
    if outer is not None:
        yield outer
        return
    run = Collector(where)
    token = _RUN.set(run)
    watch = _LogWatch(run)
    try:
        yield run
    finally:
        watch.close()
        _RUN.reset(token)
    run.emit(log)


def in_run() -> bool:
    """Whether a run is collecting (then a stage attaches its details instead of logging them)."""
    return _RUN.get() is not None


class _LogWatch(logging.Handler):
    """The outermost run's watch over ``trtrepo``'s WARNING records (module doc): as a handler on
    the ``trtrepo`` logger it records each one in the run; as a filter on the handlers that print
    (the root logger's) it drops a record whose text came before in the run. A record reaches the
    ``trtrepo`` logger's handlers before the root's, so it is counted (and a repeat marked) before
    it is filtered, and every root handler takes the same decision on it."""

    def __init__(self, run: Collector) -> None:
        super().__init__(logging.WARNING)
        self.run = run
        self.logger = logging.getLogger("trtrepo")
        self.logger.addHandler(self)
        self.printers = list(logging.getLogger().handlers)
        for h in self.printers:
            h.addFilter(self._shown)

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno != logging.WARNING:
            return
        if self.run.record(record.name, record.getMessage()) > 1:
            record.trtrepo_repeat = True

    @staticmethod
    def _shown(record: logging.LogRecord) -> bool:
        return not getattr(record, "trtrepo_repeat", False)

    def close(self) -> None:
        self.logger.removeHandler(self)
        for h in self.printers:
            h.removeFilter(self._shown)
        super().close()
