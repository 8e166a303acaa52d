"""The memory budget: how much of a batch's activations one ONNX Runtime run may fetch.

ONNX Runtime allocates every extra output of a run (also those not fetched), so the activations
of a batch grow with ``batch_size``. Each batch is therefore cut into micro-batches (slices along
axis 0 of every input) whose fetched bytes stay within the budget: the first sample is run once
alone to measure the bytes per sample of every tensor, and every run is measured again (the
largest bytes per sample seen for each input shape; a new shape, e.g. a longer sequence, starts
from a quadratic extrapolation). Where fewer than 3 samples' tensors fit in the budget, the
tensors are split into groups (:func:`pack_groups`), each fetched by its own session in its own walk
over the data (the data is read once per group and pass). Group sessions load the model as ONNX
Runtime optimized it with *all* the tensors as outputs (graph optimizations off), so they run the
same kernels: fetching fewer outputs from the original model would let ONNX Runtime fuse other
nodes and change the last bits.

The budget does not change the results (statistics, ranges, caches): a micro-batch is never one
sample of a larger batch (:func:`slice_size`; ONNX Runtime runs a one-row MatMul/Gemm through another
kernel whose last bits differ), and a tensor that does not depend on the batch (e.g. a position
embedding) is recognised on the first cut batch (runs of 2 then 3 or more samples, compared by
:func:`witness_digest`) and counted once per batch, as without a budget. The budget bounds the fetched
activations; it is exceeded only by a tensor larger than it (alone in its group), a cut batch of
3 or 4 samples before that classification (run whole), a run of 3 where only 2 fit (never leaving
1 behind) and a first run on a new input shape whose extrapolation fell short. The batch's
inputs, the model, ONNX Runtime's scratch memory and one tensor's histogram scratch come on top.
``memory_budget_mb=None`` fetches whole batches (the behaviour before the budget).

The functions here are pure; the :class:`~trtrepo.calibrate.calibrator.Calibrator` keeps the
measured bytes and runs the sessions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_MEMORY_BUDGET_MB = 512.0

# Input shapes of one sample (axis 0 dropped), by input name: what the fetched bytes depend on.
Signature = tuple[tuple[str, tuple[int, ...]], ...]


def input_signature(inputs: Mapping[str, np.ndarray]) -> Signature:
    return tuple(sorted((name, tuple(np.shape(a)[1:])) for name, a in inputs.items()))


def signature_elements(sig: Signature) -> int:
    return sum(math.prod(shape) for _, shape in sig)


# Elements a witness digest reads (see witness_digest).
_DIGEST_ELEMENTS = 1 << 16


def witness_digest(value: np.ndarray) -> bytes:
    """Fingerprint of a tensor's values for telling batch-independent tensors (the same values
    whatever the samples) from batch-dependent ones: the whole tensor up to ``_DIGEST_ELEMENTS``
    elements, else that many elements at an even stride. It is compared only between two runs
    whose shapes are equal (a tensor with a batch axis already differs in shape), so a
    data-dependent tensor would have to repeat bit for bit on every sampled element to pass."""
    flat = np.ascontiguousarray(value).reshape(-1)
    if flat.size > _DIGEST_ELEMENTS:
        flat = np.ascontiguousarray(flat[:: -(-flat.size // _DIGEST_ELEMENTS)])
    return hashlib.blake2b(flat.data, digest_size=16).digest()


def slice_size(left: int, most: int, avoid: int = 0) -> int:
    """Samples of the next micro-batch: ``left`` if at most ``most``, else up to ``most`` but at
    least 2, never leaving exactly 1 sample behind (nor taking ``avoid``)."""
    if left <= most and left != avoid:
        return left
    for take in (*range(min(most, left), 1, -1), *range(min(most, left) + 1, left + 1)):
        if take != avoid and left - take != 1:
            return take
    return left


def pack_groups(names: Sequence[str], sizes: Mapping[str, float], budget: int) -> list[list[str]]:
    """Consecutive groups of ``names`` whose ``sizes`` sum within ``budget`` (a larger tensor alone)."""
    groups: list[list[str]] = []
    total = 0.0
    for name in names:
        if groups and total + sizes[name] <= budget:
            groups[-1].append(name)
            total += sizes[name]
        else:
            groups.append([name])
            total = sizes[name]
    return groups
