"""Calibration feed of the legacy (implicit INT8) route: host batches of the profile's opt shape into
device buffers, and the calibration cache TensorRT reads and writes."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import cache as cache_codec
from ..contracts.profile import ShapeRange
from ..data import iter_batches
from ..errors import OptionError, UsageError
from ..fsutil import atomic_write_bytes
from ..modelio import ModelIO
from .env import CudaRuntime, nv_tensorrt_version_int, tensorrt_major
from .options import CALIBRATORS, SETTINGS, BuildOptions
from .trtexec import legacy_on_11_message

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Calibration feed (legacy route): host batches -> device buffers; the calibration cache


class CalibrationFeed:
    """What the calibrator hands TensorRT: batches of exactly the calibration shape copied into device
    buffers (one per input, reused, freed by :meth:`close`), and the cache as bytes.

    ``batches`` may be None when the cache holds everything (a cache from ``trtrepo calibrate``). A cache
    whose header names another TensorRT version but the same algorithm is handed over with the running
    version in its header (trtrepo's scales do not depend on the TensorRT version; TensorRT would
    otherwise ignore it)."""

    def __init__(self, batches: Iterable[Mapping[str, np.ndarray]] | None, batch_size: int, cuda: CudaRuntime,
                 shapes: Mapping[str, tuple[int, ...]], method: str, tensorrt_version: str,
                 cache_path: str | Path | None = None) -> None:
        self._batches: Iterator[Mapping[str, np.ndarray]] | None = iter(batches) if batches is not None else None
        self.batch_size = batch_size
        self.cuda = cuda
        self.shapes = dict(shapes)
        self.method = method
        self.tensorrt_version = tensorrt_version
        self.cache_path = Path(cache_path) if cache_path else None
        self.buffers: dict[str, tuple[int, int]] = {}  # name -> (pointer, nbytes)
        self.batches_served = 0
        self.error: BaseException | None = None
        self.cache_used = False
        self.cache_written = False

    def next_pointers(self, names: Sequence[str]) -> list[int] | None:
        if self.error is not None or self._batches is None:
            return None
        try:
            batch = next(self._batches, None)
            if batch is None:
                return None
            pointers = []
            for name in names:
                if name not in batch:
                    raise UsageError(f"calibration data has no input '{name}' (has: {', '.join(batch)})")
                array = np.ascontiguousarray(batch[name])
                want = self.shapes.get(name)
                if want is not None and tuple(array.shape) != tuple(want):
                    raise UsageError(f"calibration batch {self.batches_served}: input '{name}' has shape {list(array.shape)}, "
                                     f"TensorRT calibrates with the profile's opt shape {list(want)}")
                ptr, size = self.buffers.get(name, (0, 0))
                if size < array.nbytes:
                    if ptr:
                        self.cuda.free(ptr)
                        del self.buffers[name]
                    ptr, size = self.cuda.malloc(array.nbytes), array.nbytes
                    self.buffers[name] = (ptr, size)
                self.cuda.memcpy_htod(ptr, array)
                pointers.append(int(ptr))
            self.batches_served += 1
            return pointers
        except BaseException as exc:  # TensorRT calls this from C++: keep the error, stop calibration
            self.error = exc
            return None

    def read_cache(self) -> bytes | None:
        if self.cache_path is None or not self.cache_path.is_file() or self.cache_path.stat().st_size == 0:
            return None
        data = self.cache_path.read_bytes()
        header = cache_codec.header_of(data)
        want_algo = CALIBRATORS[self.method]
        if header is None:
            log.warning("%s: not a TensorRT calibration cache (no TRT-<version>-<algorithm> header); ignored", self.cache_path)
            return None
        if header.algorithm != want_algo:
            log.warning("%s: cache was made for %s, not %s; TensorRT will calibrate from data", self.cache_path,
                        header.algorithm, want_algo)
            return None
        running = nv_tensorrt_version_int(self.tensorrt_version)
        if header.version != running:
            log.info("%s: cache header version %d rewritten to the running TensorRT's %d", self.cache_path, header.version,
                     running)
            data = cache_codec.with_header(data, cache_codec.CacheHeader(running, header.algorithm))
        self.cache_used = True
        return data

    def write_cache(self, data: bytes) -> None:
        if self.cache_path is None or self.batches_served == 0:
            return  # nothing new: the cache came from the file, which stays as it is
        try:
            atomic_write_bytes(self.cache_path, data)
            self.cache_written = True
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        for ptr, _ in self.buffers.values():
            self.cuda.free(ptr)
        self.buffers.clear()

    def __enter__(self) -> CalibrationFeed:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_calibration_inputs(options: BuildOptions, tensorrt_version: str) -> None:
    """Before any work: the legacy route needs TensorRT <= 10 and either data or a usable cache."""
    if options.legacy_calibrator is None:
        return
    if tensorrt_major(tensorrt_version) >= 11:
        raise OptionError("", legacy_on_11_message(tensorrt_version), others=SETTINGS)
    if options.data is not None:
        return
    if not options.calib_cache:
        raise OptionError("legacy_calibrator", "needs {data_spec} (calibration samples) or {calib_cache} (a calibration "
                          "cache)", others=SETTINGS)
    path = Path(options.calib_cache)
    if not path.is_file():
        raise OptionError("", f"{path}: calibration cache not found, and no {{data_spec}} to calibrate from", others=SETTINGS)
    header = cache_codec.header_of(path.read_bytes())
    if header is None:
        raise UsageError(f"{path}: not a TensorRT calibration cache (first line must be TRT-<version>-<algorithm>)")
    want = CALIBRATORS[options.legacy_calibrator]
    if header.algorithm != want:
        raise OptionError("", f"{path}: cache holds {header.algorithm} ranges but {{legacy_calibrator}} "
                          f"{options.legacy_calibrator} needs {want}; TensorRT would ignore it and there is no {{data_spec}} "
                          f"to calibrate from", others=SETTINGS)


def calibration_batches(options: BuildOptions, io: ModelIO, profile: Mapping[str, ShapeRange]) -> Iterator[dict[str, np.ndarray]]:
    """Batches of exactly the profile's opt batch (TensorRT calibrates with the OPT shapes); a short last
    batch is dropped."""

    source = options.data.open(io)
    batch = options.opt_batch
    served = 0
    for b in iter_batches(source, batch, io):
        if b.size < batch:
            if served == 0:
                raise OptionError("", f"calibration data has {b.size} sample(s), fewer than one batch of {{opt_batch}} {batch}",
                                  others=SETTINGS)
            log.info("dropping the last %d calibration sample(s) (not a full batch of %d)", b.size, batch)
            break
        served += 1
        yield b.inputs


