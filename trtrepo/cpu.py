"""What this CPU offers ONNX Runtime's INT8 kernels (read from /proc/cpuinfo, no I/O elsewhere).

On x86 CPUs without VNNI (AVX2 or AVX-512 only, e.g. AMD Zen 2/3, Intel before Cascade Lake),
ONNX Runtime runs uint8 x int8 ("U8S8") Conv/MatMul with ``VPMADDUBSW``, which adds pairs of
u8*s8 products in saturating int16: with full-range int8 weights a pair can exceed 32767 and the
result is silently wrong. ONNX Runtime's session option ``session.x64quantprecision=1`` converts
such kernels to U8U8 (no saturation). It is not free where it is not needed: with VNNI it gives
the same outputs at well under FP32's speed (figures: docs/benchmarks.md, "INT8 on the CPU:
run-to-run spread and CPU kinds (issue 4)"; docs/quantization.md, "CPUs without VNNI"). So
trtrepo sets it only where this CPU saturates
(:func:`quant_session_entries`); the generated Triton model.py decides the same way on the
serving machine. ONNX Runtime's other remedy is 7-bit weights (``reduce_range``), which costs
accuracy.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: ONNX Runtime session config key: U8S8 -> U8U8 where the CPU would saturate (x86 without VNNI).
X64_QUANT_PRECISION = "session.x64quantprecision"


@dataclass(frozen=True)
class CpuInt8:
    machine: str
    model: str
    vnni: bool | None  # None: not x86 or flags unreadable
    flags: tuple[str, ...]  # the INT8-relevant flags present

    @property
    def saturates(self) -> bool:
        """True where ONNX Runtime's U8S8 kernels can saturate (x86 with AVX2/AVX-512, no VNNI)."""
        return self.vnni is False and any(f in self.flags for f in ("avx2", "avx512f", "avx512bw"))

    def describe(self) -> str:
        what = ", ".join(self.flags) or "no AVX2/AVX-512"
        if self.vnni is None:
            return f"{self.model or self.machine}: INT8 features unknown"
        if self.vnni:
            note = f"VNNI: INT8 dot products without saturation; {X64_QUANT_PRECISION} left unset"
        elif self.saturates:
            note = f"no VNNI: U8S8 Conv/MatMul can saturate; trtrepo's ONNX Runtime sessions set {X64_QUANT_PRECISION}=1"
        else:
            note = "no AVX2/AVX-512: ONNX Runtime's U8S8 kernels do not use VPMADDUBSW"
        return f"{self.model or self.machine} ({what}); {note}"


_RELEVANT = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")


def parse_cpuinfo(text: str, machine: str = "x86_64") -> CpuInt8:
    """The INT8 facts from the text of ``/proc/cpuinfo`` (pure function)."""
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    if machine not in ("x86_64", "AMD64", "i686") or not flags:
        return CpuInt8(machine, model, None, ())
    present = tuple(f for f in _RELEVANT if f in flags)
    return CpuInt8(machine, model, "avx512_vnni" in flags or "avx_vnni" in flags, present)


@lru_cache(maxsize=1)
def cpu_int8() -> CpuInt8:
    """This machine's :class:`CpuInt8` (Linux; elsewhere ``vnni`` is None)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.machine())


def quant_session_entries(info: CpuInt8 | None = None) -> dict[str, str]:
    """ONNX Runtime session config entries for exact INT8 on ``info`` (default: this CPU):
    ``{X64_QUANT_PRECISION: "1"}`` where U8S8 kernels saturate, nothing elsewhere."""
    info = cpu_int8() if info is None else info
    return {X64_QUANT_PRECISION: "1"} if info.saturates else {}
