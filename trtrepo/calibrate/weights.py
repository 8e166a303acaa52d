"""The calibrated model without its weights in memory.

The calibrator reads the graph without the data of its initializers of ``LARGE_TENSOR_BYTES`` (1 KB) or more
(:func:`load_graph`: they stay in the model's file, as external data; shape inference never
sees them), and the session loads the augmented copy from a temporary folder, its weights copied
into a file beside it that ONNX Runtime maps (:func:`gather_weights`): the weights are in memory
once, as the session's (packed MatMul and Gemm) weights, never in Python nor serialized. The peak
is then about the model's weights, the interpreter and libraries, and the budget-bounded
activations with ONNX Runtime's scratch memory, whatever the batch size, instead of several copies
of the weights held by Python (figures: docs/benchmarks.md, "Calibration memory at any batch size
(issue 13)"; its script left with issue 42: ``git show fe27e6f:bench/calib_memory.py``). The temporary folder takes the model's size on disk for
the calibrator's lifetime. Prepacking stays on: without it (``session.disable_prepacking``) the
mapped weights are resident instead of the packed ones (no saving) and the MatMul kernels compute
other last bits.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..modelio import external_data_path, load_onnx

log = logging.getLogger(__name__)

# Tensors of this many bytes or more leave the calibration's copies of the model (ONNX's threshold
# for external data); smaller ones (shapes, scalars) stay in the graph, where shape inference reads them.
LARGE_TENSOR_BYTES = 1024


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _fields(f: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, tag offset, value offset, end offset)`` of the fields of the protobuf
    message stored at ``[start, end)`` of the binary file ``f``."""
    pos = start
    while pos < end:
        f.seek(pos)
        head = f.read(20)
        key, n = _varint(head, 0)
        wire = key & 7
        if wire == 0:
            _, stop = _varint(head, n)
            yield key >> 3, pos, pos + n, pos + stop
            pos += stop
        elif wire == 2:
            length, n2 = _varint(head, n)
            yield key >> 3, pos, pos + n2, pos + n2 + length
            pos += n2 + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            yield key >> 3, pos, pos + n, pos + n + size
            pos += n + size
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos}")
    if pos != end:
        raise ValueError(f"protobuf field overruns its message at byte {pos}")


def _read(f: Any, start: int, end: int) -> bytes:
    f.seek(start)
    data = f.read(end - start)
    if len(data) != end - start:
        raise ValueError("truncated file")
    return bytes(data)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _graph_bytes(path: Path) -> bytes:
    """The serialized ModelProto of ``path`` with the raw data of every initializer of the main
    graph of ``LARGE_TENSOR_BYTES`` bytes or more left in the file: such an initializer becomes external data
    whose location is the file itself (relative to its folder), at the raw data's offset.

    Reads the file field by field (ModelProto.graph = 7, GraphProto.initializer = 5,
    TensorProto.raw_data = 9, external_data = 13, data_location = 14), so that the weights are
    never in memory; everything else is copied byte for byte."""
    location = path.name.encode()
    out = bytearray()
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        for number, tag, start, end in _fields(f, 0, size):
            if number != 7:
                out += _read(f, tag, end)
                continue
            graph = bytearray()
            for gfield, gtag, gstart, gend in _fields(f, start, end):
                if gfield != 5:
                    graph += _read(f, gtag, gend)
                    continue
                parts = list(_fields(f, gstart, gend))
                raw = [(s, e) for n, _, s, e in parts if n == 9]
                if len(raw) != 1 or raw[0][1] - raw[0][0] < LARGE_TENSOR_BYTES or any(n in (13, 14) for n, *_ in parts):
                    graph += _read(f, gtag, gend)
                    continue
                tensor = bytearray()
                for n, t, _, e in parts:
                    if n != 9:
                        tensor += _read(f, t, e)
                for key, value in ((b"location", location), (b"offset", str(raw[0][0]).encode()),
                                   (b"length", str(raw[0][1] - raw[0][0]).encode())):
                    tensor += _length_delimited(13, _length_delimited(1, key) + _length_delimited(2, value))
                tensor += _encode_varint(14 << 3) + _encode_varint(1)  # data_location = EXTERNAL
                graph += _length_delimited(5, bytes(tensor))
            out += _length_delimited(7, bytes(graph))
    return bytes(out)


def load_graph(path: Path) -> Any:
    """The ONNX model ``path`` without the data of its large initializers (see :func:`_graph_bytes`):
    their external data is relative to the model's folder, as for a model saved with external data.

    Falls back to loading the whole model (weights in memory) where the file cannot be read
    field by field; a file that is not ONNX gets :func:`~trtrepo.modelio.load_onnx`'s error."""
    import onnx

    if path.is_file():
        try:
            model = onnx.ModelProto()
            model.ParseFromString(_graph_bytes(path))
            return model
        except Exception as exc:  # not ONNX, or a layout this reader does not know: load it all
            log.debug("%s: cannot read the graph without its weights (%s); loading the whole model", path, exc)
    return load_onnx(path)


def gather_weights(model: Any, source: Path, target: Path) -> None:
    """Write the data of every initializer of ``model``'s main graph that is external (relative to
    the folder ``source``) or holds ``LARGE_TENSOR_BYTES`` bytes or more into the file ``target`` and point the
    initializer there (relative to ``target``'s folder), in place.

    Each tensor starts at a multiple of ``mmap.ALLOCATIONGRANULARITY``: ONNX Runtime then maps
    the file instead of reading it into memory. The data is copied in chunks, never held whole."""
    import onnx

    external = onnx.TensorProto.EXTERNAL
    with open(target, "wb") as out:
        for t in model.graph.initializer:
            if t.data_location == external:
                entries = {e.key: e.value for e in t.external_data}
                src = external_data_path(source, entries.get("location", ""), f"initializer '{t.name}':")
                try:
                    with open(src, "rb") as f:
                        offset = int(entries.get("offset") or 0)
                        available = f.seek(0, 2) - offset
                        length = int(entries["length"]) if entries.get("length") else available
                        if offset < 0 or length < 0 or length > available:
                            raise UsageError(f"initializer '{t.name}': external data beyond the end of {src}")
                        out.seek(-out.tell() % mmap.ALLOCATIONGRANULARITY, 1)
                        start = out.tell()
                        f.seek(offset)
                        left = length
                        while left:
                            chunk = f.read(min(left, 1 << 24))
                            if not chunk:
                                raise UsageError(f"initializer '{t.name}': {src} is truncated")
                            out.write(chunk)
                            left -= len(chunk)
                except OSError as exc:
                    raise UsageError(f"initializer '{t.name}': cannot read its external data ({exc})") from exc
            elif len(t.raw_data) >= LARGE_TENSOR_BYTES:
                out.seek(-out.tell() % mmap.ALLOCATIONGRANULARITY, 1)
                start, length = out.tell(), len(t.raw_data)
                out.write(t.raw_data)
                t.ClearField("raw_data")
            else:
                continue
            del t.external_data[:]
            t.data_location = external
            for key, value in (("location", target.name), ("offset", str(start)), ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, value
