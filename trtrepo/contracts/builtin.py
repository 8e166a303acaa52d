"""Models that ship with trtrepo (``demo``, ``demo-text``) as plug-in sources.

The stages (``export``, ``data``, ``deploy``) know a built-in model only through a
:class:`BuiltinModel` record found by name here; they never import the plug-in's module, which
is imported by name on first use (so the plug-in may import the stages it needs, e.g.
``trtrepo.export.InputShape``, without an import cycle). A new built-in model is one module
defining ``BUILTIN = BuiltinModel(...)`` and one ``trtrepo.builtin_models`` entry point naming it
(``NAME = "package.module:BUILTIN"``, see :mod:`trtrepo.plugins`): the entry points' names are
the built-in names, and a model's module is imported only when the model is used.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..plugins import BUILTIN_MODELS, PluginError, describe, entry_points, load


@dataclass(frozen=True)
class BuiltinModel:
    """What the stages need to know about a built-in model.

    ``build_model()``: the torch module in eval mode with its weights; ``inputs()``: export's
    ``InputShape`` list (per-sample shapes); ``open_data(split)``: a ``DataSource`` of a split
    (``NAME:SPLIT`` data specs); ``calib_split``: the split ``deploy`` calibrates on;
    ``class_labels``: Triton's label file lines, or None; ``preprocess()``: the ``Preprocess``
    spec of raw images (None: no image input)."""

    name: str
    build_model: Callable[[], Any]
    inputs: Callable[[], list[Any]]
    output_names: tuple[str, ...]
    open_data: Callable[[str], Any]
    default_split: str = "val"
    calib_split: str = "calib"
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    class_labels: tuple[str, ...] | None = None
    preprocess: Callable[[], Any] | None = None

    @property
    def calib_spec(self) -> str:
        return f"{self.name}:{self.calib_split}"


# trtrepo's own built-in models, declared here as well as in pyproject.toml (a test checks the two
# agree), so they are there whatever the installed metadata says (:mod:`trtrepo.plugins`).
OWN = {"demo": "trtrepo.demo:BUILTIN", "demo-text": "trtrepo.demo.text:BUILTIN"}


@functools.lru_cache(maxsize=1)
def declared() -> dict[str, Any]:
    """name -> entry point: trtrepo's own (:data:`OWN`), then the installed ones."""
    from importlib.metadata import EntryPoint  # noqa: PLC0415  # deferred: the entry points are read on first use, not when this module is imported (it is on --help)

    out: dict[str, Any] = {name: EntryPoint(name, value, BUILTIN_MODELS) for name, value in OWN.items()}
    for ep in entry_points(BUILTIN_MODELS):
        if ep.name in out and out[ep.name].value != ep.value:
            raise PluginError(f"plug-in {describe(ep)}: built-in model '{ep.name}' is already declared "
                              f"({out[ep.name].value})")
        out.setdefault(ep.name, ep)
    return out


def names() -> tuple[str, ...]:
    """The built-in model names (nothing is imported)."""
    return tuple(declared())


def module_of(name: str) -> str | None:
    """The module that defines built-in model ``name`` (None: no such model)."""
    ep = declared().get(name)
    return ep.value.partition(":")[0] if ep is not None else None


@functools.cache
def builtin(name: str) -> BuiltinModel | None:
    """The built-in model called ``name``, or None when there is none (its module imported now)."""
    ep = declared().get(name)
    return load(ep, BuiltinModel) if ep is not None else None


def data_spec(spec: str) -> tuple[BuiltinModel, str] | None:
    """(model, split) for a built-in data spec ``NAME`` or ``NAME:SPLIT``, else None."""
    name, sep, split = spec.partition(":")
    plugin = builtin(name)
    if plugin is None:
        return None
    return plugin, (split if sep else plugin.default_split)
