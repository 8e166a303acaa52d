"""One request to a served model and the output shapes its response must have: the contract
between :mod:`trtrepo.validate` (accuracy, latency) and :mod:`trtrepo.validate.speed` (served vs
reference timing), which both build and check requests with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TrtrepoError
from ..modelio import ModelIO


@dataclass
class Payload:
    """One request: a batch of inputs, and the output shapes its response must have (``-1``:
    not known in advance)."""

    inputs: dict[str, np.ndarray]
    expected: dict[str, tuple[int, ...]]
    indices: np.ndarray | None = None

    @property
    def batch(self) -> int:
        return int(len(next(iter(self.inputs.values()))))


def expected_shapes(io: ModelIO, batch: int) -> dict[str, tuple[int, ...]]:
    return {t.name: t.with_batch(batch) for t in io.outputs}


def check_shape(name: str, got: Sequence[int], expected: Sequence[int], where: str) -> None:
    ok = len(got) == len(expected) and all(e == -1 or g == e for g, e in zip(got, expected, strict=True))
    if not ok:
        raise TrtrepoError(f"{where}: output '{name}' has shape {list(got)}, expected {list(expected)}"
                           f"{' (empty response: check the Python backend environment, numpy<2)' if 0 in got or not got else ''}")
