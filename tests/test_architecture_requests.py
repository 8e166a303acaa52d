"""Issue 42 items 1-3, enforced on the source: the Q/DQ target is passed as its record (names are
looked up once, at the registry or the CLI edge), one place checks 7-bit weights, and the INT8
request has one declaration (no flat copy of its fields in ``DeployOptions``)."""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "trtrepo/qdq/options.py"


@functools.cache
def _library() -> list[tuple[str, ast.Module, str]]:
    """(path, tree, text) of each library file (outside trtrepo/commands and cli.py), parsed once per process."""
    out = []
    for path in sorted((ROOT / "trtrepo").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("trtrepo/commands/") or rel == "trtrepo/cli.py":
            continue
        text = path.read_text()
        out.append((rel, ast.parse(text), text))
    return out


@functools.cache
def raise_segments() -> list[tuple[str, int, str]]:
    """(path, line, source text) of each library ``raise`` statement. The text is sliced from the
    file's lines by the node's offsets (UTF-8 bytes), as ``ast.get_source_segment`` does, without
    its split of the whole file at every call (12 s for the 700 raises on the 2-core machine)."""
    out = []
    for rel, tree, text in _library():
        lines = [line.encode() for line in text.splitlines(keepends=True)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.end_lineno is not None and node.end_col_offset is not None:
                first, last = node.lineno - 1, node.end_lineno - 1
                if first == last:
                    seg = lines[first][node.col_offset:node.end_col_offset]
                else:
                    seg = lines[first][node.col_offset:] + b"".join(lines[first + 1:last]) + lines[last][:node.end_col_offset]
                out.append((rel, node.lineno, seg.decode()))
    return out


@pytest.mark.parametrize("rel", [REGISTRY, "trtrepo/objectstore.py"])  # the second holds non-ASCII text
def test_raise_segments_are_the_source_segments(rel: str) -> None:
    tree, text = next((t, x) for r, t, x in _library() if r == rel)
    expected = [(rel, n.lineno, ast.get_source_segment(text, n)) for n in ast.walk(tree) if isinstance(n, ast.Raise)]
    assert expected and [s for s in raise_segments() if s[0] == rel] == expected


def test_no_target_name_lookup_outside_the_registry_and_the_cli_edge():
    found = []
    for rel, tree, _text in _library():
        if rel == REGISTRY:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "qdq_target":
                found.append(f"{rel}:{node.lineno} qdq_target()")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "QDQ_TARGETS":
                found.append(f"{rel}:{node.lineno} QDQ_TARGETS.get()")
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "QDQ_TARGETS":
                found.append(f"{rel}:{node.lineno} QDQ_TARGETS[...]")
    assert found == []


def test_one_place_checks_reduce_range():
    checks = [f"{rel}:{line}" for rel, line, seg in raise_segments() if "reduce_range" in seg]
    assert checks and all(c.startswith(REGISTRY) for c in checks) and len(checks) == 1, checks


def test_deploy_options_hold_the_composed_request_not_its_fields():
    from trtrepo.data import DataOptions
    from trtrepo.deploy import DeployOptions
    from trtrepo.qdq import QuantizeOptions
    from trtrepo.quantize import QuantizeSettings

    deploy = {f.name for f in dataclasses.fields(DeployOptions)}
    request = ({f.name for f in dataclasses.fields(QuantizeSettings)} | {f.name for f in dataclasses.fields(QuantizeOptions)}
               | {f.name for f in dataclasses.fields(DataOptions)})
    assert {"data", "int8"} <= deploy
    assert deploy & request == set(), deploy & request
