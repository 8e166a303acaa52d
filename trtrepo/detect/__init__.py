"""Detection postprocessing and metrics for YOLO-style heads, as pure numpy (no I/O, numpy only).

The raw head output decoded into boxes (:mod:`.decode`), greedy and class-aware NMS, the full
postprocessing and the letterbox geometry (:mod:`.nms`), COCO mAP plus box-count agreement
of one model's detections against another's (:mod:`.metrics`), and ground-truth boxes from COCO
JSON or YOLO txt (:mod:`.labels`). The same functions judge an INT8
detector against its FP32 twin, check served detections, and run inside the Triton ensemble's
postprocessing model, which is why nothing here imports more than numpy.
"""

from __future__ import annotations

from .decode import KINDS, Detections, YoloLayout, decode, xywh_to_xyxy
from .judge import (
    DetectionFigures,
    LabelFigures,
    borderline_detections,
    candidate_detections,
    compare_detections,
    decisive_difference,
    detection_figures,
    labelled_figures,
    reference_detections,
)
from .labels import (
    BoxLabels,
    CocoImage,
    CocoIndex,
    class_names,
    coco_index,
    image_region,
    in_input_frame,
    yolo_txt_boxes,
)
from .metrics import (
    COCO_IOU_THRESHOLDS,
    COCO_MAX_DETS,
    MapResult,
    bootstrap_map,
    box_iou,
    count_agreement,
    count_difference,
    mean_ap,
    paired_map_bootstrap,
)
from .nms import (
    DEFAULT_CONF,
    DEFAULT_IOU,
    DEFAULT_MAX_DET,
    DEFAULT_MAX_NMS,
    batched_nms,
    letterbox_params,
    nms,
    postprocess,
    unletterbox,
)

__all__ = [
    "BoxLabels",
    "CocoImage",
    "CocoIndex",
    "LabelFigures",
    "candidate_detections",
    "class_names",
    "coco_index",
    "image_region",
    "in_input_frame",
    "labelled_figures",
    "paired_map_bootstrap",
    "yolo_txt_boxes",
    "DetectionFigures",
    "compare_detections",
    "detection_figures",
    "decisive_difference",
    "borderline_detections",
    "reference_detections",
    "COCO_IOU_THRESHOLDS",
    "COCO_MAX_DETS",
    "DEFAULT_CONF",
    "DEFAULT_IOU",
    "DEFAULT_MAX_DET",
    "DEFAULT_MAX_NMS",
    "KINDS",
    "Detections",
    "MapResult",
    "YoloLayout",
    "batched_nms",
    "box_iou",
    "count_agreement",
    "count_difference",
    "decode",
    "letterbox_params",
    "bootstrap_map",
    "mean_ap",
    "nms",
    "postprocess",
    "unletterbox",
    "xywh_to_xyxy",
]
