"""Triton Python-backend detector postprocessing model (written by trtrepo).

Copied as ``model.py``; the version folder also holds ``trtrepo_postprocess/detect/``, a copy of
trtrepo's own ``trtrepo.detect`` (numpy only), so the served boxes are exactly what
``trtrepo.detect.postprocess`` and ``unletterbox`` give locally.

One image per request (``max_batch_size: 0``): the number of boxes differs per image, and a
request's outputs are that image's.

Inputs: the detector's raw head output (the config's first input: ``[1, C, A]`` channels first or
``[1, A, C]`` channels last), ``LETTERBOX`` (scale, pad_x, pad_y) float32 and ``IMAGE_HW``
(original height, width) int32, both from the preprocessing model.
Outputs: ``boxes`` ``[K, 4]`` float32 (x1, y1, x2, y2 in the original image's pixels),
``scores`` ``[K]`` float32, ``classes`` ``[K]`` int64, by score descending.
Parameters (read once, at initialize): ``conf``, ``iou``, ``max_det`` (the NMS settings) and the
head's layout: ``kind`` (anchor_free or anchor_based), ``num_classes``, ``num_masks``,
``channels_last`` (true or false).
"""

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        if version_dir not in sys.path:
            sys.path.insert(0, version_dir)
        from trtrepo_postprocess.detect import YoloLayout, postprocess, unletterbox

        self.postprocess, self.unletterbox = postprocess, unletterbox
        self.layout = YoloLayout(params["kind"], int(params["num_classes"]), int(params.get("num_masks", "0")),
                                 params.get("channels_last", "") == "true")
        self.conf = float(params.get("conf", "0.25"))
        self.iou = float(params.get("iou", "0.7"))
        self.max_det = int(params.get("max_det", "300"))
        # the config's order: raw output, LETTERBOX, IMAGE_HW in; boxes, scores, classes out
        self.raw_name, self.letterbox_name, self.hw_name = (t["name"] for t in config["input"])
        self.output_names = [t["name"] for t in config["output"]]

    def _detect(self, request):
        raw = pb_utils.get_input_tensor_by_name(request, self.raw_name).as_numpy()
        if raw.ndim == 2:
            raw = raw[None]
        if raw.ndim != 3 or raw.shape[0] != 1:
            raise ValueError(f"'{self.raw_name}' of shape {list(raw.shape)}: expected one image per request")
        scale, pad_x, pad_y = (float(v) for v in pb_utils.get_input_tensor_by_name(request, self.letterbox_name).as_numpy().reshape(3))
        h, w = (int(v) for v in pb_utils.get_input_tensor_by_name(request, self.hw_name).as_numpy().reshape(2))
        (det,) = self.postprocess(raw, self.layout, conf=self.conf, iou=self.iou, max_det=self.max_det)
        boxes = self.unletterbox(det.boxes, (scale, pad_x, pad_y), (h, w))
        values = (np.ascontiguousarray(boxes, dtype=np.float32).reshape(-1, 4),
                  np.ascontiguousarray(det.scores, dtype=np.float32), np.ascontiguousarray(det.classes, dtype=np.int64))
        return [pb_utils.Tensor(name, value) for name, value in zip(self.output_names, values, strict=True)]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._detect(request)))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocess: {exc}")))
        return responses
