"""Triton Python-backend preprocessing model (written by trtrepo).

Copied as ``model.py``; the version folder also holds ``preprocess.json`` (the saved
preprocessing spec) and ``trtrepo_preprocess/``, a copy of trtrepo's own ``data.py`` (with the
modules it imports), so images are decoded and transformed by exactly the code
(``Preprocess.apply``) that calibration and evaluation used.

Input: one encoded image (PNG, JPEG, ...) per sample, ``TYPE_STRING`` with dims ``[1]``.
Output: the model input tensor named in the config (one output).
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
        self.batching = int(config.get("max_batch_size", 0)) > 0

    def _decode(self, blob):
        from PIL import Image

        if isinstance(blob, np.ndarray):
            blob = blob.item()
        with Image.open(io.BytesIO(bytes(blob))) as img:
            img.load()
            return self.preprocess.apply(img)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                blobs = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
                if self.batching:
                    arr = np.stack([self._decode(b) for b in blobs.reshape(blobs.shape[0], -1)[:, 0]])
                else:
                    arr = self._decode(blobs.reshape(-1)[0])
                tensor = pb_utils.Tensor(self.output_name, np.ascontiguousarray(arr.astype(self.output_dtype, copy=False)))
                responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocess: {exc}")))
        return responses
