"""``trtrepo validate`` on a detector: served detections judged in boxes against the reference's.

Two servings are recognised, from what the server says of the model:

* **a detector ensemble** (``trtrepo deploy --ensemble`` on a YOLO-style model,
  :func:`trtrepo.repository.add_detector_ensemble`): one encoded image in, ``boxes [K, 4]``,
  ``scores [K]``, ``classes [K]`` out, in the original image's pixels (:func:`detector_endpoint`).
  The settings of the comparison are read from the server, not assumed: the postprocessing step's
  ``conf``, ``iou``, ``max_det`` and YOLO layout are its ``config.pbtxt`` parameters, and the raw
  head output it takes is named by the ensemble's steps. The reference (the FP32 ONNX or the
  PyTorch model, run locally) sees each file through the data's preprocessing (``--preprocess``,
  which must letterbox as the served preprocessing does), and its raw output goes through the same
  :func:`trtrepo.detect.postprocess` at the served settings and :func:`~trtrepo.detect.unletterbox`
  with the file's own geometry. So an FP32 model served behind the ensemble gives the reference's
  boxes exactly (mAP 1.0), and any difference is the serving's: the model file, its precision, the
  decoding of the image, the postprocessing's settings or code.
* **the raw detector model** (tensors in, the head's ``[N, 4 + classes, anchors]`` out): its
  outputs that :func:`trtrepo.qdq.detector_outputs` finds in the ONNX graph are judged by the
  gate's rule (:func:`trtrepo.detect.detection_figures`: the reference's boxes at predict settings
  against the served output's at validation settings), beside the usual cosine
  (:func:`detector_output_classes`, used by :func:`~trtrepo.validate.accuracy.run_accuracy`).

Figures (:func:`trtrepo.detect.compare_detections`): COCO mAP50-95 and mAP50 of the served
detections with the reference's as ground truth, its 95 % interval (the gate's, over the images),
the box-count agreement (images whose served and reference box counts are equal), and the worst
images by name. With box labels (``--labels``, :mod:`trtrepo.boxlabels`), the served detections
and the reference's are both judged against the labels on the same images
(:func:`trtrepo.detect.labelled_figures`: the drop in points with its paired interval), and
``--max-map-drop`` judges that drop with the gate's labelled rule. Served detections come at the served ``conf`` (no candidates below it to rank,
unlike the gate's): a box that scores just under the threshold on one side and just over it on
the other counts as missed. ``--min-map`` judges the figure with the gate's verdict
(:meth:`~trtrepo.detect.DetectionFigures.verdict`): the interval's lower end must clear the limit.

Latency needs nothing of its own: the latency phase sends the same one-image requests to the
ensemble, so its figures are end to end (decode + letterbox, the model, decode + NMS).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..boxlabels import image_hw
from ..contracts.payload import Payload
from ..detect import (
    BoxLabels,
    DetectionFigures,
    Detections,
    LabelFigures,
    YoloLayout,
    compare_detections,
    labelled_figures,
    postprocess,
    unletterbox,
)
from ..errors import OptionError, UsageError
from ..modelio import ModelIO, TensorSpec, load_onnx
from ..qdq import detector_outputs
from ..tritonconfig import DETECTIONS, NmsSettings
from .client import TritonTarget
from .contract import ThresholdResult

log = logging.getLogger(__name__)

DETECTION_OUTPUTS = tuple(t.name for t in DETECTIONS)  # boxes, scores, classes
_DTYPES = {"TYPE_FP32": "float32", "TYPE_INT64": "int64"}


@dataclass(frozen=True)
class DetectorEndpoint:
    """A served detector ensemble: its image input, the postprocessing model, the raw head output
    that feeds it (the reference's output of that name), and the served layout and NMS settings."""

    model: str
    image_input: str
    postprocess: str
    raw_output: str
    layout: YoloLayout
    nms: NmsSettings

    def served_io(self, reference: ModelIO) -> ModelIO:
        """The IO clients see: one encoded image per request (no batch axis), the detections."""
        outputs = tuple(TensorSpec(t.name, _DTYPES[t.data_type], t.dims, None) for t in DETECTIONS)
        return ModelIO((TensorSpec(self.image_input, "object", (1,), None),), outputs, source=reference.source)

    def payloads(self, files: Sequence[Path]) -> list[Payload]:
        """One request per file: its bytes as read from disk (the server decodes them)."""
        expected = {t.name: tuple(t.dims) for t in DETECTIONS}
        return [Payload({self.image_input: np.array([Path(f).read_bytes()], dtype=object)}, dict(expected),
                        np.array([i])) for i, f in enumerate(files)]

    def settings(self) -> dict[str, Any]:
        return {"postprocess": self.postprocess, "raw_output": self.raw_output, "conf": self.nms.conf,
                "iou": self.nms.iou, "max_det": self.nms.max_det, "layout": self.layout.kind,
                "classes": self.layout.num_classes}


def _params(config: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str((v or {}).get("string_value", "")) for k, v in (config.get("parameters") or {}).items()}


def _postprocess_settings(model: str, name: str, params: Mapping[str, str]) -> tuple[YoloLayout, NmsSettings]:
    """The head's layout and NMS settings from the postprocessing model's parameters; a missing or
    unreadable one is an error (not a trtrepo detector ensemble?)."""
    missing = [k for k in ("conf", "iou", "max_det", "kind", "num_classes") if not params.get(k)]
    if missing:
        raise UsageError(f"model '{model}': its postprocessing model '{name}' has no parameter '{missing[0]}' in its "
                         f"config (not a trtrepo detector ensemble?)")
    try:
        layout = YoloLayout(params["kind"], int(params["num_classes"]), int(params.get("num_masks") or 0),  # type: ignore[arg-type]
                            params.get("channels_last") == "true")
        nms = NmsSettings(float(params["conf"]), float(params["iou"]), int(params["max_det"]))
    except (ValueError, UsageError) as exc:
        raise UsageError(f"model '{model}': the parameters of its postprocessing model '{name}': {exc}") from exc
    return layout, nms


def _raw_output(model: str, io: ModelIO, steps: list[Any], post: Mapping[str, Any],
                post_config: Mapping[str, Any]) -> str:
    """The reference output the postprocessing takes: the detector output that the step feeding
    it maps to its input. Decision: a name the reference lacks falls back to the reference's only
    output; with several it is an error."""
    raw_in = str((post_config.get("input") or [{}])[0].get("name", ""))
    tensor = (post.get("input_map") or {}).get(raw_in, raw_in)  # the ensemble's tensor feeding it
    raw = next((k for s in steps for k, v in (s.get("output_map") or {}).items() if v == tensor and s is not post), raw_in)
    if raw in io.output_names:
        return raw
    if len(io.outputs) != 1:
        raise UsageError(f"model '{model}': its postprocessing takes the detector's output '{raw}', which the "
                         f"reference does not have (outputs: {', '.join(io.output_names)})")
    return io.outputs[0].name


def detector_endpoint(io: ModelIO, metadata: Mapping[str, Any], config: Mapping[str, Any],
                      model_config: Callable[[str], Mapping[str, Any]]) -> DetectorEndpoint | None:
    """The detector ensemble the server describes (``metadata`` and ``config`` of the model;
    ``model_config(name)``: another model's config from the same server), or None when the model
    is not one: one BYTES input, the outputs ``boxes``/``scores``/``classes``, ensemble steps."""
    inputs = list(metadata.get("inputs", []))
    outputs = {str(o.get("name")) for o in metadata.get("outputs", [])}
    steps = list((config.get("ensemble_scheduling") or {}).get("step", []))
    if len(inputs) != 1 or inputs[0].get("datatype") != "BYTES" or outputs != set(DETECTION_OUTPUTS) or not steps:
        return None
    model = str(metadata.get("name", ""))
    post = next((s for s in steps if "boxes" in (s.get("output_map") or {}).values()), None)
    if post is None:
        return None
    name = str(post.get("model_name"))
    post_config = model_config(name)
    layout, nms = _postprocess_settings(model, name, _params(post_config))
    raw = _raw_output(model, io, steps, post, post_config)
    return DetectorEndpoint(model, str(inputs[0]["name"]), name, raw, layout, nms)


def detector_output_classes(io: ModelIO) -> dict[str, int | None]:
    """The reference's outputs that are a YOLO-style head's (:func:`trtrepo.qdq.detector_outputs`
    on its ONNX graph: decided from the graph, not from shapes), each with its class count when the
    exporter names the classes; empty when its ONNX file cannot be read (a PyTorch reference not
    exported to a file) or holds no such head."""
    path = Path(io.source) if io.source else None
    if path is None or path.suffix.lower() != ".onnx" or not path.is_file():
        return {}
    try:
        found = detector_outputs(load_onnx(path, load_weights=False))
    except UsageError as exc:
        log.debug("%s: no detector check (%s)", path, exc)
        return {}
    return {k: v for k, v in found.items() if k in io.output_names}


def served_config(target: TritonTarget, name: str) -> dict[str, Any]:
    """Another model's config from ``target``'s server (a step of the ensemble)."""
    cfg = dict(target.call("get_model_config", name, ""))
    return dict(cfg.get("config", cfg))


def check_letterbox(preprocess: Any) -> None:
    """The data's preprocessing must letterbox, as a detector ensemble's does: the boxes are mapped
    back to the image through its geometry."""
    if getattr(preprocess, "letterbox", None) is None:
        raise OptionError("preprocess", "must letterbox as the served detector's preprocessing does (a spec with "
                                        "letterbox, as deploy wrote it)", concept="the preprocessing")


def reference_detections(rows: Sequence[Mapping[str, np.ndarray]], files: Sequence[Path], preprocess: Any,
                         endpoint: DetectorEndpoint) -> list[Detections]:
    """The reference's detections per file, as the ensemble makes them: its raw output (``rows``,
    one per file, from :func:`~trtrepo.validate.accuracy.reference_rows` on the letterboxed
    tensors) through :func:`trtrepo.detect.postprocess` at the served settings, boxes mapped back
    through the file's letterbox geometry."""
    check_letterbox(preprocess)
    out = []
    for row, f in zip(rows, files, strict=True):
        raw = np.asarray(row[endpoint.raw_output])[None]
        if raw.ndim != 3 or raw.shape[endpoint.layout.channel_axis] != endpoint.layout.channels:
            raise UsageError(f"the reference's output '{endpoint.raw_output}' has shape {list(raw.shape[1:])} per "
                             f"image; the served postprocessing expects {endpoint.layout.channels} channels "
                             f"({endpoint.layout.kind}, {endpoint.layout.num_classes} classes)")
        n = endpoint.nms
        (det,) = postprocess(raw, endpoint.layout, conf=n.conf, iou=n.iou, max_det=n.max_det)
        hw = image_hw(Path(f))
        out.append(Detections(unletterbox(det.boxes, preprocess.letterbox_geometry(hw), hw), det.scores, det.classes))
    return out


def labels_on_images(truth: Sequence[BoxLabels], files: Sequence[str | Path], preprocess: Any) -> list[BoxLabels]:
    """Box labels in the letterboxed input's pixels (as the data source reads them) mapped back to
    each file's own pixels, where a detector ensemble's boxes are; the image is the region."""
    out = []
    for t, f in zip(truth, files, strict=True):
        hw = image_hw(Path(f))
        g = preprocess.letterbox_geometry(hw)
        objects, crowd = (Detections(unletterbox(d.boxes, g, hw), d.scores, d.classes) for d in (t.objects, t.crowd))
        out.append(BoxLabels(objects, crowd, region=(0.0, 0.0, float(hw[1]), float(hw[0]))))
    return out


def run_detection(target: TritonTarget, endpoint: DetectorEndpoint, payloads: Sequence[Payload],
                  reference: Sequence[Detections], names: Sequence[str], *, concurrency: int = 4, worst: int = 5,
                  progress: Callable[[int], None] | None = None,
                  truth: Sequence[BoxLabels] | None = None) -> dict[str, Any]:
    """Every request once (``concurrency`` in flight), the served detections judged against
    ``reference`` (one per payload, in order), and with ``truth`` (box labels in the images'
    pixels, :func:`labels_on_images`) both against the labels: the ``detection`` section of
    validate.json."""
    res = target.load(payloads, min(concurrency, len(payloads)), requests=len(payloads), keep=True, progress=progress)
    served = [Detections(o["boxes"], o["scores"], o["classes"]) for o in (res.outputs[i] for i in range(len(payloads)))]
    figures = compare_detections(reference, served, worst=max(worst, 0))
    if truth is not None:
        figures = replace(figures, labels=labelled_figures(truth, reference, served))
    counts = [(len(r), len(s)) for r, s in zip(reference, served, strict=True)]
    rows = [{"sample": i, "file": names[i], "reference_boxes": r, "served_boxes": s} for i, (r, s) in enumerate(counts)]
    worst_rows = [{**rows[i], "map50_95": v} for i, v in figures.worst]
    differ = [rows[i] for i in sorted((i for i, (r, s) in enumerate(counts) if r != s),
                                      key=lambda i: (-abs(counts[i][0] - counts[i][1]), i))]
    return {"model": endpoint.model, "images": len(payloads), "requests": len(payloads), "settings": endpoint.settings(),
            "figures": figures_dict(figures), "worst_images": worst_rows, "count_differences": differ[:max(worst, 0)],
            "per_image": rows}


# --------------------------------------------------------------------------------------------
# Thresholds and rendering (pure)


def figures_dict(figures: DetectionFigures) -> dict[str, Any]:
    """JSON-ready (validate.json allows no NaN: an undefined mAP, no reference box, is None)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in figures.to_dict().items()}


def figures_from(d: Mapping[str, Any]) -> DetectionFigures:
    """:func:`figures_dict` (or :meth:`DetectionFigures.to_dict`) read back; None is NaN again."""
    return DetectionFigures.from_dict({k: math.nan if v is None else v for k, v in d.items()})


def _undecided(need: int | None, decided: int) -> str:
    return f": cannot decide on {decided} images" + (f", about {need} would decide" if need is not None else "")


def map_threshold(figures: DetectionFigures, name: str, limit: float) -> ThresholdResult:
    """The gate's rule on ``figures`` (:meth:`DetectionFigures.verdict`): the value is mAP50-95,
    which passes when its interval's lower end clears ``limit``; an undecided one fails, naming
    the images that would decide."""
    verdict = figures.verdict(limit)
    detail = (f"mAP50-95 vs the reference's detections, 95% interval {figures.lower:.3f}-{figures.upper:.3f} "
              f"({figures.decided} of {figures.images} images hold reference boxes); the lower end is judged")
    if verdict == "undecided":
        detail += _undecided(figures.images_to_decide(limit), figures.decided)
    value = figures.map50_95 if math.isfinite(figures.map50_95) else None
    return ThresholdResult(f"map[{name}]", limit, value, verdict == "pass", detail)


def detection_thresholds(report: Mapping[str, Any], min_map: float | None) -> list[ThresholdResult]:
    """``--min-map`` on a report dict: the ensemble's detections (``detection``) and every raw
    detector output of the accuracy phase; an OptionError when nothing in it is a detector's."""
    if min_map is None:
        return []
    found = _detector_figures(report)
    if not found:
        raise OptionError("min_map", ": the served model is not a detector (no detection ensemble and no "
                                     "YOLO-style head output), or the accuracy phase is off",
                          concept="the mAP floor")
    return [map_threshold(f, name, min_map) for name, f in found]


def map_drop_threshold(labels: LabelFigures, name: str, limit: float) -> ThresholdResult:
    """The gate's labelled rule on ``labels`` (:meth:`LabelFigures.verdict`): the value is the drop
    in points, which passes when its paired interval's upper end is at or under ``limit``."""
    verdict = labels.verdict(limit)
    detail = (f"mAP50-95 vs labels, the reference's {labels.fp32_map50_95:.3f} minus the served {labels.map50_95:.3f}, "
              f"points; 95% interval {labels.lower:.2f} to {labels.upper:.2f} ({labels.decided} of {labels.images} "
              "images hold labelled boxes); the upper end is judged")
    if verdict == "undecided":
        detail += _undecided(labels.images_to_decide(limit), labels.decided)
    value = labels.drop if math.isfinite(labels.drop) else None
    return ThresholdResult(f"map_drop[{name}]", limit, value, verdict == "pass", detail)


def map_drop_thresholds(report: Mapping[str, Any], limit: float | None) -> list[ThresholdResult]:
    """``--max-map-drop`` on a report dict, like :func:`detection_thresholds`; an OptionError when
    no detector figure in it was measured against box labels."""
    if limit is None:
        return []
    found = [(name, f.labels) for name, f in _detector_figures(report) if f.labels is not None]
    if not found:
        raise OptionError("max_map_drop", ": no detector was judged against box labels (give {labels}: a COCO JSON "
                                          "file or a YOLO txt folder for the image folder)",
                          concept="the mAP drop limit", others={"labels": "labels"})
    return [map_drop_threshold(lab, name, limit) for name, lab in found]


def _detector_figures(report: Mapping[str, Any]) -> list[tuple[str, DetectionFigures]]:
    """The ensemble's figures and every raw detector output's of a report dict."""
    found = []
    det = report.get("detection")
    if det:
        found.append((str(det["model"]), figures_from(det["figures"])))
    for name, m in ((report.get("accuracy") or {}).get("outputs") or {}).items():
        if m.get("detection"):
            found.append((name, figures_from(m["detection"])))
    return found


def _labels_line(f: Mapping[str, Any]) -> str | None:
    lab = f.get("labels")
    return None if not lab else "against the box labels: " + LabelFigures.from_dict(lab).describe().replace(
        "against FP32's", "against the reference's")


def _describe(f: Mapping[str, Any]) -> str:
    def num(key: str) -> str:
        v = f.get(key)
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    return (f"mAP50-95 {num('map50_95')} (95% interval {num('lower')}-{num('upper')}), mAP50 {num('map50')}, box "
            f"counts agree on {100 * float(f.get('count_agreement') or 0):.0f}% of {f.get('images')} images "
            f"({f.get('reference_boxes')} reference boxes, {f.get('candidate_boxes')} served)")


def detection_console_lines(det: Mapping[str, Any], worst: int = 3) -> list[str]:
    """What validate prints of a detector ensemble's detections: the settings, the figures, the
    worst images by name (those below 1.0: a perfect image is no news) and the images whose box
    counts differ."""
    s = det["settings"]
    lines = [f"detections of {det['model']} vs the reference run locally (same letterbox, decode + class-aware NMS "
             f"at conf {s['conf']:g}, IoU {s['iou']:g}, max {s['max_det']}, as '{s['postprocess']}' serves): "
             + _describe(det["figures"])]
    labelled = _labels_line(det["figures"])
    if labelled:
        lines.append(labelled)
    below = [r for r in det.get("worst_images") or () if r["map50_95"] < 1.0 - 1e-9]
    if below and worst > 0:
        lines.append("worst images: " + "; ".join(
            f"{r['file']} (mAP50-95 {r['map50_95']:.3f}, boxes {r['reference_boxes']} reference / {r['served_boxes']} served)"
            for r in below[:worst]))
    if det.get("count_differences") and worst > 0:
        lines.append("box counts differ: " + "; ".join(
            f"{r['file']} ({r['reference_boxes']} reference / {r['served_boxes']} served)"
            for r in det["count_differences"][:worst]))
    return lines


def output_detection_line(name: str, m: Mapping[str, Any]) -> str | None:
    """A raw detector output's figures judged in boxes (the gate's rule), or None."""
    f = m.get("detection")
    if not f:
        return None
    labelled = _labels_line(f)
    return (f"{name}: in boxes (reference at predict settings, served at validation ones): {_describe(f)}"
            + (f"; {labelled}" if labelled else ""))


def detection_markdown(det: Mapping[str, Any]) -> list[str]:
    """The ``Detections`` section of validate.md."""
    s, f = det["settings"], det["figures"]
    lines = ["", f"## Detections ({det['images']} images, one request each)", "",
             f"The served `{det['model']}` (image bytes -> letterbox -> model -> decode + class-aware NMS in "
             f"`{s['postprocess']}` at conf {s['conf']:g}, IoU {s['iou']:g}, at most {s['max_det']} boxes) against the "
             f"reference run locally on the same files through the same letterbox and postprocessing (its raw output "
             f"`{s['raw_output']}`, {s['layout']}, {s['classes']} classes); COCO mAP with the reference's boxes as "
             f"ground truth.", "",
             "| mAP50-95 | 95% interval | mAP50 | box counts agree | reference boxes | served boxes |",
             "|---|---|---|---|---|---|",
             f"| {_num(f.get('map50_95'))} | {_num(f.get('lower'))}-{_num(f.get('upper'))} | {_num(f.get('map50'))} | "
             f"{100 * float(f.get('count_agreement') or 0):.0f}% | {f.get('reference_boxes')} | {f.get('candidate_boxes')} |"]
    labelled = _labels_line(f)
    if labelled:
        lines += ["", labelled[0].upper() + labelled[1:] + "."]
    if det.get("worst_images"):
        lines += ["", "Worst images (lowest mAP50-95):", "", "| file | mAP50-95 | reference boxes | served boxes |",
                  "|---|---|---|---|"]
        lines += [f"| {r['file']} | {r['map50_95']:.3f} | {r['reference_boxes']} | {r['served_boxes']} |"
                  for r in det["worst_images"]]
    if det.get("count_differences"):
        lines += ["", "Images whose box counts differ:", "", "| file | reference boxes | served boxes |", "|---|---|---|"]
        lines += [f"| {r['file']} | {r['reference_boxes']} | {r['served_boxes']} |" for r in det["count_differences"]]
    lines += ["", "The latency below is end to end: each request is one encoded image through the whole ensemble."]
    return lines


def _num(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.3f}"
