"""Model repositories on S3-compatible object storage (``--repo s3://BUCKET/PREFIX``).

tritonserver reads such a repository itself (``--model-repository=s3://...``; for an
S3-compatible endpoint Triton's form is ``s3://http://HOST:PORT/BUCKET/PREFIX``, which
``--s3-endpoint`` builds). trtrepo writes one by writing the model locally first, with every
check of a local write (:mod:`trtrepo.repository`), against a local stand-in of the remote
repository (:func:`checkout`: the live configs and the version numbers), then uploading it
(:func:`publish`). Credentials come from boto3's standard chain (``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, instance roles); the region from ``AWS_DEFAULT_REGION``
(default us-east-1).

Commit protocol. S3 has no rename, but each PUT of one object is atomic: a reader sees the old
object or the new one. So the one object that decides what Triton serves, ``config.pbtxt``, is
written last, and it always names the versions it serves:

1. Every ``config.pbtxt`` trtrepo writes to object storage pins its versions
   (``version_policy: { specific: { versions: [...] } }``): the versions the model's own policy
   (``--version-policy``, default the latest one) serves among the *complete* versions. A version
   still being uploaded is never in that list, so a server that loads or polls the repository
   during an upload does not see it.
2. Before the first object of a new version is uploaded, a live config whose policy would pick up
   the new number (one not written by trtrepo, e.g. ``latest``) is rewritten pinned to the
   versions it serves now: one PUT, and the server serves the same versions as before.
3. The new version's objects are uploaded (smallest first), then the model-level files
   (``labels.txt``, ...). For a model's *first* upload there is no config yet, and tritonserver
   takes any folder under the repository for a model (filling its config in itself): a half
   uploaded version there would fail to load and stop a starting server. So a first upload goes
   to ``PREFIX.trtrepo-staging/<id>/`` beside the repository (where Triton does not look), its
   pinned config staged last, and then into place by server-side copies (one CopyObject request
   per object up to 5 GiB: the object appears whole; no data through this machine), the config
   last.
4. ``config.pbtxt`` is written (one PUT): from then on the new version is served.
5. A version is never overwritten in place: ``--force`` on an existing number writes the next
   free number and retires the old one (left out of the config of step 4, deleted after it).
   Leftovers of interrupted uploads of the model are deleted after step 4 too.

A kill at any point leaves the old config and its complete versions, plus unserved leftovers: a
version newer than every version the config names, staged objects beside the repository, or --
only when the kill falls within the server-side copies of a first upload -- a model folder
without ``config.pbtxt``. tritonserver 2.51 does not start on that folder, and no layout avoids
it (measured: a config without its version, or pinning a version not yet there, fails the same
way), so that window is kept short: one CopyObject request per object rather than a managed
multipart copy (figures: docs/benchmarks.md, "Issue 28 (in progress): crash safety, bounded
reads and waits"). ``trtrepo repo check``
names it as a folder Triton fails to load; ``--fix`` finishes that upload from the complete staged
copy (and removes the other leftovers); the next write of the model redoes it.

Writers are serialised by :func:`writer_lock` (an object ``PREFIX.trtrepo-lock`` created with a
conditional PUT, with a renewed lease): concurrent ``repo add``/``deploy`` of one repository get
distinct versions, one after the other. The local write's checks ran against a checkout taken
before the lock, so :func:`publish` re-reads the model's live config under the lock and runs the
consistency checks again against it (:func:`_check_live_state`: the new version's IO against the
config that will be live and its version policy; an ensemble's steps): a writer that raced
another one on a model's IO is refused, nothing uploaded, the other one's change left live.

What a bucket holds is not trusted (docs/fleet.md, "What trtrepo trusts in a bucket"): every key
is checked to be a relative path inside the repository before any local path is made from any key
(:func:`checked_keys`; one bad key refuses the repository), local files are made without following
symlinks (:func:`trtrepo.fsutil.write_inside`), configs and plan metadata are read up to
:data:`MAX_CONFIG_BYTES` and parsed (configs with Triton's protobuf), model files are never
downloaded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contracts.location import StorageLocation, parse_endpoint, parse_storage_url
from .errors import OptionError, TrtrepoError, UsageError
from .fsutil import mkdir_inside, unsafe_relpath, write_inside
from .repository import MAX_VERSION, ModelEntry, config_io, incomplete_versions, served_versions, versions_of
from .tritonconfig import parse_config_text, validate_config_text

log = logging.getLogger("trtrepo.objectstore")

SINGLE_COPY_LIMIT = 5 * 2**30  # S3's limit for one CopyObject request
MAX_CONFIG_BYTES = 16 * 2**20  # the most of a config.pbtxt or *.plan.json read from a bucket (they are KiB)
STAGING_SUFFIX = ".trtrepo-staging"  # PREFIX.trtrepo-staging/<id>/...: a model's first upload, outside the repository


@dataclass(frozen=True)
class S3Location:
    """An ``s3://`` repository as the writer and reader here use it (parsed by
    :func:`trtrepo.contracts.location.parse_storage_url`, the one owner of the URL rules)."""

    bucket: str
    prefix: str  # without leading or trailing "/"; "" for the bucket's root
    endpoint: str | None = None  # http(s)://HOST:PORT of an S3-compatible service; None: AWS

    @property
    def url(self) -> str:
        """The URL tritonserver's ``--model-repository`` takes."""
        return self.storage().triton_url()

    def storage(self) -> StorageLocation:
        return StorageLocation("s3", self.bucket, self.prefix, None if self.endpoint is None else parse_endpoint(self.endpoint))


def parse_url(url: str, endpoint: str | None = None) -> S3Location:
    """``s3://BUCKET[/PREFIX]`` (+ ``endpoint``, else ``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL``)
    or Triton's ``s3://http(s)://HOST:PORT/BUCKET[/PREFIX]``."""
    if url.startswith(("gs://", "as://")):
        raise UsageError(f"{url}: trtrepo writes and reads s3:// repositories only (tritonserver itself also reads "
                         f"gs:// and as://)")
    if not url.startswith("s3://"):
        raise UsageError(f"{url}: not an s3:// URL")
    names_endpoint = re.match(r"s3://(https?://|[^/]+:[0-9]+/)", url) is not None
    if endpoint is None and not names_endpoint:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    loc = parse_storage_url(url, "repo", endpoint)
    assert loc is not None
    return S3Location(loc.bucket, loc.path, loc.endpoint_url)


# --------------------------------------------------------------------------------------------
# Config texts


def pin_versions(text: str, versions: Sequence[int]) -> str:
    """``text`` with its ``version_policy`` replaced by ``specific: { versions: [...] }`` (appended
    when it has none). Pure; the result is parsed by the caller's checks."""
    if not versions:
        raise ValueError("pin_versions: no version")
    start = text.find("version_policy")
    if start >= 0:
        brace = text.find("{", start)
        depth, end = 0, brace
        for end in range(brace, len(text)):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
        text = text[:start].rstrip(" \t") + text[end + 1:].lstrip(" \t")
        text = re.sub(r"\n{3,}", "\n\n", text)
    pinned = f"version_policy: {{ specific: {{ versions: [ {', '.join(str(v) for v in sorted(versions))} ] }} }}\n"
    return text.rstrip("\n") + "\n" + pinned


def pinned_versions(msg: Any) -> list[int] | None:
    """The versions a config names (``specific``), None for ``latest``/``all`` policies."""
    if msg.HasField("version_policy") and msg.version_policy.WhichOneof("policy_choice") == "specific":
        return sorted(int(v) for v in msg.version_policy.specific.versions)
    return None


def complete_versions(msg: Any | None, versions: Sequence[int]) -> list[int]:
    """The versions of a remote model that are whole: with a pinned config, those up to its newest
    pinned version (a newer one can only be an interrupted upload); with another policy, all
    (trtrepo cannot tell); with no config, none."""
    if msg is None:
        return []
    pins = pinned_versions(msg)
    if pins is None:
        return sorted(versions)
    return sorted(v for v in versions if v <= max(pins))


# --------------------------------------------------------------------------------------------
# The store


S3_TIMEOUT_ENV = "TRTREPO_S3_TIMEOUT"
S3_TIMEOUT_S = 20.0  # connect (at most 5 s) and read timeout of each S3 request ...
S3_TIMEOUT_MAX_S = 3600.0  # ... at most this (a longer wait is a mistake, and boto's clock overflows at inf)
S3_ATTEMPTS = 2  # attempts per request, the first included (botocore's total_max_attempts; its
# max_attempts counts retries only: 2 there made 3 attempts, 61 s): an endpoint that never answers ends
# a request after S3_ATTEMPTS x the timeout (about 40 s) plus botocore's backoff of at most 0.05 s


def s3_timeout() -> float:
    """Seconds each S3 request may wait for the endpoint: ``$TRTREPO_S3_TIMEOUT`` or
    :data:`S3_TIMEOUT_S`. One setting for every command that reads or writes ``s3://``; a value
    that is not a number of seconds in (0, :data:`S3_TIMEOUT_MAX_S`] (``inf``, ``nan``, ``0``,
    negative) is a usage error naming the variable."""
    text = os.environ.get(S3_TIMEOUT_ENV)
    if not text:
        return S3_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= S3_TIMEOUT_MAX_S:  # false for nan too
        raise UsageError(f"{S3_TIMEOUT_ENV}={text!r}: expected a positive number of seconds, at most "
                         f"{S3_TIMEOUT_MAX_S:g}")
    return value


def s3_wait(timeout: float) -> str:
    """What a request to an endpoint that never answers costs, in words, from the same constants
    the client is configured with."""
    return f"{S3_ATTEMPTS} attempts, about {S3_ATTEMPTS * timeout:g} s in all"


class S3Store:
    """A thin adapter over boto3's S3 client for one repository location (keys relative to it).
    Each request waits at most :func:`s3_timeout` seconds for the endpoint, :data:`S3_ATTEMPTS`
    times; an endpoint that cannot be reached or does not answer is exit 2, like a Triton server
    that cannot be reached."""

    def __init__(self, loc: S3Location) -> None:
        self.loc = loc
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UsageError(f"{loc.url}: s3:// repositories need boto3 (pip install boto3)") from None
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
        self.timeout = s3_timeout()
        self.client = boto3.client("s3", endpoint_url=loc.endpoint, region_name=region,
                                   config=Config(retries={"total_max_attempts": S3_ATTEMPTS, "mode": "standard"},
                                                 connect_timeout=min(self.timeout, 5.0), read_timeout=self.timeout))

    def key(self, rel: str) -> str:
        return f"{self.loc.prefix}/{rel}" if self.loc.prefix else rel

    def staging(self) -> S3Store:
        """The store of :data:`STAGING_SUFFIX` beside the repository (same bucket and client),
        where a model's first upload goes before it is copied in."""
        if not self.loc.prefix:
            raise UsageError(f"{self.loc.url}: trtrepo writes into s3://BUCKET/PREFIX, not a bucket's root (uploads are "
                             f"staged beside the repository, where tritonserver does not look)")
        other = object.__new__(S3Store)
        other.loc = S3Location(self.loc.bucket, self.loc.prefix + STAGING_SUFFIX, self.loc.endpoint)
        other.client, other.timeout = self.client, self.timeout
        return other

    def copy_from(self, source: S3Store, src_rel: str, rel: str, size: int) -> None:
        """A server-side copy (no data through this machine): one CopyObject request up to S3's
        5 GiB limit for it, so the object appears at once (boto3's managed copy splits anything
        over 8 MiB into part copies, which keeps a first upload's config-less window open several
        times longer); multipart above the limit."""
        src = {"Bucket": source.loc.bucket, "Key": source.key(src_rel)}
        if size <= SINGLE_COPY_LIMIT:
            self._call(f"copy {rel}", self.client.copy_object, CopySource=src, Bucket=self.loc.bucket, Key=self.key(rel))
        else:
            self._call(f"copy {rel}", self.client.copy, CopySource=src, Bucket=self.loc.bucket, Key=self.key(rel))

    def _call(self, what: str, fn: Callable[..., Any], *, absent_ok: bool = False, **kw: Any) -> Any:
        """``fn(**kw)`` with boto's errors as one-line trtrepo errors; with ``absent_ok`` a missing
        object gives None."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            ReadTimeoutError,
        )

        try:
            return fn(**kw)
        except (ReadTimeoutError, ConnectTimeoutError, ConnectionClosedError):
            raise UsageError(f"{self.loc.url}: {what}: the S3 endpoint {self.loc.endpoint or 'of AWS'} did not answer "
                             f"within {self.timeout:g} s ({s3_wait(self.timeout)}); set {S3_TIMEOUT_ENV}=SECONDS to "
                             f"wait longer") from None
        except NoCredentialsError:
            raise UsageError(f"{self.loc.url}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                             f"or configure ~/.aws)") from None
        except EndpointConnectionError:
            raise UsageError(f"{self.loc.url}: cannot reach the S3 endpoint {self.loc.endpoint or 'of AWS'}") from None
        except ClientError as exc:
            err = exc.response.get("Error", {})
            code = err.get("Code", "?")
            if absent_ok and code in ("NoSuchKey", "404"):
                return None
            if code in ("NoSuchBucket", "404") and what.startswith("list"):
                raise UsageError(f"{self.loc.url}: bucket {self.loc.bucket} not found") from None
            raise TrtrepoError(f"{self.loc.url}: {what}: {code} {err.get('Message', '')}".rstrip()) from None
        except BotoCoreError as exc:
            raise TrtrepoError(f"{self.loc.url}: {what}: {exc}") from None

    def keys(self, rel: str = "", *, folders: bool = False) -> list[str]:
        """Keys under ``rel`` (relative to the repository), or with ``folders`` the names of the
        "folders" directly under it."""
        base = self.key(rel).rstrip("/") + "/" if (self.loc.prefix or rel) else ""
        out: list[str] = []
        kw: dict[str, Any] = {"Bucket": self.loc.bucket, "Prefix": base}
        if folders:
            kw["Delimiter"] = "/"
        while True:
            page = self._call(f"list {base or '/'}", self.client.list_objects_v2, **kw)
            if folders:
                out += [p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
            else:
                out += [o["Key"][len(base):] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return out
            kw["ContinuationToken"] = page["NextContinuationToken"]

    def size(self, rel: str) -> int:
        head = self._call(f"stat {rel}", self.client.head_object, Bucket=self.loc.bucket, Key=self.key(rel))
        return int(head["ContentLength"])

    def read(self, rel: str, limit: int | None = None) -> bytes | None:
        """The object's bytes, None when there is none. With ``limit``, an object larger than
        ``limit`` bytes is refused (UsageError naming it) without reading its body: what a bucket
        holds is not trusted to be small."""
        obj = self._call(f"read {rel}", self.client.get_object, absent_ok=True, Bucket=self.loc.bucket, Key=self.key(rel))
        if obj is None:
            return None
        size = int(obj.get("ContentLength") or 0)
        if limit is not None and size > limit:
            obj["Body"].close()
            raise UsageError(f"{self.loc.url}/{rel}: {size} bytes; trtrepo reads at most {limit} bytes of a config or "
                             f"metadata file (a model repository's are a few KiB)")
        body: bytes = obj["Body"].read() if limit is None else obj["Body"].read(limit + 1)
        if limit is not None and len(body) > limit:
            raise UsageError(f"{self.loc.url}/{rel}: more than {limit} bytes; trtrepo reads at most {limit} bytes of a "
                             f"config or metadata file")
        return body

    def put_bytes(self, rel: str, data: bytes) -> None:
        self._call(f"write {rel}", self.client.put_object, Bucket=self.loc.bucket, Key=self.key(rel), Body=data)

    def put_file(self, rel: str, path: Path) -> None:
        self._call(f"upload {rel}", self.client.upload_file, Filename=str(path), Bucket=self.loc.bucket, Key=self.key(rel))

    def delete(self, rels: Iterable[str]) -> None:
        keys = [{"Key": self.key(r)} for r in rels]
        if not keys:
            return
        for i in range(0, len(keys), 1000):
            self._call("delete", self.client.delete_objects, Bucket=self.loc.bucket,
                       Delete={"Objects": keys[i:i + 1000], "Quiet": True})

    # the repository's layout

    def models(self) -> list[str]:
        return sorted(n for n in self.keys(folders=True) if n and not n.startswith("."))

    def versions(self, name: str) -> list[int]:
        return sorted(n for v in self.keys(name, folders=True) if (n := version_number(v)) is not None)

    def config(self, name: str) -> tuple[str | None, Any | None]:
        """The model's config.pbtxt text and parsed message (None, None when it has none)."""
        data = self.read(f"{name}/config.pbtxt", MAX_CONFIG_BYTES)
        if data is None:
            return None, None
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise UsageError(f"{self.loc.url}/{name}/config.pbtxt: not UTF-8 text, so not a Triton config") from None
        return text, parse_config_text(text, f"{self.loc.url}/{name}/config.pbtxt")


def version_number(segment: str) -> int | None:
    """A version folder's number (ASCII digits, 1 .. Triton's int64 maximum), None for any other
    name (``"²".isdigit()`` is true, and ``int("²")`` fails)."""
    if segment.isascii() and segment.isdigit() and 0 < int(segment) <= MAX_VERSION:
        return int(segment)
    return None


def open_store(url: str, endpoint: str | None = None) -> S3Store:
    return S3Store(parse_url(url, endpoint))


# --------------------------------------------------------------------------------------------
# Reading


@dataclass
class RemoteModel:
    name: str
    config_text: str | None
    versions: dict[int, list[str]]  # version -> its object names (relative to the version folder)
    complete: list[int] = field(default_factory=list)
    msg: Any | None = None
    keys: list[str] = field(default_factory=list)  # every object name under the model folder

    @property
    def leftovers(self) -> list[int]:
        return [v for v in self.versions if v not in self.complete]


def remote_model(store: S3Store, name: str) -> RemoteModel:
    keys = store.keys(name)
    versions: dict[int, list[str]] = {}
    for k in keys:
        head, _, rest = k.partition("/")
        number = version_number(head)
        if number is not None and rest:
            versions.setdefault(number, []).append(rest)
    text, msg = store.config(name)
    return RemoteModel(name, text, {v: sorted(f) for v, f in sorted(versions.items())},
                       complete_versions(msg, list(versions)), msg, keys)


def checked_keys(store: S3Store) -> list[str]:
    """Every object key of the repository (relative to its prefix), each a relative path inside
    it by :func:`trtrepo.fsutil.unsafe_relpath` (a folder marker ``NAME/`` aside): no empty, ``.``
    or ``..`` segment, no backslash or NUL, not absolute (``PREFIX//etc/x`` is ``/etc/x`` below
    the prefix). One bad key refuses the whole repository, with one line naming it, before any
    local path is made from any key: a bucket's contents are not trusted (docs/fleet.md, "What
    trtrepo trusts in a bucket")."""
    keys = store.keys()
    for rel in keys:
        why = unsafe_relpath(rel[:-1] if rel.endswith("/") else rel) if rel else None
        if why:
            raise UsageError(f"{store.loc.url}: object key {store.key(rel)!r}: {rel!r} below the prefix {why}, so it "
                             f"is no path inside the repository; trtrepo refuses a repository holding it (nothing "
                             f"written; delete or rename that object)")
    return keys


def list_remote(url: str, endpoint: str | None = None) -> list[ModelEntry]:
    """``trtrepo repo list`` of an s3:// repository (the same entries as a local listing; a model
    without config, or versions newer than its config names, get a problem line). A repository
    holding a key that is no path inside it is refused (:func:`checked_keys`): ``trtrepo serve``
    lists it before tritonserver, which copies the objects to local files, is started on it."""
    store = open_store(url, endpoint)
    checked_keys(store)
    entries = []
    for name in store.models():
        try:
            m = remote_model(store, name)
        except UsageError as exc:
            entries.append(ModelEntry(name, "?", None, {}, exc.message))
            continue
        if m.msg is None:
            entries.append(ModelEntry(name, "?", None, m.versions, "no config.pbtxt: an interrupted first upload "
                                      "(not served; 'trtrepo repo check --fix' removes it)"))
            continue
        problem = (f"version(s) {', '.join(map(str, m.leftovers))} left by an interrupted upload (not served; "
                   f"'trtrepo repo check --fix' removes them)") if m.leftovers else None
        msg = m.msg
        entries.append(ModelEntry(name, msg.platform or msg.backend or "?", msg.max_batch_size, m.versions, problem,
                                  [t.name for t in msg.input], [t.name for t in msg.output]))
    return entries


def remote_leftovers(store: S3Store) -> list[tuple[str, list[str]]]:
    """(what, object names) of every interrupted upload in the repository; staged objects of an
    interrupted first upload beside it are named ``STAGING:<key>``."""
    out = []
    if store.loc.prefix:
        staged = store.staging().keys()
        if staged:
            out.append((f"{store.loc.url}{STAGING_SUFFIX}/ (staged uploads)", [f"STAGING:{k}" for k in staged]))
    for name in store.models():
        m = remote_model(store, name)
        if m.msg is None:  # the whole folder (its versions too) is the leftover
            out.append((f"{name}/ (no config.pbtxt)", [f"{name}/{k}" for k in m.keys]))
            continue
        for v in m.leftovers:
            out.append((f"{name}/{v}/", [f"{name}/{v}/{f}" for f in m.versions[v]]))
    return out


def remote_problems(store: S3Store) -> list[tuple[str, str]]:
    """(where, why) of each hidden top-level folder, and of each version its config serves that
    lacks a file Triton needs (see :func:`trtrepo.repository.files_needed`): Triton fails to load
    those."""
    out = [(f"{name}/", "a hidden folder: tritonserver 2.51 loads hidden folders under the prefix too (measured), "
                        "tries this one as a model and does not start while it fails")
           for name in store.keys(folders=True) if name.startswith(".")]
    for name in store.models():
        m = remote_model(store, name)
        if m.msg is not None:
            out += [(f"{name}/{v}/", why) for v, why in incomplete_versions(m.msg, {v: m.versions[v] for v in m.complete})]
    return out


def snapshot(url: str, dest: Path, *, endpoint: str | None = None) -> Path:
    """The repository's ``config.pbtxt`` and ``*.plan.json`` files (same layout) in ``dest``:
    enough to read its models, IO and plans' TensorRT versions without the model files. Every key
    is checked first (:func:`checked_keys`: one bad key and nothing is written), then each file is
    written by :func:`trtrepo.fsutil.write_inside` (no symlink below ``dest`` followed, no file
    written over)."""
    store = open_store(url, endpoint)
    keys = checked_keys(store)
    dest.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if key.endswith(("/config.pbtxt", ".plan.json")):
            data = store.read(key, MAX_CONFIG_BYTES)
            if data is not None:
                try:
                    data.decode()
                except UnicodeDecodeError:
                    raise UsageError(f"{store.loc.url}/{key}: not UTF-8 text, so not a Triton config or plan "
                                     f"metadata") from None
                write_inside(dest, key, data, f"{store.loc.url}: object key {store.key(key)!r}")
    return dest


# --------------------------------------------------------------------------------------------
# Writing


def checkout(store: S3Store, dest: Path) -> dict[str, RemoteModel]:
    """A local stand-in of the remote repository in ``dest`` for :mod:`trtrepo.repository`'s
    writers: each model's live config.pbtxt and one empty folder per version number (leftovers
    included, so a new version gets a number no object uses). Model files are not downloaded.
    Every key is checked first (:func:`checked_keys`), and each folder and file is made by
    :func:`trtrepo.fsutil.mkdir_inside` / :func:`~trtrepo.fsutil.write_inside`."""
    checked_keys(store)
    dest.mkdir(parents=True, exist_ok=True)
    models = {}
    for name in store.models():
        m = remote_model(store, name)
        models[name] = m
        what = f"{store.loc.url}: model folder {name!r}"
        mkdir_inside(dest, name, what)
        if m.config_text is not None:
            write_inside(dest, f"{name}/config.pbtxt", m.config_text.encode(), what)
        for v in m.versions:
            mkdir_inside(dest, f"{name}/{v}", what)
    return models


@dataclass
class Published:
    name: str
    version: int
    url: str
    retired: list[int]
    removed_leftovers: list[int]


def publish(store: S3Store, local_repo: Path, name: str, version: int, *, replaced: bool = False,
            allocated: bool = False, say: Callable[[str], None] | None = None) -> Published:
    """Upload version ``version`` of model ``name`` written in ``local_repo`` (a :func:`checkout`
    plus one write) by the commit protocol of this module, under the repository's
    :func:`writer_lock`. The remote state is read again under the lock: a number ``allocated`` by
    the local write (no ``--version`` given) that another writer took meanwhile moves to the next
    free one; a number the user gave is refused."""
    with writer_lock(store):
        return _publish(store, local_repo, name, version, replaced=replaced, allocated=allocated, say=say)


def _publish(store: S3Store, local_repo: Path, name: str, version: int, *, replaced: bool, allocated: bool,
             say: Callable[[str], None] | None) -> Published:
    say = say or (lambda s: None)
    model_dir = local_repo / name
    new_text = (model_dir / "config.pbtxt").read_text()
    new_msg = parse_config_text(new_text, f"{model_dir}/config.pbtxt")
    remote = remote_model(store, name)
    target, retire = _target_version(store, remote, set(versions_of(model_dir)), version, (replaced, allocated))
    complete = [v for v in remote.complete if v not in retire]
    served = served_versions(new_msg, [*complete, target])
    _check_live_state(store, remote, new_text, new_msg, served, target)  # before any object is written
    _pin_live_config(store, remote, target, say)
    objects = _objects_to_upload(model_dir, name, version, target)
    if remote.msg is None:
        first = pin_versions(new_text, served_versions(new_msg, [target]))
        staged = _upload_first(store, remote, objects, first, say)
    else:
        for i, (key, p) in enumerate(objects, 1):
            say(f"{name}: uploading {key} ({i}/{len(objects)}, {p.stat().st_size / 2**20:.1f} MiB)")
            store.put_file(key, p)
        staged = []
    pinned = pin_versions(new_text, served)
    parse_config_text(pinned, f"{store.loc.url}/{name}/config.pbtxt")
    store.put_bytes(f"{name}/config.pbtxt", pinned.encode())  # step 4: the commit
    say(f"{name}: config.pbtxt written, serving version(s) {', '.join(map(str, served))}")
    if staged:
        store.staging().delete(staged)
    stale = [v for v in remote.leftovers if v != target] if remote.msg is not None else []
    gone = [f"{name}/{v}/{f}" for v in (*retire, *stale) for f in remote.versions.get(v, [])]
    if gone:
        store.delete(gone)
    return Published(name, target, f"{store.loc.url}/{name}/{target}", retire, stale)


def _target_version(store: S3Store, remote: RemoteModel, local: set[int], version: int,
                    how: tuple[bool, bool]) -> tuple[int, list[int]]:
    """The number the upload takes and the versions it retires (``how``: (replaced, allocated)).
    Decision: a number the remote lacks is kept; one it has is never overwritten in place but
    moves to the next free number, which a complete version allows only when this write
    replaces it (then retired) or allocated the number itself; a number the user gave is refused."""
    replaced, allocated = how
    if version not in remote.versions:
        return version, []
    if version in remote.complete and not replaced and not allocated:
        raise UsageError(f"{store.loc.url}/{remote.name}/{version}: version {version} already exists")
    target = max(set(remote.versions) | local) + 1
    return target, [version] if version in remote.complete and replaced else []


def _pin_live_config(store: S3Store, remote: RemoteModel, target: int, say: Callable[[str], None]) -> None:
    """Step 2. Decision: when the live config would pick up the new number mid-upload, it is
    pinned first to the versions it serves now."""
    if remote.msg is None or target not in served_versions(remote.msg, [*remote.complete, target]):
        return
    now = served_versions(remote.msg, remote.complete)
    if now:
        store.put_bytes(f"{remote.name}/config.pbtxt", pin_versions(remote.config_text or "", now).encode())
        say(f"{remote.name}: pinned the live config to version(s) {', '.join(map(str, now))} before the upload")


def _objects_to_upload(model_dir: Path, name: str, version: int, target: int) -> list[tuple[str, Path]]:
    """(key, file) of the version's files under the target number, small objects first (an
    interrupted upload has left the small ones and no large one half-way), then the model-level
    files (before the config, which is not among them)."""
    files = sorted((p for p in (model_dir / str(version)).rglob("*") if p.is_file()), key=lambda p: (p.stat().st_size, str(p)))
    objects = [(f"{name}/{target}/{p.relative_to(model_dir / str(version)).as_posix()}", p) for p in files]
    objects += [(f"{name}/{p.relative_to(model_dir).as_posix()}", p) for p in sorted(model_dir.rglob("*"))
                if p.is_file() and p.relative_to(model_dir).parts[0] != "config.pbtxt"
                and not p.relative_to(model_dir).parts[0].isdigit()]
    return objects


def _upload_first(store: S3Store, remote: RemoteModel, objects: list[tuple[str, Path]], first_config: str,
                  say: Callable[[str], None]) -> list[str]:
    """A model's first upload, staged: without a config.pbtxt, tritonserver would take any object
    under NAME/ for a model (it fills the config in itself) and fail on the half-uploaded version,
    and a starting server with it. So the objects go beside the repository first, then into it by
    server-side copies; returns the staged keys (deleted after the commit)."""
    name = remote.name
    # objects of a first upload interrupted during its copies: never served
    store.delete([f"{name}/{k}" for k in remote.keys])
    staging = store.staging()
    tag = f"{uuid.uuid4().hex[:12]}"
    for i, (key, p) in enumerate(objects, 1):
        say(f"{name}: uploading {key} ({i}/{len(objects)}, {p.stat().st_size / 2**20:.1f} MiB) to {staging.loc.url}")
        staging.put_file(f"{tag}/{key}", p)
    # the staged config, last: the staged upload is complete, so a kill during the copies below
    # (the one window: see the module's docstring) can be finished by 'repo check --fix'
    staging.put_bytes(f"{tag}/{name}/config.pbtxt", first_config.encode())
    for key, p in objects:
        store.copy_from(staging, f"{tag}/{key}", key, p.stat().st_size)
    return [f"{tag}/{key}" for key, _ in objects] + [f"{tag}/{name}/config.pbtxt"]


def _check_live_state(store: S3Store, remote: RemoteModel, new_text: str, new_msg: Any, served: Sequence[int],
                      target: int) -> None:
    """The consistency checks of a local write (:mod:`trtrepo.repository.write`), run again under
    the writer lock against the remote state read there, not the :func:`checkout` taken before
    it: another writer may have published meanwhile. A config whose IO (names, data types, dims,
    batching) differs from the live one's while its version policy would serve an older version
    (``served``, the new ``target`` aside) is refused, as a local write refuses it (Triton could
    not load that version under it); an ensemble's steps are checked against the live configs of
    the models it calls. UsageError, one line; nothing has been uploaded."""
    where = f"{store.loc.url}/{remote.name}"
    if remote.msg is not None and config_io(remote.msg) != config_io(new_msg):
        old = [v for v in served if v != target]
        if old:
            raise OptionError("", f"{where}: the new version's IO (input/output names, data types, dims, batching) "
                                  f"differs from the live config.pbtxt's (as read under the writer lock: another writer "
                                  f"may have published since this write began), and its version policy would serve the "
                                  f"older version(s) {', '.join(map(str, old))} under the new config; nothing uploaded; "
                                  f"use another {{name}}, or {{version_policy}} latest:1",
                              others={"name": "model name", "version_policy": "the version policy"})
    if new_msg.platform == "ensemble":
        steps = {s.model_name for s in new_msg.ensemble_scheduling.step}
        known = {n: msg for n in sorted(steps) if (msg := store.config(n)[1]) is not None}
        validate_config_text(new_text, f"{where}/config.pbtxt", model_dir_name=remote.name, known_models=known)


LOCK_SUFFIX = ".trtrepo-lock"  # PREFIX.trtrepo-lock: one object beside the repository
LOCK_LEASE_S = 60.0  # a writer renews its lease every quarter of it; a lease past its time is taken over
LOCK_WAIT_S = 120.0  # how long a writer waits for another one before it gives up
LOCK_MAX_BYTES = 64 * 2**10  # the most of the lock object read (a writer's is about 150 bytes)


class RepositoryBusy(TrtrepoError):
    """Another writer held the repository's lock for longer than the wait."""

    exit_code = 1


@contextlib.contextmanager
def writer_lock(store: S3Store, *, wait: float | None = None, lease: float | None = None) -> Iterator[None]:
    """Serialise writers of one s3:// repository: an object ``PREFIX.trtrepo-lock`` beside it
    (Triton does not look there), created with a conditional PUT (``If-None-Match: *``: only one
    writer's create succeeds; AWS S3 since 2024, MinIO, moto) and holding the writer's token,
    host, pid and lease end. The holder renews the lease every quarter of it from a thread; a lock
    whose lease has ended, or whose holder was a process of this host that no longer runs (killed),
    is taken over with a conditional delete (``If-Match`` on its ETag, so two waiters cannot both
    take it). A waiter gives up after
    ``wait`` seconds with the holder's identity (exit 1). On release the object is deleted if it
    is still ours."""

    if not store.loc.prefix:
        raise UsageError(f"{store.loc.url}: trtrepo writes into s3://BUCKET/PREFIX, not a bucket's root")
    wait = LOCK_WAIT_S if wait is None else wait
    lease = LOCK_LEASE_S if lease is None else lease
    key = store.loc.prefix + LOCK_SUFFIX
    where = f"{store.loc.url}{LOCK_SUFFIX}"
    token = uuid.uuid4().hex
    host = socket.gethostname()
    me = {"token": token, "host": host, "pid": os.getpid()}

    def body() -> bytes:
        return json.dumps({**me, "lease_until": time.time() + lease}).encode()

    deadline = time.monotonic() + wait
    holder: dict[str, Any] = {}
    while True:
        try:
            store._call(f"lock {where}", store.client.put_object, Bucket=store.loc.bucket, Key=key, Body=body(),
                        IfNoneMatch="*")
            break
        except TrtrepoError as exc:
            if not any(code in str(exc) for code in ("PreconditionFailed", "ConditionalRequestConflict")):
                raise
        obj = store._call(f"read {where}", store.client.get_object, absent_ok=True, Bucket=store.loc.bucket, Key=key)
        if obj is None:
            continue  # released between our PUT and the read: try again
        holder = _lock_holder(obj["Body"].read(LOCK_MAX_BYTES))
        if holder["lease_until"] < time.time() or _gone(holder, host):  # its writer is gone
            with contextlib.suppress(TrtrepoError):
                store._call(f"unlock {where}", store.client.delete_object, Bucket=store.loc.bucket, Key=key,
                            IfMatch=obj["ETag"])
            log.warning("%s: took over the lock of %s pid %s (its lease had ended or its process is gone)", where,
                        holder.get("host"), holder.get("pid"))
            continue
        if time.monotonic() > deadline:
            raise RepositoryBusy(f"{store.loc.url}: another trtrepo is writing to this repository ({where} held by "
                                 f"{holder.get('host')} pid {holder.get('pid')}; waited {wait:.0f} s); try again later")
        time.sleep(0.25)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease / 4):
            with contextlib.suppress(Exception):
                store.client.put_object(Bucket=store.loc.bucket, Key=key, Body=body())

    thread = threading.Thread(target=renew, name="trtrepo-s3-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(Exception):
            obj = store.client.get_object(Bucket=store.loc.bucket, Key=key)
            if _lock_holder(obj["Body"].read(LOCK_MAX_BYTES)).get("token") == token:
                store.client.delete_object(Bucket=store.loc.bucket, Key=key, IfMatch=obj["ETag"])


def _lock_holder(data: bytes) -> dict[str, Any]:
    """The lock object's fields as :func:`writer_lock` reads them; a body that is not the JSON
    object a writer puts there (not trusted: anyone with write access to the bucket) reads as a
    lock whose lease has ended, like an unreadable one."""
    try:
        holder = json.loads(data)
    except ValueError:
        holder = None
    if not isinstance(holder, dict):
        holder = {}
    try:
        lease_until = float(holder.get("lease_until", 0))
    except (TypeError, ValueError):
        lease_until = 0.0
    host = holder.get("host")  # printed in one-line messages: no control characters, bounded
    host = None if host is None else re.sub(r"[\x00-\x1f\x7f]", "?", str(host))[:200]
    pid = holder.get("pid") if isinstance(holder.get("pid"), int) else None
    return {**holder, "lease_until": lease_until, "host": host, "pid": pid}


def _gone(holder: dict[str, Any], host: str) -> bool:
    """A lock holder on this host whose process no longer runs (killed: its lease need not end)."""
    pid = holder.get("pid")
    if holder.get("host") != host or not isinstance(pid, int) or not 0 < pid < 2**31:
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def finishable_uploads(store: S3Store) -> dict[str, tuple[str, list[str]]]:
    """Models whose first upload was killed during its server-side copies: the live folder has
    no config.pbtxt, and a staged upload of it is complete (its staged config is there).
    ``{name: (tag, staged keys of the model without the config)}``."""
    if not store.loc.prefix:
        return {}
    staged = checked_keys(store.staging())  # a staged key becomes a key of the repository: the same rule
    out: dict[str, tuple[str, list[str]]] = {}
    for key in staged:
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == "config.pbtxt" and store.read(f"{parts[1]}/config.pbtxt") is None \
                and store.keys(parts[1]):
            tag, name = parts[0], parts[1]
            out[name] = (tag, sorted(k for k in staged if k.startswith(f"{tag}/{name}/") and k != key))
    return out


def finish_upload(store: S3Store, name: str, tag: str, keys: Sequence[str]) -> str:
    """Copy a complete staged first upload into place, its config last (idempotent)."""
    staging = store.staging()
    for key in keys:
        store.copy_from(staging, key, key.partition("/")[2], staging.size(key))
    store.copy_from(staging, f"{tag}/{name}/config.pbtxt", f"{name}/config.pbtxt", 0)
    return f"completed {name}/ (a first upload killed during its server-side copies)"


def remove_leftovers(store: S3Store) -> list[str]:
    """``repo check --fix``: finish the first uploads killed during their server-side copies,
    then delete the objects of interrupted uploads; what was done. A repository holding a key
    that is no path inside it is refused first (:func:`checked_keys`)."""
    checked_keys(store)
    with writer_lock(store):
        done = [finish_upload(store, name, tag, keys) for name, (tag, keys) in finishable_uploads(store).items()]
        for what, keys in remote_leftovers(store):
            staged = [k[len("STAGING:"):] for k in keys if k.startswith("STAGING:")]
            if staged:
                store.staging().delete(staged)
            store.delete([k for k in keys if not k.startswith("STAGING:")])
            done.append(f"removed {what} ({len(keys)} object(s))")
    return done
