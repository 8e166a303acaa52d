"""Registries that plug-ins extend through Python entry points.

Six groups, one per kind of plug-in; an entry point's name is the record's name and its value
(``module:attribute``) is the record itself:

* ``trtrepo.calibration_methods``: a :class:`trtrepo.rangemath.CalibrationMethod`;
* ``trtrepo.backends``: a :class:`trtrepo.contracts.backends.BackendSpec` (its template ships in
  the plug-in's package, beside the module, or comes with ``--template-dir``);
* ``trtrepo.qdq_targets``: a :class:`trtrepo.qdq.QdqTarget`;
* ``trtrepo.builtin_models``: a :class:`trtrepo.contracts.builtin.BuiltinModel` (loaded only when
  the model is used: its name is the entry point's);
* ``trtrepo.data_sources``: a :class:`trtrepo.data.DataSourceKind` (a kind of ``--data`` spec);
* ``trtrepo.model_sources``: a :class:`trtrepo.modelsource.ModelSourceKind` (a kind of model
  ``SOURCE``).

trtrepo declares its own records the same way (``pyproject.toml``,
``[project.entry-points."trtrepo.*"]``), and the module owning each registry also registers (or,
for built-in models, declares) its own records when imported, so they are there whatever the
installed metadata says (an editable install made before the declarations existed, or a stale
``trtrepo.egg-info`` in the working directory, which shadows the installed metadata); loading the
entry point of a record that is already registered is a no-op. A registry reads the entry points
once, the first time it is read (not when it is imported), so a plug-in module may import the
registry it extends.

A plug-in that fails to load or holds the wrong kind of record is a :class:`PluginError`: one
line naming the entry point and its distribution.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from .errors import TrtrepoError

GROUP_PREFIX = "trtrepo."
CALIBRATION_METHODS = "trtrepo.calibration_methods"
BACKENDS = "trtrepo.backends"
QDQ_TARGETS = "trtrepo.qdq_targets"
BUILTIN_MODELS = "trtrepo.builtin_models"
DATA_SOURCES = "trtrepo.data_sources"
MODEL_SOURCES = "trtrepo.model_sources"
GROUPS = (CALIBRATION_METHODS, BACKENDS, QDQ_TARGETS, BUILTIN_MODELS, DATA_SOURCES, MODEL_SOURCES)

T = TypeVar("T")


class PluginError(TrtrepoError):
    """A plug-in's entry point that cannot be loaded or holds the wrong record."""


@functools.lru_cache(maxsize=1)
def _all_entry_points() -> Any:
    from importlib.metadata import entry_points  # noqa: PLC0415  # deferred: a registry reads the entry points on its first read, not when this module is imported

    return entry_points()


def entry_points(group: str) -> list[Any]:
    """The installed entry points of ``group``, in the order the metadata lists them (read once per
    process: scanning the installed distributions is the slow part)."""
    return list(_all_entry_points().select(group=group))


def describe(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    where = f" (from {dist.name} {dist.version})" if dist is not None else ""
    return f"entry point '{ep.name} = {ep.value}' in group {ep.group}{where}"


def load(ep: Any, record_type: type[T]) -> T:
    """The record an entry point names, checked to be a ``record_type`` named like the entry point."""
    try:
        obj = ep.load()
    except Exception as exc:  # a plug-in's import error of any kind: one line, not its traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PluginError(f"plug-in {describe(ep)} failed to load: {type(exc).__name__}: {first}") from exc
    if not isinstance(obj, record_type):
        raise PluginError(f"plug-in {describe(ep)} names an object of type {type(obj).__name__}, "
                          f"not a {record_type.__name__}")
    name = getattr(obj, "name", None)
    if name is not None and name != ep.name:
        raise PluginError(f"plug-in {describe(ep)} holds a {record_type.__name__} named {name!r}, not {ep.name!r}")
    return obj


class Registry(Mapping[str, T], Generic[T]):
    """Records by name, in registration order: the owner's built-ins (registered when the owning
    module is imported), then the group's entry points, read on the first read of the registry.

    ``register`` checks ``check(registry, record)`` (raising ``ValueError``) and refuses a second
    record under a taken name; registering the same object again is a no-op."""

    def __init__(self, group: str, what: str, record_type: type[T], key: Callable[[T], str],
                 check: Callable[[Mapping[str, T], T], None] | None = None) -> None:
        self.group, self.what, self.record_type, self.key, self.check = group, what, record_type, key, check
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, record: T) -> T:
        if not isinstance(record, self.record_type):
            raise TypeError(f"{self.what}: expected a {self.record_type.__name__}, got {type(record).__name__}")
        name = self.key(record)
        if self._items.get(name) is record:
            return record
        if name in self._items:
            raise ValueError(f"{self.what} '{name}' is already registered")
        if self.check is not None:
            self.check(self._items, record)
        self._items[name] = record
        return record

    def discover(self) -> None:
        """Register the group's entry points (once)."""
        if self._discovered:
            return
        self._discovered = True  # before loading: a plug-in module may read the registry it extends
        for ep in entry_points(self.group):
            record = load(ep, self.record_type)
            try:
                self.register(record)
            except (ValueError, TypeError) as exc:
                raise PluginError(f"plug-in {describe(ep)}: {exc}") from exc

    def __getitem__(self, name: str) -> T:
        self.discover()
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        self.discover()
        return iter(self._items)

    def __len__(self) -> int:
        self.discover()
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._items

    def __repr__(self) -> str:
        return f"Registry({self.group!r}, {list(self._items)!r})"
