"""Triton model configuration values: the config objects, :class:`ModelOptions` and
:func:`config_from_io` (Python decides every value), the preprocessing, detector postprocessing
and ensemble configs and the execution-environment settings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..contracts.backends import BACKENDS, BackendSpec
from ..contracts.plan import PlanMetadata
from ..contracts.profile import DEFAULT_MAX_BATCH
from ..detect import YoloLayout
from ..errors import OptionError, UsageError
from ..modelio import ModelIO, TensorSpec

INSTANCE_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")
# Triton model names: a folder name; kept to a portable, URL-safe set.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def check_model_name(name: str, what: str = "model name") -> str:
    """A Triton-legal model name: a single folder name, no separators, no ``..``, not hidden."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", "..") or ".." in name:
        raise UsageError(
            f"{what} {name!r} is not a valid Triton model name (letters, digits, '_', '-', '.'; "
            f"starts with a letter, digit or '_'; at most 128 characters; no '..')"
        )
    return name


# --------------------------------------------------------------------------------------------
# Value objects (mirror model_config.proto; frozen, validated where built)


MAX_INSTANCE_COUNT = 128  # model instances per instance group

@dataclass(frozen=True)
class TensorConfig:
    name: str
    data_type: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    label_filename: str | None = None
    optional: bool = False


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False


@dataclass(frozen=True)
class InstanceGroup:
    kind: str = "KIND_CPU"
    count: int = 1
    gpus: tuple[int, ...] = ()
    profiles: tuple[str, ...] = ()


@dataclass(frozen=True)
class WarmupInput:
    name: str
    data_type: str
    dims: tuple[int, ...]
    source: str = "zero"  # zero | random


@dataclass(frozen=True)
class Warmup:
    name: str
    batch_size: int
    count: int
    inputs: tuple[WarmupInput, ...]


@dataclass(frozen=True)
class VersionPolicy:
    kind: str = "latest"  # latest | all | specific
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        """``latest``, ``latest:N``, ``all`` or ``specific:1,3``."""
        kind, _, arg = text.partition(":")
        try:
            if kind == "latest":
                n = int(arg) if arg else 1
                if n < 1:
                    raise ValueError
                return cls("latest", num_versions=n)
            if kind == "all" and not arg:
                return cls("all")
            if kind == "specific" and arg:
                versions = tuple(int(v) for v in arg.split(","))
                if any(v < 1 for v in versions):
                    raise ValueError
                return cls("specific", versions=versions)
        except ValueError:
            pass
        raise OptionError("version_policy", f"{text!r}: expected latest, latest:N, all or specific:V1,V2")


@dataclass(frozen=True)
class CudaOptimization:
    graphs: bool = False
    busy_wait_events: bool = False
    output_copy_stream: bool = False


@dataclass(frozen=True)
class EnsembleStep:
    model_name: str
    input_map: tuple[tuple[str, str], ...]  # (step model tensor, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]
    model_version: int = -1


@dataclass(frozen=True)
class ModelConfig:
    """Everything a ``config.pbtxt`` holds, decided in Python. ``kind`` picks the template."""

    name: str
    kind: str
    max_batch_size: int
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    cuda: CudaOptimization | None = None
    warmup: tuple[Warmup, ...] = ()
    version_policy: VersionPolicy | None = None
    response_cache: bool = False
    parameters: tuple[tuple[str, str], ...] = ()
    default_model_filename: str | None = None
    cc_model_filenames: tuple[tuple[str, str], ...] = ()
    ensemble_steps: tuple[EnsembleStep, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in BACKENDS:
            raise UsageError(f"model '{self.name}': unknown model kind '{self.kind}' (one of {', '.join(BACKENDS)})")
        check_model_name(self.name)

    @property
    def spec(self) -> BackendSpec:
        return BACKENDS[self.kind]

    @property
    def platform(self) -> str | None:
        return self.spec.platform

    @property
    def backend(self) -> str | None:
        return self.spec.backend

    @property
    def model_filename(self) -> str | None:
        return self.default_model_filename or self.spec.model_file

    @property
    def template(self) -> str:
        return self.spec.template


# --------------------------------------------------------------------------------------------
# Options -> config


@dataclass(frozen=True)
class ModelOptions:
    """User choices for one model; everything else is derived from the IO description.

    ``max_batch_size`` None: the plan's profile maximum, else 32 (0 without a batch axis).
    ``instance_kind`` auto: KIND_GPU for plans, KIND_CPU for Python models, KIND_AUTO for ONNX Runtime.
    ``preferred_batch_sizes`` empty: ``(max_batch_size,)``, what Triton itself fills in at load time.
    """

    max_batch_size: int | None = None
    dynamic_batching: bool = True
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 100
    preserve_ordering: bool = False
    instance_kind: str = "auto"
    instance_count: int = 1
    gpus: tuple[int, ...] = ()
    cuda_graphs: bool = False
    warmup: bool = False
    warmup_random: bool = False
    version_policy: str | None = None
    response_cache: bool = False
    parameters: tuple[tuple[str, str], ...] = ()
    label_output: str | None = None
    label_filename: str = "labels.txt"
    has_labels: bool = False
    intra_op_threads: int | None = None  # None: cores available / instances (machine_threads)
    inter_op_threads: int = 1
    execution_env: str | None = None  # EXECUTION_ENV_PATH: a packed archive (shipped) or a directory of this machine
    cc_model_filenames: tuple[tuple[str, str], ...] = ()
    profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 0:
            raise OptionError("max_batch_size", f"{self.max_batch_size}: must be >= 0")
        if self.max_queue_delay_us < 0:
            raise OptionError("max_queue_delay_us", f"{self.max_queue_delay_us}: must be >= 0 microseconds",
                              concept="the max queue delay")
        if not 1 <= self.instance_count <= MAX_INSTANCE_COUNT:
            raise OptionError("instance_count", f"{self.instance_count}: expected 1..{MAX_INSTANCE_COUNT} per group "
                                                f"(each instance holds its own copy of the model)")
        kind = self.instance_kind.upper()
        if kind != "AUTO" and f"KIND_{kind.removeprefix('KIND_')}" not in INSTANCE_KINDS:
            raise OptionError("instance_kind", f"{self.instance_kind!r}: one of auto, gpu, cpu, model")
        if any(g < 0 for g in self.gpus):
            raise OptionError("gpus", f"{list(self.gpus)}: GPU ids must be >= 0", concept="the instance GPUs")
        if any(b < 1 for b in self.preferred_batch_sizes):
            raise OptionError("preferred_batch_sizes", f"{list(self.preferred_batch_sizes)}: sizes must be >= 1")
        if (self.intra_op_threads is not None and self.intra_op_threads < 0) or self.inter_op_threads < 0:
            raise OptionError("intra_op_threads", "and {inter_op_threads} must be >= 0 (0: ONNX Runtime's default)",
                              concept="the intra-op threads", others={"inter_op_threads": "the inter-op threads"})
        for key, _ in self.parameters:
            if not key:
                raise OptionError("parameters", ": the key must not be empty (KEY=VALUE)", concept="a config parameter")
        if self.version_policy is not None:
            VersionPolicy.parse(self.version_policy)


def _tensor_config(t: TensorSpec, batching: bool, label_filename: str | None = None) -> TensorConfig:
    dims = t.sample_shape if batching else t.shape
    reshape = None
    if not dims:  # Triton needs non-empty dims: a per-sample scalar is [1] reshaped to []
        dims, reshape = (1,), ()
    return TensorConfig(t.name, t.triton_dtype, tuple(dims), reshape, label_filename)


def _instance_kind(options: ModelOptions, kind: str) -> str:
    k = options.instance_kind.upper().removeprefix("KIND_")
    if k != "AUTO":
        return f"KIND_{k}"
    return BACKENDS[kind].instance_kind


def config_from_io(
    name: str,
    io: ModelIO,
    spec: BackendSpec,
    options: ModelOptions | None = None,
    *,
    plan: PlanMetadata | None = None,
) -> ModelConfig:
    """Decide every config value for model ``name`` of backend ``spec`` from its IO description.
    ``plan``: an engine's metadata, whose optimization profiles bound max_batch_size (Triton's
    rule, :meth:`PlanMetadata.triton_max_batch`)."""
    options = options or ModelOptions()
    check_model_name(name)
    kind = spec.kind
    if kind not in BACKENDS or kind == "ensemble":
        raise UsageError(f"model '{name}': config_from_io does not build '{kind}' configs")
    mbs = _max_batch_size(name, io, options, plan if spec.engine else None)
    batching = mbs > 0
    label_output = _label_output(name, io, options)
    inputs = tuple(_tensor_config(t, batching) for t in io.inputs)
    outputs = tuple(
        _tensor_config(t, batching, options.label_filename if options.has_labels and t.name == label_output else None)
        for t in io.outputs
    )
    dyn = _dynamic_batching(name, options, mbs)
    groups = (InstanceGroup(_instance_kind(options, kind), options.instance_count, tuple(options.gpus), tuple(options.profiles)),)
    warmup = _warmup(io, inputs, options, mbs)
    params = _parameters(spec, options)
    cuda = CudaOptimization(graphs=True) if options.cuda_graphs else None
    _check_engine_only(name, spec, options)
    return ModelConfig(
        name=name,
        kind=kind,
        max_batch_size=mbs,
        inputs=inputs,
        outputs=outputs,
        dynamic_batching=dyn,
        instance_groups=groups,
        cuda=cuda,
        warmup=warmup,
        version_policy=VersionPolicy.parse(options.version_policy) if options.version_policy else None,
        response_cache=options.response_cache,
        parameters=params,
        cc_model_filenames=tuple(options.cc_model_filenames),
    )


def _max_batch_size(name: str, io: ModelIO, options: ModelOptions, plan: PlanMetadata | None) -> int:
    """Decision: 0 for a model without a dynamic batch axis (a max batch size given for it is
    refused); else the one given; else what an engine's profiles allow (``plan``); else
    DEFAULT_MAX_BATCH. The plan's profiles are read first, whatever is decided (a profile it lacks fails)."""
    engine_max = plan.triton_max_batch(options.profiles) if plan is not None else None
    if not io.has_batch_axis:
        if options.max_batch_size:
            raise OptionError(
                "", f"model '{name}': {{max_batch_size}} {options.max_batch_size} but the model has no dynamic batch "
                    f"axis (axis 0 of every input and output); use {{max_batch_size}} 0",
                others={"max_batch_size": "the max batch size"})
        return 0
    if options.max_batch_size is not None:
        return options.max_batch_size
    return engine_max if engine_max is not None else DEFAULT_MAX_BATCH


def _label_output(name: str, io: ModelIO, options: ModelOptions) -> str | None:
    """The output the labels file belongs to. Decision: with labels and none named, the one output
    with one value per class (judged per sample when axis 0 is a batch axis, even one that
    --max-batch-size 0 leaves to the model: dims [-1, classes]); several or none is an error."""
    label_output = options.label_output
    if options.has_labels and label_output is None:
        cands = [t for t in io.outputs if len(t.sample_shape if io.has_batch_axis else t.shape) == 1]
        if len(cands) != 1:
            raise OptionError("", f"model '{name}': cannot tell which output the labels belong to; give {{label_output}}",
                              others={"label_output": "the label output"})
        label_output = cands[0].name
    if label_output is not None:
        io.output(label_output)  # names the output when missing
    return label_output


def _dynamic_batching(name: str, options: ModelOptions, mbs: int) -> DynamicBatching | None:
    """Decision: dynamic batching only with a max batch size over 1, its preferred sizes explicit
    (Triton fills an empty preferred_batch_size with max_batch_size at load time: say so);
    preferred sizes without room to batch are refused."""
    if options.dynamic_batching and mbs > 1:
        preferred = tuple(options.preferred_batch_sizes) or (mbs,)
        return DynamicBatching(preferred, options.max_queue_delay_us, options.preserve_ordering)
    if options.preferred_batch_sizes and mbs <= 1:
        raise OptionError("", f"model '{name}': {{preferred_batch_sizes}} needs {{max_batch_size}} > 1 (it is {mbs})",
                          others={"preferred_batch_sizes": "the preferred batch sizes", "max_batch_size": "the max batch size"})
    return None


def _warmup(io: ModelIO, inputs: tuple[TensorConfig, ...], options: ModelOptions, mbs: int) -> tuple[Warmup, ...]:
    """One warm-up request at the max batch size (at least 1), dynamic dims as 1, zeros or random."""
    if not options.warmup:
        return ()
    winputs = tuple(
        WarmupInput(t.name, t.triton_dtype, tuple(1 if d == -1 else d for d in c.dims), "random" if options.warmup_random else "zero")
        for t, c in zip(io.inputs, inputs, strict=True)
    )
    return (Warmup("warmup", max(1, mbs), 1, winputs),)


def _parameters(spec: BackendSpec, options: ModelOptions) -> tuple[tuple[str, str], ...]:
    """The config's parameters: the ones given win over the backend's defaults; a Python model
    with an execution environment names it (EXECUTION_ENV_PATH)."""
    params = dict(options.parameters)
    for key, value in spec.parameters(options).items():
        params.setdefault(key, value)
    if spec.runs_python and options.execution_env:
        params.setdefault("EXECUTION_ENV_PATH", execution_env_value(options.execution_env))
    return tuple(sorted(params.items()))


def _check_engine_only(name: str, spec: BackendSpec, options: ModelOptions) -> None:
    """CUDA graphs and per-compute-capability plan files apply to TensorRT engines only."""
    if options.cuda_graphs and not spec.engine:
        raise OptionError("", f"model '{name}': {{cuda_graphs}} applies to the tensorrt backend only (backend is {spec.kind})",
                          others={"cuda_graphs": "CUDA graphs"})
    if options.cc_model_filenames and not spec.engine:
        raise UsageError(f"model '{name}': cc_model_filenames applies to TensorRT plans only")


ENV_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"


def is_env_archive(env: str | Path) -> bool:
    """A packed Python environment (conda-pack's ``.tar.gz``), shipped inside the model folder."""
    return str(env).endswith(ENV_ARCHIVE_SUFFIXES)


def execution_env_value(env: str | Path) -> str:
    """``EXECUTION_ENV_PATH`` for ``--python-env``: an archive is copied into the model folder and
    named relative to it (``$$TRITON_MODEL_DIRECTORY/ENV.tar.gz``, portable); a directory stays an
    absolute path of this machine (the repository is then host-specific)."""
    if is_env_archive(env):
        return f"{MODEL_DIRECTORY}/{Path(env).name}"
    return str(Path(env).absolute())


def execution_env_warning(env: str | Path) -> str | None:
    """The warning for a ``--python-env`` directory: the repository then names a path of this machine."""
    if is_env_archive(env):
        return None
    return (f"--python-env {env}: EXECUTION_ENV_PATH names a directory of this machine, so the repository does not "
            f"travel ('trtrepo repo check' reports it); pack the environment (conda-pack -o ENV.tar.gz) to ship it "
            f"with the model")


def execution_env_files(options: ModelOptions) -> dict[str, Path]:
    """The model-folder files ``options.execution_env`` needs (its archive), by file name."""
    env = options.execution_env
    return {Path(env).name: Path(env)} if env and is_env_archive(env) else {}


# The letterbox geometry the preprocessing model hands the detector's postprocessing, per image.
LETTERBOX = TensorConfig("LETTERBOX", "TYPE_FP32", (3,))  # scale, pad_x, pad_y
IMAGE_HW = TensorConfig("IMAGE_HW", "TYPE_INT32", (2,))  # the original image's height, width
# A detector ensemble's outputs, one image per request: K boxes (x1, y1, x2, y2 in the original
# image's pixels), their scores and classes.
DETECTIONS = (TensorConfig("boxes", "TYPE_FP32", (-1, 4)), TensorConfig("scores", "TYPE_FP32", (-1,)),
              TensorConfig("classes", "TYPE_INT64", (-1,)))


def preprocess_config(name: str, image_input: str, model_input: TensorSpec, max_batch_size: int,
                      options: ModelOptions | None = None, *, geometry: bool = False) -> ModelConfig:
    """Config of the Python preprocessing model: encoded image bytes -> ``model_input``; with
    ``geometry`` (a letterboxing spec feeding a detector's postprocessing) also :data:`LETTERBOX`
    and :data:`IMAGE_HW` per image."""
    options = options or ModelOptions()
    batching = max_batch_size > 0
    params = {"preprocess_file": "preprocess.json"}
    if options.execution_env:
        params["EXECUTION_ENV_PATH"] = execution_env_value(options.execution_env)
    return ModelConfig(
        name=name,
        kind="python_preprocess",
        max_batch_size=max_batch_size,
        inputs=(TensorConfig(image_input, "TYPE_STRING", (1,)),),
        outputs=(_tensor_config(model_input, batching),) + ((LETTERBOX, IMAGE_HW) if geometry else ()),
        dynamic_batching=(DynamicBatching((max_batch_size,), options.max_queue_delay_us)
                          if options.dynamic_batching and max_batch_size > 1 else None),
        instance_groups=(InstanceGroup("KIND_CPU", options.instance_count),),
        parameters=tuple(sorted(params.items())),
    )


@dataclass(frozen=True)
class NmsSettings:
    """What a detector's served postprocessing keeps: boxes scoring above ``conf``, class-aware NMS
    at ``iou``, at most ``max_det`` per image (:func:`trtrepo.detect.postprocess`). The defaults
    are Ultralytics' predict settings for YOLOv8 and later (conf 0.25, IoU 0.7, 300 boxes), what
    a served detector returns; ``trtrepo.detect.postprocess``'s own IoU default is YOLOv5's 0.45."""

    conf: float = 0.25
    iou: float = 0.7
    max_det: int = 300

    def __post_init__(self) -> None:
        for what, value, concept in (("conf", self.conf, "the confidence threshold"), ("iou", self.iou, "the NMS IoU threshold")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise OptionError(what, f"{value!r}: expected a number in [0, 1]", concept=concept)
        if isinstance(self.max_det, bool) or not isinstance(self.max_det, int) or self.max_det < 1:
            raise OptionError("max_det", f"{self.max_det!r}: expected a whole number >= 1", concept="the detections per image")


def postprocess_config(name: str, raw: TensorConfig, layout: YoloLayout, nms: NmsSettings | None = None,
                       options: ModelOptions | None = None) -> ModelConfig:
    """Config of the Python detector postprocessing model (``templates/postprocess_model.py``):
    one image's raw head output ``raw`` (its dims as one request carries it: ``[1, C, A]``),
    :data:`LETTERBOX` and :data:`IMAGE_HW` in, :data:`DETECTIONS` out. ``max_batch_size`` 0: the
    box count differs per image, so a request is one image. The NMS settings and ``layout`` are
    config parameters, read by the model once."""
    options = options or ModelOptions()
    nms = nms or NmsSettings()
    params = {"conf": repr(float(nms.conf)), "iou": repr(float(nms.iou)), "max_det": str(nms.max_det), "kind": layout.kind,
              "num_classes": str(layout.num_classes), "num_masks": str(layout.num_masks),
              "channels_last": "true" if layout.channels_last else "false"}
    if options.execution_env:
        params["EXECUTION_ENV_PATH"] = execution_env_value(options.execution_env)
    return ModelConfig(
        name=name,
        kind="python_postprocess",
        max_batch_size=0,
        inputs=(raw, LETTERBOX, IMAGE_HW),
        outputs=DETECTIONS,
        instance_groups=(InstanceGroup("KIND_CPU", options.instance_count),),
        parameters=tuple(sorted(params.items())),
    )


def ensemble_config(name: str, image_input: str, preprocess: ModelConfig, model: ModelConfig) -> ModelConfig:
    """Ensemble ``image bytes -> preprocess -> model``; outputs are the model's outputs."""
    if len(model.inputs) != 1:
        raise UsageError(f"ensemble '{name}': the model '{model.name}' has {len(model.inputs)} inputs; an image ensemble needs exactly one")
    tensor = model.inputs[0].name
    steps = (
        EnsembleStep(preprocess.name, ((image_input, image_input),), ((preprocess.outputs[0].name, tensor),)),
        EnsembleStep(model.name, ((tensor, tensor),), tuple((o.name, o.name) for o in model.outputs)),
    )
    return ModelConfig(
        name=name,
        kind="ensemble",
        max_batch_size=model.max_batch_size,
        inputs=(TensorConfig(image_input, "TYPE_STRING", (1,)),),
        outputs=tuple(TensorConfig(o.name, o.data_type, o.dims, o.reshape) for o in model.outputs),
        ensemble_steps=steps,
    )


def detector_ensemble_config(name: str, image_input: str, preprocess: ModelConfig, model: ModelConfig,
                             postprocess: ModelConfig) -> ModelConfig:
    """Ensemble ``image bytes -> preprocess -> model -> postprocess``: one image per request
    (``max_batch_size`` 0); out come the postprocessing's detections. The model's input is the
    preprocessing's first output, the postprocessing's first input the model's output of that
    name; :data:`LETTERBOX` and :data:`IMAGE_HW` go from the preprocessing to the postprocessing."""
    if len(model.inputs) != 1:
        raise UsageError(f"ensemble '{name}': the model '{model.name}' has {len(model.inputs)} inputs; an image ensemble needs exactly one")
    tensor = model.inputs[0].name
    raw = postprocess.inputs[0].name
    if raw not in {o.name for o in model.outputs}:
        raise UsageError(f"ensemble '{name}': the model '{model.name}' has no output '{raw}'")
    geometry = ((LETTERBOX.name, LETTERBOX.name), (IMAGE_HW.name, IMAGE_HW.name))
    steps = (
        EnsembleStep(preprocess.name, ((image_input, image_input),), ((preprocess.outputs[0].name, tensor),) + geometry),
        EnsembleStep(model.name, ((tensor, tensor),), ((raw, raw),)),
        EnsembleStep(postprocess.name, ((raw, raw),) + geometry, tuple((o.name, o.name) for o in postprocess.outputs)),
    )
    return ModelConfig(
        name=name,
        kind="ensemble",
        max_batch_size=0,
        inputs=(TensorConfig(image_input, "TYPE_STRING", (1,)),),
        outputs=tuple(TensorConfig(o.name, o.data_type, o.dims, o.reshape) for o in postprocess.outputs),
        ensemble_steps=steps,
    )


# --------------------------------------------------------------------------------------------
# Rendering


