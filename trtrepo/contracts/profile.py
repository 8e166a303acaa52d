"""The batch range and the other per-input axis ranges: one owner for what ``build``, ``deploy``
and the Triton config all depend on.

:class:`BatchProfile` holds the batch range (min/opt/max) and the ``--shape`` ranges of inputs
with other dynamic axes. It is made from ``build``'s flags (:meth:`BatchProfile.for_build`),
from ``deploy``'s (:meth:`BatchProfile.for_deploy`: ``--max-batch-size`` and ``--shape``), and
completed from calibration data (:meth:`BatchProfile.with_data_shapes`); it gives TensorRT's
optimization profile (:meth:`BatchProfile.resolve`) and Triton's ``max_batch_size``.

Errors name the settings that made the profile (``origin``: ``min_batch``/``opt_batch``/``max_batch``
for ``build``, ``max_batch_size`` and ``shapes`` for ``deploy``) as :class:`~trtrepo.errors.OptionError`
placeholders, so the command line shows the running command's flags and a ``deploy`` error never
speaks of ``build``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OptionError, UsageError
from ..modelio import ModelIO, TensorSpec

log = logging.getLogger(__name__)

DEFAULT_MIN_BATCH = 1
DEFAULT_OPT_BATCH = 8
DEFAULT_MAX_BATCH = 32

# How each command names the batch range in its errors: templates of OptionError placeholders
# (the command line shows each as the running command's flag: --min-batch/--opt-batch/--max-batch).
BUILD_FLAGS = "{min_batch}/{opt_batch}/{max_batch}"
DEPLOY_FLAGS = "{max_batch_size}"
_SHAPE = "the shape range"
# what the library calls each setting a profile's errors name
_SETTINGS = {"min_batch": "the min", "opt_batch": "opt", "max_batch": "max batch", "max_batch_size": "the max batch size",
             "shapes": _SHAPE}


def parse_dims(text: str, what: str = "") -> tuple[int, ...]:
    parts = text.strip().lower().split("x")
    if not text.strip() or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"{what + ': ' if what else ''}'{text}' is not a shape like 8x64 (positive dims separated by 'x')")
    return tuple(int(p) for p in parts)


def dims_str(dims: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in dims)


@dataclass(frozen=True)
class ShapeRange:
    """min/opt/max shapes of one input in an optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        for k in ("min", "opt", "max"):
            object.__setattr__(self, k, tuple(int(d) for d in getattr(self, k)))
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise UsageError(f"shape range {self.describe()}: min, opt and max must have the same rank")
        for axis, (a, b, c) in enumerate(zip(self.min, self.opt, self.max, strict=True)):
            if a <= 0:
                raise UsageError(f"shape range {self.describe()}: dimensions must be positive")
            if not a <= b <= c:
                raise UsageError(f"shape range {self.describe()}: axis {axis} needs min <= opt <= max ({a}, {b}, {c})")

    def describe(self) -> str:
        return f"{dims_str(self.min)},{dims_str(self.opt)},{dims_str(self.max)}"

    def axis(self, axis: int) -> tuple[int, int, int]:
        return self.min[axis], self.opt[axis], self.max[axis]

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[int]]) -> ShapeRange:
        return cls(tuple(data["min"]), tuple(data["opt"]), tuple(data["max"]))


def parse_shape_option(text: str) -> tuple[str, ShapeRange]:
    """``NAME:MIN,OPT,MAX`` with trtexec-like dims (``input_ids:1x8,8x64,32x128``); ``NAME:DIMS`` fixes one shape."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise OptionError("shapes", f"'{text}': expected NAME:MIN,OPT,MAX, e.g. input_ids:1x8,8x64,32x128", concept=_SHAPE)
    parts = dims.split(",")
    if len(parts) not in (1, 3):
        raise OptionError("shapes", f"'{text}': expected three shapes MIN,OPT,MAX (or one fixed shape)", concept=_SHAPE)
    try:
        shapes = [parse_dims(p) for p in parts]
        return name, ShapeRange(*(shapes * 3 if len(shapes) == 1 else shapes))
    except UsageError as exc:
        raise OptionError("shapes", f"'{text}': {exc.message}", concept=_SHAPE) from exc


@dataclass(frozen=True)
class BatchProfile:
    """The batch range and per-input shape ranges of one model (see the module doc).

    ``batched`` False: the model is served without a batch axis (Triton ``max_batch_size: 0``);
    any dynamic axis 0 is then an ordinary axis that ``shapes`` must range. ``origin`` names the
    batch range's settings in errors, a template of :class:`~trtrepo.errors.OptionError`
    placeholders (:data:`BUILD_FLAGS` for build, :data:`DEPLOY_FLAGS` for deploy)."""

    min_batch: int = DEFAULT_MIN_BATCH
    opt_batch: int = DEFAULT_OPT_BATCH
    max_batch: int = DEFAULT_MAX_BATCH
    shapes: tuple[tuple[str, ShapeRange], ...] = ()
    batched: bool = True
    origin: str = BUILD_FLAGS

    def __post_init__(self) -> None:
        if self.batched and not 1 <= self.min_batch <= self.opt_batch <= self.max_batch:
            raise OptionError("", f"batch range must satisfy 1 <= min <= opt <= max, got {self.min_batch}, {self.opt_batch}, "
                              f"{self.max_batch} ({self.origin})", others=_SETTINGS)
        names = [n for n, _ in self.shapes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise OptionError("shapes", f"given more than once for {', '.join(dup)}", concept=_SHAPE)

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def for_build(cls, min_batch: int = DEFAULT_MIN_BATCH, opt_batch: int = DEFAULT_OPT_BATCH,
                  max_batch: int = DEFAULT_MAX_BATCH, shapes: Iterable[str | tuple[str, ShapeRange]] = ()) -> BatchProfile:
        """``trtrepo build``: the batch range as given; each ``--shape`` repeats it on axis 0."""
        return cls(min_batch, opt_batch, max_batch, _parse_shapes(shapes), True, BUILD_FLAGS)

    @classmethod
    def for_deploy(cls, max_batch_size: int | None, shapes: Iterable[str | tuple[str, ShapeRange]] = ()) -> BatchProfile:
        """``trtrepo deploy``: ``--max-batch-size`` (Triton's) and ``--shape``.

        * neither: batch 1 / 8 / 32;
        * ``--max-batch-size N`` (N >= 1): batch 1 / min(8, N) / N;
        * ``--shape`` with a batch axis and no ``--max-batch-size``: the batch range is the
          shapes' axis 0 (every ``--shape`` must give the same one);
        * both: the shapes' axis-0 maximum must be N;
        * ``--max-batch-size 0``: no batch axis (Triton ``max_batch_size: 0``); a dynamic axis 0
          then needs its range from ``--shape`` (:meth:`resolve` says so), never a default.
        """
        parsed = _parse_shapes(shapes)
        if max_batch_size is not None and max_batch_size < 0:
            raise OptionError("max_batch_size", f"{max_batch_size}: must be >= 0", others=_SETTINGS)
        if max_batch_size == 0:
            return cls(0, 0, 0, parsed, False, DEPLOY_FLAGS)
        axis0 = {name: r.axis(0) for name, r in parsed}
        if len(set(axis0.values())) > 1:
            given = "; ".join(f"{n} {','.join(map(str, v))}" for n, v in axis0.items())
            raise OptionError("shapes", f": the batch axis (axis 0) differs between inputs ({given}); one batch range "
                              f"serves the whole model", others=_SETTINGS)
        if max_batch_size is None:
            if axis0:
                lo, mid, hi = next(iter(axis0.values()))
                return cls(lo, mid, hi, parsed, True, "{shapes} (axis 0)")
            return cls(DEFAULT_MIN_BATCH, min(DEFAULT_OPT_BATCH, DEFAULT_MAX_BATCH), DEFAULT_MAX_BATCH, parsed, True,
                       DEPLOY_FLAGS)
        if axis0:
            lo, mid, hi = next(iter(axis0.values()))
            if hi != max_batch_size:
                name = next(iter(axis0))
                raise OptionError("max_batch_size", f"{max_batch_size} and {{shapes}} {name}: the shape's batch axis "
                                  f"{lo},{mid},{hi} ends at {hi}; give the same maximum (or leave {{max_batch_size}} "
                                  f"out: it follows {{shapes}})", others=_SETTINGS)
            return cls(lo, mid, hi, parsed, True, f"{{shapes}} (axis 0) and {DEPLOY_FLAGS}")
        return cls(DEFAULT_MIN_BATCH, min(DEFAULT_OPT_BATCH, max_batch_size), max_batch_size, parsed, True, DEPLOY_FLAGS)

    def with_data_shapes(self, io: ModelIO, source: Iterable[Any]) -> BatchProfile:
        """Ranges for the inputs with dynamic axes besides the batch that ``shapes`` does not
        cover: per axis the smallest, median and largest size in ``source`` (samples without a
        batch axis, ``sample.inputs[name]``); the batch axis takes the batch range."""
        given = dict(self.shapes)
        dynamic = [s for s in io.inputs if s.name not in given
                   and any(d == -1 for a, d in enumerate(s.shape) if a != s.batch_axis)]
        if not dynamic:
            return self
        sizes: dict[str, list[tuple[int, ...]]] = {s.name: [] for s in dynamic}
        for sample in source:
            for spec in dynamic:
                value = sample.inputs.get(spec.name)
                if value is not None:
                    sizes[spec.name].append(tuple(np.shape(value)))
        out = list(self.shapes)
        for spec in dynamic:
            seen = np.asarray(sizes[spec.name])
            if seen.size == 0:
                raise OptionError("", f"input '{spec.name}': the data has no values to size its dynamic axes (give "
                                  f"{{shapes}})", others=_SETTINGS)
            lo, mid, hi = [], [], []
            k = 0
            for axis, d in enumerate(spec.shape):
                if axis == spec.batch_axis and self.batched:
                    lo.append(self.min_batch)
                    mid.append(self.opt_batch)
                    hi.append(self.max_batch)
                    continue
                col = seen[:, k] if seen.ndim == 2 and k < seen.shape[1] else None
                k += 1
                if d != -1:
                    lo.append(d)
                    mid.append(d)
                    hi.append(d)
                elif col is None:
                    raise UsageError(f"input '{spec.name}': the data's samples do not match its rank {spec.rank}")
                else:
                    lo.append(int(col.min()))
                    mid.append(int(np.median(col)))
                    hi.append(int(col.max()))
            out.append((spec.name, ShapeRange(tuple(lo), tuple(mid), tuple(hi))))
        return BatchProfile(self.min_batch, self.opt_batch, self.max_batch, tuple(out), self.batched, self.origin)

    # --- what the stages read -------------------------------------------------------------
    @property
    def batch_range(self) -> tuple[int, int, int]:
        return self.min_batch, self.opt_batch, self.max_batch

    @property
    def triton_max_batch_size(self) -> int:
        """Triton's ``max_batch_size``: the batch maximum, 0 without a batch axis."""
        return self.max_batch if self.batched else 0

    def check_shapes(self, io: ModelIO) -> dict[str, ShapeRange]:
        """Every ``--shape`` names an input of ``io`` and fits its rank, its fixed dims and the
        batch range; returns the given ranges of the inputs with dynamic axes. Any backend checks
        this (a mistyped name is an error even where no engine is built)."""
        overrides = dict(self.shapes)
        unknown = [n for n in overrides if n not in io.input_names]
        if unknown:
            raise OptionError("shapes", f"names unknown input(s) {', '.join(unknown)} (inputs: {', '.join(io.input_names)})",
                              others=_SETTINGS)
        lo, mid, hi = self.batch_range
        given: dict[str, ShapeRange] = {}
        for spec in io.inputs:
            if spec.name not in overrides:
                continue
            r = overrides[spec.name]
            if len(r.min) != spec.rank:
                raise OptionError("shapes", f"{spec.name}: rank {len(r.min)} but the input has shape {list(spec.shape)}",
                                  others=_SETTINGS)
            for axis, d in enumerate(spec.shape):
                if d != -1 and not (r.min[axis] == r.opt[axis] == r.max[axis] == d):
                    raise OptionError("shapes", f"{spec.name}:{r.describe()}: axis {axis} is fixed at {d} in the model",
                                      others=_SETTINGS)
            if self.batched and spec.shape and spec.shape[0] == -1 and r.axis(0) != (lo, mid, hi):
                raise OptionError(
                    "shapes", f"{spec.name}:{r.describe()}: batch axis {r.min[0]},{r.opt[0]},{r.max[0]} differs from "
                    f"{self.origin} {lo},{mid},{hi}", others=_SETTINGS)
            if spec.dynamic_axes:
                given[spec.name] = r
        return given

    def resolve(self, io: ModelIO) -> dict[str, ShapeRange]:
        """TensorRT's optimization profile: a shape range for every input with a dynamic axis.

        A dynamic axis 0 takes the batch range (when ``batched``); every other dynamic axis needs
        a ``--shape``. A ``--shape`` must fit the input's rank and fixed dims, and on a batched
        model its axis 0 must equal the batch range (one batch range for the whole model, which
        Triton's ``max_batch_size`` follows).

        Inputs that share a symbolic axis (``input_ids`` and ``attention_mask`` both
        ``[batch, sequence]``) must get the same range on it. An input without ``--shape`` whose
        other dynamic axes are all named after axes that another input's ``--shape`` ranges
        takes those ranges (``--shape input_ids:...`` alone covers ``attention_mask``).
        """
        overrides = dict(self.shapes)
        batch_axis = 0 if self.batched else None
        given = self.check_shapes(io)
        symbols = _ranged_symbols(io, given, batch_axis)
        result: dict[str, ShapeRange] = {}
        for spec in io.inputs:
            if spec.name in given:
                result[spec.name] = given[spec.name]
            elif spec.name not in overrides and spec.dynamic_axes:
                result[spec.name] = self._range_from_symbols(spec, symbols)
        return result

    def _range_from_symbols(self, spec: TensorSpec, symbols: Mapping[str, tuple[tuple[int, int, int], str]]) -> ShapeRange:
        """An input without ``--shape``: axis 0 takes the batch range (when ``batched``), every
        other dynamic axis the range of the ``--shape`` that names its symbol. Decision: an axis
        whose symbol no ``--shape`` ranges is an error that says how to give it."""
        lo, mid, hi = self.batch_range
        batch_axis = 0 if self.batched else None
        other = [a for a in spec.dynamic_axes if a != batch_axis]
        labels = {a: spec.dim_names[a] if spec.dim_names else None for a in other}
        missing = [a for a in other if labels[a] not in symbols]
        if missing:
            raise self._no_range(spec, missing[0], labels[missing[0]])
        shapes = [list(spec.with_batch(b)) if self.batched else list(spec.shape) for b in (lo, mid, hi)]
        for a in other:
            rng, _ = symbols[labels[a]]  # type: ignore[index]
            for k in range(3):
                shapes[k][a] = rng[k]
        if other:
            log.info("input '%s': range of axes %s taken from --shape %s (shared symbolic axes)", spec.name,
                     ", ".join(f"'{labels[a]}'" for a in other),
                     ", ".join(sorted({symbols[labels[a]][1] for a in other})))  # type: ignore[index]
        return ShapeRange(*(tuple(s) for s in shapes))


    def _no_range(self, spec: TensorSpec, axis: int, label: str | None) -> OptionError:
        """The error for a dynamic axis nothing ranges: which axis, and how to give it."""
        axis_desc = f"axis {axis}" + (f" ('{label}')" if label else "")
        example = "x".join("N" if d == -1 else str(d) for d in spec.shape)
        why = (" ({max_batch_size} 0: no batch axis, so axis 0 is an ordinary axis)"
               if not self.batched and axis == 0 else "")
        return OptionError("", f"input '{spec.name}' has dynamic {axis_desc} (shape {example}) with no range{why}; "
                           f"give it with {{shapes}} {spec.name}:MIN,OPT,MAX (e.g. 1x8,8x64,32x128)", others=_SETTINGS)


def _ranged_symbols(io: ModelIO, given: Mapping[str, ShapeRange],
                    batch_axis: int | None) -> dict[str, tuple[tuple[int, int, int], str]]:
    """Symbolic axes ranged by ``--shape``: name -> ((min, opt, max), input that gave it).
    Decision: inputs that share a symbolic axis must give it the same range (one size at run time)."""
    symbols: dict[str, tuple[tuple[int, int, int], str]] = {}
    for spec in io.inputs:
        ranged = given.get(spec.name)
        if ranged is None:
            continue
        for axis in spec.dynamic_axes:
            label = spec.dim_names[axis] if spec.dim_names else None
            if axis == batch_axis or not label:
                continue
            rng = ranged.axis(axis)
            prev = symbols.setdefault(label, (rng, spec.name))
            if prev[0] != rng:
                raise OptionError(
                    "shapes", f": inputs '{prev[1]}' and '{spec.name}' share the dynamic axis '{label}' but give it "
                    f"different ranges ({','.join(map(str, prev[0]))} and {','.join(map(str, rng))}); the axis has "
                    f"one size at run time, so give both the same MIN,OPT,MAX", others=_SETTINGS)
    return symbols


def _parse_shapes(shapes: Iterable[str | tuple[str, ShapeRange]]) -> tuple[tuple[str, ShapeRange], ...]:
    return tuple(parse_shape_option(s) if isinstance(s, str) else (s[0], s[1]) for s in shapes)
