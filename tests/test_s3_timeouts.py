"""Issue 28 item 4: an S3 endpoint that accepts connections and never answers ends an s3://
command with exit 2 (a server that cannot be reached) within the documented bound, naming the
endpoint and the setting that waits longer; a bad setting is a usage error naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _servers import silent_tcp_server

pytest.importorskip("boto3")


@pytest.fixture
def silent_endpoint():
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte."""
    with silent_tcp_server() as (url, _):
        yield url


def _repo_list(endpoint: str, timeout: str | None) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}
    env.pop("TRTREPO_S3_TIMEOUT", None)
    if timeout is not None:
        env["TRTREPO_S3_TIMEOUT"] = timeout
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "trtrepo.cli", "repo", "list", "s3://bucket/models", "--s3-endpoint",
                        endpoint], env=env, capture_output=True, text=True, timeout=300)
    return r, time.monotonic() - t0


def test_an_endpoint_that_never_answers_is_exit_2_within_the_timeout(silent_endpoint):
    from trtrepo.objectstore import S3_ATTEMPTS

    r, took = _repo_list(silent_endpoint, "1.5")
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: s3://") and "bucket/models: list models/: " in lines[0], r.stderr
    assert f"the S3 endpoint {silent_endpoint} did not answer within 1.5 s" in lines[0]
    assert "TRTREPO_S3_TIMEOUT=SECONDS" in lines[0]
    # attempts x timeout plus boto's backoff between attempts (at most a few seconds) and start-up
    assert took < S3_ATTEMPTS * 1.5 + 12, took


def test_a_bad_timeout_setting_names_it(silent_endpoint):
    r, _ = _repo_list(silent_endpoint, "soon")
    assert r.returncode == 2 and "TRTREPO_S3_TIMEOUT='soon': expected a positive number of seconds" in r.stderr, r.stderr
