"""PyTorch reference runner: the source model's outputs on a data source.

The reference is what served models are compared against (evaluation, ``trtrepo validate``).
It runs on the CPU by default and on CUDA when asked for (``device="auto"`` picks CUDA when
available).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .data import DataSource, iter_batches
from .errors import UsageError
from .export import ModelSource, _import_torch, load_torch_model, resolve_source
from .modelio import ModelIO


@dataclass
class ReferenceResult:
    outputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    device: str


def resolve_device(device: str) -> str:
    torch = _import_torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: CUDA is not available to torch on this machine")
    if device != "cpu" and not device.startswith("cuda"):
        raise UsageError(f"--device {device}: expected cpu, cuda, cuda:N or auto")
    return device


class Reference:
    """A loaded PyTorch model plus the input/output names it is called with."""

    def __init__(
        self,
        source: ModelSource | str,
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        weights: str | None = None,
        device: str = "cpu",
    ) -> None:
        self.torch = _import_torch()
        self.source = resolve_source(source, weights) if isinstance(source, str) else source
        self.device = resolve_device(device)
        self.model = load_torch_model(self.source).to(self.device)
        self.input_names = list(input_names)
        self.output_names = list(output_names)

    @classmethod
    def for_io(cls, source: ModelSource | str, io: ModelIO, **kw: Any) -> Reference:
        return cls(source, input_names=io.input_names, output_names=io.output_names, **kw)

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        args = [torch.from_numpy(np.ascontiguousarray(feed[n])).to(self.device) for n in self.input_names]
        with torch.inference_mode():
            out = self.model(*args)
        if isinstance(out, dict):
            out = list(out.values())
        if not isinstance(out, (list, tuple)):
            out = [out]
        if len(out) != len(self.output_names):
            raise UsageError(
                f"{self.source.location}: the PyTorch model returns {len(out)} outputs but the deployed model has "
                f"{len(self.output_names)} ({', '.join(self.output_names)})"
            )
        return {n: o.detach().float().cpu().numpy() for n, o in zip(self.output_names, out, strict=True)}

    def run(
        self,
        data: DataSource,
        *,
        batch_size: int = 32,
        io: ModelIO | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> ReferenceResult:
        parts: dict[str, list[np.ndarray]] = {n: [] for n in self.output_names}
        labels: list[np.ndarray] = []
        for batch in iter_batches(data, batch_size, io):
            for k, v in self(batch.inputs).items():
                parts[k].append(v)
            if batch.labels is not None:
                labels.append(batch.labels)
            if progress:
                progress(batch.size)
        outputs = {k: _concat(v) for k, v in parts.items()}
        return ReferenceResult(outputs, np.concatenate(labels) if labels and data.has_labels else None, self.device)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate on the batch axis; variable trailing shapes (sequence outputs) become an object array."""
    if len({p.shape[1:] for p in parts}) <= 1:
        return np.concatenate(parts)
    out = np.empty(sum(len(p) for p in parts), dtype=object)
    i = 0
    for p in parts:
        for row in p:
            out[i] = row
            i += 1
    return out


def run_reference(
    source: ModelSource | str,
    data: DataSource,
    io: ModelIO,
    *,
    weights: str | None = None,
    device: str = "cpu",
    batch_size: int = 32,
) -> ReferenceResult:
    """Run the PyTorch source model over ``data``; outputs are keyed by ``io``'s output names."""
    return Reference.for_io(source, io, weights=weights, device=device).run(data, batch_size=batch_size, io=io)
