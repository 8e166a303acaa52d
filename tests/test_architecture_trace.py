"""Issue 42: traced from the CLI, the Q/DQ target and the calibration method each pass through at
most 8 files, one way.

The trace is taken at run time, not read from the source: the real CLI runs ``quantize`` and
``deploy`` on the demo under ``sys.settrace``, and every call into a trtrepo function that
receives the value, as an argument or inside one (a field of a field of the composed request,
three dataclass levels deep: ``QuantizeRequest.int8.placement.target``), is an edge from the
nearest trtrepo caller's file to the callee's. The value: the ``QdqTarget`` record (parsed once
at the edge; the library never sees its name) and the calibration method (its registry record,
or its name where the request carries it).

- **One way**: the graph of files is acyclic: no file hands the value back to a file it came from.
- **At most 8 files** on the longest chain from the CLI (``cli.py`` counted as the first file)
  to where the value acts.
- The files that handle the value at all (the chains' union) stay within :data:`MAX_FILES` (no
  growth; measured 12-14): beside the chain, the request's own records (``quantize/settings.py``,
  ``qdq/options.py``), the registry (``plugins.py``), the reports and progress labels that name
  the value.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import trtrepo
from trtrepo import rangemath
from trtrepo.cli import cli
from trtrepo.qdq import QDQ_TARGETS

# traces a quantize and a deploy of the demo (about 12 s): the README command's 6-minute budget; .ci/run runs the long tier
pytestmark = pytest.mark.long

ROOT = Path(trtrepo.__file__).resolve().parent
MAX_CHAIN = 8
MAX_FILES = 14  # measured 12-14 with cli.py: beside the chain, the request's own records, the registry, the reports and progress labels


def _holds(value: Any, wanted: Any, name: str | None, depth: int = 3) -> bool:
    if value is wanted or (name is not None and isinstance(value, str) and value == name):
        return True
    if depth and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_holds(getattr(value, f.name, None), wanted, name, depth - 1) for f in dataclasses.fields(value))
    return False


def _rel(filename: str) -> str | None:
    path = Path(filename)
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else None


def _trace(args: list[str], wanted: Any, name: str | None = None) -> dict[str, set[str]]:
    """Caller file -> callee files of every call into trtrepo that receives ``wanted``."""
    edges: dict[str, set[str]] = defaultdict(set)

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return None
        callee = _rel(frame.f_code.co_filename)
        if callee is None:
            return None
        code = frame.f_code
        n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
        if not any(_holds(frame.f_locals.get(v), wanted, name) for v in code.co_varnames[:n]):
            return None
        caller = frame.f_back
        while caller is not None and _rel(caller.f_code.co_filename) is None:
            caller = caller.f_back
        source = _rel(caller.f_code.co_filename) if caller is not None else None
        if source is not None and source != callee:
            edges[source].add(callee)
        return None

    runner = CliRunner()
    sys.settrace(tracer)
    try:
        result = runner.invoke(cli, args, catch_exceptions=False)
    finally:
        sys.settrace(None)
    assert result.exit_code == 0, result.output
    return dict(edges)


def _cycle(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return []


def _longest_chain(edges: dict[str, set[str]]) -> list[str]:
    @functools.cache
    def from_(node: str) -> tuple[str, ...]:
        tails = [from_(n) for n in sorted(edges.get(node, ()))]
        return (node, *max(tails, key=len, default=()))

    starts = set(edges) - {n for callees in edges.values() for n in callees}
    chain = max((from_(s) for s in sorted(starts)), key=len, default=())
    return ["cli.py", *(f for f in chain if f != "cli.py")]


def _files(edges: dict[str, set[str]]) -> set[str]:
    return set(edges) | {n for callees in edges.values() for n in callees}


def _all_traces(demo_onnx: Path, tmp: Path) -> dict[str, dict[str, set[str]]]:
    """The four traces: (quantize, deploy) x (target, method), the commands writing under ``tmp``."""
    common = ["--data", "demo:calib", "--limit", "64", "--method", "minmax", "--weight-rounding", "nearest"]
    quantize = ["quantize", str(demo_onnx), "--target", "tensorrt", "-o", str(tmp / "q.onnx"), "--no-progress", *common]
    deploy = ["deploy", str(demo_onnx), "--backend", "onnxruntime", "--name", "d", "--repo", str(tmp / "repo"),
              "--workdir", str(tmp / "work"), *common]
    method = rangemath.METHODS["minmax"]
    return {"quantize target": _trace(quantize, QDQ_TARGETS["tensorrt"]),
            "quantize method": _trace(quantize, method, "minmax"),
            "deploy target": _trace(deploy, QDQ_TARGETS["onnxruntime"]),
            "deploy method": _trace(deploy, method, "minmax")}


@pytest.fixture(scope="module")
def traces(demo_onnx, tmp_path_factory) -> dict[str, dict[str, set[str]]]:
    return _all_traces(demo_onnx, tmp_path_factory.mktemp("trace"))


def test_the_trace_sees_the_value_reach_where_it_acts(traces):
    """The trace is not empty by accident: the target reaches the placement rules, the method the range arithmetic."""
    for run in ("quantize", "deploy"):
        assert "qdq/rules.py" in _files(traces[f"{run} target"])
        assert "rangemath.py" in _files(traces[f"{run} method"])
    assert _cycle({"a.py": {"b.py"}, "b.py": {"a.py"}}) == ["a.py", "b.py", "a.py"]  # the check itself finds a cycle


@pytest.mark.parametrize("which", ["quantize target", "quantize method", "deploy target", "deploy method"])
def test_the_target_and_the_method_pass_one_way_through_at_most_8_files(traces, which):
    edges = traces[which]
    assert _cycle(edges) == [], f"{which} returns to a file it left: {' -> '.join(_cycle(edges))}"
    chain = _longest_chain(edges)
    assert len(chain) <= MAX_CHAIN, f"{which}: {' -> '.join(chain)}"
    assert len(_files(edges) | {"cli.py"}) <= MAX_FILES, sorted(_files(edges))


if __name__ == "__main__":  # print the chains: python tests/test_architecture_trace.py DEMO.onnx
    import tempfile

    for which, edges in _all_traces(Path(sys.argv[1]), Path(tempfile.mkdtemp(prefix="trace"))).items():
        print(f"{which}: chain {' -> '.join(_longest_chain(edges))}; {len(_files(edges) | {'cli.py'})} files")
