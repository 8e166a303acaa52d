"""Triton Python-backend preprocessing model (written by trtrepo).

Copied as ``model.py``; the version folder also holds ``preprocess.json`` (the saved
preprocessing spec) and ``trtrepo_preprocess/``, a copy of trtrepo's own ``data.py`` (with the
modules it imports), so images are decoded and transformed by exactly the code
(``Preprocess.apply``) that calibration and evaluation used.

Input: one encoded image (PNG, JPEG, ...) per sample, ``TYPE_STRING`` with dims ``[1]``.
Outputs: the model input tensor named first in the config; when the config also declares them
(a letterboxing spec feeding a detector's postprocessing), ``LETTERBOX`` (scale, pad_x, pad_y)
float32 and ``IMAGE_HW`` (the original height, width) int32 per image, which map the detector's
boxes back to the original image. Without batching (``max_batch_size: 0``) the tensor takes the
config's dims (a leading 1 where the model's input has one).
Parameters: ``preprocess_file`` (default ``preprocess.json``).
"""

import io
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
        from trtrepo_preprocess.data import Preprocess

        self.preprocess = Preprocess.load(os.path.join(version_dir, params.get("preprocess_file", "preprocess.json")))
        self.input_name = config["input"][0]["name"]
        out = config["output"][0]
        self.output_name = out["name"]
        self.output_dtype = pb_utils.triton_string_to_numpy(out["data_type"])
        self.output_dims = [int(d) for d in out.get("dims", [])]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        names = {o["name"] for o in config["output"][1:]}
        self.geometry = "LETTERBOX" in names and "IMAGE_HW" in names

    def _decode(self, blob):
        """(tensor, letterbox (scale, pad_x, pad_y), (height, width)) of one encoded image."""
        from PIL import Image

        if isinstance(blob, np.ndarray):
            blob = blob.item()
        with Image.open(io.BytesIO(bytes(blob))) as img:
            img.load()
            hw = (img.size[1], img.size[0])
            box = self.preprocess.letterbox_geometry(hw) if self.geometry else (1.0, 0.0, 0.0)
            return self.preprocess.apply(img), box, hw

    def _tensors(self, arr, boxes, hws):
        tensors = [pb_utils.Tensor(self.output_name, np.ascontiguousarray(arr.astype(self.output_dtype, copy=False)))]
        if self.geometry:
            tensors.append(pb_utils.Tensor("LETTERBOX", np.asarray(boxes, dtype=np.float32)))
            tensors.append(pb_utils.Tensor("IMAGE_HW", np.asarray(hws, dtype=np.int32)))
        return tensors

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                blobs = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
                if self.batching:
                    done = [self._decode(b) for b in blobs.reshape(blobs.shape[0], -1)[:, 0]]
                    tensors = self._tensors(np.stack([d[0] for d in done]), [d[1] for d in done], [d[2] for d in done])
                else:
                    arr, box, hw = self._decode(blobs.reshape(-1)[0])
                    dims = [1 if d == -1 else d for d in self.output_dims]
                    if dims and int(np.prod(dims)) == arr.size:  # the config's [1, C, H, W] for [C, H, W]
                        arr = arr.reshape(dims)
                    tensors = self._tensors(arr, box, hw)
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocess: {exc}")))
        return responses
