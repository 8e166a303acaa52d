"""Load generation: the closed loop, the open loop and the windows a level is measured in, written
once (:class:`LoadRun`) over a transport that sends the requests and does the waiting.

**Schedules** (:class:`LoadRun`):

- *Closed loop* (``concurrency``): that many chains, each sending its next request as soon as the
  previous one answered, keeping its shared-memory slot; request numbers (which payload, cycling
  through them) are handed out in the order requests are sent. The run ends at its budget of
  requests or seconds (:meth:`~trtrepo.validate.client.TritonTarget.load`: warm-up, accuracy) or
  when its windows say so.
- *Open loop* (``rate``): each request at its time from :func:`~trtrepo.measure.send_times`,
  drawn in blocks of twice a window's requests (at least 64; a Poisson stream's seed moves on by
  the requests sent), whether or not earlier requests answered, once a request may be in flight
  (at most :data:`~trtrepo.validate.options.MAX_CONCURRENCY`, and a free slot with shared
  memory). One sent more than :data:`LATE_S` after its time counts as late.
- *Windows* (:mod:`trtrepo.measure`): fixed time from the previous window's end, or a fixed number
  of answers (the window ends with its last request's answer), until the last windows are stable
  or the last trial is measured. Answers after that still count as ``completed`` (the server books
  them too).
- *One interval for the client and the server* (:class:`ServerBooks`): given the server's
  statistics, a window ends where the server's own count of finished requests stands. At the
  window's time (or count) the run reads the statistics (:class:`Fetch`, again every
  :data:`BOOK_POLL_S` until the server has booked at least the answers the client holds, at most
  :data:`BOOKED_WAIT_S`), waits until the client holds as many answers as the server booked, and
  cuts the window there: the window's client latencies are the first N answers, the server's
  figures the diff of the two readings, N requests each (a count window then holds at least its
  number of requests, and the requests that the server booked meanwhile). Decision: **count by completion**, not
  drain. A request is counted whole on each side (the server books it when it releases it, the
  client when its answer arrives), so no boundary splits one; draining the requests in flight at
  every boundary would give the exact same set but measure a load that pauses every window (a
  ramp down and up of one latency each, most of a window for a slow model). The price: two
  requests that end within microseconds of each other at a boundary can fall on different sides
  for the two counts (the same number of requests, the same requests up to that order). Where the
  server books requests this client never sends (another client of the model), the client cannot
  reach the server's count: the run then cuts by the client's answers alone and says the books
  did not match (:attr:`Measurement.books_matched`).

A failed request (or a failure in the schedule) stops the run: no chain sends again, the requests
in flight are waited for (at most the request timeout and :data:`DRAIN_GRACE_S`), and the first
failure is raised.

**Transports** send requests, report each end to :meth:`LoadRun.completed` and run the run's
courses (:meth:`LoadRun.main`, and :meth:`LoadRun.schedule` beside it in the open loop) with
their own waiting. They differ where their clients differ, and each measures latency on its own
clock:

- :class:`AsyncioTransport`: tritonclient's asyncio client of either protocol on the client's
  event loop; a chain is one task; waits sleep on the loop, woken by answers. A failed run cancels
  the requests in flight. Latency runs from the call (writing shared memory included) until the
  outputs are read and checked.
- :class:`CallbackTransport`: gRPC's ``async_infer`` on the synchronous client, completion
  callbacks on gRPC's threads sending their chain's next request themselves (perf_analyzer's
  asynchronous mode), the open loop on a thread of its own. A request sent cannot be taken back:
  a failed run waits for those in flight. Latency runs from the request's send until its callback
  starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from ..contracts.payload import Payload
from ..errors import UsageError
from ..measure import STABLE_WINDOWS, Stability, is_stable, latency_ms, merged, send_times, spread, window_summary
from .options import MAX_CONCURRENCY

LATE_S = 1e-3  # an open-loop request sent this long after its time counts as late
DRAIN_GRACE_S = 1.0  # beyond the request timeout: how long a run's end waits for the requests in flight
OPEN_LOOP_MIN_BLOCK = 64  # send times drawn at once, at least
BOOK_POLL_S = 0.005  # a window's end: the server's statistics read again this often while it books the client's answers
BOOKED_WAIT_S = 2.0  # a window's end: how long the server may take to book the client's answers, and the client to get the server's


class Inference(Protocol):
    """What the transports need of a Triton client (:class:`~trtrepo.validate.client.TritonTarget`)."""

    timeout: float

    def build_request(self, payload: Payload, slot: int | None) -> tuple[list[Any], list[Any]]: ...

    async def infer_async(self, payload: Payload, slot: int | None,
                          request: tuple[list[Any], list[Any]] | None = None) -> dict[str, np.ndarray]: ...

    def infer_with_callback(self, request: tuple[list[Any], list[Any]], done: Callable[[Any, Any], None]) -> None: ...

    def read_result(self, result: Any, payload: Payload, slot: int | None) -> dict[str, np.ndarray]: ...

    def request_error(self, exc: BaseException) -> Exception: ...

    def run_async(self, coro: Coroutine[Any, Any, Any]) -> Any: ...


class Transport(Protocol):
    def send(self, number: int, slot: int | None) -> None:
        """Send request ``number`` in ``slot``; report its end to the run once (from any thread)."""

    def drive(self) -> None:
        """Run the run to its end: start it, follow its courses, drain, raise its first failure."""


class Completion(NamedTuple):
    """One request's end as its transport saw it (``t0``/``t1``: its clock, perf_counter())."""

    number: int  # the request's number (which payload)
    slot: int | None
    batch: int
    t0: float
    t1: float
    outputs: dict[str, np.ndarray] | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Wait:
    """Wait until ``until`` (a perf_counter() time) passes or ``ready()`` holds (read under the
    run's lock); a stopped run ends a ``stoppable`` wait at once."""

    until: float | None = None
    ready: Callable[[], bool] | None = None
    stoppable: bool = True


@dataclass(frozen=True)
class Fetch:
    """Await ``call()`` (the server's statistics) on the client's event loop; the answer is
    appended to ``into``. A course yields it where it needs a reading of the server."""

    call: Callable[[], Coroutine[Any, Any, Any]]
    into: list[Any]


Step = Wait | Fetch


@dataclass(frozen=True)
class ServerBooks:
    """The server's own count of finished requests, read at each window's end so that the client's
    and the server's figures of a window cover the same requests (module docstring). ``read``: one
    statistics answer; ``booked``: the requests finished in an answer; ``start``: the answer read
    before the run's first request (settled: every earlier request booked)."""

    read: Callable[[], Coroutine[Any, Any, Mapping[str, Any]]]
    booked: Callable[[Mapping[str, Any]], int]
    start: Mapping[str, Any]


@dataclass(frozen=True)
class Arrivals:
    """An open loop's schedule: ``rate`` requests per second, their send times spaced by
    ``distribution`` (:func:`trtrepo.measure.send_times`) from ``seed``."""

    rate: float
    distribution: str = "constant"
    seed: int = 0


class LoadRun:
    """One run: its schedule and its records (module docstring). Records are kept under one lock,
    :attr:`cond`, notified at every answer and at the stop: the callback transport reports from
    gRPC's threads. ``concurrency`` (closed loop) or ``arrivals`` (open loop) sets the schedule.
    ``slots``: the shared-memory slots (None: no shared memory)."""

    def __init__(self, payloads: Sequence[Payload], *, concurrency: int | None = None, arrivals: Arrivals | None = None,
                 stability: Stability | None = None, requests: int | None = None, duration: float | None = None,
                 keep: bool = False, slots: int | None = None, progress: Callable[[int], None] | None = None,
                 books: ServerBooks | None = None) -> None:
        rate = None if arrivals is None else arrivals.rate
        distribution, seed = ("constant", 0) if arrivals is None else (arrivals.distribution, arrivals.seed)
        if (concurrency is None) == (rate is None):
            raise UsageError("give a concurrency or a request rate")
        if not payloads:
            raise UsageError("no data to send")
        self.payloads = payloads
        self.concurrency, self.rate, self.distribution, self.seed = concurrency, rate, distribution, seed
        self.stability, self.requests, self.duration, self.keep = stability, requests, duration, keep
        self.use_shm = slots is not None
        self.progress = progress
        self.cond = threading.Condition()
        self.stopped = threading.Event()
        self.on_change: Callable[[], None] = _nothing  # a transport's own wake-up, after every answer and the stop
        self.latencies: list[float] = []  # answered requests, in the order their answers were recorded
        self.batches: list[int] = []
        self.answered_at: list[float] = []
        self.outputs: dict[int, dict[str, np.ndarray]] = {}
        self.errors: list[BaseException] = []
        self.in_flight = 0
        self.free_slots = list(range(slots or 0))
        self.sent = 0  # open loop: requests sent
        self.late = 0  # open loop: requests sent later than LATE_S after their time
        self.windows: list[dict[str, Any]] = []
        self.window_latencies: list[np.ndarray] = []
        self.books = books
        self.books_matched = books is not None  # False once the server booked requests this client never got
        self.readings: list[Mapping[str, Any]] = [] if books is None else [books.start]  # at the start and each window's end
        self.start = time.perf_counter()
        self._end = math.inf
        self._next = 0

    @property
    def open_loop(self) -> bool:
        return self.rate is not None

    def payload(self, number: int) -> Payload:
        return self.payloads[number % len(self.payloads)]

    # --- events (any thread) ---------------------------------------------------------------
    def completed(self, c: Completion) -> int | None:
        """A request ended: record it; the request its chain sends next (closed loop, run going
        on), or None: the chain ends and its slot is free again."""
        with self.cond:
            if c.error is None:
                self.latencies.append(c.t1 - c.t0)
                self.batches.append(c.batch)
                self.answered_at.append(c.t1)
                if self.keep and c.outputs is not None:
                    self.outputs[c.number] = c.outputs
            else:
                self.errors.append(c.error)
                self.stopped.set()
            nxt = self._next_number() if self.concurrency is not None else None
            if nxt is None:
                self.in_flight -= 1
                if c.slot is not None:
                    self.free_slots.append(c.slot)
            self.cond.notify_all()
        self.on_change()
        if c.error is None and self.progress is not None:
            self.progress(1)
        return nxt

    def stop(self) -> None:
        with self.cond:
            self.stopped.set()
            self.cond.notify_all()
        self.on_change()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            self.errors.append(exc)
        self.stop()

    def _next_number(self) -> int | None:
        """The closed loop's next request number, or None when the run is over (lock held)."""
        if self.stopped.is_set() or (self.requests is not None and self._next >= self.requests) \
                or (self._end != math.inf and time.perf_counter() >= self._end):
            return None
        self._next += 1
        return self._next - 1

    def _idle(self) -> bool:
        return self.in_flight == 0

    def _room(self) -> bool:
        return self.in_flight < MAX_CONCURRENCY and (not self.use_shm or bool(self.free_slots))

    def _answered(self, count: int) -> bool:
        return len(self.latencies) >= count

    # --- courses -------------------------------------------------------------------------------
    def begin(self, transport: Transport) -> None:
        """Start the clock and, in the closed loop, the chains (chain ``s`` has slot ``s``)."""
        self.start = time.perf_counter()
        self._end = self.start + self.duration if self.duration is not None else math.inf
        if self.concurrency is None:
            return
        chains = []
        with self.cond:
            for s in range(self.concurrency):
                i = self._next_number()
                if i is None:
                    break
                self.in_flight += 1
                chains.append((i, s if self.use_shm else None))
        for i, slot in chains:
            transport.send(i, slot)

    def main(self) -> Iterator[Step]:
        """The run's own course: its windows until they end it, or (no windows) until every chain
        used up the budget; then the run stops."""
        if self.stability is not None:
            yield from self._windows(self.stability)
        else:
            yield Wait(ready=self._idle)
        self.stop()

    def _windows(self, st: Stability) -> Iterator[Step]:
        mark, w_start = 0, self.start
        while not self.stopped.is_set():
            if st.requests is None:
                yield Wait(until=w_start + st.interval_s)
            else:
                yield Wait(ready=functools.partial(self._answered, mark + st.requests))
            booked = None
            if self.books_matched:
                booked = yield from self._server_cut(mark + (st.requests or 0))
            with self.cond:
                if self.stopped.is_set():
                    return
                if booked is not None:  # the window ends where the server's count stands
                    end = booked
                    now = self.answered_at[end - 1] if end > mark else time.perf_counter()
                elif st.requests is None:
                    now, end = time.perf_counter(), len(self.latencies)
                else:  # the window ends with its last request's answer
                    end = mark + st.requests
                    now = self.answered_at[end - 1]
                lat = np.asarray(self.latencies[mark:end])
                inferences = sum(self.batches[mark:end])
            self.windows.append(window_summary(lat, inferences, now - w_start, st.percentiles))
            self.window_latencies.append(lat)
            mark, w_start = end, now
            if len(self.windows) >= st.max_trials or is_stable(self.windows, st.pct, st.latency_key):
                return

    def _server_cut(self, at_least: int) -> Generator[Step, None, int | None]:
        """Read the server's count until it has booked at least the answers the client holds (and
        ``at_least``), wait for the client to hold every answer the server booked; return that
        count (requests of this run), or None when the counts cannot meet (module docstring: the
        books no longer match; the reading is dropped and windows are cut by the client alone)."""
        books = self.books
        assert books is not None
        base = books.booked(books.start)
        with self.cond:
            at_least = max(at_least, len(self.latencies))
        deadline = time.perf_counter() + BOOKED_WAIT_S
        while True:
            box: list[Any] = []
            yield Fetch(books.read, box)
            reading = box[0]
            booked = books.booked(reading) - base
            if booked >= at_least or time.perf_counter() >= deadline or self.stopped.is_set():
                break
            yield Wait(until=time.perf_counter() + BOOK_POLL_S)
        yield Wait(until=time.perf_counter() + BOOKED_WAIT_S, ready=functools.partial(self._answered, booked))
        with self.cond:
            if self.stopped.is_set():
                return None
            if len(self.latencies) < booked:
                self.books_matched = False
                self.readings = []
                return None
        self.readings.append(reading)
        return booked

    def schedule(self, transport: Transport) -> Iterator[Wait]:
        """The open loop's sender (module docstring)."""
        assert self.rate is not None and self.stability is not None  # measure() gives both
        rate = self.rate
        block = max(OPEN_LOOP_MIN_BLOCK, int(rate * self.stability.interval_s * 2))
        offsets = send_times(rate, block, self.distribution, self.seed)
        base = time.perf_counter()
        k = 0
        while not self.stopped.is_set():
            if k == len(offsets):
                base += float(offsets[-1]) + 1.0 / rate
                offsets = send_times(rate, block, self.distribution, self.seed + self.sent)
                k = 0
            due = base + float(offsets[k])
            if due > time.perf_counter():
                yield Wait(until=due)
            yield Wait(ready=self._room)
            with self.cond:
                if self.stopped.is_set():
                    return
                slot = self.free_slots.pop() if self.use_shm else None
                self.in_flight += 1
                if time.perf_counter() - due > LATE_S:
                    self.late += 1
                i = self.sent
                self.sent += 1
            transport.send(i, slot)
            k += 1

    def drain(self, timeout: float) -> Wait:
        """The end: every request in flight answered (each bounded by the request ``timeout``)."""
        return Wait(until=time.perf_counter() + timeout + DRAIN_GRACE_S, ready=self._idle, stoppable=False)

    def raise_failure(self) -> None:
        if self.errors:
            raise self.errors[0]

    # --- results -------------------------------------------------------------------------------
    def load_result(self) -> LoadResult:
        assert self.concurrency is not None  # load() is a closed loop
        return LoadResult(self.concurrency, len(self.latencies), sum(self.batches), time.perf_counter() - self.start,
                          np.asarray(self.latencies), self.outputs)

    def measurement(self) -> Measurement:
        assert self.stability is not None  # measure() gives it
        return Measurement(self.stability, self.windows, self.window_latencies, self.concurrency, self.rate,
                           time.perf_counter() - self.start, sent=self.sent, late=self.late,
                           completed=len(self.latencies), readings=list(self.readings),
                           books_matched=self.books_matched)


def _nothing() -> None:
    pass


# --------------------------------------------------------------------------------------------
# Transports


class AsyncioTransport:
    """Requests on tritonclient's asyncio client of either protocol, on the client's event loop
    (module docstring)."""

    def __init__(self, client: Inference, run: LoadRun) -> None:
        self.client = client
        self.run = run
        self.requests = None if run.use_shm else [client.build_request(p, None) for p in run.payloads]
        self._tasks: set[asyncio.Future[None]] = set()
        self._stopped = asyncio.Event()
        self._waits: list[tuple[Callable[[], bool], asyncio.Event]] = []  # conditions waited for, each with its wake-up

    def drive(self) -> None:
        self.client.run_async(self._drive())

    async def _drive(self) -> None:
        run = self.run
        run.on_change = self._on_change
        courses: list[asyncio.Future[None]] = []
        try:
            run.begin(self)
            # side by side: the run's own course, and the open loop's sender
            courses = [asyncio.ensure_future(self._follow(run.main()))]
            if run.open_loop:
                courses.append(asyncio.ensure_future(self._follow(run.schedule(self))))
            await asyncio.gather(*courses)
            if run.errors:
                for t in list(self._tasks):
                    t.cancel()
            await self._follow([run.drain(self.client.timeout)])
        except BaseException:
            run.stop()
            rest = [*courses, *self._tasks]
            for t in rest:
                t.cancel()
            if rest:
                await asyncio.wait(rest, timeout=self.client.timeout + DRAIN_GRACE_S)
            raise
        run.raise_failure()

    def _on_change(self) -> None:
        """After an answer or the stop: wake the waits whose condition holds now (checked here
        rather than by waking every wait at every answer)."""
        stopped = self.run.stopped.is_set()
        if stopped:
            self._stopped.set()
        for ready, event in self._waits:
            if stopped or ready():
                event.set()

    async def _follow(self, course: Iterable[Step]) -> None:
        """Follow one course, waiting and reading the server where it says; a failure in it fails the run."""
        try:
            for w in course:
                if isinstance(w, Fetch):
                    w.into.append(await w.call())
                else:
                    await self._wait(w)
        except Exception as exc:
            self.run.fail(exc)

    async def _wait(self, w: Wait) -> None:
        run = self.run
        if w.ready is None:  # a time: only the stop ends it early
            wait_s = (w.until or 0.0) - time.perf_counter()
            if wait_s > 0 and w.stoppable:
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), wait_s)
            elif wait_s > 0:
                await asyncio.sleep(wait_s)
            return
        entry = (w.ready, asyncio.Event())
        self._waits.append(entry)
        try:
            while not (w.stoppable and run.stopped.is_set()) and not w.ready():
                left = None if w.until is None else w.until - time.perf_counter()
                if left is not None and left <= 0:
                    return
                entry[1].clear()
                if left is None:
                    await entry[1].wait()
                else:
                    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                        await asyncio.wait_for(entry[1].wait(), left)
        finally:
            self._waits.remove(entry)

    def send(self, number: int, slot: int | None) -> None:
        task = asyncio.ensure_future(self._chain(number, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _chain(self, number: int, slot: int | None) -> None:
        """One chain: its requests one after the other (one request in the open loop)."""
        run = self.run
        i: int | None = number
        while i is not None:
            p = run.payload(i)
            t0 = time.perf_counter()
            try:
                out = await self.client.infer_async(p, slot, None if self.requests is None else
                                                    self.requests[i % len(self.requests)])
            except asyncio.CancelledError as exc:
                run.completed(Completion(i, slot, p.batch, t0, time.perf_counter(), error=exc))
                raise
            except Exception as exc:
                i = run.completed(Completion(i, slot, p.batch, t0, time.perf_counter(), error=exc))
            else:
                i = run.completed(Completion(i, slot, p.batch, t0, time.perf_counter(), outputs=out))


class CallbackTransport:
    """gRPC's ``async_infer`` with completion callbacks, without an event loop (module
    docstring). Chosen to measure over gRPC: on a machine whose cores the server shares, the
    asyncio client cost throughput against a plain synchronous client and this one did not
    (docs/serving.md, bench/measurement.py)."""

    def __init__(self, client: Inference, run: LoadRun) -> None:
        self.client = client
        self.run = run
        self.requests = None if run.use_shm else [client.build_request(p, None) for p in run.payloads]

    def drive(self) -> None:
        run = self.run
        sender = None
        try:
            run.begin(self)
            if run.open_loop:
                sender = threading.Thread(target=self._follow, args=(run.schedule(self),), name="trtrepo-open-loop",
                                          daemon=True)
                sender.start()
            self._follow(run.main())
        finally:
            run.stop()
            if sender is not None:
                sender.join(self.client.timeout + DRAIN_GRACE_S)
            self._wait(run.drain(self.client.timeout))
        run.raise_failure()

    def _follow(self, course: Iterable[Step]) -> None:
        """Follow one course, waiting where it says, reading the server on the client's event loop
        (idle on this thread: requests go through gRPC's threads); a failure in it fails the run."""
        try:
            for w in course:
                if isinstance(w, Fetch):
                    w.into.append(self.client.run_async(w.call()))
                else:
                    self._wait(w)
        except Exception as exc:
            self.run.fail(exc)

    def _wait(self, w: Wait) -> None:
        run = self.run
        if w.ready is None:  # a time: only the stop ends it early (answers do not wake it)
            wait_s = (w.until or 0.0) - time.perf_counter()
            if wait_s > 0:
                if w.stoppable:
                    run.stopped.wait(wait_s)
                else:
                    time.sleep(wait_s)
            return
        with run.cond:
            while not (w.stoppable and run.stopped.is_set()) and not w.ready():
                left = None if w.until is None else w.until - time.perf_counter()
                if left is not None and left <= 0:
                    return
                run.cond.wait(left)

    def send(self, number: int, slot: int | None) -> None:
        run, client = self.run, self.client
        p = run.payload(number)
        try:
            request = self.requests[number % len(self.requests)] if self.requests is not None else \
                client.build_request(p, slot)
        except BaseException as exc:
            run.completed(Completion(number, slot, p.batch, 0.0, 0.0, error=exc))
            return
        t0 = time.perf_counter()

        def done(result: Any, error: Any) -> None:  # on a gRPC thread
            t1 = time.perf_counter()
            if error is not None:
                c = Completion(number, slot, p.batch, t0, t1, error=client.request_error(error))
            else:
                try:
                    c = Completion(number, slot, p.batch, t0, t1, outputs=client.read_result(result, p, slot))
                except BaseException as exc:
                    c = Completion(number, slot, p.batch, t0, t1, error=exc)
            nxt = run.completed(c)
            if nxt is not None:
                self.send(nxt, slot)

        try:
            client.infer_with_callback(request, done)
        except BaseException as exc:
            run.completed(Completion(number, slot, p.batch, t0, time.perf_counter(), error=client.request_error(exc)))


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class LoadResult:
    concurrency: int
    requests: int
    inferences: int
    wall_s: float
    latencies_s: np.ndarray
    outputs: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.inferences / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class Measurement:
    """One level measured in windows (:meth:`~trtrepo.validate.client.TritonTarget.measure`):
    every window, and the reported figures of the last ones merged."""

    stability: Stability
    windows: list[dict[str, Any]]
    window_latencies: list[np.ndarray]
    concurrency: int | None
    rate: float | None
    total_s: float
    sent: int = 0  # open loop: requests sent
    late: int = 0  # open loop: requests sent more than 1 ms after their time
    completed: int = 0  # every request answered, in the windows or after the last one
    readings: list[Mapping[str, Any]] = field(default_factory=list)  # the server's statistics at the start and each window's end
    books_matched: bool = False  # the windows were cut where the server's count stood (LoadRun, ServerBooks)

    @property
    def stable(self) -> bool:
        return is_stable(self.windows, self.stability.pct, self.stability.latency_key)

    def merged(self) -> tuple[np.ndarray, int, float]:
        return merged(self.windows, self.window_latencies)

    def reported_readings(self) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        """The server's statistics at the start and the end of the windows :meth:`merged` reports
        (their diff covers the same requests as the client figures), or None when the windows were
        not cut where the server's count stood."""
        k = min(STABLE_WINDOWS, len(self.windows))
        if not self.books_matched or k == 0 or len(self.readings) != len(self.windows) + 1:
            return None
        return self.readings[-k - 1], self.readings[-1]

    @property
    def throughput(self) -> float:
        _, inferences, seconds = self.merged()
        return inferences / seconds if seconds > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        lat, _, _ = self.merged()
        return latency_ms(lat, self.stability.percentiles)

    def summary(self) -> dict[str, Any]:
        """The level as reported: merged figures, stability, spread and every window."""
        lat, inferences, seconds = self.merged()
        out: dict[str, Any] = {"requests": int(len(lat)), "inferences": inferences, "wall_s": seconds,
                               "throughput": inferences / seconds if seconds > 0 else 0.0,
                               "client_ms": self.latency_ms(), "stable": self.stable,
                               "spread_pct": spread(self.windows, self.stability.latency_key),
                               "windows": [dict(w) for w in self.windows], "completed": self.completed,
                               "measured_s": self.total_s}
        if self.rate is not None:
            out.update(request_rate=self.rate, sent=self.sent, sent_late=self.late,
                       late_share=self.late / self.sent if self.sent else 0.0)
        return out
