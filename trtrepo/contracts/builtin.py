"""Models that ship with trtrepo (``demo``, ``demo-text``) as plug-in sources.

The stages (``export``, ``data``, ``deploy``) know a built-in model only through a
:class:`BuiltinModel` record found by name here; they never import the plug-in's module, which
is imported by name on first use (so the plug-in may import the stages it needs, e.g.
``trtrepo.export.InputShape``, without an import cycle). A new built-in model is one module
defining ``BUILTIN = BuiltinModel(...)`` and one entry in :data:`PLUGINS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# name -> module defining BUILTIN (imported on first use)
PLUGINS: dict[str, str] = {"demo": "trtrepo.demo", "demo-text": "trtrepo.demo.text"}


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


def names() -> tuple[str, ...]:
    return tuple(PLUGINS)


def builtin(name: str) -> BuiltinModel | None:
    """The built-in model called ``name``, or None when there is none."""
    module = PLUGINS.get(name)
    if module is None:
        return None
    plugin = importlib.import_module(module).BUILTIN
    if not isinstance(plugin, BuiltinModel) or plugin.name != name:
        raise TypeError(f"{module}.BUILTIN must be a BuiltinModel named {name!r}")
    return plugin


def data_spec(spec: str) -> tuple[BuiltinModel, str] | None:
    """(model, split) for a built-in data spec ``NAME`` or ``NAME:SPLIT``, else None."""
    name, sep, split = spec.partition(":")
    plugin = builtin(name)
    if plugin is None:
        return None
    return plugin, (split if sep else plugin.default_split)
