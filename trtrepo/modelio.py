"""The IO description: one frozen dataclass that every stage reads.

:class:`ModelIO` lists a model's inputs and outputs as :class:`TensorSpec` (name, numpy dtype,
shape with ``-1`` for dynamic axes, and which axis is the batch axis). It is derived once from
the ONNX graph (:meth:`ModelIO.from_onnx`) or from a built engine's metadata
(:meth:`ModelIO.from_dict`); calibration, the builder, the Triton config renderer and the
validation harness all take it instead of re-deriving shapes themselves.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .detect import class_names
from .errors import UsageError, one_line

# ONNX TensorProto element type -> numpy dtype name. Only what models actually use.
_ONNX_TO_NUMPY = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}

# numpy dtype name -> Triton data type, used by the config renderer and the harness.
_NUMPY_TO_TRITON = {
    "bool": "TYPE_BOOL",
    "uint8": "TYPE_UINT8",
    "uint16": "TYPE_UINT16",
    "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64",
    "int8": "TYPE_INT8",
    "int16": "TYPE_INT16",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "float16": "TYPE_FP16",
    "float32": "TYPE_FP32",
    "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
    "object": "TYPE_STRING",  # bytes (encoded images into an ensemble); numpy object arrays
}


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor.

    ``shape`` is the full shape, batch axis included, with ``-1`` for every dynamic axis.
    ``batch_axis`` is the index of the batch axis (``None`` when the model has none).
    ``dim_names`` keeps the symbolic names of dynamic axes (``"batch"``, ``"sequence"``) when known.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    batch_axis: int | None = 0
    dim_names: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise UsageError("tensor name must not be empty")
        if self.dtype not in _NUMPY_TO_TRITON:
            raise UsageError(f"tensor '{self.name}': unsupported dtype '{self.dtype}'")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        for d in self.shape:
            if d < -1 or d == 0:
                raise UsageError(f"tensor '{self.name}': invalid dimension {d} in shape {list(self.shape)}")
        if self.batch_axis is not None and not 0 <= self.batch_axis < len(self.shape):
            raise UsageError(f"tensor '{self.name}': batch axis {self.batch_axis} outside shape {list(self.shape)}")
        if self.dim_names and len(self.dim_names) != len(self.shape):
            raise UsageError(f"tensor '{self.name}': {len(self.dim_names)} dim names for rank {len(self.shape)}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def triton_dtype(self) -> str:
        return _NUMPY_TO_TRITON[self.dtype]

    @property
    def triton_dtype_short(self) -> str:
        """Data type as tritonclient names it (``FP32``, ``INT64``...)."""
        short = _NUMPY_TO_TRITON[self.dtype].removeprefix("TYPE_")
        return "BYTES" if short == "STRING" else short

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape without the batch axis (what Triton's ``dims`` holds when batching)."""
        if self.batch_axis is None:
            return self.shape
        return self.shape[: self.batch_axis] + self.shape[self.batch_axis + 1 :]

    @property
    def dynamic_axes(self) -> tuple[int, ...]:
        return tuple(i for i, d in enumerate(self.shape) if d == -1)

    def with_batch(self, batch: int) -> tuple[int, ...]:
        """Concrete shape for ``batch`` samples; other dynamic axes stay -1."""
        if self.batch_axis is None:
            return self.shape
        shape = list(self.shape)
        shape[self.batch_axis] = batch
        return tuple(shape)

    def check_array(self, array: np.ndarray, *, batched: bool = True, where: str = "") -> None:
        """Raise :class:`UsageError` naming this tensor when ``array`` does not fit the spec."""
        expected = self.shape if batched else self.sample_shape
        ctx = f" ({where})" if where else ""
        if array.ndim != len(expected):
            raise UsageError(
                f"input '{self.name}'{ctx}: data has shape {list(array.shape)} (rank {array.ndim}) "
                f"but the model expects rank {len(expected)} shape {list(expected)}"
            )
        for axis, (got, want) in enumerate(zip(array.shape, expected, strict=True)):
            if want != -1 and got != want:
                raise UsageError(
                    f"input '{self.name}'{ctx}: data has shape {list(array.shape)} but the model expects "
                    f"{list(expected)} (axis {axis}: {got} != {want})"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "batch_axis": self.batch_axis,
            "dim_names": list(self.dim_names),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorSpec:
        return cls(
            name=data["name"],
            dtype=data["dtype"],
            shape=tuple(data["shape"]),
            batch_axis=data.get("batch_axis", 0),
            dim_names=tuple(data.get("dim_names") or ()),
        )


@dataclass(frozen=True)
class ModelIO:
    """Inputs and outputs of a model, in graph order."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    source: str = field(default="", compare=False)
    # the classes' names in index order, where the exporter wrote them (Ultralytics' ``names``
    # metadata); they map a COCO labels file's categories by name (trtrepo.boxlabels)
    class_names: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        names = [t.name for t in (*self.inputs, *self.outputs)]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise UsageError(f"{self.source or 'model'}: tensor names are not unique: {', '.join(dup)}")
        if not self.inputs:
            raise UsageError(f"{self.source or 'model'}: the model has no inputs")
        if not self.outputs:
            raise UsageError(f"{self.source or 'model'}: the model has no outputs")

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    @property
    def has_batch_axis(self) -> bool:
        """True when every tensor has a dynamic batch axis at position 0 (Triton batching)."""
        return all(t.batch_axis == 0 and t.shape[0] == -1 for t in (*self.inputs, *self.outputs))

    @property
    def fixed_batch(self) -> int | None:
        """The batch every input is fixed at, for a model exported with a static axis 0 (Ultralytics
        exports batch 1 unless asked otherwise): the steps that run it feed batches of exactly this
        size (:func:`trtrepo.data.iter_batches`). None when axis 0 is dynamic (the model batches) or
        the inputs disagree."""
        if self.has_batch_axis or any(t.rank == 0 or t.shape[0] == -1 for t in self.inputs):
            return None
        sizes = {t.shape[0] for t in self.inputs}
        return sizes.pop() if len(sizes) == 1 else None

    def input(self, name: str) -> TensorSpec:
        for t in self.inputs:
            if t.name == name:
                return t
        raise UsageError(f"{self.source or 'model'} has no input named '{name}' (inputs: {', '.join(self.input_names)})")

    def output(self, name: str) -> TensorSpec:
        for t in self.outputs:
            if t.name == name:
                return t
        raise UsageError(
            f"{self.source or 'model'} has no output named '{name}' (outputs: {', '.join(self.output_names)})"
        )

    def check_feed(self, feed: Mapping[str, np.ndarray], *, where: str = "") -> None:
        """Check a batch ``{input name: array}`` against the inputs; the error names the tensor."""
        missing = [n for n in self.input_names if n not in feed]
        extra = [n for n in feed if n not in self.input_names]
        ctx = f" ({where})" if where else ""
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing input(s) {', '.join(missing)}")
            if extra:
                parts.append(f"unknown input(s) {', '.join(extra)}")
            raise UsageError(f"data{ctx} does not match the model's inputs: {'; '.join(parts)}")
        for spec in self.inputs:
            spec.check_array(np.asarray(feed[spec.name]), where=where)

    def to_dict(self) -> dict[str, Any]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "") -> ModelIO:
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in data["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in data["outputs"]),
            source=source,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_onnx(cls, model: Any, *, source: str | Path = "") -> ModelIO:
        """Read the IO description from an ONNX model (a path or a loaded ``ModelProto``;
        ``source`` names the file of a loaded one in messages).

        A dimension with a symbolic name or no value is dynamic (-1). The batch axis is axis 0
        when axis 0 is dynamic on every input and output; otherwise the model has no batch
        axis and Triton's ``max_batch_size`` will be 0.
        """
        import onnx

        source = str(source)
        if isinstance(model, (str, Path)):
            source = str(model)
            model = load_onnx(model, load_weights=False)
        graph = model.graph
        initializer_names = {init.name for init in graph.initializer}

        def specs(values: Any) -> list[tuple[str, str, list[int], list[str | None]]]:
            result = []
            for vi in values:
                if vi.name in initializer_names:
                    continue
                if isinstance(vi.name, bytes):  # protobuf hands over a name that is not UTF-8 as bytes
                    shown = vi.name.decode("utf-8", "backslashreplace")
                    raise UsageError(f"{source or 'model'}: the tensor name '{shown}' is not valid UTF-8 (data, "
                                     f"configs and requests name tensors in UTF-8)")
                ttype = vi.type.tensor_type
                if not vi.type.HasField("tensor_type"):
                    raise UsageError(f"{source or 'model'}: tensor '{vi.name}' is not a plain tensor")
                elem = ttype.elem_type
                if elem not in _ONNX_TO_NUMPY:
                    name = onnx.TensorProto.DataType.Name(elem) if elem else "UNDEFINED"
                    raise UsageError(f"{source or 'model'}: tensor '{vi.name}' has unsupported type {name}")
                shape: list[int] = []
                names: list[str | None] = []
                for d in ttype.shape.dim:
                    if d.HasField("dim_value") and d.dim_value > 0:
                        shape.append(int(d.dim_value))
                        names.append(None)
                    else:
                        shape.append(-1)
                        names.append(d.dim_param or None)
                result.append((vi.name, _ONNX_TO_NUMPY[elem], shape, names))
            return result

        ins = specs(graph.input)
        outs = specs(graph.output)
        batched = all(len(s) > 0 and s[0] == -1 for _, _, s, _ in ins + outs)
        axis = 0 if batched else None

        def make(items: list[tuple[str, str, list[int], list[str | None]]]) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(name=n, dtype=dt, shape=tuple(s), batch_axis=axis, dim_names=tuple(dn))
                for n, dt, s, dn in items
            )

        meta = {p.key: p.value for p in model.metadata_props}
        names = class_names(meta["names"]) if "names" in meta else ()
        return cls(inputs=make(ins), outputs=make(outs), source=source, class_names=names)


def load_onnx(path: str | Path, *, load_weights: bool = True) -> Any:
    """Load an ONNX file with a one-line error naming the file when it is missing or invalid."""
    import onnx

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: ONNX file not found")
    try:
        return onnx.load(str(p), load_external_data=load_weights)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise UsageError(f"{p}: not a readable ONNX model ({one_line(exc)})") from exc


def external_data_path(folder: Path, location: str, what: str) -> Path:
    """The file that an external-data ``location`` of an ONNX model in ``folder`` names, checked
    the way ONNX's own loader checks it, so that every reader refuses the same files (``export``
    and ``deploy`` load through ONNX, ``repo add`` copies the file, ``calibrate`` and ``quantize``
    read it field by field): a relative path inside the folder, reached through no symbolic link,
    a regular file with no other hard link. A link there would carry a file from elsewhere on the
    host (a key beside the model) into the repository and its bucket as the model's weights.
    ``what`` starts each message (``"model.onnx: its"``)."""
    rel = Path(location)
    if not location or rel.is_absolute() or ".." in rel.parts:
        raise UsageError(f"{what} external data location '{location}' is outside the model's folder")
    path = folder
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            how = "is a symbolic link" if path == folder / rel else f"is reached through the symbolic link {path}"
            raise UsageError(f"{what} external data file {folder / rel} {how} (copy the file into the model's folder)")
    try:
        st = path.stat()
    except OSError:
        raise UsageError(f"{what} external data file {path} is missing") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{what} external data file {path} is not a regular file")
    if st.st_nlink > 1:
        raise UsageError(f"{what} external data file {path} has {st.st_nlink} hard links (copy the file into the "
                         f"model's folder)")
    return path


def qdq_counts(path: str | Path) -> tuple[int, int]:
    """(QuantizeLinear, DequantizeLinear) nodes in the main graph of the ONNX file ``path``
    (read without its weights)."""
    ops = [n.op_type for n in load_onnx(path, load_weights=False).graph.node]
    return ops.count("QuantizeLinear"), ops.count("DequantizeLinear")


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        raise UsageError("bfloat16 tensors cannot be fed from numpy")
    return np.dtype(name)


def with_outputs(model: Any, names: Iterable[str], types: Mapping[str, int] | None = None) -> Any:
    """A copy of ``model`` with each of ``names`` that is not a graph output yet added as one
    (element type from ``types``, default FLOAT; shape left open): how a pass fetches
    intermediate tensors from ONNX Runtime."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    have = {o.name for o in copy.graph.output}
    for name in names:
        if name not in have:
            copy.graph.output.append(onnx.helper.make_tensor_value_info(name, (types or {}).get(name, 1), None))
            have.add(name)
    return copy


def normalize_weights(model: Any) -> list[str]:
    """Give ``model``'s weights the form every stage reads, in place; one note per change.

    Exporters other than today's PyTorch lay weights out in two other valid ways, and the INT8
    passes (weight rounding, bias correction, Q/DQ on weights) look weights up among the
    initializers and run the model with the data inputs only:

    * paddle2onnx (and hand-built graphs) make every weight a ``Constant`` node: each ``Constant``
      of the main graph holding a tensor (its ``value``) becomes an initializer of the same name
      (the node goes; one whose output is itself a graph output stays, an initializer cannot be
      one everywhere);
    * old PyTorch exports (``keep_initializers_as_inputs=True``, the default before 1.x) also list
      every initializer as a graph input -- an input a caller *may* override: it leaves the inputs
      (the served model is fed its data inputs only; :meth:`ModelIO.from_onnx` already skips them)
      and the IR version becomes 4 where it was older (IR 3 required the listing).

    The same model (ONNX Runtime then folds the weights as constants: float rounding apart, the
    same outputs)."""
    graph = model.graph
    notes = []
    outputs = {o.name for o in graph.output}
    constants = [n for n in graph.node if n.op_type == "Constant" and len(n.output) == 1 and n.output[0] not in outputs
                 and len(n.attribute) == 1 and n.attribute[0].name == "value"]
    if constants:
        moved = {id(n) for n in constants}
        kept = [n for n in graph.node if id(n) not in moved]
        for node in constants:
            tensor = graph.initializer.add()
            tensor.CopyFrom(node.attribute[0].t)
            tensor.name = node.output[0]
        del graph.node[:]
        graph.node.extend(kept)
        notes.append(f"{len(constants)} Constant node(s) read as initializers (weights as Constant nodes, "
                     f"as paddle2onnx exports them)")
    names = {t.name for t in graph.initializer}
    listed = [i for i in graph.input if i.name in names]
    if listed:
        data = [i for i in graph.input if i.name not in names]
        del graph.input[:]
        graph.input.extend(data)
        model.ir_version = max(model.ir_version, 4)
        notes.append(f"{len(listed)} initializer(s) also listed as graph inputs left out of the inputs "
                     f"(an old PyTorch export's keep_initializers_as_inputs)")
    return notes


def without_weights(model: Any, large: int = 1024) -> Any:
    """What shape inference reads of ``model``: its graph with the initializers of ``large`` bytes
    or more reduced to name, type and dims (their data is never read: shapes and constant inputs of
    shape computations are small), so that inference does not copy the weights (4 times). The
    model itself when it has no such initializer. Not for ``onnx.checker``, which wants data."""
    import onnx

    graph = model.graph
    if not any(len(t.raw_data) >= large for t in graph.initializer):
        return model
    light = onnx.ModelProto(ir_version=model.ir_version)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = graph.name
    for name in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(g, name).extend(getattr(graph, name))
    for t in graph.initializer:
        if len(t.raw_data) >= large:
            g.initializer.append(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
        else:
            g.initializer.append(t)
    return light
