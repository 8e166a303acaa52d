"""The package's layering (issue 14): the import-linter contracts in pyproject.toml hold, they
catch an upward import when one is added, and the import graph has no cycle. Issue 29: imports
sit at module top except the few deferred ones, each with its reason, and no library function
takes more than 10 parameters."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint_imports() -> str:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    return exe


def _run(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_lint_imports(), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"})


def test_import_contracts_hold() -> None:
    proc = _run(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    # a stage reaching up to the orchestration layer
    ("data.py", "def _up():\n    from . import deploy\n", "cli -> commands"),
    # a core stage importing the demo plug-in instead of going through contracts.builtin
    ("export.py", "def _demo():\n    from . import demo\n", "built-in models only through"),
    # the pure algorithms importing a stage
    ("rangemath.py", "def _io():\n    from . import calibrate\n", "cli -> commands"),
    # a stage importing one above it in the stages' order (export is a leaf; validate.reference uses it)
    ("export.py", "def _ref():\n    from .validate import reference\n", "cli -> commands"),
])
def test_contracts_catch_an_upward_import(tmp_path: Path, module: str, line: str, contract: str) -> None:
    shutil.copytree(ROOT / "trtrepo", tmp_path / "trtrepo", ignore=shutil.ignore_patterns("__pycache__", "*.pt", "*.npz"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "trtrepo" / module
    target.write_text(target.read_text() + "\n\n" + line)
    proc = _run(tmp_path)
    assert proc.returncode != 0, proc.stdout[-3000:]
    broken = [ln for ln in proc.stdout.splitlines() if ln.rstrip().endswith("BROKEN")]
    assert any(contract in ln for ln in broken) or contract in proc.stdout.split("BROKEN")[0], proc.stdout[-3000:]


def test_import_graph_has_no_cycle() -> None:
    """Deferred (function-level) imports count too: a cycle that works only through a deferred
    import is still a cycle."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("trtrepo")
    modules = sorted(m for m in graph.modules if m.startswith("trtrepo"))
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.find_modules_directly_imported_by(m)):
            if not n.startswith("trtrepo") or n == "trtrepo":
                continue  # the package root (its __version__) imports nothing of the package
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in modules:
        if m not in state:
            visit(m)
    assert cycles == [], cycles


def test_no_package_folder_is_named_like_build_output() -> None:
    """Issue 29: tools skip folders named build/ (code viewers, many .gitignore templates), so no
    package folder inside trtrepo/ carries that name; the build stage lives in trtrepo/engine/."""
    root = Path(__file__).resolve().parents[1] / "trtrepo"
    named = [p for p in root.rglob("*") if p.is_dir() and p.name in ("build", "dist") and (p / "__init__.py").exists()]
    assert named == [] and (root / "engine" / "__init__.py").is_file(), named


def test_every_subpackage_is_listed_for_the_wheel() -> None:
    """pyproject's explicit package list names every folder of trtrepo/ that holds an __init__.py:
    a regular (non-editable) install leaves out any that it misses."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"]) - set(setuptools.get("package-dir", {}))  # trtrepo.templates lives in templates/
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "trtrepo").rglob("__init__.py")}
    assert found == listed, (sorted(found - listed), sorted(listed - found))


MAX_DEFERRED = 40  # function-level imports of trtrepo modules (issue 29)
MAX_PARAMETERS = 10  # of a library function, self/cls excluded (issue 29)


def _is_internal(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "trtrepo"
    return any(a.name.split(".")[0] == "trtrepo" for a in node.names)


def _deferred_imports(package: Path, heavy: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(function-level imports of trtrepo modules, those of them without their reason, other
    function-level imports of modules not listed in ``heavy`` and without their reason), as
    ``path:line`` under ``package``."""
    internal, unexplained, other = [], [], []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        seen: set[int] = set()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                    continue
                seen.add(id(node))
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                explained = "# noqa: PLC0415  # deferred: " in lines[node.lineno - 1]
                if _is_internal(node):
                    internal.append(where)
                    if not explained:
                        unexplained.append(where)
                    continue
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                if not explained and not all(any(n == h or n.startswith(h + ".") for h in heavy) for n in names):
                    other.append(f"{where}: {', '.join(names)}")
    return internal, unexplained, other


def _long_signatures(package: Path) -> list[str]:
    """Functions with more than MAX_PARAMETERS parameters (self/cls excluded), click commands
    (decorated functions of commands/ and cli.py) aside."""
    too_many = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if (rel.parts[0] == "commands" or rel.name == "cli.py") and fn.decorator_list:
                continue
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            if params and params[0].arg in ("self", "cls"):
                params = params[1:]
            if len(params) > MAX_PARAMETERS:
                too_many.append(f"{rel}:{fn.lineno} {fn.name} ({len(params)})")
    return too_many


def _heavy_modules() -> set[str]:
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "PLC0415" in lint["select"] and "TID253" in lint["select"]  # ruff keeps the rest at module top
    return set(lint["flake8-tidy-imports"]["banned-module-level-imports"])


def test_deferred_imports_are_few_and_give_their_reason() -> None:
    """A trtrepo module imported inside a function says why on its line (``# noqa: PLC0415  #
    deferred: <reason>``), and there are at most MAX_DEFERRED of them; any other function-level
    import is of a module that ruff's banned-module-level-imports lists (optional or slow to
    import: never imported at module level) or gives its reason the same way."""
    internal, unexplained, other = _deferred_imports(ROOT / "trtrepo", _heavy_modules())
    assert unexplained == [], f"deferred trtrepo imports without '# noqa: PLC0415  # deferred: <reason>': {unexplained}"
    assert len(internal) <= MAX_DEFERRED, f"{len(internal)} deferred trtrepo imports (at most {MAX_DEFERRED}): {internal}"
    assert other == [], f"function-level imports of modules that belong at module top: {other}"


def test_no_library_function_takes_more_than_ten_parameters() -> None:
    """Parameters that belong together travel as one frozen dataclass (DataOptions, QuantizeRequest,
    ExportCheck, ...); click commands are exempt, their options are what builds those objects."""
    assert _long_signatures(ROOT / "trtrepo") == []


def test_the_import_and_signature_checks_catch_a_violation(tmp_path: Path) -> None:
    """Written into a copy of the package, an unexplained deferred import, a deferred import of a
    light module and an 11-parameter function are each reported; an explained one is not."""
    package = tmp_path / "trtrepo"
    shutil.copytree(ROOT / "trtrepo", package, ignore=shutil.ignore_patterns("__pycache__", "*.pt", "*.npz"))
    target = package / "rangemath.py"
    target.write_text(target.read_text() + (
        "\n\ndef _bad(a, b, c, d, e, f, g, h, i, j, k):\n"
        "    from .errors import UsageError\n"
        "    from .fsutil import temp_dir  # noqa: PLC0415  # deferred: a reason\n"
        "    import json\n"
        "    import csv  # noqa: PLC0415  # deferred: a reason\n"
        "    return UsageError, temp_dir, json, csv\n"))
    internal, unexplained, other = _deferred_imports(package, _heavy_modules())
    n = len(target.read_text().splitlines())
    assert {f"trtrepo/rangemath.py:{n - 4}", f"trtrepo/rangemath.py:{n - 3}"} <= set(internal)
    assert unexplained == [f"trtrepo/rangemath.py:{n - 4}"]
    assert other == [f"trtrepo/rangemath.py:{n - 2}: json"]
    assert _long_signatures(package) == [f"rangemath.py:{n - 5} _bad (11)"]
