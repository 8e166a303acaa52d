"""Triton Python-backend model that runs an ONNX model with ONNX Runtime (written by trtrepo).

Copied as ``model.py`` next to ``model.onnx`` in the version folder. Config parameters
(``parameters { key: ... value: { string_value: ... } }``):

* ``onnx_filename``: file in the version folder (default ``model.onnx``);
* ``intra_op_threads`` / ``inter_op_threads``: ONNX Runtime thread pools (default 1 / 1);
* ``x64quantprecision``: ``auto`` (default), ``1`` or ``0``: ONNX Runtime's
  ``session.x64quantprecision``. ``auto`` sets it to 1 only on x86 CPUs with AVX2/AVX-512 and
  no VNNI, where ONNX Runtime's U8S8 INT8 kernels saturate and give wrong results; elsewhere it
  only slows INT8 down (2.9x measured on a VNNI CPU), so it stays unset. Decided on the serving
  machine, which need not be the one that built the repository;
* ``EXECUTION_ENV_PATH``: read by the backend itself: a venv with ``numpy<2`` and ``onnxruntime``.

ONNX Runtime's intra-op thread spinning is turned off (``session.intra_op.allow_spinning=0``):
spinning threads compete with the server's own threads on small CPUs. Requests of one
``execute`` call (a dynamic batch) are concatenated along the batch axis and run in one
session call when their per-sample shapes agree.
"""

import json
import os
import platform

import numpy as np
import triton_python_backend_utils as pb_utils


def u8s8_saturates(cpuinfo_path="/proc/cpuinfo", machine=None):
    """True on x86 CPUs with AVX2/AVX-512 and no VNNI (the rule of trtrepo.cpu, kept standalone
    because this file runs inside Triton without trtrepo)."""
    if (machine or platform.machine()) not in ("x86_64", "AMD64", "i686"):
        return False
    try:
        with open(cpuinfo_path) as f:
            flags = next((line.partition(":")[2].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags
    return not vnni and any(f in flags for f in ("avx2", "avx512f", "avx512bw"))


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(version_dir, params.get("onnx_filename", "model.onnx"))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        opts.inter_op_num_threads = int(params.get("inter_op_threads", "1"))
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        precision = params.get("x64quantprecision", "auto")
        if precision == "auto":
            precision = "1" if u8s8_saturates() else ""
        if precision:
            opts.add_session_config_entry("session.x64quantprecision", precision)
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["input"]]
        self.outputs = [(t["name"], pb_utils.triton_string_to_numpy(t["data_type"])) for t in config["output"]]
        model_inputs = {i.name for i in self.session.get_inputs()}
        model_outputs = {o.name for o in self.session.get_outputs()}
        missing = [n for n, _ in self.inputs if n not in model_inputs] + [n for n, _ in self.outputs if n not in model_outputs]
        if missing:
            raise pb_utils.TritonModelException(f"{path}: the ONNX model has no tensor(s) {', '.join(missing)}")

    def _feeds(self, request):
        feed = {}
        for name, dtype in self.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is None:
                raise ValueError(f"missing input '{name}'")
            feed[name] = np.ascontiguousarray(tensor.as_numpy().astype(dtype, copy=False))
        return feed

    def _run(self, feed):
        names = [n for n, _ in self.outputs]
        return dict(zip(names, self.session.run(names, feed), strict=True))

    def _respond(self, result):
        tensors = [pb_utils.Tensor(name, np.ascontiguousarray(result[name].astype(dtype, copy=False)))
                   for name, dtype in self.outputs]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests):
        responses = [None] * len(requests)
        feeds = []
        for i, request in enumerate(requests):
            try:
                feeds.append((i, self._feeds(request)))
            except Exception as exc:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        same_shape = len({tuple((n, a.shape[1:]) for n, a in f.items()) for _, f in feeds}) == 1
        if self.batching and len(feeds) > 1 and same_shape:
            sizes = [next(iter(f.values())).shape[0] for _, f in feeds]
            merged = {name: np.concatenate([f[name] for _, f in feeds]) for name, _ in self.inputs}
            try:
                result = self._run(merged)
            except Exception as exc:
                error = pb_utils.TritonError(f"onnxruntime: {exc}")
                for i, _ in feeds:
                    responses[i] = pb_utils.InferenceResponse(error=error)
                return responses
            start = 0
            for (i, _), size in zip(feeds, sizes, strict=True):
                responses[i] = self._respond({k: v[start:start + size] for k, v in result.items()})
                start += size
            return responses
        for i, feed in feeds:
            try:
                responses[i] = self._respond(self._run(feed))
            except Exception as exc:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {exc}"))
        return responses

    def finalize(self):
        self.session = None
