"""Deployment check against a running Triton server (``trtrepo validate``), a package split by concern:
``options``, ``contract`` (pure comparisons and statistics), ``shm`` (shared-memory regions),
``load`` (closed and open loop, measured in windows, over two transports), ``client``
(:class:`TritonTarget`), ``accuracy``, ``detection`` (a detector judged in boxes), ``report``,
``stage`` (:func:`validate`).

Four phases, each usable on its own through :class:`TritonTarget`:

1. **Readiness and contract** -- :meth:`TritonTarget.wait_ready` polls server liveness and
   model readiness with exponential backoff under one deadline (a model that is not in the
   repository index or failed to load is reported at once, with the server's reason);
   :func:`compare_contract` checks the served model's metadata and config against the
   reference's :class:`~trtrepo.modelio.ModelIO` field by field (names, data types, shapes,
   max batch size) before any inference request is sent.
2. **Accuracy** -- :func:`run_accuracy` sends the data set through Triton and through the
   reference (PyTorch, or ONNX Runtime for an ``.onnx`` reference) batch by batch, checks every
   response's shape and compares the outputs with the metric functions of
   :mod:`trtrepo.evaluate`; the worst samples (lowest cosine similarity) are listed. A detector
   (an ensemble returning boxes, or a YOLO-style head output) is judged in boxes: mAP of the
   served detections against the reference's (:mod:`~trtrepo.validate.detection`).
3. **Latency and throughput** -- after a warm-up (:meth:`TritonTarget.load`),
   :meth:`TritonTarget.measure` keeps ``concurrency`` requests in flight (or sends them at a
   request rate) and measures in windows until the last ones are stable
   (:mod:`~trtrepo.validate.load`); client percentiles come next to the server's own statistics
   for the same requests (:func:`stats_diff` of ``get_inference_statistics`` read where the
   reported windows start and end), so the client's overhead is visible.
   Tensors can travel through system shared memory (or CUDA shared memory on a GPU machine).
4. **Speed against the reference** (issue 8) -- :func:`trtrepo.validate.speed.compare_speed` times the
   PyTorch reference (CUDA when available, else CPU) and the served model at concurrency 1 on
   the same batches of one input shape, per batch size; ``speed_vs_reference`` in the report.
5. **Report** -- :class:`ValidationReport` writes ``validate.json`` (stable keys),
   ``validate.md`` and ``latency.png`` atomically; :func:`check_thresholds` decides the exit code.

Every wait is bounded: readiness by ``ready_timeout``, each request by ``timeout`` (the gRPC
deadline and an asyncio timeout around every call). :func:`validate` runs the whole check against
the model a :class:`ReferenceSource` names.
"""

from __future__ import annotations

from .accuracy import (
    make_reference,
    reference_io,
    reference_rows,
    run_accuracy,
)
from .client import TritonTarget
from .contract import (
    ContractError,
    Mismatch,
    ThresholdResult,
    check_thresholds,
    compare_contract,
    stats_diff,
)
from .detection import detector_output_classes
from .load import (
    Arrivals,
    AsyncioTransport,
    CallbackTransport,
    LoadResult,
    LoadRun,
    Measurement,
)
from .options import (
    DEFAULT_PORTS,
    PERCENTILES,
    PROTOCOLS,
    REFUSED_GRACE_S,
    REPORT_SCHEMA,
    SHARED_MEMORY,
    ReferenceSource,
    Thresholds,
    ValidateOptions,
    parse_concurrency,
    parse_url,
)
from .report import (
    ValidationReport,
    write_latency_csv,
    write_plot,
)
from .shm import (
    SharedMemory,
)
from .stage import (
    make_payloads,
    run_latency,
    run_speed,
    validate,
)

__all__ = [
    "detector_output_classes",
    "Arrivals",
    "AsyncioTransport",
    "CallbackTransport",
    "ContractError",
    "DEFAULT_PORTS",
    "LoadResult",
    "LoadRun",
    "Measurement",
    "Mismatch",
    "PERCENTILES",
    "PROTOCOLS",
    "REFUSED_GRACE_S",
    "REPORT_SCHEMA",
    "SHARED_MEMORY",
    "ReferenceSource",
    "SharedMemory",
    "ThresholdResult",
    "Thresholds",
    "TritonTarget",
    "ValidateOptions",
    "ValidationReport",
    "check_thresholds",
    "compare_contract",
    "make_payloads",
    "make_reference",
    "parse_concurrency",
    "parse_url",
    "reference_io",
    "reference_rows",
    "run_accuracy",
    "run_latency",
    "run_speed",
    "stats_diff",
    "validate",
    "write_latency_csv",
    "write_plot",
]
