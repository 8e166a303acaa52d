"""The package's layering (issue 14): the import-linter contracts in pyproject.toml hold, they
catch an upward import when one is added, and the import graph has no cycle."""

from __future__ import annotations

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
    ("histogram.py", "def _io():\n    from . import calibrate\n", "cli -> commands"),
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
