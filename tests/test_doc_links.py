"""Every relative link in README.md and docs/ points at a file of the repository, and every
``#anchor`` at a heading of its target (GitHub's anchor rule) (issue 41 item 7)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' removed,
    spaces to '-'."""
    text = re.sub(r"`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in CODE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            a = anchor(m.group(1))
            n = seen.get(a, 0)
            out.add(a if n == 0 else f"{a}-{n}")
            seen[a] = n + 1
    return out


def links(path: Path) -> list[str]:
    text = CODE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def test_relative_links_in_the_docs_resolve():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for doc in docs:
        for target in links(doc):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, frag = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
                continue
            if frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_follows_github():
    assert anchor("Issue 40: the gate's bound on 51-crop hold-outs") == "issue-40-the-gates-bound-on-51-crop-hold-outs"
    assert anchor("What runs where (read this before trusting a number)") == "what-runs-where-read-this-before-trusting-a-number"
    assert anchor("`trtrepo validate`: prove the deployment works") == "trtrepo-validate-prove-the-deployment-works"
