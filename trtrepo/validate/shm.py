"""Shared memory for requests (``validate --shared-memory system|cuda``): :class:`SharedMemory`
holds the regions of every in-flight request slot, registered with the server, and reads and
writes them; the regions of killed runs are reaped before new ones are made.

A slot is one request's inputs and outputs, each in a region of its own sized for the largest
tensor of that name over the payloads; a slot serves one request at a time (the load generator
hands slots out). Regions are named ``trtrepo_<pid>_<object>_<slot>_<in|out><i>``: the process id
lets the next run tell a killed run's regions from a living one's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.payload import Payload
from ..errors import OptionError, TrtrepoError, one_line
from ..fsutil import pid_alive, reap_stale
from ..modelio import ModelIO

log = logging.getLogger(__name__)


class _Slot:
    """Shared-memory regions of one in-flight request slot (inputs and outputs)."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, Any, int]] = {}  # name -> (region, handle, size)
        self.outputs: dict[str, tuple[str, Any, int]] = {}


class SharedMemory:
    """The shared-memory regions of one client: none until :meth:`setup`, released by
    :meth:`release` (also when a setup fails half-way).

    ``call(name, *args)`` makes one administrative call to the server (tritonclient's method
    ``name``) and raises what the client raises; ``url`` and ``where`` name the server (a server on
    another host keeps the registrations of its own clients: process ids mean nothing there)."""

    def __init__(self, call: Callable[..., Any], url: str, where: str) -> None:
        self._call = call
        self.url = url
        self.where = where
        self.kind = "none"
        self.slots: list[_Slot] = []

    def __len__(self) -> int:
        return len(self.slots)

    def setup(self, kind: str, slots: int, payloads: Sequence[Payload], io: ModelIO | None) -> None:
        """Create and register regions for ``slots`` concurrent requests, sized for the largest
        input and output of ``payloads`` (the output sizes need their shapes in advance)."""
        self.release()
        if kind == "none":
            return
        if any(-1 in shape for p in payloads for shape in p.expected.values()):
            raise OptionError("shared_memory", "needs the output shapes in advance (run the accuracy phase too)")
        assert io is not None  # the served IO is known before shared memory is set up
        in_sizes: dict[str, int] = {}
        out_sizes: dict[str, int] = {}
        for p in payloads:
            for n, a in p.inputs.items():
                in_sizes[n] = max(in_sizes.get(n, 0), a.nbytes)
            for n, shape in p.expected.items():
                out_sizes[n] = max(out_sizes.get(n, 0), int(np.prod(shape)) * int(np.dtype(io.output(n).dtype).itemsize))
        if kind == "cuda":
            cudashm = cuda_shm()
        else:
            import tritonclient.utils.shared_memory as sysshm
        self.kind = kind
        if kind == "system":
            self._reap_stale_regions()
        tag = f"trtrepo_{os.getpid()}_{id(self) & 0xFFFFFF:x}"
        try:
            for s in range(slots):
                slot = _Slot()
                self.slots.append(slot)
                for group, sizes, target in (("in", in_sizes, slot.inputs), ("out", out_sizes, slot.outputs)):
                    for i, (name, size) in enumerate(sizes.items()):
                        region = f"{tag}_{s}_{group}{i}"
                        size = max(size, 1)
                        if kind == "system":
                            handle = sysshm.create_shared_memory_region(region, "/" + region, size)
                            target[name] = (region, handle, size)
                            self._call("register_system_shared_memory", region, "/" + region, size)
                        else:
                            handle = cudashm.create_shared_memory_region(region, size, 0)
                            target[name] = (region, handle, size)
                            self._call("register_cuda_shared_memory", region, cudashm.get_raw_handle(handle), 0, size)
        except Exception as exc:
            self.release()
            if isinstance(exc, TrtrepoError):
                raise
            raise TrtrepoError(f"{self.where}: cannot set up {kind} shared memory: {one_line(exc)}") from exc

    def _reap_stale_regions(self) -> None:
        """Regions of validate runs that were killed (named ``trtrepo_<pid>_...``): their
        ``/dev/shm`` files, and, on a server on this machine, their registrations."""
        if Path("/dev/shm").is_dir():
            for p in reap_stale("trtrepo_", "/dev/shm"):
                log.info("removed %s (left by a killed trtrepo process)", p)
        if self.url.rsplit(":", 1)[0] not in ("127.0.0.1", "localhost", "::1", "[::1]"):
            return  # process ids mean nothing on another host
        with contextlib.suppress(Exception):
            status = self._call("get_system_shared_memory_status")
            regions = status.get("regions", {}) if isinstance(status, dict) else status
            names = list(regions) if isinstance(regions, dict) else [r.get("name", "") for r in regions]
            for name in names:
                parts = str(name).split("_")
                if len(parts) > 2 and parts[0] == "trtrepo" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                    self._call("unregister_system_shared_memory", name)
                    log.info("unregistered shared-memory region %s of a killed trtrepo process", name)

    def release(self) -> None:
        """Unregister and destroy every region (each step best effort: the server may be gone)."""
        if not self.slots:
            return
        mod = _shm_module(self.kind)
        unregister = f"unregister_{self.kind}_shared_memory"
        for slot in self.slots:
            for region, handle, _ in (*slot.inputs.values(), *slot.outputs.values()):
                with contextlib.suppress(Exception):
                    self._call(unregister, region)
                with contextlib.suppress(Exception):
                    mod.destroy_shared_memory_region(handle)
        self.slots = []
        self.kind = "none"

    # --- one request's tensors ---------------------------------------------------------------
    def write_input(self, slot: int, name: str, arr: np.ndarray) -> str:
        """Put input ``name`` of a request into ``slot``'s region; the region's name."""
        region, handle, _ = self.slots[slot].inputs[name]
        _shm_module(self.kind).set_shared_memory_region(handle, [arr])
        return region

    def output_region(self, slot: int, name: str) -> tuple[str, int]:
        """The region (name, size in bytes) where the server writes output ``name`` of ``slot``'s request."""
        region, _, size = self.slots[slot].outputs[name]
        return region, size

    def read_output(self, slot: int, name: str, dtype: np.dtype[Any], shape: Sequence[int]) -> np.ndarray:
        """Output ``name`` of ``slot``'s answered request, as numpy."""
        return _shm_module(self.kind).get_contents_as_numpy(self.slots[slot].outputs[name][1], dtype, shape)


def _shm_module(kind: str) -> Any:
    if kind == "cuda":
        return cuda_shm()
    import tritonclient.utils.shared_memory as sysshm

    return sysshm


def cuda_shm() -> Any:
    """``tritonclient.utils.cuda_shared_memory`` when a CUDA GPU is usable, else a UsageError."""
    try:
        import cuda.bindings.runtime as cudart  # type: ignore[import-not-found]
    except ImportError:
        raise OptionError("shared_memory", "cuda needs an NVIDIA GPU and cuda-python (cuda.bindings), which this "
                                           "machine does not have; use {shared_memory} system or none") from None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or not count:
        why = getattr(err, "name", str(err))
        raise OptionError("shared_memory", f"cuda: no CUDA GPU is visible on this machine ({why}); "
                                           f"use {{shared_memory}} system or none")
    import tritonclient.utils.cuda_shared_memory as cudashm

    return cudashm
