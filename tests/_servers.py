"""A real tritonserver for one test, killed when the test is done with it.

Triton's graceful exit polls its model count once a second: a stopped server takes about 2.4 s
(two polls while the Python backend stub unloads), which a test that only needs the server to
answer pays for nothing. These servers are stopped with ``TritonServer.stop(grace=0)``: SIGTERM,
then SIGKILL of the process group (the Python stubs with it) and removal of the server's shared
memory regions, the same cleanup as a graceful stop. The graceful path itself is tested where it is
the subject (``test_server_e2e.py``: ``trtrepo serve`` stops on SIGINT)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

from trtrepo.server import TritonServer


@contextlib.contextmanager
def live_server(repo: Any, **kw: Any) -> Iterator[TritonServer]:
    server = TritonServer(repo, **kw)
    try:
        yield server.start()
    finally:
        server.stop(grace=0)



@contextlib.contextmanager
def silent_tcp_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """``(http://127.0.0.1:PORT, connections)``: a TCP server that accepts every connection
    (kept in ``connections``, in order) and never sends a byte; closed when the block ends."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", held
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()
