"""Stage 1: model sources -> ONNX.

A model source is a built-in model (``demo``), ``model.onnx`` (passed through after
``onnx.checker``), a TorchScript file, ``package.module:factory`` or a torchvision architecture:
the kinds are records of :mod:`trtrepo.modelsource`, which resolves and loads them.

:func:`export_onnx` exports with a dynamic batch axis (and any extra dynamic axes), writes the
sizes of the output axes that do not vary into the graph outputs (:func:`static_output_dims`),
checks the result with ``onnx.checker`` and compares ONNX Runtime's outputs with PyTorch's on a
sample batch of another batch size before the file is renamed into place.
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .contracts import builtin
from .errors import OptionError, TrtrepoError, UsageError, one_line
from .fsutil import atomic_path
from .modelio import ModelIO, external_data_path, load_onnx
from .modelsource import ModelSource, import_torch, load_torch_model, resolve_source
from .onnxgraph import make_session

log = logging.getLogger(__name__)

DEFAULT_OPSET = 17


# --------------------------------------------------------------------------------------------
# Sample inputs


@dataclass(frozen=True)
class InputShape:
    """An export input: name, per-sample shape (no batch axis) and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    given: str | None = None  # the --input-shape text it came from


# values in one sample of an --input-shape: 512 MiB as float32 (a 3x4096x4096 image is 50 M); the
# export feeds a few random samples of it to the model (MemoryError from numpy before)
MAX_INPUT_ELEMENTS = 1 << 27
_INPUT_SHAPE = "the input shape"  # the concept the input_shapes setting names (--input-shape)


def parse_input_shape(text: str) -> tuple[str | None, tuple[int, ...]]:
    """``3x224x224`` or ``NAME:3x224x224`` -> (name or None, shape)."""
    name, sep, dims = text.rpartition(":")
    if not sep:
        name, dims = "", text
    try:
        shape = tuple(int(d) for d in dims.lower().split("x") if d)
    except ValueError as exc:
        raise OptionError("input_shapes", f"'{text}': expected dims like 3x224x224 or NAME:3x224x224", concept=_INPUT_SHAPE) from exc
    if not shape or any(d <= 0 for d in shape):
        raise OptionError("input_shapes", f"'{text}': dims must be positive integers", concept=_INPUT_SHAPE)
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise OptionError("input_shapes", f"'{text}': {math.prod(shape)} values per sample; at most {MAX_INPUT_ELEMENTS} "
                          f"(the export runs the model on random samples of this shape)", concept=_INPUT_SHAPE)
    return (name or None), shape


def inputs_from_data(samples: Iterable[Any], limit: int = 64) -> tuple[list[InputShape], dict[str, dict[int, str]]]:
    """Export inputs read off calibration samples (``sample.inputs``: name -> one sample, no batch
    axis; an unnamed input is ``input``): names, the first sample's shape, dtypes; an axis whose
    size differs among the first ``limit`` samples becomes a dynamic axis (``{name}_dim{axis}``,
    shared by inputs whose sizes vary together, e.g. ``input_ids`` and ``attention_mask``)."""
    first: dict[str, np.ndarray] = {}
    sizes: dict[str, set[tuple[int, ...]]] = {}
    for i, sample in enumerate(samples):
        if i >= limit:
            break
        for name, value in sample.inputs.items():
            key = name if name is not None else "input"
            arr = np.asarray(value)
            first.setdefault(key, arr)
            sizes.setdefault(key, set()).add(tuple(arr.shape))
    if not first:
        raise UsageError("the data has no samples to read the input shapes from")
    inputs, axes = [], {}
    for name, arr in first.items():
        ranks = {len(s) for s in sizes[name]}
        if len(ranks) != 1:
            raise UsageError(f"input '{name}': samples of different ranks in the data ({sorted(ranks)})")
        varying = [a for a in range(arr.ndim) if len({s[a] for s in sizes[name]}) > 1]
        inputs.append(InputShape(name, tuple(int(d) for d in arr.shape), str(arr.dtype)))
        if varying:
            # axes are numbered with the batch axis (0) first
            axes[name] = {a + 1: f"dim{a + 1}" for a in varying}
    return inputs, axes


def resolve_inputs(source: ModelSource, input_shapes: Sequence[str] = (), data: Any = None
                   ) -> tuple[list[InputShape] | None, dict[str, dict[int, str]]]:
    """The export inputs of a PyTorch source: ``--input-shape`` when given (``3x224x224`` or
    ``NAME:3x224x224``, batch axis excluded, float32), else read off ``data`` (a DataSource,
    :func:`inputs_from_data`); None for sources that know their own (ONNX, built-in models)."""
    if source.kind == "onnx" or builtin.builtin(source.kind) is not None:
        if input_shapes:
            raise OptionError("input_shapes", f"does not apply to {source.describe()} (its inputs are known)", concept=_INPUT_SHAPE)
        return None, {}
    if input_shapes:
        parsed = [parse_input_shape(t) for t in input_shapes]
        return [InputShape(name or ("input" if len(parsed) == 1 else f"input{i}"), shape, given=text)
                for i, ((name, shape), text) in enumerate(zip(parsed, input_shapes, strict=True))], {}
    if data is not None:
        return inputs_from_data(data)
    return None, {}


def _random_batch(inputs: Sequence[InputShape], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in inputs:
        shape = (batch, *spec.shape)
        if np.issubdtype(np.dtype(spec.dtype), np.integer):
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(spec.dtype)
        else:
            feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feed


# --------------------------------------------------------------------------------------------
# Export


@dataclass(frozen=True)
class ExportCheck:
    """How :func:`export_onnx` verifies an export: ONNX Runtime against PyTorch on a random batch of
    ``batch`` samples (0: no check), failing when an output differs beyond ``atol + rtol*|ref|``."""

    batch: int = 3
    atol: float = 1e-4
    rtol: float = 1e-3


@dataclass
class ExportResult:
    path: Path
    io: ModelIO
    source: ModelSource
    max_abs_error: float | None = None
    checked_batch: int | None = None
    notes: list[str] = field(default_factory=list)


def _ort_run(path: Path | str, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return make_session(path).run(None, dict(feed))  # type: ignore[no-any-return]


def _torch_outputs(torch: Any, model: Any, feed: Mapping[str, np.ndarray], names: Sequence[str]) -> list[np.ndarray]:
    with torch.no_grad():
        out = model(*[torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names])
    if isinstance(out, Mapping):
        out = list(out.values())
    if not isinstance(out, (list, tuple)):
        out = [out]
    return [o.detach().cpu().numpy() for o in out]


def export_onnx(
    source: ModelSource | str,
    output: str | Path,
    *,
    weights: str | Path | None = None,
    inputs: Sequence[InputShape] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_axes: Mapping[str, Mapping[int, str]] | None = None,
    opset: int = DEFAULT_OPSET,
    check: ExportCheck = ExportCheck(),
    force: bool = True,
) -> ExportResult:
    """Export ``source`` to ``output`` (ONNX) and verify it against PyTorch.

    ``inputs`` gives names, per-sample shapes and dtypes (the demo models know their own).
    Axis 0 of every input and output is dynamic (``batch``); ``dynamic_axes`` adds more, as
    ``{tensor: {axis: name}}``. Every other output axis whose size does not change with them is
    written with its size (:func:`_write_static_output_dims`). The check (:class:`ExportCheck`)
    runs ONNX Runtime and PyTorch on a random batch of ``check.batch`` samples (another size than
    the export's, so the dynamic axis is exercised) and fails when the outputs differ beyond
    ``check.atol + check.rtol*|ref|``.
    """
    import onnx

    if isinstance(source, str):
        source = resolve_source(source, weights)
    output = Path(output)
    _check_opset(opset)

    if source.kind == "onnx":
        return _pass_through(source, output, force)

    torch = import_torch()
    model = load_torch_model(source)
    plugin = builtin.builtin(source.kind)
    inputs = _export_inputs(source, inputs, plugin)
    names = [i.name for i in inputs]
    notes: list[str] = []
    inputs, export_feed, ref_out = _reference_run(torch, model, inputs, names, source, notes)
    output_names = _output_names(output_names, plugin, len(ref_out))
    if plugin is not None and plugin.dynamic_axes:
        dynamic_axes = {**plugin.dynamic_axes, **(dynamic_axes or {})}
    axes = _export_axes([*names, *output_names], dynamic_axes)

    with atomic_path(output, force=force) as tmp:
        args = tuple(torch.from_numpy(export_feed[n]) for n in names)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter is deliberate
                torch.onnx.export(
                    model,
                    args,
                    str(tmp),
                    input_names=names,
                    output_names=output_names,
                    dynamic_axes=axes,
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
        except Exception as exc:
            raise TrtrepoError(f"{source.location}: ONNX export failed: {type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        exported = onnx.load(str(tmp))
        try:
            onnx.checker.check_model(exported, full_check=True)
        except Exception as exc:
            raise TrtrepoError(f"{output}: onnx.checker rejected the exported model: {str(exc).splitlines()[0]}") from exc
        exported = _write_static_output_dims(exported, tmp, export_feed, axes, notes)
        io = ModelIO.from_onnx(exported)
        io = ModelIO(io.inputs, io.outputs, source=str(output))
        max_err = _check_against_torch(torch, model, tmp, output, inputs, names, output_names, check)
    return ExportResult(output, io, source, max_abs_error=max_err, checked_batch=check.batch or None, notes=notes)


def _check_opset(opset: int) -> None:
    """Opset 13 or newer (per-channel Q/DQ), and one the installed onnx knows."""
    import onnx

    if opset < 13:
        raise OptionError("opset", f"{opset}: trtrepo needs opset 13 or newer (per-channel Q/DQ)")
    if opset > onnx.defs.onnx_opset_version():
        raise OptionError("opset", f"{opset}: the installed onnx {onnx.__version__} knows opsets up to "
                          f"{onnx.defs.onnx_opset_version()}")


def _export_inputs(source: ModelSource, inputs: Sequence[InputShape] | None, plugin: Any) -> list[InputShape]:
    """The inputs given, else a built-in model's own; none for another model is an error. Their
    names must be unique."""
    if inputs is None:
        if plugin is None:
            raise OptionError("", f"{source.location}: give the input shapes ({{input_shapes}}, e.g. 3x224x224, batch axis "
                              f"excluded) or calibration data ({{data_spec}}) to read them from",
                              others={"input_shapes": "input_shapes", "data_spec": "data"})
        inputs = plugin.inputs()
    out = list(inputs)
    names = [i.name for i in out]
    if len(set(names)) != len(names):
        raise UsageError(f"input names are not unique: {', '.join(names)}")
    return out


def _output_names(given: Sequence[str] | None, plugin: Any, count: int) -> list[str]:
    """The names given, else a built-in model's, else ``output`` (one output) or ``outputN``; as
    many as the model returns."""
    names = given if given is not None else (list(plugin.output_names) if plugin is not None else None)
    if names is None:
        names = ["output"] if count == 1 else [f"output{i}" for i in range(count)]
    out = list(names)
    if len(out) != count:
        raise OptionError("output_names", f"lists {len(out)} names but the model returns {count} outputs",
                          concept="the output name list")
    return out


def _export_axes(tensors: list[str], dynamic_axes: Mapping[str, Mapping[int, str]] | None) -> dict[str, dict[int, str]]:
    """Axis 0 of every tensor is ``batch``; ``dynamic_axes`` adds more, each naming an input or output."""
    axes: dict[str, dict[int, str]] = {n: {0: "batch"} for n in tensors}
    for tensor, extra in (dynamic_axes or {}).items():
        if tensor not in axes:
            raise OptionError("dynamic_axes", f": '{tensor}' is not an input or output name")
        axes[tensor].update({int(a): str(n) for a, n in extra.items()})
    return axes


def _pass_through(source: ModelSource, output: Path, force: bool) -> ExportResult:
    """An ONNX source: checked and copied to ``output`` (external data gathered into one file;
    otherwise the given bytes unchanged, so a Q/DQ model is deployed as given)."""
    import onnx

    # parsed once: the graph first, the weights of an external-data model added to it
    model = load_onnx(source.location, load_weights=False)
    external = any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    if external:
        folder = Path(source.location).parent
        for t in model.graph.initializer:  # the check repo add makes, before ONNX reads anything
            if onnx.external_data_helper.uses_external_data(t):
                location = next((e.value for e in t.external_data if e.key == "location"), "")
                external_data_path(folder, location, f"{source.location}: its")
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(Path(source.location).parent))
        except Exception as exc:  # a missing file, a location outside the folder (onnx's ValidationError)
            raise UsageError(f"{source.location}: its external data cannot be read: {one_line(exc)}") from exc
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        raise UsageError(f"{source.location}: onnx.checker rejected the model: {str(exc).splitlines()[0]}") from exc
    io = ModelIO.from_onnx(model, source=source.location)
    io = ModelIO(io.inputs, io.outputs, source=str(output))
    if Path(source.location).resolve() != output.resolve():
        with atomic_path(output, force=force) as tmp:
            if external:  # gathered into one file
                onnx.save(model, str(tmp))
            else:  # the given bytes, unchanged (a Q/DQ model is deployed as given)
                shutil.copyfile(source.location, tmp)
    return ExportResult(output, io, source, notes=["ONNX passed through after onnx.checker"])


def _reference_run(torch: Any, model: Any, inputs: list[InputShape], names: list[str], source: ModelSource,
                   notes: list[str]) -> tuple[list[InputShape], dict[str, np.ndarray], list[np.ndarray]]:
    """PyTorch's outputs on the export batch; trtexec-style shapes (batch included) are retried
    without their leading 1, with a note."""
    export_feed = _random_batch(inputs, 2, seed=0)
    try:
        ref_out = _torch_outputs(torch, model, export_feed, names)
    except Exception as exc:
        shapes = ", ".join(f"{i.name}:{'x'.join(map(str, i.shape))}" for i in inputs)
        retry = _without_batch(inputs)
        if retry is None:
            raise UsageError(f"{source.location}: the model does not run on inputs {shapes}: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
        try:  # trtexec-style shapes (batch included): the model runs once the leading 1 is dropped
            export_feed = _random_batch(retry, 2, seed=0)
            ref_out = _torch_outputs(torch, model, export_feed, names)
        except Exception:
            raise UsageError(f"{source.location}: the model does not run on inputs {shapes} (batch axis excluded), nor "
                             f"without their leading 1: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                             ) from exc
        fixed = ", ".join(f"{i.name}:{'x'.join(map(str, i.shape))}" for i in retry)
        notes.append(f"--input-shape {', '.join(str(i.given) for i in inputs)} includes the batch axis: --input-shape "
                     f"excludes it (build/deploy --shape include it, trtexec-style); exported with {fixed}")
        inputs = retry
    return inputs, export_feed, ref_out


def _check_against_torch(torch: Any, model: Any, path: Path, output: Path, inputs: Sequence[InputShape],
                         names: Sequence[str], output_names: Sequence[str], check: ExportCheck) -> float | None:
    """ONNX Runtime against PyTorch on a random batch of ``check.batch`` samples: the largest
    absolute difference, or a one-line error naming the output that differs."""
    if not check.batch:
        return None
    feed = _random_batch(inputs, check.batch, seed=1)
    expected = _torch_outputs(torch, model, feed, names)
    got = _ort_run(path, feed)
    max_err = 0.0
    for name, e, g in zip(output_names, expected, got, strict=True):
        if e.shape != g.shape:
            raise TrtrepoError(f"{output}: output '{name}' has shape {list(g.shape)} in ONNX Runtime but {list(e.shape)} in PyTorch")
        err = float(np.max(np.abs(e.astype(np.float64) - g.astype(np.float64)))) if e.size else 0.0
        max_err = max(max_err, err)
        if not np.allclose(g, e, atol=check.atol, rtol=check.rtol):
            raise TrtrepoError(f"{output}: output '{name}' differs from PyTorch by up to {err:.3g} (atol {check.atol}, rtol {check.rtol})")
    return max_err


def probe_feed(feed: Mapping[str, np.ndarray], axes: Mapping[str, Mapping[int, str]]) -> dict[str, np.ndarray]:
    """``feed`` with every declared dynamic axis of each input (``axes``: ``{input: {axis:
    label}}``, axis 0 the batch) resized: one shorter when longer than 1 (a smaller sequence stays
    within a model's position limit), else 2. The rows come from ``feed`` itself (cyclically), so
    token ids and masks keep values the model accepts."""
    probe = {}
    for name, value in feed.items():
        arr = np.asarray(value)
        for axis in sorted(axes.get(name, {})):
            if 0 <= axis < arr.ndim:
                size = arr.shape[axis]
                new = size - 1 if size > 1 else 2
                arr = np.take(arr, np.arange(new) % size, axis=axis)
        probe[name] = np.ascontiguousarray(arr)
    return probe


def static_output_dims(shapes: Sequence[Mapping[str, Sequence[int]]], declared: Mapping[str, Mapping[int, str]]
                       ) -> dict[str, dict[int, int | None]]:
    """Which output axes are static: ``shapes`` holds each output's shape in runs that differ in
    every declared dynamic input axis (batch included); ``declared`` the output axes declared
    dynamic. An undeclared axis is static (its size) when it has the same size in every run, and
    dynamic (None) when it varies: a per-token output whose sequence axis was not declared stays
    dynamic rather than being fixed to the sample's length. Declared axes and outputs whose rank
    differs between runs are left out (left as the exporter wrote them)."""
    result: dict[str, dict[int, int | None]] = {}
    for name in shapes[0] if shapes else {}:
        runs = [tuple(s[name]) for s in shapes if name in s]
        if len(runs) != len(shapes) or len({len(r) for r in runs}) != 1:
            continue
        dims: dict[int, int | None] = {}
        for axis in range(len(runs[0])):
            if axis in declared.get(name, {}):
                continue
            sizes = {r[axis] for r in runs}
            dims[axis] = sizes.pop() if len(sizes) == 1 and runs[0][axis] > 0 else None
        result[name] = dims
    return result


def _set_output_dims(out: Any, decided: Mapping[int, int | None], labels: set[str], notes: list[str]) -> bool:
    """Write one graph output's decided axes; whether anything changed. Decision: an axis the
    exporter sized stays; a static one gets its size; a varying one keeps its symbol when it is a
    declared axis name, else is named ``{output}_dim{axis}`` with a note."""
    dims = out.type.tensor_type.shape.dim
    changed = False
    for axis, size in decided.items():
        d = dims[axis]
        if d.HasField("dim_value") and d.dim_value > 0:
            continue  # the exporter knew it
        if size is not None:
            d.dim_value = size  # clears dim_param (one field of a oneof)
            changed = True
        elif d.dim_param not in labels:
            d.dim_param = f"{out.name}_dim{axis}"
            changed = True
            notes.append(f"output '{out.name}' axis {axis} varies with the input sizes but is not declared dynamic: "
                         f"kept dynamic as '{out.name}_dim{axis}' (--dynamic-axis {out.name}:{axis}:LABEL names it)")
    return changed


def _write_static_output_dims(model: Any, path: Path, feed: Mapping[str, np.ndarray],
                              axes: Mapping[str, Mapping[int, str]], notes: list[str]) -> Any:
    """The exported ``model`` (saved at ``path``) with the sizes of its static output axes written
    into the graph outputs, saved back to ``path``: the legacy exporter often leaves them symbolic
    (a pooled ``[batch, 384]`` embedding comes out as two symbolic dims), and Triton's config and
    metadata then say ``-1``. The axes are judged by :func:`static_output_dims` on ONNX Runtime's
    outputs for the export sample and for :func:`probe_feed` of it (batch and declared dynamic axes
    resized). An undeclared axis that varies stays dynamic, named ``{output}_dim{axis}`` unless the
    exporter tied it to a declared axis name, with a note. When the model does not run on the
    resized sample, or ``onnx.checker`` refuses the result, the model stays as exported (a note
    says why)."""
    import onnx

    names = [o.name for o in model.graph.output]
    feed = {k: np.asarray(v) for k, v in feed.items()}
    probe = probe_feed(feed, {n: {0: "batch", **dict(a)} for n, a in axes.items()})
    try:
        sess = make_session(path)
        runs = [dict(zip(names, (o.shape for o in sess.run(names, f)), strict=True)) for f in (feed, probe)]
    except Exception as exc:
        notes.append(f"output dims left as exported: ONNX Runtime fails on the export sample with batch 1 and each "
                     f"declared dynamic axis resized by one, so an axis declared dynamic may be fixed in the graph "
                     f"({type(exc).__name__}: {one_line(exc, 160)})")
        return model
    decided = static_output_dims(runs, {n: axes.get(n, {}) for n in names})
    labels = {label for a in axes.values() for label in a.values()}
    changed = False
    patched = onnx.ModelProto()
    patched.CopyFrom(model)
    for out in patched.graph.output:
        if out.type.HasField("tensor_type"):
            changed |= _set_output_dims(out, decided.get(out.name, {}), labels, notes)
    if not changed:
        return model
    try:
        onnx.checker.check_model(patched, full_check=True)
    except Exception as exc:
        notes.append(f"output dims left as exported: onnx.checker refused the static sizes ({one_line(exc)})")
        return model
    if any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer):
        light = onnx.load(str(path), load_external_data=False)  # the graph only: the weights files stay
        light.graph.ClearField("output")
        light.graph.output.extend(patched.graph.output)
        onnx.save(light, str(path))
    else:
        onnx.save(patched, str(path))
    return patched


def _without_batch(inputs: Sequence[InputShape]) -> list[InputShape] | None:
    """``--input-shape`` values given trtexec-style (``1x3x224x224``): the same without the leading
    1; None when an input did not come from ``--input-shape`` or does not start with a 1."""
    if not inputs or any(i.given is None or len(i.shape) < 2 or i.shape[0] != 1 for i in inputs):
        return None
    return [InputShape(i.name, i.shape[1:], i.dtype, i.given) for i in inputs]
