"""Issue 42 item 5: facades export only the public API. No module of trtrepo/ imports another
module's ``_private`` name (a helper shared across modules drops its underscore or moves), and no
package facade (``trtrepo/*/__init__.py``) imports or lists in ``__all__`` a ``_private`` name.
Importing a private *module* (``commands/_options.py``) is allowed: the rule is about names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trtrepo"


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_module(path: Path, node: ast.ImportFrom, name: str) -> bool:
    """``from . import _options``: the name is a private module of the package, not a helper."""
    if node.level == 0 or node.module:
        return False
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    return (base / f"{name}.py").exists() or (base / name / "__init__.py").exists()


def private_imports(path: Path, source: str) -> list[str]:
    """``file:line: name`` for each ``from <trtrepo module> import _name`` in ``source``."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0 and not (node.module or "").startswith("trtrepo"):
            continue  # a third-party module's private name is that library's business
        hits += [f"{path}:{node.lineno}: {a.name}" for a in node.names
                 if _private(a.name) and not _is_module(path, node, a.name)]
    return hits


def private_exports(path: Path, source: str) -> list[str]:
    """``file: name`` for each ``_name`` a facade lists in ``__all__``."""
    hits = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            assert isinstance(node.value, (ast.List, ast.Tuple)), f"{path}: __all__ is not a literal list"
            hits += [f"{path}: {e.value}" for e in node.value.elts
                     if isinstance(e, ast.Constant) and isinstance(e.value, str) and _private(e.value)]
    return hits


def test_no_cross_module_private_imports() -> None:
    hits = [h for p in sorted(PACKAGE.rglob("*.py")) for h in private_imports(p, p.read_text())]
    assert hits == [], "\n".join(hits)


def test_facades_export_no_private_name() -> None:
    facades = sorted(PACKAGE.glob("*/__init__.py"))
    assert len(facades) >= 7
    hits = [h for p in facades for h in private_exports(p, p.read_text())]
    assert hits == [], "\n".join(hits)


def test_the_walk_sees_a_private_import_and_export() -> None:
    """The two walks catch what they are meant to catch (else the two tests above cannot fail)."""
    here = PACKAGE / "validate" / "stage.py"
    src = ("from .contract import _booked, compare_contract\nfrom ..errors import one_line\n"
           "from numpy import _private_thing\nfrom trtrepo.export import _import_torch\nfrom . import shm\n")
    assert private_imports(here, src) == [f"{here}:1: _booked", f"{here}:4: _import_torch"]
    assert private_imports(PACKAGE / "commands" / "deploy.py", "from . import _options\n") == []
    facade = PACKAGE / "validate" / "__init__.py"
    assert private_exports(facade, '__all__ = ["validate", "_Slot", "__version__"]\n') == [f"{facade}: _Slot"]
