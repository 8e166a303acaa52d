"""One :class:`BackendSpec` per kind of Triton model trtrepo writes: the registry that
``tritonconfig`` (templates, platform/backend, defaults), ``repository`` (which files go into the
version folder), ``deploy`` (which Q/DQ placement, whether to build a plan) and the CLI's
``--backend`` choices all read.

A new backend is one ``BackendSpec`` declared under the ``trtrepo.backends`` entry points (or one
:func:`register` call) plus its jinja2 template, shipped beside the plug-in's module (see
``template_dir``), in ``templates/`` or in a ``--template-dir``.

Names: a backend's one user-facing name is its ``--backend`` name (:attr:`BackendSpec.name`:
``tensorrt``, ``onnxruntime``, ``python``), which is also the entry point's name and the name of
the Q/DQ target its INT8 model needs where it has its own placement. ``kind`` (``tensorrt_plan``,
``onnxruntime_onnx``) is the registry key and summaries' label; ``platform``/``backend`` are
Triton's own strings in ``config.pbtxt``, mapped back to the spec by :func:`for_config`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import plugins
from ..cpu import available_cores
from ..plugins import Registry


@dataclass(frozen=True)
class BackendSpec:
    """A kind of model in a Triton repository.

    * ``kind``: the config kind (``ModelConfig.kind``); ``template``: its jinja2 template;
    * ``platform`` / ``backend``: what ``config.pbtxt`` names (one of them);
    * ``model_file``: the file Triton loads from the version folder;
    * ``option``: the name users give to ``--backend`` (None: written only by trtrepo itself);
    * ``source``: the model file it is made from (``onnx`` or ``plan``; None for composed kinds);
    * ``extra_files``: ``(file in the version folder, shipped template file)`` copied beside it;
    * ``instance_kind``: the instance group's kind under ``--instance-kind auto``;
    * ``quantize_target``: the Q/DQ placement its INT8 model needs (``tensorrt`` / ``onnxruntime``);
    * ``engine``: a TensorRT plan (profiles, CUDA graphs, per-GPU plan files apply);
    * ``runs_python``: Python backend (``EXECUTION_ENV_PATH`` applies);
    * ``parameters``: default config parameters from the model options (``ModelOptions``);
    * ``server_backend``: the backend library the server needs (``server --help`` lists them);
    * ``label``: how summaries name it (default: the kind);
    * ``threads_parameter``: the config parameter holding its instances' intra-op threads (what
      ``tune`` varies; None: not a knob), ``threads_unset``: the threads a config without that
      parameter runs with (None: the runtime's own default, which ``tune`` leaves alone);
    * ``template_dir``: the folder holding ``template`` when it is not one of trtrepo's (a
      plug-in's package); a ``--template-dir`` still comes first;
    * ``runtime``: what loads its model file when Triton loads the model (``onnxruntime``: an
      ONNX Runtime session, ``tensorrt``: a plan deserialised; None: nothing trtrepo can try), which
      ``repository.loads`` tries before the model lands (``repo add``, ``deploy``, ``tune --apply``)
      and ``repo check`` tries again;
    * ``unsupported_types``: Triton data types its model cannot carry at all (refused when the
      model is added, naming the tensor): the Python backend converts every tensor to numpy
      (``pb_utils.triton_string_to_numpy``), which has no bfloat16.
    """

    kind: str
    template: str
    platform: str | None = None
    backend: str | None = None
    model_file: str | None = None
    option: str | None = None
    source: str | None = None
    extra_files: tuple[tuple[str, str], ...] = ()
    instance_kind: str = "KIND_AUTO"
    quantize_target: str = "onnxruntime"
    engine: bool = False
    runs_python: bool = False
    parameters: Callable[[Any], Mapping[str, str]] = field(default=lambda options: {}, compare=False)
    server_backend: str | None = None
    label: str | None = None  # how summaries name it (default: the kind)
    threads_parameter: str | None = None
    threads_unset: int | None = None
    template_dir: str | None = None
    runtime: str | None = None
    unsupported_types: tuple[str, ...] = ()

    @property
    def display(self) -> str:
        return self.label or self.kind

    @property
    def name(self) -> str:
        """The backend's one user-facing name: its ``--backend`` name (the kind for the kinds only
        trtrepo writes)."""
        return self.option or self.kind

    def __post_init__(self) -> None:
        if (self.platform is None) == (self.backend is None):
            raise ValueError(f"backend spec '{self.kind}': give exactly one of platform and backend")


def _check(specs: Mapping[str, BackendSpec], new: BackendSpec) -> None:
    if new.option is not None and any(s.option == new.option for s in specs.values()):
        raise ValueError(f"backend option '{new.option}' is already registered")


# The registry, by kind: the six below, then the ``trtrepo.backends`` entry points (trtrepo.plugins).
BACKENDS: Registry[BackendSpec] = Registry(plugins.BACKENDS, "backend kind", BackendSpec, lambda s: s.kind, _check)


def register(spec: BackendSpec) -> BackendSpec:
    return BACKENDS.register(spec)


def spec(kind: str) -> BackendSpec | None:
    return BACKENDS.get(kind)


def for_option(option: str) -> BackendSpec | None:
    """The spec users pick with ``--backend OPTION``."""
    return next((s for s in BACKENDS.values() if s.option == option), None)


def for_config(platform: str, backend: str) -> BackendSpec | None:
    """The spec of a parsed config: the first whose ``platform`` or ``backend`` it names (the Python
    backend's kinds share ``backend: "python"``: the first registered, ``python_onnx``, answers).
    A platform kind named by its backend library instead (``backend: "tensorrt"``,
    ``backend: "onnxruntime"``, both of which Triton accepts) is found by its ``server_backend``."""
    return next((s for s in BACKENDS.values()
                 if (platform and s.platform == platform) or (backend and backend in (s.backend, s.server_backend))),
                None)


def options(source: str | None = None) -> tuple[str, ...]:
    """``--backend`` names, of the backends made from ``source`` (``onnx``/``plan``) when given."""
    return tuple(s.option for s in BACKENDS.values() if s.option is not None and (source is None or s.source == source))


def machine_threads(instance_count: int, cores: int | None = None) -> int:
    """The default ONNX Runtime intra-op threads of a CPU model: the cores available here shared by
    its instances, at least 1 (``cores // instances``): one instance on a 2-core machine gets 2."""
    return max(1, (cores or available_cores()) // max(1, instance_count))


def _python_onnx_parameters(options: Any) -> dict[str, str]:
    """ONNX Runtime's thread pools in the Python backend: ``--intra-op-threads``, else the cores of
    this machine shared by the model's instances (:func:`machine_threads`)."""

    cores = available_cores()
    instances = max(1, int(options.instance_count))
    threads = options.intra_op_threads if options.intra_op_threads is not None else machine_threads(instances, cores)
    if threads and threads * instances > cores:
        logging.getLogger("trtrepo.tritonconfig").warning(
            "%d instance(s) x %d intra-op thread(s) = %d threads on %d core(s): the instances will compete for "
            "the cores (oversubscribed); lower --instance-count or --intra-op-threads", instances, threads,
            threads * instances, cores)
    return {"onnx_filename": "model.onnx", "intra_op_threads": str(threads),
            "inter_op_threads": str(options.inter_op_threads)}


TENSORRT = register(BackendSpec("tensorrt_plan", "tensorrt_plan.pbtxt.j2", platform="tensorrt_plan", model_file="model.plan",
                     option="tensorrt", source="plan", instance_kind="KIND_GPU", quantize_target="tensorrt",
                     engine=True, server_backend="tensorrt", runtime="tensorrt"))
ONNXRUNTIME = register(BackendSpec("onnxruntime_onnx", "onnxruntime.pbtxt.j2", platform="onnxruntime_onnx",
                                   model_file="model.onnx", option="onnxruntime", source="onnx",
                                   server_backend="onnxruntime", threads_parameter="intra_op_thread_count",
                                   runtime="onnxruntime"))
PYTHON = register(BackendSpec("python_onnx", "python_onnx.pbtxt.j2", backend="python", model_file="model.py", option="python",
                     source="onnx", extra_files=(("model.py", "python_onnx_model.py"),), instance_kind="KIND_CPU",
                     runs_python=True, parameters=_python_onnx_parameters, server_backend="python",
                     label="python (onnxruntime)", threads_parameter="intra_op_threads", threads_unset=1,
                     runtime="onnxruntime", unsupported_types=("TYPE_BF16",)))
PYTHON_PREPROCESS = register(BackendSpec("python_preprocess", "python_preprocess.pbtxt.j2", backend="python", model_file="model.py",
                     instance_kind="KIND_CPU", runs_python=True, server_backend="python"))
PYTHON_POSTPROCESS = register(BackendSpec("python_postprocess", "python_postprocess.pbtxt.j2", backend="python",
                     model_file="model.py", instance_kind="KIND_CPU", runs_python=True, server_backend="python"))
ENSEMBLE = register(BackendSpec("ensemble", "ensemble.pbtxt.j2", platform="ensemble"))
