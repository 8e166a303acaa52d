"""What ``trtrepo validate`` takes: :class:`ValidateOptions`, :class:`ReferenceSource`, :class:`Thresholds`, URL and
concurrency parsing."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import OptionError
from ..measure import DEFAULT_PERCENTILES, DISTRIBUTIONS, Stability
from .speed import DEFAULT_TIME_BUDGET_S, SpeedOptions

log = logging.getLogger(__name__)


REPORT_SCHEMA = "trtrepo.validate/5"  # /2: speed_vs_reference added; /3: latency levels measured in windows; /4: fleet;
# /5: detection (a detector ensemble's detections vs the reference's)
PROTOCOLS = ("grpc", "http")
SHARED_MEMORY = ("none", "system", "cuda")
DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
PERCENTILES = DEFAULT_PERCENTILES  # client latency percentiles reported by default


# --------------------------------------------------------------------------------------------
# Options


MAX_CONCURRENCY = 1024  # requests in flight (one asyncio task each)
MAX_REQUESTS = 10_000_000  # measured requests per level
MAX_DURATION_S = 3600.0  # measured seconds per level


REFUSED_GRACE_S = 3.0

@dataclass(frozen=True)
class ValidateOptions:
    """How to reach the model and how much traffic to send."""

    model: str
    url: str = ""  # HOST:PORT, or several comma-separated: servers of one repository (a fleet)
    protocol: str = "grpc"
    version: str = ""
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    # each level measured in windows until stable (trtrepo.measure): time windows, or count
    # windows of ``requests`` requests
    requests: int | None = None
    stability: Stability = field(default_factory=Stability)
    # open loop: requests per second per level, instead of the concurrency levels
    request_rates: tuple[float, ...] = ()
    distribution: str = "constant"
    warmup: int = 20
    batch_size: int = 1
    shared_memory: str = "none"
    timeout: float = 10.0
    ready_timeout: float = 30.0
    # A connection refused this long ends the wait at once: nothing listens there (None: wait the
    # whole ready_timeout, for a server that is still starting).
    refused_grace: float | None = REFUSED_GRACE_S
    worst: int = 5
    label_output: str | None = None
    accuracy: bool = True
    latency: bool = True
    progress: bool | None = None
    # Speed against the reference (runs with the latency phase); None skips it.
    speed: SpeedOptions | None = field(default_factory=SpeedOptions)
    # the largest absolute difference allowed between two servers' outputs for one request (a fleet)
    max_server_diff: float = 1e-5
    # wall-time budget of the run in seconds (None: none, --thorough): the speed phase, the last
    # and the one that grows with a slow reference, gets what is left of it (trtrepo.validate.speed)
    time_budget: float | None = DEFAULT_TIME_BUDGET_S
    urls: tuple[str, ...] = field(default=(), init=False)  # every server; ``url`` is the first

    def __post_init__(self) -> None:
        self._check_target()
        self._check_load()
        self._check_times()
        urls = self._server_urls()
        object.__setattr__(self, "urls", urls)
        object.__setattr__(self, "url", urls[0])

    def _check_target(self) -> None:
        """A known protocol and shared-memory kind, and a model name."""
        if self.protocol not in PROTOCOLS:
            raise OptionError("protocol", f"{self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if self.shared_memory not in SHARED_MEMORY:
            raise OptionError("shared_memory", f"{self.shared_memory!r}: one of {', '.join(SHARED_MEMORY)}")
        if not self.model:
            raise OptionError("model", ": give the name of the model on the server", concept="the model name")

    def _check_load(self) -> None:
        """The load the levels put on the server: concurrency levels, requests per window (which
        set the measurement's window size), interval, request distribution and rates, batch size."""
        if not self.concurrency or any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency):
            raise OptionError("concurrency", f"{list(self.concurrency)}: levels must be integers 1..{MAX_CONCURRENCY}",
                              concept="the concurrency levels")
        if self.requests is not None and not 1 <= self.requests <= MAX_REQUESTS:
            raise OptionError("requests", f"{self.requests}: expected 1..{MAX_REQUESTS} per window",
                              concept="the requests per window")
        if self.stability.interval_s > MAX_DURATION_S:
            raise OptionError("measurement_interval", f"{self.stability.interval_s:g}: at most {MAX_DURATION_S:g} s")
        if self.requests is not None and self.stability.requests != self.requests:
            object.__setattr__(self, "stability", replace(self.stability, requests=self.requests))
        if self.distribution not in DISTRIBUTIONS:
            raise OptionError("request_distribution", f"{self.distribution!r}: one of {', '.join(DISTRIBUTIONS)}")
        if any(not (r > 0 and math.isfinite(r)) for r in self.request_rates):
            raise OptionError("request_rate", f"{list(self.request_rates)}: positive requests per second",
                              concept="the request rates")
        if self.batch_size < 1:
            raise OptionError("batch_size", f"{self.batch_size}: must be >= 1")

    def _check_times(self) -> None:
        """Timeouts, the model version, the time budget and the fleet's difference limit."""
        for what, v in (("timeout", self.timeout), ("ready_timeout", self.ready_timeout)):
            if not (v > 0 and math.isfinite(v)):
                raise OptionError(what, f"{v}: must be a positive number of seconds")
        if self.version and not str(self.version).isdigit():
            raise OptionError("model_version", f"{self.version!r}: a model version is a positive integer")
        if self.time_budget is not None and not (self.time_budget > 0 and math.isfinite(self.time_budget)):
            raise OptionError("time_budget", f"{self.time_budget}: a positive number of seconds ({{thorough}}: no budget)",
                              others={"thorough": "None"})
        if not (self.max_server_diff >= 0 and math.isfinite(self.max_server_diff)):
            raise OptionError("max_server_diff", f"{self.max_server_diff}: a non-negative number",
                              concept="the largest difference between servers")

    def _server_urls(self) -> tuple[str, ...]:
        """Every server of ``url`` (a comma-separated list: a fleet), as HOST:PORT; an empty
        address in a list or a server given twice is refused."""
        parts = (self.url or "").split(",")
        if len(parts) > 1 and any(not u.strip() for u in parts):
            raise OptionError("url", f"{self.url!r}: an empty address in the list", concept="the server URL")
        urls = tuple(parse_url(u, self.protocol) for u in parts)
        dup = sorted({u for u in urls if urls.count(u) > 1})
        if dup:
            raise OptionError("url", f"{self.url}: {dup[0]} given twice", concept="the server URL")
        return urls

    def server(self, url: str) -> ValidateOptions:
        """These options for one server of the fleet."""
        return replace(self, url=url)


@dataclass(frozen=True)
class ReferenceSource:
    """The model the served one is compared with, and how to read it: ``source`` is what
    ``--reference`` takes (a built-in name, a TorchScript or ``.onnx`` file, ``package.module:factory``);
    ``weights`` a state dict for an entry-point reference; ``onnx`` the ONNX model that was
    deployed, whose IO contract is used (default: the reference's, exported when it is a PyTorch
    model); ``input_shapes`` a PyTorch reference's input shapes without the batch axis
    (``[NAME:]DIMS``; default: read off the data); ``output_names`` its outputs' names; ``cache``
    False exports a PyTorch reference afresh instead of reusing its cached export
    (:func:`trtrepo.validate.reference.export_reference`)."""

    source: str
    weights: str | None = None
    onnx: str | Path | None = None
    input_shapes: Sequence[str] = ()
    output_names: Sequence[str] = ()
    cache: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shapes", tuple(self.input_shapes))
        object.__setattr__(self, "output_names", tuple(self.output_names))


DEFAULT_MIN_EMBEDDING_COSINE = 0.99  # the same floor as the held-out check of quantize/deploy


@dataclass(frozen=True)
class Thresholds:
    """Deployment-gate limits; ``None`` disables one."""

    max_top1_drop: float | None = None  # percentage points (accuracy drop vs labels, else the expected top-1 drop)
    max_p99_ms: float | None = None  # at every concurrency level
    min_cosine: float | None = None  # mean cosine similarity, every output
    # mean cosine of every output without classes (embeddings, pooled features): on by default so a
    # badly quantized encoder cannot pass silently; None disables it
    min_embedding_cosine: float | None = DEFAULT_MIN_EMBEDDING_COSINE
    # mAP50-95 of a detector's served detections against the reference's, the gate's rule
    # (trtrepo.validate.detection): its 95 % interval's lower end must clear it
    min_map: float | None = None
    # with box labels (--labels): the served detections' mAP50-95 drop against the labels, the
    # reference's minus the served, in points; the upper end of its paired 95 % interval is judged
    max_map_drop: float | None = None

    def __post_init__(self) -> None:
        if self.max_top1_drop is not None and not (0 <= self.max_top1_drop <= 100):
            raise OptionError("max_top1_drop", f"{self.max_top1_drop}: points between 0 and 100", concept="the top-1 drop limit")
        if self.max_p99_ms is not None and not self.max_p99_ms > 0:
            raise OptionError("max_p99_ms", f"{self.max_p99_ms}: must be > 0", concept="the p99 latency limit")
        if self.min_cosine is not None and not -1 <= self.min_cosine <= 1:
            raise OptionError("min_cosine", f"{self.min_cosine}: between -1 and 1", concept="the cosine floor")
        if self.min_embedding_cosine is not None and not -1 <= self.min_embedding_cosine <= 1:
            raise OptionError("min_embedding_cosine", f"{self.min_embedding_cosine}: between -1 and 1",
                              concept="the embedding cosine floor")
        if self.min_map is not None and not 0 <= self.min_map <= 1:
            raise OptionError("min_map", f"{self.min_map}: between 0 and 1", concept="the mAP floor")
        if self.max_map_drop is not None and not 0 <= self.max_map_drop <= 100:
            raise OptionError("max_map_drop", f"{self.max_map_drop}: points between 0 and 100", concept="the mAP drop limit")


def parse_url(url: str, protocol: str) -> str:
    """``HOST:PORT`` (a scheme is dropped; no URL at all is the local default port). A URL without
    a host (``http://``, ``/``, blanks) is refused: read as the default, it validated whatever
    server listens on this machine."""
    if not url:
        return f"127.0.0.1:{DEFAULT_PORTS[protocol]}"
    given = url
    url = url.strip()
    for scheme in ("http://", "https://", "grpc://"):
        if url.startswith(scheme):
            url = url[len(scheme):]
    url = url.rstrip("/")
    if not url:
        raise OptionError("url", f"{given!r}: no host; expected HOST:PORT (leave it out for 127.0.0.1)",
                          concept="the server URL")
    if "/" in url:
        raise OptionError("url", f"{url!r}: expected HOST:PORT", concept="the server URL")
    host, sep, port = url.rpartition(":")
    if not sep:
        return f"{url}:{DEFAULT_PORTS[protocol]}"
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionError("url", f"{url!r}: expected HOST:PORT with a port between 1 and 65535", concept="the server URL")
    return url


def parse_concurrency(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4) (sorted, duplicates dropped)."""
    try:
        levels = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise OptionError("concurrency", f"{text!r}: expected comma-separated integers, e.g. 1,2,4,8", concept="the concurrency levels") from None
    if not levels or levels[0] < 1 or levels[-1] > MAX_CONCURRENCY:
        raise OptionError("concurrency", f"{text!r}: levels must be integers 1..{MAX_CONCURRENCY}", concept="the concurrency levels")
    return tuple(levels)


