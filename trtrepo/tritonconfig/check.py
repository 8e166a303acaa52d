"""Validation of a rendered config: parsed into Triton's own ``ModelConfig`` protobuf (the schema
check) and checked the way Triton checks a config at load time; every error one line naming the
model and the field."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..contracts.backends import BACKENDS, for_config
from ..contracts.plan import PlanMetadata
from ..errors import OptionError, UsageError
from ..modelio import ModelIO
from .model import ModelConfig, check_model_name
from .render import render_config, shipped_templates_dir


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
    ``model_files``: files in the model folder (for label_filename). The first failing check
    raises, in the order: identity, tensors, scheduling, warm-up and version policy, ensemble,
    model IO, profiles.
    """

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
    spec = for_config(platform, backend)
    is_plan = spec is not None and spec.engine  # a TensorRT plan, by platform or by backend name
    is_ensemble = platform == "ensemble"
    if msg.max_batch_size < 0:
        fail("max_batch_size", f"{msg.max_batch_size} must be >= 0")
    _check_tensors(msg, fail, model_files)
    _check_scheduling(msg, fail, is_plan, is_ensemble)
    _check_warmup_and_versions(msg, fail)
    if is_ensemble:
        _check_ensemble(msg, fail, known_models)
    elif msg.HasField("ensemble_scheduling"):
        fail("ensemble_scheduling", f"only platform 'ensemble' takes ensemble_scheduling (platform is '{platform or backend}')")
    if io is not None:
        _check_against_io(msg, io, fail)
    if is_plan and plan is not None and plan.profiles:
        _check_profiles(msg, plan, fail)


def _check_tensors(msg: Any, fail: Any, model_files: Sequence[str] | None) -> None:
    """Inputs and outputs: names unique, data types set, dims valid, reshapes of the same size,
    label files on outputs only and present in the model folder."""
    from tritonclient.grpc import model_config_pb2 as pb

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
            _check_dims(t, f, fail)
            if section == "input" and getattr(t, "label_filename", None):
                fail(f"{f}.label_filename", "only outputs take a label file")
            if section == "output" and t.label_filename:
                if model_files is not None and t.label_filename not in model_files:
                    fail(f"{f}.label_filename", f"'{t.label_filename}' is not in the model folder")


def _check_dims(t: Any, f: str, fail: Any) -> None:
    """Dims not empty, each positive or -1; a reshape of the same element count (checked when
    neither side has a -1)."""
    if not t.dims:
        fail(f"{f}.dims", f"'{t.name}' must not be empty (use dims [1] with reshape {{ shape: [] }} for a scalar)")
    for d in t.dims:
        if d == 0 or d < -1:
            fail(f"{f}.dims", f"'{t.name}' has invalid dimension {d} in {list(t.dims)}")
    if not t.HasField("reshape") or -1 in t.dims or -1 in t.reshape.shape:
        return
    n1 = 1
    for d in t.dims:
        n1 *= d
    n2 = 1
    for d in t.reshape.shape:
        n2 *= d
    if n1 != n2:
        fail(f"{f}.reshape", f"'{t.name}': {list(t.reshape.shape)} has another element count than dims {list(t.dims)}")


def _check_scheduling(msg: Any, fail: Any, is_plan: bool, is_ensemble: bool) -> None:
    """Dynamic batching, instance groups, CUDA optimization and compute-capability files."""
    mbs = msg.max_batch_size
    if msg.HasField("dynamic_batching"):
        if mbs == 0:
            fail("dynamic_batching", "needs max_batch_size > 0")
        for b in msg.dynamic_batching.preferred_batch_size:
            if b < 1 or b > mbs:
                fail("dynamic_batching.preferred_batch_size", f"{b} must be in 1..max_batch_size ({mbs})")
    for i, g in enumerate(msg.instance_group):
        _check_instance_group(g, f"instance_group[{i}]", fail, is_plan, is_ensemble)
    if msg.HasField("optimization") and msg.optimization.HasField("cuda") and not is_plan:
        cuda = msg.optimization.cuda
        if cuda.graphs or cuda.graph_spec:
            fail("optimization.cuda.graphs", "CUDA graphs are recognised by the TensorRT backend only")
    if msg.cc_model_filenames and not is_plan:
        fail("cc_model_filenames", "applies to TensorRT plans only")
    for key in msg.cc_model_filenames:
        if not re.fullmatch(r"\d+\.\d+", key):
            fail("cc_model_filenames", f"key '{key}' is not a compute capability like '8.0'")


def _check_instance_group(g: Any, f: str, fail: Any, is_plan: bool, is_ensemble: bool) -> None:
    """One instance group: none in an ensemble, a count, GPU ids only on GPU kinds; a plan runs on
    GPUs only (server#4696), and only a plan selects optimization profiles."""
    from tritonclient.grpc import model_config_pb2 as pb

    kinds = pb.ModelInstanceGroup
    if is_ensemble:
        fail(f, "an ensemble takes no instance_group")
    if g.count < 0:
        fail(f"{f}.count", f"{g.count} must be >= 1")
    if g.gpus and g.kind not in (kinds.KIND_GPU, kinds.KIND_AUTO):
        fail(f"{f}.gpus", f"GPU ids need kind KIND_GPU (kind is {kinds.Kind.Name(g.kind)})")
    if is_plan and g.kind in (kinds.KIND_CPU, kinds.KIND_MODEL):
        fail(f"{f}.kind", f"TensorRT plans run on GPUs only; {kinds.Kind.Name(g.kind)} does not load (server#4696)")
    if g.profile and not is_plan:
        fail(f"{f}.profile", "optimization profiles apply to TensorRT plans only")


def _check_warmup_and_versions(msg: Any, fail: Any) -> None:
    """Warm-up samples (batch size, every input, concrete dims, data types) and the version policy."""
    mbs = msg.max_batch_size
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
            _check_tensor_against_spec(t, by_name[t.name], f"{section}[{i}]", mbs, fail)


def _check_tensor_against_spec(t: Any, spec: Any, f: str, mbs: int, fail: Any) -> None:
    """One config tensor against the model file's: its data type, and its dims (the reshape when
    given) against the model's shape, without the batch axis when the config batches."""
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
        sub = _step_model(msg, s, f, fail, known_models)
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


def _step_model(msg: Any, s: Any, f: str, fail: Any, known_models: Mapping[str, Any] | None) -> Any:
    """The config of the model a step calls (None when the repository is not known): named, not
    the ensemble itself, and in the repository when that is known."""
    if not s.model_name:
        fail(f"{f}.model_name", "must be set")
    if s.model_name == msg.name:
        fail(f"{f}.model_name", "an ensemble cannot call itself")
    if known_models is None:
        return None
    sub = known_models.get(s.model_name)
    if sub is None:
        fail(f"{f}.model_name", f"model '{s.model_name}' is not in the repository")
    return sub


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
            raise OptionError("", f"{where}: the rendered template changed '{key}' to {got[key]!r} (trtrepo decided "
                                  f"{value!r}); check the template in {{template_dir}}",
                              others={"template_dir": "the template folder"})
    if template_dir is not None and _has_own_template(config):
        # a user template lays out; it decides nothing: every field equals what the shipped templates
        # render, whatever the folder holds (the backend's template, or only _macros.j2 that it
        # imports). A backend registered outside trtrepo whose template only the folder has leaves
        # nothing to compare with: the checks above hold.
        reference = config_to_dict(parse_config_text(render_config(config), where))
        diff = _first_difference(config_to_dict(msg), reference)
        if diff is not None:
            path, value, decided = diff
            raise OptionError("", f"{where}: {{template_dir}} {template_dir}: the rendered {config.template} "
                              + (f"added '{path}' ({value!r})" if decided is None else
                                 f"dropped '{path}' (trtrepo decided {decided!r})" if value is None else
                                 f"changed '{path}' to {value!r} (trtrepo decided {decided!r})")
                              + "; templates lay out the values trtrepo decides (options set them)",
                              others={"template_dir": "the template folder"})


def _has_own_template(config: ModelConfig) -> bool:
    """Whether ``config``'s template exists without a ``--template-dir`` (trtrepo's or the backend
    plug-in's own): what a user template is compared with."""
    folders = [d for d in (config.spec.template_dir, shipped_templates_dir()) if d is not None]
    return any((Path(d) / config.template).is_file() for d in folders)


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

