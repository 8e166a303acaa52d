"""Where a model repository lives: a local folder, or an object-storage URL Triton reads itself.

The one owner of the URL rules that ``repository``, ``objectstore``, ``manifests``, ``server`` and
the commands share (Triton's own forms: ``s3://BUCKET/PREFIX``,
``s3://http(s)://HOST:PORT/BUCKET/PREFIX`` or ``s3://HOST:PORT/BUCKET/PREFIX`` for an
S3-compatible endpoint, ``gs://BUCKET/PREFIX``, ``as://ACCOUNT/CONTAINER/PREFIX``). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import OptionError

REMOTE_SCHEMES = ("s3://", "gs://", "as://")
SCHEMES = ("s3", "gs", "as")
# Triton's S3 URL pattern with an endpoint (s3.cc): a bucket or prefix outside it makes Triton
# ignore the endpoint and go to AWS, silently.
_TRITON_S3 = re.compile(r"^s3://(http://|https://|)([0-9a-zA-Z\-.]+):([0-9]+)/([0-9a-z.\-]+)((/[0-9a-zA-Z.\-_]+)*)?$")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")  # AWS's bucket naming rules


def is_remote(repo: object) -> bool:
    """True for a repository given as an object-storage URL (``s3://``, ``gs://``, ``as://``)."""
    return isinstance(repo, str) and repo.startswith(REMOTE_SCHEMES)


@dataclass(frozen=True)
class StorageLocation:
    """``scheme`` s3 | gs | as; ``bucket`` (the Azure account for as://); ``path`` (the prefix,
    without leading or trailing ``/``; for as:// ``CONTAINER/PREFIX``); ``endpoint`` (protocol,
    host, port) of a custom S3 endpoint, None for AWS."""

    scheme: str
    bucket: str
    path: str
    endpoint: tuple[str, str, int] | None = None

    def triton_url(self) -> str:
        """The ``--model-repository`` value (Triton's form for a custom S3 endpoint:
        ``s3://http://HOST:PORT/BUCKET/PREFIX``, the port always written out: Triton ignores an
        endpoint without one)."""
        tail = f"{self.bucket}/{self.path}" if self.path else self.bucket
        if self.endpoint is not None:
            return f"s3://{self.endpoint_url}/{tail}"
        return f"{self.scheme}://{tail}"

    @property
    def endpoint_url(self) -> str | None:
        """``http(s)://HOST:PORT`` of the custom endpoint (what boto3 takes), None for AWS."""
        if self.endpoint is None:
            return None
        proto, host, port = self.endpoint
        return f"{proto}://{host}:{port}"

    def kserve_uri(self) -> str:
        """KServe's ``storageUri``: plain ``s3://BUCKET/PREFIX`` (the endpoint goes in the secret's
        annotations), and ``https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX`` for Azure."""
        if self.scheme == "as":
            return f"https://{self.bucket}.blob.core.windows.net/{self.path}"
        return f"{self.scheme}://{self.bucket}/{self.path}" if self.path else f"{self.scheme}://{self.bucket}"


# How the library names the settings these URLs come from (the CLI shows the flag or argument).
_CONCEPTS = {"s3_endpoint": "the S3 endpoint", "repo": "the repository", "repo_url": "the repository",
             "repository_url": "the URL the pods read"}


def _concept(setting: str) -> str:
    return _CONCEPTS.get(setting, "the " + setting.replace("_", " "))


def parse_endpoint(value: str, setting: str = "s3_endpoint") -> tuple[str, str, int]:
    """``http(s)://HOST[:PORT]`` -> (protocol, host, port); the port defaults to 80 / 443 (Triton
    needs it written out). ``setting`` names the value in messages (an :class:`OptionError`)."""
    m = re.fullmatch(r"(https?)://([^/:\s]+)(?::([0-9]{1,5}))?/?", value)
    if not m:
        raise OptionError(setting, f"{value}: expected http://HOST[:PORT] or https://HOST[:PORT]", concept=_concept(setting))
    proto, host, port = m.group(1), m.group(2), int(m.group(3) or (443 if m.group(1) == "https" else 80))
    if not re.fullmatch(r"[0-9a-zA-Z\-.]+", host) or not 0 < port < 65536:
        raise OptionError(setting, f"{value}: Triton takes a host of letters, digits, '-' and '.' and a port 1-65535",
                          concept=_concept(setting))
    return proto, host, port


def _s3_endpoint(url: str, rest: str, setting: str, s3_endpoint: str | None) -> tuple[tuple[str, str, int] | None, str]:
    """An s3:// URL's endpoint and the rest of it (BUCKET/PREFIX). Decision: an endpoint the URL
    names in one of Triton's forms (``s3://http(s)://HOST[:PORT]/BUCKET/...``,
    ``s3://HOST:PORT/BUCKET/...``, HTTP) wins, and ``s3_endpoint`` given as well must be the same
    one; else ``s3_endpoint``, else none (AWS)."""
    m = re.match(r"(https?)://([^/]*)/?(.*)$", rest) or re.match(r"()([^/]+:[0-9]+)/?(.*)$", rest)
    if not m:
        return (parse_endpoint(s3_endpoint) if s3_endpoint else None), rest
    endpoint = parse_endpoint(f"{m.group(1) or 'http'}://{m.group(2)}", setting)
    if s3_endpoint and parse_endpoint(s3_endpoint) != endpoint:
        raise OptionError("s3_endpoint", f"{s3_endpoint}: {{{setting}}} {url} names another endpoint "
                                         f"({endpoint[0]}://{endpoint[1]}:{endpoint[2]})",
                          concept=_concept("s3_endpoint"), others={setting: _concept(setting)})
    return endpoint, m.group(3)


def parse_storage_url(url: str, setting: str = "repo", s3_endpoint: str | None = None) -> StorageLocation | None:
    """The location of an object-storage URL; None for a local path (``s3_endpoint`` is then the
    caller's to judge). ``setting`` names the value in messages (an :class:`OptionError`: ``repo``,
    the repository; ``repo_url``; ``repository_url``). An ``s3://`` URL may name its endpoint
    itself (Triton's forms); ``s3_endpoint`` given as well must be the same one."""
    if "://" not in url:
        return None
    concept = _concept(setting)
    scheme, rest = url.split("://", 1)
    if scheme not in SCHEMES:
        raise OptionError(setting, f"{url}: not an object-storage URL Triton reads (s3://, gs://, as://)", concept=concept)
    endpoint = None
    if scheme == "s3":
        endpoint, rest = _s3_endpoint(url, rest, setting, s3_endpoint)
    elif s3_endpoint:
        raise OptionError("s3_endpoint", f"{s3_endpoint}: only for s3:// repositories, not {scheme}://",
                          concept=_concept("s3_endpoint"))
    bucket, _, path = rest.partition("/")
    path = path.strip("/")
    if not bucket or (scheme == "as" and not path):
        need = "as://ACCOUNT/CONTAINER[/PREFIX]" if scheme == "as" else f"{scheme}://BUCKET[/PREFIX]"
        raise OptionError(setting, f"{url}: expected {need}", concept=concept)
    if scheme == "s3" and not _S3_BUCKET.fullmatch(bucket):
        raise OptionError(setting, f"{url}: no valid bucket name (3-63 of a-z, 0-9, '.', '-')", concept=concept)
    if path and any(part in ("", ".", "..") for part in path.split("/")):
        raise OptionError(setting, f"{url}: the prefix has an empty, '.' or '..' component", concept=concept)
    location = StorageLocation(scheme, bucket, path, endpoint)
    if endpoint is not None and not _TRITON_S3.match(location.triton_url()):
        raise OptionError(setting, f"{url}: with a custom S3 endpoint Triton needs a bucket of [0-9a-z.-] and a prefix of "
                                   f"[0-9A-Za-z._-] path segments (else it ignores the endpoint and reads AWS); rename the "
                                   f"bucket or prefix", concept=concept)
    return location
