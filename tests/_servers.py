"""A real tritonserver for one test, killed when the test is done with it.

Triton's graceful exit polls its model count once a second: a stopped server takes about 2.4 s
(two polls while the Python backend stub unloads), which a test that only needs the server to
answer pays for nothing. These servers are stopped with ``TritonServer.stop(grace=0)``: SIGTERM,
then SIGKILL of the process group (the Python stubs with it) and removal of the server's shared
memory regions, the same cleanup as a graceful stop. The graceful path itself is tested where it is
the subject (``test_server_e2e.py``: ``trtrepo serve`` stops on SIGINT)."""

from __future__ import annotations

import contextlib
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

