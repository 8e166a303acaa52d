"""moto's standalone S3 server (``moto_server``) with its conditional writes made atomic, as S3's are.

moto 5.2 checks a PUT's ``If-None-Match: *`` (and a PUT's or DELETE's ``If-Match``) and then writes,
in two steps, on a threaded HTTP server: two conditional PUTs of one key at the same instant can both
succeed. AWS S3 documents conditional writes as atomic, and trtrepo's writer lock
(:func:`trtrepo.objectstore.writer_lock`) relies on it. On the unpatched server, in one loaded CI
run, two of three concurrent ``repo add`` reported version 1
(tests/test_objectstore.py::test_three_concurrent_adds_to_one_s3_model_get_distinct_versions_and_lose_nothing);
moto's check-then-write is the one window found by reading the code (not reproduced in 8 loaded
reruns of the test, nor in 400 bursts of 8 simultaneous conditional PUTs). One lock around moto's
object PUT, multipart completion and DELETE handlers closes it; everything else is moto's own server.

    python tests/_moto_server.py -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_WRITES = threading.Lock()


def _atomic(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _WRITES:
            return method(self, *args, **kwargs)

    return locked


for _name in ("put_object", "_key_response_post", "delete_object"):
    setattr(S3Response, _name, _atomic(getattr(S3Response, _name)))

if __name__ == "__main__":
    main(sys.argv[1:])
