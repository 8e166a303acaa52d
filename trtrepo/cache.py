"""Range file formats: TensorRT calibration cache, JSON ranges, sampleINT8API dynamic ranges.

Stable API::

    CacheHeader(version: int, algorithm: str)            # .text == "TRT-100300-EntropyCalibration2"
    header_of(data: bytes) -> CacheHeader | None;  with_header(data, header) -> bytes
    trt_version_int("10.13.0") -> 101300                  # NV_TENSORRT_VERSION encoding
    encode_scale(0.5 / 127) -> "3b810204"; decode_scale("3c010204") -> 1/127 (float32)
    format_cache(scales, trt_version, algorithm) -> str;  parse_cache(text) -> (CacheHeader, {name: scale})
    write_cache(path, ranges, trt_version="10.13.0", algorithm="EntropyCalibration2") -> Path
    read_cache(path) -> (CacheHeader, {name: scale})
    write_dynamic_range(path, ranges) / read_dynamic_range(path) -> {name: amax}
    check_names(names, expected, known=None, source=...)  # refuses mismatching caches

**TensorRT calibration cache.** A header line ``TRT-<version>-<Algorithm>`` and one
``name: hhhhhhhh`` line per tensor holding the big-endian bits of the float32
``scale = amax / 127`` (``3c010204`` is amax 1.0). ``<version>`` is ``NV_TENSORRT_VERSION``:
``M*1000 + m*100 + p`` for TensorRT 8 (8.6.1 -> 8601) and ``M*10000 + m*100 + p`` from 10 on
(10.3.0 -> 100300). TensorRT only reads a cache whose header matches its own version and the
algorithm of the calibrator that reads it; ``trtexec --calib`` reads through an
EntropyCalibrator2, hence that default whatever method computed the ranges. The scales in a
cache round-trip exactly (float32 bits); amax read back is ``float32(scale) * 127``.

**Dynamic-range text** (TensorRT's sampleINT8API): ``name:amax`` per line, *amax not scale*,
applied as ``setDynamicRange(-amax, amax)``.

The JSON ranges file is written by :meth:`trtrepo.calibrate.Ranges.save_json`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import OptionError, UsageError
from .fsutil import atomic_write_text

ALGORITHMS = ("EntropyCalibration2", "EntropyCalibration", "MinMaxCalibration", "LegacyCalibration")
DEFAULT_ALGORITHM = "EntropyCalibration2"
DEFAULT_TRT_VERSION = "10.13.0"
QMAX = 127.0
# Scale written for a tensor whose range is 0 (all zeros): TensorRT needs a positive scale.
MIN_SCALE = float(struct.unpack(">f", struct.pack(">f", 1e-12))[0])

# The largest amax a range file may hold: float32's largest value (an amax beyond it cannot be a
# float32 activation's range; a scale whose amax overflows is a corrupt or hand-made file).
MAX_AMAX = 3.4028234663852886e38  # numpy.finfo(numpy.float32).max


def check_range(name: str, amax: float, source: str) -> float:
    """``amax`` of tensor ``name`` read from the file ``source``, or a :class:`UsageError` naming
    both: zero (every value of the tensor would quantize to 0), negative, NaN/Inf and values
    beyond float32 are not ranges."""
    if amax != amax or amax in (float("inf"), float("-inf")):
        raise UsageError(f"{source}: tensor '{name}': amax {amax} is not a finite range")
    if amax <= 0:
        raise UsageError(f"{source}: tensor '{name}': amax {amax:g} is not a range (must be > 0: a zero range "
                         f"quantizes every value of the tensor to 0)")
    if amax > MAX_AMAX:
        raise UsageError(f"{source}: tensor '{name}': amax {amax:.3g} is beyond float32's largest value (3.4e38)")
    return amax


_HEADER = re.compile(r"^TRT-(\d+)-([A-Za-z0-9]+)$")
_LINE = re.compile(r"^(.*): ?([0-9a-fA-F]{8})$")


@dataclass(frozen=True)
class CacheHeader:
    version: int
    algorithm: str

    @property
    def text(self) -> str:
        return f"TRT-{self.version}-{self.algorithm}"

    @property
    def version_string(self) -> str:
        """``100300`` -> ``10.3.0``; ``8601`` -> ``8.6.1``."""
        v = self.version
        if v >= 100000:
            return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        return f"{v // 1000}.{v // 100 % 10}.{v % 100}"


def header_of(data: bytes) -> CacheHeader | None:
    """The header of a cache given as bytes (its first line), or None when it has none."""
    first = data.split(b"\n", 1)[0].decode(errors="replace").strip()
    m = _HEADER.match(first)
    return CacheHeader(int(m.group(1)), m.group(2)) if m else None


def with_header(data: bytes, header: CacheHeader) -> bytes:
    """The cache ``data`` with its first line replaced by ``header`` (the ranges untouched)."""
    rest = data[data.index(b"\n"):] if b"\n" in data else b""
    return header.text.encode() + rest


_TRT_VERSION = "the TensorRT version"


def trt_version_int(version: str | int) -> int:
    """``"10.13.0"`` -> 101300, ``"8.6.1"`` -> 8601; an int (or digit string) passes through."""
    if isinstance(version, int):
        return version
    text = str(version).strip()
    if text.isdigit() and int(text) >= 1000:  # already encoded (8601, 101300)
        return int(text)
    parts = text.split(".")
    if not 2 <= len(parts) <= 4 or not all(p.isdigit() for p in parts):
        raise OptionError("trt_version", f"'{version}': expected MAJOR.MINOR.PATCH, e.g. 10.13.0", concept=_TRT_VERSION)
    major, minor = int(parts[0]), int(parts[1])
    patch = int(parts[2]) if len(parts) > 2 else 0
    if minor > 99 or patch > 99:
        raise OptionError("trt_version", f"'{version}': minor and patch must be below 100", concept=_TRT_VERSION)
    if major >= 10:
        return major * 10000 + minor * 100 + patch
    if minor > 9:
        raise OptionError("trt_version", f"'{version}': TensorRT {major}.x minor versions are below 10", concept=_TRT_VERSION)
    return major * 1000 + minor * 100 + patch


def encode_scale(scale: float) -> str:
    """Big-endian float32 bits of ``scale`` as 8 lowercase hex digits."""
    return struct.pack(">f", scale).hex()


def decode_scale(hex_digits: str) -> float:
    return float(struct.unpack(">f", bytes.fromhex(hex_digits))[0])


def scale_of(amax: float) -> float:
    """``amax / 127`` as the float32 TensorRT stores, floored at :data:`MIN_SCALE`."""
    s = float(struct.unpack(">f", struct.pack(">f", float(amax) / QMAX))[0])
    return max(s, MIN_SCALE)


def format_cache(scales: Mapping[str, float], trt_version: str | int = DEFAULT_TRT_VERSION,
                 algorithm: str = DEFAULT_ALGORITHM) -> str:
    """The cache text for ``{tensor name: scale}`` (scales, not amax)."""
    if algorithm not in ALGORITHMS:
        raise UsageError(f"cache algorithm '{algorithm}' is not one of {', '.join(ALGORITHMS)}")
    lines = [CacheHeader(trt_version_int(trt_version), algorithm).text]
    for name, scale in scales.items():
        if "\n" in name:
            raise UsageError(f"tensor name {name!r} cannot be written to a calibration cache (newline)")
        if not scale > 0 or scale != scale or scale == float("inf"):
            raise UsageError(f"tensor '{name}': scale {scale!r} cannot be written to a calibration cache")
        lines.append(f"{name}: {encode_scale(scale)}")
    return "\n".join(lines) + "\n"


def parse_cache(text: str, source: str = "calibration cache") -> tuple[CacheHeader, dict[str, float]]:
    lines = [line.rstrip("\r") for line in text.splitlines()]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"{source}: empty calibration cache")
    m = _HEADER.match(lines[0].strip())
    if not m:
        raise UsageError(f"{source}: line 1 is not a TensorRT cache header 'TRT-<version>-<Algorithm>': {lines[0][:80]!r}")
    header = CacheHeader(int(m.group(1)), m.group(2))
    scales: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        lm = _LINE.match(line)
        if not lm:
            raise UsageError(f"{source}: line {number} is not 'name: hhhhhhhh': {line[:80]!r}")
        name = lm.group(1)
        if name in scales:
            raise UsageError(f"{source}: line {number}: tensor '{name}' is listed twice")
        scales[name] = decode_scale(lm.group(2))
        check_range(name, scales[name] * QMAX, f"{source}: line {number}")
    return header, scales


def write_cache(path: str | Path, ranges: Mapping[str, float], trt_version: str | int = DEFAULT_TRT_VERSION,
                algorithm: str = DEFAULT_ALGORITHM) -> Path:
    """Write ``{tensor name: amax}`` (e.g. a :class:`~trtrepo.calibrate.Ranges`) as a TensorRT
    calibration cache, atomically."""
    scales = {name: scale_of(amax) for name, amax in ranges.items()}
    return atomic_write_text(path, format_cache(scales, trt_version, algorithm))


def read_cache(path: str | Path) -> tuple[CacheHeader, dict[str, float]]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: calibration cache not found")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p}: cannot read calibration cache ({exc})") from exc
    return parse_cache(text, source=str(p))


def format_dynamic_range(ranges: Mapping[str, float]) -> str:
    lines = []
    for name, amax in ranges.items():
        if ":" in name or "\n" in name:
            raise UsageError(f"tensor name {name!r} cannot be written to a dynamic-range file (':' or newline)")
        lines.append(f"{name}:{float(amax)!r}")
    return "\n".join(lines) + "\n"


def write_dynamic_range(path: str | Path, ranges: Mapping[str, float]) -> Path:
    """sampleINT8API's per-tensor file: ``name:amax`` lines (shortest exact float text)."""
    return atomic_write_text(path, format_dynamic_range(ranges))


def read_dynamic_range(path: str | Path) -> dict[str, float]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: dynamic-range file not found")
    out: dict[str, float] = {}
    for number, line in enumerate(p.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")
        try:
            amax = float(value)
        except ValueError:
            amax = float("nan")
        if not sep or not name or amax != amax:
            raise UsageError(f"{p}: line {number} is not 'name:amax': {line[:80]!r}")
        out[name] = check_range(name, amax, f"{p}: line {number}")
    return out


def check_names(names: Iterable[str], expected: Iterable[str], known: Iterable[str] | None = None,
                source: str = "calibration cache", limit: int = 5) -> None:
    """Refuse a cache that does not match the model: every ``expected`` tensor must be listed,
    and every listed name must be a tensor of the model (``known``, default ``expected``;
    TensorRT-internal ``(Unnamed Layer* ...)`` names are tolerated)."""
    names = list(names)
    expected = list(expected)
    known_set = set(known) if known is not None else set(expected)
    listed = set(names)
    missing = [n for n in expected if n not in listed]
    unknown = [n for n in names if n not in known_set and not n.startswith("(Unnamed Layer")]
    if not missing and not unknown:
        return

    def show(items: list[str]) -> str:
        more = f" and {len(items) - limit} more" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    parts = []
    if missing:
        parts.append(f"{len(missing)} model tensor(s) missing from it: {show(missing)}")
    if unknown:
        parts.append(f"{len(unknown)} name(s) not in the model: {show(unknown)}")
    raise OptionError("", f"{source} does not match the model ({'; '.join(parts)}); use {{recalibrate}} to rebuild it",
                      others={"recalibrate": "recalibrate=True"})
