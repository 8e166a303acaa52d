"""The Triton client: :class:`TritonTarget` (connection, readiness, metadata and statistics, requests
and their answers, every call bounded); load generation is :mod:`~trtrepo.validate.load` over its
requests, shared memory :mod:`~trtrepo.validate.shm`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

import numpy as np

from ..contracts.payload import Payload, check_shape
from ..errors import TrtrepoError, UsageError, one_line
from ..measure import Stability
from ..modelio import ModelIO
from .contract import as_int_list, booked
from .load import Arrivals, AsyncioTransport, CallbackTransport, LoadResult, LoadRun, Measurement, ServerBooks
from .options import ValidateOptions
from .shm import SharedMemory

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Requests


class TritonTarget:
    """A model on a Triton server, reached with tritonclient's asyncio client on a private
    event loop (and, to measure over gRPC, the synchronous client's completion callbacks).
    Synchronous methods; every call bounded by ``timeout``. A context manager."""

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
                last_error = one_line(exc)
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

    def _index_rows(self) -> Sequence[Mapping[str, Any]]:
        """The repository index's rows of this model; a model the server does not have is an error
        naming the ones it has."""
        index = self.repository_index()
        rows = [m for m in index if m.get("name") == self.model]
        if not rows:
            names = ", ".join(sorted({str(m.get("name")) for m in index})) or "none"
            raise UsageError(f"model '{self.model}' is not in the repository of {self._where()} (models: {names})")
        return rows

    def _model_state(self) -> str:
        """Why the model is not ready; raises at once when it can never become ready."""
        rows = self._index_rows()
        if self.version:
            vrows = [m for m in rows if str(m.get("version", "")) == self.version]
            if not vrows:
                have = ", ".join(sorted(str(m.get("version", "?")) for m in rows))
                raise UsageError(f"model '{self.model}' has no version {self.version} on {self._where()} (versions: {have})")
            rows = vrows
        states = _version_states(rows)
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

    def server_books(self, version: str, start: Mapping[str, Any]) -> ServerBooks:
        """The server's count of this model's finished requests, read at a measured run's window
        ends from ``start`` (a settled reading) on (:class:`~trtrepo.validate.load.ServerBooks`)."""
        return ServerBooks(lambda: self._call("get_inference_statistics", self.model, version),
                           lambda s: booked(s, self.model, version), start)

    def settled_statistics(self, version: str, at_least: int | None = None, wait: float = 2.0) -> dict[str, Any]:
        """Statistics once the server has booked every finished request: Triton updates them
        when it releases a request, which can be just after the client got the response. Polls
        (bounded by ``wait``) until the request count reaches ``at_least`` and stops moving."""
        deadline = time.monotonic() + wait
        prev = self.statistics(version)
        while time.monotonic() < deadline:
            time.sleep(0.02)
            cur = self.statistics(version)
            n_prev, n_cur = booked(prev, self.model, version), booked(cur, self.model, version)
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

    def build_request(self, payload: Payload, slot: int | None) -> tuple[list[Any], list[Any]]:
        """tritonclient's inputs and requested outputs for ``payload``; with a shared-memory
        ``slot``, the inputs are written into its regions and the outputs asked there."""
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

    async def infer_async(self, payload: Payload, slot: int | None,
                          request: tuple[list[Any], list[Any]] | None = None) -> dict[str, np.ndarray]:
        """One request on the asyncio client (``request``: built already), outputs read and checked."""
        inputs, outputs = request if request is not None else self.build_request(payload, slot)
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
            raise self.request_error(exc) from exc
        return self.read_result(result, payload, slot)

    def infer_with_callback(self, request: tuple[list[Any], list[Any]], done: Callable[[Any, Any], None]) -> None:
        """One request on gRPC's synchronous client; ``done(result, error)`` runs on a gRPC thread."""
        inputs, outputs = request
        self._sync_client().async_infer(self.model, inputs, done, model_version=self.version, outputs=outputs,
                                        client_timeout=self.timeout)

    def run_async(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on this client's event loop (each step inside it bounded on its own)."""
        return self._run(coro, None)

    def request_error(self, exc: BaseException) -> TrtrepoError:
        """A failed request as the error trtrepo raises: a lost connection exits 2, a deadline or
        an error answer 1."""
        msg = one_line(exc)
        if _lost_connection(exc):
            return UsageError(f"lost the connection to the server at {self.url} during inference to model "
                              f"'{self.model}': {msg}")
        if "deadline" in msg.lower():
            return TrtrepoError(f"inference request to model '{self.model}' timed out after {self.timeout:g}s "
                                f"(--timeout): {msg}")
        return TrtrepoError(f"inference request to model '{self.model}' failed: {msg}")

    def read_result(self, result: Any, payload: Payload, slot: int | None) -> dict[str, np.ndarray]:
        """The outputs of a response (from the response or the slot's shared memory), shapes checked."""
        where = f"model '{self.model}' response"
        assert self._io is not None
        if slot is not None and len(self.shm) > 0:
            out: dict[str, np.ndarray] = {}
            for spec in self._io.outputs:
                o = result.get_output(spec.name)
                if o is None:
                    raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
                shape = as_int_list(o["shape"] if isinstance(o, dict) else o.shape)
                check_shape(spec.name, shape, payload.expected[spec.name], where)
                out[spec.name] = self.shm.read_output(slot, spec.name, np.dtype(spec.dtype), shape)
            return out
        out = {}
        for spec in self._io.outputs:
            try:
                arr = result.as_numpy(spec.name)
            except Exception as exc:  # the client fails to reshape an empty body
                raise TrtrepoError(f"{where}: output '{spec.name}' cannot be read ({one_line(exc)}); "
                                   f"check the Python backend environment (numpy<2)") from exc
            if arr is None:
                raise TrtrepoError(f"{where}: output '{spec.name}' is missing")
            check_shape(spec.name, arr.shape, payload.expected[spec.name], where)
            out[spec.name] = arr
        return out

    def infer(self, payload: Payload) -> dict[str, np.ndarray]:
        """One request, outputs as numpy (shapes checked)."""
        return self._run(self.infer_async(payload, None), None)

    def load(self, payloads: Sequence[Payload], concurrency: int, *, requests: int | None = None,
             duration: float | None = None, keep: bool = False, use_shm: bool = False,
             progress: Callable[[int], None] | None = None) -> LoadResult:
        """Keep ``concurrency`` requests in flight, cycling through ``payloads``, until
        ``requests`` were sent or ``duration`` seconds passed (:mod:`~trtrepo.validate.load`'s
        closed loop, on the asyncio client). Each response's shape is checked; the first failure
        stops the run and raises. ``keep``: return the outputs too (by request number, which is
        payload order: for the accuracy phase)."""
        run = LoadRun(payloads, concurrency=concurrency, requests=requests, duration=duration, keep=keep,
                      slots=len(self.shm) if use_shm else None, progress=progress)
        AsyncioTransport(self, run).drive()
        return run.load_result()

    def measure(self, payloads: Sequence[Payload], stability: Stability, *, concurrency: int | None = None,
                rate: float | None = None, distribution: str = "constant", use_shm: bool = False,
                progress: Callable[[int], None] | None = None, seed: int = 0,
                books: ServerBooks | None = None) -> Measurement:
        """Load the model without pause -- ``concurrency`` requests in flight (closed loop), or
        requests sent at ``rate`` per second whether or not earlier ones returned (open loop) --
        and cut it into windows by completion time until the last ones are stable
        (:mod:`trtrepo.measure`, :mod:`trtrepo.validate.load`). Over gRPC the requests go through
        completion callbacks, over HTTP through the asyncio client. Each response's shape is
        checked; the first failure stops the run and raises. ``books``: windows end where the
        server's count of finished requests stands, so its statistics cover the same requests."""
        arrivals = None if rate is None else Arrivals(rate, distribution, seed)
        run = LoadRun(payloads, concurrency=concurrency, arrivals=arrivals, stability=stability,
                      slots=len(self.shm) if use_shm else None, progress=progress, books=books)
        transport: CallbackTransport | AsyncioTransport
        if self.protocol == "grpc":
            self._sync_client()  # made before the clock starts
            transport = CallbackTransport(self, run)
        else:
            transport = AsyncioTransport(self, run)
        transport.drive()
        return run.measurement()

    def _sync_client(self) -> Any:
        if getattr(self, "_sync", None) is None:
            self._sync = self._mod.InferenceServerClient(self.url)
        return self._sync


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


def _version_states(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(version, state, reason) of each index row; the reason can hold a Python traceback from the
    backend: its first line is kept (a bare "Exception" says nothing and is dropped)."""
    states = [(str(m.get("version", "")), str(m.get("state", "")), one_line(Exception(str(m.get("reason", ""))))[:300])
              for m in rows]
    return [(v, st, "" if r == "Exception" else r) for v, st, r in states]
