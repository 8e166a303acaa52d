"""The ONNX adapter floor: what every stage that reads an ONNX graph or runs one on ONNX Runtime
shares. :class:`GraphView` (producers, consumers, initializers, constants, inferred types and
shapes of a graph; read-only), the producer and consumer maps it is built on
(:func:`producer_map`, :func:`consumer_map`; also used alone by passes that edit the graph), and
the one ONNX Runtime CPU session factory (:func:`make_session`). Decision: one owner for these, below
the stages (qdq, equalize, weightsteps, smoothquant, quantize, evaluate, export, validate,
engine and deploy use them), so a stage never rebuilds them with its own variations. The calibrator
opens its own sessions (its execution providers, memory pattern and optimized-model files)."""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .cpu import available_cores, quant_session_entries
from .errors import TrtrepoError
from .modelio import without_weights

log = logging.getLogger(__name__)

ONNX_FLOAT = 1  # onnx.TensorProto.FLOAT


def producer_map(nodes: Iterable[Any]) -> dict[str, Any]:
    """Tensor name -> the node that produces it (empty output names, i.e. optional outputs left out, skipped)."""
    return {out: node for node in nodes for out in node.output if out}


def consumer_map(nodes: Iterable[Any]) -> defaultdict[str, list[tuple[Any, int]]]:
    """Tensor name -> ``(node, input index)`` of each use, in node order (a node that reads a tensor
    twice appears twice; empty input names, i.e. optional inputs left out, skipped)."""
    consumers: defaultdict[str, list[tuple[Any, int]]] = defaultdict(list)
    for node in nodes:
        for i, name in enumerate(node.input):
            if name:
                consumers[name].append((node, i))
    return consumers


class GraphView:
    """Producers, consumers, initializers and float tensors of a graph (read-only helper)."""

    def __init__(self, model: Any) -> None:
        import onnx

        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.constants: dict[str, Any] = {}
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self.constants[node.output[0]] = attr.t
        self.graph_inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.graph_outputs = {o.name for o in graph.output}
        self.producer = producer_map(self.nodes)
        self.consumers = consumer_map(self.nodes)
        self.elem_type: dict[str, int] = {}
        self.shape: dict[str, list[int | None]] = {}  # tensors whose rank shape inference knows (None: a free dim)
        try:
            inferred = onnx.shape_inference.infer_shapes(without_weights(model))
        except Exception as exc:  # shape inference is a help, not a requirement
            log.debug("shape inference failed: %s", exc)
            inferred = model
        for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
            if vi.type.HasField("tensor_type"):
                self.elem_type[vi.name] = vi.type.tensor_type.elem_type
                if vi.type.tensor_type.HasField("shape"):
                    self.shape[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                                           for d in vi.type.tensor_type.shape.dim]
        for name, t in {**self.initializers, **self.constants}.items():
            self.elem_type[name] = t.data_type
        self.order = {node.name: i for i, node in enumerate(self.nodes)}
        self._nonneg: dict[str, bool] = {}

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self.constants

    def constant_array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        t = self.initializers.get(name) or self.constants[name]
        return numpy_helper.to_array(t)

    def is_float_activation(self, name: str) -> bool:
        """A float32 tensor computed at run time (or a graph input). Unknown types count as
        float when the producer is a float op -- shape inference fills them for normal models."""
        if not name or self.is_constant(name):
            return False
        return self.elem_type.get(name, ONNX_FLOAT) == ONNX_FLOAT

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        import onnx

        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def non_negative(self, name: str) -> bool:
        """Whether ``name`` is provably >= 0 (Relu output and ops that keep the sign)."""
        if name in self._nonneg:
            return self._nonneg[name]
        self._nonneg[name] = False  # cycles cannot happen in a DAG; guards recursion anyway
        node = self.producer.get(name)
        result = False
        if node is not None:
            op = node.op_type
            if op in ("Relu", "Sigmoid", "Softmax", "Abs", "Exp", "Sqrt", "Softplus"):
                result = True
            elif op == "Clip":
                lo = node.input[1] if len(node.input) > 1 else ""
                lo_val = self.constant_array(lo) if lo and self.is_constant(lo) else self.attr(node, "min")
                result = lo_val is not None and float(np.min(lo_val)) >= 0.0
            elif op in ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten", "Reshape",
                        "Transpose", "Squeeze", "Unsqueeze", "Identity", "Resize", "Slice", "Gather", "Expand"):
                result = self.non_negative(node.input[0])
            elif op in ("Concat", "Max", "Add", "Mul"):
                result = all(self.non_negative(i) for i in node.input if i)
        elif self.is_constant(name):
            result = bool(np.all(self.constant_array(name) >= 0))
        self._nonneg[name] = result
        return result


def make_session(model: Any, *, threads: int | None = None, optimization: str = "all",
                 optimized_path: str | Path | None = None, config: Mapping[str, str] | None = None,
                 arena: bool = True, spin: bool = True) -> Any:
    """An ONNX Runtime CPU session for a path, serialized bytes or a ModelProto. ``config``:
    extra session config entries (they override trtrepo's own). ``arena=False``: no CPU memory
    arena (memory goes back after each run; for sessions that fetch many large tensors).
    ``threads=None``: ONNX Runtime's default, except where this process may run on fewer cores than
    the machine has (a container's cpuset, ``taskset``): then one thread per core it may use, since
    ONNX Runtime sizes its pool to the machine and its spinning threads would fight over them.
    ``spin=False``: ONNX Runtime's threads sleep instead of spinning between runs (sessions run
    many short pieces between numpy work, as the weight steps do: spinning threads take the cores
    that numpy and other processes need on a busy machine)."""

    import onnxruntime as ort

    if threads is None and available_cores() < (os.cpu_count() or 1):
        threads = available_cores()

    so = ort.SessionOptions()
    so.log_severity_level = 4  # failures reach the user as our one-line errors
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    if threads is not None:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    if threads is not None or not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not spin:
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # Exact INT8 on x86 CPUs without VNNI (set only there: it is slow elsewhere): see trtrepo.cpu.
    for key, value in {**quant_session_entries(), **(config or {})}.items():
        so.add_session_config_entry(key, value)
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if not arena:
        so.enable_cpu_mem_arena = False
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    what = "model" if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(model if isinstance(model, bytes) else str(model), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrtrepoError(f"{what}: ONNX Runtime cannot load the model ({first})") from exc
