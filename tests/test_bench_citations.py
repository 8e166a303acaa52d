"""bench/ backs the figures quoted today (issue 42 item 8), checked both ways on the files themselves.

- Every Python file under bench/ is named by its path in docs/benchmarks.md, so a reader finds the
  figure a script writes (and a script that writes none has no place in the tree).
- Every ``## `` section of docs/benchmarks.md (with its subsections) that holds a table of figures names where they come from: a
  bench script, a script under scripts/, the CI run, a test, a ``trtrepo`` command, or "script
  removed; see COMMIT:PATH" for a historic figure whose script has left the tree.
- A bench script named in docs/benchmarks.md exists, unless its section carries that marker.
- The levers measured and not kept are one table in docs/quantization.md, "Measured and not kept",
  each row with the commit that measured it; every ``COMMIT:PATH`` in either file resolves in git
  (where the checkout has its history), so ``git show COMMIT:PATH`` brings the removed file back.
- bench/ stays small: at most BENCH_LINES (3,000, the issue's target) lines of Python. The trained-model
  gauntlet is one script with its two model files (bench/gauntlet/); the scripts of demo-only and
  random-weight figures and the one-off runs of closed issues left with issue 42 (docs/benchmarks.md,
  "Current figures of earlier issues whose scripts left the tree").
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
QUANTIZATION = ROOT / "docs" / "quantization.md"
BENCH_LINES = 3000

SECTION = re.compile(r"(?m)^(?=##+ )")  # a section or subsection
PART = re.compile(r"(?m)^(?=## )")  # a section with its subsections
TABLE_RULE = re.compile(r"(?m)^\|[-|: ]+\|$")
SOURCE = re.compile(r"bench/[\w/]+\.py|scripts/\w+\.sh|\.ci/run|`trtrepo |python -m pytest|tests/test_\w+\.py"
                    r"|script removed; see [0-9a-f]{7,40}:")
REMOVED = re.compile(r"\b([0-9a-f]{7,40}):((?:bench|docs)/[\w/]+\.(?:py|md|jsonl|json))")
NAMED_SCRIPT = re.compile(r"(?<![0-9a-f]:)\b(bench/[\w/]+\.py)")


def _bench_scripts() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts)


def _sections(path: Path, split: re.Pattern[str] = SECTION) -> list[str]:
    return [s for s in split.split(path.read_text(encoding="utf-8")) if s.startswith("#")]


def _not_kept_table() -> list[str]:
    section = next(s for s in _sections(QUANTIZATION) if s.startswith("## Measured and not kept\n"))
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows[0] == "| lever | figure (as measured, with the model) | commit |"
    return rows[2:]


def test_every_bench_script_is_named_in_the_benchmarks():
    text = BENCHMARKS.read_text(encoding="utf-8")
    scripts = _bench_scripts()
    assert "bench/gauntlet/run.py" in scripts  # the walk finds the subfolders
    assert [s for s in scripts if s not in text] == []


def test_every_table_of_figures_names_its_source():
    unsourced = [s.splitlines()[0] for s in _sections(BENCHMARKS, PART)
                 if TABLE_RULE.search(s) and not SOURCE.search(s)]
    assert unsourced == []


def test_a_named_bench_script_exists_or_its_section_says_where_it_went():
    stale = []
    for section in _sections(BENCHMARKS):
        marked = {path for _, path in REMOVED.findall(section)}
        stale += [(section.splitlines()[0], m) for m in NAMED_SCRIPT.findall(section)
                  if not (ROOT / m).is_file() and m not in marked]
    assert stale == []


def test_levers_measured_and_not_kept_are_one_table_with_their_commits():
    rows = _not_kept_table()
    assert len(rows) >= 10
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 3 and all(cells), row
        assert re.match(r"[0-9a-f]{7,40}\b", cells[2]), row
    # the levers the issue names are rows of it, not sections of the benchmarks
    levers = " ".join(r.split("|")[1] for r in rows).lower()
    for lever in ("block reconstruction", "activation quantizers removed", "residual-stream equalization",
                  "activation ranges learned"):
        assert lever in levers
    assert QUANTIZATION.read_text(encoding="utf-8").count("## Measured and not kept") == 1


def test_removed_files_are_gone_and_resolve_in_git():
    refs = set(REMOVED.findall(BENCHMARKS.read_text(encoding="utf-8")))
    for row in _not_kept_table():
        commit = row.split("|")[3].strip().split(":")[0]
        refs |= {(commit, p) for p in re.findall(r"`((?:bench|docs)/[\w/]+\.(?:py|md|jsonl|json))", row)}
    assert refs
    assert [p for _, p in refs if (ROOT / p).exists()] == []
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("no git history in this checkout to resolve COMMIT:PATH against")
    query = "".join(f"{c}:{p}\n" for c, p in sorted(refs))
    out = subprocess.run([git, "cat-file", "--batch-check"], cwd=ROOT, input=query, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert [line for line in out.splitlines() if line.endswith(" missing")] == []


def test_bench_stays_within_its_line_budget():
    lines = sum(len((ROOT / s).read_text(encoding="utf-8").splitlines()) for s in _bench_scripts())
    assert lines <= BENCH_LINES
