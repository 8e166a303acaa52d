"""The reference side and the accuracy phase: served outputs against the reference's, batch by
batch, with the worst samples."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts import builtin
from ..contracts.payload import Payload
from ..data import iter_batches
from ..detect import BoxLabels
from ..errors import OptionError, UsageError
from ..evaluate import Detector, OutputMetrics, compare_output, cosine_similarity, looks_like_embedding
from ..export import resolve_inputs
from ..modelio import ModelIO
from ..modelsource import resolve_source
from ..onnxgraph import make_session
from .client import TritonTarget
from .detection import figures_dict
from .reference import Reference, export_reference

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Reference side


def reference_io(reference: str, *, onnx: str | Path | None = None, weights: str | None = None,
                 workdir: str | Path | None = None, input_shapes: Sequence[str] = (), data: Any = None,
                 output_names: Sequence[str] = (), cache: bool = True) -> ModelIO:
    """The reference's IO: from ``onnx`` (the model that was deployed) when given, from the
    reference itself when it is an ONNX file, else by exporting the PyTorch source to ONNX with
    its inputs from ``input_shapes`` (``--input-shape``) or read off ``data`` (a DataSource); the
    export is cached (:func:`trtrepo.validate.reference.export_reference`; ``cache=False`` bypasses it)."""

    if onnx is not None:
        return ModelIO.from_onnx(onnx)
    src = resolve_source(reference, weights)
    if output_names and (not src.is_torch or builtin.builtin(src.kind) is not None):
        raise OptionError("output_names", f"do not apply to {{reference}} {reference} (its outputs are named already)",
                          others={"reference": "the reference"})
    if src.kind == "onnx":
        return ModelIO.from_onnx(src.location)

    try:
        inputs, axes = resolve_inputs(src, input_shapes, data)
        result = export_reference(src, inputs=inputs, dynamic_axes=axes or None, output_names=list(output_names) or None,
                                  workdir=workdir, cache=cache)
        for note in result.notes:
            log.warning("--reference %s: %s", reference, note)
    except UsageError as exc:
        raise OptionError("reference", f"{reference}: cannot derive its IO by exporting it ({exc.message}); "
                                       f"give {{input_shapes}} or the deployed ONNX model ({{onnx}})",
                          others={"input_shapes": "the input shapes", "onnx": "onnx="}) from exc
    return result.io


def make_reference(reference: str, io: ModelIO, *, weights: str | None = None, device: str = "cpu"
                   ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A callable ``feed -> outputs``: the PyTorch model (:class:`~trtrepo.validate.reference.Reference`)
    or, for an ``.onnx`` reference, ONNX Runtime."""

    src = resolve_source(reference, weights)
    if src.kind == "onnx":

        sess = make_session(src.location)
        names = io.output_names
        in_names = {i.name for i in sess.get_inputs()}

        def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, sess.run(names, {k: v for k, v in feed.items() if k in in_names}), strict=True))

        return run

    return Reference.for_io(src, io, device=device)


# --------------------------------------------------------------------------------------------
# Accuracy


def _merge_metrics(name: str, refs: list[np.ndarray], served: list[np.ndarray], labels: np.ndarray | None,
                   classification: bool = False, classes: int | None | bool = False,
                   truth: Sequence[BoxLabels] | None = None) -> Any:
    """Metrics of one output with :mod:`trtrepo.evaluate` (top-k only when ``classification``;
    judged in boxes too when ``classes`` is not False: a detector's head, with its class count or
    None, :class:`trtrepo.evaluate.Detector`); batches whose trailing shapes differ (sequence
    outputs) are compared batch by batch and merged (no top-k, no boxes then)."""

    if len({r.shape[1:] for r in refs}) <= 1:
        ref = np.concatenate(refs)
        detector = None if classes is False else Detector.of(ref, None if classes is True else classes, truth)
        return compare_output(name, ref, np.concatenate(served), labels, classification=classification,
                              detection=detector), cosine_similarity(ref, np.concatenate(served))
    cos = np.concatenate([cosine_similarity(r, s) for r, s in zip(refs, served, strict=True)])
    diffs = [np.abs(r.astype(np.float64) - s.astype(np.float64)) for r, s in zip(refs, served, strict=True)]
    total = sum(d.size for d in diffs)
    m = OutputMetrics(name=name, samples=len(cos), max_abs_error=float(max((d.max() for d in diffs if d.size), default=0.0)),
                      mean_abs_error=float(sum(d.sum() for d in diffs) / total) if total else 0.0,
                      cosine_mean=float(cos.mean()) if len(cos) else float("nan"),
                      cosine_min=float(cos.min()) if len(cos) else float("nan"))
    return m, cos


def reference_rows(reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], source: Any, io: ModelIO, *,
                   batch_size: int = 64, progress: Callable[[int], None] | None = None) -> list[dict[str, np.ndarray]]:
    """The reference's outputs per sample (by position in ``source``), computed in batches of
    ``batch_size`` whatever the request batch size (the reference is much faster batched)."""

    rows: list[dict[str, np.ndarray]] = []
    for b in iter_batches(source, batch_size, io):
        out = reference(b.inputs)
        rows.extend({k: np.asarray(v[j]) for k, v in out.items()} for j in range(b.size))
        if progress is not None:
            progress(b.size)
    return rows


@dataclass(frozen=True)
class BoxChecks:
    """What :func:`run_accuracy` judges in boxes: the outputs that are a YOLO-style head's, with
    their class counts (:func:`~trtrepo.validate.detection.detector_output_classes`), and the data's
    box labels per sample position (in the input's pixels), where it has them."""

    classes: Mapping[str, int | None]
    labels: Sequence[BoxLabels] | None = None


def run_accuracy(target: TritonTarget, payloads: Sequence[Payload],
                 reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | Sequence[dict[str, np.ndarray]],
                 labels: Sequence[np.ndarray | None], *, concurrency: int = 4, worst: int = 5,
                 label_output: str | None = None, progress: Callable[[int], None] | None = None,
                 names: Sequence[str] | None = None, detectors: BoxChecks | None = None) -> dict[str, Any]:
    """Send every payload once and compare its outputs with the reference's (a callable run on
    the same batches, or :func:`reference_rows`), per output. Each payload's ``expected``
    shapes are set to the reference's (the latency phase checks responses against them).

    ``names``: one name per sample position (the data's file names): the worst samples and the
    per-sample rows (``per_sample``: cosine of every output, and top-1 of both sides with their
    agreement for the label output) carry it as ``file``. ``detectors``: the outputs that are a
    YOLO-style head's, also judged in boxes (the gate's rule; ``detection`` in their metrics), and
    against the data's box labels where it has them (:class:`BoxChecks`)."""
    ref_parts = _reference_parts(payloads, reference)
    res = target.load(payloads, min(concurrency, len(payloads)), requests=len(payloads), keep=True, progress=progress)
    served_parts = [res.outputs[i] for i in range(len(payloads))]
    y = _label_array(labels)
    index = np.concatenate([p.indices if p.indices is not None else np.arange(p.batch) for p in payloads])
    classes = {} if detectors is None else detectors.classes
    truth = None if detectors is None or detectors.labels is None else [detectors.labels[int(i)] for i in index]
    outputs = list(ref_parts[0])
    if label_output is not None and label_output not in outputs:
        raise OptionError("label_output", f"{label_output!r}: the model has no such output (outputs: {', '.join(outputs)})")
    classifiers = _classifier_outputs(outputs, ref_parts, label_output)
    primary = label_output or (classifiers[0] if classifiers else None)
    metrics: dict[str, Any] = {}
    worst_rows: dict[str, list[dict[str, Any]]] = {}
    cosines: dict[str, np.ndarray] = {}
    for name in outputs:
        refs = [r[name] for r in ref_parts]
        served = [s[name].astype(np.float32, copy=False) for s in served_parts]
        is_label = name == primary and name in classifiers  # top-1/top-5 only on the label output
        metrics[name], cosines[name] = _output_metrics(name, refs, served, (y if is_label else None, is_label),
                                                       classes.get(name, False), truth)
        worst_rows[name] = _worst(cosines[name], refs, served, index, y, worst, names)
    top1 = _top1_pair(ref_parts, served_parts, primary) if primary is not None and primary in classifiers else None
    return {"samples": int(len(index)), "requests": len(payloads), "label_output": primary, "outputs": metrics,
            "worst_samples": worst_rows, "per_sample": per_sample_rows(index, cosines, top1, y, names)}


def _label_array(labels: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """Decision: the labels count only when every batch has them (and there is a batch)."""
    has_labels = all(lb is not None for lb in labels)
    return np.concatenate([np.asarray(lb) for lb in labels]) if has_labels and labels else None


def _top1_pair(ref_parts: list[dict[str, np.ndarray]], served_parts: list[dict[str, np.ndarray]],
               primary: str) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 classes of the label output, reference and served, in payload order."""
    return (np.concatenate([np.argmax(r[primary], axis=1) for r in ref_parts]),
            np.concatenate([np.argmax(s[primary], axis=1) for s in served_parts]))


def _reference_parts(payloads: Sequence[Payload],
                     reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | Sequence[dict[str, np.ndarray]],
                     ) -> list[dict[str, np.ndarray]]:
    """The reference's outputs per payload, each payload's ``expected`` shapes set to them.
    Decision: per-sample rows (:func:`reference_rows`) are stacked by the payload's sample
    positions; a callable runs on the payload's inputs."""
    ref_parts: list[dict[str, np.ndarray]] = []
    for p in payloads:
        if isinstance(reference, Sequence):  # per-sample rows (see reference_rows)
            idx = p.indices if p.indices is not None else np.arange(p.batch)
            out = {k: np.stack([reference[int(i)][k] for i in idx]) for k in reference[int(idx[0])]}
        else:
            out = reference(p.inputs)
        ref_parts.append(out)
        p.expected = {k: tuple(v.shape) for k, v in out.items()}
    return ref_parts


def _classifier_outputs(outputs: list[str], ref_parts: list[dict[str, np.ndarray]], label_output: str | None) -> list[str]:
    """Decision: [N, C] outputs are classifiers, except what looks like an embedding (unit-norm
    rows, an embedding-like name) unless it is the label output named: the same rule as the
    held-out check of quantize/deploy (trtrepo.evaluate.label_output)."""
    return [n for n in outputs if all(r[n].ndim == 2 and r[n].shape[1] >= 2 for r in ref_parts)
            and (n == label_output or not looks_like_embedding(n, np.concatenate([r[n] for r in ref_parts])))]


def _output_metrics(name: str, refs: list[np.ndarray], served: list[np.ndarray], label: tuple[np.ndarray | None, bool],
                    classes: int | None | bool,
                    truth: Sequence[BoxLabels] | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """One output's metrics as the report keeps them (``label``: (labels, whether it is judged as
    the label output, top-k); ``classes``: a detector head's class count, judged in boxes too) and
    its per-sample cosines."""
    y, is_label = label
    m, cos = _merge_metrics(name, refs, served, y, classification=is_label, classes=classes, truth=truth)
    d = m.to_dict()
    d["top1_drop_points"] = m.top1_drop_points
    if m.detection is not None:
        d["detection"] = figures_dict(m.detection)
    return d, cos


def per_sample_rows(index: np.ndarray, cosines: dict[str, np.ndarray], top1: tuple[np.ndarray, np.ndarray] | None,
                    labels: np.ndarray | None, names: Sequence[str] | None) -> list[dict[str, Any]]:
    """One row per sample, in data order: its position (and file), the cosine of every output
    and, for the label output, both top-1 classes and whether they agree."""
    rows = []
    for j, pos in enumerate(index):
        row: dict[str, Any] = {"sample": int(pos)}
        if names is not None:
            row["file"] = names[int(pos)]
        row["cosine"] = {k: float(v[j]) for k, v in cosines.items() if len(v) == len(index)}
        if top1 is not None:
            row["reference_top1"], row["served_top1"] = int(top1[0][j]), int(top1[1][j])
            row["top1_agree"] = bool(top1[0][j] == top1[1][j])
        if labels is not None:
            row["label"] = int(labels[j])
        rows.append(row)
    order = np.argsort(index, kind="stable")
    return [rows[int(k)] for k in order]


def _worst(cos: np.ndarray, refs: list[np.ndarray], served: list[np.ndarray], index: np.ndarray,
           labels: np.ndarray | None, k: int, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    if k <= 0 or len(cos) == 0:
        return []
    rows_ref = [row for r in refs for row in r]
    rows_srv = [row for s in served for row in s]
    err = np.asarray([float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0 for a, b in zip(rows_ref, rows_srv, strict=True)])
    order = np.lexsort((-err, cos))[:k]
    out = []
    for j in order:
        row: dict[str, Any] = {"sample": int(index[j]), "cosine": float(cos[j]), "max_abs_error": float(err[j])}
        if names is not None:
            row["file"] = names[int(index[j])]
        if rows_ref[j].ndim == 1 and rows_ref[j].size >= 2:
            row["reference_top1"] = int(np.argmax(rows_ref[j]))
            row["served_top1"] = int(np.argmax(rows_srv[j]))
        if labels is not None:
            row["label"] = int(labels[j])
        out.append(row)
    return out


