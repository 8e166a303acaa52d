"""Issue 42 items 1-3, enforced on the source: the Q/DQ target is passed as its record (names are
looked up once, at the registry or the CLI edge), one place checks 7-bit weights, and the INT8
request has one declaration (no flat copy of its fields in ``DeployOptions``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "trtrepo/qdq/options.py"


def _library() -> list[tuple[str, ast.Module, str]]:
    out = []
    for path in sorted((ROOT / "trtrepo").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("trtrepo/commands/") or rel == "trtrepo/cli.py":
            continue
        text = path.read_text()
        out.append((rel, ast.parse(text), text))
    return out


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
    checks = [f"{rel}:{node.lineno}" for rel, tree, text in _library() for node in ast.walk(tree)
              if isinstance(node, ast.Raise) and "reduce_range" in (ast.get_source_segment(text, node) or "")]
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
