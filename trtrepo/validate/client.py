"""The Triton client: :class:`TritonTarget` (readiness, metadata, requests, shared memory, load
generation on tritonclient's asyncio clients, every call bounded)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..contracts.payload import Payload, check_shape
from ..errors import TrtrepoError, UsageError
from ..measure import Stability
from ..modelio import ModelIO
from .contract import _as_int_list, _booked
from .options import ValidateOptions, _one_line
from .shm import SharedMemory

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Requests


class TritonTarget:
    """A model on a Triton server, reached with tritonclient's asyncio client on a private
    event loop. Synchronous methods; every call bounded by ``timeout``. A context manager."""

    def __init__(self, options: ValidateOptions) -> None:
        self.options = options
        self.url = options.url
        self.protocol = options.protocol
        self.model = options.model
        self.version = str(options.version or "")
        self.timeout = options.timeout
        # Server calls other than inference (readiness, metadata, statistics) get at least 10 s,
        # so a tight --timeout for requests does not fail the set-up.
        self.admin_timeout = max(options.timeout, 10.0)
        if self.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module  # type: ignore[no-redef]
            import tritonclient.http.aio as aio  # type: ignore[no-redef]
        self._mod = module
        self._aio = aio
        self._loop = asyncio.new_event_loop()
        self._client: Any = None
        self._sync: Any = None  # tritonclient.grpc's synchronous client, for measure()
        self._io: ModelIO | None = None
        self.shm = SharedMemory(self._call_now, self.url, self._where())
        self._run(self._connect(), self.admin_timeout)

    # --- plumbing ---------------------------------------------------------------------------
    async def _connect(self) -> None:
        if self.protocol == "grpc":
            self._client = self._aio.InferenceServerClient(self.url)
        else:
            self._client = self._aio.InferenceServerClient(self.url, conn_timeout=self.admin_timeout,
                                                           conn_limit=max(100, *self.options.concurrency))

    def _run(self, coro: Any, timeout: float | None) -> Any:
        async def bounded() -> Any:
            return await asyncio.wait_for(coro, timeout) if timeout else await coro

        return self._loop.run_until_complete(bounded())

    async def _call(self, name: str, *args: Any, bound: float | None = None, **kw: Any) -> Any:
        fn = getattr(self._client, name)
        bound = self.admin_timeout if bound is None else max(0.05, min(bound, self.admin_timeout))
        if self.protocol == "grpc":
            kw.setdefault("client_timeout", bound)
            if name.startswith("get_"):
                kw.setdefault("as_json", True)
        return await asyncio.wait_for(fn(*args, **kw), bound)

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        """One administrative call (``get_model_metadata``...) as JSON, bounded by the timeout."""
        try:
            return self._run(self._call(name, *args, **kw), None)
        except (asyncio.TimeoutError, TimeoutError):
            raise TrtrepoError(f"{self._where()}: {name} got no answer within {self.admin_timeout:g}s") from None

    def _where(self) -> str:
        return f"Triton at {self.url} ({self.protocol})"

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.release_shared_memory()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._run(self._client.close(), 5.0)
        if getattr(self, "_sync", None) is not None:
            with contextlib.suppress(Exception):
                self._sync.close()
        with contextlib.suppress(Exception):
            pending = asyncio.all_tasks(self._loop)
            for t in pending:
                t.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.wait(pending, timeout=5.0))
        self._loop.close()

    def __enter__(self) -> TritonTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- readiness --------------------------------------------------------------------------
    def repository_index(self) -> list[dict[str, Any]]:
        idx = self.call("get_model_repository_index")
        if isinstance(idx, dict):
            idx = idx.get("models", [])
        return [dict(m) for m in idx]

    def wait_ready(self, timeout: float | None = None) -> dict[str, Any]:
        """Wait (backoff 50 ms doubling to 1 s, at most ``timeout``) until the server answers and
        the model is ready. Unreachable server or unknown model: :class:`UsageError` (exit 2);
        a model that failed to load or stays unready: :class:`TrtrepoError` (exit 1)."""
        timeout = self.options.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        delay = 0.05
        last_error = ""
        live = False
        info: dict[str, Any] = {}
        refused_since: float | None = None
        grace = self.options.refused_grace
        while True:
            state = None
            refused = False
            try:
                left = deadline - time.monotonic()
                live = bool(self._run(self._call("is_server_live", bound=left), None))
                if live:
                    info["server_ready"] = bool(self._run(self._call("is_server_ready", bound=left), None))
                    if self._run(self._call("is_model_ready", self.model, self.version, bound=left), None):
                        break
                    state = self._model_state()
            except (asyncio.TimeoutError, TimeoutError):
                last_error = f"no answer within {self.admin_timeout:g}s"
            except UsageError:
                raise
            except TrtrepoError:
                raise
            except Exception as exc:
                last_error = _one_line(exc)
                refused = _refused(exc)
            if state is not None:
                last_error = state
            now = time.monotonic()
            refused_since = (refused_since or now) if refused else None
            if refused_since is not None and grace is not None and now - refused_since >= grace:
                raise UsageError(f"cannot reach {self._where()}: connection refused (nothing listens there); "
                                 f"start one with: trtrepo serve REPO")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if not live:
                    raise UsageError(f"cannot reach {self._where()} within {timeout:g}s: {last_error}")
                raise TrtrepoError(f"model '{self.model}'{self._vtext()} on {self._where()} is not ready after "
                                   f"{timeout:g}s: {last_error}")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)
        meta = self.call("get_server_metadata")
        info.update(server_live=True, server_version=str(meta.get("version", "")),
                    extensions=list(meta.get("extensions", [])))
        return info

    def _vtext(self) -> str:
        return f" version {self.version}" if self.version else ""

    def _model_state(self) -> str:
        """Why the model is not ready; raises at once when it can never become ready."""
        index = self.repository_index()
        rows = [m for m in index if m.get("name") == self.model]
        if not rows:
            names = ", ".join(sorted({str(m.get("name")) for m in index})) or "none"
            raise UsageError(f"model '{self.model}' is not in the repository of {self._where()} (models: {names})")
        if self.version:
            vrows = [m for m in rows if str(m.get("version", "")) == self.version]
            if not vrows:
                have = ", ".join(sorted(str(m.get("version", "?")) for m in rows))
                raise UsageError(f"model '{self.model}' has no version {self.version} on {self._where()} (versions: {have})")
            rows = vrows
        # The reason can hold a Python traceback from the backend: keep its first line.
        states = [(str(m.get("version", "")), str(m.get("state", "")), _one_line(Exception(str(m.get("reason", ""))))[:300])
                  for m in rows]
        states = [(v, st, "" if r == "Exception" else r) for v, st, r in states]
        text = "; ".join(f"version {v or '?'} {s or 'UNKNOWN'}{': ' + r if r else ''}" for v, s, r in states)
        if all(s == "UNAVAILABLE" and r and r != "unloaded" for _, s, r in states):
            raise TrtrepoError(f"model '{self.model}' failed to load on {self._where()}: {text}")
        return text

    # --- contract ---------------------------------------------------------------------------
    def metadata(self) -> dict[str, Any]:
        return dict(self.call("get_model_metadata", self.model, self.version))

    def config(self) -> dict[str, Any]:
        cfg = dict(self.call("get_model_config", self.model, self.version))
        return dict(cfg.get("config", cfg))

    def resolve_version(self, metadata: Mapping[str, Any]) -> str:
        """The version the statistics are read for: ``--version`` or the one ready version."""
        if self.version:
            return self.version
        versions = [str(v) for v in metadata.get("versions", [])]
        return max(versions, key=int) if versions else ""

    def statistics(self, version: str) -> dict[str, Any]:
        return dict(self.call("get_inference_statistics", self.model, version))

    def settled_statistics(self, version: str, at_least: int | None = None, wait: float = 2.0) -> dict[str, Any]:
        """Statistics once the server has booked every finished request: Triton updates them
        when it releases a request, which can be just after the client got the response. Polls
        (bounded by ``wait``) until the request count reaches ``at_least`` and stops moving."""
        deadline = time.monotonic() + wait
        prev = self.statistics(version)
        while time.monotonic() < deadline:
            time.sleep(0.02)
            cur = self.statistics(version)
            n_prev, n_cur = _booked(prev, self.model, version), _booked(cur, self.model, version)
            if n_cur == n_prev and (at_least is None or n_cur >= at_least):
                return cur
            prev = cur
        return prev

    # --- shared memory ------------------------------------------------------------------------
    def _call_now(self, name: str, *args: Any) -> Any:
        """One administrative call, raising what the client raises (shared-memory bookkeeping)."""
        return self._run(self._call(name, *args), None)

    def setup_shared_memory(self, kind: str, slots: int, payloads: Sequence[Payload]) -> None:
        """Create and register regions for ``slots`` concurrent requests, sized for the largest
        input and output of ``payloads`` (:meth:`SharedMemory.setup`)."""
        self.shm.setup(kind, slots, payloads, self._io)

    def release_shared_memory(self) -> None:
        self.shm.release()

    # --- inference ----------------------------------------------------------------------------
    def prepare(self, io: ModelIO) -> None:
        """The served IO (names and Triton data types) used to build requests."""
        self._io = io

    def _request(self, payload: Payload, slot: int | None) -> tuple[list[Any], list[Any]]:
        assert self._io is not None
        mod = self._mod
        inputs = []
        shm_slot = slot if slot is not None and len(self.shm) > 0 else None
        for spec in self._io.inputs:
            arr = payload.inputs[spec.name]
            t = mod.InferInput(spec.name, list(arr.shape), spec.triton_dtype_short)
            if shm_slot is not None:
                t.set_shared_memory(self.shm.write_input(shm_slot, spec.name, arr), arr.nbytes)
            elif self.protocol == "http":
                t.set_data_from_numpy(arr, binary_data=True)
            else:
                t.set_data_from_numpy(arr)
            inputs.append(t)
        outputs = []
        for spec in self._io.outputs:
            o = mod.InferRequestedOutput(spec.name, binary_data=True) if self.protocol == "http" else mod.InferRequestedOutput(spec.name)
            if shm_slot is not None:
                o.set_shared_memory(*self.shm.output_region(shm_slot, spec.name))
            outputs.append(o)
        return inputs, outputs

    async def _infer(self, payload: Payload, slot: int | None, prebuilt: Any = None) -> dict[str, np.ndarray] | None:
        inputs, outputs = prebuilt if prebuilt is not None else self._request(payload, slot)
        kw: dict[str, Any] = {"model_version": self.version, "outputs": outputs}
        if self.protocol == "grpc":
            kw["client_timeout"] = self.timeout
        try:
            if self.protocol == "grpc":  # the gRPC deadline bounds it; wait_for would add a task per request
                result = await self._client.infer(self.model, inputs, **kw)
            else:
                result = await asyncio.wait_for(self._client.infer(self.model, inputs, **kw), self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            raise TrtrepoError(f"inference request to model '{self.model}' timed out after {self.timeout:g}s (--timeout)") from None
        except Exception as exc:
            raise self._request_error(exc) from exc
        return self._read_result(result, payload, slot)

    def _request_error(self, exc: BaseException) -> TrtrepoError:
        """A failed request as the error trtrepo raises: a lost connection exits 2, a deadline or
        an error answer 1."""
        msg = _one_line(exc)
        if _lost_connection(exc):
            return UsageError(f"lost the connection to the server at {self.url} during inference to model "
                              f"'{self.model}': {msg}")
        if "deadline" in msg.lower():
            return TrtrepoError(f"inference request to model '{self.model}' timed out after {self.timeout:g}s "
                                f"(--timeout): {msg}")
        return TrtrepoError(f"inference request to model '{self.model}' failed: {msg}")

    def _read_result(self, result: Any, payload: Payload, slot: int | None) -> dict[str, np.ndarray]:
        """The outputs of a response (from the response or the slot's shared memory), shapes checked."""
        where = f"model '{self.model}' response"
        assert self._io is not None
        if slot is not None and len(self.shm) > 0:
            out: dict[str, np.ndarray] = {}
            for spec in self._io.outputs:
                o = result.get_output(spec.name)
                if o is None:
                    raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
                shape = _as_int_list(o["shape"] if isinstance(o, dict) else o.shape)
                check_shape(spec.name, shape, payload.expected[spec.name], where)
                out[spec.name] = self.shm.read_output(slot, spec.name, np.dtype(spec.dtype), shape)
            return out
        out = {}
        for spec in self._io.outputs:
            try:
                arr = result.as_numpy(spec.name)
            except Exception as exc:  # the client fails to reshape an empty body
                raise TrtrepoError(f"{where}: output '{spec.name}' cannot be read ({_one_line(exc)}); "
                                   f"check the Python backend environment (numpy<2)") from exc
            if arr is None:
                raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
            check_shape(spec.name, arr.shape, payload.expected[spec.name], where)
            out[spec.name] = arr
        return out

    def infer(self, payload: Payload) -> dict[str, np.ndarray]:
        """One request, outputs as numpy (shapes checked)."""
        out = self._run(self._infer(payload, None), None)
        assert out is not None
        return out

    def load(self, payloads: Sequence[Payload], concurrency: int, *, requests: int | None = None,
             duration: float | None = None, keep: bool = False, use_shm: bool = False,
             progress: Callable[[int], None] | None = None) -> LoadResult:
        """Keep ``concurrency`` requests in flight, cycling through ``payloads``, until
        ``requests`` were sent or ``duration`` seconds passed. Each response's shape is checked;
        the first failure stops the run and raises. ``keep``: return the outputs too (in
        payload order, for the accuracy phase)."""
        return self._run(self._load(payloads, concurrency, requests, duration, keep, use_shm, progress), None)

    async def _load(self, payloads: Sequence[Payload], concurrency: int, requests: int | None, duration: float | None,
                    keep: bool, use_shm: bool, progress: Callable[[int], None] | None) -> LoadResult:
        if not payloads:
            raise UsageError("no data to send")
        latencies: list[float] = []
        outputs: dict[int, dict[str, np.ndarray]] = {}
        inferences = 0
        counter = 0
        prebuilt = None if use_shm else [self._request(p, None) for p in payloads]
        start = time.perf_counter()
        end = start + duration if duration is not None else math.inf

        async def worker(slot: int) -> None:
            nonlocal counter, inferences
            while True:
                if requests is not None and counter >= requests:
                    return
                if time.perf_counter() >= end:
                    return
                i = counter
                counter += 1
                p = payloads[i % len(payloads)]
                t0 = time.perf_counter()
                out = await self._infer(p, slot if use_shm else None,
                                        None if prebuilt is None else prebuilt[i % len(payloads)])
                latencies.append(time.perf_counter() - t0)
                inferences += p.batch
                if keep and out is not None:
                    outputs[i] = out
                if progress is not None:
                    progress(1)

        tasks = [asyncio.ensure_future(worker(s)) for s in range(concurrency)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=self.timeout + 1.0)
            raise
        wall = time.perf_counter() - start
        return LoadResult(concurrency, len(latencies), inferences, wall, np.asarray(latencies), outputs)


    def measure(self, payloads: Sequence[Payload], stability: Stability, *, concurrency: int | None = None,
                rate: float | None = None, distribution: str = "constant", use_shm: bool = False,
                progress: Callable[[int], None] | None = None, seed: int = 0) -> Measurement:
        """Load the model without pause -- ``concurrency`` requests in flight (closed loop), or
        requests sent at ``rate`` per second whether or not earlier ones returned (open loop) --
        and cut it into windows by completion time until the last ones are stable
        (:mod:`trtrepo.measure`). Each response's shape is checked; the first failure stops the
        run and raises."""
        if (concurrency is None) == (rate is None):
            raise UsageError("give a concurrency or a request rate")
        if self.protocol == "grpc":
            return self._measure_callbacks(payloads, stability, concurrency, rate, distribution, use_shm, progress, seed)
        return self._run(self._measure(payloads, stability, concurrency, rate, distribution, use_shm, progress, seed), None)

    async def _measure(self, payloads: Sequence[Payload], stability: Stability, concurrency: int | None,
                       rate: float | None, distribution: str, use_shm: bool, progress: Callable[[int], None] | None,
                       seed: int) -> Measurement:
        from ..measure import is_stable, send_times, window_summary

        if not payloads:
            raise UsageError("no data to send")
        done_lat: list[float] = []
        done_inf: list[int] = []
        done_t: list[float] = []
        prebuilt = None if use_shm else [self._request(p, None) for p in payloads]
        slots = list(range(len(self.shm))) if use_shm else []
        counter = 0
        stop = asyncio.Event()
        late = 0
        sent = 0

        async def one(i: int, slot: int | None) -> None:
            p = payloads[i % len(payloads)]
            t0 = time.perf_counter()
            await self._infer(p, slot, None if prebuilt is None else prebuilt[i % len(payloads)])
            t1 = time.perf_counter()
            done_lat.append(t1 - t0)
            done_inf.append(p.batch)
            done_t.append(t1)
            if progress is not None:
                progress(1)

        async def worker(slot: int) -> None:
            nonlocal counter
            while not stop.is_set():
                i = counter
                counter += 1
                await one(i, slot if use_shm else None)

        in_flight: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []

        def finished(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            if not task.cancelled() and task.exception() is not None:
                errors.append(task.exception())  # type: ignore[arg-type]
                stop.set()
            if use_shm and hasattr(task, "slot"):
                slots.append(task.slot)

        async def scheduler() -> None:
            nonlocal late, sent
            assert rate is not None
            block = max(64, int(rate * stability.interval_s * 2))
            offsets = send_times(rate, block, distribution, seed)
            base = time.perf_counter()
            k = 0
            while not stop.is_set():
                if k == len(offsets):
                    base += float(offsets[-1]) + (1.0 / rate)
                    offsets = send_times(rate, block, distribution, seed + sent)
                    k = 0
                due = base + float(offsets[k])
                wait = due - time.perf_counter()
                if wait > 0:
                    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                    if stop.is_set():
                        break
                while len(in_flight) >= self._max_in_flight() or (use_shm and not slots):
                    await asyncio.sleep(0.0005)
                    if stop.is_set():
                        return
                if time.perf_counter() - due > 1e-3:
                    late += 1
                slot = slots.pop() if use_shm else None
                task = asyncio.ensure_future(one(sent, slot))
                task.slot = slot  # type: ignore[attr-defined]
                in_flight.add(task)
                task.add_done_callback(finished)
                sent += 1
                k += 1

        windows: list[dict[str, Any]] = []
        latencies: list[np.ndarray] = []

        async def monitor() -> None:
            mark = 0
            w_start = time.perf_counter()
            while not stop.is_set():
                if stability.requests is None:
                    with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                        await asyncio.wait_for(stop.wait(), stability.interval_s)
                else:
                    while len(done_lat) - mark < stability.requests and not stop.is_set():
                        await asyncio.sleep(0.002)
                if stop.is_set():
                    return
                if stability.requests is None:
                    now, end = time.perf_counter(), len(done_lat)
                else:  # the window ends with its last request's answer
                    end = mark + stability.requests
                    now = done_t[end - 1]
                lat = np.asarray(done_lat[mark:end])
                windows.append(window_summary(lat, sum(done_inf[mark:end]), now - w_start, stability.percentiles))
                latencies.append(lat)
                mark, w_start = end, now
                if len(windows) >= stability.max_trials or is_stable(windows, stability.pct, stability.latency_key):
                    stop.set()

        start = time.perf_counter()
        if concurrency is not None:
            tasks = [asyncio.ensure_future(worker(s)) for s in range(concurrency)]
        else:
            tasks = [asyncio.ensure_future(scheduler())]
        mon = asyncio.ensure_future(monitor())
        try:
            pending: set[Any] = {*tasks, mon}
            while pending and not mon.done():
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if t is not mon and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            if errors:
                raise errors[0]
            stop.set()
            await asyncio.gather(*tasks)
            if in_flight:
                await asyncio.gather(*list(in_flight), return_exceptions=True)
        except BaseException:
            stop.set()
            rest = [*tasks, mon, *in_flight]
            for t in rest:
                t.cancel()
            await asyncio.wait(rest, timeout=self.timeout + 1.0)
            raise
        return Measurement(stability, windows, latencies, concurrency, rate, time.perf_counter() - start,
                           sent=sent, late=late, completed=len(done_lat))

    def _sync_client(self) -> Any:
        if getattr(self, "_sync", None) is None:
            self._sync = self._mod.InferenceServerClient(self.url)
        return self._sync

    def _measure_callbacks(self, payloads: Sequence[Payload], stability: Stability, concurrency: int | None,
                           rate: float | None, distribution: str, use_shm: bool,
                           progress: Callable[[int], None] | None, seed: int) -> Measurement:
        """:meth:`measure` over gRPC without an event loop: tritonclient's ``async_infer`` with
        completion callbacks on gRPC's threads, each callback sending its chain's next request
        (closed loop) -- perf_analyzer's asynchronous mode. On a 2-core machine that shares its
        cores with the server, the asyncio client cost up to a fifth of the throughput at
        concurrency 1 against a plain synchronous client; this one matched it (bench/measurement.py)."""
        import itertools
        import threading

        from ..measure import is_stable, send_times, window_summary

        if not payloads:
            raise UsageError("no data to send")
        client = self._sync_client()
        prebuilt = None if use_shm else [self._request(p, None) for p in payloads]
        lock = threading.Condition()
        done_lat: list[float] = []
        done_inf: list[int] = []
        done_t: list[float] = []
        errors: list[BaseException] = []
        stop = threading.Event()
        state = {"in_flight": 0, "sent": 0, "late": 0}
        free_slots = list(range(len(self.shm))) if use_shm else []
        counter = itertools.count()
        n = len(payloads)

        def finish(slot: int | None) -> None:
            with lock:
                state["in_flight"] -= 1
                if slot is not None:
                    free_slots.append(slot)
                lock.notify_all()

        def send(i: int, slot: int | None) -> None:
            p = payloads[i % n]
            try:
                inputs, outputs = prebuilt[i % n] if prebuilt is not None else self._request(p, slot)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
                finish(slot)
                return
            t0 = time.perf_counter()

            def done(result: Any, error: Any) -> None:
                t1 = time.perf_counter()
                try:
                    if error is not None:
                        raise self._request_error(error)
                    self._read_result(result, p, slot)
                except BaseException as exc:
                    errors.append(exc)
                    stop.set()
                else:
                    with lock:
                        done_lat.append(t1 - t0)
                        done_inf.append(p.batch)
                        done_t.append(t1)
                        lock.notify_all()
                    if progress is not None:
                        progress(1)
                if concurrency is not None and not stop.is_set():
                    send(next(counter), slot)
                else:
                    finish(slot)

            try:
                client.async_infer(self.model, inputs, done, model_version=self.version, outputs=outputs,
                                   client_timeout=self.timeout)
            except BaseException as exc:
                errors.append(self._request_error(exc))
                stop.set()
                finish(slot)

        def open_loop() -> None:
            assert rate is not None
            block = max(64, int(rate * stability.interval_s * 2))
            offsets = send_times(rate, block, distribution, seed)
            base = time.perf_counter()
            k = 0
            while not stop.is_set():
                if k == len(offsets):
                    base += float(offsets[-1]) + 1.0 / rate
                    offsets = send_times(rate, block, distribution, seed + state["sent"])
                    k = 0
                due = base + float(offsets[k])
                wait = due - time.perf_counter()
                if wait > 0 and stop.wait(wait):
                    return
                with lock:
                    while not stop.is_set() and (state["in_flight"] >= self._max_in_flight() or (use_shm and not free_slots)):
                        lock.wait(0.01)
                    if stop.is_set():
                        return
                    slot = free_slots.pop() if use_shm else None
                    state["in_flight"] += 1
                    if time.perf_counter() - due > 1e-3:
                        state["late"] += 1
                    i = state["sent"]
                    state["sent"] += 1
                send(i, slot)
                k += 1

        start = time.perf_counter()
        sender = None
        if concurrency is not None:
            with lock:
                state["in_flight"] = concurrency
            for s in range(concurrency):
                send(next(counter), s if use_shm else None)
        else:
            sender = threading.Thread(target=open_loop, name="trtrepo-open-loop", daemon=True)
            sender.start()
        windows: list[dict[str, Any]] = []
        latencies: list[np.ndarray] = []
        mark = 0
        w_start = start
        try:
            while not stop.is_set():
                with lock:
                    if stability.requests is None:
                        deadline = w_start + stability.interval_s
                        while not stop.is_set() and time.perf_counter() < deadline:
                            lock.wait(max(0.0, deadline - time.perf_counter()))
                        now, end = time.perf_counter(), len(done_lat)
                    else:
                        while not stop.is_set() and len(done_lat) - mark < stability.requests:
                            lock.wait(0.05)
                        end = mark + stability.requests
                        now = done_t[end - 1] if end <= len(done_t) else time.perf_counter()
                    if stop.is_set():
                        break
                    lat = np.asarray(done_lat[mark:end])
                    inferences = sum(done_inf[mark:end])
                windows.append(window_summary(lat, inferences, now - w_start, stability.percentiles))
                latencies.append(lat)
                mark, w_start = end, now
                if len(windows) >= stability.max_trials or is_stable(windows, stability.pct, stability.latency_key):
                    break
        except BaseException:
            stop.set()
            raise
        finally:
            stop.set()
            if sender is not None:
                sender.join(self.timeout + 1.0)
            with lock:  # every request in flight answers or times out (client_timeout)
                deadline = time.perf_counter() + self.timeout + 1.0
                while state["in_flight"] > 0 and time.perf_counter() < deadline:
                    lock.wait(0.05)
        if errors:
            raise errors[0]
        sent = state["sent"] if rate is not None else 0
        return Measurement(stability, windows, latencies, concurrency, rate, time.perf_counter() - start,
                           sent=sent, late=state["late"], completed=len(done_lat))

    def _max_in_flight(self) -> int:
        from .options import MAX_CONCURRENCY

        return MAX_CONCURRENCY


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
    """One level measured in windows (:meth:`TritonTarget.measure`): every window, and the
    reported figures of the last ones merged."""

    stability: Stability
    windows: list[dict[str, Any]]
    window_latencies: list[np.ndarray]
    concurrency: int | None
    rate: float | None
    total_s: float
    sent: int = 0  # open loop: requests sent
    late: int = 0  # open loop: requests sent more than 1 ms after their time
    completed: int = 0  # every request answered, in the windows or after the last one

    @property
    def stable(self) -> bool:
        from ..measure import is_stable

        return is_stable(self.windows, self.stability.pct, self.stability.latency_key)

    def merged(self) -> tuple[np.ndarray, int, float]:
        from ..measure import merged

        return merged(self.windows, self.window_latencies)

    @property
    def throughput(self) -> float:
        _, inferences, seconds = self.merged()
        return inferences / seconds if seconds > 0 else 0.0

    def latency_ms(self) -> dict[str, float]:
        from ..measure import latency_ms

        lat, _, _ = self.merged()
        return latency_ms(lat, self.stability.percentiles)

    def summary(self) -> dict[str, Any]:
        """The level as reported: merged figures, stability, spread and every window."""
        from ..measure import spread

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


_CONNECTION_SIGNS = ("unavailable", "connection refused", "socket closed", "connection reset", "failed to connect",
                     "server disconnected", "cannot connect", "broken pipe", "connection aborted")


def _refused(exc: BaseException) -> bool:
    """The server's port refused the connection (nothing listens), as opposed to a timeout."""
    if isinstance(exc, ConnectionRefusedError) or isinstance(getattr(exc, "os_error", None), ConnectionRefusedError):
        return True  # aiohttp's ClientConnectorError carries the socket's error
    text = f"{type(exc).__name__} {exc}".lower()
    return "refused" in text or "connect call failed" in text


def _lost_connection(exc: BaseException) -> bool:
    """A request that failed because the server went away (exit 2, like an unreachable server),
    not because it answered with an error (exit 1)."""
    if isinstance(exc, (ConnectionError, OSError)) or type(exc).__name__ in ("ClientConnectorError",
                                                                             "ServerDisconnectedError"):
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(sign in text for sign in _CONNECTION_SIGNS)
