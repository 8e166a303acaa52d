"""Triton model configuration: value objects, rendering through jinja2 templates, validation.

Python decides every value (:func:`config_from_io` turns a :class:`~trtrepo.modelio.ModelIO`
plus :class:`ModelOptions` into a :class:`ModelConfig`); the templates in the top-level
``templates/`` folder (package ``trtrepo.templates``) hold only the layout. Every rendered
text goes through :func:`validate_config_text` before anything is written: it is parsed with
protobuf ``text_format`` into Triton's own ``ModelConfig`` message (the schema check: unknown
fields and wrong types fail) and then checked the way Triton checks a config at load time
(:func:`check_config`). Every error is a one-line :class:`~trtrepo.errors.UsageError` that
names the model and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contracts.backends import BACKENDS, BackendSpec
from .contracts.plan import PlanMetadata
from .contracts.profile import DEFAULT_MAX_BATCH
from .errors import UsageError, one_line
from .modelio import ModelIO, TensorSpec

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
        raise UsageError(f"--version-policy {text!r}: expected latest, latest:N, all or specific:V1,V2")


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
            raise UsageError(f"--max-batch-size {self.max_batch_size}: must be >= 0")
        if self.max_queue_delay_us < 0:
            raise UsageError(f"--max-queue-delay {self.max_queue_delay_us}: must be >= 0 microseconds")
        if not 1 <= self.instance_count <= MAX_INSTANCE_COUNT:
            raise UsageError(f"--instance-count {self.instance_count}: expected 1..{MAX_INSTANCE_COUNT} per group "
                             f"(each instance holds its own copy of the model)")
        kind = self.instance_kind.upper()
        if kind != "AUTO" and f"KIND_{kind.removeprefix('KIND_')}" not in INSTANCE_KINDS:
            raise UsageError(f"--instance-kind {self.instance_kind!r}: one of auto, gpu, cpu, model")
        if any(g < 0 for g in self.gpus):
            raise UsageError(f"--gpus {list(self.gpus)}: GPU ids must be >= 0")
        if any(b < 1 for b in self.preferred_batch_sizes):
            raise UsageError(f"--preferred-batch-size {list(self.preferred_batch_sizes)}: sizes must be >= 1")
        if (self.intra_op_threads is not None and self.intra_op_threads < 0) or self.inter_op_threads < 0:
            raise UsageError("--intra-op-threads/--inter-op-threads must be >= 0 (0: ONNX Runtime's default)")
        for key, _ in self.parameters:
            if not key:
                raise UsageError("--parameter: the key must not be empty (KEY=VALUE)")
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
    batching = io.has_batch_axis
    engine_max = plan.triton_max_batch(options.profiles) if spec.engine and plan is not None else None
    if not batching:
        if options.max_batch_size:
            raise UsageError(
                f"model '{name}': --max-batch-size {options.max_batch_size} but the model has no dynamic batch axis "
                f"(axis 0 of every input and output); use --max-batch-size 0"
            )
        mbs = 0
    elif options.max_batch_size is not None:
        mbs = options.max_batch_size
    else:
        mbs = engine_max if engine_max is not None else DEFAULT_MAX_BATCH
    batching = mbs > 0

    label_output = options.label_output
    if options.has_labels and label_output is None:
        # one value per class: judged per sample when axis 0 is a batch axis, even one that
        # --max-batch-size 0 leaves to the model (dims [-1, classes])
        cands = [t for t in io.outputs if len(t.sample_shape if io.has_batch_axis else t.shape) == 1]
        if len(cands) != 1:
            raise UsageError(f"model '{name}': cannot tell which output the labels belong to; give --label-output")
        label_output = cands[0].name
    if label_output is not None:
        io.output(label_output)  # names the output when missing

    inputs = tuple(_tensor_config(t, batching) for t in io.inputs)
    outputs = tuple(
        _tensor_config(t, batching, options.label_filename if options.has_labels and t.name == label_output else None)
        for t in io.outputs
    )
    dyn = None
    if options.dynamic_batching and mbs > 1:
        # Triton fills an empty preferred_batch_size with max_batch_size at load time: say so explicitly.
        preferred = tuple(options.preferred_batch_sizes) or (mbs,)
        dyn = DynamicBatching(preferred, options.max_queue_delay_us, options.preserve_ordering)
    elif options.preferred_batch_sizes and mbs <= 1:
        raise UsageError(f"model '{name}': --preferred-batch-size needs --max-batch-size > 1 (it is {mbs})")
    groups = (InstanceGroup(_instance_kind(options, kind), options.instance_count, tuple(options.gpus), tuple(options.profiles)),)

    warmup: tuple[Warmup, ...] = ()
    if options.warmup:
        winputs = tuple(
            WarmupInput(t.name, t.triton_dtype, tuple(1 if d == -1 else d for d in c.dims), "random" if options.warmup_random else "zero")
            for t, c in zip(io.inputs, inputs, strict=True)
        )
        warmup = (Warmup("warmup", max(1, mbs), 1, winputs),)

    params = dict(options.parameters)
    for key, value in spec.parameters(options).items():
        params.setdefault(key, value)
    if spec.runs_python and options.execution_env:
        params.setdefault("EXECUTION_ENV_PATH", execution_env_value(options.execution_env))
    cuda = CudaOptimization(graphs=True) if options.cuda_graphs else None
    if options.cuda_graphs and not spec.engine:
        raise UsageError(f"model '{name}': --cuda-graphs applies to the tensorrt backend only (backend is {kind})")
    if options.cc_model_filenames and not spec.engine:
        raise UsageError(f"model '{name}': cc_model_filenames applies to TensorRT plans only")
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
        parameters=tuple(sorted(params.items())),
        cc_model_filenames=tuple(options.cc_model_filenames),
    )


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


def preprocess_config(name: str, image_input: str, model_input: TensorSpec, max_batch_size: int,
                      options: ModelOptions | None = None) -> ModelConfig:
    """Config of the Python preprocessing model: encoded image bytes -> ``model_input``."""
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
        outputs=(_tensor_config(model_input, batching),),
        dynamic_batching=(DynamicBatching((max_batch_size,), options.max_queue_delay_us)
                          if options.dynamic_batching and max_batch_size > 1 else None),
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


# --------------------------------------------------------------------------------------------
# Rendering


def pbstr(value: Any) -> str:
    """Quote a string for protobuf text format (C escapes; non-ASCII as octal UTF-8 bytes)."""
    out = ['"']
    for b in str(value).encode("utf-8"):
        ch = chr(b)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif 32 <= b < 127:
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def _pbbool(value: Any) -> str:
    return "true" if value else "false"


def template_environment(template_dir: str | Path | None = None) -> Any:
    """jinja2 environment with StrictUndefined; ``template_dir`` files override the shipped ones by name."""
    import jinja2

    from . import __version__

    loaders: list[Any] = []
    if template_dir is not None:
        d = Path(template_dir)
        if not d.is_dir():
            raise UsageError(f"--template-dir {d}: not a directory")
        loaders.append(_contained_loader(d))
    loaders.append(jinja2.FileSystemLoader(str(shipped_templates_dir())))
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Sandboxed: a --template-dir template can only read the config it is given (no attribute
    # walks to os/subprocess, no mutation); Python decides every value.
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pbstr"] = pbstr
    env.filters["pbbool"] = _pbbool
    env.globals["trtrepo_version"] = __version__
    return env


def _contained(folder: Path, name: str) -> Path | None:
    """``folder/name`` if it is a file inside ``folder`` reached without a symlink; None if absent.
    A symlink (or a ``..`` path) would let a template directory read any file of the host into a
    config or a model folder: refused."""
    p = folder / name
    if not p.exists() and not p.is_symlink():
        return None
    parts = Path(name).parts
    if ".." in parts or Path(name).is_absolute() or any((folder.joinpath(*parts[:i + 1])).is_symlink()
                                                        for i in range(len(parts))):
        raise UsageError(f"--template-dir {folder}: {name} is a symlink or leaves the folder; templates are read "
                         f"only from files inside it")
    return p if p.is_file() else None


def _contained_loader(folder: Path) -> Any:
    """jinja2 loader of a ``--template-dir``: files inside the folder only (see :func:`_contained`)."""
    import jinja2

    class ContainedLoader(jinja2.BaseLoader):
        def get_source(self, environment: Any, template: str) -> tuple[str, str, Any]:
            p = _contained(folder, template)
            if p is None:
                raise jinja2.TemplateNotFound(template)
            mtime = p.stat().st_mtime
            return p.read_text(), str(p), lambda: p.exists() and p.stat().st_mtime == mtime

    return ContainedLoader()


def shipped_templates_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("trtrepo.templates")))


def template_file(name: str, template_dir: str | Path | None = None) -> Path:
    """A non-jinja template file (the Python models), user's copy first."""
    if template_dir is not None:
        mine = _contained(Path(template_dir), name)
        if mine is not None:
            return mine
    p = shipped_templates_dir() / name
    if not p.is_file():
        raise UsageError(f"template file {name} not found in {shipped_templates_dir()}")
    return p


def render_config(config: ModelConfig, template_dir: str | Path | None = None) -> str:
    import jinja2

    env = template_environment(template_dir)
    try:
        text: str = env.get_template(config.template).render(m=config)
    except jinja2.exceptions.SecurityError as exc:
        raise UsageError(f"template {config.template}: refused by the sandbox ({one_line(exc)}); templates only "
                         f"lay out the values trtrepo gives them") from exc
    except jinja2.TemplateError as exc:
        where = getattr(exc, "filename", None) or config.template
        line = getattr(exc, "lineno", None)
        loc = f"{where}:{line}" if line else where
        raise UsageError(f"template {loc}: {type(exc).__name__}: {one_line(exc)}") from exc
    except Exception as exc:  # an expression of the template failed (TypeError, ZeroDivisionError, ...)
        raise UsageError(f"template {config.template}: {type(exc).__name__}: {one_line(exc)}") from exc
    return text.rstrip() + "\n"


# --------------------------------------------------------------------------------------------
# Validation


def parse_config_text(text: str, where: str) -> Any:
    """Parse pbtxt into ``tritonclient.grpc.model_config_pb2.ModelConfig`` (the schema check)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    msg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        raise UsageError(f"{where}: not a valid Triton ModelConfig: {exc}") from exc
    return msg


def _dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return str(model_config_pb2.DataType.Name(value))


def check_config(
    msg: Any,
    where: str,
    *,
    io: ModelIO | None = None,
    plan: PlanMetadata | None = None,
    model_dir_name: str | None = None,
    known_models: Mapping[str, Any] | None = None,
    model_files: Sequence[str] | None = None,
) -> None:
    """Semantic checks Triton applies at load time, on a parsed ModelConfig message.

    ``io``: the model file's IO (names, dtypes, shapes must match); ``plan``: the engine's
    metadata (its optimization profiles); ``known_models``: name -> parsed config of models an ensemble may use;
    ``model_files``: files in the model folder (for label_filename).
    """
    from tritonclient.grpc import model_config_pb2 as pb

    def fail(field_name: str, message: str) -> None:
        raise UsageError(f"{where}: {field_name}: {message}")

    if not msg.name:
        fail("name", "must be set")
    check_model_name(msg.name, f"{where}: name")
    if model_dir_name is not None and msg.name != model_dir_name:
        fail("name", f"'{msg.name}' differs from the model folder name '{model_dir_name}'")
    platform, backend = msg.platform, msg.backend
    known_platforms = {s.platform for s in BACKENDS.values() if s.platform} | {
        "pytorch_libtorch", "tensorflow_savedmodel", "tensorflow_graphdef"}
    if not platform and not backend:
        fail("platform", "one of platform or backend must be set")
    if platform and platform not in known_platforms:
        fail("platform", f"unknown platform '{platform}'")
    is_plan = platform == "tensorrt_plan" or backend == "tensorrt"
    is_ensemble = platform == "ensemble"
    mbs = msg.max_batch_size
    if mbs < 0:
        fail("max_batch_size", f"{mbs} must be >= 0")

    for section, tensors in (("input", msg.input), ("output", msg.output)):
        if not tensors:
            fail(section, "at least one is required")
        seen: set[str] = set()
        for i, t in enumerate(tensors):
            f = f"{section}[{i}]"
            if not t.name:
                fail(f"{f}.name", "must be set")
            if t.name in seen:
                fail(f"{f}.name", f"'{t.name}' is not unique among the {section}s")
            seen.add(t.name)
            if t.data_type == pb.TYPE_INVALID:
                fail(f"{f}.data_type", f"'{t.name}' must be set")
            if not t.dims:
                fail(f"{f}.dims", f"'{t.name}' must not be empty (use dims [1] with reshape {{ shape: [] }} for a scalar)")
            for d in t.dims:
                if d == 0 or d < -1:
                    fail(f"{f}.dims", f"'{t.name}' has invalid dimension {d} in {list(t.dims)}")
            if t.HasField("reshape"):
                known = [d for d in t.dims if d != -1]
                rknown = [d for d in t.reshape.shape if d != -1]
                if -1 not in t.dims and -1 not in t.reshape.shape:
                    n1 = 1
                    for d in known:
                        n1 *= d
                    n2 = 1
                    for d in rknown:
                        n2 *= d
                    if n1 != n2:
                        fail(f"{f}.reshape", f"'{t.name}': {list(t.reshape.shape)} has another element count than dims {list(t.dims)}")
            if section == "input" and getattr(t, "label_filename", None):
                fail(f"{f}.label_filename", "only outputs take a label file")
            if section == "output" and t.label_filename:
                if model_files is not None and t.label_filename not in model_files:
                    fail(f"{f}.label_filename", f"'{t.label_filename}' is not in the model folder")

    if msg.HasField("dynamic_batching"):
        if mbs == 0:
            fail("dynamic_batching", "needs max_batch_size > 0")
        for b in msg.dynamic_batching.preferred_batch_size:
            if b < 1 or b > mbs:
                fail("dynamic_batching.preferred_batch_size", f"{b} must be in 1..max_batch_size ({mbs})")
    for i, g in enumerate(msg.instance_group):
        f = f"instance_group[{i}]"
        if is_ensemble:
            fail(f, "an ensemble takes no instance_group")
        if g.count < 0:
            fail(f"{f}.count", f"{g.count} must be >= 1")
        if g.gpus and g.kind not in (pb.ModelInstanceGroup.KIND_GPU, pb.ModelInstanceGroup.KIND_AUTO):
            fail(f"{f}.gpus", f"GPU ids need kind KIND_GPU (kind is {pb.ModelInstanceGroup.Kind.Name(g.kind)})")
        if is_plan and g.kind in (pb.ModelInstanceGroup.KIND_CPU, pb.ModelInstanceGroup.KIND_MODEL):
            fail(f"{f}.kind", f"TensorRT plans run on GPUs only; {pb.ModelInstanceGroup.Kind.Name(g.kind)} does not load (server#4696)")
        if g.profile and not is_plan:
            fail(f"{f}.profile", "optimization profiles apply to TensorRT plans only")
    if msg.HasField("optimization") and msg.optimization.HasField("cuda") and not is_plan:
        cuda = msg.optimization.cuda
        if cuda.graphs or cuda.graph_spec:
            fail("optimization.cuda.graphs", "CUDA graphs are recognised by the TensorRT backend only")
    if msg.cc_model_filenames and not is_plan:
        fail("cc_model_filenames", "applies to TensorRT plans only")
    for key in msg.cc_model_filenames:
        if not re.fullmatch(r"\d+\.\d+", key):
            fail("cc_model_filenames", f"key '{key}' is not a compute capability like '8.0'")

    inputs = {t.name: t for t in msg.input}
    for i, w in enumerate(msg.model_warmup):
        f = f"model_warmup[{i}]"
        if w.batch_size < 1 or w.batch_size > max(1, mbs):
            fail(f"{f}.batch_size", f"{w.batch_size} must be in 1..{max(1, mbs)}")
        for key, value in w.inputs.items():
            if key not in inputs:
                fail(f"{f}.inputs", f"'{key}' is not an input of the model")
            if value.data_type != inputs[key].data_type:
                fail(f"{f}.inputs[{key}].data_type", f"{_dtype_name(value.data_type)} differs from the input's {_dtype_name(inputs[key].data_type)}")
            if any(d < 1 for d in value.dims):
                fail(f"{f}.inputs[{key}].dims", f"{list(value.dims)} must be concrete (no -1)")
        missing = [n for n in inputs if n not in w.inputs]
        if missing:
            fail(f"{f}.inputs", f"missing input(s) {', '.join(missing)}")

    if msg.version_policy.HasField("specific") and not msg.version_policy.specific.versions:
        fail("version_policy.specific.versions", "must list at least one version")
    if msg.version_policy.HasField("latest") and msg.version_policy.latest.num_versions < 1:
        fail("version_policy.latest.num_versions", "must be >= 1")

    if is_ensemble:
        _check_ensemble(msg, fail, known_models)
    elif msg.HasField("ensemble_scheduling"):
        fail("ensemble_scheduling", f"only platform 'ensemble' takes ensemble_scheduling (platform is '{platform or backend}')")
    if io is not None:
        _check_against_io(msg, io, fail)
    if is_plan and plan is not None and plan.profiles:
        _check_profiles(msg, plan, fail)


def _check_against_io(msg: Any, io: ModelIO, fail: Any) -> None:
    mbs = msg.max_batch_size
    if mbs > 0 and not io.has_batch_axis:
        fail("max_batch_size", f"{mbs} but the model file has no dynamic batch axis (axis 0 of every tensor); use 0")
    for section, tensors, specs in (("input", msg.input, io.inputs), ("output", msg.output, io.outputs)):
        by_name = {t.name: t for t in specs}
        names = [t.name for t in tensors]
        missing = [n for n in by_name if n not in names]
        extra = [n for n in names if n not in by_name]
        if missing or extra:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"not in the model file: {', '.join(extra)}"] if extra else [])
            fail(section, f"names do not match the model file's {section}s ({'; '.join(parts)})")
        for i, t in enumerate(tensors):
            spec = by_name[t.name]
            f = f"{section}[{i}]"
            if _dtype_name(t.data_type) != spec.triton_dtype:
                fail(f"{f}.data_type", f"'{t.name}' is {_dtype_name(t.data_type)} but the model file has {spec.triton_dtype}")
            expected = spec.sample_shape if mbs > 0 else spec.shape
            dims = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
            if len(dims) != len(expected):
                hint = " (dims must omit the batch axis when max_batch_size > 0)" if mbs > 0 and len(dims) == len(spec.shape) else ""
                fail(f"{f}.dims", f"'{t.name}' {list(t.dims)} has rank {len(dims)} but the model expects {list(expected)}{hint}")
            for d, e in zip(dims, expected, strict=True):
                if e != -1 and d != e:
                    fail(f"{f}.dims", f"'{t.name}' {list(t.dims)} does not match the model's {list(expected)}")


def _check_profiles(msg: Any, plan: PlanMetadata, fail: Any) -> None:
    selected: list[str] = []
    for g in msg.instance_group:
        selected.extend(g.profile)
    engine_max = plan.triton_max_batch(selected)
    mbs = msg.max_batch_size
    if engine_max is not None and mbs > engine_max:
        fail("max_batch_size", f"configuration specified max-batch {mbs} but TensorRT engine only supports max-batch {engine_max} "
             f"(the optimization profiles' largest batch)")
    inputs = {t.name: t for t in msg.input}
    for pname in selected or ["0"]:
        for tname, rng in plan.profile_named(pname).items():
            if tname not in inputs:
                continue
            t = inputs[tname]
            lo, hi = list(rng.min), list(rng.max)
            if not lo or not hi:
                continue
            full = ([-1] if mbs > 0 else []) + list(t.dims)
            if len(full) != len(hi):
                fail(f"input '{tname}'.dims", f"rank {len(full)} (with batch) differs from profile {pname}'s rank {len(hi)}")
            for axis, (d, a, b) in enumerate(zip(full, lo, hi, strict=True)):
                if d != -1 and not a <= d <= b:
                    fail(f"input '{tname}'.dims", f"axis {axis} = {d} is outside profile {pname}'s range [{a}, {b}]")


def _check_ensemble(msg: Any, fail: Any, known_models: Mapping[str, Any] | None) -> None:
    steps = msg.ensemble_scheduling.step
    if not steps:
        fail("ensemble_scheduling.step", "an ensemble needs at least one step")
    available = {t.name for t in msg.input}
    produced: set[str] = set()
    for i, s in enumerate(steps):
        f = f"ensemble_scheduling.step[{i}]"
        if not s.model_name:
            fail(f"{f}.model_name", "must be set")
        if s.model_name == msg.name:
            fail(f"{f}.model_name", "an ensemble cannot call itself")
        sub = known_models.get(s.model_name) if known_models is not None else None
        if known_models is not None and sub is None:
            fail(f"{f}.model_name", f"model '{s.model_name}' is not in the repository")
        for key, value in s.input_map.items():
            if value not in available:
                fail(f"{f}.input_map", f"'{value}' is neither an ensemble input nor produced by an earlier step")
            if sub is not None and key not in {t.name for t in sub.input}:
                fail(f"{f}.input_map", f"model '{s.model_name}' has no input '{key}'")
        for key, value in s.output_map.items():
            if value in produced or value in {t.name for t in msg.input}:
                fail(f"{f}.output_map", f"tensor '{value}' is produced twice")
            if sub is not None and key not in {t.name for t in sub.output}:
                fail(f"{f}.output_map", f"model '{s.model_name}' has no output '{key}'")
            produced.add(value)
            available.add(value)
    for i, t in enumerate(msg.output):
        if t.name not in produced:
            fail(f"output[{i}]", f"'{t.name}' is not produced by any step")


def check_rendered(msg: Any, config: ModelConfig, where: str, template_dir: str | Path | None = None) -> None:
    """The parsed config says what Python decided: name, platform/backend, max_batch_size, and
    each input and output (name, data type, dims) in order; and, where a ``template_dir``
    template rendered it, every other field too (instance groups, dynamic batching, parameters,
    cache, warmup, ...: the parsed config must equal the shipped template's). A template that
    drops escaping or adds fields can otherwise change the served contract unnoticed."""
    from tritonclient.grpc import model_config_pb2

    def tensors(ts: Any) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, model_config_pb2.DataType.Name(t.data_type), tuple(int(d) for d in t.dims)) for t in ts]

    want = {"name": config.name, "platform": config.platform or "", "backend": config.backend or "",
            "max_batch_size": config.max_batch_size,
            "input": [(t.name, t.data_type, tuple(t.dims)) for t in config.inputs],
            "output": [(t.name, t.data_type, tuple(t.dims)) for t in config.outputs]}
    got = {"name": msg.name, "platform": msg.platform, "backend": msg.backend, "max_batch_size": int(msg.max_batch_size),
           "input": tensors(msg.input), "output": tensors(msg.output)}
    for key, value in want.items():
        if got[key] != value:
            raise UsageError(f"{where}: the rendered template changed '{key}' to {got[key]!r} (trtrepo decided "
                             f"{value!r}); check the --template-dir template")
    if (template_dir is not None and (Path(template_dir) / config.template).exists()
            and (shipped_templates_dir() / config.template).is_file()):
        # a user template lays out; it decides nothing: every field equals the shipped template's (a
        # template of a backend registered outside trtrepo has no shipped one: the checks above hold)
        reference = config_to_dict(parse_config_text(render_config(config), where))
        diff = _first_difference(config_to_dict(msg), reference)
        if diff is not None:
            path, value, decided = diff
            raise UsageError(f"{where}: the --template-dir template {config.template} "
                             + (f"added '{path}' ({value!r})" if decided is None else
                                f"dropped '{path}' (trtrepo decided {decided!r})" if value is None else
                                f"changed '{path}' to {value!r} (trtrepo decided {decided!r})")
                             + "; templates lay out the values trtrepo decides (options set them)")


def _first_difference(got: Any, want: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first field where two config dicts differ: (dotted path, got, wanted); None for a
    field one side lacks."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            sub = f"{path}.{key}" if path else key
            if key not in want:
                return sub, got[key], None
            if key not in got:
                return sub, None, want[key]
            found = _first_difference(got[key], want[key], sub)
            if found is not None:
                return found
        return None
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            found = _first_difference(g, w, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    return None if got == want else (path, got, want)


def validate_config_text(text: str, where: str, **checks: Any) -> Any:
    """Schema check (protobuf) then semantic checks; returns the parsed message."""
    msg = parse_config_text(text, where)
    check_config(msg, where, **checks)
    return msg


def config_to_dict(msg: Any) -> dict[str, Any]:
    from google.protobuf import json_format

    return dict(json_format.MessageToDict(msg, preserving_proto_field_name=True))


__all__ = [
    "CudaOptimization", "DynamicBatching", "EnsembleStep", "InstanceGroup", "ModelConfig", "ModelOptions",
    "TensorConfig", "VersionPolicy", "Warmup", "WarmupInput", "check_config", "check_model_name", "config_from_io",
    "ensemble_config", "parse_config_text", "pbstr", "preprocess_config",
    "render_config", "template_environment", "validate_config_text",
]

